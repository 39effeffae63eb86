//! The daemon's data path on the engine's asynchronous face (issue 12, part 2): client
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
//! Buffers: a read op's bytes are kept (shared) until its request retires — a staged
//! write copies from them, a client read's reply is assembled from them; a write op
//! writes a slice of its request's bytes or of its source read's.

use crate::backing::Backing;
use crate::persist::Persistence;
use cachevisor_engine::{Commit, DeviceOp, Engine, Event, Failure, OpId, ReqId, Schedule};
use cachevisor_trace::{Op, Request, VmId};
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod committer;
mod control;
mod devices;
mod ring;
mod stats;
pub use stats::ExportStats;

/// Bytes and the disk address of their first byte.
pub type Bytes = (bytes::Bytes, u64);

/// A reply callback: the request's outcome and, for a read, the bytes its client read ops
/// returned (each with its disk address; together they cover the request). Called on some
/// data-path thread with no lock held.
pub type Done = Box<dyn FnOnce(Result<Vec<Bytes>, Failure>) + Send>;

/// Called with each client request as it is submitted (the policy's observation), under
/// the data path's lock.
pub type ObserveHook = Box<dyn FnMut(&Request) + Send>;

/// Called at the end of each controller interval with the engine and every vDisk's
/// counters, under the data path's lock (the policy controller: it may submit jobs).
pub type IntervalHook = Box<dyn FnMut(&mut Engine, &[ExportStats]) + Send>;

/// A client command for [`DataPath::submit`].
#[derive(Debug)]
pub enum Cmd {
    /// Read this many bytes.
    Read(u32),
    /// Write these bytes.
    Write(Vec<u8>),
    /// Make every acknowledged write durable.
    Flush,
    /// Discard (TRIM) this many bytes.
    Discard(u32),
}

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
    /// Device errors after which a vDisk passes through to its backing store.
    error_threshold: u64,
    /// Metadata records (vDisk names, backing bindings) for the committer's next commit.
    meta: Vec<crate::journal::Record>,
    /// Jobs callers wait for.
    jobs: HashMap<ReqId, JobWait>,
    observe: Option<ObserveHook>,
    on_interval: Option<IntervalHook>,
    /// Trace recording of every request.
    recorder: Option<cachevisor_trace::TraceWriter>,
    /// A checkpoint was asked for ([`DataPath::checkpoint_now`]).
    want_checkpoint: bool,
    /// Ops queued with no device thread woken: the submitting thread runs its own first
    /// and wakes threads for what is left ([`DataPath::submit`] with `here`).
    quiet: bool,
}

struct Shared {
    core: Mutex<Core>,
    /// Work for device threads, or a commit for the committer.
    wake: Condvar,
    /// A commit, or a checkpoint's wait, for the committer.
    commit_cv: Condvar,
    ssd: File,
    /// The cache store was opened O_DIRECT (I/O through aligned buffers).
    direct: bool,
    /// Backing stores by VM id (`Backing::Removed` once a vDisk is removed).
    backings: RwLock<Vec<Arc<Backing>>>,
    bs: u64,
    start: Instant,
    /// Device calls made (reads and writes, a coalesced run counting once).
    calls: AtomicU64,
    /// Checkpoints written.
    checkpoints: AtomicU64,
    /// Device threads.
    threads: usize,
    /// Write-backs of dirty data completed (flusher, evictions, destaging).
    written_back: AtomicU64,
    /// Stopped as a crash would ([`DataPath::halt`]): no device I/O, no metadata written.
    halted: AtomicBool,
    /// Device calls and commits under way (a halt waits for them).
    busy: AtomicUsize,
    /// Fault injection: the cache-store write at which to fail (counting down; 0 = none).
    fail_ssd_write_in: AtomicU64,
    /// Test hook: microseconds each device read waits before it starts (widens races).
    read_delay_us: AtomicU64,
    /// Cache-store ops run on the io_uring thread (`ring.rs`), not the device threads.
    ring_on: AtomicBool,
    /// Wakes the io_uring thread (cache-store ops queued, or room for more in flight).
    ring_notify: tokio::sync::Notify,
    /// Backing-store ops queued (with the ring on, the only ones device threads take: a
    /// wakeup for a cache-store op would find nothing to do and sleep again).
    backing_queued: AtomicUsize,
    /// The io_uring thread's I/O buffers (a read's goes out as its reply's bytes).
    io_pool: Arc<crate::aligned_buf::IoPool>,
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
}

