//! The daemon's data path on the engine's asynchronous face: client
//! threads submit requests and wait for their replies (or get a callback); a pool of
//! device threads runs the engine's ops on the cache store and the backing stores with no
//! lock held (`devices.rs`); one committer thread runs the engine's commits and
//! checkpoints (`committer.rs`); a ticker runs the engine's timers and hands each ended
//! interval to the policy hook. Commands (resizes, write-policy switches, destaging) run
//! as background jobs a caller can wait for (`control.rs`). Every decision — what waits
//! on what, what a failed op undoes, which metadata must be durable before which write —
//! is the engine's (`inflight.rs`, `repair.rs`, `durability.rs`); this module moves bytes
//! and keeps the counters.
//!
//! What it does not know it is given (`injected.rs`): the devices of cache stores on
//! other nodes and a log a client write must reach before it is answered, so it never
//! depends on the cluster. A vDisk on it is the protocol's backend through
//! `vdisk_export.rs`; the journal format and the backing stores are `cachevisor-store`'s,
//! and `persist.rs` turns the engine's commits into journal records.
//!
//! Buffers: a read op's bytes are kept (shared) until its request retires — a staged
//! write copies from them, a client read's reply is assembled from them; a write op
//! writes a slice of its request's bytes or of its source read's.

#![warn(unreachable_pub)]

use crate::persist::Persistence;
use cachevisor_engine::{Commit, DeviceOp, Engine, Event, Failure, OpId, ReqId, Schedule};
use cachevisor_store::backing::Backing;
use cachevisor_trace::{Op, Request, VmId};
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod allocation;
pub mod block_sums;
mod cache_hints;
mod cache_resize;
mod cache_swap;
mod checksums;
mod committer;
mod control;
mod device_addition;
mod device_removal;
mod devices;
mod engine_loop;
mod executors;
mod fault_devices;
pub mod injected;
mod logged_writes;
pub mod persist;
mod ram_memory;
mod ring;
mod start;
mod stats;
mod store_devices;
pub mod vdisk_export;
pub use allocation::MAX_EXTENTS;
pub use cache_hints::{HintCounts, MAX_QUEUED_BLOCKS};
pub use cache_swap::{CacheState, DetachReport};
pub use control::DataPathCounts;
pub use device_removal::{DeviceRemoval, RemovalState};
pub use executors::RingCounts;
pub use stats::ExportStats;

pub use cachevisor_nbd::backend::{copy_range, Bytes, ClientError, Cmd, Done};

/// Called with each client request as it is submitted (the policy's observation), under
/// the data path's lock.
pub type ObserveHook = Box<dyn FnMut(&Request) + Send>;

/// Called at the end of each controller interval (the engine's `Event::Interval`) with
/// the engine, under the data path's lock (the policy controller: it takes the window's
/// counters from the engine and may submit jobs).
pub type IntervalHook = Box<dyn FnMut(&mut Engine) + Send>;

/// Called at each sampling point of the interval (the engine's `Event::Sample`, the k-th
/// of n) with the engine, under the data path's lock (the policy's rECS sampling periods,
/// spread over the interval).
pub type SampleHook = Box<dyn FnMut(&Engine, u32, u32) + Send>;

/// What a client asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Flush,
    Discard,
}

/// A client request waiting for its reply.
struct Waiting {
    vm: VmId,
    kind: Kind,
    len: u64,
    done: Option<Result<(), Failure>>,
    /// A write's bytes (from its offset).
    write: Option<Bytes>,
    /// A read's bytes, as its client read ops return them.
    reads: Vec<Bytes>,
    /// Asynchronous submission: called instead of waking a waiting thread.
    callback: Option<Done>,
    /// A blocking submission: its thread waits here (one condition per request, so a
    /// reply wakes only its own client).
    waiter: Option<Arc<Condvar>>,
}

/// One op for a device thread, with the bytes a write writes.
struct Work {
    op: DeviceOp,
    data: Option<Bytes>,
    /// What a cache write does to its sectors' checksums (`block_sums.rs`).
    sum: SumAction,
}

/// What a cache write does to the checksums of the sectors it writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SumAction {
    /// Not a cache write.
    None,
    /// A client's bytes, or checksummed bytes copied from another slot: theirs.
    Set,
    /// A fill from a backing store (clean bytes): none.
    Clear,
}

