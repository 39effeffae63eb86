//! Operations in flight: the engine's asynchronous face (quinn-proto's shape). A driver
//! submits requests ([`Engine::submit`]) and background jobs ([`Engine::submit_job`]),
//! takes device operations to run ([`Engine::poll_op`]), reports each one's completion
//! ([`Engine::handle_completion`]) in any order, and takes events ([`Engine::poll_event`]):
//! a request's reply and, later, its retirement (every op ended, buffers can go).
//!
//! What waits on what, decided here and nowhere else:
//! - a request touching a block that a running request or job still has ops on (its own
//!   blocks, or a victim being written back) waits, in arrival order, until they end; so
//!   a read of a block being filled waits for the fill, a write racing a write-back is
//!   ordered after it, and a miss never reads a backing block whose write-back is still
//!   on its way;
//! - a slot with ops in flight is *pinned*: it is never chosen as a victim, taken from
//!   the free list, written back by a flush or destage, or reclaimed by the cleaner;
//! - inside one request or job, ops run phase by phase (the output contract): phase k
//!   is handed out when every op of the phases before it completed;
//! - a failed op stops its request: no later phase is handed out, the engine repairs its
//!   state once nothing of the request is in flight (`repair.rs`), counts the error, and
//!   replies with the failure;
//! - slots whose state changed stay out of [`Engine::take_changed`] while pinned, so a
//!   driver journals only settled states (never "clean" before a write-back completed).

use crate::engine::Engine;
use crate::output::{BlockOutcome, DeviceOp, OpHandle, Output};
use cachevisor_trace::{Request, VmId};
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;

/// A request's or job's id (unique for the engine's life).
pub type ReqId = u64;

/// Why a device op failed, as a driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Failure {
    /// The device is full (ENOSPC): the client is told so.
    NoSpace,
    /// Any other I/O error.
    Io,
    /// The device or vDisk is no longer served (a removed vDisk, a stopped daemon): the
    /// client is told the export shut down.
    Shutdown,
    /// The request reaches past its vDisk's end or names no vDisk (`disk_range.rs`):
    /// refused before it touched anything; not a device error.
    OutOfRange,
    /// A cache read returned bytes that fail the checksum they were written with (a cache
    /// store that lost or garbled them): the client gets EIO, the slot is poisoned — never
    /// written back, never a victim — until a client write to it lands (`seals.rs`).
    Corrupt,
}

