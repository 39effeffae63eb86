//! The local store's per-slot tables sized to the slots in use, not to the store's
//! layout: a daemon laid out for `cache.max_size` (the most a reload may grow the cache
//! to) keeps tables — keys and list links, sector bitmaps, the block index, vouched
//! sectors, ~55 bytes a slot — only for the slots its cache has, and grows them when a
//! reload grows the cache ([`Engine::return_slots`] past them) or a restart replays a
//! record there, and cuts them when a shrink has emptied the tail
//! ([`Engine::cut_withheld_tail`]).
//!
//! A slot of the layout past the tables is *absent*: withheld from the cache, empty, on
//! no list, with no op — exactly what an idle withheld slot is (`withheld.rs`), held in no
//! table. So every rule about withheld slots holds for it: `withhold` finds it emptied,
//! `withheld_ready` ready, `withheld_slots` counts it, `return_slots` gives it to the
//! cache (the tables grow to hold it), a restore puts a block there (the tables grow, the
//! slots between free as every slot of a fresh engine is). Only an engine whose layout
//! has the local store alone grows (the other stores' slots come after the local ones,
//! and their ids must not move).

use crate::block_index::BlockIndex;
use crate::config::EngineConfig;
use crate::engine::Engine;
use crate::slot_table::FREE_KEY;

impl Engine {
    /// An engine laid out for `cfg` (every slot id of `cfg.slots` valid) whose tables hold
    /// only the first `present` slots (free); the rest are absent (the module doc).
    /// Errors when `cfg` has stores besides the local one or `present` is past its slots.
    pub fn new_growable(cfg: EngineConfig, present: u64) -> Result<Self, String> {
        if !cfg.stores.is_empty() {
            return Err("a growable engine has the local store alone".into());
        }
        if present == 0 || present > cfg.slots {
            return Err(format!("{present} slots in use of {} laid out", cfg.slots));
        }
        let mut e = Engine::new(EngineConfig { slots: present, ..cfg.clone() })?;
        cfg.validate()?;
        e.stores.relayout(cfg.layout());
        if let Some(shared) = e.shared.as_mut() {
            // As an engine of the whole layout builds it (its capacity is a target).
            *shared = cfg.replacement.build(cfg.total_slots());
        }
        e.cfg = cfg;
        Ok(e)
    }

    /// Slots the tables hold: the local store's first ones.
    #[inline]
    pub(crate) fn present(&self) -> u32 {
        self.slots.len() as u32
    }

    /// How many of slots `first..first + n` the tables hold (those past them are absent).
    #[inline]
    pub(crate) fn held_part(&self, first: u32, n: u32) -> u32 {
        n.min(self.present().saturating_sub(first))
    }

    /// Slots of the layout past the tables (withheld, empty).
    pub(crate) fn absent_slots(&self) -> u64 {
        self.slot_count() - self.present() as u64
    }

    /// Grows the tables to `to` slots: those before `free_from` stay withheld (idle), the
    /// rest go on the free list.
    pub(crate) fn grow_tables(&mut self, to: u32, free_from: u32) {
        let from = self.present();
        if to <= from {
            return;
        }
        debug_assert!(u64::from(to) <= self.slot_count());
        self.slots.resize(to as usize, self.cfg.track_last_access);
        self.valid.resize(to as usize);
        self.dirty.resize(to as usize);
        self.resize_index(to);
        for s in from..to {
            if s < free_from {
                self.withheld.add_idle(s);
            } else {
                self.free_push_back(s);
            }
        }
    }

    /// Cuts the tables at `to` when every slot from there to their end is withheld, empty,
    /// on no list and has no op in flight (a shrink finished: `withheld_ready`); those
    /// slots become absent. Returns whether it cut. A run still emptying keeps its rows;
    /// an engine with stores besides the local one never cuts (their ids follow).
    pub fn cut_withheld_tail(&mut self, to: u32) -> bool {
        let end = self.present();
        if self.stores.len() > 1 || to == 0 || to >= end || !self.withheld_ready(to, end - to) {
            return false;
        }
        for s in to..end {
            debug_assert!(self.withheld.is_idle(s) && self.slots.key(s) == FREE_KEY);
            self.withheld.forget(s);
        }
        self.withheld.shrink();
        self.slots.resize(to as usize, self.cfg.track_last_access);
        self.valid.resize(to as usize);
        self.dirty.resize(to as usize);
        self.dur.forget_slots_from(to);
        self.resize_index(to);
        true
    }

