//! Which of the host's cache devices a new block goes to. A host with several cache
//! devices (`StoreKind::Device` rows beside store 0) has one allocation over all of them:
//! the allocators and the replacement policies see one pool of slots, and only a block
//! that takes a *free* slot chooses a device — a victim's slot is reused where it is. The
//! choice weighs each device's free slots against the ops this engine has in flight on it
//! (its queue, counted as ops are handed out and completed — the same count in the
//! simulator, whose device models complete them, and in the daemon, whose devices do):
//! the device with the most free slots per op queued plus one, ties to the lowest store
//! id. Equal idle devices fill in turn; a device with twice the free space takes twice the
//! blocks; a device whose queue is long is passed over until it drains or the others
//! fill (CacheLib's navy places by hash instead: it has no queue to look at).
//!
//! Hand-written: an argmax over a handful of rows.

use crate::engine::Engine;
use crate::stores::StoreId;

/// A candidate device: its store, free slots, ops in flight on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub(crate) store: StoreId,
    pub(crate) free: u64,
    pub(crate) queued: u32,
}

/// The device a new block goes to among `cands` (each with a free slot): the most free
/// slots per queued op plus one, the first in `cands`' order on a tie; `None` for none.
pub(crate) fn choose(cands: impl Iterator<Item = Candidate>) -> Option<StoreId> {
    let mut best: Option<Candidate> = None;
    for c in cands.filter(|c| c.free > 0) {
        best = match best {
            // c.free / (1 + c.queued) > b.free / (1 + b.queued), in integers.
            Some(b)
                if u128::from(c.free) * u128::from(1 + b.queued) <= u128::from(b.free) * u128::from(1 + c.queued) =>
            {
                Some(b)
            }
            _ => Some(c),
        };
    }
    best.map(|c| c.store)
}