/// What the engine tells a driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Every op the request waits for completed (or one failed): answer the client. Its
    /// read data is in the buffers of its `client` read ops.
    Reply {
        /// The request.
        req: ReqId,
        /// `Err` with the first failure.
        result: Result<(), Failure>,
        /// Per-block outcomes.
        blocks: Vec<BlockOutcome>,
    },
    /// Every op of a request or job ended (background fills and write-backs included):
    /// buffers kept for its ops can be freed.
    Retired {
        /// The request or job.
        req: ReqId,
        /// Whether any of its ops failed.
        failed: bool,
    },
    /// A controller interval ended (`interval.rs`): the driver runs the policy controller
    /// on it (the window's counters: [`Engine::take_window_counts`]).
    Interval {
        /// When it ended, in driver time.
        at_ns: u64,
        /// Intervals ended before it.
        index: u64,
    },
    /// A sampling point inside interval `index` (`interval.rs`): the `k`-th of `of`, at
    /// k/of of it (the `of`-th is its end, [`Event::Interval`]); the driver has the
    /// controller sample rECS (S-CAVE §IV-B).
    Sample {
        /// When, in driver time.
        at_ns: u64,
        /// The interval it is in.
        index: u64,
        /// Which point, 1-based, and of how many.
        k: u32,
        /// Points in the interval (its end the last).
        of: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpState {
    Pending,
    Issued,
    Done,
    Failed,
}

/// A running (dispatched) request or background job.
#[derive(Debug, Clone, Default)]
pub(crate) struct Job {
    /// Its id.
    pub(crate) id: ReqId,
    /// The client request (`None`: a background job).
    pub(crate) req: Option<Request>,
    /// Its ops (`out.ops`) and, for a request, per-block outcomes (`out.blocks`).
    pub(crate) out: Output,
    pub(crate) state: Vec<OpState>,
    /// Write requests: (slot, block key) of the slots the request's blocks held before
    /// it, for repairs; their dirty flags, one per sector, are `pre_dirty[k * spb..]`.
    pub(crate) pre: Vec<(u32, u64)>,
    pub(crate) pre_dirty: Vec<bool>,
    pub(crate) replied: bool,
    pub(crate) failure: Option<Failure>,
    pub(crate) keys: Vec<u64>,
    /// Persistent mode: no op is handed out until an intent commit is durable.
    pub(crate) held: bool,
    /// Op indices in phase order (empty: the ops are in phase order), and how many were
    /// handed out: each completion costs O(1), not a scan of the job (a shrink's job can
    /// hold thousands of ops).
    pub(crate) order: Vec<u32>,
    pub(crate) cursor: usize,
    /// Ops handed out and not ended; sync ops not done; ops done.
    pub(crate) issued: usize,
    pub(crate) sync_left: usize,
    pub(crate) done: usize,
    /// Background jobs of several blocks: op indices by block key, and per key (first
    /// index there, ops, ops not done). A block whose ops all succeeded is released at
    /// once (its slots unpinned, its key free), not when the whole job retires: a shrink
    /// or flush of thousands of blocks never holds the early ones (nor the requests that
    /// want them) for its whole run. Repairs never touch a block whose ops all completed,
    /// so releasing it early changes nothing they do; after a failure nothing more is
    /// released early.
    pub(crate) by_key: Vec<u32>,
    pub(crate) groups: HashMap<u64, (u32, u32, u32)>,
    /// Slots pinned with it beyond its ops' (`InRequest::keep`).
    pub(crate) keep: Vec<u32>,
}

impl Job {
    pub(crate) fn in_flight(&self) -> bool {
        self.issued > 0
    }

    /// A job to fill: recycled from `spare` (its buffers keep their capacity) or new.
    #[allow(clippy::vec_box)] // jobs move between the table and the spares as pointers
    pub(crate) fn recycled(spare: &mut Vec<Box<Job>>) -> Box<Job> {
        spare.pop().unwrap_or_default()
    }

    /// Empties the job for reuse; `false` when it grew too large to keep (a shrink's).
    fn reset(&mut self) -> bool {
        if self.out.ops.capacity() > SPARE_OPS_MAX || self.keys.capacity() > SPARE_OPS_MAX {
            return false;
        }
        self.out.clear();
        self.state.clear();
        self.pre.clear();
        self.pre_dirty.clear();
        self.keys.clear();
        self.order.clear();
        self.by_key.clear();
        self.groups.clear();
        self.keep.clear();
        (self.replied, self.failure, self.held) = (false, None, false);
        (self.cursor, self.issued, self.sync_left, self.done) = (0, 0, 0, 0);
        true
    }
}

/// Retired jobs kept for reuse, and the largest op list one may keep: a replay dispatches and
/// retires a job per request, and reusing them (with their buffers) keeps allocation off
/// that path.
pub(crate) const SPARE_JOBS: usize = 256;
pub(crate) const SPARE_OPS_MAX: usize = 256;

/// How many holders each key has; a key with none is not in the table.
#[derive(Debug, Clone)]
struct Counts<K>(HashMap<K, u32>);

impl<K> Default for Counts<K> {
    fn default() -> Self {
        Counts(HashMap::default())
    }
}

impl<K: std::hash::Hash + Eq + Copy + std::fmt::Debug> Counts<K> {
    #[inline]
    fn contains(&self, k: K) -> bool {
        !self.0.is_empty() && self.0.contains_key(&k)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn keys(&self) -> impl Iterator<Item = K> + '_ {
        self.0.keys().copied()
    }

    #[inline]
    fn add(&mut self, k: K) {
        *self.0.entry(k).or_default() += 1;
    }

    /// One holder of `k` fewer; whether it was the last.
    fn remove(&mut self, k: K) -> bool {
        let n = self.0.get_mut(&k).unwrap_or_else(|| panic!("{k:?} has no holder"));
        *n -= 1;
        let last = *n == 0;
        if last {
            self.0.remove(&k);
        }
        last
    }
}

/// The in-flight state (inside [`Engine`]): the table of running jobs, the slots their
/// ops pin and the blocks they hold, the ops ready to hand out and the events to report.
#[derive(Debug, Clone, Default)]
pub(crate) struct Flight {
    next_req: ReqId,
    /// Device errors after which a VM passes through ([`Engine::set_error_threshold`];
    /// `None`: never).
    error_threshold: Option<u64>,
    /// Running requests and jobs, by the key their ops carry ([`OpHandle`]): a completion
    /// finds its job without a lookup by id.
    jobs: slab::Slab<Box<Job>>,
    /// Retired jobs for reuse ([`Job::recycled`]), and reply block lists handed back by
    /// the driver ([`Engine::recycle`]).
    #[allow(clippy::vec_box)] // jobs move between the table and the spares as pointers
    spare: Vec<Box<Job>>,
    spare_blocks: Vec<Vec<BlockOutcome>>,
    ready: VecDeque<DeviceOp>,
    events: VecDeque<Event>,
    /// Slot → ops of running jobs on it (jobs count once per op).
    pins: Counts<u32>,
    /// Block key → running jobs holding it.
    busy: Counts<u64>,
    /// Failed ops per VM.
    errors: Vec<u64>,
    /// Dispatch held (a checkpoint is waiting for work in flight to drain).
    hold: bool,
}

impl Flight {
    /// Whether slot `s` has ops in flight.
    #[inline]
    pub(crate) fn pinned(&self, s: u32) -> bool {
        self.pins.contains(s)
    }

    /// Whether any slot is pinned.
    #[inline]
    pub(crate) fn has_pins(&self) -> bool {
        !self.pins.is_empty()
    }

    /// One more op on slot `s`.
    #[inline]
    pub(crate) fn pin(&mut self, s: u32) {
        self.pins.add(s);
    }

    /// One op on slot `s` ended for good; whether it was the last (the slot is unpinned).
    pub(crate) fn unpin(&mut self, s: u32) -> bool {
        self.pins.remove(s)
    }

    /// Whether a running job holds block key `k`.
    #[inline]
    pub(crate) fn holds_block(&self, k: u64) -> bool {
        self.busy.contains(k)
    }

    /// Whether a running job holds any block.
    pub(crate) fn any_block_held(&self) -> bool {
        !self.busy.is_empty()
    }

    /// The block keys running jobs hold.
    pub(crate) fn held_blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.busy.keys()
    }

    /// One more running job holds block key `k`.
    #[inline]
    pub(crate) fn hold_block(&mut self, k: u64) {
        self.busy.add(k);
    }

    /// One job holding block key `k` let go of it; whether the block is free now.
    pub(crate) fn let_go_block(&mut self, k: u64) -> bool {
        self.busy.remove(k)
    }

    pub(crate) fn push_event(&mut self, e: Event) {
        self.events.push_back(e);
    }

    /// Answers request `id` without running an op: its reply, then its retirement.
    pub(crate) fn answer_at_once(&mut self, id: ReqId, result: Result<(), Failure>, failed: bool) {
        self.push_event(Event::Reply { req: id, result, blocks: Vec::new() });
        self.push_event(Event::Retired { req: id, failed });
    }

    /// Requests and jobs running (dispatched and not retired).
    pub(crate) fn jobs_in_flight(&self) -> usize {
        self.jobs.len()
    }

    /// Where the next job inserted goes.
    pub(crate) fn vacant_key(&self) -> usize {
        self.jobs.vacant_key()
    }

    /// Puts a started job in the table; its key.
    pub(crate) fn insert(&mut self, job: Box<Job>) -> usize {
        self.jobs.insert(job)
    }

    /// The running job at `key`.
    pub(crate) fn job(&self, key: usize) -> &Job {
        &self.jobs[key]
    }

    pub(crate) fn job_mut(&mut self, key: usize) -> &mut Job {
        &mut self.jobs[key]
    }

    /// Running job `id` at `key`, if it is still there and held for a commit.
    pub(crate) fn held_job(&mut self, id: ReqId, key: usize) -> Option<&mut Job> {
        self.jobs.get_mut(key).filter(|j| j.id == id && j.held).map(|j| &mut **j)
    }

    /// Takes the job at `key` out of the table (it retires).
    pub(crate) fn remove(&mut self, key: usize) -> Box<Job> {
        self.jobs.remove(key)
    }

    /// A job for a background command.
    pub(crate) fn new_job(&mut self) -> Box<Job> {
        Job::recycled(&mut self.spare)
    }

    /// A job for a client request, with a reply block list to fill.
    pub(crate) fn new_request_job(&mut self) -> Box<Job> {
        let mut job = Job::recycled(&mut self.spare);
        if job.out.blocks.capacity() == 0 {
            if let Some(b) = self.spare_blocks.pop() {
                job.out.blocks = b;
            }
        }
        job
    }

    pub(crate) fn new_id(&mut self) -> ReqId {
        self.next_req += 1;
        self.next_req
    }

    /// Moves the job at `key` on: once the phase handed out ended, hands out the next one
    /// (the lowest with ops not done; `issued` sees each op), and replies once every sync
    /// op is done. Whether the job ended: every op done, or one failed and none is left in
    /// flight (it retires).
    pub(crate) fn advance(&mut self, key: usize, mut issued: impl FnMut(&DeviceOp)) -> bool {
        let job = &mut self.jobs[key];
        let id = job.id;
        if job.held && job.failure.is_none() {
            return false;
        }
        if job.failure.is_some() {
            return !job.in_flight();
        }
        let at = |job: &Job, k: usize| if job.order.is_empty() { k } else { job.order[k] as usize };
        let n = job.out.ops.len();
        if job.issued == 0 && job.cursor < n {
            let phase = job.out.ops[at(job, job.cursor)].phase;
            while job.cursor < n {
                let i = at(job, job.cursor);
                let op = job.out.ops[i];
                if op.phase != phase {
                    break;
                }
                job.state[i] = OpState::Issued;
                job.issued += 1;
                job.cursor += 1;
                issued(&op);
                self.ready.push_back(op);
            }
        }
        if job.sync_left == 0 && !job.replied && job.req.is_some() {
            job.replied = true;
            let blocks = std::mem::take(&mut job.out.blocks); // replied once
            self.events.push_back(Event::Reply { req: id, result: Ok(()), blocks });
        }
        job.done == n
    }

    /// Whether dispatch is held ([`Engine::hold_requests`]).
    pub(crate) fn held(&self) -> bool {
        self.hold
    }

    pub(crate) fn set_held(&mut self, on: bool) {
        self.hold = on;
    }

    /// Sets the device errors after which a VM passes through.
    pub(crate) fn set_error_threshold(&mut self, errors: u64) {
        self.error_threshold = Some(errors.max(1));
    }

    pub(crate) fn error_threshold(&self) -> Option<u64> {
        self.error_threshold
    }

    /// Counts a device error of `vm`'s; whether its errors reached the threshold.
    pub(crate) fn count_error(&mut self, vm: VmId) -> bool {
        let errors = &mut self.errors;
        if errors.len() <= vm as usize {
            errors.resize(vm as usize + 1, 0);
        }
        errors[vm as usize] += 1;
        self.error_threshold.is_some_and(|t| errors[vm as usize] >= t)
    }
}

