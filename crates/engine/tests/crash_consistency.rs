//! Persistent mode checked against a crash model: devices whose writes are durable only
//! after a sync (a crash keeps, per sector, the synced value or any later write), a
//! journal that holds the records of completed commits only, requests concurrent with
//! ops completed in random order, flushes, the flusher, random op and commit failures.
//! At the end the machine crashes mid-flight (in-flight writes torn at random); a new
//! engine replays the journal, and every sector of every disk is read back through it:
//! the cache store never serves another block's bytes, and each sector holds a version no
//! older than the last write acknowledged before a completed flush. With `lent`, the
//! engine has a second cache store (a region node 1 lends, ELICA §3.1) beside the local
//! one, and a commit syncs only the stores it names (`Commit::sync_stores`). Without
//! it, half the runs (odd seeds) have a second cache device of the host's own beside the
//! first (`StoreKind::Device`, one allocation over both): its writes are durable only
//! when a commit names it too. A quarter of the runs (seeds 3 mod 4) mirror dirty data
//! over the two devices (`set_mirror_dirty`), and half of those lose one device with the
//! crash (every sector of it foreign bytes): the replay pairs mirrors with their blocks,
//! the device is dropped (`fail_device`, as the daemon does at a start without it), and
//! every flushed write still reads back.
//!
//! Checksums (`seals.rs`): the driver keeps a checksum of each sector it wrote
//! to a slot (here the written tag itself, an exact one), checks every cache read against
//! it, and journals the dirty sectors' checksums with each seal record. After the crash
//! some sectors the journal holds checksums for are garbled: a read through the recovered
//! engine that meets one fails (`Failure::Corrupt`) and writes nothing back; no sector
//! that is not garbled ever fails its checksum (a seal record that outlived the bytes it
//! describes would).

use cachevisor_engine::*;
use cachevisor_trace::{Op, Request};
use proptest::prelude::*;

mod lending;
mod model_harness;
use lending::{Lends, RUN};
use model_harness::{cases, trace};
use rand::{Rng, SeedableRng};
use std::collections::{BTreeSet, HashMap};

const SECTORS: u64 = 48;
const VMS: u32 = 2;

#[derive(Debug, Clone)]
enum Step {
    Io {
        vm: u32,
        write: bool,
        sector: u64,
        count: u64,
    },
    Complete {
        pick: usize,
        fail: bool,
    },
    Flush,
    /// Runs the next commit's syncs, then (next time) makes its records durable.
    Commit {
        fail: bool,
    },
    RequestCommit,
    Tick,
    /// Holds admission, drains what is in flight, and replaces the journal with a
    /// checkpoint.
    Checkpoint,
    /// A paced target (`set_target_paced`): the other VM's misses take this VM's blocks.
    PacedTarget {
        vm: u32,
        slots: u64,
    },
    /// A lazy change between write-back and write-through (`set_write_policy_lazy`, as
    /// `adaptive`'s decisions apply them): leaving write-back keeps the dirty blocks dirty.
    LazyPolicy {
        vm: u32,
        policy: WritePolicy,
    },
    /// A switch of write policy (`set_write_policy`, as an operator's or `eci-cache`'s):
    /// leaving write-back flushes the dirty blocks; read-only and write-around write
    /// around the cache.
    Policy {
        vm: u32,
        policy: WritePolicy,
    },
    /// Pass-through on or off (`set_bypass`: read-only, misses take no slots, the dirty
    /// blocks stay cached).
    Bypass {
        vm: u32,
        on: bool,
    },
    /// Which misses enter (`set_admission`): a rejected read miss reads around the cache,
    /// a rejected write miss writes around it.
    Admission {
        vm: u32,
        read: AdmissionPolicy,
        write: AdmissionPolicy,
    },
    /// I/O classes (`set_io_classes`): `CLASS_SETS[pick]`.
    Classes {
        vm: u32,
        pick: usize,
    },
    /// Congestion bypass (`set_congestion`): misses go around the cache while its ops take
    /// longer than the thresholds (steps are 50 ms of driver time apart).
    Congestion {
        read: Option<u64>,
        write: Option<u64>,
    },
    /// The cache's shared write budget (`set_write_budget`), in bytes a second (`None`:
    /// off): what each VM's admission lets in meets it.
    SharedBudget {
        rate: Option<u64>,
    },
    /// Prefetch for sequential reads (`set_prefetch_policy`): loads ahead of a read that
    /// continues the last, as background jobs that may evict.
    Prefetch {
        vm: u32,
        policy: PrefetchPolicy,
    },
    /// A prewarm load of `len` blocks from `block`, as a background job.
    Prewarm {
        vm: u32,
        block: u64,
        len: u32,
    },
    /// Local slots `2 * run`, `2 * run + 1` withheld (lent out, as to a vSSD region; runs 4
    /// and 5 are the second cache device, when there is one: removed online): once
    /// the engine says they are empty, their new user writes its own bytes there, synced;
    /// with `moving`, the run's clean blocks move to free slots outside it first (a cache
    /// shrinking online, `withhold_moving`).
    Lend {
        run: u32,
        moving: bool,
    },
    /// A lent run (the `run`-th, modulo) given back.
    Return {
        run: usize,
    },
    /// The lender of the lent store dies now (runs that lose it only): `lose_lender`, then
    /// every op on its region fails, and no request or job that comes after may place a
    /// block there (its cap is 0, its idle blocks dropped).
    LoseLender,
    /// Runs with a lent store: `vm`'s share of it becomes `MIGRATION_SHARES[pick]` slots
    /// and its migration scheme `scheme` (ELICA §3.6: blocks at a store above its share
    /// move to one below, each an SSD→SSD copy).
    Shares {
        vm: u32,
        pick: usize,
        scheme: MigrationScheme,
    },
    /// Runs with a lent store: Instant Migration's bulk copy of up to `max` blocks.
    Migrate {
        vm: u32,
        max: u64,
    },
}

/// `Step::Admission`'s choices.
const ADMISSIONS: [AdmissionPolicy; 5] = [
    AdmissionPolicy::All,
    AdmissionPolicy::Auto,
    AdmissionPolicy::NthMiss { n: 2 },
    AdmissionPolicy::Probability { p: 0.5 },
    // Four blocks a second: with a step every `STEP_NS`, it rejects most misses.
    AdmissionPolicy::WriteBudget { rate: cachevisor_engine::BudgetRate::BytesPerSec(16 << 10) },
];

