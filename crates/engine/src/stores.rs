//! The engine's store table: one row per cache store — the local SSD (store 0), then each
//! store of `EngineConfig::stores` (a region another node lends, ELICA §3.1) — with its
//! kind, its slot range, its free list, the slots in use and the cap a driver set. Every
//! slot belongs to exactly one store: a slot id is global, `StoreLayout` says which store
//! it is in and its index there, once, for the engine and for drivers alike (a cache op
//! names its store in `Location::Cache`, and its byte offset there is
//! [`StoreLayout::offset`]). Per VM, the slots held and the share wanted in each store
//! live in its partition (`Partition::held`, `Partition::shares`), indexed by store.
//!
//! Adding a store kind is a [`StoreKind`] variant and a device a driver runs its ops on;
//! the bookkeeping here is the same for every kind. Hand-written: bookkeeping over the
//! engine's own slot lists.

use crate::config::{EngineConfig, StoreKind};
use crate::engine::Engine;
use crate::output::{DeviceOp, Location};
use crate::slot_table::{List, SlotTable};
use cachevisor_trace::VmId;

/// A store's index in the engine's store table (0: the local cache store).
pub type StoreId = u16;

/// The local cache store's id.
pub const LOCAL: StoreId = 0;

/// Where each store's slots are: what the engine and its drivers look a slot's store and
/// an op's offset up in (cheap to clone: a driver's device threads keep a copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreLayout {
    kinds: Vec<StoreKind>,
    /// First slot of each store, then the total.
    starts: Vec<u64>,
    shift: u32,
}

impl StoreLayout {
    /// The layout of `cfg`'s stores: the local one, then `cfg.stores` in order.
    pub fn new(cfg: &EngineConfig) -> StoreLayout {
        let mut kinds = vec![StoreKind::Local];
        let mut starts = vec![0, cfg.slots];
        for s in &cfg.stores {
            kinds.push(s.kind);
            starts.push(starts.last().unwrap() + s.slots);
        }
        StoreLayout { kinds, starts, shift: cfg.block_size.trailing_zeros() }
    }

    /// Stores in the table.
    pub fn len(&self) -> usize {
        self.kinds.len()
    }

    /// Every slot of every store.
    pub fn total(&self) -> u64 {
        *self.starts.last().expect("the local store is always there")
    }

    /// Whether the table is empty (never: the local store is always there).
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// Store `id`'s kind.
    pub fn kind(&self, id: StoreId) -> StoreKind {
        self.kinds[id as usize]
    }

    /// Store `id`'s slots: the first, and how many.
    pub fn range(&self, id: StoreId) -> (u64, u64) {
        let i = id as usize;
        (self.starts[i], self.starts[i + 1] - self.starts[i])
    }

    /// The store of `kind`, if the table has one.
    pub fn find(&self, kind: StoreKind) -> Option<StoreId> {
        self.kinds.iter().position(|&k| k == kind).map(|i| i as StoreId)
    }

    /// The store slot `slot` is in.
    #[inline]
    pub fn store_of(&self, slot: u32) -> StoreId {
        let s = slot as u64;
        if s < self.starts[1] {
            return LOCAL;
        }
        debug_assert!(s < *self.starts.last().unwrap(), "slot {slot} past every store");
        (self.starts.partition_point(|&start| start <= s) - 1) as StoreId
    }

    /// Slot `slot`'s store and its index there (a byte offset is that index × the block).
    #[inline]
    pub fn index_of(&self, slot: u32) -> (StoreId, u64) {
        let st = self.store_of(slot);
        (st, slot as u64 - self.starts[st as usize])
    }

    /// A cache op's byte offset in its store: its slot's index there × the block size,
    /// plus the op's offset inside its block.
    #[inline]
    pub fn offset(&self, op: &DeviceOp) -> u64 {
        let Location::Cache(st) = op.loc else { panic!("a backing op has no cache offset: {op:?}") };
        let index = op.slot as u64 - self.starts[st as usize];
        (index << self.shift) + (op.disk_addr & ((1u64 << self.shift) - 1))
    }
}