impl Engine {
    /// Runs a command (`set_target`, `flush`, `destage_block`, `clean`, …) whose ops become
    /// a background job; pinned slots are skipped by every command, so a command never
    /// races a request. Returns the job's id, `None` when it emitted no op.
    pub fn submit_job(&mut self, f: impl FnOnce(&mut Engine, &mut Output)) -> Option<ReqId> {
        if self.flight.held() {
            return None; // not run while dispatch is held (timers try again)
        }
        let mut job = self.flight.new_job();
        f(self, &mut job.out);
        if job.out.ops.is_empty() {
            self.retire_job(job);
            return None;
        }
        let id = self.flight.new_id();
        self.start(id, None, job);
        Some(id)
    }

    /// Hands back a reply's block list (from [`Event::Reply`]) once read, so a later
    /// request reuses its buffer (optional: a driver that keeps it loses nothing).
    pub fn recycle(&mut self, mut blocks: Vec<BlockOutcome>) {
        if self.flight.spare_blocks.len() < SPARE_JOBS && blocks.capacity() <= SPARE_OPS_MAX {
            blocks.clear();
            self.flight.spare_blocks.push(blocks);
        }
    }

    /// Keeps a retired job for reuse, if it is small enough.
    pub(crate) fn retire_job(&mut self, mut job: Box<Job>) {
        if self.flight.spare.len() < SPARE_JOBS && job.reset() {
            self.flight.spare.push(job);
        }
    }

