//! The cache engine: a deterministic, sans-IO state machine over a global pool of SSD
//! slots. See the crate documentation for the call order.

use crate::block_index::BlockIndex;
use crate::config::{EngineConfig, FillMode, PartitionMode, SECTOR};
use crate::output::{BlockOutcome, DeviceOp, Evicted, Location, OpId, OpKind, Output, NO_SLOT};
use crate::replacement::{AnyReplacement, Replacement};
use crate::sector_bits::{SectorBits, SectorRange};
use crate::slot_table::{key_block, key_vm, pack_key, List, SlotTable, FREE_KEY};
use crate::write_policy::WritePolicy;
use cachevisor_trace::{Op, Request, VmId};

/// One VM's share of the pool.
#[derive(Debug, Clone)]
pub(crate) struct Partition {
    pub(crate) seq: crate::sequential_cutoff::SequentialCutoff,
    pub(crate) target: u64,
    pub(crate) used: u64,
    pub(crate) dirty_blocks: u64,
    pub(crate) write_policy: WritePolicy,
    pub(crate) repl: Option<AnyReplacement>,
    /// Misses take no slots (see [`Engine::set_bypass`]).
    pub(crate) bypass: bool,
}

/// A VM's partition as seen from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PartitionInfo {
    /// Slots the VM may hold (static partitioning; informational when shared).
    pub target: u64,
    /// Slots it holds.
    pub used: u64,
    /// Slots holding at least one dirty sector.
    pub dirty_blocks: u64,
    /// Its write policy.
    pub write_policy: WritePolicy,
}

/// Pinned victims a miss passes over before it bypasses (`unpinned_victim`).
const VICTIM_SCAN: usize = 64;

/// The engine.
#[derive(Debug, Clone)]
pub struct Engine {
    pub(crate) cfg: EngineConfig,
    pub(crate) spb: u32,
    pub(crate) shift: u32,
    pub(crate) slots: SlotTable,
    pub(crate) valid: SectorBits,
    pub(crate) dirty: SectorBits,
    pub(crate) index: BlockIndex,
    pub(crate) free: List,
    /// Free slots taken off the free list because ops were still in flight on them (a
    /// victim's write-back reading it): they return when the ops' job retires, so taking
    /// a free slot never scans past them.
    pub(crate) parked: rustc_hash::FxHashSet<u32>,
    /// Dirty slots a flush leaving write-back skipped (ops in flight on them): written
    /// back once those ops end, so a partition that left write-back keeps nothing dirty.
    pub(crate) left_dirty: Vec<u32>,
    /// A partition may be above its target (a shrink stopped at slots with ops in
    /// flight): checked when a job retires.
    pub(crate) shrink_due: bool,
    pub(crate) vms: Vec<Partition>,
    pub(crate) shared: Option<AnyReplacement>,
    runs: Vec<SectorRange>,
    runs2: Vec<SectorRange>,
    now_ms: u32,
    /// This request takes no new slots (sequential cutoff).
    no_insert: bool,
    /// [`Self::access_no_insert`] is running.
    force_no_insert: bool,
    /// Slots whose key or sector bits changed, when a driver asked for them.
    changed: Option<Vec<u32>>,
    /// Position of the global cleaner's scan (S-CAVE §V-B).
    pub(crate) cleaner_hand: u32,
    /// Id of the next device op emitted.
    next_op: OpId,
    /// The request being processed: (vm, first block, last block, block being processed).
    /// Blocks it used already (first..current) are never its own victims (their ops may
    /// run in the same phase as the eviction's); blocks are processed in ascending order.
    req_blocks: Option<(VmId, u64, u64, u64)>,
    /// Blocks of the request being processed that an earlier block of it evicted dirty,
    /// with the phase after that write-back: their own ops start there.
    req_evicted_dirty: Vec<(u64, u16)>,
    /// Added to the phase of every op emitted (see `req_evicted_dirty`).
    phase_base: u16,
    /// Operations in flight and requests waiting for them (see `inflight.rs`).
    pub(crate) flight: crate::inflight::Flight,
    /// Interval, flusher and cleaner timers (see `timers.rs`).
    pub(crate) timers: crate::timers::Timers,
    /// Persistent mode: commits, limbo, vouched slots (see `durability.rs`).
    pub(crate) dur: crate::durability::Durability,
}