/// A background job someone waits for: its condition and, once retired, whether it failed.
struct JobWait {
    cv: Arc<Condvar>,
    failed: Option<bool>,
    /// The first failure of one of its ops.
    failure: Option<Failure>,
}

struct Core {
    engine: Engine,
    waiting: HashMap<ReqId, Waiting>,
    /// Read ops' bytes until their request retires: request → op → bytes.
    bufs: HashMap<ReqId, HashMap<OpId, Bytes>>,
    /// Background cache reads done (request, op): a staged cache write from one copies
    /// checksummed bytes (`SumAction::Set`).
    cache_sources: std::collections::HashSet<(ReqId, OpId)>,
    /// Ops of client requests, run first.
    work: VecDeque<Work>,
    /// Ops of background jobs (flusher, destaging, resizes), run by device threads when
    /// no client op waits.
    background: VecDeque<Work>,
    /// Device threads running background ops (at most half of them).
    background_busy: usize,
    commit: Option<Commit>,
    committing: bool,
    stop: bool,
    /// Replies to deliver once the lock is released.
    callbacks: Vec<(Done, Result<Vec<Bytes>, Failure>)>,
    /// vDisk names by VM id (written into checkpoints; empty once removed).
    names: Vec<String>,
    /// Counters by VM id.
    stats: Vec<ExportStats>,
    /// VM ids no longer served (requests get `Failure::Shutdown`).
    removed: Vec<bool>,
    /// Metadata records (vDisk names, backing bindings) for the committer's next commit.
    meta: Vec<cachevisor_store::journal::Record>,
    /// Jobs callers wait for.
    jobs: HashMap<ReqId, JobWait>,
    observe: Option<ObserveHook>,
    on_interval: Option<IntervalHook>,
    on_sample: Option<SampleHook>,
    /// Trace recording of every request.
    recorder: Option<cachevisor_trace::TraceWriter>,
    /// A checkpoint was asked for ([`DataPath::checkpoint_now`]).
    want_checkpoint: bool,
    /// Ops queued with no device thread woken: the submitting thread runs its own first
    /// and wakes threads for what is left ([`DataPath::submit`] with `here`).
    quiet: bool,
    /// Whether the cache file is in (`cache_swap.rs`).
    cache: CacheState,
    /// Each vDisk's write policy and pass-through before a detach, given back by the
    /// attach.
    saved_modes: Vec<(cachevisor_engine::WritePolicy, bool)>,
    /// Cache devices being removed or removed (`device_removal.rs`), by store.
    device_removals: std::collections::BTreeMap<cachevisor_engine::StoreId, DeviceRemoval>,
    /// The RAM tier's memory (`ram_memory.rs`; empty without one).
    ram: ram_memory::RamMemory,
}