    /// The next device op to run, if any.
    pub fn poll_op(&mut self) -> Option<DeviceOp> {
        self.flight.ready.pop_front()
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.flight.events.pop_front()
    }

    /// Requests running or waiting, and background jobs, not yet retired.
    pub fn in_flight(&self) -> usize {
        self.flight.jobs.len() + self.queue.len()
    }

    /// Device ops that failed for `vm` so far (`Failure::Shutdown` ones not counted: they
    /// never ran).
    pub fn device_errors(&self, vm: VmId) -> u64 {
        self.flight.errors.get(vm as usize).copied().unwrap_or(0)
    }

    /// Reports that the op of handle `h` ([`DeviceOp::handle`]) completed (`Ok`) or
    /// failed, at driver time `now_ns`. Ops not in flight (already reported, or unknown)
    /// are ignored.
    pub fn handle_completion(&mut self, now_ns: u64, h: OpHandle, result: Result<(), Failure>) {
        self.ahead.at(now_ns);
        let key = h.job();
        let Some(job) = self.flight.jobs.get_mut(key) else { return };
        let Some(first) = job.out.ops.first() else { return };
        let i = h.id.wrapping_sub(first.id) as usize;
        if job.state.get(i) != Some(&OpState::Issued) {
            return;
        }
        let op = job.out.ops[i];
        job.issued -= 1;
        self.ahead.completed(&op);
        self.congestion.completed(op.id, op.kind, now_ns);
        if let crate::output::Location::Cache(st) = op.loc {
            self.stores.op_moved(st, true);
        }
        self.seals.at(now_ns);
        let (mut device_error, mut corrupt) = (false, false);
        match result {
            Ok(()) => {
                job.state[i] = OpState::Done;
                job.done += 1;
                job.sync_left -= op.sync as usize;
            }
            Err(f) => {
                job.state[i] = OpState::Failed;
                job.failure.get_or_insert(f);
                // An op a stopping driver never ran (`Shutdown`) is not a device error,
                // nor is one on a region a lost peer lent (its blocks are clean, the
                // request is tried again from the backing store: the vDisk's own devices
                // are fine). A read whose bytes failed their checksum is a device error
                // only of its device, when there are several (a device returning garbage
                // is dropped as one returning EIO): the block is lost and poisoned
                // (`seals.rs`), and a client reading it again must not push its vDisk to
                // pass-through, where overwriting it would need a write-back of those
                // bytes first.
                let lent =
                    matches!(op.loc, crate::output::Location::Cache(st) if !self.stores.layout().kind(st).is_local());
                // The RAM tier holds clean copies only: its failure is no device's.
                device_error = f != Failure::Shutdown
                    && !(lent && self.stores.lent_write_through())
                    && op.loc != crate::output::Location::Ram;
                corrupt = f == Failure::Corrupt;
            }
        }
        // Background jobs of several blocks release each block once its ops succeeded.
        let by_block = job.failure.is_none() && !job.groups.is_empty();
        // With several cache devices, one failing is dropped, not the vDisks' cache
        // (`device_failure.rs`).
        let on_device =
            |e: &mut Engine| matches!(op.loc, crate::output::Location::Cache(st) if e.count_device_store_error(st));
        if device_error && !on_device(self) && !corrupt {
            self.count_device_error(op.vm);
        }
        match (op.kind, result) {
            (crate::output::OpKind::SsdRead, Err(Failure::Corrupt)) => {
                let k = crate::slot_table::pack_key(op.vm, op.block(self.cfg.block_size));
                self.corrupt_read(key, op.slot, k);
            }
            (crate::output::OpKind::SsdWrite, Ok(())) if op.client => self.unpoison(op.slot),
            _ => {}
        }
        // Any backing write, even a failed (maybe torn) one, is synced before the next
        // commit: a fill may read those bytes and the journal call them clean.
        match (op.kind, op.loc) {
            (crate::output::OpKind::BackingWrite, _) => self.note_write_back(op.vm),
            (crate::output::OpKind::SsdWrite, crate::output::Location::Cache(st)) => self.note_cache_write(st),
            _ => {}
        }
        let released = by_block && self.release_block(key, op);
        // Blocks are released when a job retires (or a background job's block is done):
        // only then can a waiting request go.
        if self.advance(key) || released {
            self.dispatch_waiting(now_ns);
        }
        self.run_writeback_ahead();
    }
}