/// `Step::Classes`' choices: none; the first 16 KiB pinned; everything capped at a
/// quarter; writes of a whole block or more on their own second-hit admission; the first
/// 16 KiB kept longest and reads evicted first (priorities).
fn class_set(pick: usize) -> Vec<IoClass> {
    match pick {
        1 => vec![IoClass { range: (0, 16 << 10), pinned: true, ..IoClass::named("pinned") }],
        2 => vec![IoClass { max_share: Some(0.25), ..IoClass::named("capped") }],
        3 => vec![IoClass {
            size: (4096, u64::MAX),
            op: Some(Op::Write),
            admission: Some(AdmissionPolicy::NthMiss { n: 2 }),
            ..IoClass::named("big writes")
        }],
        4 => vec![
            IoClass { range: (0, 16 << 10), priority: 10, ..IoClass::named("kept") },
            IoClass { op: Some(Op::Read), priority: 250, ..IoClass::named("reads first") },
        ],
        _ => Vec::new(),
    }
}

/// Driver time per step: 50 ms, so that a write budget's periods (1 s) end within a run.
const STEP_NS: u64 = 50_000_000;

/// `Step::Shares`' choices: none of the lent store to all of it.
const MIGRATION_SHARES: [&[(u16, u64)]; 5] = [&[], &[(1, 1)], &[(1, 2)], &[(1, 3)], &[(1, 4)]];

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0..VMS, any::<bool>(), 0..SECTORS, 1u64..10).prop_map(|(vm, write, sector, count)| {
            Step::Io { vm, write, sector, count: count.min(SECTORS - sector) }
        }),
        // Whole-block writes (a rewrite of a clean cached block moves it to a free slot).
        3 => (0..VMS, 0..SECTORS / 8).prop_map(|(vm, b)| Step::Io { vm, write: true, sector: b * 8, count: 8 }),
        10 => (any::<usize>(), prop::bool::weighted(0.05)).prop_map(|(pick, fail)| Step::Complete { pick, fail }),
        1 => Just(Step::Flush),
        4 => prop::bool::weighted(0.05).prop_map(|fail| Step::Commit { fail }),
        1 => Just(Step::RequestCommit),
        1 => Just(Step::Tick),
        1 => Just(Step::Checkpoint),
        1 => (0..VMS, 0u64..7).prop_map(|(vm, slots)| Step::PacedTarget { vm, slots }),
        1 => (0..VMS, prop::sample::select(vec![WritePolicy::Wb, WritePolicy::Wt])).prop_map(|(vm, policy)| Step::LazyPolicy { vm, policy }),
        1 => (0..VMS, prop::sample::select(WritePolicy::ALL.to_vec())).prop_map(|(vm, policy)| Step::Policy { vm, policy }),
        1 => (0..VMS, any::<bool>()).prop_map(|(vm, on)| Step::Bypass { vm, on }),
        1 => (0..VMS, prop::sample::select(ADMISSIONS.to_vec()), prop::sample::select(ADMISSIONS.to_vec()))
            .prop_map(|(vm, read, write)| Step::Admission { vm, read, write }),
        2 => (0..VMS, 0..SECTORS / 8, 1u32..5).prop_map(|(vm, block, len)| Step::Prewarm { vm, block, len }),
        1 => (0..VMS, 0usize..5).prop_map(|(vm, pick)| Step::Classes { vm, pick }),
        1 => (prop::sample::select(vec![None, Some(20_000_000u64), Some(200_000_000)]), prop::sample::select(vec![None, Some(20_000_000u64), Some(200_000_000)]))
            .prop_map(|(read, write)| Step::Congestion { read, write }),
        // 16 KiB/s: four blocks a second, most misses rejected; 1 MiB/s: most admitted.
        1 => prop::sample::select(vec![None, Some(16u64 << 10), Some(1 << 20)]).prop_map(|rate| Step::SharedBudget { rate }),
        1 => (0..VMS, prop::sample::select(vec![PrefetchPolicy::None, PrefetchPolicy::Obl, PrefetchPolicy::Amp { max: 4 }, PrefetchPolicy::Auto]))
            .prop_map(|(vm, policy)| Step::Prefetch { vm, policy }),
        1 => (0u32..6, any::<bool>()).prop_map(|(run, moving)| Step::Lend { run, moving }),
        1 => any::<usize>().prop_map(|run| Step::Return { run }),
        1 => Just(Step::LoseLender),
        1 => (0..VMS, 0..MIGRATION_SHARES.len(), prop::sample::select(vec![MigrationScheme::Off, MigrationScheme::Gradual, MigrationScheme::Instant]))
            .prop_map(|(vm, pick, scheme)| Step::Shares { vm, pick, scheme }),
        2 => (0..VMS, 1u64..4).prop_map(|(vm, max)| Step::Migrate { vm, max }),
    ]
}

/// A sector of a device: the synced value and writes since.
#[derive(Debug, Clone, Default)]
struct Cell<T: Clone> {
    synced: Option<T>,
    pending: Vec<T>,
}

impl<T: Clone> Cell<T> {
    fn read(&self) -> Option<T> {
        self.pending.last().cloned().or_else(|| self.synced.clone())
    }
    fn sync(&mut self) {
        if let Some(v) = self.pending.pop() {
            self.synced = Some(v);
        }
        self.pending.clear();
    }
    /// After a crash: the synced value or any later write.
    fn crash(&mut self, rng: &mut impl Rng) {
        let n = self.pending.len();
        if n > 0 {
            let i = rng.gen_range(0..=n);
            if i > 0 {
                self.synced = Some(self.pending[i - 1].clone());
            }
        }
        self.pending.clear();
    }
}

/// (vm, disk sector, version).
type Tag = (u32, u64, u64);

/// Checksums of a slot's sectors (sector of the block → tag).
type Sums = HashMap<u32, Tag>;

/// Sectors per block (4 KiB blocks).
const SPB: u32 = 8;

/// What garbled bytes read as.
const GARBAGE: u32 = u32::MAX - 1;