/// One row of the engine's store table: the state that changes as slots are taken.
#[derive(Debug, Clone)]
struct Store {
    /// Free slots (pinned ones set aside in `Stores::parked`).
    free: List,
    /// Slots in use (every VM's).
    used: u64,
    /// The cap a driver set (`set_store_limit`; `u64::MAX`: none).
    limit: u64,
    /// Where migration's reclaim scan resumes (`migration.rs`).
    reclaim_cursor: u64,
    /// Ops handed out on the store and not yet completed (its queue, as this engine
    /// sees it: `device_placement.rs`).
    queued: u32,
}

/// The store table: the layout and a row per store.
#[derive(Debug, Clone)]
pub(crate) struct Stores {
    layout: StoreLayout,
    rows: Vec<Store>,
    /// Free slots taken off their free list because ops were still in flight on them (a
    /// victim's write-back reading it): they return when the ops' job retires, so taking
    /// a free slot never scans past them.
    parked: rustc_hash::FxHashSet<u32>,
    /// Writes to blocks in lent stores go through to the backing store, so no block there
    /// is ever dirty (`set_lent_write_through`).
    lent_write_through: bool,
    /// The host's own cache devices: stores `0..local` (store 0 and every
    /// `StoreKind::Device`; `EngineConfig::validate` keeps them first).
    local: StoreId,
}

impl Stores {
    /// Every store of `cfg` with all its slots free.
    pub(crate) fn new(cfg: &EngineConfig, slots: &mut SlotTable) -> Stores {
        let layout = cfg.layout();
        let rows = (0..layout.len())
            .map(|i| {
                let (first, n) = layout.range(i as StoreId);
                let mut free = List::default();
                for s in first..first + n {
                    free.push_back(slots, s as u32);
                }
                Store { free, used: 0, limit: u64::MAX, reclaim_cursor: 0, queued: 0 }
            })
            .collect();
        let local = (0..layout.len()).take_while(|&i| layout.kind(i as StoreId).is_local()).count() as StoreId;
        Stores { layout, rows, parked: Default::default(), lent_write_through: false, local }
    }

    /// Appends a cache device's row (`layout`, the table's with it last), its free list
    /// empty (its slots arrive withheld: `device_added.rs`).
    pub(crate) fn push_device(&mut self, layout: StoreLayout) {
        debug_assert_eq!(layout.len(), self.rows.len() + 1);
        debug_assert_eq!(self.local as usize, self.rows.len(), "devices come first");
        self.rows.push(Store { free: List::default(), used: 0, limit: u64::MAX, reclaim_cursor: 0, queued: 0 });
        self.layout = layout;
        self.local += 1;
    }

    /// Takes `layout` for the table's (a growable engine's: the local store's rows and
    /// free list stay, its slot ids reach further).
    pub(crate) fn relayout(&mut self, layout: StoreLayout) {
        debug_assert_eq!(layout.len(), self.rows.len());
        self.layout = layout;
    }

    /// Every store's id.
    pub(crate) fn ids(&self) -> impl Iterator<Item = StoreId> {
        0..self.rows.len() as StoreId
    }

    /// Free slots in every store (pinned ones set aside not counted).
    pub(crate) fn free_len(&self) -> u64 {
        self.rows.iter().map(|r| r.free.len() as u64).sum()
    }

    /// Whether store `st` has a free slot and is below its cap.
    #[inline]
    pub(crate) fn open(&self, st: StoreId) -> bool {
        let r = &self.rows[st as usize];
        r.free.front().is_some() && r.used < r.limit
    }

    /// Whether some store has a free slot and is below its cap.
    pub(crate) fn any_open(&self) -> bool {
        self.ids().any(|st| self.open(st))
    }

    /// Stores in the table.
    pub(crate) fn len(&self) -> usize {
        self.rows.len()
    }