impl Engine {
    /// The local device a block taking a free slot goes to ([`choose`]): every local
    /// store with a free slot and below its cap; `None` when none has one.
    ///
    /// With dirty data mirrored (`dirty_mirror.rs`) a tie goes to the device after the
    /// last one chosen instead: each dirty block takes a slot on two devices, so their
    /// free counts stay equal, and lowest-first would put every block on the first device
    /// and every copy on the second (one device serving all the reads).
    pub(crate) fn local_store_for_new_block(&mut self) -> Option<StoreId> {
        self.park_pinned_free();
        let stores = &self.stores;
        let n = stores.local_ids().end;
        let start = if self.mirrors.on() { self.mirrors.next_device % n.max(1) } else { 0 };
        let chosen = choose((0..n).map(|i| (start + i) % n).filter(|&st| stores.open(st)).map(|st| Candidate {
            store: st,
            free: stores.free_count(st),
            queued: stores.queued(st),
        }));
        if let (true, Some(st)) = (self.mirrors.on(), chosen) {
            self.mirrors.next_device = (st + 1) % n.max(1);
        }
        chosen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn c(store: StoreId, free: u64, queued: u32) -> Candidate {
        Candidate { store, free, queued }
    }

    #[test]
    fn free_space_over_queue_picks_and_ties_go_low() {
        assert_eq!(choose([c(0, 10, 0), c(1, 10, 0)].into_iter()), Some(0));
        assert_eq!(choose([c(0, 10, 1), c(1, 10, 0)].into_iter()), Some(1));
        assert_eq!(choose([c(0, 10, 0), c(1, 21, 1)].into_iter()), Some(1), "21/2 > 10/1");
        assert_eq!(choose([c(0, 10, 0), c(1, 20, 1)].into_iter()), Some(0), "a tie: the lower id");
        assert_eq!(choose([c(0, 0, 0), c(1, 1, 99)].into_iter()), Some(1), "no free slot is no candidate");
        assert_eq!(choose(std::iter::empty()), None);
    }

    use crate::config::{EngineConfig, PartitionMode};
    use crate::output::{Location, OpKind, Output};
    use cachevisor_trace::{Op, Request};

    fn engine(sizes: &[u64]) -> Engine {
        let cfg = EngineConfig { partition: PartitionMode::Shared, ..EngineConfig::with_slots(1) }.over_devices(sizes);
        Engine::new(cfg).unwrap()
    }

    fn read(block: u64) -> Request {
        Request { time_ns: 0, vm: 0, op: Op::Read, offset: block * 4096, len: 4096 }
    }

    /// The store each miss's fill went to, misses of blocks `blocks` on the synchronous face.
    fn fills(e: &mut Engine, blocks: std::ops::Range<u64>) -> Vec<StoreId> {
        let mut out = Output::default();
        blocks
            .map(|b| {
                e.access(0, &read(b), &mut out);
                let fill = out.ops.iter().find(|o| o.kind == OpKind::SsdWrite).expect("a fill");
                let Location::Cache(st) = fill.loc else { panic!("{fill:?}") };
                assert_eq!(st, e.layout().store_of(fill.slot));
                st
            })
            .collect()
    }

    #[test]
    fn equal_idle_devices_fill_in_turn_and_unequal_ones_by_free_space() {
        let mut e = engine(&[4, 4]);
        assert_eq!(fills(&mut e, 0..8), [0, 1, 0, 1, 0, 1, 0, 1]);
        assert_eq!((e.store_used(0), e.store_used(1)), (4, 4));
        let mut e = engine(&[12, 4]);
        // Free (12, 4): store 0 until both have 4 free, then in turn.
        assert_eq!(fills(&mut e, 0..16), [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 1]);
        assert_eq!((e.store_used(0), e.store_used(1)), (12, 4));
        // Full: a miss reuses its victim's slot where it is, the allocation is one pool.
        assert_eq!(fills(&mut e, 16..20).len(), 4);
        assert_eq!((e.store_used(0), e.store_used(1)), (12, 4));
        e.check_invariants().unwrap();
    }

    #[test]
    fn a_device_with_ops_queued_is_passed_over() {
        // Store 0 has twice the free slots; one fill queued on it tips the next block over.
        let mut e = engine(&[8, 4]);
        e.submit(0, &read(0));
        let backing = e.poll_op().expect("the miss's backing read");
        assert_eq!(backing.kind, OpKind::BackingRead);
        e.handle_completion(1, backing.handle(), Ok(()));
        let fill = e.poll_op().expect("the fill");
        assert_eq!((fill.kind, fill.loc), (OpKind::SsdWrite, Location::Cache(0)));
        // Free (7, 4), queued (1, 0): 7/2 < 4/1.
        e.submit(2, &read(1));
        let b = e.poll_op().unwrap();
        e.handle_completion(3, b.handle(), Ok(()));
        let fill_b = e.poll_op().unwrap();
        assert_eq!(fill_b.loc, Location::Cache(1), "the idle device takes it");
        // Both drain; free (7, 3) idle: store 0 again.
        e.handle_completion(4, fill.handle(), Ok(()));
        e.handle_completion(4, fill_b.handle(), Ok(()));
        while e.poll_event().is_some() {}
        assert_eq!((e.stores.queued(0), e.stores.queued(1)), (0, 0));
        e.submit(5, &read(2));
        let c = e.poll_op().unwrap();
        e.handle_completion(6, c.handle(), Ok(()));
        assert_eq!(e.poll_op().unwrap().loc, Location::Cache(0));
    }

    proptest! {
        /// Against brute force: the chosen store's ratio is the largest (exact, as
        /// fractions), and no lower id has the same.
        #[test]
        fn the_choice_is_the_brute_force_argmax(rows in prop::collection::vec((0u64..1000, 0u32..64), 1..8)) {
            let cands: Vec<Candidate> = rows.iter().enumerate().map(|(i, &(f, q))| c(i as StoreId, f, q)).collect();
            let ratio = |c: &Candidate| (c.free as f64) / f64::from(1 + c.queued);
            let best = cands.iter().filter(|c| c.free > 0).map(ratio).fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))));
            let want = best.and_then(|b| cands.iter().find(|c| c.free > 0 && ratio(c) == b).map(|c| c.store));
            // Ratios as f64 are exact enough here: numerators below 2^10, denominators below 2^7.
            prop_assert_eq!(choose(cands.iter().copied()), want);
        }
    }
}