/// Result of asking for a slot.
struct Alloc {
    slot: u32,
    evicted: Option<Evicted>,
    /// First phase the new block's own SSD ops may use.
    phase: u16,
}

impl Engine {
    /// Builds an engine; the error names the setting that is out of bounds.
    pub fn new(cfg: EngineConfig) -> Result<Self, String> {
        cfg.validate()?;
        let n = cfg.slots as usize;
        let spb = cfg.sectors_per_block();
        let mut slots = SlotTable::new(n, cfg.track_last_access);
        let mut free = List::default();
        for s in 0..n as u32 {
            free.push_back(&mut slots, s);
        }
        let shared = (cfg.partition == PartitionMode::Shared).then(|| cfg.replacement.build(cfg.slots));
        Ok(Engine {
            spb,
            shift: cfg.block_size.trailing_zeros(),
            valid: SectorBits::new(n, spb),
            dirty: SectorBits::new(n, spb),
            index: BlockIndex::new(n),
            slots,
            free,
            parked: Default::default(),
            left_dirty: Vec::new(),
            shrink_due: true,
            vms: Vec::new(),
            shared,
            runs: Vec::new(),
            runs2: Vec::new(),
            now_ms: 0,
            no_insert: false,
            force_no_insert: false,
            changed: None,
            cleaner_hand: 0,
            next_op: 1,
            req_blocks: None,
            req_evicted_dirty: Vec::new(),
            phase_base: 0,
            flight: Default::default(),
            timers: Default::default(),
            dur: Default::default(),
            cfg,
        })
    }

    // ----- getters -----

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// VMs known so far (ids are dense from 0).
    pub fn vm_count(&self) -> usize {
        self.vms.len()
    }

    /// A VM's partition (a VM never seen has an empty one).
    pub fn partition(&self, vm: VmId) -> PartitionInfo {
        match self.vms.get(vm as usize) {
            Some(p) => PartitionInfo {
                target: p.target,
                used: p.used,
                dirty_blocks: p.dirty_blocks,
                write_policy: p.write_policy,
            },
            None => PartitionInfo { target: 0, used: 0, dirty_blocks: 0, write_policy: self.cfg.write_policy },
        }
    }

    /// Free slots.
    pub fn free_slots(&self) -> u64 {
        self.free.len() as u64 + self.parked.len() as u64
    }

    /// The slot holding (vm, block), if cached.
    pub fn lookup(&self, vm: VmId, block: u64) -> Option<u32> {
        self.index.get(pack_key(vm, block), |x| self.slots.key(x))
    }

    /// Whether sectors `range` of (vm, block) are all cached (a read of them hits).
    pub fn holds(&self, vm: VmId, block: u64, range: (u32, u32)) -> bool {
        self.lookup(vm, block).is_some_and(|s| self.valid.all(s, range))
    }

    /// Whether sector `s` of `slot` is valid / dirty.
    pub fn sector_state(&self, slot: u32, s: u32) -> (bool, bool) {
        (self.valid.get(slot, s), self.dirty.get(slot, s))
    }

    /// The policy byte of a slot (CLOCK's reference counter in bits 0–3).
    pub fn slot_aux(&self, slot: u32) -> u8 {
        self.slots.aux[slot as usize]
    }

    /// Slots in the pool.
    pub fn slot_count(&self) -> u64 {
        self.slots.len() as u64
    }

    /// The owner of resident slot `s` and whether it has been referenced: bits 0–4 of its
    /// policy byte are non-zero (CLOCK's counter, S3-FIFO's frequency, hits since
    /// insertion for LRU and FIFO, the multi-touch bit of two-pool). This is the probe
    /// S-CAVE's rECS scan reads (§IV-B); `None` for a free slot.
    pub fn slot_referenced(&self, s: u32) -> Option<(VmId, bool)> {
        let k = self.slots.key(s);
        (k != FREE_KEY).then(|| (key_vm(k), self.slots.aux[s as usize] & 0x1f != 0))
    }

