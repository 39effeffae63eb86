//! Slots of the local store withheld from the cache, for one SSD budget shared by the
//! host-managed partitions and guest-managed vSSDs (SymFlex §2.2: the hypervisor's SSD is
//! carved between them, and the allocator moves space from one to the other).
//!
//! A driver *withholds* a run of the local store's slots (one vSSD block's worth) and the
//! engine empties it: free slots come off the free list, cached blocks are written back if
//! dirty and dropped (removed from their policy like any eviction), slots with ops in
//! flight are waited for ([`Engine::withhold_step`] retries them), and in persistent mode
//! a dropped block's slot goes through limbo as every freed slot does — so once
//! [`Engine::withheld_ready`] says the run is empty, no durable record of the engine's
//! names any of its slots and no op of the engine's touches them: the driver may hand the
//! bytes to someone else. [`Engine::return_slots`] gives a run back (its slots free
//! again). Withheld slots are never taken for a block, never restored from a journal,
//! and counted apart from free ones ([`Engine::withheld_slots`]).
//!
//! The engine keeps this in memory only: which runs are withheld is the borrower's durable
//! state (the vSSD region's journal), and a driver withholds them again at start, before
//! any I/O, when they are free anyway (a borrower takes a run only after the engine's
//! frees are durable, and gives it back only after its own release is). Hand-written:
//! bookkeeping over the engine's own free lists and pins.

use crate::engine::Engine;
use crate::output::Output;
use crate::replacement::Replacement;
use crate::slot_table::{key_vm, FREE_KEY};
use crate::stores::LOCAL;
use rustc_hash::FxHashSet;

/// Slots withheld from the cache.
#[derive(Debug, Clone, Default)]
pub(crate) struct Withheld {
    /// Every withheld slot, emptied or not.
    slots: FxHashSet<u32>,
    /// Withheld slots that hold nothing and are on no list (not free, not in limbo).
    idle: FxHashSet<u32>,
}

impl Withheld {
    /// Withheld slots emptied (holding nothing, on no list).
    pub(crate) fn idle_len(&self) -> usize {
        self.idle.len()
    }

    /// Takes idle slot `s` back for a block (a restore or repair puts one there; it is
    /// emptied again by [`Engine::withhold_step`]); whether it was idle.
    pub(crate) fn take_back(&mut self, s: u32) -> bool {
        !self.idle.is_empty() && self.idle.remove(&s)
    }

    /// Marks slot `s` withheld and idle (a slot the tables grew to, not given to the cache).
    pub(crate) fn add_idle(&mut self, s: u32) {
        self.slots.insert(s);
        self.idle.insert(s);
    }

    /// Whether slot `s` is withheld and idle.
    pub(crate) fn is_idle(&self, s: u32) -> bool {
        self.idle.contains(&s)
    }

    /// Forgets slot `s` (the tables were cut below it).
    pub(crate) fn forget(&mut self, s: u32) {
        self.slots.remove(&s);
        self.idle.remove(&s);
    }

    /// Gives back the sets' room for slots no longer withheld (after a cut).
    pub(crate) fn shrink(&mut self) {
        self.slots.shrink_to_fit();
        self.idle.shrink_to_fit();
    }

    /// An idle slot that holds a block (`holds`) or is not withheld: the invariant broken.
    pub(crate) fn broken(&self, holds: impl Fn(u32) -> bool) -> Option<u32> {
        self.idle.iter().copied().find(|&s| holds(s) || !self.slots.contains(&s))
    }
}

impl Engine {
    /// Withholds local-store slots `first..first + n` from the cache (see the module doc):
    /// what can be emptied now is, dirty blocks' write-backs go into `out`; the rest is
    /// retried by [`Self::withhold_step`]. Slots already withheld are left as they are.
    /// Errors (nothing changed) when the run is not inside the local store.
    pub fn withhold(&mut self, first: u32, n: u32, out: &mut Output) -> Result<(), String> {
        let (first, n) = self.mark_withheld(first, n)?;
        for s in first..first + n {
            self.empty_withheld(s, out);
        }
        Ok(())
    }

    /// Withholds slots `first..first + n` as [`Self::withhold`] does, but first moves
    /// the run's clean cached blocks with no op in flight into free slots outside it,
    /// while there are any (a cache shrinking keeps what fits: the daemon's
    /// `cache_resize.rs`) — staged copies as a migration's (`migration.rs`, §3.7's update
    /// safety: a request touching a block waits for its copy). The rest is emptied as
    /// `withhold` does. Returns the blocks moved.
    pub fn withhold_moving(&mut self, first: u32, n: u32, out: &mut Output) -> Result<u64, String> {
        let (first, n) = self.mark_withheld(first, n)?;
        // The run's free slots leave the free list first: no move lands inside it.
        for s in first..first + n {
            if self.slots.key(s) == FREE_KEY {
                self.empty_withheld(s, out);
            }
        }
        let mut moved = 0;
        for s in first..first + n {
            let key = self.slots.key(s);
            // A block with a mirror stays (written back and dropped below): a move could
            // land it on its mirror's device (`dirty_mirror.rs`).
            if key == FREE_KEY
                || self.flight.pinned(s)
                || self.block_taken(key)
                || !self.movable(s)
                || self.slot_mirrored(s)
            {
                continue;
            }
            // Into a free slot outside the run: on the run's device past it, or another.
            let Some(d) = self.local_store_for_new_block().and_then(|st| self.take_free_of(st)) else { break };
            self.move_block_to(key_vm(key), s, d, out);
            moved += 1;
        }
        self.free_deferred();
        for s in first..first + n {
            self.empty_withheld(s, out);
        }
        Ok(moved)
    }