struct Machine {
    /// Where the engine's cache stores' slots are.
    layout: StoreLayout,
    /// Cache sectors by (store, sector in that store).
    cache: HashMap<(StoreId, u64), Cell<Tag>>,
    backing: HashMap<(u32, u64), Cell<u64>>,
    /// Records made durable, each seal with the checksums (tags) of its dirty sectors.
    journal: Vec<(SlotRecord, Option<Sums>)>,
    /// The driver's checksums: per slot, per sector of the block, the tag last written.
    sums: HashMap<u32, Sums>,
    /// Ops that read a cache store (a staged write from one copies checksummed bytes).
    cache_reads: BTreeSet<OpId>,
    bufs: HashMap<OpId, (ReqId, Vec<Tag>)>,
    /// Request → (request, version, client read data).
    reqs: HashMap<ReqId, (Request, u64, HashMap<u64, u64>)>,
    /// Last acknowledged version per sector.
    acked: HashMap<(u32, u64), u64>,
    /// Versions written (submitted) per sector.
    written: HashMap<(u32, u64), BTreeSet<u64>>,
    /// Per sector, what a crash must keep at least (the last acknowledged write before a
    /// completed flush).
    floor: HashMap<(u32, u64), u64>,
    /// Flush → the acknowledged versions when it was submitted.
    flushes: HashMap<ReqId, HashMap<(u32, u64), u64>>,
    /// Local slots lent out (their user's bytes; no engine op may touch them).
    lent: BTreeSet<u32>,
    /// The RAM tier's sectors (memory: gone at a crash).
    ram: HashMap<u64, Tag>,
}

impl Machine {
    fn new(layout: StoreLayout) -> Machine {
        Machine {
            layout,
            cache: HashMap::new(),
            backing: HashMap::new(),
            journal: Vec::new(),
            sums: HashMap::new(),
            cache_reads: BTreeSet::new(),
            bufs: HashMap::new(),
            reqs: HashMap::new(),
            acked: HashMap::new(),
            written: HashMap::new(),
            floor: HashMap::new(),
            flushes: HashMap::new(),
            lent: BTreeSet::new(),
            ram: HashMap::new(),
        }
    }

    /// Slot `slot` lent out: its user's bytes, synced (no VM's).
    fn lend(&mut self, slot: u32) {
        self.lent.insert(slot);
        for i in 0..8 {
            let c = self.cache.entry((0, u64::from(slot) * 8 + i)).or_default();
            c.pending.clear();
            c.synced = Some((u32::MAX, u64::from(slot), 0));
        }
    }

    /// Record `r` as the driver journals it: a seal with the checksums of its dirty
    /// sectors (none when one is unknown: a failed write left it), a free record
    /// forgetting the slot's checksums (its next block's writes give new ones).
    fn journal_entry(&mut self, r: SlotRecord) -> (SlotRecord, Option<Sums>) {
        if r.block.is_none() {
            self.sums.remove(&r.slot);
            return (r, None);
        }
        if !r.sealed {
            return (r, None);
        }
        let have = self.sums.get(&r.slot).cloned().unwrap_or_default();
        let dirty: Vec<u32> = (0..SPB).filter(|&i| r.dirty[0] >> i & 1 == 1).collect();
        let sums: Option<Sums> = dirty.iter().map(|i| have.get(i).map(|t| (*i, *t))).collect();
        (r, sums)
    }

    /// Syncs the cache stores `stores`.
    fn sync_stores(&mut self, stores: &[StoreId]) {
        self.cache.iter_mut().filter(|(k, _)| stores.contains(&k.0)).for_each(|(_, c)| c.sync());
    }

    /// Whether cache read `op` meets a sector whose bytes differ from the checksum `sums`
    /// hold for it (the daemon's check before a cache read completes).
    fn corrupt(&self, op: &DeviceOp, sums: &HashMap<u32, Sums>) -> bool {
        let Some(s) = sums.get(&op.slot) else { return false };
        let (lo, hi) = op.sectors(u64::from(SPB) * 512);
        let (st, base) = (self.layout.store_of(op.slot), self.layout.offset(op) / 512);
        (lo..hi).any(|i| {
            let cell = self.cache.get(&(st, base + u64::from(i - lo))).and_then(|c| c.read());
            s.get(&i).is_some_and(|want| cell.as_ref() != Some(want))
        })
    }

    /// The driver's checksums after cache write `op` (the daemon's rule): a client write
    /// or a copy from another slot gives its sectors the tags written, a fill from the
    /// backing store (clean bytes) none, a failed (maybe torn) write none.
    fn note_sums(&mut self, op: &DeviceOp, fail: bool) {
        if op.kind != OpKind::SsdWrite {
            return;
        }
        let (lo, hi) = op.sectors(u64::from(SPB) * 512);
        let d0 = op.disk_addr / 512;
        let source = op.source_id().and_then(|src| self.bufs.get(&src));
        let from_cache = op.source_id().is_some_and(|src| self.cache_reads.contains(&src));
        let sums = self.sums.entry(op.slot).or_default();
        for (k, i) in (lo..hi).enumerate() {
            let d = d0 + k as u64;
            let tag = if fail || (op.staged && !from_cache) {
                None
            } else if op.staged {
                source.and_then(|(_, b)| b.iter().find(|t| (t.0, t.1) == (op.vm, d)).copied())
            } else {
                self.reqs.get(&op.req).map(|r| (op.vm, d, r.1))
            };
            match tag {
                Some(t) => sums.insert(i, t),
                None => sums.remove(&i),
            };
        }
    }

    fn execute(&mut self, op: &DeviceOp, fail: bool, torn: u64) -> Result<(), String> {
        let n = op.len.div_ceil(512) as u64;
        let d0 = op.disk_addr / 512;
        if op.kind.is_ram() {
            return self.execute_ram(op, fail, torn);
        }
        let (st, s0) = match op.loc {
            Location::Cache(st) if op.kind.is_ssd() => (st, self.layout.offset(op) / 512),
            _ => (0, 0),
        };
        if op.kind.is_ssd() && self.lent.contains(&op.slot) {
            return Err(format!("{op:?}: slot {} is lent out of the cache", op.slot));
        }
        if !op.kind.is_write() {
            if fail {
                return Ok(());
            }
            if op.kind.is_ssd() && self.corrupt(op, &self.sums) {
                return Err(format!("{op:?}: a cache read fails its checksum while nothing is garbled"));
            }
            let mut got = Vec::new();
            for i in 0..n {
                let key = (op.vm, d0 + i);
                let tag = if op.kind.is_ssd() {
                    let t = self.cache.get(&(st, s0 + i)).and_then(|c| c.read()).ok_or(format!("{op:?}: unwritten"))?;
                    if (t.0, t.1) != key {
                        return Err(format!("{op:?}: cache sector holds {t:?}, not {key:?}"));
                    }
                    t
                } else {
                    (op.vm, key.1, self.backing.get(&key).and_then(|c| c.read()).unwrap_or(0))
                };
                got.push(tag);
            }
            if op.client {
                if let Some((r, _, data)) = self.reqs.get_mut(&op.req) {
                    for t in &got {
                        if (r.offset / 512..r.end().div_ceil(512)).contains(&t.1) {
                            data.insert(t.1, t.2);
                        }
                    }
                }
            }
            if op.kind.is_ssd() {
                self.cache_reads.insert(op.id);
            }
            self.bufs.insert(op.id, (op.req, got));
            return Ok(());
        }
        self.note_sums(op, fail);
        for i in 0..if fail { torn.min(n) } else { n } {
            let key = (op.vm, d0 + i);
            let v = if op.staged {
                let src = op.source_id().ok_or("staged write without a source")?;
                let (_, buf) = self.bufs.get(&src).ok_or(format!("{op:?}: source not read"))?;
                buf.iter().find(|t| (t.0, t.1) == key).ok_or("source lacks the sector")?.2
            } else {
                self.reqs.get(&op.req).ok_or(format!("{op:?}: no request"))?.1
            };
            if op.kind.is_ssd() {
                self.cache.entry((st, s0 + i)).or_default().pending.push((op.vm, key.1, v));
            } else {
                self.backing.entry(key).or_default().pending.push(v);
            }
        }
        Ok(())
    }
}