    /// (vm, block) held by a slot.
    pub fn slot_block(&self, slot: u32) -> Option<(VmId, u64)> {
        let k = self.slots.key(slot);
        (k != FREE_KEY).then(|| (key_vm(k), key_block(k)))
    }

    /// Last access of a slot in ms of the driver's clock, when tracked.
    pub fn slot_last_access_ms(&self, slot: u32) -> Option<u32> {
        self.slots.last_access_ms.get(slot as usize).copied()
    }

    /// Bytes of memory the per-slot metadata holds (slot table, bitmaps, index).
    pub fn metadata_bytes(&self) -> usize {
        self.slots.memory_bytes() + self.valid.memory_bytes() + self.dirty.memory_bytes() + self.index.memory_bytes()
    }

    /// Resident slots of a VM in eviction order (static partitions only).
    pub fn dump_partition(&self, vm: VmId) -> Vec<u32> {
        match (&self.shared, self.vms.get(vm as usize).and_then(|p| p.repl.as_ref())) {
            (Some(r), _) => r.dump(&self.slots).into_iter().filter(|&s| key_vm(self.slots.key(s)) == vm).collect(),
            (None, Some(r)) => r.dump(&self.slots),
            _ => Vec::new(),
        }
    }

    // ----- inputs -----

    /// Makes sure `vm` has a partition (target 0 until set).
    #[inline]
    pub fn ensure_vm(&mut self, vm: VmId) {
        if vm as usize >= self.vms.len() {
            self.add_vms(vm);
        }
    }

    #[cold]
    fn add_vms(&mut self, vm: VmId) {
        while self.vms.len() <= vm as usize {
            let repl = (self.cfg.partition == PartitionMode::Static).then(|| self.cfg.replacement.build(0));
            self.vms.push(Partition {
                seq: Default::default(),
                target: 0,
                used: 0,
                dirty_blocks: 0,
                write_policy: self.cfg.write_policy,
                repl,
                bypass: false,
            });
        }
    }

    /// [`Self::access`], but misses take no slots (they are read from or written to the
    /// backing store, bypassing the cache): a driver serving a read whose victim could not
    /// be written back.
    pub fn access_no_insert(&mut self, now_ns: u64, req: &Request, out: &mut Output) {
        self.force_no_insert = true;
        self.access(now_ns, req, out);
        self.force_no_insert = false;
    }

    /// Processes one request at driver time `now_ns`, filling `out` with per-block
    /// outcomes and the device operations to perform.
    pub fn access(&mut self, now_ns: u64, req: &Request, out: &mut Output) {
        out.clear();
        self.ensure_vm(req.vm);
        self.now_ms = (now_ns / 1_000_000) as u32;
        if req.len == 0 {
            return;
        }
        let p = &mut self.vms[req.vm as usize];
        self.no_insert = p.seq.bypass(req.offset, req.len as u64) || p.bypass || self.force_no_insert;
        let bs = self.cfg.block_size;
        let (first, last) = (req.offset >> self.shift, (req.end() - 1) >> self.shift);
        self.req_blocks = Some((req.vm, first, last, first));
        let aligned = (req.offset | req.len as u64).is_multiple_of(SECTOR);
        for b in first..=last {
            if let Some(r) = self.req_blocks.as_mut() {
                r.3 = b;
            }
            if !self.req_evicted_dirty.is_empty() {
                let key = pack_key(req.vm, b);
                self.phase_base = self.req_evicted_dirty.iter().find(|e| e.0 == key).map_or(0, |e| e.1);
            }
            let start = b << self.shift;
            let lo = req.offset.max(start) - start;
            let hi = req.end().min(start + bs) - start;
            let r = ((lo / SECTOR) as u32, hi.div_ceil(SECTOR) as u32);
            match req.op {
                Op::Read => self.read_block(req.vm, b, r, out),
                Op::Write if aligned => self.write_block(req.vm, b, r, out),
                Op::Write => self.write_unaligned(req.vm, b, lo, hi, out),
            }
        }
        self.req_blocks = None;
        self.req_evicted_dirty.clear();
        self.phase_base = 0;
    }

