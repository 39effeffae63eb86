//! The cache engine: a deterministic, sans-IO state machine over a global pool of SSD
//! slots. See the crate documentation for the call order.

use crate::block_index::BlockIndex;
use crate::config::{EngineConfig, PartitionMode, SECTOR};
use crate::output::{DeviceOp, Evicted, Location, OpId, OpKind, Output, NO_SLOT};
use crate::replacement::{AnyReplacement, Replacement};
use crate::sector_bits::{SectorBits, SectorRange};
use crate::slot_table::{key_block, key_vm, pack_key, SlotTable, FREE_KEY};
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
    /// It passes through because its device errors reached the threshold
    /// ([`Engine::set_error_threshold`]), until a driver ends the pass-through.
    pub(crate) bypass_errors: bool,
    /// Its last shrink is paced ([`Engine::set_target_paced`]): above its target, it gives
    /// a block up each time a VM below its own target misses with no free slot.
    pub(crate) paced: bool,
    /// Of its target, slots in stores other than the local one
    /// ([`Engine::set_remote_shares`]): in all, and per store (`shares[0]`, the local
    /// store's, is 0: the local part is the target less the others).
    pub(crate) remote_target: u64,
    pub(crate) shares: Vec<u64>,
    /// Of its used slots, those in each store (`stores.rs`).
    pub(crate) held: Vec<u64>,
    /// ELICA-Traffic's run detector (§3.4): a request continuing a run of at least
    /// [`TRAFFIC_RUN`] bytes is sequential.
    pub(crate) traffic: crate::sequential_cutoff::SequentialCutoff,
    /// How its blocks move when its shares change (`migration.rs`), blocks moved so far,
    /// and where Instant Migration's scan of the slots resumes.
    pub(crate) migration: crate::migration::MigrationScheme,
    pub(crate) moved: u64,
    pub(crate) migration_cursor: u64,
    /// The vDisk's size in bytes: blocks past it are refused (`disk_range.rs`).
    pub(crate) disk_end: u64,
}

/// ELICA-Traffic's threshold (§3.4): a contiguous run of this many bytes is sequential
/// and takes local cache; shorter or scattered requests take lent cache first.
pub const TRAFFIC_RUN: u64 = 64 << 10;

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
    /// Of its target, slots in regions other nodes lent ([`Engine::set_remote_target`]).
    pub remote_target: u64,
    /// Of the slots it holds, those in lent regions.
    pub remote_used: u64,
}

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
    /// The store table: each cache store's slots, free list, use and cap (`stores.rs`).
    pub(crate) stores: crate::stores::Stores,
    /// ELICA-Traffic's choices (`remote_regions.rs`).
    pub(crate) traffic: crate::remote_regions::Traffic,
    /// Shrinks still to finish (`commands.rs`).
    pub(crate) shrink: crate::commands::Shrinks,
    /// Dirty blocks a steal from a paced shrink passed over, written back in background
    /// jobs paced per donor, so the next steals find them clean (`paced_clean.rs`).
    pub(crate) paced_clean: crate::paced_clean::PacedClean,
    /// Write-back ahead of eviction in backing stores' idle time (`writeback_ahead.rs`).
    pub(crate) ahead: crate::writeback_ahead::Ahead,
    pub(crate) vms: Vec<Partition>,
    pub(crate) shared: Option<AnyReplacement>,
    pub(crate) now_ms: u32,
    /// Slots whose key or sector bits changed, when a driver asked for them.
    pub(crate) changed: Option<Vec<u32>>,
    /// Position of the global cleaner's scan (S-CAVE §V-B).
    pub(crate) cleaner_hand: u32,
    /// Id of the next device op emitted.
    pub(crate) next_op: OpId,
    /// Operations in flight and requests waiting for them (see `inflight.rs`).
    pub(crate) flight: crate::inflight::Flight,
    /// Interval, flusher and cleaner timers (see `timers.rs`).
    pub(crate) timers: crate::timers::Timers,
    /// Persistent mode: commits, limbo, vouched slots (see `durability.rs`).
    pub(crate) dur: crate::durability::Durability,
    /// Persistent mode: sealed slots, seal candidates, poisoned slots (see `seals.rs`).
    pub(crate) seals: crate::seals::Seals,
    /// Each local cache device's errors, and which were dropped (`device_failure.rs`).
    pub(crate) health: crate::device_failure::DeviceHealth,
    /// Mirror slots of dirty blocks (`dirty_mirror.rs`).
    pub(crate) mirrors: crate::dirty_mirror::DirtyMirrors,
    /// The RAM tier's copies (`ram_tier.rs`).
    pub(crate) ram: crate::ram_tier::RamTier,
    /// The request being processed (its blocks, mode, phases).
    pub(crate) req: InRequest,
    /// Reused buffers.
    pub(crate) scratch: Scratch,
    /// Per VM: which missed blocks enter (`block_admission.rs`); `None`: all of them.
    pub(crate) admission: Vec<Option<crate::block_admission::Admission>>,
    /// Migration between stores (`migration.rs`).
    pub(crate) moving: crate::migration::Moving,
    /// Prewarmed blocks' protection (`prewarm_load.rs`).
    pub(crate) prewarmed: crate::prewarm_load::Protection,
    /// Per VM: prefetch streams, and prefetched blocks not read yet (`block_prefetch.rs`).
    pub(crate) prefetcher: crate::block_prefetch::Prefetcher,
    /// The cache device's latency and congestion bypass (`congestion.rs`).
    pub(crate) congestion: crate::congestion::Congestion,
    /// Per VM: I/O classes, and each slot's class (`io_class.rs`).
    pub(crate) classes: crate::io_class::Classes,
    /// The cache's write budget shared across VMs (`shared_budget.rs`).
    pub(crate) shared_budget: crate::shared_budget::SharedBudget,
    /// The controller's interval: its clock and window counters (`interval.rs`).
    pub(crate) interval: crate::interval::IntervalClock,
    /// Local-store slots withheld from the cache (`withheld.rs`).
    pub(crate) withheld: crate::withheld::Withheld,
    /// Submitted requests waiting to be dispatched (`request_queue.rs`).
    pub(crate) queue: crate::request_queue::RequestQueue,
}