    /// The host's own cache devices' stores (store 0 first).
    #[inline]
    pub(crate) fn local_ids(&self) -> std::ops::Range<StoreId> {
        0..self.local
    }

    /// Whether the host has more than one cache device.
    #[inline]
    pub(crate) fn several_devices(&self) -> bool {
        self.local > 1
    }

    /// Free slots on store `st`'s list.
    #[inline]
    pub(crate) fn free_count(&self, st: StoreId) -> u64 {
        self.rows[st as usize].free.len() as u64
    }

    /// Ops handed out on store `st` and not completed.
    #[inline]
    pub(crate) fn queued(&self, st: StoreId) -> u32 {
        self.rows[st as usize].queued
    }

    /// An op on store `st` was handed out (`ended`: it completed).
    #[inline]
    pub(crate) fn op_moved(&mut self, st: StoreId, ended: bool) {
        if let Some(r) = self.rows.get_mut(st as usize) {
            r.queued = if ended { r.queued.saturating_sub(1) } else { r.queued + 1 };
        }
    }

    pub(crate) fn layout(&self) -> &StoreLayout {
        &self.layout
    }

    /// Whether store `st` holds fewer slots than its cap.
    #[inline]
    pub(crate) fn below_cap(&self, st: StoreId) -> bool {
        let r = &self.rows[st as usize];
        r.used < r.limit
    }

    /// Store `st`'s cap (`u64::MAX`: none).
    pub(crate) fn limit(&self, st: StoreId) -> u64 {
        self.rows[st as usize].limit
    }

    /// Slots in use in store `st` (0 for a store not in the table).
    pub(crate) fn used(&self, st: StoreId) -> u64 {
        self.rows.get(st as usize).map_or(0, |r| r.used)
    }

    /// Counts a slot in or out of store `st`'s use (`delta` ±1).
    #[inline]
    pub(crate) fn count(&mut self, st: StoreId, delta: i64) {
        let row = &mut self.rows[st as usize];
        row.used = row.used.wrapping_add_signed(delta);
    }

    /// Store `st`'s free list.
    #[inline]
    pub(crate) fn free_list(&mut self, st: StoreId) -> &mut List {
        &mut self.rows[st as usize].free
    }

    /// Free slots set aside while pinned.
    pub(crate) fn parked_len(&self) -> usize {
        self.parked.len()
    }

    /// Sets free slot `s` aside: ops are still in flight on it.
    pub(crate) fn park(&mut self, s: u32) {
        self.parked.insert(s);
    }

    /// Takes slot `s` out of the set-aside ones; whether it was there.
    #[inline]
    pub(crate) fn unpark(&mut self, s: u32) -> bool {
        !self.parked.is_empty() && self.parked.remove(&s)
    }

    /// Moves the pinned slots at the front of every free list aside.
    #[inline]
    pub(crate) fn park_pinned_free(&mut self, slots: &mut SlotTable, pinned: impl Fn(u32) -> bool) {
        for r in self.rows.iter_mut() {
            while let Some(s) = r.free.front().filter(|&s| pinned(s)) {
                r.free.unlink(slots, s);
                self.parked.insert(s);
            }
        }
    }

    /// Where migration's reclaim scan of store `st` (`len` slots) looks next; the scan
    /// moves on by one.
    pub(crate) fn next_reclaim(&mut self, st: StoreId, len: u64) -> u64 {
        let row = &mut self.rows[st as usize];
        let at = row.reclaim_cursor % len;
        row.reclaim_cursor = at + 1;
        at
    }

    /// Whether writes to lent stores go through (`Engine::set_lent_write_through`).
    #[inline]
    pub(crate) fn lent_write_through(&self) -> bool {
        self.lent_write_through
    }
}

impl Engine {
    /// The store table's layout: where each store's slots are.
    pub fn layout(&self) -> &StoreLayout {
        &self.stores.layout
    }

    /// The store slot `s` is in.
    #[inline]
    pub(crate) fn store_of(&self, s: u32) -> StoreId {
        self.stores.layout.store_of(s)
    }