impl Machine {
    /// A RAM-tier op: memory, written at once, read back as written (a copy of cached
    /// bytes: a read of another block's sector is an error).
    fn execute_ram(&mut self, op: &DeviceOp, fail: bool, torn: u64) -> Result<(), String> {
        let (n, d0, s0) = (op.len.div_ceil(512) as u64, op.disk_addr / 512, op.ram_offset(u64::from(SPB) * 512) / 512);
        if op.kind == OpKind::RamRead {
            if fail {
                return Ok(());
            }
            let mut got = Vec::new();
            for i in 0..n {
                let t = *self.ram.get(&(s0 + i)).ok_or(format!("{op:?}: unwritten RAM"))?;
                if (t.0, t.1) != (op.vm, d0 + i) {
                    return Err(format!("{op:?}: RAM sector holds {t:?}"));
                }
                got.push(t);
            }
            if let Some((r, _, data)) = self.reqs.get_mut(&op.req) {
                for t in &got {
                    if (r.offset / 512..r.end().div_ceil(512)).contains(&t.1) {
                        data.insert(t.1, t.2);
                    }
                }
            }
            self.bufs.insert(op.id, (op.req, got));
            return Ok(());
        }
        let src = op.source_id().ok_or("a RAM write without a source")?;
        let (_, buf) = self.bufs.get(&src).ok_or(format!("{op:?}: source not read"))?;
        for i in 0..if fail { torn.min(n) } else { n } {
            let t = *buf.iter().find(|t| (t.0, t.1) == (op.vm, d0 + i)).ok_or("source lacks the sector")?;
            self.ram.insert(s0 + i, t);
        }
        Ok(())
    }
}

struct Driver {
    e: Engine,
    m: Machine,
    flying: Vec<DeviceOp>,
    commit: Option<(Commit, bool)>,
    version: u64,
    /// Runs withheld (first slot), and whether they are lent out yet.
    lending: lending::Lending,
    /// Whether the run may lose its lender, and, once lost, the id of a flush submitted
    /// then: ids after it were submitted after the loss.
    losing: bool,
    lost_at: Option<ReqId>,
    /// The region's slots still holding a block right after the loss (held by requests
    /// in flight then): a write there may be a hit; any other slot of it takes none.
    held_at_loss: BTreeSet<u32>,
}

lending::impl_lends!(Driver, m);

impl Driver {
    fn pump(&mut self) -> Result<(), String> {
        while let Some(op) = self.e.poll_op() {
            trace(|| format!("issue {op:?}"));
            if let Some(at) = self.lost_at {
                let in_region = matches!(op.loc, Location::Cache(_)) && self.m.layout.store_of(op.slot) != 0;
                if in_region && op.kind == OpKind::SsdWrite && op.req > at && !self.held_at_loss.contains(&op.slot) {
                    return Err(format!("{op:?}: a block placed in the lost lender's region after the loss"));
                }
            }
            self.flying.push(op);
        }
        while let Some(ev) = self.e.poll_event() {
            trace(|| format!("event {ev:?}"));
            match ev {
                Event::Reply { req, result, .. } => {
                    if let Some(snapshot) = self.m.flushes.remove(&req) {
                        if result.is_ok() {
                            for (k, v) in snapshot {
                                let f = self.m.floor.entry(k).or_default();
                                *f = (*f).max(v);
                            }
                        }
                        continue;
                    }
                    let Some((r, v, data)) = self.m.reqs.get(&req) else { continue };
                    let (lo, hi) = (r.offset / 512, r.end().div_ceil(512));
                    if r.op == Op::Write && result.is_ok() {
                        for s in lo..hi {
                            self.m.acked.insert((r.vm, s), *v);
                        }
                    } else if r.op == Op::Read && result.is_ok() {
                        for s in lo..hi {
                            let got = data.get(&s).ok_or(format!("req {req}: sector {s} not read"))?;
                            let newest = self.m.written.get(&(r.vm, s)).and_then(|w| w.last()).copied().unwrap_or(0);
                            let acked = self.m.acked.get(&(r.vm, s)).copied().unwrap_or(0);
                            if *got < acked || *got > newest {
                                return Err(format!("req {req}: sector {s} read {got}, acked {acked}"));
                            }
                        }
                    }
                }
                Event::Retired { req, .. } => {
                    self.m.reqs.remove(&req);
                    self.m.bufs.retain(|_, (r, _)| *r != req);
                }
                Event::Interval { .. } | Event::Sample { .. } => {}
            }
        }
        Ok(())
    }

    fn commit_step(&mut self, now: u64, fail: bool) {
        match self.commit.take() {
            None => {
                if let Some(c) = self.e.poll_commit() {
                    trace(|| format!("commit {c:?} fail={fail}"));
                    // The syncs: backing stores named, then the cache stores named.
                    if !fail {
                        for &vm in &c.sync_backings {
                            self.m.backing.iter_mut().filter(|(k, _)| k.0 == vm).for_each(|(_, c)| c.sync());
                        }
                        self.m.sync_stores(&c.sync_stores);
                    }
                    self.commit = Some((c, fail));
                }
            }
            Some((c, failed)) => {
                if failed {
                    self.e.handle_commit(now, c.epoch, Err(Failure::Io));
                } else {
                    for r in c.records {
                        let entry = self.m.journal_entry(r);
                        self.m.journal.push(entry);
                    }
                    self.e.handle_commit(now, c.epoch, Ok(()));
                }
            }
        }
    }
}