struct Shared {
    core: Mutex<Core>,
    /// Work for device threads, or a commit for the committer.
    wake: Condvar,
    /// A commit, or a checkpoint's wait, for the committer.
    commit_cv: Condvar,
    /// The cache file (`None` while detached: `cache_swap.rs`).
    ssd: store_devices::CacheSlot,
    /// The cache's other devices, store 1.. (`None` when missing at start or removed:
    /// `device_removal.rs`; one more when added online), each with whether it was opened
    /// O_DIRECT (the io_uring thread serves those).
    device_files: RwLock<Vec<(store_devices::CacheSlot, bool)>>,
    /// The device list's generation: bumped when a device is added or removed, so the
    /// io_uring thread opens or closes its descriptors (`ring.rs`), and the generation it
    /// has taken in.
    ring_gen: [std::sync::atomic::AtomicU64; 2],
    /// Stores whose ops the io_uring thread runs (bit per store id below 64): the cache
    /// file's, and every O_DIRECT device's once the ring has a descriptor of it.
    ring_mask: std::sync::atomic::AtomicU64,
    /// The metadata the committer writes (`committer.rs`; closed while the cache is
    /// detached with its metadata directory).
    persist: Mutex<Persistence>,
    /// The io_uring thread is asked to end once nothing is in flight (a detach).
    ring_stop: AtomicBool,
    /// Local slots in use: the cache's size in blocks (`cache_resize.rs`; the rest of
    /// the local store is withheld).
    local_slots: std::sync::atomic::AtomicU32,
    /// The cache file was opened O_DIRECT (I/O through aligned buffers).
    direct: bool,
    /// One device per row of the engine's store table (`store_devices.rs`; a row is
    /// appended when a device is added online, `device_addition.rs`).
    stores: RwLock<Vec<Arc<store_devices::StoreDevice>>>,
    /// Backing stores by VM id (`Backing::Removed` once a vDisk is removed).
    backings: RwLock<Vec<Arc<Backing>>>,
    bs: u64,
    /// Where the engine's cache stores' slots are (one store: the local cache file);
    /// replaced whole when a device is added ([`Shared::layout`]).
    layout: RwLock<Arc<cachevisor_engine::StoreLayout>>,
    start: Instant,
    /// Device calls made (reads and writes, a coalesced run counting once).
    calls: AtomicU64,
    /// Checkpoints written.
    checkpoints: AtomicU64,
    /// Commits that failed (each retried after a pause: `committer.rs`).
    commit_failures: AtomicU64,
    /// Who runs the ops: device threads and the io_uring thread (`executors.rs`).
    exec: executors::Executors,
    /// Write-backs of dirty data completed (flusher, evictions, destaging).
    written_back: AtomicU64,
    /// Stopped as a crash would ([`DataPath::halt`]): no device I/O, no metadata written.
    halted: AtomicBool,
    /// Rounds of the ticker (the engine's timers run under its lock): the watchdog's sign
    /// that the engine loop is alive (`systemd.rs`).
    ticks: AtomicU64,
    /// Device calls and commits under way (a halt waits for them).
    busy: AtomicUsize,
    /// The faults its devices were wrapped with (tests; `cachevisor_store::faults`): a
    /// vDisk added later gets its backing wrapped too, and cache ops stay on the device
    /// threads (whose devices are the wrapped ones) instead of the io_uring thread.
    faults: Option<Arc<cachevisor_store::faults::Faults>>,
    /// The replica log of a cluster node's replicated vDisks (`cluster/replicator.rs`):
    /// their client writes are logged on a peer before they are answered.
    replicator: std::sync::OnceLock<Arc<dyn crate::injected::WriteLog>>,
    /// Replicated writes handed to the log and not yet completed (`logged_writes.rs`).
    holds: logged_writes::Holds,
    /// The io_uring thread's I/O buffers (a read's goes out as its reply's bytes).
    io_pool: Arc<cachevisor_files::aligned_buf::IoPool>,
    /// Checksums of the sectors written to the cache stores (`block_sums.rs`).
    sums: crate::block_sums::BlockSums,
}

/// Everything a data path starts from.
pub struct Setup {
    /// The engine, replayed from `persist`'s metadata.
    pub engine: Engine,
    /// The metadata (journal and checkpoints).
    pub persist: Persistence,
    /// The cache store.
    pub ssd: File,
    /// Whether `ssd` was opened O_DIRECT.
    pub direct: bool,
    /// The cache's other devices (`[[cache.device]]`, stores 1.. of the engine's table),
    /// each with whether it was opened O_DIRECT; `None` for one missing at start (the
    /// engine has it failed: no op goes there).
    pub devices: Vec<Option<(File, bool)>>,
    /// Backing stores by VM id.
    pub backings: Vec<Arc<Backing>>,
    /// vDisk names by VM id.
    pub names: Vec<String>,
    /// Device threads.
    pub threads: usize,
    /// The engine's timers (flusher, intervals).
    pub schedule: Schedule,
    /// Free slots kept durable ahead (persistent mode).
    pub reserve: u64,
    /// Device errors after which a vDisk passes through (`u64::MAX`: never).
    pub error_threshold: u64,
    /// An O_DIRECT cache store's I/O through io_uring where available (else device
    /// threads).
    pub io_uring: bool,
    /// The peers whose lent regions are cache stores (`[cluster] peers`).
    pub peers: Option<Arc<dyn crate::injected::RemoteStores>>,
    /// Checksums of the cache store's sectors, as the metadata's seal records left them.
    pub sums: crate::block_sums::BlockSums,
    /// Seal window (`cache.seal_after`; 0: never).
    pub seal_after: Duration,
    /// Faults to wrap every device with (tests: `cachevisor_store::faults`; `None` in
    /// production).
    pub faults: Option<Arc<cachevisor_store::faults::Faults>>,
}

