//! The daemon's core: the engine (which decides) and the files (which hold the bytes),
//! behind one lock. Every NBD command becomes an engine call whose device operations are
//! executed against the cache store and the backing files before the reply, so the engine
//! state and the bytes on disk never disagree. Serializing on one lock is the simple,
//! safe first shape; a sharded or queue-based data path is the speed work to come.

use crate::backing::Backing;
use crate::config::{Config, Resolved};
use crate::executor::{execute, execute_with, Client, Devices, OpError};
use crate::journal::Record;
use crate::persist::{bits_to_bools, Persistence, Pre};
use cachevisor_engine::slot_table::pack_key;
use cachevisor_engine::OpKind;
use cachevisor_engine::{Engine, EngineConfig, FillMode, Output, PartitionMode};
use cachevisor_policy::controller::{self, Controller, VmSettings, WindowCounts};
use cachevisor_policy::registry;
use cachevisor_trace::units::parse_size;
use cachevisor_trace::{Op, Request, VmId};
use std::fs::File;
use std::sync::{Mutex, RwLock};
use std::time::Instant;

mod start;
mod undo;
pub use start::StartOptions;

/// One served vDisk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// Its VM id in the engine.
    pub id: VmId,
    /// Export name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
}

/// One vDisk's state and counters, as the API and metrics report it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VdiskStatus {
    /// Export name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Write policy.
    pub write_policy: cachevisor_engine::WritePolicy,
    /// Cache blocks held.
    pub used_blocks: u64,
    /// Partition target in blocks.
    pub target_blocks: u64,
    /// Dirty blocks.
    pub dirty_blocks: u64,
    /// Cache block size in bytes (the unit of the block counts).
    pub block_size: u64,
    /// Counters.
    pub stats: ExportStats,
}

/// Per-export counters.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct ExportStats {
    /// Read requests.
    pub reads: u64,
    /// Write requests.
    pub writes: u64,
    /// Block accesses that hit.
    pub hit_blocks: u64,
    /// Block accesses.
    pub blocks: u64,
    /// Of the block accesses, by reads.
    pub read_blocks: u64,
    /// Of the hits, by reads.
    pub read_hit_blocks: u64,
    /// Bytes read by clients.
    pub read_bytes: u64,
    /// Bytes written by clients.
    pub write_bytes: u64,
    /// Flushes.
    pub flushes: u64,
    /// TRIM requests.
    pub trims: u64,
    /// Device errors returned as EIO.
    pub errors: u64,
    /// The vDisk bypasses the cache after too many device errors.
    pub passthrough: bool,
}

struct Files {
    /// Shared so O_DIRECT hits can read with the core lock released.
    ssd: std::sync::Arc<File>,
    /// Write versions of cache-store blocks (see `prefetch`): O_DIRECT hits read without
    /// the lock and check that no write began meanwhile.
    ssd_versions: std::sync::Arc<crate::prefetch::Versions>,
    /// The cache store is O_DIRECT: its I/O goes through an aligned bounce buffer.
    direct: Option<Mutex<crate::aligned_buf::AlignedBuf>>,
    /// Shared so a prefetch can read with the core lock released.
    backings: Vec<std::sync::Arc<Backing>>,
    /// Write versions of backing blocks (see `prefetch`).
    versions: std::sync::Arc<crate::prefetch::Versions>,
    /// Injected fault: the cache-store write at which to fail (counting down).
    fail_ssd_write_in: std::sync::atomic::AtomicU64,
    /// The cache's block size.
    bs: u64,
}

impl Devices for Files {
    fn ssd(&self) -> &File {
        &self.ssd
    }
    fn backing(&self, vm: VmId) -> &Backing {
        &self.backings[vm as usize]
    }
    fn block_size(&self) -> u64 {
        self.bs
    }
    fn fault(&self, op: &cachevisor_engine::DeviceOp) -> std::io::Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        if op.kind == OpKind::SsdWrite {
            let n = self.fail_ssd_write_in.load(Relaxed);
            if n > 0 {
                self.fail_ssd_write_in.store(n - 1, Relaxed);
                if n == 1 {
                    return Err(std::io::Error::other("injected cache-store write failure"));
                }
            }
        }
        Ok(())
    }
    fn ssd_read(&self, buf: &mut [u8], addr: u64) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        match &self.direct {
            None => self.ssd.read_exact_at(buf, addr),
            Some(b) => {
                crate::aligned_buf::read_at(&self.ssd, &mut b.lock().unwrap_or_else(|e| e.into_inner()), buf, addr)
            }
        }
    }
    fn ssd_write(&self, data: &[u8], addr: u64) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.ssd_versions.around_write(0, addr, data.len() as u64, || match &self.direct {
            None => self.ssd.write_all_at(data, addr),
            Some(b) => {
                crate::aligned_buf::write_at(&self.ssd, &mut b.lock().unwrap_or_else(|e| e.into_inner()), data, addr)
            }
        })
    }
    fn backing_write(&self, vm: VmId, data: &[u8], addr: u64) -> std::io::Result<()> {
        self.versions.around_write(vm, addr, data.len() as u64, || self.backings[vm as usize].write_at(data, addr))
    }
}

struct Core {
    /// Blocks (keys) whose client write-through is still on its way to the backing store,
    /// with the number of such writes: requests touching them wait for
    /// [`Daemon::unfenced`].
    fenced: std::collections::HashMap<u64, u32>,
    engine: Engine,
    files: Files,
    out: Output,
    staging: Vec<(VmId, u64, Vec<u8>)>,
    stats: Vec<ExportStats>,
    persist: Persistence,
    names: Vec<String>,
    /// Device errors after which a vDisk stops using the cache.
    error_threshold: u64,
    passthrough: Vec<bool>,
    /// The interval controller (the same code the simulator runs).
    ctl: Controller,
    /// Counters at the last interval, and when it was.
    last: Vec<ExportStats>,
    last_tick: Instant,
    /// Trace recording of every request.
    recorder: Option<cachevisor_trace::TraceWriter>,
    /// The daemon stopped serving ([`Daemon::stop_serving`]): no more device I/O.
    stopped: bool,
    /// Each vDisk's backing store by VM id (`None` once removed).
    identities: Vec<Option<crate::backing_identity::Identity>>,
}

/// What a warm start found in the metadata.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Blocks back in the cache.
    pub blocks: u64,
    /// Of which dirty.
    pub dirty_blocks: u64,
    /// Journal records replayed after the checkpoint.
    pub journal_records: usize,
    /// The journal ended in a torn record (the previous run died while appending).
    pub torn_tail: bool,
}

fn os_err(kind: OpKind, vm: VmId, source: std::io::Error) -> OpError {
    OpError { kind, vm, disk_addr: 0, ssd_addr: 0, len: 0, source, at: usize::MAX }
}

/// Dirty blocks found by one scan (keys in backing-address order) waiting to be written
/// back by a flusher or a destage job, and where the next scan starts.
#[derive(Debug, Default)]
pub struct DestageQueue {
    vm: Option<VmId>,
    keys: std::collections::VecDeque<u64>,
    cursor: u32,
}

impl DestageQueue {
    /// A queue for `vm`'s dirty blocks (or every vDisk's).
    pub fn new(vm: Option<VmId>) -> Self {
        DestageQueue { vm, ..Default::default() }
    }
}

/// Dirty blocks a scan takes at once (64 MiB of 4 KiB blocks): the sweep is in address
/// order within each batch.
const DESTAGE_BATCH: usize = 16384;

