//! Cache migration between stores (ELICA §3.6): when a VM's shares change — less of its
//! target local and more on a lender, or from one lender to another — the blocks it holds
//! where it is now above its share move to a store where it is below, instead of waiting
//! to be replaced. A move is an SSD→SSD staged copy (the source slot read, the
//! destination written with those bytes), emitted as a background job:
//!
//! - the block's index points at the destination when the copy is emitted and the source
//!   slot is freed; the job holds the block (`inflight.rs`), so a request touching it
//!   waits until the copy landed — §3.7's update safety: data is never moved while being
//!   updated, and a write arriving during the transfer is applied after it, to the
//!   destination; the source slot stays pinned (never reused) until its read ended;
//! - a copy that fails puts the block back in its source slot with its valid and dirty
//!   sectors (`repair.rs`), as a failed write-back does: the source bytes were never
//!   overwritten, so nothing a client was told is written is lost;
//! - the block keeps its place in its replacement order ([`Replacement::replace`]).
//!
//! Schemes (per VM, [`Engine::set_migration`]): **Gradual** (§3.6.1) moves a block after
//! an access that hit it at a store where its VM is above its share (the copy reads the
//! source once more — the seed reuses the access's own read; ours keeps every copy a job
//! of its own, so coherency has one rule), and a miss of such a VM whose victim frees a
//! slot at a store above its share lands in a free slot of a store below it (promotion to
//! the destination). **Instant** (§3.6.2) does the same and, as the driver asks
//! ([`Engine::migrate_some`]), copies the VM's misplaced blocks in the order of the source
//! store's slots (sequential reads of the source SSD). **Off**: blocks stay until replaced.
//! Hand-written: bookkeeping over the engine's own slot table and free lists.

use crate::engine::Engine;
use crate::output::{DeviceOp, OpKind, Output};
use crate::replacement::Replacement;
use crate::slot_table::{key_vm, FREE_KEY};
use crate::stores::{StoreId, LOCAL};
use cachevisor_trace::VmId;

/// How a VM's misplaced blocks move (ELICA §3.6).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MigrationScheme {
    /// Blocks above a share stay until replaced (no copies).
    #[default]
    Off,
    /// Gradual Migration (§3.6.1): a block moves when accessed; misses land at the
    /// destination.
    Gradual,
    /// Instant Migration (§3.6.2): Gradual's routing plus a bulk copy the driver paces.
    Instant,
}

/// A VM's migration counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MigrationStats {
    /// Blocks moved so far (copies emitted and not undone by a failure).
    pub moved: u64,
    /// Blocks now at a store where the VM is above its share that a store where it is
    /// below could take: what is still to move (ELICA's reserved capacity, in blocks).
    pub misplaced: u64,
}

/// Migration's state inside the engine.
#[derive(Debug, Clone, Default)]
pub(crate) struct Moving {
    /// VMs whose migration scheme is not `Off`.
    migrating: u32,
    /// Block keys hits queued for a move (Gradual).
    gm_due: Vec<u64>,
    /// Slots moves and promotions let go of, freed once the ops being built are complete.
    deferred_free: Vec<u32>,
}

impl Moving {
    /// Whether some VM migrates (its scheme is not `Off`).
    #[inline]
    pub(crate) fn any(&self) -> bool {
        self.migrating > 0
    }

    /// Slot `s` is freed once the ops being built are complete.
    pub(crate) fn free_later(&mut self, s: u32) {
        self.deferred_free.push(s);
    }

    /// Whether slots wait to be freed.
    #[inline]
    pub(crate) fn frees_due(&self) -> bool {
        !self.deferred_free.is_empty()
    }

    /// Whether slot `s` waits to be freed.
    pub(crate) fn frees_later(&self, s: u32) -> bool {
        self.deferred_free.contains(&s)
    }

    /// Whether hits queued Gradual moves.
    pub(crate) fn moves_due(&self) -> bool {
        !self.gm_due.is_empty()
    }
}

