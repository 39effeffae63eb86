//! Inflate and deflate (SymFlex §2.4.3, Fig. 4) with balloon semantics: the host sets a
//! vSSD's target; above what it holds, free blocks are zeroed, recorded and announced as
//! new valid logical blocks; below, the guest is asked for the difference by a deadline
//! and answers with the logical blocks it gives back, in parts if it likes. A guest that
//! has not given them all by the deadline loses the least recently used ones the host
//! picks (logged as forced, counted). A target the free list cannot meet waits for blocks
//! to be freed, with no timer: nothing spins.

use crate::geometry::Lbn;
use crate::manager::{BlockManager, Event, Live, Nanos};
use crate::record::VssdId;
use std::collections::BTreeSet;

/// Why a release was refused (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("vSSD {id}: {reason}")]
pub struct ReleaseError {
    /// The vSSD.
    pub id: VssdId,
    /// Why.
    pub reason: String,
}

/// A vSSD's resize state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResizeStatus {
    /// Blocks the host wants it to hold.
    pub target: u32,
    /// Blocks that serve I/O.
    pub valid: u32,
    /// Blocks being zeroed or copied in, or committed soon.
    pub coming: u32,
    /// Blocks released whose space is not free yet.
    pub leaving: u32,
    /// Blocks asked of the guest and not given yet.
    pub asked: u32,
    /// When the host picks them itself.
    pub deadline: Option<Nanos>,
}

impl BlockManager {
    /// Sets vSSD `id`'s target to `blocks` (at most its M): inflates at once as far as the
    /// free list allows, or asks the guest to give back the difference by `now` + the
    /// grace period (a new target replaces the request and its deadline).
    pub fn set_target(&mut self, id: VssdId, blocks: u32, now: Nanos) -> Result<(), String> {
        let v = self.state.vssd(id).ok_or_else(|| format!("no vSSD {id}"))?;
        if !v.active || v.removing {
            return Err(format!("vSSD `{}` is not running", v.name));
        }
        if blocks > v.max_blocks {
            return Err(format!(
                "vSSD `{}`: a target of {blocks} blocks is more than its maximum {}",
                v.name, v.max_blocks
            ));
        }
        let held = self.held(id);
        let grace = self.config.deflate_grace;
        let l = self.vssds.get_mut(&id).expect("live");
        l.target = blocks;
        let asked = held.saturating_sub(blocks);
        if asked != l.asked {
            l.asked = asked;
            l.deadline = (asked > 0).then_some(now + grace);
            let deadline = l.deadline.unwrap_or(0);
            self.push_event(Event::DeflateRequested { id, blocks: asked, deadline });
        }
        self.fill();
        Ok(())
    }

    /// The guest of `id` gives back `lbns`: each must be a valid block of this vSSD, none
    /// twice, no more than asked for. All are released or none (the error says why).
    pub fn release(&mut self, id: VssdId, lbns: &[Lbn]) -> Result<(), ReleaseError> {
        let err = |reason: String| Err(ReleaseError { id, reason });
        let Some(v) = self.state.vssd(id) else { return err("no such vSSD".into()) };
        if !v.active {
            return err("not running".into());
        }
        let asked = self.vssds[&id].asked;
        if lbns.len() as u64 > u64::from(asked) {
            return err(format!("{} blocks given back, {asked} asked for", lbns.len()));
        }
        let mut seen = BTreeSet::new();
        for &lbn in lbns {
            if lbn >= v.max_blocks {
                return err(format!("logical block {lbn} is past the device's {} blocks", v.max_blocks));
            }
            if !seen.insert(lbn) {
                return err(format!("logical block {lbn} is given twice"));
            }
            match v.map.get(&lbn).map(|&p| self.live[p as usize]) {
                Some(Live::Valid { .. }) => {}
                _ => return err(format!("logical block {lbn} is not a valid block of this vSSD")),
            }
        }
        let pbns: Vec<_> = lbns.iter().map(|l| v.map[l]).collect();
        for pbn in pbns {
            let Live::Valid { id, lbn } = self.live[pbn as usize] else { unreachable!("checked") };
            self.set_live(pbn, Live::Draining { id, lbn });
            self.drain(pbn);
        }
        self.counters.released += lbns.len() as u64;
        let l = self.vssds.get_mut(&id).expect("live");
        l.asked -= lbns.len() as u32;
        if l.asked == 0 {
            l.deadline = None;
        }
        let mut sorted = lbns.to_vec();
        sorted.sort_unstable();
        if !sorted.is_empty() {
            self.push_event(Event::Released { id, lbns: sorted, forced: false });
        }
        Ok(())
    }

    /// The guest of `id` said hello (it has the valid blocks as they are now): the blocks
    /// taken from it after deadlines may be inflated again.
    pub fn hello(&mut self, id: VssdId) {
        if let Some(l) = self.vssds.get_mut(&id) {
            if !l.fenced.is_empty() {
                l.fenced.clear();
                self.fill();
            }
        }
    }

    /// When `handle_timeout` is next due (the earliest deflate deadline).
    pub fn poll_timeout(&self) -> Option<Nanos> {
        self.vssds.values().filter_map(|l| l.deadline).min()
    }

    /// Deadlines at or before `now` passed: the host releases the blocks still asked for,
    /// least recently used first (ties: lowest logical block).
    pub fn handle_timeout(&mut self, now: Nanos) {
        let due: Vec<VssdId> =
            self.vssds.iter().filter(|(_, l)| l.deadline.is_some_and(|d| d <= now)).map(|(&i, _)| i).collect();
        for id in due {
            let asked = self.vssds[&id].asked;
            let v = self.state.vssd(id).expect("live");
            let mut candidates: Vec<(Nanos, Lbn, u32)> = v
                .map
                .iter()
                .filter(|(_, &p)| matches!(self.live[p as usize], Live::Valid { .. }))
                .map(|(&lbn, &p)| (self.last_access[p as usize], lbn, p))
                .collect();
            candidates.sort_unstable();
            let mut lbns = Vec::new();
            for &(_, lbn, pbn) in candidates.iter().take(asked as usize) {
                self.set_live(pbn, Live::Draining { id, lbn });
                self.drain(pbn);
                lbns.push(lbn);
            }
            self.counters.forced += lbns.len() as u64;
            self.counters.deadlines_missed += 1;
            // Blocks still on their way that hold data (copied back in) are asked for
            // again; zeroed ones are dropped when they arrive.
            let held = self.held(id);
            let l = self.vssds.get_mut(&id).expect("live");
            l.fenced.extend(&lbns);
            l.asked = 0;
            l.deadline = None;
            let rest = held.saturating_sub(l.target);
            if rest > 0 {
                l.asked = rest;
                l.deadline = Some(now + self.config.deflate_grace);
                let deadline = now + self.config.deflate_grace;
                self.push_event(Event::DeflateRequested { id, blocks: rest, deadline });
            }
            lbns.sort_unstable();
            if !lbns.is_empty() {
                self.push_event(Event::Released { id, lbns, forced: true });
            }
        }
    }

    /// Vssd `id`'s resize state.
    pub fn resize_status(&self, id: VssdId) -> Option<ResizeStatus> {
        let l = self.vssds.get(&id)?;
        let t = &l.tally;
        Some(ResizeStatus {
            target: l.target,
            valid: t.valid,
            coming: t.filling.len() as u32 + t.committing,
            leaving: t.draining + t.swapping_out,
            asked: l.asked,
            deadline: l.deadline,
        })
    }
}