fn dirty_left(engine: &Engine, vm: Option<VmId>, vms: usize) -> u64 {
    match vm {
        Some(v) => engine.partition(v).dirty_blocks,
        None => (0..vms).map(|v| engine.partition(v as VmId).dirty_blocks).sum(),
    }
}

/// The sectors of block `b` (of `bs` bytes) that `len` bytes at `offset` touch.
fn sectors_of(offset: u64, len: u64, bs: u64, b: u64) -> (u32, u32) {
    let start = b * bs;
    (((offset.max(start) - start) / 512) as u32, ((offset + len).min(start + bs) - start).div_ceil(512) as u32)
}

/// Sets up a new VM id for vDisk `v` in the engine (write policy, sequential cutoff) and
/// the controller (weight, ratio, minimum). The partition is empty: no device work.
fn enroll(
    engine: &mut Engine,
    ctl: &mut Controller,
    id: VmId,
    v: &crate::config::VdiskConfig,
    block_size: u64,
    out: &mut Output,
) -> Result<(), String> {
    let min = v.min.as_deref().map(parse_size).transpose()?.unwrap_or(0);
    let cutoff = v.sequential_cutoff.as_deref().map(parse_size).transpose()?;
    engine.ensure_vm(id);
    if let Some(p) = v.write_policy {
        engine.set_write_policy(id, p, out);
    }
    if let Some(c) = cutoff {
        engine.set_sequential_cutoff(id, c);
    }
    ctl.add_vm(VmSettings { weight: v.weight, ratio: v.ratio, min_blocks: min.div_ceil(block_size) });
    Ok(())
}

/// Why adding or removing a vDisk was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// Bad settings.
    #[error("{0}")]
    Invalid(String),
    /// The name is taken, or the change would leave nothing to serve.
    #[error("{0}")]
    Conflict(String),
    /// No such vDisk.
    #[error("{0}")]
    NotFound(String),
    /// A device or metadata failure.
    #[error("{0}")]
    Failed(String),
}

/// The error of a request that raced with the removal of its vDisk.
fn removed_err(vm: VmId) -> OpError {
    os_err(OpKind::BackingRead, vm, std::io::Error::new(std::io::ErrorKind::NotFound, "the vDisk was removed"))
}

/// The error of a request that arrives after [`Daemon::stop_serving`].
fn stopped_err(vm: VmId) -> OpError {
    os_err(OpKind::BackingRead, vm, std::io::Error::new(std::io::ErrorKind::NotConnected, "the daemon stopped serving"))
}

/// Runs background ops (write-backs, evictions) and makes their write-backs durable
/// (backing stores of `sync_vm`, or of every VM that took one, fsynced). When an op fails
/// or a sync does, what did not complete or is not durable is put back (see `undo`): the
/// blocks stay dirty. The metadata is recorded by the caller.
fn run_background(
    engine: &mut Engine,
    files: &Files,
    out: &Output,
    staging: &mut Vec<(VmId, u64, Vec<u8>)>,
    sync_vm: Option<VmId>,
) -> Result<(), OpError> {
    if let Err(e) = execute(&out.ops, Client::None, files, staging) {
        undo::undo(engine, &out.ops, e.at, &Default::default(), None);
        return Err(e);
    }
    let mut vms: Vec<VmId> =
        out.ops.iter().filter(|o| o.kind == OpKind::BackingWrite).map(|o| o.vm).chain(sync_vm).collect();
    vms.sort_unstable();
    vms.dedup();
    for vm in vms {
        if let Err(e) = files.backings[vm as usize].sync() {
            undo::undo(engine, &out.ops, out.ops.len(), &Default::default(), None);
            return Err(os_err(OpKind::BackingWrite, vm, e));
        }
    }
    Ok(())
}

/// Counts a device error of `vm`; at the threshold the vDisk enters pass-through, keeping
/// its dirty blocks cached until they are written back (`Engine::set_bypass`).
fn count_error(
    name: &str,
    engine: &mut Engine,
    s: &mut ExportStats,
    passthrough: &mut bool,
    threshold: u64,
    vm: VmId,
    e: &OpError,
) {
    s.errors += 1;
    tracing::error!(%e, vdisk = name, errors = s.errors, "device error");
    if s.errors >= threshold && !*passthrough {
        *passthrough = true;
        s.passthrough = true;
        engine.set_bypass(vm, true);
        let p = engine.partition(vm);
        tracing::error!(vdisk = name, errors = s.errors, cached = p.used, dirty = p.dirty_blocks, "error threshold reached: the vDisk passes through to its backing store from now on; its dirty blocks stay cached (reads of them hit) until they are written back");
    }
}

impl Core {
    /// Counts a device error of `vm` (see [`count_error`]).
    fn device_error(&mut self, vm: VmId, e: &OpError) {
        let Core { engine, stats, passthrough, error_threshold, names, .. } = self;
        count_error(
            &names[vm as usize],
            engine,
            &mut stats[vm as usize],
            &mut passthrough[vm as usize],
            *error_threshold,
            vm,
            e,
        );
    }

    /// Applies an allocation decision online — vDisks in pass-through keep no cache —
    /// and makes the write-backs it causes durable before the metadata says clean.
    fn apply(&mut self, mut d: cachevisor_policy::allocator::Decision) -> Result<(), OpError> {
        let Core { engine, files, out, staging, persist, passthrough, .. } = self;
        for (vm, &p) in passthrough.iter().enumerate() {
            if p {
                // Draining: its dirty blocks leave as the flusher writes them back (`tick`).
                d.targets[vm] = engine.partition(vm as VmId).target;
                d.write_policies[vm] = None;
            }
        }
        *out = controller::apply(engine, &d);
        run_background(engine, files, out, staging, None)?;
        persist.record_all(engine).map_err(|e| os_err(OpKind::SsdWrite, 0, e))?;
        for (vm, &t) in d.targets.iter().enumerate() {
            persist.record_target(vm as u16, t).map_err(|e| os_err(OpKind::SsdWrite, vm as VmId, e))?;
        }
        Ok(())
    }
}

/// The daemon: exports and the locked core.
pub struct Daemon {
    metrics: crate::metrics::Metrics,
    /// The cache store is O_DIRECT.
    direct: bool,
    /// Test hook: microseconds to wait before a read done without the lock (widens races).
    unlocked_delay_us: std::sync::atomic::AtomicU64,
    /// By VM id; `None` once removed (ids are not reused while the daemon runs).
    exports: RwLock<Vec<Option<ExportInfo>>>,
    /// vDisks added and removed through the API (serializes those calls).
    overlay: Mutex<crate::vdisk_overlay::Overlay>,
    block_size: u64,
    resolved: Resolved,
    core: Mutex<Core>,
    /// Signalled when fenced blocks are released.
    unfenced: std::sync::Condvar,
    start: Instant,
    recovery: Recovery,
    meta_dir: std::path::PathBuf,
    /// Blocks written back by the flusher and destage jobs since the start.
    destaged: std::sync::atomic::AtomicU64,
    job: crate::destage_job::Job,
    /// The exclusive lock on the cache store and metadata (released by `stop_serving`).
    owner: Mutex<Option<crate::owner_lock::OwnerLock>>,
}