/// How long a dirty block's region goes without a write, its record durable, before the
/// engine seals it and the journal carries its checksums (`engine/src/seals.rs`; the
/// daemon's `cache.seal_after`, this for tests and benches).
pub const SEAL_AFTER: Duration = Duration::from_secs(30);

/// The data path: an engine in persistent mode driven by device, commit and timer threads.
pub struct DataPath {
    shared: Arc<Shared>,
    /// Its threads (an attach adds an io_uring thread).
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// NBD_CMD_CACHE hints waiting for the loader (`cache_hints.rs`).
    hints: cache_hints::CacheHints,
}

impl DataPath {
    /// Reads `buf.len()` bytes of `vm`'s disk at `offset` (sector-aligned).
    pub fn read(&self, vm: VmId, offset: u64, buf: &mut [u8]) -> Result<(), Failure> {
        let req = Request { time_ns: 0, vm, op: Op::Read, offset, len: buf.len() as u32 };
        copy_range(&self.shared.run(Kind::Read, req, None)?, offset, buf);
        Ok(())
    }

    /// Writes `data` to `vm`'s disk at `offset`; with `fua`, durable before it returns.
    pub fn write(&self, vm: VmId, offset: u64, data: &[u8], fua: bool) -> Result<(), Failure> {
        let req = Request { time_ns: 0, vm, op: Op::Write, offset, len: data.len() as u32 };
        self.shared.run(Kind::Write, req, Some((bytes::Bytes::copy_from_slice(data), offset)))?;
        if fua {
            self.flush(vm)?;
        }
        Ok(())
    }

    /// Discards (TRIM) `len` bytes of `vm`'s disk at `offset`: the whole sectors inside
    /// leave the cache (dirty ones unwritten), then the backing store is told where it can
    /// take the hint (a store refusing it loses nothing: the cache already dropped them).
    pub fn discard(&self, vm: VmId, offset: u64, len: u32) -> Result<(), Failure> {
        let req = Request { time_ns: 0, vm, op: Op::Write, offset, len };
        self.shared.run(Kind::Discard, req, None)?;
        self.hint_discard(vm, offset, len);
        Ok(())
    }

    /// Passes a discard of whole sectors on to `vm`'s backing store (unless it passes
    /// through after errors: then the store is left alone).
    fn hint_discard(&self, vm: VmId, offset: u64, len: u32) {
        let (lo, hi) = (offset.div_ceil(512) * 512, (offset + len as u64) / 512 * 512);
        if lo >= hi || self.stats(vm).passthrough {
            return;
        }
        let Some(b) = self.shared.backings.read().unwrap_or_else(|p| p.into_inner()).get(vm as usize).cloned() else {
            return;
        };
        match b.discard(lo, hi - lo) {
            Ok(taken) => tracing::trace!(vdisk = vm, offset = lo, len = hi - lo, taken, "trim"),
            Err(e) => tracing::warn!(%e, vdisk = vm, "backing store refused a discard"),
        }
    }

    /// Submits `cmd` at `offset` of `vm`'s disk without waiting: `done` is called with
    /// the outcome on a data-path thread (the NBD front end's shape: replies leave in
    /// completion order, matched by cookie). A discard's reply comes after the backing
    /// store was hinted. With `here`, the calling thread first runs the request's ops on
    /// the cache store itself (no device thread woken for them: a hit from the page cache
    /// costs less than a wakeup) and leaves the rest to the device threads.
    pub fn submit(self: &Arc<Self>, vm: VmId, offset: u64, cmd: Cmd, here: bool, done: Done) -> Option<ReqId> {
        self.submit_with(vm, offset, cmd, false, here, done)
    }

