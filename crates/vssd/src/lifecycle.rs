//! A vSSD's life (SymFlex §2.4.1, §2.4.4, §5.3): registration with ⟨M, C, P⟩ — a new
//! vSSD, or a persistent one whose VM restarts and gets its ⟨lbn, pbn⟩ mapping and data
//! back —, the VM's stop (without P its blocks return to the free list and the vSSD is
//! removed; with P it keeps them, inactive, until the space is needed and they are
//! swapped out), and removal by the operator.

use crate::manager::{AfterCommit, BlockManager, Live, Nanos, VssdLive};
use crate::record::{Record, VssdId};

/// Why a lifecycle call was refused (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LifecycleError {
    /// Bad arguments.
    #[error("{0}")]
    Invalid(String),
    /// The vSSD's state does not allow it.
    #[error("{0}")]
    State(String),
}

/// Longest vSSD name.
pub const MAX_NAME: usize = 255;

impl BlockManager {
    /// Registers `name` with M = `max_blocks` logical blocks, C = `initial` blocks wanted
    /// now and P = `persist` (§2.4.1). A persistent vSSD of that name whose VM stopped is
    /// activated again with the blocks it kept (and its swapped-out ones copied back);
    /// its M and P must be the same. Blocks become valid as they are zeroed and their
    /// records committed (`Event::Inflated`).
    pub fn register(
        &mut self,
        name: &str,
        max_blocks: u32,
        initial: u32,
        persist: bool,
        now: Nanos,
    ) -> Result<VssdId, LifecycleError> {
        let invalid = |m: String| Err(LifecycleError::Invalid(m));
        if name.is_empty() || name.len() > MAX_NAME || name.chars().any(|c| c.is_control() || c == '/') {
            return invalid(format!(
                "`{name}` is not a vSSD name (1 to {MAX_NAME} bytes, no `/` or control characters)"
            ));
        }
        if max_blocks == 0 {
            return invalid(format!("vSSD `{name}`: a maximum size of 0 blocks"));
        }
        if initial > max_blocks {
            return invalid(format!("vSSD `{name}`: {initial} initial blocks is more than its maximum {max_blocks}"));
        }
        let _ = now;
        if let Some(id) = self.state.id_of(name) {
            let v = self.state.vssd(id).expect("named");
            if v.removing {
                return Err(LifecycleError::State(format!("vSSD `{name}` is being removed")));
            }
            if v.active {
                return Err(LifecycleError::State(format!("vSSD `{name}` is registered and active already")));
            }
            if v.max_blocks != max_blocks || v.persist != persist {
                return invalid(format!(
                    "vSSD `{name}` was registered with M = {} blocks and P = {}: a restart must give the same (remove it to change them)",
                    v.max_blocks, v.persist
                ));
            }
            self.emit(Record::Activate { id }, None);
            let l = self.vssds.get_mut(&id).expect("named");
            l.inactive_since = None;
            // Blocks it kept still hold its data: valid again at once (§5.3).
            let kept: Vec<_> = self.state.vssd(id).expect("named").map.iter().map(|(&l, &p)| (l, p)).collect();
            let mut lbns = Vec::new();
            for (lbn, pbn) in kept {
                if let Live::Valid { .. } = self.live[pbn as usize] {
                    lbns.push(lbn);
                }
            }
            // Its data comes back whatever C says: blocks held, swapped out, or on their
            // way out now (they are copied back in once out; `held` counts them all).
            let held = self.held(id);
            self.vssds.get_mut(&id).expect("named").target = initial.max(held);
            if !lbns.is_empty() {
                self.push_event(crate::manager::Event::Inflated { id, lbns });
            }
            self.fill();
            return Ok(id);
        }
        let id = self.state.next_id().max(self.next_id);
        self.next_id = id + 1;
        self.emit(Record::Register { id, name: name.to_string(), max_blocks, persist }, None);
        self.vssds.insert(id, VssdLive { target: initial, ..Default::default() });
        self.fill();
        Ok(id)
    }

