//! The daemon's data path on the engine's asynchronous face (issue 12, part 2; not yet
//! behind the NBD front end): client threads submit requests and wait for their replies;
//! a pool of device threads runs the engine's ops on the cache store and the backing
//! stores with no lock held; one committer thread runs the engine's commits (persistent
//! mode: group commit); a ticker runs the engine's timers. Every decision — what waits on
//! what, what a failed op undoes, which metadata must be durable before which write — is
//! the engine's (`inflight.rs`, `repair.rs`, `durability.rs`); this file moves bytes.
//!
//! Buffers: a read op's bytes are kept (shared) until its request retires — a staged
//! write copies from them, a client read's reply is assembled from them; a write op
//! writes a slice of its request's bytes or of its source read's.
//!
//! Large I/O: the engine emits one op per block; a thread taking work also takes the ops
//! queued right behind that continue it on the same device (the next cache-store offset,
//! or the next disk address of the same backing store), up to [`MAX_RUN`] bytes, and runs
//! them as one read or write (a 1 MiB read of consecutive slots is one `pread`).

use crate::backing::Backing;
use crate::persist::Persistence;
use cachevisor_engine::{Commit, DeviceOp, Engine, Event, Failure, Location, OpId, ReqId, Schedule};
use cachevisor_trace::{Op, Request, VmId};
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes and the disk address of their first byte.
pub type Bytes = (Arc<Vec<u8>>, u64);

/// A reply callback: the request's outcome and, for a read, the bytes its client read ops
/// returned (each with its disk address; together they cover the request). Called on some
/// data-path thread with no lock held.
pub type Done = Box<dyn FnOnce(Result<Vec<Bytes>, Failure>) + Send>;