/// The request `Engine::access` is processing.
#[derive(Debug, Clone, Default)]
pub(crate) struct InRequest {
    /// (vm, first block, last block, block being processed). Blocks it used already
    /// (first..current) are never its own victims (their ops may run in the same phase
    /// as the eviction's); blocks are processed in ascending order.
    pub(crate) blocks: Option<(VmId, u64, u64, u64)>,
    /// Blocks an earlier block of it evicted dirty, with the phase after that
    /// write-back: their own ops start there.
    pub(crate) evicted_dirty: Vec<(u64, u16)>,
    /// Added to the phase of every op emitted (see `evicted_dirty`).
    pub(crate) phase_base: u16,
    /// It continues a sequential run (ELICA-Traffic): its new blocks take local slots
    /// first.
    pub(crate) sequential: bool,
    /// Its mode (`mode.rs`): whether its misses take slots, what its writes do.
    pub(crate) mode: crate::mode::Mode,
    /// [`Engine::access_no_insert`] is running.
    pub(crate) force_no_insert: bool,
    /// Its I/O class (`io_class.rs`: 1 + index; 0: none).
    pub(crate) class: u8,
    /// A write the client asked to be durable at once (set by dispatch for the request
    /// it runs; classification only).
    pub(crate) sync: bool,
    /// Slots whose dirty sectors it dropped because its own write replaces them on the
    /// backing store (a write passing through): its job pins them until it retires, so
    /// no other block takes them meanwhile and a failed write can put those sectors back
    /// (`repair.rs`; before, a miss could take the freed slot and the sectors' only copy,
    /// acknowledged earlier, was lost with the failed write).
    pub(crate) keep: Vec<u32>,
}

/// Buffers reused from call to call (no allocation per request).
#[derive(Debug, Clone, Default)]
pub(crate) struct Scratch {
    /// Sector runs of a slot (valid, dirty), two at once.
    pub(crate) runs: Vec<SectorRange>,
    pub(crate) runs2: Vec<SectorRange>,
    /// For `peek_victims` (ELICA-Traffic's victim choice, write-back ahead).
    pub(crate) peek_buf: Vec<u32>,
}

/// Result of asking for a slot.
pub(crate) struct Alloc {
    pub(crate) slot: u32,
    pub(crate) evicted: Option<Evicted>,
    /// First phase the new block's own SSD ops may use.
    pub(crate) phase: u16,
}

