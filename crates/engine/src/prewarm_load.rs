//! Prewarm loads: blocks read from a VM's backing store into free cache slots ahead of any
//! request (Nutanix prewarming slides, "Cache mechanics: prewarming": skip what is cached,
//! stop when the cache is full). The `prewarm` crate decides what and when; this is the
//! engine's half, run as a background job so its ops are ordinary device ops the drivers
//! already execute, and so a client request on a block being loaded waits for the load
//! (the job holds the block) and then acts on the loaded block: a write during prewarm
//! wins.

use crate::engine::Engine;
use crate::output::Output;
use crate::replacement::Replacement;
use crate::slot_table::pack_key;
use cachevisor_trace::VmId;

/// What one prewarm load did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrewarmOutcome {
    /// Blocks read from backing into the cache.
    pub loaded: u32,
    /// Blocks not loaded: cached already, or with a client request in flight on them.
    pub skipped: u32,
    /// Blocks not loaded because they are past the vDisk's end (a snapshot of a larger
    /// disk, a hostile one): never read, never a device error.
    pub out_of_range: u32,
    /// The VM's share of the cache had no free slot for the rest (nothing was evicted).
    pub no_room: bool,
}

/// Prewarmed blocks' protection inside the engine.
#[derive(Debug, Clone, Default)]
pub(crate) struct Protection {
    /// Prewarmed blocks not touched yet, protected from eviction until their deadline
    /// (slot → ms), when protection is on.
    protected: rustc_hash::FxHashMap<u32, u32>,
    /// How long a prewarmed block is protected, ms (`None`: not at all).
    protect_ms: Option<u32>,
}

impl Protection {
    /// Whether any prewarmed block is protected.
    #[inline]
    pub(crate) fn any(&self) -> bool {
        !self.protected.is_empty()
    }

    /// Whether slot `s` holds a prewarmed block still protected at `now_ms`.
    #[inline]
    pub(crate) fn protects(&self, s: u32, now_ms: u32) -> bool {
        self.any() && self.protected.get(&s).is_some_and(|&deadline| now_ms < deadline)
    }

    /// Slot `s`'s block moved to slot `d`: its protection goes with it.
    pub(crate) fn moved(&mut self, s: u32, d: u32) {
        if let Some(until) = self.any().then(|| self.protected.remove(&s)).flatten() {
            self.protected.insert(d, until);
        }
    }

    /// Slot `s` was touched or emptied: whatever it held is protected no more.
    #[inline]
    pub(crate) fn end(&mut self, s: u32) {
        if self.any() {
            self.protected.remove(&s);
        }
    }
}

impl Engine {
    /// Protects each block a prewarm loads from now on for `ms` milliseconds or until
    /// its first touch, whichever comes first (`None`: no protection). The slides leave
    /// it as future work ("prewarm set objects are given proper priority when evictions
    /// happen"); PostgreSQL's pg_prewarm gives none. A protected victim is passed over
    /// for the next unprotected one (at most 64 looked at; all protected: it goes).
    pub fn set_prewarm_protection(&mut self, ms: Option<u32>) {
        self.prewarmed.protect_ms = ms;
        if ms.is_none() {
            self.prewarmed.protected.clear();
        }
    }

    /// Loads blocks `first..first + len` of `vm` into free slots, as a background job's
    /// body (`submit_job(|e, out| outcome = e.prewarm_load(vm, first, len, out))`).
    ///
    /// A block already cached, or one a client request is working on right now (a
    /// write-around in flight would otherwise be overtaken by the old data), is skipped.
    /// Slots come from the free list only, within the VM's target in partitioned modes:
    /// prewarming never evicts. Loaded blocks enter the replacement policy through
    /// [`Replacement::insert_prewarmed`], in load order. A VM in pass-through takes none.
    pub fn prewarm_load(&mut self, vm: VmId, first: u64, len: u32, out: &mut Output) -> PrewarmOutcome {
        out.clear();
        self.load_blocks(vm, first, len, Load::Prewarm, out)
    }