    /// `st`'s free list, with the slot table its links live in.
    fn free_list(&mut self, st: StoreId) -> (&mut List, &mut SlotTable) {
        (self.stores.free_list(st), &mut self.slots)
    }

    /// Puts a free slot at the back of its store's free list (a withheld one stays off).
    pub(crate) fn free_push_back(&mut self, s: u32) {
        if self.withheld_instead_of_free(s) {
            return;
        }
        let (list, slots) = self.free_list(self.store_of(s));
        list.push_back(slots, s);
    }

    /// Puts a free slot at the front of its store's free list (a withheld one stays off).
    pub(crate) fn free_push_front(&mut self, s: u32) {
        if self.withheld_instead_of_free(s) {
            return;
        }
        let (list, slots) = self.free_list(self.store_of(s));
        list.push_front(slots, s);
    }

    /// Takes a slot off its store's free list.
    pub(crate) fn free_unlink(&mut self, s: u32) {
        let (list, slots) = self.free_list(self.store_of(s));
        list.unlink(slots, s);
    }

    /// Takes a free slot with no ops in flight (a slot freed while its write-back runs is
    /// pinned until it ends): the local store's first (with several cache devices, the
    /// one `device_placement.rs` chooses), else the other stores' in order (shared mode)
    /// — a store at its cap gives none (a lost lender's region has cap 0: without this, a
    /// miss whose victim's freed slot was still pinned took a slot there and its write
    /// failed).
    #[inline]
    pub(crate) fn take_free(&mut self) -> Option<u32> {
        if self.stores.several_devices() {
            if let Some(st) = self.local_store_for_new_block() {
                return self.take_free_of(st);
            }
        }
        (0..self.stores.len() as StoreId)
            .find_map(|st| self.stores.below_cap(st).then(|| self.take_free_of(st)).flatten())
    }

    /// Takes a free slot of store `st`.
    #[inline]
    pub(crate) fn take_free_of(&mut self, st: StoreId) -> Option<u32> {
        self.park_pinned_free();
        let (list, slots) = self.free_list(st);
        let s = list.front()?;
        list.unlink(slots, s);
        Some(s)
    }

    /// Whether a free slot with no ops in flight is left.
    pub(crate) fn free_available(&mut self) -> bool {
        self.park_pinned_free();
        self.stores.any_open()
    }

    /// Moves pinned slots at the front of the free lists aside ([`Stores::park`]).
    #[inline]
    pub(crate) fn park_pinned_free(&mut self) {
        if self.flight.has_pins() {
            let flight = &self.flight;
            self.stores.park_pinned_free(&mut self.slots, |s| flight.pinned(s));
        }
    }

    /// Counts slot `s` in or out of `vm`'s slots in its store (`delta` ±1).
    #[inline]
    pub(crate) fn count_store(&mut self, vm: VmId, s: u32, delta: i64) {
        let st = self.store_of(s) as usize;
        let p = &mut self.vms[vm as usize];
        p.held[st] = p.held[st].wrapping_add_signed(delta);
        self.stores.count(st as StoreId, delta);
    }

    /// Slots in use in store `st` (every VM's).
    pub fn store_used(&self, st: StoreId) -> u64 {
        self.stores.used(st)
    }

    /// Caps the slots this engine's VMs may hold in store `st` (`u64::MAX`: no cap, the
    /// default). The local store's cap is, in a cluster, the node's SSD less what its
    /// borrowers hold in the regions it lent them; a lent store's is the space the lender
    /// has free for this engine now. A VM below its target at the cap takes a block from
    /// a VM above its own (paced) or replaces one of its own, as with no free slot; slots
    /// held above a lowered cap stay.
    pub fn set_store_limit(&mut self, st: StoreId, slots: u64) {
        if let Some(r) = self.stores.rows.get_mut(st as usize) {
            r.limit = slots;
        }
    }