/// The data path: an engine in persistent mode driven by device, commit and timer threads.
pub struct DataPath {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Shared {
    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves the engine's ready ops to the device queue, its events to the waiting
    /// clients (and the policy hook), and its next commit to the committer; wakes whoever
    /// has something to do.
    fn pump(&self, core: &mut Core) {
        let (mut queued, mut queued_ssd) = (0usize, 0usize);
        loop {
            while let Some(op) = core.engine.poll_op() {
                let data = if !op.kind.is_write() {
                    None
                } else if op.staged {
                    // A staged write's source read is an op of the same request or job.
                    op.source_id().and_then(|s| core.bufs.get(&op.req)?.get(&s)).cloned()
                } else {
                    core.waiting.get(&op.req).and_then(|w| w.write.clone())
                };
                if core.waiting.contains_key(&op.req) {
                    core.work.push_back(Work { op, data });
                } else {
                    core.background.push_back(Work { op, data });
                }
                queued += 1;
                if op.kind.is_ssd() {
                    queued_ssd += 1;
                } else {
                    self.backing_queued.fetch_add(1, Relaxed);
                }
            }
            let Some(ev) = core.engine.poll_event() else { break };
            match ev {
                Event::Reply { req, result, blocks } => {
                    let Some(w) = core.waiting.get(&req) else { continue };
                    stats::count_reply(&mut core.stats, w.vm, w.kind, w.len, &blocks);
                    if result.is_err() {
                        self.count_errors(core);
                    }
                    let w = core.waiting.get_mut(&req).expect("waiting");
                    if w.callback.is_some() {
                        let w = core.waiting.remove(&req).expect("waiting");
                        let f = w.callback.expect("a callback");
                        core.callbacks.push((f, result.map(|()| w.reads)));
                    } else {
                        w.done = Some(result);
                        if let Some(cv) = &w.waiter {
                            cv.notify_one();
                        }
                    }
                }
                Event::Retired { req, failed } => {
                    core.bufs.remove(&req);
                    if failed {
                        self.count_errors(core);
                    }
                    if let Some(j) = core.jobs.get_mut(&req) {
                        j.failed = Some(failed);
                        j.cv.notify_all();
                    }
                }
                Event::Interval { .. } => Self::interval(core),
            }
        }
        if !core.committing {
            if let Some(c) = core.engine.poll_commit() {
                core.commit = Some(c);
                core.committing = true;
                self.commit_cv.notify_one();
            }
        }
        // One device thread per queued op, not every thread on every change (on a small
        // machine a herd of wakeups costs more than the I/O).
        if !core.quiet {
            self.wake_for(core, queued_ssd, queued);
        }
    }

    /// Wakes whoever runs the `queued` ops just queued (`ssd` of them on the cache store):
    /// the io_uring thread for cache-store ops when it runs them, and one device thread
    /// per op left to device threads (at most as many as are still queued).
    fn wake_for(&self, core: &Core, ssd: usize, queued: usize) {
        let ring = self.ring_on.load(Relaxed);
        if ring && ssd > 0 {
            self.ring_notify.notify_one();
        }
        let (mine, left) = if ring {
            (queued - ssd, self.backing_queued.load(Relaxed))
        } else {
            (queued, core.work.len() + core.background.len())
        };
        for _ in 0..mine.min(left).min(self.threads) {
            self.wake.notify_one();
        }
    }