impl Engine {
    /// Builds an engine; the error names the setting that is out of bounds.
    pub fn new(cfg: EngineConfig) -> Result<Self, String> {
        cfg.validate()?;
        let n = cfg.total_slots() as usize;
        let spb = cfg.sectors_per_block();
        let mut slots = SlotTable::new(n, cfg.track_last_access);
        let stores = crate::stores::Stores::new(&cfg, &mut slots);
        let shared = (cfg.partition == PartitionMode::Shared).then(|| cfg.replacement.build(cfg.total_slots()));
        Ok(Engine {
            spb,
            shift: cfg.block_size.trailing_zeros(),
            valid: SectorBits::new(n, spb),
            dirty: SectorBits::new(n, spb),
            index: BlockIndex::new(n),
            slots,
            stores,
            traffic: Default::default(),
            shrink: crate::commands::Shrinks::due(),
            paced_clean: Default::default(),
            ahead: Default::default(),
            vms: Vec::new(),
            shared,
            now_ms: 0,
            changed: None,
            cleaner_hand: 0,
            next_op: 1,
            flight: Default::default(),
            timers: Default::default(),
            dur: Default::default(),
            seals: Default::default(),
            health: Default::default(),
            mirrors: Default::default(),
            ram: Default::default(),
            req: InRequest::default(),
            scratch: Scratch::default(),
            admission: Vec::new(),
            moving: Default::default(),
            prewarmed: Default::default(),
            prefetcher: Default::default(),
            congestion: Default::default(),
            classes: Default::default(),
            shared_budget: Default::default(),
            withheld: Default::default(),
            interval: Default::default(),
            queue: Default::default(),
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
                remote_target: p.remote_target,
                remote_used: p.used - p.held[0],
            },
            None => PartitionInfo {
                target: 0,
                used: 0,
                dirty_blocks: 0,
                write_policy: self.cfg.write_policy,
                remote_target: 0,
                remote_used: 0,
            },
        }
    }

    /// Free slots.
    pub fn free_slots(&self) -> u64 {
        self.stores.free_len() + self.stores.parked_len() as u64
    }

    /// The slot holding (vm, block), if cached. A block no key can name (2^48 or more, a
    /// VM id past 2^16) is never cached: `None`, never another VM's block.
    pub fn lookup(&self, vm: VmId, block: u64) -> Option<u32> {
        if block >= crate::disk_range::MAX_DISK_BLOCKS || vm >= crate::config::MAX_VMS {
            return None;
        }
        self.index.get(pack_key(vm, block), |x| self.slots.key(x))
    }

    /// Hints the CPU to load the block index entries a lookup of the block at byte
    /// `offset` of `vm` reads first (`prefetch.rs`): for a driver that knows its next
    /// requests, called some requests ahead. Changes nothing.
    #[inline]
    pub fn prefetch(&self, vm: VmId, offset: u64) {
        let block = offset >> self.shift;
        if block < crate::disk_range::MAX_DISK_BLOCKS && vm < crate::config::MAX_VMS {
            self.index.prefetch(pack_key(vm, block));
        }
    }

    /// Whether sectors `range` of (vm, block) are all cached (a read of them hits).
    pub fn holds(&self, vm: VmId, block: u64, range: (u32, u32)) -> bool {
        self.lookup(vm, block).is_some_and(|s| self.valid.all(s, range))
    }

    /// Whether sector `s` of `slot` is valid / dirty.
    pub fn sector_state(&self, slot: u32, s: u32) -> (bool, bool) {
        if slot >= self.present() {
            return (false, false); // absent: empty (`growable.rs`)
        }
        (self.valid.get(slot, s), self.dirty.get(slot, s))
    }

    /// Whether any sector of `slot` is dirty.
    pub fn slot_dirty(&self, slot: u32) -> bool {
        slot < self.present() && self.dirty.any(slot, (0, self.spb))
    }

    /// The policy byte of a slot (CLOCK's reference counter in bits 0–3).
    pub fn slot_aux(&self, slot: u32) -> u8 {
        self.slots.aux.get(slot as usize).copied().unwrap_or(0)
    }

    /// Slots in the pool: every slot id of the layout, withheld ones included (a growable
    /// engine's tables may hold fewer: `growable.rs`).
    pub fn slot_count(&self) -> u64 {
        self.stores.layout().total()
    }