/// A client request waiting for its reply.
struct Waiting {
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

/// Bytes a thread runs as one device call at most.
const MAX_RUN: u64 = 1 << 20;

/// One op for a device thread, with the bytes a write writes.
struct Work {
    op: DeviceOp,
    data: Option<Bytes>,
}

struct Core {
    engine: Engine,
    waiting: HashMap<ReqId, Waiting>,
    /// Read ops' bytes until their request retires: op → (request, bytes).
    bufs: HashMap<OpId, (ReqId, Bytes)>,
    work: VecDeque<Work>,
    commit: Option<Commit>,
    committing: bool,
    stop: bool,
    /// Replies to deliver once the lock is released.
    callbacks: Vec<(Done, Result<Vec<Bytes>, Failure>)>,
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
    backings: Vec<Arc<Backing>>,
    bs: u64,
    /// vDisk names by VM id (written into checkpoints).
    names: Vec<String>,
    start: Instant,
    /// Device calls made (reads and writes, a coalesced run counting once).
    calls: std::sync::atomic::AtomicU64,
    /// Checkpoints written.
    checkpoints: std::sync::atomic::AtomicU64,
}

/// The data path: an engine in persistent mode driven by device, commit and timer threads.
pub struct DataPath {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

thread_local! {
    /// Each thread's aligned buffer for an O_DIRECT cache store.
    static BOUNCE: std::cell::RefCell<crate::aligned_buf::AlignedBuf> = Default::default();
}

fn no_device() -> std::io::Error {
    std::io::Error::other("no such device (a removed vDisk, or a remote cache: not served yet)")
}

fn failure(e: &std::io::Error) -> Failure {
    if e.raw_os_error() == Some(libc_enospc()) {
        Failure::NoSpace
    } else {
        Failure::Io
    }
}

/// ENOSPC without a libc dependency (Linux).
const fn libc_enospc() -> i32 {
    28
}

impl Shared {
    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves the engine's ready ops to the device queue, its events to the waiting
    /// clients, and its next commit to the committer; wakes whoever has something to do.
    fn pump(&self, core: &mut Core) {
        let mut queued = 0usize;
        while let Some(op) = core.engine.poll_op() {
            let data = if !op.kind.is_write() {
                None
            } else if op.staged {
                op.source_id().and_then(|s| core.bufs.get(&s)).map(|(_, b)| b.clone())
            } else {
                core.waiting.get(&op.req).and_then(|w| w.write.clone())
            };
            core.work.push_back(Work { op, data });
            queued += 1;
        }
        while let Some(ev) = core.engine.poll_event() {
            match ev {
                Event::Reply { req, result, .. } => {
                    if core.waiting.get(&req).is_some_and(|w| w.callback.is_some()) {
                        let w = core.waiting.remove(&req).expect("waiting");
                        let f = w.callback.expect("a callback");
                        core.callbacks.push((f, result.map(|()| w.reads)));
                    } else if let Some(w) = core.waiting.get_mut(&req) {
                        w.done = Some(result);
                        if let Some(cv) = &w.waiter {
                            cv.notify_one();
                        }
                    }
                }
                Event::Retired { req, .. } => core.bufs.retain(|_, (r, _)| *r != req),
                Event::Interval { .. } => {} // the policy controller joins with the daemon rebuild
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
        for _ in 0..queued.min(core.work.len()) {
            self.wake.notify_one();
        }
    }

    /// Runs one op on its device; a read returns its bytes.
    fn execute(&self, w: &Work) -> Result<Option<Bytes>, Failure> {
        let op = &w.op;
        let len = op.len as usize;
        let slice = || -> Result<&[u8], Failure> {
            let (bytes, base) = w.data.as_ref().ok_or(Failure::Io)?;
            let at = op.disk_addr.checked_sub(*base).ok_or(Failure::Io)? as usize;
            bytes.get(at..at + len).ok_or(Failure::Io)
        };
        let at = if op.kind.is_ssd() { op.ssd_offset(self.bs) } else { op.disk_addr };
        let r = if op.kind.is_write() {
            self.dev_write(op.loc, slice()?, at).map(|()| None)
        } else {
            let mut buf = vec![0u8; len];
            self.dev_read(op.loc, &mut buf, at).map(|()| Some(buf))
        };
        r.map(|b| b.map(|buf| (Arc::new(buf), op.disk_addr))).map_err(|e| {
            tracing::error!(?op, %e, "device operation failed");
            failure(&e)
        })
    }

    /// Reads `buf.len()` bytes at `at` of the device `loc` names (the cache store through
    /// an aligned buffer when it is O_DIRECT).
    fn dev_read(&self, loc: Location, buf: &mut [u8], at: u64) -> std::io::Result<()> {
        match loc {
            Location::Ssd(_) if self.direct => {
                BOUNCE.with(|b| crate::aligned_buf::read_at(&self.ssd, &mut b.borrow_mut(), buf, at))
            }
            Location::Ssd(_) => self.ssd.read_exact_at(buf, at),
            Location::Backing(vm) => self.backing(vm).map_err(|_| no_device())?.read_at(buf, at),
            Location::Remote { .. } => Err(no_device()),
        }
    }

    /// Writes `data` at `at` of the device `loc` names.
    fn dev_write(&self, loc: Location, data: &[u8], at: u64) -> std::io::Result<()> {
        match loc {
            Location::Ssd(_) if self.direct => {
                BOUNCE.with(|b| crate::aligned_buf::write_at(&self.ssd, &mut b.borrow_mut(), data, at))
            }
            Location::Ssd(_) => self.ssd.write_all_at(data, at),
            Location::Backing(vm) => self.backing(vm).map_err(|_| no_device())?.write_at(data, at),
            Location::Remote { .. } => Err(no_device()),
        }
    }

    fn backing(&self, vm: VmId) -> Result<&Backing, Failure> {
        self.backings.get(vm as usize).map(|b| &**b).ok_or(Failure::Io)
    }

    fn device_thread(&self) {
        loop {
            let run = {
                let mut core = self.lock();
                loop {
                    if let Some(run) = self.pop_run(&mut core) {
                        break run;
                    }
                    if core.stop {
                        return;
                    }
                    core = self.wake.wait(core).unwrap_or_else(|p| p.into_inner());
                }
            };
            let results = self.execute_run(&run);
            let mut core = self.lock();
            for (w, r) in run.into_iter().zip(results) {
                self.complete(&mut core, w.op, r);
            }
            self.unlock(core);
        }
    }

    /// The next queued op and those right behind it that continue it on its device.
    fn pop_run(&self, core: &mut Core) -> Option<Vec<Work>> {
        let first = core.work.pop_front()?;
        let mut total = first.op.len as u64;
        let mut run = vec![first];
        while let Some(next) = core.work.front() {
            let prev = &run[run.len() - 1].op;
            let o = &next.op;
            let follows = o.kind == prev.kind
                && o.loc == prev.loc
                && if o.kind.is_ssd() {
                    o.ssd_offset(self.bs) == prev.ssd_offset(self.bs) + prev.len as u64
                } else {
                    o.vm == prev.vm && o.disk_addr == prev.disk_addr + prev.len as u64
                };
            if !follows || total + o.len as u64 > MAX_RUN {
                break;
            }
            total += o.len as u64;
            run.push(core.work.pop_front().expect("a front"));
        }
        Some(run)
    }

    /// Runs a run of ops as one device call (one op: as it is).
    fn execute_run(&self, run: &[Work]) -> Vec<Result<Option<Bytes>, Failure>> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if run.len() == 1 {
            return vec![self.execute(&run[0])];
        }
        let first = &run[0].op;
        let total: usize = run.iter().map(|w| w.op.len as usize).sum();
        let (ssd, write) = (first.kind.is_ssd(), first.kind.is_write());
        let at = if ssd { first.ssd_offset(self.bs) } else { first.disk_addr };
        // Whether the run's disk addresses are contiguous too (sequential I/O): then one
        // buffer serves every op with no copy.
        let disk_contiguous = run.windows(2).all(|p| p[1].op.disk_addr == p[0].op.disk_addr + p[0].op.len as u64);
        let r = if write {
            let Some(((bytes, base), rest)) = run[0].data.as_ref().zip(Some(&run[1..])) else {
                return vec![Err(Failure::Io); run.len()];
            };
            let same = disk_contiguous
                && rest.iter().all(|w| w.data.as_ref().is_some_and(|(b, s)| Arc::ptr_eq(b, bytes) && s == base));
            if same {
                let from = (first.disk_addr - base) as usize;
                self.dev_write(first.loc, &bytes[from..from + total], at).map(|()| Vec::new())
            } else {
                let mut data = Vec::with_capacity(total);
                for w in run {
                    let Some((bytes, base)) = w.data.as_ref() else { return vec![Err(Failure::Io); run.len()] };
                    let from = (w.op.disk_addr - base) as usize;
                    data.extend_from_slice(&bytes[from..from + w.op.len as usize]);
                }
                self.dev_write(first.loc, &data, at).map(|()| Vec::new())
            }
        } else {
            let mut buf = vec![0u8; total];
            self.dev_read(first.loc, &mut buf, at).map(|()| buf)
        };
        match r {
            Err(e) => {
                tracing::error!(op = ?first, ops = run.len(), %e, "device operation failed");
                vec![Err(failure(&e)); run.len()]
            }
            Ok(_) if write => vec![Ok(None); run.len()],
            Ok(buf) if disk_contiguous => {
                let shared: Bytes = (Arc::new(buf), first.disk_addr);
                run.iter().map(|_| Ok(Some(shared.clone()))).collect()
            }
            Ok(buf) => {
                let mut at = 0;
                run.iter()
                    .map(|w| {
                        let piece = buf[at..at + w.op.len as usize].to_vec();
                        at += w.op.len as usize;
                        Ok(Some((Arc::new(piece), w.op.disk_addr)))
                    })
                    .collect()
            }
        }
    }

    /// Releases the lock, then delivers the replies of asynchronous submissions.
    fn unlock(&self, mut core: MutexGuard<'_, Core>) {
        let callbacks = std::mem::take(&mut core.callbacks);
        drop(core);
        for (f, r) in callbacks {
            f(r);
        }
    }

    /// Records an op's outcome (a read's bytes kept for its request) and lets the engine
    /// go on.
    fn complete(&self, core: &mut Core, op: DeviceOp, r: Result<Option<Bytes>, Failure>) {
        {
            let result = match r {
                Ok(Some(bytes)) => {
                    if op.client {
                        if let Some(wt) = core.waiting.get_mut(&op.req) {
                            // The ops of a coalesced run share one buffer: keep it once.
                            if !wt.reads.last().is_some_and(|(b, _)| Arc::ptr_eq(b, &bytes.0)) {
                                wt.reads.push(bytes.clone());
                            }
                        }
                    }
                    core.bufs.insert(op.id, (op.req, bytes));
                    Ok(())
                }
                Ok(None) => Ok(()),
                Err(f) => Err(f),
            };
            let now = self.now();
            core.engine.handle_completion(now, op.id, result);
            self.pump(core);
        }
    }

    fn committer(&self, mut persist: Persistence) {
        let mut checkpointing = false;
        loop {
            let c = {
                let mut core = self.lock();
                loop {
                    if let Some(c) = core.commit.take() {
                        break c;
                    }
                    if checkpointing && core.engine.quiescent() {
                        self.checkpoint(&mut core, &mut persist);
                        checkpointing = false;
                        continue;
                    }
                    if core.stop && !core.committing {
                        return;
                    }
                    if checkpointing {
                        // Waiting for the work in flight to drain.
                        core = self
                            .commit_cv
                            .wait_timeout(core, Duration::from_millis(2))
                            .map_or_else(|p| p.into_inner().0, |g| g.0);
                    } else {
                        core = self.commit_cv.wait(core).unwrap_or_else(|p| p.into_inner());
                    }
                }
            };
            let backings: Vec<&Backing> =
                c.sync_backings.iter().filter_map(|&vm| self.backings.get(vm as usize).map(|b| &**b)).collect();
            let r = persist.commit(&c, &self.ssd, &backings);
            if let Err(e) = &r {
                tracing::error!(%e, epoch = c.epoch, "commit failed: its records are tried again");
            }
            let mut core = self.lock();
            let now = self.now();
            core.engine.handle_commit(now, c.epoch, r.map_err(|e| failure(&e)));
            core.committing = false;
            // The journal past its limit: hold admission until nothing is in flight, then a
            // checkpoint replaces it (commits go on meanwhile: held writes need them).
            if !checkpointing && persist.wants_checkpoint() {
                checkpointing = true;
                core.engine.hold_admission(true, now);
            }
            self.pump(&mut core);
            self.unlock(core);
        }
    }

    /// Writes a checkpoint of the quiescent engine and lets admission go on (a failed one
    /// leaves the journal in force and is tried again after the next commit).
    fn checkpoint(&self, core: &mut Core, persist: &mut Persistence) {
        let targets = vec![0; self.names.len()];
        let engine = &mut core.engine;
        let r = persist
            .checkpoint_records(&self.names, &targets, &self.ssd, &self.backings, &mut |emit| engine.checkpoint(emit));
        match r {
            Ok(()) => {
                core.engine.checkpoint_done();
                self.checkpoints.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Err(e) => tracing::error!(%e, "checkpoint failed: the journal stays in force"),
        }
        let now = self.now();
        core.engine.hold_admission(false, now);
        self.pump(core);
    }

    fn ticker(&self, period: Duration) {
        let mut last_commit = Instant::now();
        loop {
            std::thread::sleep(period);
            let mut core = self.lock();
            if core.stop {
                return;
            }
            let now = self.now();
            core.engine.handle_timeout(now);
            // Keeps the journal close to the cache, so a restart after a crash is warm.
            if last_commit.elapsed() >= Duration::from_secs(1) {
                core.engine.request_commit();
                last_commit = Instant::now();
            }
            self.pump(&mut core);
            self.unlock(core);
        }
    }

    /// Submits `req` (a flush when `None`) and waits for its reply; returns the bytes its
    /// client reads returned.
    fn run(&self, req: Option<Request>, write: Option<Bytes>) -> Result<Vec<Bytes>, Failure> {
        let mut core = self.lock();
        let cv = Arc::new(Condvar::new());
        let id = self.enter(&mut core, req, write, None, Some(cv.clone()));
        loop {
            if let Some(result) = core.waiting.get(&id).and_then(|w| w.done) {
                let w = core.waiting.remove(&id).expect("waiting");
                self.unlock(core);
                return result.map(|()| w.reads);
            }
            // The client thread runs queued ops itself rather than waiting for a device
            // thread (no hand-off on the common path); device threads take the rest.
            if let Some(run) = self.pop_run(&mut core) {
                self.unlock(core);
                let results = self.execute_run(&run);
                core = self.lock();
                for (w, r) in run.into_iter().zip(results) {
                    self.complete(&mut core, w.op, r);
                }
                continue;
            }
            if !core.callbacks.is_empty() {
                self.unlock(core);
                core = self.lock();
                continue;
            }
            core = cv.wait(core).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Submits `req` (a flush when `None`) to the engine and queues what it can start.
    fn enter(
        &self,
        core: &mut Core,
        req: Option<Request>,
        write: Option<Bytes>,
        callback: Option<Done>,
        waiter: Option<Arc<Condvar>>,
    ) -> ReqId {
        let now = self.now();
        let id = match req {
            Some(mut r) => {
                r.time_ns = now;
                core.engine.submit(now, &r)
            }
            None => core.engine.submit_flush(),
        };
        core.waiting.insert(id, Waiting { done: None, write, reads: Vec::new(), callback, waiter });
        self.pump(core);
        id
    }
}

impl DataPath {
    /// Starts the data path on `engine` (replayed from `persist`'s metadata), turning on
    /// persistent mode with `reserve` free slots kept durable ahead, `threads` device
    /// threads, and the engine's `schedule` (flusher, intervals) ticked every `tick`.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        mut engine: Engine,
        persist: Persistence,
        ssd: File,
        direct: bool,
        backings: Vec<Arc<Backing>>,
        names: Vec<String>,
        threads: usize,
        schedule: Schedule,
        reserve: u64,
    ) -> DataPath {
        engine.set_persistent(reserve);
        engine.set_schedule(0, schedule);
        let bs = engine.config().block_size;
        let core = Core {
            engine,
            waiting: HashMap::new(),
            bufs: HashMap::new(),
            work: VecDeque::new(),
            commit: None,
            committing: false,
            stop: false,
            callbacks: Vec::new(),
        };
        let shared = Arc::new(Shared {
            core: Mutex::new(core),
            wake: Condvar::new(),
            commit_cv: Condvar::new(),
            ssd,
            direct,
            backings,
            bs,
            names,
            start: Instant::now(),
            calls: Default::default(),
            checkpoints: Default::default(),
        });
        let mut handles = Vec::new();
        for _ in 0..threads.max(1) {
            let s = shared.clone();
            handles.push(std::thread::spawn(move || s.device_thread()));
        }
        let s = shared.clone();
        handles.push(std::thread::spawn(move || s.committer(persist)));
        let s = shared.clone();
        handles.push(std::thread::spawn(move || s.ticker(Duration::from_millis(20))));
        DataPath { shared, threads: handles }
    }

    /// Opens (or creates) a cache of `cfg.slots` blocks in `dir` (`cache.img`, metadata in
    /// `meta/`) in front of `vms` disk files `disk{N}.img` of `disk` bytes, replays the
    /// metadata into a new engine, writes the first checkpoint and starts (for benches and
    /// tests; the daemon keeps its own start with its checks).
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
        persist.checkpoint(&mut engine, &names, &vec![0; vms as usize], &ssd).map_err(|e| e.to_string())?;
        if let Some(limit) = journal_limit {
            persist.set_journal_limit(limit);
        }
        Ok(DataPath::start(engine, persist, ssd, direct, backings, names, threads, schedule, reserve))
    }

    /// Reads `buf.len()` bytes of `vm`'s disk at `offset` (sector-aligned).
    pub fn read(&self, vm: VmId, offset: u64, buf: &mut [u8]) -> Result<(), Failure> {
        let req = Request { time_ns: 0, vm, op: Op::Read, offset, len: buf.len() as u32 };
        copy_range(&self.shared.run(Some(req), None)?, offset, buf);
        Ok(())
    }

    /// Writes `data` to `vm`'s disk at `offset`; with `fua`, durable before it returns.
    pub fn write(&self, vm: VmId, offset: u64, data: &[u8], fua: bool) -> Result<(), Failure> {
        let req = Request { time_ns: 0, vm, op: Op::Write, offset, len: data.len() as u32 };
        self.shared.run(Some(req), Some((Arc::new(data.to_vec()), offset)))?;
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// Submits a read (`data` = `None`, `len` bytes) or a write of `data` at `offset` of
    /// `vm`'s disk, or a flush (`len` 0, no data, `flush`), without waiting: `done` is
    /// called with the outcome on a data-path thread (the NBD front end's shape: replies
    /// leave in completion order, matched by cookie).
    pub fn submit(&self, vm: VmId, offset: u64, len: u32, data: Option<Vec<u8>>, flush: bool, done: Done) {
        let req = (!flush).then(|| Request {
            time_ns: 0,
            vm,
            op: if data.is_some() { Op::Write } else { Op::Read },
            offset,
            len: data.as_ref().map_or(len, |d| d.len() as u32),
        });
        let write = data.map(|d| (Arc::new(d), offset));
        let mut core = self.shared.lock();
        self.shared.enter(&mut core, req, write, Some(done), None);
        self.shared.unlock(core);
    }

    /// Runs queued ops on the calling thread until none is left (a submitter with nothing
    /// else to do — an NBD reader whose input has no further request buffered — saves the
    /// hand-off to a device thread).
    pub fn run_queued(&self) {
        let s = &self.shared;
        let mut core = s.lock();
        while let Some(run) = s.pop_run(&mut core) {
            s.unlock(core);
            let results = s.execute_run(&run);
            core = s.lock();
            for (w, r) in run.into_iter().zip(results) {
                s.complete(&mut core, w.op, r);
            }
        }
        s.unlock(core);
    }

    /// Makes every write acknowledged so far durable (cache store, journal, backings).
    pub fn flush(&self) -> Result<(), Failure> {
        self.shared.run(None, None).map(|_| ())
    }

    /// Whether the cache store is O_DIRECT.
    pub fn direct(&self) -> bool {
        self.shared.direct
    }

    /// Checkpoints written so far (each replaced the journal).
    pub fn checkpoints(&self) -> u64 {
        self.shared.checkpoints.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Device calls made so far (a coalesced run of ops counts once).
    pub fn device_calls(&self) -> u64 {
        self.shared.calls.load(std::sync::atomic::Ordering::Relaxed)
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
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests;