/// A failed start: which file or setting.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Bad configuration.
    #[error("config: {0}")]
    Config(String),
    /// Starting would harm stored data (the cache is in use, dirty blocks are bound to
    /// another backing store): the message says what to do.
    #[error("{0}")]
    Refused(String),
    /// A file could not be opened or created (the reason is in the message, not chained
    /// again as a source: `{:#}` would print it twice).
    #[error("{path}: {error}")]
    File {
        /// The file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
}

impl Daemon {
    /// Latency histograms (and the metrics exposition).
    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.metrics
    }

    /// The metadata directory.
    pub fn metadata_dir(&self) -> &std::path::Path {
        &self.meta_dir
    }

    /// Whether the cache store is O_DIRECT.
    pub fn direct_io(&self) -> bool {
        self.direct
    }

    /// What the warm start recovered.
    pub fn recovery(&self) -> Recovery {
        self.recovery
    }

    /// The vDisks being served, by VM id.
    pub fn exports(&self) -> Vec<ExportInfo> {
        self.exports.read().unwrap_or_else(|e| e.into_inner()).iter().flatten().cloned().collect()
    }

    /// vDisk `vm`, unless it was removed.
    pub fn export(&self, vm: VmId) -> Option<ExportInfo> {
        self.exports.read().unwrap_or_else(|e| e.into_inner()).get(vm as usize).cloned().flatten()
    }

    /// Whether vDisk `vm` is still served.
    pub fn is_live(&self, vm: VmId) -> bool {
        self.exports.read().unwrap_or_else(|e| e.into_inner()).get(vm as usize).is_some_and(|e| e.is_some())
    }

    /// The numbers the configuration resolved to (with the API's vDisk changes laid over).
    pub fn resolved(&self) -> Resolved {
        self.resolved
    }

    /// Cache block size.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Counters of export `vm`.
    pub fn stats(&self, vm: VmId) -> ExportStats {
        self.lock().stats[vm as usize]
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Core> {
        // A panic while holding the lock leaves engine and files consistent up to the op
        // that failed; keep serving.
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits (lock released meanwhile) until no write-through to the blocks of `len` bytes
    /// at `offset` of `vm` is on its way to the backing store — for a read, only of blocks
    /// it would miss (a hit returns the new data, which the cache already holds).
    fn unfenced<'a>(
        &self,
        mut guard: std::sync::MutexGuard<'a, Core>,
        vm: VmId,
        offset: u64,
        len: u64,
        read: bool,
    ) -> std::sync::MutexGuard<'a, Core> {
        let bs = self.block_size;
        let blocks = offset / bs..(offset + len.max(1)).div_ceil(bs);
        let waits = |core: &Core| {
            !core.fenced.is_empty()
                && blocks.clone().any(|b| {
                    core.fenced.contains_key(&pack_key(vm, b))
                        && !(read && core.engine.holds(vm, b, sectors_of(offset, len, bs, b)))
                })
        };
        while waits(&guard) {
            guard = self.unfenced.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        guard
    }

    /// Serves one read or write under the core lock (`guard`); backing reads covered by
    /// `prefetch` (read with the lock released, still valid) are served from its bytes.
    fn access(
        &self,
        guard: std::sync::MutexGuard<'_, Core>,
        vm: VmId,
        op: Op,
        offset: u64,
        client: Client<'_>,
        prefetch: Option<&crate::prefetch::Prefetch>,
    ) -> Result<(), OpError> {
        self.access_once(guard, vm, op, offset, client, prefetch, true)
    }

    /// [`Self::access`]; with `first` false (a read retried after racing with a cache-store
    /// write) the request is not observed, recorded or counted again.
    #[allow(clippy::too_many_arguments)]
    fn access_once(
        &self,
        mut guard: std::sync::MutexGuard<'_, Core>,
        vm: VmId,
        op: Op,
        offset: u64,
        client: Client<'_>,
        prefetch: Option<&crate::prefetch::Prefetch>,
        first: bool,
    ) -> Result<(), OpError> {
        let len = match &client {
            Client::Read(_, _, b) => b.len(),
            Client::Write(_, _, b) => b.len(),
            Client::None => 0,
        };
        let req = Request { time_ns: self.start.elapsed().as_nanos() as u64, vm, op, offset, len: len as u32 };
        let bs = self.block_size;
        let blocks = if len == 0 { 0..0 } else { offset / bs..(offset + len as u64 - 1) / bs + 1 };
        guard = self.unfenced(guard, vm, offset, len as u64, !op.is_write());
        let Core {
            engine,
            files,
            out,
            staging,
            stats,
            persist,
            error_threshold,
            passthrough,
            ctl,
            recorder,
            names,
            fenced,
            stopped,
            ..
        } = &mut *guard;
        if *stopped {
            return Err(stopped_err(vm));
        }
        if ctl.is_retired(vm as usize) {
            return Err(removed_err(vm));
        }
        if ctl.observes() && first {
            ctl.observe(&req);
        }
        if let Some(w) = recorder.as_mut().filter(|_| first) {
            if let Err(e) = w.write(&req, &names[vm as usize]) {
                tracing::error!(%e, "trace recording failed: stopped");
                *recorder = None;
            }
        }
        // The journaled state of the slots the request's blocks hold: what a barrier must
        // supersede if the request overwrites them.
        // Only writes rewrite sectors a slot already vouches for; a read's cache writes are
        // fills of invalid sectors or of slots taken from another block (keys below), so
        // reads skip this capture (an unknown state is treated conservatively).
        let mut pre: std::collections::HashMap<u32, Pre> = if op.is_write() {
            blocks
                .clone()
                .filter_map(|b| engine.lookup(vm, b))
                .map(|slot| (slot, Pre::State(crate::persist::SlotState::of(engine, slot))))
                .collect()
        } else {
            Default::default()
        };
        engine.access(req.time_ns, &req, out);
        // Slots taken from another block: the evicted block's key was journaled there.
        for (b, o) in blocks.clone().zip(out.blocks.iter()) {
            if let (Some(ev), Some(slot)) = (o.evicted, engine.lookup(vm, b)) {
                pre.entry(slot).or_insert(Pre::Key(pack_key(ev.vm, ev.block)));
            }
        }
        let s = &mut stats[vm as usize];
        if first {
            let (blocks, hits) = (out.blocks.len() as u64, out.blocks.iter().filter(|b| b.hit).count() as u64);
            s.blocks += blocks;
            s.hit_blocks += hits;
            if op.is_write() {
                s.writes += 1;
                s.write_bytes += len as u64;
            } else {
                s.reads += 1;
                s.read_bytes += len as u64;
                s.read_blocks += blocks;
                s.read_hit_blocks += hits;
            }
        }
        // An O_DIRECT hit waits on the device: read with the lock released, then check
        // that no cache-store write began on those blocks meanwhile (else once more under
        // the lock). Buffered hits are served from the page cache faster than the lock
        // would be given up and taken again.
        let device_hit = first
            && self.direct
            && matches!(client, Client::Read(..))
            && !out.ops.is_empty()
            && out.ops.iter().all(|o| o.kind == OpKind::SsdRead && !o.staged);
        if device_hit {
            let Client::Read(_, _, buf) = client else { unreachable!("a read") };
            let ops = out.ops.clone();
            let noted: Vec<Vec<u64>> = ops
                .iter()
                .map(|o| files.ssd_versions.snapshot_range(0, o.ssd_offset(files.bs), o.len as u64))
                .collect();
            let (ssd, versions, bs) = (files.ssd.clone(), files.ssd_versions.clone(), files.bs);
            // A read promises no durability: a journal that takes no appends (its records wait
            // in memory, in order) does not fail it.
            let _ = persist.record(engine, |_| None);
            drop(guard);
            self.unlocked_delay();
            let dev = crate::prefetch::UnlockedSsd { ssd: &ssd, bs, bounce: Default::default() };
            let r = execute(&ops, Client::Read(vm, offset, &mut *buf), &dev, &mut Vec::new());
            if r.is_ok()
                && ops.iter().zip(&noted).all(|(o, n)| versions.snapshot_range(0, o.ssd_offset(bs), o.len as u64) == *n)
            {
                return Ok(());
            }
            return self.access_once(self.lock(), vm, op, offset, Client::Read(vm, offset, buf), None, false);
        }
        // Cache-store writes over data the synced metadata vouches for need a barrier.
        let mut barrier: Vec<(u32, u64, (u32, u32), Pre)> = Vec::new();
        for o in out.ops.iter().filter(|o| o.kind == OpKind::SsdWrite) {
            let (slot, _, range) = undo::ssd_place(o, bs);
            let new_key = engine.slot_block(slot).map_or(u64::MAX, |(v, b)| pack_key(v, b));
            let p = pre.get(&slot).cloned().unwrap_or(Pre::Free);
            if persist.needs_barrier(slot, new_key, range, &p) {
                barrier.push((slot, new_key, range, p));
            }
        }
        // A client write's own backing writes (write-through, write-around) run after the
        // lock is released, the blocks fenced meanwhile — unless a later op reads the
        // backing store back.
        let write_data = match &client {
            Client::Write(_, _, d) => Some(*d),
            _ => None,
        };
        let own_write = |o: &cachevisor_engine::DeviceOp| o.kind == OpKind::BackingWrite && !o.staged && o.vm == vm;
        let defer = first
            && write_data.is_some()
            && out
                .ops
                .iter()
                .position(own_write)
                .is_some_and(|i| !out.ops[i..].iter().any(|o| o.kind == OpKind::BackingRead && o.vm == vm));
        let deferred: Vec<cachevisor_engine::DeviceOp> =
            if defer { out.ops.iter().filter(|o| own_write(o)).cloned().collect() } else { Vec::new() };
        out.ops.retain(|o| !(defer && own_write(o)));
        let mut wrote_back: Vec<VmId> = Vec::new();
        let mut pending = !barrier.is_empty();
        let files_ref: &Files = files;
        let with_prefetch = prefetch.map(|p| crate::prefetch::WithPrefetch { dev: files_ref, p });
        let dev: &dyn Devices = match &with_prefetch {
            Some(w) => w,
            None => files_ref,
        };
        let mut client = client;
        let r = execute_with(&out.ops, client.reborrow(), dev, staging, &mut |o| {
            if o.kind == OpKind::BackingWrite && o.staged && !wrote_back.contains(&o.vm) {
                wrote_back.push(o.vm);
            }
            if pending && o.kind == OpKind::SsdWrite {
                pending = false;
                let backs: Vec<&Backing> = wrote_back.iter().map(|&v| &*files_ref.backings[v as usize]).collect();
                persist.barrier(&barrier, &files_ref.ssd, &backs)?;
            }
            Ok(())
        });
        // The slots that will hold data the backing store does not have yet stay out of
        // the journal until it does.
        let held: Vec<(u32, u64)> = if defer && r.is_ok() {
            blocks.clone().filter_map(|b| engine.lookup(vm, b).map(|slot| (slot, pack_key(vm, b)))).collect()
        } else {
            Vec::new()
        };
        if defer && r.is_ok() {
            persist.withhold(&held);
        }
        if let Err(e) = &r {
            let write = write_data.map(|d| (vm, offset, d.len() as u64));
            undo::undo(engine, &out.ops, e.at, &pre, write);
            count_error(&names[vm as usize], engine, s, &mut passthrough[vm as usize], *error_threshold, vm, e);
        }
        // A read whose new slot could not be had (the victim's write-back failed, e.g. a
        // full backing store) is served without taking slots: hits from the cache, the
        // rest from the backing store, which has it (the victim stays cached dirty).
        let evicting = |e: &OpError| e.kind == OpKind::BackingWrite && out.ops.get(e.at).is_some_and(|o| o.staged);
        let r = match r {
            Err(e) if !op.is_write() && evicting(&e) => {
                engine.access_no_insert(req.time_ns, &req, out);
                // Fills of sectors missing from cached blocks are left out: not needed to
                // answer, and their slots stay as they were.
                for o in out.ops.iter().filter(|o| o.kind == OpKind::SsdWrite) {
                    let (_, block, range) = undo::ssd_place(o, bs);
                    engine.discard(o.vm, block, range);
                }
                out.ops.retain(|o| o.kind != OpKind::SsdWrite);
                execute(&out.ops, client.reborrow(), files_ref, staging).inspect_err(|e2| {
                    undo::undo(engine, &out.ops, e2.at, &pre, None);
                })
            }
            r => r,
        };
        let post = (|| -> Result<(), OpError> {
            if let Err(e) = persist.record(engine, |slot| pre.get(&slot).cloned()) {
                // A read promises no durability: its records wait in memory (in order) for
                // the journal to take them. A write fails: it cannot be made durable now.
                if op.is_write() {
                    return Err(os_err(OpKind::SsdWrite, vm, e));
                }
            }
            // S-CAVE's global cleaner keeps a reserve of free slots (§V-B).
            if let Some(w) = ctl.allocator().cleaner() {
                let slots = engine.slot_count() as f64;
                if (engine.free_slots() as f64) < w.low * slots {
                    engine.clean((w.high * slots) as u64, out);
                    run_background(engine, files, out, staging, None)?;
                    persist.record_all(engine).map_err(|e| os_err(OpKind::SsdWrite, vm, e))?;
                }
            }
            Ok(())
        })();
        if defer && r.is_ok() {
            if let Err(e) = post {
                // The client gets the error; the cache must not keep what the backing store
                // will not get.
                persist.unwithhold(&held);
                undo::undo(engine, &out.ops, out.ops.len(), &pre, write_data.map(|d| (vm, offset, d.len() as u64)));
                return Err(e);
            }
            // Fenced only now that nothing can fail before the backing write is issued.
            for b in blocks.clone() {
                *fenced.entry(pack_key(vm, b)).or_default() += 1;
            }
        }
        post?;
        if !defer || r.is_err() {
            return r;
        }
        let (backing, versions) = (files.backings[vm as usize].clone(), files.versions.clone());
        drop(guard);
        self.unlocked_delay();
        let data = write_data.expect("a write");
        let mut res = Ok(());
        for o in &deferred {
            let from = (o.disk_addr - offset) as usize;
            let chunk = &data[from..from + o.len as usize];
            if let Err(source) =
                versions.around_write(vm, o.disk_addr, o.len as u64, || backing.write_at(chunk, o.disk_addr))
            {
                res = Err(OpError {
                    kind: o.kind,
                    vm,
                    disk_addr: o.disk_addr,
                    ssd_addr: 0,
                    len: o.len,
                    source,
                    at: usize::MAX,
                });
                break;
            }
        }
        let mut guard = self.lock();
        let core = &mut *guard;
        if let Err(e) = &res {
            // The cache must not keep data the backing store did not take (dirty sectors
            // outside what this write covered stay).
            undo::drop_clean(&mut core.engine, vm, offset, data.len() as u64);
            core.device_error(vm, e);
        }
        for b in blocks {
            if let std::collections::hash_map::Entry::Occupied(mut e) = core.fenced.entry(pack_key(vm, b)) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
        let released = core.persist.release(&core.engine, &held);
        drop(guard);
        self.unfenced.notify_all();
        released.map_err(|e| os_err(OpKind::SsdWrite, vm, e))?;
        res
    }

    /// One step of the background flusher or of a destage job: writes back up to
    /// `max_blocks` dirty blocks taken from `q` (refilled by a scan of the dirty bitmap,
    /// in backing-address order), and makes that durable before the metadata says clean.
    /// The core lock is held for at most ~10 ms of write-back at a time (one block on a
    /// very slow backing store), so foreground I/O interleaves. Returns the blocks written
    /// back and the dirty blocks left.
    pub fn destage_step(&self, q: &mut DestageQueue, max_blocks: u64) -> Result<(u64, u64), OpError> {
        const HOLD: std::time::Duration = std::time::Duration::from_millis(10);
        let mut done = 0;
        loop {
            let mut guard = self.lock();
            if guard.stopped {
                return Err(stopped_err(q.vm.unwrap_or(0)));
            }
            let Core { engine, files, out, staging, persist, .. } = &mut *guard;
            if done >= max_blocks {
                return Ok((done, dirty_left(engine, q.vm, files.backings.len())));
            }
            if q.keys.is_empty() {
                q.keys.extend(engine.dirty_batch(q.vm, &mut q.cursor, DESTAGE_BATCH));
            }
            if q.keys.is_empty() {
                return Ok((done, dirty_left(engine, q.vm, files.backings.len())));
            }
            let held = Instant::now();
            let mut touched: Vec<VmId> = Vec::new();
            let mut step_ops: Vec<cachevisor_engine::DeviceOp> = Vec::new();
            let mut failed: Option<OpError> = None;
            let mut n = 0;
            while done + n < max_blocks && held.elapsed() < HOLD {
                let Some(key) = q.keys.pop_front() else { break };
                let (vm, block) =
                    (cachevisor_engine::slot_table::key_vm(key), cachevisor_engine::slot_table::key_block(key));
                if engine.destage_block(vm, block, out) == 0 {
                    continue; // clean or gone since the scan
                }
                if let Err(e) = execute(&out.ops, Client::None, &*files, staging) {
                    undo::undo(engine, &out.ops, e.at, &Default::default(), None);
                    failed = Some(e);
                    break;
                }
                step_ops.extend_from_slice(&out.ops);
                n += 1;
                if !touched.contains(&vm) {
                    touched.push(vm);
                }
            }
            for &vm in &touched {
                if let Err(e) = files.backings[vm as usize].sync() {
                    // Not durable: every write-back of this step stays dirty.
                    undo::undo(engine, &step_ops, step_ops.len(), &Default::default(), None);
                    n = 0;
                    failed = failed.or(Some(os_err(OpKind::BackingWrite, vm, e)));
                    break;
                }
            }
            persist.record_all(engine).map_err(|e| os_err(OpKind::SsdWrite, 0, e))?;
            if let Some(e) = failed {
                self.destaged.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                return Err(e);
            }
            self.destaged.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            done += n;
        }
    }

    /// Writes every dirty block of `vm` (or of every vDisk) back, in steps with the lock
    /// released between them, calling `progress(done, done + left)` after each step; blocks
    /// stay cached, clean. Ends when nothing is dirty (writes arriving meanwhile are
    /// destaged too), then fsyncs the metadata.
    pub fn destage_all(&self, vm: Option<VmId>, progress: &mut dyn FnMut(u64, u64)) -> Result<u64, OpError> {
        const STEP_BLOCKS: u64 = 256;
        let mut q = DestageQueue::new(vm);
        let mut done = 0;
        loop {
            let (n, left) = self.destage_step(&mut q, STEP_BLOCKS)?;
            done += n;
            progress(done, done + left);
            if n == 0 || left == 0 {
                break;
            }
        }
        let mut guard = self.lock();
        let Core { files, persist, .. } = &mut *guard;
        persist.sync(&files.ssd).map_err(|e| os_err(OpKind::SsdWrite, vm.unwrap_or(0), e))?;
        Ok(done)
    }

    /// The destage job (progress of the running or last one).
    pub fn destage_job(&self) -> &crate::destage_job::Job {
        &self.job
    }

    /// Blocks written back by the flusher and destage jobs since the start.
    pub fn destaged_blocks(&self) -> u64 {
        self.destaged.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// One allocation interval: the window's counters and rECS go to the controller, the
    /// allocator decides (if it runs every interval), resizes and write-policy switches are
    /// applied online, and their write-backs made durable before the metadata says clean.
    pub fn tick(&self) -> Result<(), OpError> {
        let allocated = self.tick_allocator();
        self.drain_passthrough()?;
        allocated
    }

    /// vDisks in pass-through write their dirty blocks back a step at a time (failures
    /// leave them dirty, to be tried again next interval); once nothing is dirty their
    /// clean blocks leave the cache.
    fn drain_passthrough(&self) -> Result<(), OpError> {
        let draining: Vec<(VmId, u64)> = {
            let core = self.lock();
            core.passthrough
                .iter()
                .enumerate()
                .filter(|(_, &p)| p)
                .map(|(vm, _)| (vm as VmId, core.engine.partition(vm as VmId).dirty_blocks))
                .filter(|_| !core.stopped)
                .collect()
        };
        for (vm, dirty) in draining {
            if dirty > 0 {
                self.destage_step(&mut DestageQueue::new(Some(vm)), 256)?;
                continue;
            }
            let mut guard = self.lock();
            let Core { engine, files, out, staging, persist, .. } = &mut *guard;
            if engine.partition(vm).used == 0 {
                continue;
            }
            engine.set_target(vm, 0, out);
            let r = run_background(engine, files, out, staging, None);
            persist.record_all(engine).map_err(|e| os_err(OpKind::SsdWrite, vm, e))?;
            persist.record_target(vm as u16, 0).map_err(|e| os_err(OpKind::SsdWrite, vm, e))?;
            r?;
            tracing::info!(vdisk = vm, "pass-through: every dirty block is written back; the vDisk holds no cache now");
        }
        Ok(())
    }

    fn tick_allocator(&self) -> Result<(), OpError> {
        let mut guard = self.lock();
        if guard.stopped {
            return Err(stopped_err(0));
        }
        let Core { engine, stats, ctl, last, last_tick, recorder, .. } = &mut *guard;
        let secs = last_tick.elapsed().as_secs_f64();
        *last_tick = Instant::now();
        let counts: Vec<WindowCounts> = stats
            .iter()
            .zip(last.iter())
            .map(|(s, l)| WindowCounts {
                requests: s.reads + s.writes - l.reads - l.writes,
                accesses: s.blocks - l.blocks,
                hits: s.hit_blocks - l.hit_blocks,
            })
            .collect();
        last.clone_from(stats);
        if let Some(w) = recorder.as_mut() {
            let _ = w.flush();
        }
        let (_, sampled) = ctl.sample_recs(engine);
        ctl.end_window(&counts);
        if !ctl.allocator().every_interval() {
            return Ok(());
        }
        let d = ctl.decide(engine, Some((&counts, secs)), &sampled, None);
        ctl.next_window();
        guard.apply(d)
    }

    /// Adds vDisk `v` while running: its backing store is opened (created when `size` is
    /// given), the change is saved to the metadata directory's overlay (so it survives a
    /// restart), the vDisk joins the engine and the controller, the allocator re-divides
    /// the cache at once, and the export is offered to clients.
    pub fn add_vdisk(&self, mut v: crate::config::VdiskConfig) -> Result<ExportInfo, ChangeError> {
        let mut overlay = self.overlay.lock().unwrap_or_else(|e| e.into_inner());
        if self.vdisk(&v.name).is_some() {
            return Err(ChangeError::Conflict(format!("a vDisk named `{}` is already served", v.name)));
        }
        if !crate::backing::is_uri(&v.backing) {
            v.backing = std::path::absolute(&v.backing).map_err(|e| ChangeError::Invalid(format!("backing: {e}")))?;
        }
        v.check("vdisk").map_err(ChangeError::Invalid)?;
        let size = v.size.as_deref().map(parse_size).transpose().map_err(ChangeError::Invalid)?;
        let place = crate::backing_identity::Place::of(&v.backing)
            .map_err(|e| ChangeError::Invalid(format!("backing {}: {e}", v.backing.display())))?;
        {
            let core = self.lock();
            let served = self.exports();
            if let Some(other) = served.iter().find(|e| {
                core.identities
                    .get(e.id as usize)
                    .cloned()
                    .flatten()
                    .is_some_and(|id| place.same(&crate::backing_identity::Place::Existing(id)))
            }) {
                return Err(ChangeError::Conflict(format!("backing {} is already the backing of vDisk `{}`: two vDisks on one backing store would overwrite each other's data", v.backing.display(), other.name)));
            }
        }
        let b = Backing::open(&v.backing, size, v.grow, "vdisk").map_err(ChangeError::Invalid)?;
        let failed = |e: std::io::Error| ChangeError::Invalid(format!("backing {}: {e}", v.backing.display()));
        let size = b.size().map_err(failed)?;
        let identity = match place {
            crate::backing_identity::Place::Uri(uri) => crate::backing_identity::Identity::Nbd { uri, size },
            _ => crate::backing_identity::Identity::of_path(&v.backing)
                .map_err(failed)?
                .ok_or_else(|| ChangeError::Invalid(format!("backing {} vanished", v.backing.display())))?,
        };
        overlay.change(&self.meta_dir, |o| o.add(v.clone())).map_err(ChangeError::Failed)?;
        let mut guard = self.lock();
        let core = &mut *guard;
        let id = core.names.len() as VmId;
        if id > u16::MAX as VmId {
            return Err(ChangeError::Conflict("no VM ids left: restart the daemon to renumber".into()));
        }
        enroll(&mut core.engine, &mut core.ctl, id, &v, self.block_size, &mut core.out)
            .map_err(ChangeError::Invalid)?;
        core.files.backings.push(std::sync::Arc::new(b));
        core.stats.push(ExportStats::default());
        core.last.push(ExportStats::default());
        core.passthrough.push(false);
        core.names.push(v.name.clone());
        core.persist
            .record_vdisk(id as u16, &v.name)
            .map_err(|e| ChangeError::Failed(format!("metadata journal: {e}")))?;
        core.persist
            .record_binding(id as u16, &identity)
            .map_err(|e| ChangeError::Failed(format!("metadata journal: {e}")))?;
        core.identities.push(Some(identity));
        let d = core.ctl.decide(&core.engine, None, &[], None);
        core.apply(d).map_err(|e| ChangeError::Failed(e.to_string()))?;
        let info = ExportInfo { id, name: v.name.clone(), size };
        self.exports.write().unwrap_or_else(|e| e.into_inner()).push(Some(info.clone()));
        tracing::info!(vdisk = %v.name, id, size, backing = %v.backing.display(), "vDisk added");
        Ok(info)
    }

    /// Removes vDisk `vm` while running: it stops being offered (open connections get
    /// ESHUTDOWN at their next request), its dirty blocks are written back in steps and
    /// made durable, its cache is released to the others at once, its backing store is
    /// closed, and the removal is saved to the metadata directory's overlay. The last vDisk
    /// cannot be removed.
    pub fn remove_vdisk(&self, vm: VmId) -> Result<(), ChangeError> {
        let mut overlay = self.overlay.lock().unwrap_or_else(|e| e.into_inner());
        let info = self.export(vm).ok_or_else(|| ChangeError::NotFound(format!("no vDisk with id {vm}")))?;
        if self.exports().len() == 1 {
            return Err(ChangeError::Conflict(format!(
                "`{}` is the last vDisk: add another before removing it",
                info.name
            )));
        }
        self.exports.write().unwrap_or_else(|e| e.into_inner())[vm as usize] = None;
        let restore = |e: String| {
            self.exports.write().unwrap_or_else(|p| p.into_inner())[vm as usize] = Some(info.clone());
            ChangeError::Failed(format!("`{}` is still served: {e}", info.name))
        };
        // Most of the write-back with the lock released between steps, so others go on.
        self.destage_all(Some(vm), &mut |_, _| {}).map_err(|e| restore(e.to_string()))?;
        let mut guard = self.lock();
        let core = &mut *guard;
        // What requests that were already past the check wrote meanwhile is written back here.
        core.engine.drop_vm(vm, &mut core.out);
        let Core { engine, files, out, staging, persist, ctl, names, .. } = core;
        if let Err(e) = run_background(engine, files, out, staging, Some(vm)) {
            let _ = persist.record_all(engine);
            return Err(restore(e.to_string()));
        }
        ctl.retire_vm(vm as usize);
        names[vm as usize].clear(); // a checkpoint maps no slots to it
        let failed = |e: std::io::Error| ChangeError::Failed(format!("metadata journal: {e}"));
        persist.record_all(engine).map_err(failed)?;
        persist.record_target(vm as u16, 0).map_err(failed)?;
        persist.sync(&files.ssd).map_err(failed)?;
        files.backings[vm as usize] = std::sync::Arc::new(Backing::Removed);
        core.identities[vm as usize] = None;
        let d = core.ctl.decide(&core.engine, None, &[], None);
        core.apply(d).map_err(|e| ChangeError::Failed(e.to_string()))?;
        drop(guard);
        overlay.change(&self.meta_dir, |o| o.remove(&info.name)).map_err(ChangeError::Failed)?;
        tracing::info!(vdisk = %info.name, id = vm, "vDisk removed");
        Ok(())
    }

    /// Switches the allocation policy online (VM settings are kept).
    pub fn set_allocator(&self, name: &str, params: &cachevisor_policy::params::Params) -> Result<(), String> {
        let alloc = registry::build_with(name, params)?;
        let mut guard = self.lock();
        let Core { engine, ctl, names, .. } = &mut *guard;
        let n = names.len();
        let settings: Vec<(VmSettings, bool)> = (0..n).map(|v| (*ctl.settings_mut(v), ctl.is_retired(v))).collect();
        *ctl = Controller::new(alloc, engine.slot_count(), self.block_size, true);
        for (v, (s, retired)) in settings.into_iter().enumerate() {
            ctl.add_vm(s);
            if retired {
                ctl.retire_vm(v);
            }
        }
        drop(guard);
        self.overlay
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .change(&self.meta_dir, |o| o.set_allocator(name, params))
            .map_err(|e| format!("the allocator is switched but not saved for the next start: {e}"))?;
        tracing::info!(allocator = name, "allocator switched");
        Ok(())
    }

    /// Applies the partition targets the API set before the last stop (from the overlay).
    pub(crate) fn restore_api_targets(&self) -> Result<(), OpError> {
        let targets = self.overlay.lock().unwrap_or_else(|e| e.into_inner()).target_blocks.clone();
        for (name, blocks) in targets {
            if let Some(vm) = self.vdisk(&name) {
                tracing::info!(vdisk = %name, blocks, "partition target set through the API");
                self.set_target_now(vm, blocks)?;
            }
        }
        Ok(())
    }

    /// The allocation policy's name.
    pub fn allocator_name(&self) -> &'static str {
        self.lock().ctl.allocator().name()
    }

    /// Records every request from now on to `path` in `format`.
    pub fn record_to(&self, path: &std::path::Path, format: cachevisor_trace::Format) -> std::io::Result<()> {
        let f = std::io::BufWriter::new(std::fs::File::create(path)?);
        let w = cachevisor_trace::TraceWriter::new(format, Box::new(f), self.block_size)?;
        self.lock().recorder = Some(w);
        Ok(())
    }

    /// Every vDisk's state and counters.
    pub fn status(&self) -> Vec<VdiskStatus> {
        let exports = self.exports();
        let core = self.lock();
        exports
            .into_iter()
            .map(|e| {
                let p = core.engine.partition(e.id);
                VdiskStatus {
                    name: e.name,
                    size: e.size,
                    write_policy: p.write_policy,
                    used_blocks: p.used,
                    target_blocks: p.target,
                    dirty_blocks: p.dirty_blocks,
                    block_size: self.block_size,
                    stats: core.stats[e.id as usize],
                }
            })
            .collect()
    }

    /// The VM id of the served vDisk `name`.
    pub fn vdisk(&self, name: &str) -> Option<VmId> {
        self.exports().into_iter().find(|e| e.name == name).map(|e| e.id)
    }

    /// Switches export `vm`'s write policy online (leaving write-back writes its dirty
    /// blocks back first).
    pub fn set_write_policy(&self, vm: VmId, policy: cachevisor_engine::WritePolicy) -> Result<(), OpError> {
        let mut guard = self.lock();
        let Core { engine, files, out, staging, persist, .. } = &mut *guard;
        engine.set_write_policy(vm, policy, out);
        let r = run_background(engine, files, out, staging, Some(vm));
        persist.record_all(engine).map_err(|e| os_err(OpKind::SsdWrite, vm, e))?;
        drop(guard);
        // Saved even when some write-back failed: the policy is switched (what is still
        // dirty stays cached and is written back later).
        self.remember(vm, |o, name| o.set_write_policy(name, policy))?;
        r
    }

    /// Test hook: reads done with the core lock released wait `us` microseconds where a
    /// racing write would do harm (before an O_DIRECT hit's read, after a read-ahead), so
    /// races with writes become likely.
    pub fn delay_unlocked_reads(&self, us: u64) {
        self.unlocked_delay_us.store(us, std::sync::atomic::Ordering::Relaxed);
    }

    fn unlocked_delay(&self) {
        let us = self.unlocked_delay_us.load(std::sync::atomic::Ordering::Relaxed);
        if us > 0 {
            std::thread::sleep(std::time::Duration::from_micros(us));
        }
    }

    /// Fault injection for tests: the `n`-th cache-store write from now fails (0 = none).
    pub fn fail_ssd_write_in(&self, n: u64) {
        self.lock().files.fail_ssd_write_in.store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether a read can be served under the lock at once (hits, and reads too large
    /// or otherwise not worth reading ahead), or which blocks it should read ahead from
    /// the backing store with the lock released (see `prefetch`).
    fn plan_read(&self, core: &Core, vm: VmId, offset: u64, len: u64) -> Option<std::ops::Range<u64>> {
        if len == 0 || len > crate::prefetch::MAX_PREFETCH || core.ctl.is_retired(vm as usize) {
            return None;
        }
        let bs = self.block_size;
        let last = (offset + len - 1) / bs;
        let needs = |b: u64| !core.engine.holds(vm, b, sectors_of(offset, len, bs, b));
        let first = (offset / bs..=last).find(|&b| needs(b))?;
        let end = (first..=last).rev().find(|&b| needs(b)).unwrap_or(first) + 1;
        Some(first..end)
    }

    /// Reads `buf.len()` bytes of export `vm` at `offset` (range already checked). A read
    /// that misses reads its blocks from the backing store with the core lock released
    /// (see `prefetch`), so hits and other misses go on meanwhile.
    pub fn read(&self, vm: VmId, offset: u64, buf: &mut [u8]) -> Result<(), OpError> {
        let guard = self.lock();
        let Some(blocks) = self.plan_read(&guard, vm, offset, buf.len() as u64) else {
            return self.access(guard, vm, Op::Read, offset, Client::Read(vm, offset, buf), None);
        };
        let size = self.export(vm).map_or(0, |e| e.size);
        let (mut p, noted) = crate::prefetch::Prefetch::plan(&guard.files.versions, vm, blocks, size);
        let backing = guard.files.backings[vm as usize].clone();
        drop(guard);
        let read = backing.read_at(&mut p.data, p.start);
        self.unlocked_delay();
        let guard = self.unfenced(self.lock(), vm, offset, buf.len() as u64, true);
        let valid = read.is_ok() && p.still_valid(&guard.files.versions, &noted);
        self.access(guard, vm, Op::Read, offset, Client::Read(vm, offset, buf), valid.then_some(&p))
    }

    /// Whether writes to `vm` wait on its backing store (any write policy but write-back,
    /// or pass-through).
    pub fn writes_wait_on_backing(&self, vm: VmId) -> bool {
        let core = self.lock();
        core.passthrough.get(vm as usize).copied().unwrap_or(false)
            || core.engine.partition(vm).write_policy != cachevisor_engine::WritePolicy::Wb
    }

    /// Like [`Self::read`] when the read can be served at once (it hits); `None` when it
    /// would wait on the backing store (nothing was done): the caller hands it to a thread
    /// that may wait, and serves the next request meanwhile.
    pub fn read_if_cached(&self, vm: VmId, offset: u64, buf: &mut [u8]) -> Option<Result<(), OpError>> {
        let guard = self.lock();
        match self.plan_read(&guard, vm, offset, buf.len() as u64) {
            None => Some(self.access(guard, vm, Op::Read, offset, Client::Read(vm, offset, buf), None)),
            Some(_) => None,
        }
    }

    /// Writes `data` to export `vm` at `offset`; with `fua`, durable before returning.
    pub fn write(&self, vm: VmId, offset: u64, data: &[u8], fua: bool) -> Result<(), OpError> {
        self.access(self.lock(), vm, Op::Write, offset, Client::Write(vm, offset, data), None)?;
        if fua {
            self.flush(vm)?;
        }
        Ok(())
    }

    /// Makes every write to export `vm` acknowledged so far durable: write-back data stays
    /// cached (the cache store and the metadata journal are fsynced), write-through data
    /// is fsynced on the backing file.
    pub fn flush(&self, vm: VmId) -> Result<(), OpError> {
        let mut guard = self.lock();
        let Core { engine, files, stats, persist, names, ctl, fenced, stopped, .. } = &mut *guard;
        if *stopped {
            return Err(stopped_err(vm));
        }
        if ctl.is_retired(vm as usize) {
            return Err(removed_err(vm));
        }
        stats[vm as usize].flushes += 1;
        persist.sync(&files.ssd).map_err(|e| os_err(OpKind::SsdWrite, vm, e))?;
        files.backings[vm as usize].sync().map_err(|e| os_err(OpKind::BackingWrite, vm, e))?;
        if persist.wants_checkpoint() && fenced.is_empty() {
            let targets: Vec<u64> = (0..names.len()).map(|v| engine.partition(v as VmId).target).collect();
            persist.checkpoint(engine, names, &targets, &files.ssd).map_err(|e| os_err(OpKind::SsdWrite, vm, e))?;
        }
        Ok(())
    }

    /// TRIM (NBD_CMD_TRIM): the client no longer needs `len` bytes at `offset`. The whole
    /// 512-byte sectors inside the range leave the cache, dirty ones without being written
    /// back (their contents are undefined after a TRIM), so the cache neither holds nor
    /// destages dead data; then the backing store is told (hole punched, or TRIM passed on)
    /// where it can take the hint. Partial sectors at the ends are left alone.
    pub fn trim(&self, vm: VmId, offset: u64, len: u64) -> Result<(), OpError> {
        let (lo, hi) = (offset.div_ceil(512) * 512, (offset + len) / 512 * 512);
        let mut guard = self.lock();
        let Core { engine, files, stats, persist, passthrough, ctl, stopped, .. } = &mut *guard;
        if *stopped {
            return Err(stopped_err(vm));
        }
        if ctl.is_retired(vm as usize) {
            return Err(removed_err(vm));
        }
        stats[vm as usize].trims += 1;
        if lo >= hi {
            return Ok(());
        }
        let bs = self.block_size;
        for block in lo / bs..hi.div_ceil(bs) {
            let start = block * bs;
            let range = (((lo.max(start) - start) / 512) as u32, ((hi.min(start + bs) - start) / 512) as u32);
            engine.discard(vm, block, range);
        }
        persist.record_all(engine).map_err(|e| os_err(OpKind::SsdWrite, vm, e))?;
        if !passthrough[vm as usize] {
            match files.versions.around_write(vm, lo, hi - lo, || files.backings[vm as usize].discard(lo, hi - lo)) {
                Ok(taken) => tracing::trace!(vdisk = vm, offset = lo, len = hi - lo, taken, "trim"),
                // The cache already dropped the range; a store refusing the hint loses nothing.
                Err(e) => tracing::warn!(%e, vdisk = vm, "backing store refused a discard"),
            }
        }
        Ok(())
    }

    /// Writes every dirty block of export `vm` back to its backing file (blocks stay
    /// cached, clean) and makes that durable.
    pub fn destage(&self, vm: VmId) -> Result<(), OpError> {
        self.destage_all(Some(vm), &mut |_, _| {}).map(|_| ())
    }

    /// Sets export `vm`'s partition to `blocks` cache blocks (a shrink evicts its coldest
    /// blocks, writing dirty ones back first).
    pub fn resize(&self, vm: VmId, blocks: u64) -> Result<(), OpError> {
        self.set_target_now(vm, blocks)?;
        self.remember(vm, |o, name| o.set_target(name, blocks))
    }

    /// Saves a change made through the API to the overlay (it survives restarts).
    fn remember(&self, vm: VmId, change: impl FnOnce(&mut crate::vdisk_overlay::Overlay, &str)) -> Result<(), OpError> {
        let Some(info) = self.export(vm) else { return Ok(()) };
        let mut overlay = self.overlay.lock().unwrap_or_else(|e| e.into_inner());
        overlay
            .change(&self.meta_dir, |o| change(o, &info.name))
            .map_err(|e| os_err(OpKind::SsdWrite, vm, std::io::Error::other(e)))
    }

    /// [`Self::resize`] without saving it (a target the overlay already holds).
    fn set_target_now(&self, vm: VmId, blocks: u64) -> Result<(), OpError> {
        let mut guard = self.lock();
        let Core { engine, files, out, staging, persist, .. } = &mut *guard;
        engine.set_target(vm, blocks, out);
        // Write-backs of the shrink reach the backing file before the metadata says clean.
        let r = run_background(engine, files, out, staging, Some(vm));
        persist.record_all(engine).map_err(|e| os_err(OpKind::SsdWrite, vm, e))?;
        r?;
        persist.record_target(vm as u16, blocks).map_err(|e| os_err(OpKind::SsdWrite, vm, e))
    }

    /// Blocks export `vm` holds in the cache and its dirty blocks.
    pub fn occupancy(&self, vm: VmId) -> (u64, u64) {
        let p = self.lock().engine.partition(vm);
        (p.used, p.dirty_blocks)
    }

    /// Stops all device I/O at once, as if the process had died here (what dropping a
    /// [`crate::service::Running`] does): every later request, flush, flusher step and
    /// interval fails, the exports are withdrawn, the backing stores are closed and the
    /// owner lock is released, so another daemon may take over the cache. Nothing is
    /// written: the next start recovers from the metadata like after a SIGKILL.
    pub fn stop_serving(&self) {
        let mut core = self.lock();
        core.stopped = true;
        for b in core.files.backings.iter_mut() {
            *b = std::sync::Arc::new(Backing::Removed);
        }
        drop(core);
        self.exports.write().unwrap_or_else(|e| e.into_inner()).iter_mut().for_each(|e| *e = None);
        self.owner.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Whether [`Self::stop_serving`] ran (the background threads then end).
    pub fn is_stopped(&self) -> bool {
        self.lock().stopped
    }

    /// A clean stop: every backing file and the cache store fsynced and a checkpoint
    /// written, so the next start is warm without replaying a journal.
    pub fn shutdown(&self) -> Result<(), OpError> {
        let mut guard = self.lock();
        // Client writes on their way to a backing store finish (or fail) on their own; a
        // store that hangs must not hang the stop.
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        while !guard.fenced.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(os_err(OpKind::BackingWrite, 0, std::io::Error::new(std::io::ErrorKind::TimedOut, format!("{} client writes still waiting on their backing store after 30 s; their blocks are not journaled (the next start reads them from the backing store)", guard.fenced.len()))));
            }
            guard = self.unfenced.wait_timeout(guard, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        let dirty: Vec<String> = guard
            .passthrough
            .iter()
            .enumerate()
            .filter(|(vm, &p)| p && guard.engine.partition(*vm as VmId).dirty_blocks > 0)
            .map(|(vm, _)| {
                format!("{} ({} dirty blocks)", guard.names[vm], guard.engine.partition(vm as VmId).dirty_blocks)
            })
            .collect();
        if !dirty.is_empty() {
            tracing::warn!(vdisks = %dirty.join(", "), "stopping with vDisks in pass-through that still hold dirty blocks: they stay in the cache and are written back after the next start");
        }
        let Core { engine, files, persist, names, recorder, .. } = &mut *guard;
        if let Some(w) = recorder.take() {
            w.finish().map_err(|e| os_err(OpKind::SsdWrite, 0, e))?;
        }
        for (vm, b) in files.backings.iter().enumerate() {
            b.sync().map_err(|e| os_err(OpKind::BackingWrite, vm as VmId, e))?;
        }
        let targets: Vec<u64> = (0..names.len()).map(|v| engine.partition(v as VmId).target).collect();
        persist.checkpoint(engine, names, &targets, &files.ssd).map_err(|e| os_err(OpKind::SsdWrite, 0, e))
    }
}