    /// Marks slots `first..first + n` withheld; errors (nothing changed) when the run is
    /// not inside one of the host's cache devices (the local store, or a
    /// `StoreKind::Device`: a device removed online is withheld whole). Returns the part
    /// the tables hold (the slots past them are withheld and empty already:
    /// `growable.rs`).
    fn mark_withheld(&mut self, first: u32, n: u32) -> Result<(u32, u32), String> {
        let layout = self.stores.layout();
        let st = if u64::from(first) < layout.total() { layout.store_of(first) } else { LOCAL };
        let (lo, len) = layout.range(st);
        let end = u64::from(first) + u64::from(n);
        if !layout.kind(st).is_local() || u64::from(first) < lo || end > lo + len {
            return Err(format!("slots {first}..{end} are not all in one cache device's {lo}..{}", lo + len));
        }
        let held = self.held_part(first, n);
        for s in first..first + held {
            self.withheld.slots.insert(s);
        }
        self.refit_admission();
        Ok((first, held))
    }

    /// Marks slot `s`, empty and on no list, withheld and idle (a device added:
    /// `device_added.rs`).
    pub(crate) fn withheld_idle(&mut self, s: u32) {
        self.withheld.add_idle(s);
    }

    /// Retries emptying the withheld slots that had ops in flight; returns how many are
    /// still not idle.
    pub fn withhold_step(&mut self, out: &mut Output) -> usize {
        let busy: Vec<u32> = self.withheld.slots.iter().filter(|s| !self.withheld.idle.contains(s)).copied().collect();
        for &s in &busy {
            self.empty_withheld(s, out);
        }
        self.withheld.slots.len() - self.withheld.idle.len()
    }

    /// Whether every slot of `first..first + n` is withheld, holds nothing, is on no list
    /// and has no op in flight: the run's bytes may be given to someone else.
    pub fn withheld_ready(&self, first: u32, n: u32) -> bool {
        (first..first + self.held_part(first, n)).all(|s| self.withheld.idle.contains(&s) && !self.flight.pinned(s))
    }

    /// Gives withheld slots `first..first + n` back to the cache (free again); slots not
    /// withheld are left as they are. The caller no longer uses their bytes.
    pub fn return_slots(&mut self, first: u32, n: u32) {
        let end = u64::from(first) + u64::from(n);
        // Slots past the tables: they grow to hold them (the ones before `first` stay
        // withheld).
        if end > u64::from(self.present()) && end <= self.slot_count() {
            self.grow_tables(end as u32, first);
        }
        for s in first..first + self.held_part(first, n) {
            if !self.withheld.slots.remove(&s) {
                continue;
            }
            if self.withheld.idle.remove(&s) {
                if self.flight.pinned(s) {
                    self.stores.park(s);
                } else {
                    self.free_push_back(s);
                }
            }
            // A slot still emptying comes back through the free list when it is.
        }
        self.refit_admission();
    }

    /// What withholding slots `first..first + n` would cost: the cached blocks it would
    /// drop and, of them, the dirty ones it would write back first. Ordered so the
    /// cheapest run compares least (fewest write-backs, then fewest blocks lost). Slots
    /// outside the pool count as nothing.
    pub fn withhold_cost(&self, first: u32, n: u32) -> WithholdCost {
        let end = (u64::from(first) + u64::from(n)).min(self.slots.len() as u64) as u32;
        let mut c = WithholdCost::default();
        for s in first.min(end)..end {
            if self.slots.key(s) != FREE_KEY {
                c.cached += 1;
                c.dirty += u32::from(self.slot_dirty(s));
            }
        }
        c
    }

    /// Slots withheld (emptied or not), those past the tables included.
    pub fn withheld_slots(&self) -> u64 {
        self.withheld.slots.len() as u64 + self.absent_slots()
    }

    /// Whether slot `s` is withheld.
    #[inline]
    pub(crate) fn is_withheld(&self, s: u32) -> bool {
        !self.withheld.slots.is_empty() && self.withheld.slots.contains(&s)
    }

    /// A withheld slot reaching a free list stays off it: idle.
    #[inline]
    pub(crate) fn withheld_instead_of_free(&mut self, s: u32) -> bool {
        if !self.is_withheld(s) {
            return false;
        }
        self.withheld.idle.insert(s);
        true
    }