impl Engine {
    /// Sets how `vm`'s blocks move when its shares change.
    pub fn set_migration(&mut self, vm: VmId, scheme: MigrationScheme) {
        self.ensure_vm(vm);
        let p = &mut self.vms[vm as usize];
        let was = p.migration != MigrationScheme::Off;
        p.migration = scheme;
        let now = scheme != MigrationScheme::Off;
        self.moving.migrating = self.moving.migrating + now as u32 - was as u32;
    }

    /// `vm`'s migration counters.
    pub fn migration_stats(&self, vm: VmId) -> MigrationStats {
        let Some(p) = self.vms.get(vm as usize) else { return MigrationStats::default() };
        let (mut over, mut under) = (0u64, 0u64);
        for store in self.stores.ids() {
            let (used, share) = self.held_and_share(vm, store);
            over += used.saturating_sub(share);
            under += share.saturating_sub(used);
        }
        MigrationStats { moved: p.moved, misplaced: over.min(under) }
    }

    /// Slots `vm` holds at `store`, and its share there (local: its target less its remote
    /// shares).
    fn held_and_share(&self, vm: VmId, store: StoreId) -> (u64, u64) {
        let p = &self.vms[vm as usize];
        match store {
            LOCAL => (p.held[0], p.target - p.remote_target.min(p.target)),
            r => (p.held[r as usize], p.shares[r as usize]),
        }
    }

    /// Whether `vm` holds more than its share at `store`.
    fn above_share(&self, vm: VmId, store: StoreId) -> bool {
        let (used, share) = self.held_and_share(vm, store);
        used > share
    }

    /// A store where `vm` holds less than its share and a free slot is left (local first).
    fn store_below_share(&mut self, vm: VmId) -> Option<StoreId> {
        self.park_pinned_free();
        self.stores.ids().find(|&st| {
            let (used, share) = self.held_and_share(vm, st);
            used < share && self.stores.open(st)
        })
    }

    /// A slot for `vm` at a store where it is below its share: a free one, else one
    /// reclaimed from another VM above its share there ([`Self::reclaim_at`]).
    fn destination_slot(&mut self, vm: VmId) -> Option<u32> {
        if let Some(store) = self.store_below_share(vm) {
            return self.take_free_of(store);
        }
        let below: Vec<StoreId> = self
            .stores
            .ids()
            .filter(|&st| {
                let (used, share) = self.held_and_share(vm, st);
                used < share
            })
            .collect();
        below.into_iter().find_map(|st| self.reclaim_at(st, vm))
    }

    /// Makes room at `store` for `vm` (ELICA §3.6.2: the destination's space is allocated
    /// first): a clean block of another VM above its share there but not above its target
    /// (a VM whose cache is moving elsewhere, not one shrinking — a paced shrink gives its
    /// blocks up through steals, clean ones first, `slot_alloc.rs`), with no op in flight
    /// and no request holding it, is dropped (the backing store has it) and its slot
    /// returned, on no list. Dirty ones are passed over: writing them back to make room
    /// put HDD writes ahead of their VMs' misses (Azure placement, Instant Migration:
    /// p99.99 33 ms → 251 ms); they leave as their VMs' misses replace them. Scans at most [`RECLAIM_SCAN`] slots from where it stopped last.
    /// Without this, two VMs each waiting for the other's store to free a slot (one
    /// moving local → lent, the other lent → local) would wait until misses evicted their
    /// blocks.
    fn reclaim_at(&mut self, store: StoreId, vm: VmId) -> Option<u32> {
        let (start, len) = self.stores.layout().range(store);
        if len == 0 {
            return None;
        }
        for _ in 0..RECLAIM_SCAN.min(len) {
            let at = self.stores.next_reclaim(store, len);
            let s = (start + at) as u32;
            let key = self.slots.key(s);
            if key == FREE_KEY {
                continue;
            }
            let owner = key_vm(key);
            if owner == vm
                || self.flight.pinned(s)
                || self.block_taken(key)
                || !self.above_share(owner, store)
                || self.vms[owner as usize].used > self.vms[owner as usize].target
            {
                continue;
            }
            if self.dirty.any(s, (0, self.spb)) {
                continue;
            }
            self.with_repl(owner, |r, t| r.remove(t, s));
            self.forget(owner, s);
            if self.dur.on() {
                // The journal may still say `s` holds that block: it goes to limbo, and
                // is a destination once a commit recorded it free (durability.rs's free
                // reserve; measured by the crash model: a move into it, then a crash,
                // left the record naming the old block over the new one's bytes).
                self.free_slot(s);
                return None;
            }
            return Some(s);
        }
        None
    }