    // ----- request paths -----

    /// An op on sectors `lo..hi` of `block` (its id is given by [`Self::emit`]).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn op(
        &self,
        kind: OpKind,
        loc: Location,
        vm: VmId,
        block: u64,
        slot: u32,
        (lo, hi): SectorRange,
        phase: u16,
        sync: bool,
    ) -> DeviceOp {
        DeviceOp {
            id: 0,
            req: 0,
            kind,
            loc,
            vm,
            disk_addr: (block << self.shift) + lo as u64 * SECTOR,
            slot,
            len: (hi - lo) * SECTOR as u32,
            phase,
            sync,
            staged: false,
            client: false,
            source: None,
            job: 0,
        }
    }

    /// An SSD op on sectors of a slot (the slot's key must already name its block).
    #[inline]
    fn ssd(&self, kind: OpKind, vm: VmId, slot: u32, r: SectorRange, phase: u16, sync: bool) -> DeviceOp {
        let block = key_block(self.slots.key(slot));
        self.op(kind, Location::Ssd(0), vm, block, slot, r, phase, sync)
    }

    /// A backing op on sectors of a block.
    #[inline]
    fn backing(&self, kind: OpKind, vm: VmId, block: u64, r: SectorRange, phase: u16, sync: bool) -> DeviceOp {
        self.op(kind, Location::Backing(vm), vm, block, NO_SLOT, r, phase, sync)
    }

    /// Gives `op` the next id and appends it to `out`; returns the id.
    #[inline]
    pub(crate) fn emit(&mut self, out: &mut Output, mut op: DeviceOp) -> OpId {
        op.id = self.next_op;
        op.phase += self.phase_base;
        self.next_op += 1;
        out.ops.push(op);
        op.id
    }

    #[inline]
    fn read_block(&mut self, vm: VmId, b: u64, r: SectorRange, out: &mut Output) {
        let key = pack_key(vm, b);
        if let Some(s) = self.index.get(key, |x| self.slots.key(x)) {
            self.touch(vm, s);
            if self.valid.all(s, r) {
                let op = DeviceOp { client: true, ..self.ssd(OpKind::SsdRead, vm, s, r, 0, true) };
                self.emit(out, op);
                out.blocks.push(BlockOutcome { block: b, hit: true, inserted: false, bypassed: false, evicted: None });
                return;
            }
            // Partial hit: valid sectors from the SSD, the rest from backing, then filled.
            let mut valid_runs = std::mem::take(&mut self.runs);
            self.valid.runs(s, r, true, &mut valid_runs);
            for &run in &valid_runs {
                let op = DeviceOp { client: true, ..self.ssd(OpKind::SsdRead, vm, s, run, 0, true) };
                self.emit(out, op);
            }
            self.runs = valid_runs;
            let fill = if self.cfg.fill == FillMode::Block { (0, self.spb) } else { r };
            self.fill(vm, b, s, fill, 0, out);
            out.blocks.push(BlockOutcome { block: b, hit: false, inserted: false, bypassed: false, evicted: None });
            return;
        }
        match self.allocate(vm, key, false, out) {
            Some(a) => {
                let fill = if self.cfg.fill == FillMode::Block { (0, self.spb) } else { r };
                self.fill(vm, b, a.slot, fill, a.phase, out);
                out.blocks.push(BlockOutcome {
                    block: b,
                    hit: false,
                    inserted: true,
                    bypassed: false,
                    evicted: a.evicted,
                });
            }
            None => {
                let op = DeviceOp { client: true, ..self.backing(OpKind::BackingRead, vm, b, r, 0, true) };
                self.emit(out, op);
                out.blocks.push(BlockOutcome { block: b, hit: false, inserted: false, bypassed: true, evicted: None });
            }
        }
    }

    /// Reads the invalid sectors of `range` from backing (sync) and writes them into the
    /// slot (async, from `phase` on, at least after the reads).
    #[inline]
    fn fill(&mut self, vm: VmId, b: u64, s: u32, range: SectorRange, phase: u16, out: &mut Output) {
        let mut runs = std::mem::take(&mut self.runs2);
        if self.valid.any(s, (0, self.spb)) {
            self.valid.runs(s, range, false, &mut runs);
        } else {
            runs.clear();
            runs.push(range);
        }
        let first = self.next_op;
        for &run in &runs {
            let op = DeviceOp { staged: true, client: true, ..self.backing(OpKind::BackingRead, vm, b, run, 0, true) };
            self.emit(out, op);
        }
        for (i, &run) in runs.iter().enumerate() {
            let op = self.ssd(OpKind::SsdWrite, vm, s, run, phase.max(1), false);
            self.emit(out, DeviceOp { staged: true, source: std::num::NonZeroU64::new(first + i as u64), ..op });
            self.valid.set(s, run);
            self.note(s);
        }
        self.runs2 = runs;
    }

    #[inline]
    fn write_block(&mut self, vm: VmId, b: u64, r: SectorRange, out: &mut Output) {
        let policy = self.vms[vm as usize].write_policy;
        let key = pack_key(vm, b);
        let resident = self.index.get(key, |x| self.slots.key(x));
        let allocate = matches!(policy, WritePolicy::Wb | WritePolicy::Wt);
        let (slot, phase, inserted, evicted) = match (resident, policy) {
            (_, WritePolicy::Ro) => {
                let op = DeviceOp { client: true, ..self.backing(OpKind::BackingWrite, vm, b, r, 0, true) };
                self.emit(out, op);
                if let Some(s) = resident {
                    self.invalidate(vm, s, r);
                }
                out.blocks.push(BlockOutcome { block: b, hit: false, inserted: false, bypassed: true, evicted: None });
                return;
            }
            (Some(s), _) if self.relocates(policy, s, r) => {
                // Persistent mode: a write-back write of a whole block the journal vouches
                // clean moves to a durable free slot instead of waiting for an intent
                // commit; the old slot, still the journal's copy until the commit that
                // frees it, goes to limbo.
                self.with_repl(vm, |rp, t| rp.remove(t, s));
                self.release(vm, s);
                match self.allocate(vm, key, true, out) {
                    Some(a) => (Some(a.slot), a.phase, false, None),
                    None => (None, 0, false, None),
                }
            }
            (Some(s), _) => {
                self.touch(vm, s);
                (Some(s), 0, false, None)
            }
            (None, _) if allocate => match self.allocate(vm, key, true, out) {
                Some(a) => (Some(a.slot), a.phase, true, a.evicted),
                None => (None, 0, false, None),
            },
            (None, _) => (None, 0, false, None),
        };
        let Some(s) = slot else {
            let op = DeviceOp { client: true, ..self.backing(OpKind::BackingWrite, vm, b, r, 0, true) };
            self.emit(out, op);
            out.blocks.push(BlockOutcome { block: b, hit: false, inserted: false, bypassed: true, evicted: None });
            return;
        };
        let op = DeviceOp { client: true, ..self.ssd(OpKind::SsdWrite, vm, s, r, phase, true) };
        self.emit(out, op);
        self.valid.set(s, r);
        self.note(s);
        if policy == WritePolicy::Wb {
            self.mark_dirty(vm, s, r);
        } else {
            let op = DeviceOp { client: true, ..self.backing(OpKind::BackingWrite, vm, b, r, 0, true) };
            self.emit(out, op);
            self.clear_dirty(vm, s, r);
        }
        out.blocks.push(BlockOutcome { block: b, hit: resident.is_some(), inserted, bypassed: false, evicted });
    }

    /// Whether a write of sectors `r` under `policy` to resident slot `s` moves the block
    /// to a free slot (persistent mode, write-back, the whole block, a clean block some of
    /// which the journal vouches clean, and a durable free slot to move to): the common
    /// rewrite of clean cached data then needs no commit before its cache write
    /// (`durability.rs`). The old slot goes to limbo; a crash before the new record is
    /// durable finds the block clean in it or (its free record durable) not cached: the
    /// backing store holds the same bytes either way.
    #[inline]
    fn relocates(&mut self, policy: WritePolicy, s: u32, r: SectorRange) -> bool {
        self.dur.on
            && policy == WritePolicy::Wb
            && r == (0, self.spb)
            && self.dur.is_vouched(s)
            // A dirty sector's only copy is here: its slot must stay the journal's copy
            // until the new slot's record is durable, which a free record committed first
            // would break (the new write may still be in flight).
            && !self.dirty.any(s, (0, self.spb))
            && !self.flight.pinned(s)
            && self.free_available()
    }

    /// A write that does not cover whole sectors passes through to backing: dirty cached
    /// sectors it touches are written back first, then the touched sectors are invalidated.
    fn write_unaligned(&mut self, vm: VmId, b: u64, lo: u64, hi: u64, out: &mut Output) {
        let r = ((lo / SECTOR) as u32, hi.div_ceil(SECTOR) as u32);
        let mut phase = 0;
        if let Some(s) = self.lookup(vm, b) {
            if self.writeback(vm, s, r, 0, true, out) > 0 {
                phase = 2;
            }
            self.invalidate(vm, s, r);
        }
        let disk_addr = (b << self.shift) + lo;
        let op = DeviceOp {
            disk_addr,
            len: (hi - lo) as u32,
            client: true,
            ..self.backing(OpKind::BackingWrite, vm, b, (0, 0), phase, true)
        };
        self.emit(out, op);
        out.blocks.push(BlockOutcome { block: b, hit: false, inserted: false, bypassed: true, evicted: None });
    }

    // ----- slot bookkeeping -----

    /// Runs `f` on the policy that orders `vm`'s blocks, with the slot table.
    #[inline]
    pub(crate) fn with_repl<R>(&mut self, vm: VmId, f: impl FnOnce(&mut AnyReplacement, &mut SlotTable) -> R) -> R {
        let repl = match &mut self.shared {
            Some(r) => r,
            None => self.vms[vm as usize].repl.as_mut().expect("static partition has a policy"),
        };
        f(repl, &mut self.slots)
    }

    #[inline]
    fn touch(&mut self, vm: VmId, s: u32) {
        if !self.slots.last_access_ms.is_empty() {
            self.slots.last_access_ms[s as usize] = self.now_ms;
        }
        self.with_repl(vm, |r, t| r.touch(t, s));
    }

    fn mark_dirty(&mut self, vm: VmId, s: u32, r: SectorRange) {
        if !self.dirty.any(s, (0, self.spb)) {
            self.vms[vm as usize].dirty_blocks += 1;
        }
        self.dirty.set(s, r);
        self.note(s);
    }

    fn clear_dirty(&mut self, vm: VmId, s: u32, r: SectorRange) {
        let was = self.dirty.any(s, (0, self.spb));
        self.dirty.clear(s, r);
        // The flusher's write-backs leave the journal saying dirty (`durability.rs`).
        if !self.dur.lazy_clean {
            self.note(s);
        }
        if was && !self.dirty.any(s, (0, self.spb)) {
            self.vms[vm as usize].dirty_blocks -= 1;
        }
    }

    /// Drops sectors `r` of a slot; a slot left with no valid sector is freed.
    pub(crate) fn invalidate(&mut self, vm: VmId, s: u32, r: SectorRange) {
        self.clear_dirty(vm, s, r);
        self.valid.clear(s, r);
        self.note(s);
        if !self.valid.any(s, (0, self.spb)) {
            self.with_repl(vm, |r, t| r.remove(t, s));
            self.release(vm, s);
        }
    }

    /// Writes back the dirty sectors of `r` in slot `s` (SSD read in `phase`, backing
    /// write in `phase + 1`) and cleans them; returns the sectors written back.
    pub(crate) fn writeback(
        &mut self,
        vm: VmId,
        s: u32,
        r: SectorRange,
        phase: u16,
        sync: bool,
        out: &mut Output,
    ) -> u32 {
        if !self.dirty.any(s, r) {
            return 0;
        }
        let mut runs = std::mem::take(&mut self.runs);
        self.dirty.runs(s, r, true, &mut runs);
        let block = key_block(self.slots.key(s));
        let mut n = 0;
        for &run in &runs {
            let read = self.emit(out, DeviceOp { staged: true, ..self.ssd(OpKind::SsdRead, vm, s, run, phase, sync) });
            let write = self.backing(OpKind::BackingWrite, vm, block, run, phase + 1, sync);
            self.emit(out, DeviceOp { staged: true, source: std::num::NonZeroU64::new(read), ..write });
            n += run.1 - run.0;
        }
        self.runs = runs;
        if n > 0 {
            self.clear_dirty(vm, s, r);
        }
        n
    }

    /// Notes a slot whose persisted state changed (when tracking).
    #[inline]
    pub(crate) fn note(&mut self, s: u32) {
        if let Some(c) = self.changed.as_mut() {
            c.push(s);
        }
    }

    /// Starts (or stops) keeping the list of slots whose key or sector bits change, for a
    /// driver that persists metadata ([`Self::take_changed`]).
    pub fn track_changes(&mut self, on: bool) {
        self.changed = on.then(Vec::new);
    }

    /// Moves the slots changed since the last call into `into` (sorted, unique).
    /// Slots with ops in flight stay for a later call (their state is not settled: a
    /// write-back marked clean may yet fail); they are noted again when their ops end.
    pub fn take_changed(&mut self, into: &mut Vec<u32>) {
        into.clear();
        if let Some(c) = self.changed.as_mut() {
            into.append(c);
            into.sort_unstable();
            into.dedup();
            if self.flight.has_pins() {
                into.retain(|&s| {
                    let pinned = self.flight.pinned(s);
                    if pinned {
                        c.push(s);
                    }
                    !pinned
                });
            }
        }
    }

    /// Forgets a slot's block (already out of its policy): index, bits, owner's count.
    /// The slot is on no list afterwards; the caller reuses it or frees it.
    #[inline]
    pub(crate) fn forget(&mut self, vm: VmId, s: u32) {
        let key = self.slots.key(s);
        if self.dur.on && self.dur.is_vouched(s) {
            self.dur.vouched_elsewhere.insert(key, s);
        }
        let slots = &self.slots;
        self.index.remove(key, s, |x| slots.key(x));
        self.slots.set_key(s, FREE_KEY);
        self.note(s);
        self.valid.clear_all(s);
        self.dirty.clear_all(s);
        self.vms[vm as usize].used -= 1;
    }

    /// Returns a slot (already out of its policy) to the free list.
    pub(crate) fn release(&mut self, vm: VmId, s: u32) {
        self.forget(vm, s);
        self.free_slot(s);
    }

    /// Takes a victim from `vm`'s policy (or the shared one), writes it back if dirty and
    /// forgets it. Returns the slot, on no list, for the caller to reuse or free.
    #[inline]
    pub(crate) fn evict_from(&mut self, vm: VmId, sync: bool, out: &mut Output) -> Option<(u32, Evicted)> {
        let s = self.unpinned_victim(vm)?;
        let key = self.slots.key(s);
        let owner = key_vm(key);
        let dirty_sectors = self.writeback(owner, s, (0, self.spb), 0, sync, out);
        if dirty_sectors > 0
            && self
                .req_blocks
                .is_some_and(|(vm, first, last, _)| owner == vm && (first..=last).contains(&key_block(key)))
        {
            self.req_evicted_dirty.push((key, self.phase_base + 2));
        }
        self.forget(owner, s);
        Some((s, Evicted { vm: owner, block: key_block(key), dirty_sectors }))
    }

    /// The policy's next victim among slots with no ops in flight (pinned ones it offers
    /// are put back: they are in use right now). `None` when every resident slot is pinned.
    #[inline]
    fn unpinned_victim(&mut self, vm: VmId) -> Option<u32> {
        let s = self.with_repl(vm, |r, t| r.evict(t))?;
        // Persistent mode: no block of the request at all (one it evicted would reach the
        // backing store before the commit freeing its old, vouched-for slot).
        let pinned = |e: &Engine, s: u32| {
            e.flight.pinned(s)
                || e.req_blocks.is_some_and(|(vm, first, last, current)| {
                    let k = e.slots.key(s);
                    let end = if e.dur.on { last } else { current };
                    key_vm(k) == vm && (first..=end).contains(&key_block(k))
                })
        };
        if !pinned(self, s) {
            return Some(s);
        }
        // At most VICTIM_SCAN pinned victims are passed over: when more of the policy's
        // coldest blocks have ops in flight (fills queued behind an overloaded backing
        // store), the new block bypasses rather than every miss scanning them all.
        let mut aside = vec![s];
        let found = loop {
            match self.with_repl(vm, |r, t| r.evict(t)) {
                Some(s) if pinned(self, s) && aside.len() < VICTIM_SCAN => aside.push(s),
                Some(s) if pinned(self, s) => {
                    aside.push(s);
                    break None;
                }
                other => break other,
            }
        };
        for s in aside {
            self.with_repl(vm, |r, t| r.insert(t, s));
        }
        found
    }

    /// Takes a free slot with no ops in flight (a slot freed while its write-back runs
    /// is pinned until it ends).
    #[inline]
    fn take_free(&mut self) -> Option<u32> {
        self.park_pinned_free();
        let s = self.free.front()?;
        self.free.unlink(&mut self.slots, s);
        Some(s)
    }

    /// Whether a free slot with no ops in flight is left.
    fn free_available(&mut self) -> bool {
        self.park_pinned_free();
        self.free.front().is_some()
    }

    /// Moves pinned slots at the front of the free list aside ([`Engine::parked`]).
    fn park_pinned_free(&mut self) {
        while let Some(s) = self.free.front().filter(|&s| self.flight.pinned(s)) {
            self.free.unlink(&mut self.slots, s);
            self.parked.insert(s);
        }
    }

    /// Evicts one of `vm`'s blocks (or the shared policy's) for a new block: its slot, or
    /// in persistent mode a durable free one (the victim's goes to limbo); `None` when no
    /// victim can be had, or no durable free slot is left — then nothing is evicted (the
    /// partition keeps its blocks; only the new block bypasses the cache until the next
    /// commit returns slots from limbo).
    fn victim_slot(&mut self, vm: VmId, sync: bool, out: &mut Output) -> Option<(u32, Option<Evicted>)> {
        if self.dur.on && !self.free_available() {
            return None;
        }
        let (s, e) = self.evict_from(vm, sync, out)?;
        if !self.dur.on {
            return Some((s, Some(e)));
        }
        self.free_slot(s);
        Some((self.take_free()?, Some(e)))
    }

    /// Finds a slot for a new block of `vm` and makes it resident; `None` = bypass.
    #[inline]
    fn allocate(&mut self, vm: VmId, key: u64, sync: bool, out: &mut Output) -> Option<Alloc> {
        if self.no_insert {
            return None;
        }
        let (used, target) = (self.vms[vm as usize].used, self.vms[vm as usize].target);
        let (slot, evicted) = if self.shared.is_some() {
            match self.take_free() {
                Some(s) => (s, None),
                None => self.victim_slot(vm, sync, out)?,
            }
        } else if target == 0 {
            return None;
        } else if let Some(s) = (used < target).then(|| self.take_free()).flatten() {
            (s, None)
        } else if used > 0 {
            self.victim_slot(vm, sync, out)?
        } else {
            return None;
        };
        // A dirty victim's slot is written after its write-back.
        let phase = match evicted {
            Some(e) if e.dirty_sectors > 0 && !self.dur.on => 2,
            _ => 0,
        };
        self.slots.set_key(slot, key);
        self.note(slot);
        self.index.insert(key, slot);
        if !self.slots.last_access_ms.is_empty() {
            self.slots.last_access_ms[slot as usize] = self.now_ms;
        }
        self.vms[vm as usize].used += 1;
        self.with_repl(vm, |r, t| r.insert(t, slot));
        Some(Alloc { slot, evicted, phase })
    }
}