    /// The end of a controller interval: the policy hook runs, the trace recording's
    /// buffered lines are written (so it can be followed).
    fn interval(core: &mut Core) {
        if let Some(mut hook) = core.on_interval.take() {
            hook(&mut core.engine, &core.stats);
            core.on_interval = Some(hook);
        }
        if let Some(w) = core.recorder.as_mut() {
            let _ = w.flush();
        }
    }

    /// Submits a client request (a flush when `req` is `None`) to the engine and queues
    /// what it can start; `Err` when the vDisk or the data path is no longer served.
    fn enter(
        &self,
        core: &mut Core,
        kind: Kind,
        req: Request,
        write: Option<Bytes>,
        callback: Option<Done>,
        waiter: Option<Arc<Condvar>>,
    ) -> Result<ReqId, (Failure, Option<Done>)> {
        let vm = req.vm;
        if self.halted.load(Relaxed) || (kind != Kind::Flush && core.removed.get(vm as usize) != Some(&false)) {
            return Err((Failure::Shutdown, callback));
        }
        let now = self.now();
        let req = Request { time_ns: now, ..req };
        let id = match kind {
            Kind::Read | Kind::Write => {
                if let Some(f) = core.observe.as_mut() {
                    f(&req);
                }
                if let Some(w) = core.recorder.as_mut() {
                    if let Err(e) = w.write(&req, &core.names[vm as usize]) {
                        tracing::error!(%e, "trace recording failed: stopped");
                        core.recorder = None;
                    }
                }
                core.engine.submit(now, &req)
            }
            Kind::Flush => core.engine.submit_flush(),
            Kind::Discard => core.engine.submit_discard(now, vm, req.offset, req.len),
        };
        let len = req.len as u64;
        core.waiting.insert(id, Waiting { vm, kind, len, done: None, write, reads: Vec::new(), callback, waiter });
        self.pump(core);
        Ok(id)
    }

    /// Submits a request and waits for its reply; returns the bytes its client reads
    /// returned.
    fn run(&self, kind: Kind, req: Request, write: Option<Bytes>) -> Result<Vec<Bytes>, Failure> {
        let mut core = self.lock();
        let cv = Arc::new(Condvar::new());
        let id = self.enter(&mut core, kind, req, write, None, Some(cv.clone())).map_err(|(f, _)| f)?;
        loop {
            if let Some(result) = core.waiting.get(&id).and_then(|w| w.done) {
                let w = core.waiting.remove(&id).expect("waiting");
                self.unlock(core);
                return result.map(|()| w.reads);
            }
            core = self.help_or_wait(core, &cv, Some(devices::Own { req: id, ssd_only: false }));
        }
    }