/// 8 local slots, and with `lent` 4 more in a region node 1 lends; else, for odd seeds,
/// 4 more on the host's second cache device.
fn config(shared: bool, replacement: ReplacementKind, lent: bool, seed: u64) -> EngineConfig {
    let partition = if shared { PartitionMode::Shared } else { PartitionMode::Static };
    let stores = match (lent, seed % 2) {
        (true, _) => vec![StoreSpec::lent(1, 4)],
        (false, 1) => vec![StoreSpec::device(1, 4)],
        _ => Vec::new(),
    };
    EngineConfig { partition, replacement, stores, ..EngineConfig::with_slots(8) }
}

/// Targets of 4 slots per VM, half of them lent when there is a lent store.
fn set_targets(e: &mut Engine, lent: bool, out: &mut Output) {
    for vm in 0..VMS {
        e.set_target(vm, 4, out);
        if lent {
            e.set_remote_shares(vm, &[(1, 2)]).unwrap();
        }
    }
}

fn run(steps: &[Step], shared: bool, seed: u64, ahead: u32, repl: ReplacementKind, lent: bool) -> Result<(), String> {
    run_losing(steps, shared, seed, ahead, repl, lent, false).inspect_err(|e| trace(|| format!("FAILED: {e}")))
}

/// [`run`]; with `lost` (and `lent`), the engine writes through to blocks in the lent
/// store (`set_lent_write_through`, the daemon's rule) and the crash takes the lender
/// with it: the lent store's every sector is foreign bytes afterwards, and the replay
/// skips its records (what the daemon does with a lender it cannot vouch for). Every
/// flushed write must still read back.
fn run_losing(
    steps: &[Step],
    shared: bool,
    seed: u64,
    ahead: u32,
    repl: ReplacementKind,
    lent: bool,
    lost: bool,
) -> Result<(), String> {
    run_checking(steps, shared, seed, ahead, repl, lent, lost, false)
}

