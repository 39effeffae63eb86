//! Operations in flight: the engine's asynchronous face (quinn-proto's shape). A driver
//! submits requests ([`Engine::submit`]) and background jobs ([`Engine::submit_job`]),
//! takes device operations to run ([`Engine::poll_op`]), reports each one's completion
//! ([`Engine::handle_completion`]) in any order, and takes events ([`Engine::poll_event`]):
//! a request's reply and, later, its retirement (every op ended, buffers can go).
//!
//! What waits on what, decided here and nowhere else:
//! - a request touching a block that an admitted request or job still has ops on (its own
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
    /// A controller interval ended (`timers.rs`): the driver runs the policy controller.
    Interval {
        /// When it ended, in driver time.
        at_ns: u64,
        /// Intervals ended before it.
        index: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpState {
    Pending,
    Issued,
    Done,
    Failed,
}

/// An admitted request or background job.
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
        (self.replied, self.failure, self.held) = (false, None, false);
        (self.cursor, self.issued, self.sync_left, self.done) = (0, 0, 0, 0);
        true
    }
}

/// Retired jobs kept for reuse, and the largest op list one may keep: a replay admits and
/// retires a job per request, and reusing them (with their buffers) keeps allocation off
/// that path.
pub(crate) const SPARE_JOBS: usize = 256;
pub(crate) const SPARE_OPS_MAX: usize = 256;

/// The in-flight state (inside [`Engine`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Flight {
    pub(crate) next_req: ReqId,
    /// Device errors after which a VM passes through ([`Engine::set_error_threshold`];
    /// `None`: never).
    pub(crate) error_threshold: Option<u64>,
    /// Admitted requests and jobs, by the key their ops carry ([`OpHandle`]): a completion
    /// finds its job without a lookup by id.
    pub(crate) jobs: slab::Slab<Box<Job>>,
    /// Retired jobs for reuse ([`Job::recycled`]), and reply block lists handed back by
    /// the driver ([`Engine::recycle`]).
    #[allow(clippy::vec_box)] // jobs move between the table and the spares as pointers
    pub(crate) spare: Vec<Box<Job>>,
    pub(crate) spare_blocks: Vec<Vec<BlockOutcome>>,
    /// Requests waiting for blocks (by id: arrival order), and per block key the waiting
    /// requests on it in arrival order; a request goes once each of its blocks is free
    /// and it heads each of their queues. Only requests that head a queue whose block was
    /// just freed (or that just arrived) are looked at, so a long backlog on hot blocks
    /// (an open-loop replay past the devices' speed) costs nothing per completion.
    pub(crate) waiting: std::collections::BTreeMap<ReqId, Request>,
    pub(crate) queues: HashMap<u64, VecDeque<ReqId>>,
    /// Requests to look at in the next admission pass: arrived, or heading a queue whose
    /// block was freed; `rescan`: all of them (admission resumed after a hold).
    pub(crate) candidates: Vec<ReqId>,
    pub(crate) freed: Vec<u64>,
    pub(crate) rescan: bool,
    pub(crate) ready: VecDeque<DeviceOp>,
    pub(crate) events: VecDeque<Event>,
    /// Slot → ops of admitted jobs on it (jobs count once per op).
    pub(crate) pins: HashMap<u32, u32>,
    /// Block key → admitted jobs holding it.
    pub(crate) busy: HashMap<u64, u32>,
    /// Failed ops per VM.
    pub(crate) errors: Vec<u64>,
    /// The persistent-mode reserve refill job running, if any.
    pub(crate) refill_job: Option<ReqId>,
    /// Admission held (a checkpoint is waiting for work in flight to drain).
    pub(crate) hold: bool,
    /// Waiting discard requests (TRIM): id → the byte range of whole sectors to drop.
    pub(crate) discards: HashMap<ReqId, (u64, u64)>,
}

impl Flight {
    /// Whether slot `s` has ops in flight.
    #[inline]
    pub(crate) fn pinned(&self, s: u32) -> bool {
        !self.pins.is_empty() && self.pins.contains_key(&s)
    }

    pub(crate) fn push_event(&mut self, e: Event) {
        self.events.push_back(e);
    }

    /// Requests and jobs admitted and not retired.
    pub(crate) fn jobs_in_flight(&self) -> usize {
        self.jobs.len()
    }

    /// Whether any slot is pinned.
    #[inline]
    pub(crate) fn has_pins(&self) -> bool {
        !self.pins.is_empty()
    }

    pub(crate) fn new_id(&mut self) -> ReqId {
        self.next_req += 1;
        self.next_req
    }
}

impl Engine {
    /// Runs a command (`set_target`, `flush`, `destage_block`, `clean`, …) whose ops become
    /// a background job; pinned slots are skipped by every command, so a command never
    /// races a request. Returns the job's id, `None` when it emitted no op.
    pub fn submit_job(&mut self, f: impl FnOnce(&mut Engine, &mut Output)) -> Option<ReqId> {
        if self.flight.hold {
            return None; // not run while admission is held (timers try again)
        }
        let mut job = Job::recycled(&mut self.flight.spare);
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

    /// Requests admitted or waiting, and background jobs, not yet retired.
    pub fn in_flight(&self) -> usize {
        self.flight.jobs.len() + self.flight.waiting.len()
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
        self.seals.at(now_ns);
        let mut device_error = false;
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
                // are fine). Nor is a read whose bytes failed their checksum: the block is
                // lost and poisoned (`seals.rs`), and a client reading it again must not
                // push its vDisk to pass-through, where overwriting it would need a
                // write-back of those bytes first.
                let lent = matches!(op.loc, crate::output::Location::Cache(st) if st != crate::stores::LOCAL);
                device_error =
                    f != Failure::Shutdown && f != Failure::Corrupt && !(lent && self.stores.lent_write_through);
            }
        }
        // Background jobs of several blocks release each block once its ops succeeded.
        let by_block = job.failure.is_none() && !job.groups.is_empty();
        if device_error {
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
            self.admit_waiting(now_ns);
        }
        self.run_writeback_ahead();
    }
}