    /// [`Self::submit`]; with `sync`, a write the client asked to be durable at once (NBD
    /// FUA: a vDisk's I/O classes may match it, `sync = true`; the caller flushes after).
    pub fn submit_with(
        self: &Arc<Self>,
        vm: VmId,
        offset: u64,
        cmd: Cmd,
        sync: bool,
        here: bool,
        done: Done,
    ) -> Option<ReqId> {
        let (kind, len, data) = match cmd {
            Cmd::Read(len) => (Kind::Read, len, None),
            Cmd::Write(d) => (Kind::Write, d.len() as u32, Some(d)),
            Cmd::Flush => (Kind::Flush, 0, None),
            Cmd::Discard(len) => (Kind::Discard, len, None),
        };
        let done: Done = if kind == Kind::Discard {
            let dp = self.clone();
            Box::new(move |r| {
                if r.is_ok() {
                    dp.hint_discard(vm, offset, len);
                }
                done(r)
            })
        } else {
            done
        };
        let op = if kind == Kind::Write { Op::Write } else { Op::Read };
        let req = Request { time_ns: 0, vm, op, offset, len };
        let write = data.map(|d| (bytes::Bytes::from(d), offset));
        let s = &self.shared;
        let mut core = s.lock();
        core.quiet = here;
        let entered = s.enter(&mut core, kind, req, write, sync, Some(done), None);
        core.quiet = false;
        if let (Ok(id), true) = (&entered, here) {
            core = s.run_own_locked(core, *id);
            s.exec.wake_for_left(&s.wake, core.work.len() + core.background.len());
        }
        s.unlock(core);
        match entered {
            Ok(id) => Some(id),
            Err((f, done)) => {
                if let Some(done) = done {
                    done(Err(client_error(f)));
                }
                None
            }
        }
    }

    /// Whether vDisk `vm` is served (not removed, not halted).
    pub fn serves(&self, vm: VmId) -> bool {
        !self.halted() && self.shared.lock().removed.get(vm as usize) == Some(&false)
    }

    /// Makes every write acknowledged so far durable (cache store, journal, backings);
    /// counted as `vm`'s flush.
    pub fn flush(&self, vm: VmId) -> Result<(), Failure> {
        let req = Request { time_ns: 0, vm, op: Op::Read, offset: 0, len: 0 };
        self.shared.run(Kind::Flush, req, None).map(|_| ())
    }

    /// Logs the client writes of the vDisks `r` covers on its peer from now on.
    pub fn set_replicator(&self, r: Arc<dyn crate::injected::WriteLog>) {
        let shared = Arc::downgrade(&self.shared);
        r.attach(Box::new(move |outcomes| {
            if let Some(s) = shared.upgrade() {
                s.logged(outcomes);
            }
        }));
        let _ = self.shared.replicator.set(r);
    }

    /// Whether the cache store is O_DIRECT.
    pub fn direct(&self) -> bool {
        self.shared.direct
    }

    /// Checkpoints written so far (each replaced the journal).
    pub fn checkpoints(&self) -> u64 {
        self.shared.checkpoints.load(Relaxed)
    }

    /// Device calls made so far (a coalesced run of ops counts once).
    pub fn device_calls(&self) -> u64 {
        self.shared.calls.load(Relaxed)
    }

    /// Runs `f` on the engine (status, tests).
    pub fn with_engine<R>(&self, f: impl FnOnce(&Engine) -> R) -> R {
        f(&self.shared.lock().engine)
    }
}

/// What a client is told of a request's failure.
pub fn client_error(f: Failure) -> ClientError {
    match f {
        Failure::NoSpace => ClientError::NoSpace,
        Failure::Io => ClientError::Io,
        Failure::Corrupt => ClientError::Corrupt,
        Failure::Shutdown => ClientError::Shutdown,
        Failure::OutOfRange => ClientError::OutOfRange,
    }
}

impl Drop for DataPath {
    /// Stops the threads after the work queued; nothing is flushed (a crash-like stop:
    /// what was flushed is durable, the rest may or may not be).
    fn drop(&mut self) {
        {
            let mut core = self.shared.lock();
            core.stop = true;
        }
        self.shared.wake.notify_all();
        self.shared.commit_cv.notify_all();
        self.shared.exec.ring_notify().notify_one();
        for t in self.threads.get_mut().unwrap_or_else(|p| p.into_inner()).drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod logged_writes_tests;
#[cfg(test)]
mod tests;

/// Spawns a thread with a name (`top -H`, `perf --sort comm` and panics show it).
pub fn named<T: Send + 'static>(name: String, f: impl FnOnce() -> T + Send + 'static) -> std::thread::JoinHandle<T> {
    std::thread::Builder::new().name(name).spawn(f).expect("spawning a thread")
}