    /// Moves `vm`'s block in slot `s` (at a store where `vm` is above its share, no op in
    /// flight on it) to a slot of a store where it is below ([`Self::destination_slot`]):
    /// the staged copy's ops go to `out`, the index points at the new slot, `s` is freed
    /// once `out` is complete ([`Self::free_deferred`]). Returns whether it moved.
    pub(crate) fn move_block(&mut self, vm: VmId, s: u32, out: &mut Output) -> bool {
        if !self.movable(s) {
            return false;
        }
        let Some(d) = self.destination_slot(vm) else { return false };
        self.move_block_to(vm, s, d, out);
        true
    }

    /// Whether the block in slot `s` may move now. A dirty one may not when its only
    /// copy would be on another node (`set_lent_write_through`), or in persistent mode:
    /// the record freeing `s` could be durable before the one naming the destination
    /// (each is journaled once its own ops end), and a crash between them would lose the
    /// only copy. It stays until written back.
    pub(crate) fn movable(&self, s: u32) -> bool {
        !((self.stores.lent_write_through() || self.dur.on()) && self.dirty.any(s, (0, self.spb)))
    }

    /// Moves `vm`'s block in slot `s` ([`Self::movable`], no op in flight on it) to free
    /// slot `d` (off every list): the staged copy's ops go to `out`, the index points at
    /// `d`, `s` is freed once `out` is complete ([`Self::free_deferred`]).
    pub(crate) fn move_block_to(&mut self, vm: VmId, s: u32, d: u32, out: &mut Output) {
        let key = self.slots.key(s);
        let spb = self.spb;
        let mut runs = std::mem::take(&mut self.scratch.runs);
        self.valid.runs(s, (0, spb), true, &mut runs);
        let first = self.next_op;
        for &run in &runs {
            let read = DeviceOp { staged: true, ..self.ssd(OpKind::SsdRead, vm, s, run, 0, false) };
            self.emit(out, read);
        }
        // The destination now names the block (its ops are built from its key).
        self.slots.set_key(d, key);
        for (i, &run) in runs.iter().enumerate() {
            let write = self.ssd(OpKind::SsdWrite, vm, d, run, 1, false);
            self.emit(out, DeviceOp { staged: true, source: std::num::NonZeroU64::new(first + i as u64), ..write });
        }
        self.scratch.runs = runs;
        // Metadata follows the bytes: sector bits, index, place in the order, counts.
        for i in 0..spb {
            let (v, dirty) = (self.valid.get(s, i), self.dirty.get(s, i));
            if v {
                self.valid.set(d, (i, i + 1));
            }
            if dirty {
                self.dirty.set(d, (i, i + 1));
            }
        }
        // The journal may still say `s` holds the block, clean: a write of it to the
        // backing store waits for the commit that frees `s` (as `forget`'s).
        self.dur.left_vouched(key, s);
        if self.ram.on() {
            self.ram.ssd_changed(s);
        }
        self.valid.clear_all(s);
        self.dirty.clear_all(s);
        let slots = &self.slots;
        self.index.remove(key, s, |x| slots.key(x));
        self.index.insert(key, d);
        self.with_repl(vm, |r, t| r.replace(t, s, d));
        self.slots.set_key(s, FREE_KEY);
        if !self.slots.last_access_ms.is_empty() {
            self.slots.last_access_ms[d as usize] = self.slots.last_access_ms[s as usize];
        }
        self.prewarmed.moved(s, d);
        self.prefetcher.moved(s, d);
        self.classes.moved(s, d);
        self.shared_budget.moved(s, d);
        self.count_store(vm, s, -1);
        self.count_store(vm, d, 1);
        self.note(s);
        self.note(d);
        self.moving.deferred_free.push(s);
        self.vms[vm as usize].moved += 1;
    }