    /// [`Self::prewarm_load`]'s loader, appending to `out`; a prefetch (`block_prefetch.rs`)
    /// may evict (the victims as any miss's: written back first when dirty), and marks
    /// what it loads as prefetched, its last block as its run's end.
    pub(crate) fn load_blocks(
        &mut self,
        vm: VmId,
        first: u64,
        len: u32,
        load: Load,
        out: &mut Output,
    ) -> PrewarmOutcome {
        let mut o = PrewarmOutcome::default();
        if Self::check_vm(vm).is_err() {
            o.out_of_range = len;
            return o;
        }
        // Only blocks within the vDisk: the rest are counted, never read.
        let end = first.saturating_add(len as u64).min(self.disk_blocks(vm)).max(first);
        o.out_of_range = (first.saturating_add(len as u64) - end) as u32;
        self.ensure_vm(vm);
        if self.vms[vm as usize].bypass {
            o.no_room = true;
            return o;
        }
        let spb = self.spb;
        let saved = std::mem::replace(&mut self.req.mode, crate::mode::Mode::FILL);
        let class = std::mem::take(&mut self.req.class); // a load is no request's class
        for b in first..end {
            let key = pack_key(vm, b);
            // A block this output writes back (a victim of the request it follows, on the
            // synchronous face) is not read from the backing store before that lands.
            let written_back = load == Load::Prefetch
                && out
                    .ops
                    .iter()
                    .any(|o| o.kind == crate::OpKind::BackingWrite && o.vm == vm && o.block(self.cfg.block_size) == b);
            if written_back || self.lookup(vm, b).is_some() || self.block_taken(key) {
                o.skipped += 1;
                continue;
            }
            if load == Load::Prewarm {
                let p = &self.vms[vm as usize];
                let room = if self.shared.is_some() {
                    self.free_available()
                } else {
                    p.used < p.target && self.free_kind_for(vm).is_some()
                };
                if !room {
                    o.no_room = true;
                    break;
                }
            }
            let Some(a) = self.allocate(vm, key, false, out) else {
                o.no_room = true;
                break;
            };
            debug_assert!(load == Load::Prefetch || a.evicted.is_none(), "prewarm evicts nothing");
            match load {
                Load::Prewarm => {
                    self.with_repl(vm, |r, t| {
                        r.remove(t, a.slot);
                        r.insert_prewarmed(t, a.slot);
                    });
                    if let Some(ms) = self.prewarmed.protect_ms {
                        self.prewarmed.protected.insert(a.slot, self.now_ms.saturating_add(ms));
                    }
                }
                // Where any new block enters (LRU's MRU end, two-pool's single-touch
                // pool): at the cold end, the next prefetch's own slots would evict it
                // before its read.
                Load::Prefetch => self.prefetcher.mark(a.slot, vm, b + 1 == end),
            }
            self.fill(vm, b, a.slot, (0, spb), a.phase, false, out);
            o.loaded += 1;
        }
        self.req.mode = saved;
        self.req.class = class;
        o
    }
}

/// Who loads blocks ahead of requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Load {
    /// A prewarm: free slots only, protected as set.
    Prewarm,
    /// A prefetch: may evict, marked until read.
    Prefetch,
}

#[cfg(test)]
mod tests {
    use crate::{Engine, EngineConfig, OpKind, Output, ReplacementKind};
    use cachevisor_trace::{Op, Request};

    fn engine(slots: u64, replacement: ReplacementKind) -> Engine {
        let mut cfg = EngineConfig::with_slots(slots);
        cfg.replacement = replacement;
        Engine::new(cfg).unwrap()
    }

    #[test]
    fn loads_free_slots_only_skips_cached_blocks_and_stops_at_the_target() {
        let mut e = engine(16, ReplacementKind::Lru);
        let mut out = Output::default();
        e.set_target(0, 4, &mut out);
        e.set_target(1, 12, &mut out);
        e.access(0, &Request { time_ns: 0, vm: 0, op: Op::Read, offset: 2 * 4096, len: 4096 }, &mut out);
        let o = e.prewarm_load(0, 0, 8, &mut out);
        assert_eq!((o.loaded, o.skipped, o.no_room), (3, 1, true), "blocks 0, 1, 3 fill the target of 4");
        let reads: Vec<_> =
            out.ops.iter().filter(|op| op.kind == OpKind::BackingRead).map(|op| op.disk_addr / 4096).collect();
        assert_eq!(reads, [0, 1, 3]);
        assert!(out.ops.iter().all(|op| !op.client), "background reads");
        assert_eq!(out.ops.iter().filter(|op| op.kind == OpKind::SsdWrite).count(), 3);
        assert_eq!(e.partition(0).used, 4);
        // Nothing evicted: block 2 (the VM's own) is still cached.
        assert!(e.lookup(0, 2).is_some());
        e.check_invariants().unwrap();
    }