    /// The owner of resident slot `s` and whether it has been referenced: bits 0–4 of its
    /// policy byte are non-zero (CLOCK's counter, S3-FIFO's frequency, hits since
    /// insertion for LRU and FIFO, the multi-touch bit of two-pool). This is the probe
    /// S-CAVE's rECS scan reads (§IV-B); `None` for a free slot.
    pub fn slot_referenced(&self, s: u32) -> Option<(VmId, bool)> {
        let k = self.slot_key(s);
        (k != FREE_KEY).then(|| (key_vm(k), self.slots.aux[s as usize] & 0x1f != 0))
    }

    /// (vm, block) held by a slot.
    pub fn slot_block(&self, slot: u32) -> Option<(VmId, u64)> {
        let k = self.slot_key(slot);
        (k != FREE_KEY).then(|| (key_vm(k), key_block(k)))
    }

    /// The key of slot `s`, [`FREE_KEY`] for a free or absent one.
    #[inline]
    fn slot_key(&self, s: u32) -> u64 {
        if s < self.present() {
            self.slots.key(s)
        } else {
            FREE_KEY
        }
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
        assert!(vm < crate::config::MAX_VMS, "vm id {vm} does not fit a block key (checked where requests enter)");
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
                bypass_errors: false,
                paced: false,
                remote_target: 0,
                shares: vec![0; self.stores.len()],
                held: vec![0; self.stores.len()],
                // `bypass` is "run above the cutoff": sequential from TRAFFIC_RUN bytes on.
                traffic: crate::sequential_cutoff::SequentialCutoff::new(TRAFFIC_RUN - 1),
                migration: Default::default(),
                moved: 0,
                migration_cursor: 0,
                disk_end: crate::disk_range::key_range_bytes(self.shift),
            });
        }
    }

    /// [`Self::access`], but misses take no slots (they are read from or written to the
    /// backing store, bypassing the cache): a driver serving a read whose victim could not
    /// be written back.
    pub fn access_no_insert(&mut self, now_ns: u64, req: &Request, out: &mut Output) {
        self.req.force_no_insert = true;
        self.access(now_ns, req, out);
        self.req.force_no_insert = false;
    }

    /// Tells the engine the driver's time before a background job runs (a request's
    /// [`Self::access`] does this itself): what a prewarm load's protection deadline is
    /// counted from.
    pub fn set_clock(&mut self, now_ns: u64) {
        self.now_ms = (now_ns / 1_000_000) as u32;
    }

    /// Processes one request at driver time `now_ns`, filling `out` with per-block
    /// outcomes and the device operations to perform.
    ///
    /// A request outside its vDisk ([`Self::check_range`]) does nothing.
    pub fn access(&mut self, now_ns: u64, req: &Request, out: &mut Output) {
        self.run_access(now_ns, req, out);
        if req.op == Op::Read && req.len > 0 && self.prefetcher.stream(req.vm).is_some() {
            // The synchronous face loads a prefetch at once, into this request's output
            // (the asynchronous one starts a job: `Engine::submit`).
            let (first, last) = (req.offset >> self.shift, (req.end() - 1) >> self.shift);
            if let Some((a, n)) = self.prefetcher.stream(req.vm).and_then(|s| s.after_read(first, last, false)) {
                let o = self.load_blocks(req.vm, a, n, crate::prewarm_load::Load::Prefetch, out);
                if let Some(s) = self.prefetcher.stream(req.vm) {
                    s.loaded(o.loaded);
                }
            }
        }
    }

    /// [`Self::access`]'s request path (what dispatch runs for a submitted request).
    pub(crate) fn run_access(&mut self, now_ns: u64, req: &Request, out: &mut Output) {
        out.clear();
        self.req.keep.clear();
        let sync = std::mem::take(&mut self.req.sync);
        if self.check_range(req.vm, req.offset, req.len as u64).is_err() {
            return;
        }
        self.ensure_vm(req.vm);
        self.now_ms = (now_ns / 1_000_000) as u32;
        self.timers.request_arrived();
        if req.len == 0 {
            self.count_request(req.vm, &[], now_ns);
            return;
        }
        self.req.mode = self.decide_mode(req);
        self.req.class = self.classes.classify(req, sync);
        self.req.sequential = self.vms[req.vm as usize].traffic.bypass(req.offset, req.len as u64);
        let bs = self.cfg.block_size;
        let (first, last) = (req.offset >> self.shift, (req.end() - 1) >> self.shift);
        self.req.blocks = Some((req.vm, first, last, first));
        self.ram.req_from = self.ram.tick();
        for b in first..=last {
            if let Some(r) = self.req.blocks.as_mut() {
                r.3 = b;
            }
            if !self.req.evicted_dirty.is_empty() {
                let key = pack_key(req.vm, b);
                self.req.phase_base = self.req.evicted_dirty.iter().find(|e| e.0 == key).map_or(0, |e| e.1);
            }
            let start = b << self.shift;
            let lo = req.offset.max(start) - start;
            let hi = req.end().min(start + bs) - start;
            let r = ((lo / SECTOR) as u32, hi.div_ceil(SECTOR) as u32);
            match req.op {
                Op::Read => self.read_block(req.vm, b, r, out),
                Op::Write => self.write_block(req.vm, b, (lo, hi), out),
            }
        }
        self.req.blocks = None;
        self.req.evicted_dirty.clear();
        self.req.phase_base = 0;
        if self.moving.frees_due() {
            self.free_deferred();
        }
        self.count_request(req.vm, &out.blocks, now_ns);
        if self.admission.get(req.vm as usize).is_some_and(|a| a.as_ref().is_some_and(|a| a.observes())) {
            // Its share: its target, or in a shared pool what it holds now (what the
            // others leave it), at least a sample's worth.
            let p = &self.vms[req.vm as usize];
            let partition = if self.shared.is_some() { p.used.max(crate::admission_shadow::SAMPLE) } else { p.target };
            if let Some(Some(a)) = self.admission.get_mut(req.vm as usize) {
                for b in &out.blocks {
                    a.observe(pack_key(req.vm, b.block), partition);
                }
            }
        }
        if self.classes.any() {
            let hits = out.blocks.iter().filter(|b| b.hit).count() as u64;
            self.classes.count(req.vm, self.req.class, hits, out.blocks.len() as u64 - hits);
        }
    }

    // ----- request paths -----

    /// An op on sectors `lo..hi` of `block` (its id is given by [`Self::emit`]).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn op(
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

    /// A cache op on sectors of a slot (the slot's key must already name its block), on
    /// the store its slot is in.
    #[inline]
    pub(crate) fn ssd(&self, kind: OpKind, vm: VmId, slot: u32, r: SectorRange, phase: u16, sync: bool) -> DeviceOp {
        let block = key_block(self.slots.key(slot));
        self.op(kind, Location::Cache(self.store_of(slot)), vm, block, slot, r, phase, sync)
    }

    /// A backing op on sectors of a block.
    #[inline]
    pub(crate) fn backing(
        &self,
        kind: OpKind,
        vm: VmId,
        block: u64,
        r: SectorRange,
        phase: u16,
        sync: bool,
    ) -> DeviceOp {
        self.op(kind, Location::Backing(vm), vm, block, NO_SLOT, r, phase, sync)
    }

    /// Gives `op` the next id and appends it to `out`; returns the id.
    #[inline(always)]
    pub(crate) fn emit(&mut self, out: &mut Output, op: DeviceOp) -> OpId {
        if op.kind == OpKind::SsdWrite {
            // A RAM copy of the slot is stale once the write runs (`ram_tier.rs`).
            if self.ram.on() {
                self.ram.ssd_changed(op.slot);
            }
            // A write budget counts every SSD byte its vDisk writes (`write_budget.rs`).
            if let Some(Some(a)) = self.admission.get_mut(op.vm as usize) {
                a.note_written(self.now_ms, u64::from(op.len));
            }
            self.shared_budget.note_written(op.vm, self.now_ms, u64::from(op.len));
        }
        let id = self.next_op;
        self.next_op += 1;
        // Copied as it came, then its id and phase set in place: setting them on the
        // argument first made the copy's wide loads wait on those narrow stores (a
        // store-forwarding stall, most of this function's time in a cache-model replay).
        out.ops.push(op);
        let last = out.ops.last_mut().expect("just pushed");
        last.id = id;
        last.phase += self.req.phase_base;
        id
    }

    /// Runs `f` on the policy that orders `vm`'s blocks, with the slot table.
    #[inline]
    pub(crate) fn with_repl<R>(&mut self, vm: VmId, f: impl FnOnce(&mut AnyReplacement, &mut SlotTable) -> R) -> R {
        let repl = match &mut self.shared {
            Some(r) => r,
            None => self.vms[vm as usize].repl.as_mut().expect("static partition has a policy"),
        };
        f(repl, &mut self.slots)
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
}