    /// The VM of `id` stopped (§2.4.4): no I/O may be in flight on its blocks. Without P
    /// its blocks are freed and the vSSD removed; with P it keeps them, inactive.
    pub fn stop(&mut self, id: VssdId, now: Nanos) -> Result<(), LifecycleError> {
        let v = self.state.vssd(id).ok_or_else(|| LifecycleError::Invalid(format!("no vSSD {id}")))?;
        if !v.active || v.removing {
            return Err(LifecycleError::State(format!("vSSD `{}` is stopped already", v.name)));
        }
        if self.io_in_flight(id) {
            return Err(LifecycleError::State(format!("vSSD `{}` has I/O in flight", v.name)));
        }
        let persist = v.persist;
        {
            let l = self.vssds.get_mut(&id).expect("live");
            l.asked = 0;
            l.deadline = None;
        }
        if persist {
            self.emit(Record::Deactivate { id }, None);
            self.vssds.get_mut(&id).expect("live").inactive_since = Some(now);
            // Space others wait for may come from it now.
            self.fill();
            return Ok(());
        }
        self.remove_blocks(id);
        Ok(())
    }

    /// Removes vSSD `id` (stopped or not; no I/O may be in flight): its blocks are freed
    /// and its swapped-out copies dropped; `Event::Removed` once that is committed.
    pub fn remove(&mut self, id: VssdId) -> Result<(), LifecycleError> {
        let v = self.state.vssd(id).ok_or_else(|| LifecycleError::Invalid(format!("no vSSD {id}")))?;
        if v.removing {
            return Err(LifecycleError::State(format!("vSSD `{}` is being removed", v.name)));
        }
        if self.io_in_flight(id) {
            return Err(LifecycleError::State(format!("vSSD `{}` has I/O in flight", v.name)));
        }
        self.remove_blocks(id);
        Ok(())
    }

    /// Removes `id`: writes `Removing` first (so no `Free` of its can be durable while
    /// the vSSD is not known to be going away), drops its swapped-out copies, releases
    /// every block it holds (blocks being filled are freed when their op ends), and
    /// writes `Remove` once nothing is left. Also resumes a removal a crash interrupted.
    pub(crate) fn remove_blocks(&mut self, id: VssdId) {
        let v = self.state.vssd(id).expect("removing an existing vSSD");
        let started = v.removing;
        let swapped: Vec<_> = v.swapped.iter().copied().collect();
        if !started {
            self.emit(Record::Removing { id }, None);
        }
        for lbn in swapped {
            self.emit(Record::SwapDropped { id, lbn }, None);
            // A copy back in running for it now brings nothing wanted.
            if let Some(&pbn) = self.vssds[&id].tally.filling.get(&lbn) {
                if let Live::Filling { op, .. } = self.live[pbn as usize] {
                    self.set_live(pbn, Live::Filling { id, lbn, op, swap_in: false });
                }
            }
        }
        let l = self.vssds.get_mut(&id).expect("live");
        l.target = 0;
        l.asked = 0;
        l.deadline = None;
        for pbn in 0..self.live.len() {
            match self.live[pbn] {
                Live::Valid { id: i, lbn } | Live::Committing { id: i, lbn, .. } if i == id => {
                    if matches!(self.live[pbn], Live::Committing { .. }) {
                        // Its Assign commits first (records commit in order), and it
                        // never serves.
                        self.drop_awaited_validity(pbn as u32);
                    }
                    self.set_live(pbn as u32, Live::Draining { id, lbn });
                    self.drain(pbn as u32);
                }
                _ => {}
            }
        }
        self.settle(id);
    }

    /// Whether any block of `id` has I/O in flight.
    pub(crate) fn io_in_flight(&self, id: VssdId) -> bool {
        self.live
            .iter()
            .zip(&self.inflight)
            .any(|(l, &n)| n > 0 && matches!(*l, Live::Valid { id: i, .. } | Live::Draining { id: i, .. } if i == id))
    }

    /// Blocks of `id`'s that wait for `AfterCommit::Valid` no longer become valid.
    fn drop_awaited_validity(&mut self, pbn: u32) {
        self.forget_awaited(|a| matches!(a, AfterCommit::Valid(p) if p == pbn));
    }
}