    /// While waiting on `cv`: runs queued ops on this thread rather than waiting for a
    /// device thread (no hand-off on the common path), delivers pending callbacks, or
    /// sleeps until woken.
    fn help_or_wait<'a>(
        &'a self,
        mut core: MutexGuard<'a, Core>,
        cv: &Condvar,
        own: Option<devices::Own>,
    ) -> MutexGuard<'a, Core> {
        if let Some(run) = self.pop_run(&mut core, false, own) {
            self.unlock(core);
            let results = self.execute_run(&run);
            let mut core = self.lock();
            for (w, r) in run.into_iter().zip(results) {
                self.complete(&mut core, w.op, r);
            }
            return core;
        }
        if !core.callbacks.is_empty() {
            self.unlock(core);
            return self.lock();
        }
        cv.wait_timeout(core, Duration::from_millis(50)).map_or_else(|p| p.into_inner().0, |g| g.0)
    }

    /// [`Self::help_or_wait`] for a waiter nobody notifies: sleeps 1 ms at most.
    fn help_or_wait_briefly<'a>(&'a self, core: MutexGuard<'a, Core>, cv: &Condvar) -> MutexGuard<'a, Core> {
        if !core.work.is_empty() || !core.callbacks.is_empty() {
            return self.help_or_wait(core, cv, None);
        }
        cv.wait_timeout(core, Duration::from_millis(1)).map_or_else(|p| p.into_inner().0, |g| g.0)
    }

    /// Runs request `req`'s queued ops on the cache store on this thread until none of
    /// them is left; backing store ops (which may be slow: an NBD reader running a slow
    /// miss itself would read no further request meanwhile) and other requests' ops are
    /// left to the device threads.
    fn run_own_locked<'a>(&'a self, mut core: MutexGuard<'a, Core>, req: ReqId) -> MutexGuard<'a, Core> {
        while let Some(run) = self.pop_run(&mut core, false, Some(devices::Own { req, ssd_only: true })) {
            self.unlock(core);
            let results = self.execute_run(&run);
            core = self.lock();
            for (w, r) in run.into_iter().zip(results) {
                self.complete(&mut core, w.op, r);
            }
        }
        core
    }

    /// Releases the lock, then delivers the replies of asynchronous submissions.
    fn unlock(&self, mut core: MutexGuard<'_, Core>) {
        let callbacks = std::mem::take(&mut core.callbacks);
        drop(core);
        for (f, r) in callbacks {
            f(r);
        }
    }
}