    /// With `on`, a block in a store another node lends is never dirty: a write-back
    /// write that lands there is written through (the backing store has it before the
    /// reply), and migration moves no dirty block into such a store — so losing the
    /// lender loses no acknowledged write (the daemon's rule until a second copy exists;
    /// ELICA keeps write-back data in the remote SSD, as the simulator models by default).
    pub fn set_lent_write_through(&mut self, on: bool) {
        self.stores.lent_write_through = on;
    }

    /// Whether a write to slot `s` must go through (`set_lent_write_through`).
    #[inline]
    pub(crate) fn writes_through_at(&self, s: u32) -> bool {
        self.stores.lent_write_through && !self.stores.layout.kind(self.store_of(s)).is_local()
    }

    /// Slots in use in the local store (every VM's).
    pub fn used_local(&self) -> u64 {
        self.store_used(LOCAL)
    }

    /// [`Self::set_store_limit`] of the local store.
    pub fn set_local_limit(&mut self, slots: u64) {
        self.set_store_limit(LOCAL, slots);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{PartitionMode, StoreSpec, MAX_SLOTS};
    use crate::Output;
    use cachevisor_trace::{Op, Request};

    fn lent() -> EngineConfig {
        let stores = vec![StoreSpec::lent(2, 3), StoreSpec::lent(5, 1)];
        EngineConfig { stores, partition: PartitionMode::Shared, ..EngineConfig::with_slots(2) }
    }

    #[test]
    fn every_slot_is_in_one_store_after_the_local_ones() {
        let l = lent().layout();
        assert_eq!(lent().total_slots(), 6);
        let at: Vec<_> = (0..6).map(|s| l.index_of(s)).collect();
        assert_eq!(at, [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (2, 0)]);
        assert_eq!(l.kind(2), StoreKind::Lent { node: 5 });
        assert_eq!(l.find(StoreKind::Lent { node: 2 }), Some(1));
        assert_eq!(l.find(StoreKind::Lent { node: 9 }), None);
    }

    #[test]
    fn with_lent_write_through_no_block_in_a_lent_store_is_dirty() {
        let mut e = Engine::new(lent()).unwrap();
        e.set_lent_write_through(true);
        let l = e.layout().clone();
        let mut out = Output::default();
        let mut through = 0;
        for b in 0..6u64 {
            let req = Request { time_ns: 0, vm: 0, op: Op::Write, offset: b * 4096, len: 4096 };
            e.access(0, &req, &mut out);
            let at = out.ops.iter().find(|o| o.kind.is_ssd()).map(|o| l.store_of(o.slot)).unwrap();
            let backing = out.ops.iter().any(|o| o.kind == crate::output::OpKind::BackingWrite);
            assert_eq!(backing, at != LOCAL, "block {b} in store {at}: written through only there");
            through += u64::from(backing);
        }
        assert_eq!((through, e.partition(0).dirty_blocks), (4, 2), "the two local blocks are dirty");
    }

    #[test]
    fn a_lost_lender_takes_no_new_block_and_its_share_goes_local() {
        let cfg = EngineConfig { partition: PartitionMode::Static, ..lent() };
        let mut e = Engine::new(cfg).unwrap();
        let mut out = Output::default();
        e.set_target(0, 6, &mut out);
        e.set_remote_shares(0, &[(2, 3), (5, 1)]).unwrap();
        assert!(e.lose_lender(2));
        assert!(!e.lose_lender(2), "nothing more to change");
        assert!(!e.lose_lender(9), "no such region");
        let l = e.layout().clone();
        for b in 0..6u64 {
            let req = Request { time_ns: 0, vm: 0, op: Op::Read, offset: b * 4096, len: 4096 };
            e.access(0, &req, &mut out);
            for op in out.ops.iter().filter(|o| o.kind.is_ssd()) {
                assert_ne!(l.store_of(op.slot), 1, "block {b} placed in the lost lender's region");
            }
        }
        assert_eq!(e.used_in_region(2), 0);
        assert_eq!(e.used_in_region(5), 1, "the other lender's share holds");
    }

    #[test]
    fn a_lost_lenders_blocks_leave_so_no_miss_reuses_a_slot_there() {
        for persistent in [false, true] {
            lost_lender_run(persistent);
        }
    }

    /// A VM at its target (6 blocks: 2 local, 3 and 1 lent) replaces its own blocks on a
    /// miss; once lender 2 is lost none of them may be in its region — in persistent mode
    /// too, where a freed slot is pinned until its free is durable and the slot a miss
    /// takes is any free one below its store's cap.
    fn lost_lender_run(persistent: bool) {
        let cfg = EngineConfig { partition: PartitionMode::Static, ..lent() };
        let mut e = Engine::new(cfg).unwrap();
        if persistent {
            e.set_persistent(0);
        }
        e.set_lent_write_through(true);
        let mut out = Output::default();
        e.set_target(0, 6, &mut out);
        e.set_remote_shares(0, &[(2, 3), (5, 1)]).unwrap();
        let req = |b: u64, op| Request { time_ns: 0, vm: 0, op, offset: b * 4096, len: 4096 };
        for b in 0..6u64 {
            e.access(0, &req(b, Op::Read), &mut out);
        }
        assert_eq!(e.used_in_region(2), 3);
        assert!(e.lose_lender(2));
        assert_eq!(e.used_in_region(2), 0, "its clean blocks left at once");
        e.check_invariants().unwrap();
        let l = e.layout().clone();
        for b in 6..40u64 {
            for op in [Op::Write, Op::Read] {
                e.access(0, &req(b % 12, op), &mut out);
                for o in out.ops.iter().filter(|o| o.kind.is_ssd()) {
                    assert_ne!(
                        l.store_of(o.slot),
                        1,
                        "block {b} reached the lost lender's region (persistent {persistent})"
                    );
                }
            }
        }
        e.check_invariants().unwrap();
    }

    #[test]
    fn ops_on_a_store_s_slots_go_to_it_at_their_offset_there() {
        let c = lent();
        let mut e = Engine::new(c.clone()).unwrap();
        let l = e.layout().clone();
        let mut out = Output::default();
        // Six blocks written (write-back): every slot filled once, each write an op on the
        // slot's store at its index there.
        let mut seen = Vec::new();
        for b in 0..6u64 {
            let req = Request { time_ns: 0, vm: 0, op: Op::Write, offset: b * 4096 + 512, len: 512 };
            e.access(0, &req, &mut out);
            for op in out.ops.iter().filter(|o| o.kind.is_ssd()) {
                assert_eq!(op.loc, Location::Cache(l.store_of(op.slot)));
                seen.push((op.loc, l.offset(op)));
            }
        }
        assert_eq!(seen.len(), 6);
        for s in 0..6u32 {
            let (st, index) = l.index_of(s);
            assert!(seen.contains(&(Location::Cache(st), index * 4096 + 512)), "slot {s} at {st} {index} in {seen:?}");
        }
        assert_eq!((e.store_used(0), e.store_used(1), e.store_used(2)), (2, 3, 1));
    }

    #[test]
    fn bad_stores_are_named() {
        let zero = EngineConfig { stores: vec![StoreSpec::lent(4, 0)], ..EngineConfig::with_slots(2) };
        assert!(zero.validate().unwrap_err().contains("no slots"), "{:?}", zero.validate());
        let big = EngineConfig { stores: vec![StoreSpec::lent(1, MAX_SLOTS)], ..EngineConfig::with_slots(2) };
        assert!(big.validate().unwrap_err().contains("exceed"));
        let twice =
            EngineConfig { stores: vec![StoreSpec::lent(1, 2), StoreSpec::lent(1, 3)], ..EngineConfig::with_slots(2) };
        assert!(twice.validate().unwrap_err().contains("given twice"));
        let local = EngineConfig {
            stores: vec![StoreSpec { kind: StoreKind::Local, slots: 2 }],
            ..EngineConfig::with_slots(2)
        };
        assert!(local.validate().unwrap_err().contains("local store"));
    }
}