    /// Frees the slots moves and promotions let go of while building one request's or
    /// job's ops: only now, so no later block of the same ops takes a slot an earlier op
    /// still reads (the job pins it when it starts; a pinned free slot is set aside).
    pub(crate) fn free_deferred(&mut self) {
        while let Some(s) = self.moving.deferred_free.pop() {
            self.free_slot(s);
        }
    }

    /// Gradual and Instant Migration's routing of a miss (§3.6.1): `vm`'s victim freed
    /// slot `s` at a store where `vm` is (still) at or above its share; if a store where
    /// it is below its share has a free slot, the new block goes there and `s` is freed
    /// with the request's ops. Returns the slot to use.
    pub(crate) fn promote_to_destination(&mut self, vm: VmId, s: u32) -> u32 {
        let st = self.store_of(s);
        let (used, share) = self.held_and_share(vm, st);
        if used < share {
            return s;
        }
        match self.store_below_share(vm).and_then(|to| self.take_free_of(to)) {
            Some(d) if self.dur.on() => {
                // Persistent mode: `s` came off the free list (the victim went to limbo,
                // `place_victim`); nothing names it, so it goes straight back. (Through
                // limbo it never got a free record to leave by: every commit after was
                // due, and a checkpoint waiting for rest never came — a daemon hung.)
                self.free_push_front(s);
                d
            }
            Some(d) => {
                self.moving.deferred_free.push(s);
                d
            }
            None => s,
        }
    }

    /// A hit on `vm`'s block in slot `s` (Gradual/Instant): queued to move once the
    /// request is done, if `vm` is above its share at `s`'s store.
    #[inline]
    pub(crate) fn note_hit_for_migration(&mut self, vm: VmId, s: u32) {
        if self.vms[vm as usize].migration != MigrationScheme::Off
            && self.moving.gm_due.len() < GM_DUE_MAX
            && self.above_share(vm, self.store_of(s))
        {
            self.moving.gm_due.push(self.slots.key(s));
        }
    }

    /// Moves the blocks hits queued ([`Self::note_hit_for_migration`]) that are still
    /// misplaced and free (no op in flight, no request holding or waiting for them), as
    /// one background job; the others are dropped (their next hit queues them again).
    pub(crate) fn run_gradual_moves(&mut self) {
        let due = std::mem::take(&mut self.moving.gm_due);
        let mut seen = rustc_hash::FxHashSet::default(); // one move per block per job
        self.submit_job(|e, out| {
            for key in due {
                if !seen.insert(key) {
                    continue;
                }
                let Some(s) = e.index.get(key, |x| e.slots.key(x)) else { continue };
                let vm = key_vm(key);
                let free = !e.flight.pinned(s) && !e.block_taken(key);
                if free && e.above_share(vm, e.store_of(s)) {
                    e.move_block(vm, s, out);
                }
            }
            e.free_deferred();
        });
    }

    /// Instant Migration's bulk copy (§3.6.2): moves up to `max` of `vm`'s misplaced
    /// blocks — those at stores where it is above its share, with no op in flight and no
    /// request holding or waiting for them — to stores where it is below, in slot order
    /// from where the last call stopped (sequential reads of the source store). Returns
    /// the blocks moved (0: nothing movable now).
    pub fn migrate_some(&mut self, vm: VmId, max: u64, out: &mut Output) -> u64 {
        self.ensure_vm(vm);
        let total = u64::from(self.present());
        if total == 0 || max == 0 {
            return 0;
        }
        let mut moved = 0;
        let start = self.vms[vm as usize].migration_cursor % total;
        let mut at = start;
        let mut seen = 0u64;
        while seen < total && moved < max {
            let s = at as u32;
            let key = self.slots.key(s);
            if key != FREE_KEY
                && key_vm(key) == vm
                && !self.flight.pinned(s)
                && !self.block_taken(key)
                && self.above_share(vm, self.store_of(s))
            {
                if self.move_block(vm, s, out) {
                    moved += 1;
                } else {
                    break; // no room where it should go (yet)
                }
            }
            at = (at + 1) % total;
            seen += 1;
        }
        self.vms[vm as usize].migration_cursor = at;
        self.free_deferred();
        moved
    }
}

