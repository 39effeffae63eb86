//! A cache device added to a running engine (the daemon's `cachevisor cache add`): one
//! more `StoreKind::Device` row at the end of the store table, its slots after every
//! other's — so no slot id moves — and the per-slot tables grown to hold them. The new
//! slots arrive *withheld* (`withheld.rs`): the driver first makes the new layout
//! durable (a checkpoint naming the device, so no journal record can name a slot the
//! metadata's layout lacks), then gives them to the cache with `return_slots`. From
//! then on the allocators and policies see one larger pool, and a block taking a free
//! slot may land there (`device_placement.rs`).
//!
//! Only an engine whose stores are all the host's devices takes one (a lent region's
//! slots come after the devices', and their ids must not move), laid out to its end (a
//! `cache.max_size` engine's absent slots, `growable.rs`, are the local store's).
//! Hand-written: bookkeeping over the engine's own tables.

use crate::config::StoreSpec;
use crate::engine::Engine;
use crate::replacement::Replacement;
use crate::stores::StoreId;

impl Engine {
    /// Adds a cache device of `slots` slots (see the module doc); returns its store and
    /// its first slot. Its slots are withheld until the driver returns them.
    pub fn add_device(&mut self, slots: u64) -> Result<(StoreId, u32), String> {
        let st = self.stores.len() as StoreId;
        if self.stores.local_ids().end != st {
            return Err("the store table has regions other nodes lend after the devices".into());
        }
        if self.absent_slots() > 0 {
            return Err("the first device is laid out for cache.max_size past its size".into());
        }
        let first = self.slot_count();
        let to = first + slots;
        if slots == 0 || to > u64::from(u32::MAX) {
            return Err(format!("{slots} slots after {first}: slot ids are 32-bit"));
        }
        let mut cfg = self.cfg.clone();
        cfg.stores.push(StoreSpec::device(st, slots));
        cfg.validate()?;
        self.stores.push_device(cfg.layout());
        self.cfg = cfg;
        let to = to as u32;
        self.slots.resize(to as usize, self.cfg.track_last_access);
        self.valid.resize(to as usize);
        self.dirty.resize(to as usize);
        self.resize_index(to);
        for s in first as u32..to {
            self.withheld_idle(s);
        }
        for p in &mut self.vms {
            p.shares.push(0);
            p.held.push(0);
        }
        if let Some(shared) = self.shared.as_mut() {
            shared.set_capacity(u64::from(to));
        }
        self.refit_admission();
        Ok((st, first as u32))
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{EngineConfig, PartitionMode};
    use crate::device_failure::tests::{req, run};
    use crate::Engine;
    use cachevisor_trace::Op;

    #[test]
    fn a_device_added_joins_the_pool_once_its_slots_are_returned_and_no_slot_id_moves() {
        let cfg =
            EngineConfig { partition: PartitionMode::Shared, ..EngineConfig::with_slots(1) }.over_devices(&[4, 4]);
        let mut e = Engine::new(cfg).unwrap();
        for b in 0..8 {
            run(&mut e, req(if b % 2 == 0 { Op::Write } else { Op::Read }, b), None).unwrap();
        }
        let before: Vec<Option<u32>> = (0..8).map(|b| e.lookup(0, b)).collect();
        let (st, first) = e.add_device(6).unwrap();
        assert_eq!((st, first, e.slot_count(), e.withheld_slots()), (2, 8, 14, 6));
        assert!(e.layout().kind(2).is_local());
        // Withheld: nothing lands there yet (the cache is full: new blocks evict).
        for b in 8..12 {
            run(&mut e, req(Op::Read, b), None).unwrap();
            assert!(e.lookup(0, b).is_none_or(|s| e.layout().store_of(s) < 2));
        }
        e.check_invariants().unwrap();
        e.return_slots(first, 6);
        assert_eq!(e.withheld_slots(), 0);
        for b in 20..26 {
            run(&mut e, req(Op::Read, b), None).unwrap();
        }
        assert!(e.store_used(2) > 0, "new blocks land on the new device");
        // The blocks cached before kept their slots (the ones still cached).
        for (b, s) in before.iter().enumerate() {
            if let (Some(was), Some(now)) = (s, e.lookup(0, b as u64)) {
                assert_eq!(*was, now);
            }
        }
        e.check_invariants().unwrap();
        // A third device, while the cache runs on the other two.
        assert_eq!(e.add_device(2).unwrap(), (3, 14));
        e.check_invariants().unwrap();
    }

    #[test]
    fn an_engine_with_lent_regions_or_absent_slots_takes_no_device() {
        let lent = EngineConfig { stores: vec![crate::config::StoreSpec::lent(1, 4)], ..EngineConfig::with_slots(8) };
        assert!(Engine::new(lent).unwrap().add_device(4).unwrap_err().contains("lend"));
        let mut g = Engine::new_growable(EngineConfig::with_slots(16), 8).unwrap();
        assert!(g.add_device(4).unwrap_err().contains("max_size"));
        let mut one = Engine::new(EngineConfig::with_slots(8)).unwrap();
        assert_eq!(one.add_device(4).unwrap(), (1, 8), "a second device beside the first");
        one.check_invariants().unwrap();
    }
}