    /// Empties withheld slot `s` as far as it can now.
    fn empty_withheld(&mut self, s: u32, out: &mut Output) {
        if self.withheld.idle.contains(&s) {
            return;
        }
        if self.mirrors.is_mirror(s) {
            self.vacate_mirror(s, out);
            return;
        }
        let key = self.slots.key(s);
        if key == FREE_KEY {
            // On a free list, parked (pinned), or on its way there — in limbo or a
            // migration's deferred frees — and then it arrives idle.
            if self.stores.unpark(s) {
                self.withheld.idle.insert(s);
            } else if !self.dur.in_limbo(s) && !self.moving.frees_later(s) {
                self.free_unlink(s);
                self.withheld.idle.insert(s);
            }
            return;
        }
        // A poisoned block (bytes that failed their checksum, or dirty on a dropped
        // device: its only copy unreadable) is never written back nor dropped: the run
        // is not emptied while it holds one (a removal of a device that failed under it
        // gives up, `withheld_ready` never says yes).
        if self.flight.pinned(s) || self.poisoned(s) {
            return;
        }
        let vm = key_vm(key);
        let spb = self.spb;
        self.writeback(vm, s, (0, spb), 0, false, out);
        self.with_repl(vm, |r, t| r.remove(t, s));
        // Freed: to limbo in persistent mode, else at once — either way back here idle.
        self.release(vm, s);
    }
}

/// What withholding a run costs ([`Engine::withhold_cost`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct WithholdCost {
    /// Dirty blocks to write back first.
    pub dirty: u32,
    /// Cached blocks dropped (dirty ones included).
    pub cached: u32,
}

#[cfg(test)]
mod tests {
    use super::WithholdCost;
    use crate::{Engine, EngineConfig, Output, WritePolicy};
    use cachevisor_trace::{Op, Request};

    #[test]
    fn a_run_costs_its_cached_blocks_and_dirty_ones_most() {
        let mut e =
            Engine::new(EngineConfig { write_policy: WritePolicy::Wb, ..EngineConfig::with_slots(12) }).unwrap();
        let mut out = Output::default();
        e.set_target(0, 12, &mut out);
        let at = |b: u64, op| Request { time_ns: 0, vm: 0, op, offset: b * 4096, len: 4096 };
        for b in 0..6 {
            e.access(0, &at(b, if b < 2 { Op::Write } else { Op::Read }), &mut out);
        }
        let runs: Vec<WithholdCost> = (0..3).map(|r| e.withhold_cost(r * 4, 4)).collect();
        let dirty: u32 = runs.iter().map(|c| c.dirty).sum();
        let cached: u32 = runs.iter().map(|c| c.cached).sum();
        assert_eq!((dirty, cached), (2, 6), "{runs:?}");
        // Where the index says each block is: blocks 0 and 1 written (dirty), 2..6 read.
        let mut want = [WithholdCost::default(); 3];
        for b in 0..6u64 {
            let run = (e.lookup(0, b).unwrap() / 4) as usize;
            want[run].cached += 1;
            want[run].dirty += u32::from(b < 2);
        }
        assert_eq!(runs, want);
        assert!(WithholdCost { dirty: 0, cached: 4 } < WithholdCost { dirty: 1, cached: 1 }, "write-backs first");
        assert_eq!(e.withhold_cost(10, 8), e.withhold_cost(10, 2), "past the pool: nothing");
    }

    #[test]
    fn a_withheld_run_moves_its_clean_blocks_into_free_slots_outside_it() {
        let mut e = Engine::new(EngineConfig::with_slots(16)).unwrap();
        let mut out = Output::default();
        e.set_target(0, 16, &mut out);
        let at = |b: u64| Request { time_ns: 0, vm: 0, op: Op::Read, offset: b * 4096, len: 4096 };
        for b in 0..16 {
            e.access(0, &at(b), &mut out);
        }
        // Free the first 4 slots (their blocks dropped), then give them back empty.
        e.withhold(0, 4, &mut out).unwrap();
        assert!(e.withheld_ready(0, 4));
        e.return_slots(0, 4);
        let cached: Vec<u64> = (0..16).filter(|&b| e.lookup(0, b).is_some()).collect();
        assert_eq!(cached.len(), 12);
        let tail: Vec<u64> = cached.iter().copied().filter(|&b| e.lookup(0, b).unwrap() >= 10).collect();
        assert_eq!(tail.len(), 6, "blocks in slots 10..16");
        // Withholding 10..16 moves 4 of its 6 blocks into the 4 free slots, drops 2.
        let mut out = Output::default();
        let moved = e.withhold_moving(10, 6, &mut out).unwrap();
        assert_eq!(moved, 4);
        assert_eq!(out.ops.iter().filter(|o| o.staged).count(), 8, "a read and a write per move: {:?}", out.ops);
        let kept: Vec<u64> = (0..16).filter(|&b| e.lookup(0, b).is_some()).collect();
        assert_eq!(kept.len(), 10, "{kept:?}");
        assert!(kept.iter().all(|&b| e.lookup(0, b).unwrap() < 10), "none left in the run");
        assert!(cached.iter().filter(|b| !tail.contains(b)).all(|b| kept.contains(b)), "the others stay");
        e.check_invariants().unwrap();
        assert_eq!(
            e.withhold_moving(20, 1, &mut out).unwrap_err(),
            "slots 20..21 are not all in one cache device's 0..16"
        );
    }
}