impl DataPath {
    /// Starts the data path on `s.engine` (replayed from `s.persist`'s metadata), turning
    /// on persistent mode, with device, commit and timer threads.
    pub fn start(s: Setup) -> DataPath {
        let Setup {
            mut engine,
            persist,
            ssd,
            direct,
            backings,
            names,
            threads,
            schedule,
            reserve,
            error_threshold,
            io_uring,
        } = s;
        engine.set_persistent(reserve);
        engine.set_schedule(0, schedule);
        let bs = engine.config().block_size;
        let n = names.len();
        let core = Core {
            engine,
            waiting: HashMap::new(),
            bufs: HashMap::new(),
            work: VecDeque::new(),
            background: VecDeque::new(),
            background_busy: 0,
            commit: None,
            committing: false,
            stop: false,
            callbacks: Vec::new(),
            removed: names.iter().map(|n| n.is_empty()).collect(),
            names,
            stats: vec![ExportStats::default(); n],
            error_threshold,
            meta: Vec::new(),
            jobs: HashMap::new(),
            observe: None,
            on_interval: None,
            recorder: None,
            want_checkpoint: false,
            quiet: false,
        };
        let shared = Arc::new(Shared {
            core: Mutex::new(core),
            wake: Condvar::new(),
            commit_cv: Condvar::new(),
            ssd,
            direct,
            backings: RwLock::new(backings),
            bs,
            start: Instant::now(),
            calls: Default::default(),
            checkpoints: Default::default(),
            threads: threads.max(1),
            written_back: Default::default(),
            halted: Default::default(),
            busy: Default::default(),
            fail_ssd_write_in: Default::default(),
            read_delay_us: Default::default(),
            ring_on: Default::default(),
            ring_notify: tokio::sync::Notify::new(),
            backing_queued: Default::default(),
            io_pool: Default::default(),
        });
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let s = shared.clone();
            handles.push(named(format!("cv-device-{i}"), move || s.device_thread()));
        }
        if direct && io_uring {
            if let Some(h) = ring::start(shared.clone()) {
                shared.ring_on.store(true, Relaxed);
                handles.push(h);
                tracing::info!("cache store: O_DIRECT through io_uring");
            }
        }
        let s = shared.clone();
        handles.push(named("cv-committer".into(), move || s.committer(persist)));
        let s = shared.clone();
        handles.push(named("cv-ticker".into(), move || s.ticker(Duration::from_millis(20))));
        DataPath { shared, threads: handles }
    }

    /// Opens (or creates) a cache of `cfg.slots` blocks in `dir` (`cache.img`, metadata in
    /// `meta/`) in front of `vms` disk files `disk{N}.img` of `disk` bytes, replays the
    /// metadata into a new engine, writes the first checkpoint and starts (for benches and
    /// tests; the daemon has its own start with its checks).
    #[allow(clippy::too_many_arguments)]
    pub fn open_in(
        dir: &std::path::Path,
        cfg: cachevisor_engine::EngineConfig,
        vms: u32,
        disk: u64,
        threads: usize,
        schedule: Schedule,
        reserve: u64,
        journal_limit: Option<u64>,
        direct: crate::config::DirectIo,
        io_uring: bool,
    ) -> Result<DataPath, String> {
        let (bs, slots) = (cfg.block_size, cfg.slots);
        let spb = (bs / 512) as u32;
        let mut engine = Engine::new(cfg)?;
        let (mut persist, _) = Persistence::open(&dir.join("meta"), bs, slots, &mut |r| {
            match r {
                crate::journal::Record::Free { slot } => {
                    engine.release_slot(slot);
                }
                crate::journal::Record::Slot { slot, vm, block, valid, dirty } => {
                    engine.release_slot(slot);
                    let bools = |w: &[u64]| crate::persist::bits_to_bools(w, spb);
                    engine.restore_slot(slot, vm as VmId, block, &bools(&valid), &bools(&dirty))?;
                }
                _ => {}
            }
            Ok(())
        })?;
        let file = |name: &str, len: u64| -> Result<File, String> {
            let path = dir.join(name);
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            f.set_len(len).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(f)
        };
        drop(file("cache.img", slots * bs)?);
        let path = dir.join("cache.img");
        let (ssd, direct) = crate::backing::open_cache_store(&path, slots * bs, direct)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let mut backings = Vec::new();
        for v in 0..vms {
            backings.push(Arc::new(Backing::File(file(&format!("disk{v}.img"), disk)?)));
        }
        let names: Vec<String> = (0..vms).map(|v| format!("vm{v}")).collect();
        persist.checkpoint(&engine, &names, &vec![0; vms as usize], &ssd).map_err(|e| e.to_string())?;
        if let Some(limit) = journal_limit {
            persist.set_journal_limit(limit);
        }
        let error_threshold = u64::MAX;
        Ok(DataPath::start(Setup {
            engine,
            persist,
            ssd,
            direct,
            backings,
            names,
            threads,
            schedule,
            reserve,
            error_threshold,
            io_uring,
        }))
    }

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
        let entered = s.enter(&mut core, kind, req, write, Some(done), None);
        core.quiet = false;
        if let (Ok(id), true) = (&entered, here) {
            core = s.run_own_locked(core, *id);
            let left = core.work.len() + core.background.len();
            let backing = s.backing_queued.load(Relaxed).min(left);
            s.wake_for(&core, left - backing, left);
        }
        s.unlock(core);
        match entered {
            Ok(id) => Some(id),
            Err((f, done)) => {
                if let Some(done) = done {
                    done(Err(f));
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

/// Copies what `parts` (a read's reply: pieces that may reach beyond the request, a
/// coalesced run's buffer shared with other requests) hold of `offset..offset + buf.len()`
/// into `buf`.
pub fn copy_range(parts: &[Bytes], offset: u64, buf: &mut [u8]) {
    let end = offset + buf.len() as u64;
    for (bytes, base) in parts {
        let (lo, hi) = ((*base).max(offset), (base + bytes.len() as u64).min(end));
        if lo < hi {
            buf[(lo - offset) as usize..(hi - offset) as usize]
                .copy_from_slice(&bytes[(lo - base) as usize..(hi - base) as usize]);
        }
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
        self.shared.ring_notify.notify_one();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests;

/// Spawns a thread with a name (`top -H`, `perf --sort comm` and panics show it).
pub(crate) fn named<T: Send + 'static>(
    name: String,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    std::thread::Builder::new().name(name).spawn(f).expect("spawning a thread")
}