/// Hits queued for a Gradual move at most between two retirements.
const GM_DUE_MAX: usize = 4096;
/// Slots [`Engine::reclaim_at`] looks at per call.
const RECLAIM_SCAN: u64 = 256;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PartitionMode;
    use crate::{EngineConfig, StoreSpec};
    use cachevisor_trace::{Op, Request};

    fn engine() -> Engine {
        let cfg = EngineConfig {
            partition: PartitionMode::Static,
            stores: vec![StoreSpec::lent(1, 8)],
            ..EngineConfig::with_slots(8)
        };
        Engine::new(cfg).unwrap()
    }

    fn write(e: &mut Engine, block: u64) -> Output {
        let mut out = Output::default();
        e.access(0, &Request { time_ns: 0, vm: 0, op: Op::Write, offset: block * 4096, len: 4096 }, &mut out);
        out
    }

    #[test]
    fn instant_migration_moves_misplaced_blocks_in_slot_order_and_keeps_them_dirty() {
        let mut e = engine();
        let mut out = Output::default();
        e.set_target(0, 6, &mut out);
        for b in 0..6 {
            write(&mut e, b);
        }
        assert_eq!(e.partition(0).remote_used, 0);
        // Four of its six slots now come from node 1: four local blocks are misplaced.
        e.set_remote_shares(0, &[(1, 4)]).unwrap();
        e.set_migration(0, MigrationScheme::Instant);
        assert_eq!(e.migration_stats(0).misplaced, 4);
        let mut out = Output::default();
        assert_eq!(e.migrate_some(0, 3, &mut out), 3);
        // Each move: a staged read of the local slot, then a staged write to node 1's.
        let reads: Vec<_> = out.ops.iter().filter(|o| o.kind == OpKind::SsdRead).collect();
        let writes: Vec<_> = out.ops.iter().filter(|o| o.kind == OpKind::SsdWrite).collect();
        assert_eq!((reads.len(), writes.len()), (3, 3));
        assert!(reads.iter().all(|o| o.loc == crate::Location::Cache(0) && o.staged && o.phase == 0));
        assert!(writes.iter().all(|o| o.loc == crate::Location::Cache(1) && o.source.is_some()));
        let order: Vec<u32> = reads.iter().map(|o| o.slot).collect();
        assert!(order.is_sorted(), "source slots in order: {order:?}");
        assert_eq!(e.migration_stats(0), MigrationStats { moved: 3, misplaced: 1 });
        assert_eq!(e.partition(0).remote_used, 3);
        assert_eq!(e.partition(0).dirty_blocks, 6);
        e.check_invariants().unwrap();
        let mut out = Output::default();
        assert_eq!(e.migrate_some(0, 8, &mut out), 1);
        assert_eq!(e.migrate_some(0, 8, &mut Output::default()), 0);
        assert_eq!(e.migration_stats(0).misplaced, 0);
        // Every block still hits, dirty, and a flush writes all six back.
        for b in 0..6 {
            assert!(e.holds(0, b, (0, 8)));
        }
        let mut out = Output::default();
        e.flush(None, &mut out);
        assert_eq!(out.ops.iter().filter(|o| o.kind == OpKind::BackingWrite).count(), 6);
        e.check_invariants().unwrap();
    }

    #[test]
    fn a_moved_block_keeps_its_place_in_the_lru_order() {
        let mut e = engine();
        e.set_target(0, 4, &mut Output::default());
        for b in 0..4 {
            write(&mut e, b);
        }
        let before: Vec<u64> = e.dump_partition(0).iter().map(|&s| e.slot_block(s).unwrap().1).collect();
        e.set_remote_shares(0, &[(1, 4)]).unwrap();
        e.set_migration(0, MigrationScheme::Instant);
        assert_eq!(e.migrate_some(0, 8, &mut Output::default()), 4);
        let after: Vec<u64> = e.dump_partition(0).iter().map(|&s| e.slot_block(s).unwrap().1).collect();
        assert_eq!(before, after);
        assert!(e.dump_partition(0).iter().all(|&s| s >= 8), "all in node 1's region");
    }

    #[test]
    fn gradual_migration_routes_misses_to_the_destination_and_moves_hit_blocks() {
        let mut e = engine();
        e.set_target(0, 4, &mut Output::default());
        for b in 0..4 {
            write(&mut e, b);
        }
        e.set_remote_shares(0, &[(1, 2)]).unwrap();
        e.set_migration(0, MigrationScheme::Gradual);
        // A miss at its target: the victim's local slot is freed, the block lands lent.
        let out = write(&mut e, 10);
        let w = out.ops.iter().find(|o| o.kind == OpKind::SsdWrite && o.client).unwrap();
        assert_eq!(w.loc, crate::Location::Cache(1));
        assert_eq!(e.partition(0).remote_used, 1);
        assert_eq!(e.free_slots(), 5 + 7, "the victim's local slot is free again");
        e.check_invariants().unwrap();
        // A hit on a local block queues it; the move runs as a job once requests end.
        let mut out = Output::default();
        e.access(0, &Request { time_ns: 0, vm: 0, op: Op::Read, offset: 3 * 4096, len: 4096 }, &mut out);
        assert_eq!(e.moving.gm_due.len(), 1);
        e.run_gradual_moves();
        let read = e.poll_op().unwrap();
        assert_eq!((read.kind, read.loc, e.poll_op()), (OpKind::SsdRead, crate::Location::Cache(0), None));
        e.handle_completion(0, read.handle(), Ok(()));
        let write = e.poll_op().unwrap();
        assert_eq!((write.kind, write.loc), (OpKind::SsdWrite, crate::Location::Cache(1)));
        e.handle_completion(0, write.handle(), Ok(()));
        assert_eq!(e.in_flight(), 0);
        e.check_invariants().unwrap();
        assert_eq!(e.partition(0).remote_used, 2);
        assert_eq!(e.migration_stats(0).misplaced, 0);
    }

    #[test]
    fn two_vms_trading_stores_make_room_for_each_other() {
        // VM 0 holds all 8 local slots, VM 1 all 8 lent ones; the allocation swaps them.
        let mut e = engine();
        e.set_target(0, 8, &mut Output::default());
        e.set_target(1, 8, &mut Output::default());
        e.set_remote_shares(1, &[(1, 8)]).unwrap();
        for b in 0..8 {
            for vm in 0..2 {
                let mut out = Output::default();
                let r = Request { time_ns: 0, vm, op: Op::Read, offset: b * 4096, len: 4096 };
                e.access(0, &r, &mut out);
            }
        }
        assert_eq!((e.partition(0).remote_used, e.partition(1).remote_used), (0, 8));
        e.set_remote_shares(0, &[(1, 8)]).unwrap();
        e.set_remote_shares(1, &[]).unwrap();
        for vm in 0..2 {
            e.set_migration(vm, MigrationScheme::Instant);
        }
        assert_eq!(e.free_slots(), 0);
        // No free slot anywhere: VM 0's first move takes a clean block VM 1 holds above its
        // share in the lent region; its own source slot then lets VM 1 move, and so on.
        let mut rounds = 0;
        while e.migration_stats(0).misplaced + e.migration_stats(1).misplaced > 0 {
            rounds += 1;
            assert!(rounds < 20, "stuck: {:?} {:?}", e.migration_stats(0), e.migration_stats(1));
            for vm in 0..2 {
                e.migrate_some(vm, 4, &mut Output::default());
            }
            e.check_invariants().unwrap();
        }
        assert_eq!((e.partition(0).remote_used, e.partition(1).remote_used), (8, 0));
        let kept =
            (0..8).filter(|&b| e.holds(0, b, (0, 8))).count() + (0..8).filter(|&b| e.holds(1, b, (0, 8))).count();
        // What breaks the deadlock: VM 0's first batch (4) drops as many of VM 1's clean
        // blocks; every later move finds the slot the other VM's last batch freed.
        assert_eq!(kept, 12, "one batch of the other VM's blocks dropped");
    }
}