    #[test]
    fn prewarmed_blocks_go_behind_in_load_order_so_the_most_important_stays_longest() {
        let mut e = engine(8, ReplacementKind::Lru);
        let mut out = Output::default();
        e.set_target(0, 8, &mut out);
        e.access(0, &Request { time_ns: 0, vm: 0, op: Op::Read, offset: 100 * 4096, len: 4096 }, &mut out);
        for b in [7u64, 3, 5] {
            assert_eq!(e.prewarm_load(0, b, 1, &mut out).loaded, 1);
        }
        let order: Vec<u64> = e.dump_partition(0).iter().map(|&s| e.slot_block(s).unwrap().1).collect();
        assert_eq!(order, [5, 3, 7, 100], "eviction order: least important prewarmed first, the request's block last");
    }

    #[test]
    fn two_pool_prewarm_fills_the_multi_touch_pool_first() {
        let mut e = engine(10, ReplacementKind::TwoPool);
        let mut out = Output::default();
        e.set_target(0, 10, &mut out);
        assert_eq!(e.prewarm_load(0, 0, 10, &mut out).loaded, 10);
        // The multi-touch pool holds 80%: blocks 0..8; 8 and 9 went to single-touch.
        let multi: Vec<u64> = (0..10u64).filter(|&b| e.slot_aux(e.lookup(0, b).unwrap()) & (1 << 4) != 0).collect();
        assert_eq!(multi, (0..8).collect::<Vec<_>>());
        let order: Vec<u64> = e.dump_partition(0).iter().map(|&s| e.slot_block(s).unwrap().1).collect();
        assert_eq!(order, [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]);
    }

    #[test]
    fn protected_prewarmed_blocks_outlive_request_blocks_until_touched_or_their_deadline() {
        let read = |e: &mut Engine, t_ms: u64, b: u64| {
            let mut out = Output::default();
            e.access(
                t_ms * 1_000_000,
                &Request { time_ns: 0, vm: 0, op: Op::Read, offset: b * 4096, len: 4096 },
                &mut out,
            );
            out.blocks[0].hit
        };
        for protect in [None, Some(1000)] {
            let mut e = engine(4, ReplacementKind::Lru);
            let mut out = Output::default();
            e.set_target(0, 4, &mut out);
            e.set_prewarm_protection(protect);
            assert_eq!(e.prewarm_load(0, 10, 2, &mut out).loaded, 2); // 10, 11 at the cold end
                                                                      // Four misses of one-touch blocks at t = 1 ms fill and evict.
            for b in [20u64, 21, 22, 23] {
                assert!(!read(&mut e, 1, b));
            }
            let kept: Vec<bool> = [10u64, 11].iter().map(|&b| e.lookup(0, b).is_some()).collect();
            match protect {
                None => assert_eq!(kept, [false, false], "no protection: the prewarmed blocks went first"),
                Some(_) => {
                    assert_eq!(kept, [true, true], "protected: the request blocks went instead");
                    // Touched: protection ends, it ages like any block.
                    assert!(read(&mut e, 2, 10));
                    assert!(!e.prewarmed.protected.contains_key(&e.lookup(0, 10).unwrap()));
                    // Past the deadline (t = 1,000 ms) block 11 is evictable again.
                    for b in [30u64, 31, 32, 33] {
                        read(&mut e, 1001, b);
                    }
                    assert!(e.lookup(0, 11).is_none(), "expired protection");
                }
            }
            e.check_invariants().unwrap();
        }
    }

    #[test]
    fn protection_never_makes_a_miss_bypass() {
        let mut e = engine(2, ReplacementKind::Lru);
        let mut out = Output::default();
        e.set_target(0, 2, &mut out);
        e.set_prewarm_protection(Some(u32::MAX));
        assert_eq!(e.prewarm_load(0, 0, 2, &mut out).loaded, 2);
        e.access(0, &Request { time_ns: 0, vm: 0, op: Op::Read, offset: 9 * 4096, len: 4096 }, &mut out);
        assert!(out.blocks[0].inserted, "all protected: one of them goes");
        e.check_invariants().unwrap();
    }

    #[test]
    fn shared_mode_loads_into_any_free_slot_and_pass_through_takes_none() {
        let mut cfg = EngineConfig::with_slots(4);
        cfg.partition = crate::PartitionMode::Shared;
        let mut e = Engine::new(cfg).unwrap();
        let mut out = Output::default();
        let o = e.prewarm_load(3, 10, 6, &mut out);
        assert_eq!((o.loaded, o.no_room), (4, true));
        e.set_bypass(3, true);
        assert_eq!(e.prewarm_load(3, 50, 1, &mut out).loaded, 0);
    }
}