    /// A block index sized for `slots` (rebuilt from the slot table when its size is off
    /// by more than twice: rare, at a resize).
    pub(crate) fn resize_index(&mut self, slots: u32) {
        let n = slots as usize;
        if self.index.fits(n) && !self.index.fits(n * 4) {
            return;
        }
        let mut index = BlockIndex::new(n);
        for s in 0..slots {
            let key = self.slots.key(s);
            if key != FREE_KEY {
                index.insert(key, s);
            }
        }
        self.index = index;
    }
}

#[cfg(test)]
mod tests {
    use crate::{Engine, EngineConfig, Output};
    use cachevisor_trace::{Op, Request};

    fn at(b: u64) -> Request {
        Request { time_ns: 0, vm: 0, op: Op::Read, offset: b * 4096, len: 4096 }
    }

    /// Laid out for 64, tables for 8: the absent 56 count as withheld and ready; giving 24
    /// of them back grows the tables and the cache uses them; a shrink back empties the
    /// tail, and the cut returns the tables to 8 — the engine's invariants hold at each
    /// step, and each state matches an engine of the whole layout driven the same way.
    #[test]
    fn a_growable_engine_grows_and_cuts_as_a_whole_one_withholds() {
        let cfg = EngineConfig::with_slots(64);
        let mut g = Engine::new_growable(cfg.clone(), 8).unwrap();
        let mut w = Engine::new(cfg).unwrap();
        let mut out = Output::default();
        w.withhold(8, 56, &mut out).unwrap();
        for e in [&mut g, &mut w] {
            e.set_target(0, 64, &mut out);
        }
        let same = |g: &Engine, w: &Engine| {
            g.check_invariants().unwrap();
            assert_eq!(g.withheld_slots(), w.withheld_slots());
            assert_eq!(g.free_slots(), w.free_slots());
            assert_eq!(g.slot_count(), w.slot_count());
            for b in 0..100 {
                assert_eq!(g.lookup(0, b), w.lookup(0, b), "block {b}");
            }
        };
        assert!(g.withheld_ready(8, 56) && g.withheld_slots() == 56);
        same(&g, &w);
        for b in 0..20 {
            g.access(0, &at(b), &mut out);
            w.access(0, &at(b), &mut out);
        }
        same(&g, &w);
        g.return_slots(8, 24);
        w.return_slots(8, 24);
        assert_eq!(g.present(), 32);
        for b in 20..60 {
            g.access(0, &at(b), &mut out);
            w.access(0, &at(b), &mut out);
        }
        assert_eq!(g.partition(0).used, 32, "the grown slots hold blocks");
        same(&g, &w);
        // Give back 40..48 past a gap: the tables grow to 48, 32..40 stay withheld.
        g.return_slots(40, 8);
        w.return_slots(40, 8);
        assert_eq!((g.present(), g.withheld_slots()), (48, 24));
        same(&g, &w);
        for (e, whole) in [(&mut g, false), (&mut w, true)] {
            e.withhold_moving(8, 40, &mut out).unwrap();
            assert!(e.withheld_ready(8, 56), "whole: {whole}");
        }
        same(&g, &w);
        assert!(!g.cut_withheld_tail(48) && g.cut_withheld_tail(8));
        assert_eq!(g.present(), 8);
        same(&g, &w);
        for b in 0..30 {
            g.access(0, &at(b), &mut out);
            w.access(0, &at(b), &mut out);
        }
        same(&g, &w);
    }

    /// A restore names a slot past the tables (a shrink a crash interrupted): they grow to
    /// hold it, the slots between free, as in an engine of the whole layout.
    #[test]
    fn a_restore_past_the_tables_grows_them() {
        let mut g = Engine::new_growable(EngineConfig::with_slots(64), 8).unwrap();
        g.restore_slot(40, 0, 7, &[true; 8], &[false; 8]).unwrap();
        assert_eq!((g.present(), g.lookup(0, 7)), (41, Some(40)));
        assert_eq!(g.free_slots(), 40);
        g.check_invariants().unwrap();
        assert!(g.restore_slot(64, 0, 8, &[true; 8], &[false; 8]).unwrap_err().contains("beyond the pool"));
        assert!(Engine::new_growable(EngineConfig::with_slots(8), 9).is_err());
    }
}