/// [`run_losing`]; with `drain`, instead of the crash every op completes and every commit
/// is made durable until nothing is left: the engine must come to rest (no job in flight,
/// no commit due) — a checkpoint waits for exactly that.
#[allow(clippy::too_many_arguments)]
fn run_checking(
    steps: &[Step],
    shared: bool,
    seed: u64,
    ahead: u32,
    repl: ReplacementKind,
    lent: bool,
    lost: bool,
    drain: bool,
) -> Result<(), String> {
    let lost = lent && lost;
    // Seeds 3 mod 4: dirty data mirrored on the two devices; half of those lose one.
    let mirror = !lent && seed % 4 == 3;
    let lose_device = (mirror && (seed >> 2) % 2 == 1).then_some(((seed >> 3) % 2) as StoreId);
    trace(|| {
        format!("run shared={shared} seed={seed} ahead={ahead} replacement={repl:?} lent={lent} lost={lost} mirror={mirror} lose_device={lose_device:?}")
    });
    let mut e = Engine::new(config(shared, repl, lent, seed)).unwrap();
    e.set_lent_write_through(lost);
    if mirror {
        e.set_mirror_dirty(true).unwrap();
    }
    // Seeds with bit 5 set: a RAM tier of 3 blocks (every SSD hit fills it, or with bit 6
    // the second), lost at the crash.
    let ram = |e: &mut Engine| {
        if (seed >> 5) % 2 == 1 {
            e.set_ram_tier(3, if (seed >> 6) % 2 == 1 { RamFill::SecondHit } else { RamFill::EveryHit });
        }
    };
    ram(&mut e);
    let mut d = Driver {
        m: Machine::new(e.layout().clone()),
        e,
        flying: vec![],
        commit: None,
        version: 0,
        lending: Default::default(),
        losing: lost,
        lost_at: None,
        held_at_loss: BTreeSet::new(),
    };
    let mut out = Output::default();
    set_targets(&mut d.e, lent, &mut out);
    d.e.set_persistent(2);
    // Blocks unchanged for 3 steps are sealed (their checksums journaled).
    d.e.set_seal_after(3000);
    // Regions of 3 slots: a write waiting for a sealed slot unseals its region's others.
    d.e.set_seal_region(3);
    d.e.set_writeback_ahead(ahead);
    // A dirty target of 0: the flusher writes at its full rate among the requests.
    let flusher = Flusher { period_ns: 5 * STEP_NS, blocks_per_period: 2, dirty_target: 0.0 };
    d.e.set_schedule(0, Schedule { interval_ns: 0, flusher: Some(flusher), ..Default::default() });
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    for (i, st) in steps.iter().enumerate() {
        let now = i as u64 * STEP_NS;
        let ctx = |m: String| format!("step {i} {st:?}: {m}");
        trace(|| format!("step {i} {st:?}"));
        match *st {
            Step::Io { vm, write, sector, count } => {
                let op = if write { Op::Write } else { Op::Read };
                let req = Request { time_ns: now, vm, op, offset: sector * 512, len: (count * 512) as u32 };
                let id = d.e.submit(now, &req);
                trace(|| format!("submit {id} {req:?}"));
                let v = if write {
                    d.version += 1;
                    for s in sector..sector + count {
                        d.m.written.entry((vm, s)).or_default().insert(d.version);
                    }
                    d.version
                } else {
                    0
                };
                d.m.reqs.insert(id, (req, v, HashMap::new()));
            }
            Step::Complete { pick, fail } => {
                if !d.flying.is_empty() {
                    let op = d.flying.swap_remove(pick % d.flying.len());
                    // A dead lender answers nothing.
                    let fail = fail
                        || (d.lost_at.is_some()
                            && matches!(op.loc, Location::Cache(_))
                            && d.m.layout.store_of(op.slot) != 0);
                    trace(|| format!("complete {op:?} fail={fail}"));
                    d.m.execute(&op, fail, rng.gen_range(0..8)).map_err(ctx)?;
                    d.e.handle_completion(now, op.handle(), if fail { Err(Failure::Io) } else { Ok(()) });
                }
            }
            Step::Flush => {
                let id = d.e.submit_flush();
                d.m.flushes.insert(id, d.m.acked.clone());
            }
            Step::LoseLender => {
                if d.losing && d.lost_at.is_none() {
                    d.e.lose_lender(1);
                    let (first, n) = d.m.layout.range(1);
                    d.held_at_loss =
                        (first as u32..(first + n) as u32).filter(|&s| d.e.slot_block(s).is_some()).collect();
                    let id = d.e.submit_flush();
                    d.m.flushes.insert(id, d.m.acked.clone());
                    d.lost_at = Some(id);
                }
            }
            Step::Commit { fail } => d.commit_step(now, fail),
            Step::RequestCommit => d.e.request_commit(),
            Step::PacedTarget { vm, slots } => d.e.set_target_paced(vm, slots),
            Step::LazyPolicy { vm, policy } => {
                d.e.set_write_policy_lazy(vm, policy);
            }
            Step::Policy { vm, policy } => {
                d.e.submit_job(|e, out| e.set_write_policy(vm, policy, out));
            }
            Step::Bypass { vm, on } => {
                d.e.submit_job(|e, _| e.set_bypass(vm, on));
            }
            Step::Admission { vm, read, write } => {
                d.e.submit_job(|e, _| e.set_admission(vm, read, write));
            }
            Step::Classes { vm, pick } => {
                d.e.submit_job(|e, _| e.set_io_classes(vm, class_set(pick)).expect("few classes"));
            }
            Step::Congestion { read, write } => {
                d.e.submit_job(|e, _| e.set_congestion(read, write));
            }
            Step::SharedBudget { rate } => {
                let rate = rate.map(cachevisor_engine::BudgetRate::BytesPerSec);
                d.e.submit_job(|e, _| e.set_write_budget(rate));
            }
            Step::Prefetch { vm, policy } => {
                d.e.submit_job(|e, _| e.set_prefetch_policy(vm, policy));
            }
            Step::Prewarm { vm, block, len } => {
                d.e.submit_job(|e, out| {
                    e.prewarm_load(vm, block, len, out);
                });
            }
            Step::Checkpoint => {
                d.e.hold_requests(true, now);
                let mut rounds = 0;
                while !d.e.quiescent() {
                    rounds += 1;
                    if rounds > 10_000 {
                        return Err(ctx("a checkpoint never found the engine quiescent".into()));
                    }
                    if let Some(op) = d.flying.pop() {
                        d.m.execute(&op, false, 0).map_err(ctx)?;
                        d.e.handle_completion(now, op.handle(), Ok(()));
                    } else {
                        d.commit_step(now, false);
                    }
                    d.pump().map_err(ctx)?;
                }
                let mut records = Vec::new();
                let syncs = d.e.checkpoint(&mut |r| records.push(r));
                for vm in syncs.backings {
                    d.m.backing.iter_mut().filter(|(k, _)| k.0 == vm).for_each(|(_, c)| c.sync());
                }
                d.m.sync_stores(&syncs.stores);
                d.m.journal = records.into_iter().map(|r| d.m.journal_entry(r)).collect();
                d.e.checkpoint_done();
                d.e.hold_requests(false, now);
            }
            Step::Tick => d.e.handle_timeout(now),
            // Runs 4 and 5: the second cache device (when there is one), withheld whole
            // as a device removed online is (`cache remove`).
            Step::Lend { run, moving } if (run + 1) as u64 * RUN as u64 <= d.e.layout().total() => {
                if run < 4 || d.e.layout().kind(1).is_local() {
                    lending::lend(&mut d.e, &mut d.lending, run * RUN, moving).map_err(ctx)?
                }
            }
            Step::Lend { .. } => {}
            Step::Return { run } => {
                for s in lending::give_back(&mut d.e, &mut d.lending, run) {
                    d.m.lent.remove(&s);
                }
            }
            Step::Shares { .. } | Step::Migrate { .. } if !lent || shared => {}
            Step::Shares { vm, pick, scheme } => {
                d.e.submit_job(|e, _| {
                    // Refused once the lender is lost (its cap is 0): nothing changes.
                    let _ = e.set_remote_shares(vm, MIGRATION_SHARES[pick]);
                    e.set_migration(vm, scheme);
                });
            }
            Step::Migrate { vm, max } => {
                d.e.submit_job(|e, out| {
                    e.migrate_some(vm, max, out);
                });
            }
        }
        d.pump().map_err(ctx)?;
        d.lend_ready().map_err(ctx)?;
        d.e.check_invariants().map_err(ctx)?;
    }
    SLOT_WAITS.with(|w| w.set(w.get() + d.e.slot_waits()));
    if drain {
        let now = steps.len() as u64 * STEP_NS;
        for round in 0..200 {
            for op in std::mem::take(&mut d.flying) {
                let fail =
                    d.lost_at.is_some() && matches!(op.loc, Location::Cache(_)) && d.m.layout.store_of(op.slot) != 0;
                d.m.execute(&op, fail, 0)?;
                d.e.handle_completion(now, op.handle(), if fail { Err(Failure::Io) } else { Ok(()) });
            }
            d.pump()?;
            d.lend_ready()?;
            d.commit_step(now, false);
            d.pump()?;
            if d.flying.is_empty() && d.commit.is_none() && d.e.quiescent() {
                d.commit_step(now, false); // polls: none may be due
                if d.commit.is_none() {
                    return Ok(());
                }
            }
            trace(|| format!("drain round {round}: {} ops, quiescent {}", d.flying.len(), d.e.quiescent()));
        }
        return Err(format!(
            "no rest after 200 rounds of completions and commits: {} ops flying, quiescent {}, a commit due {}",
            d.flying.len(),
            d.e.quiescent(),
            d.commit.is_some()
        ));
    }
    // The crash: in-flight writes land torn (or not), unsynced writes survive at random.
    for op in std::mem::take(&mut d.flying) {
        if op.kind.is_write() && rng.gen_bool(0.5) {
            let _ = d.m.execute(&op, true, rng.gen_range(0..8));
        }
    }
    d.m.cache.values_mut().for_each(|c| c.crash(&mut rng));
    d.m.backing.values_mut().for_each(|c| c.crash(&mut rng));
    let lent_store = |slot: u32| !d.m.layout.kind(d.m.layout.store_of(slot)).is_local();
    if lost {
        for ((store, sector), c) in d.m.cache.iter_mut() {
            if !d.m.layout.kind(*store).is_local() {
                c.synced = Some((u32::MAX, *sector, 0));
            }
        }
    }
    if let Some(gone) = lose_device {
        for ((store, sector), c) in d.m.cache.iter_mut() {
            if *store == gone {
                c.synced = Some((u32::MAX, *sector, 0));
            }
        }
    }
    // Recovery: the journal replayed into a new engine (memory is empty).
    d.m.ram.clear();
    let mut e = Engine::new(config(shared, repl, lent, seed)).unwrap();
    e.set_lent_write_through(lost);
    if mirror {
        e.set_mirror_dirty(true).unwrap();
    }
    ram(&mut e);
    set_targets(&mut e, lent, &mut out);
    // The driver's checksums after the replay: the newest record of each slot, a seal's.
    let mut sums: HashMap<u32, Sums> = HashMap::new();
    for (r, crc) in &d.m.journal {
        if lost && lent_store(r.slot) {
            continue;
        }
        e.release_slot(r.slot);
        sums.remove(&r.slot);
        if let Some((vm, block)) = r.block {
            let bits = |w: &[u64]| (0..8).map(|i| w[0] >> i & 1 == 1).collect::<Vec<bool>>();
            if r.mirror {
                e.restore_mirror(r.slot, vm, block, &bits(&r.valid)).map_err(|x| format!("replay: {x}"))?;
                continue;
            }
            e.restore_slot(r.slot, vm, block, &bits(&r.valid), &bits(&r.dirty)).map_err(|x| format!("replay: {x}"))?;
            if r.sealed {
                e.restore_sealed(r.slot);
                if let Some(c) = crc {
                    sums.insert(r.slot, c.clone());
                }
            }
        }
    }
    // Mirrors paired with their blocks; the lost device dropped (its dirty blocks served
    // from their copies).
    e.settle_restored_mirrors();
    trace(|| {
        let dirty: Vec<String> = (0..e.slot_count() as u32)
            .filter(|&s| e.slot_dirty(s))
            .map(|s| format!("{s} {:?} {}", e.slot_block(s), e.slot_mirrored(s)))
            .collect();
        format!(
            "after replay: dirty slots (slot, block, mirrored) {dirty:?}; journal {:?}",
            d.m.journal.iter().map(|(r, _)| r).collect::<Vec<_>>()
        )
    });
    // Sectors a lost device took that the backing store holds at their flushed version
    // already: a commit cut between a written-back block's free record and its mirror's
    // leaves the mirror as the block, dirty, one copy (`settle_restored_mirrors`); lost
    // with the device it fails its reads, though nothing flushed is lost.
    let mut lost_but_on_backing: BTreeSet<(u32, u64)> = BTreeSet::new();
    if let Some(gone) = lose_device {
        let loss = e.fail_device(gone);
        trace(|| format!("device {gone} lost: {loss:?}"));
        let (first, n) = e.layout().range(gone);
        for slot in first as u32..(first + n) as u32 {
            let Some((vm, block)) = e.slot_block(slot) else { continue };
            for i in (0..8u32).filter(|&i| e.sector_state(slot, i).1) {
                let s = block * 8 + u64::from(i);
                let backing = d.m.backing.get(&(vm, s)).and_then(|c| c.synced).unwrap_or(0);
                if backing < d.m.floor.get(&(vm, s)).copied().unwrap_or(0) {
                    return Err(format!("device {gone} lost with the crash took vm {vm} sector {s}, flushed and only in the cache, though mirrored: {loss:?}"));
                }
                lost_but_on_backing.insert((vm, s));
            }
        }
    }
    let layout = d.m.layout.clone();
    let on_lost = |slot: u32| lose_device.is_some_and(|g| layout.store_of(slot) == g);
    // The cache store loses or garbles, at random, sectors the journal holds checksums for.
    let mut garbled: BTreeSet<(StoreId, u64)> = BTreeSet::new();
    for (&slot, s) in &sums {
        let (st, index) = d.m.layout.index_of(slot);
        for &i in s.keys() {
            if rng.gen_bool(0.3) {
                let at = (st, index * u64::from(SPB) + u64::from(i));
                let c = d.m.cache.entry(at).or_default();
                c.synced = Some(if rng.gen_bool(0.5) { (GARBAGE, at.1, 0) } else { (u32::MAX, at.1, 0) });
                garbled.insert(at);
            }
        }
    }
    d.m.sums = sums;
    e.check_invariants().map_err(|x| format!("after replay: {x}"))?;
    // The runs lent out are withheld again before any I/O, and are empty at once: no
    // durable record names a slot the engine let go of.
    for (&first, _) in d.lending.iter().filter(|(_, &lent)| lent) {
        out.clear();
        e.withhold(first, RUN, &mut out).map_err(|x| format!("after replay: {x}"))?;
        if !out.ops.is_empty() || !e.withheld_ready(first, RUN) {
            return Err(format!("after replay the journal still names a slot of the lent run at {first}"));
        }
    }
    // A sector the journal calls clean holds what the backing store holds: no later
    // eviction can make a read go back in time.
    for slot in 0..e.slot_count() as u32 {
        let Some((vm, block)) = e.slot_block(slot) else { continue };
        if on_lost(slot) {
            continue; // dirty with one copy, unreadable: checked below
        }
        for i in 0..8u64 {
            if e.sector_state(slot, i as u32) == (true, false) {
                let (st, index) = d.m.layout.index_of(slot);
                if garbled.contains(&(st, index * 8 + i)) {
                    continue; // garbled where the journal holds a checksum: checked below
                }
                let cached = d.m.cache.get(&(st, index * 8 + i)).and_then(|c| c.synced);
                let backing = d.m.backing.get(&(vm, block * 8 + i)).and_then(|c| c.synced).unwrap_or(0);
                if cached.map(|t| t.2) != Some(backing) {
                    return Err(format!("after the crash slot {slot} (vm {vm} block {block}) sector {i} is clean but holds {cached:?}, the backing store {backing}"));
                }
            }
        }
    }
    // Every sector of every disk, read through the recovered engine (its ops run as
    // they come on the devices as the crash left them; a cache read that fails its
    // checksum fails, and must have met a garbled sector).
    for vm in 0..VMS {
        for s in 0..SECTORS {
            let req = Request { time_ns: 0, vm, op: Op::Read, offset: s * 512, len: 512 };
            let mut result = Err(Failure::Io);
            let mut id = 0;
            // A request whose victim's write-back met garbled bytes fails; the victim is
            // poisoned, and the read tried again takes another (at most one per slot).
            // A read whose own bytes failed their checksum fails; with the block's copy on
            // another device (mirrored) the block moved there, and the read tried again
            // (as the daemon does an EIO) is served from it.
            for _attempt in 0..=e.slot_count() {
                let before = e.lookup(vm, s / 8);
                id = e.submit(0, &req);
                d.m.reqs.insert(id, (req, 0, HashMap::new()));
                let mut corrupt_own = false;
                while let Some(op) = e.poll_op() {
                    trace(|| format!("read-back {id}: {op:?}"));
                    if lose_device.is_some_and(|g| op.loc == Location::Cache(g)) {
                        e.handle_completion(0, op.handle(), Err(Failure::Io)); // a device gone
                        continue;
                    }
                    if op.kind == OpKind::SsdRead && d.m.corrupt(&op, &d.m.sums) {
                        let (lo, hi) = op.sectors(u64::from(SPB) * 512);
                        let (st, base) = (d.m.layout.store_of(op.slot), d.m.layout.offset(&op) / 512);
                        let met = (lo..hi).any(|i| garbled.contains(&(st, base + u64::from(i - lo))));
                        if !met {
                            return Err(format!("after the crash, vm {vm} sector {s}: {op:?} fails its checksum, yet nothing there is garbled (a seal outlived its bytes)"));
                        }
                        corrupt_own |= op.client;
                        trace(|| format!("corrupt {op:?}"));
                        e.handle_completion(0, op.handle(), Err(Failure::Corrupt));
                        continue;
                    }
                    d.m.execute(&op, false, 0).map_err(|x| format!("after the crash, vm {vm} sector {s}: {x}"))?;
                    if op.kind == OpKind::SsdWrite {
                        // Rewritten (a slot a promotion freed, taken again): not garbled now.
                        let (st, base) = (d.m.layout.store_of(op.slot), d.m.layout.offset(&op) / 512);
                        for i in 0..u64::from(op.len) / 512 {
                            garbled.remove(&(st, base + i));
                        }
                    }
                    e.handle_completion(0, op.handle(), Ok(()));
                }
                while let Some(ev) = e.poll_event() {
                    trace(|| format!("read-back {id}: {ev:?}"));
                    if let Event::Reply { req: r, result: x, .. } = ev {
                        if r == id {
                            result = x;
                        }
                    }
                }
                if result.is_ok() || (corrupt_own && e.lookup(vm, s / 8) == before) {
                    break;
                }
            }
            // Where the sector is cached now, in its store.
            let here = e.lookup(vm, s / 8).map(|sl| {
                let (st, index) = d.m.layout.index_of(sl);
                (sl, (st, index * 8 + s % 8))
            });
            let garbled_here = here.is_some_and(|(_, at)| garbled.contains(&at));
            if let Err(f) = result {
                if f == Failure::Io && lost_but_on_backing.contains(&(vm, s)) {
                    continue; // see above
                }
                if f != Failure::Corrupt || !garbled_here {
                    return Err(format!("after the crash vm {vm} sector {s}: the read failed ({f:?}) and its bytes are not garbled (at {here:?}; garbled {garbled:?})"));
                }
                continue; // lost with the cache store's bytes, and said so
            }
            if garbled_here {
                return Err(format!("after the crash vm {vm} sector {s}: garbled where the journal holds its checksum, yet read without an error"));
            }
            let got = *d.m.reqs[&id].2.get(&s).ok_or("no op read the sector")?;
            let floor = d.m.floor.get(&(vm, s)).copied().unwrap_or(0);
            let written = d.m.written.get(&(vm, s)).cloned().unwrap_or_default();
            if got < floor || (got != 0 && !written.contains(&got)) {
                return Err(format!(
                    "after the crash vm {vm} sector {s} holds {got}; flushed {floor}, written {written:?}"
                ));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(300)))]

    /// Every history is checked twice: crashed at its end (every flushed write kept, no
    /// foreign bytes), and — liveness — with every op completing and every commit made
    /// durable until the engine comes to rest (no job in flight, no commit due: what a
    /// checkpoint waits for; a daemon migrating for 10 minutes once never did).
    #[test]
    fn a_crash_at_any_point_keeps_every_flushed_write_and_serves_no_foreign_bytes(
        steps in prop::collection::vec(step(), 1..250),
        shared in any::<bool>(),
        seed in any::<u64>(),
        ahead in prop::sample::select(vec![0u32, 2, 8]),
        lent in any::<bool>(),
        lost in any::<bool>(),
    ) {
        for drain in [false, true] {
            run_checking(&steps, shared, seed, ahead, ReplacementKind::Lru, lent, lost, drain)
                .map_err(|e| TestCaseError::fail(format!("{}: {e}", if drain { "drain" } else { "crash" })))?;
        }
    }

    /// The same under the other replacement policies (`adaptive`'s partitions use
    /// S3-FIFO, S-CAVE's CLOCK): victims, and so evictions ahead and write-backs, differ.
    #[test]
    fn a_crash_keeps_every_flushed_write_under_every_replacement(
        steps in prop::collection::vec(step(), 1..250),
        shared in any::<bool>(),
        seed in any::<u64>(),
        ahead in prop::sample::select(vec![0u32, 2, 8]),
        repl in prop::sample::select(vec![ReplacementKind::S3fifo, ReplacementKind::Clock, ReplacementKind::TwoPool, ReplacementKind::Fifo]),
        lent in any::<bool>(),
    ) {
        run(&steps, shared, seed, ahead, repl, lent).map_err(TestCaseError::fail)?;
    }
}

thread_local! {
    /// Requests that waited for a commit to free a slot (`Engine::slot_waits`), summed
    /// over this thread's runs.
    static SLOT_WAITS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Misses into a full cache with commits held back: the durable free reserve (2 slots)
/// runs out, so misses wait in admission for the commit that returns slots from limbo
/// (`slot_wait.rs`) instead of bypassing. Crashed, and drained to rest: every flushed
/// write kept, no foreign bytes, nothing stuck waiting.
#[test]
fn misses_that_find_no_durable_free_slot_wait_for_the_commit_and_survive_a_crash() {
    let mut steps = Vec::new();
    for round in 0..6u64 {
        for b in 0..SECTORS / 8 {
            let vm = (b % 2) as u32;
            steps.push(Step::Io { vm, write: round % 2 == 0, sector: ((b + round) % (SECTORS / 8)) * 8, count: 8 });
            steps.extend((0..3).map(|pick| Step::Complete { pick, fail: false }));
        }
        steps.push(Step::Flush);
        steps.extend((0..6).map(|pick| Step::Complete { pick, fail: false }));
        steps.push(Step::Commit { fail: false });
        steps.extend((0..6).map(|pick| Step::Complete { pick, fail: false }));
        steps.push(Step::Commit { fail: false });
    }
    for shared in [false, true] {
        for drain in [false, true] {
            SLOT_WAITS.with(|w| w.set(0));
            run_checking(&steps, shared, 8, 0, ReplacementKind::Lru, false, false, drain).unwrap();
            assert!(
                SLOT_WAITS.with(|w| w.get()) > 0,
                "shared={shared}: no miss waited for a slot, the case proves nothing"
            );
        }
    }
}
