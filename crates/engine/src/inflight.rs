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
use crate::output::{BlockOutcome, DeviceOp, OpHandle, Output, NO_SLOT};
use crate::slot_table::pack_key;
use cachevisor_trace::{Op, Request, VmId};
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
    id: ReqId,
    /// The client request (`None`: a background job).
    pub(crate) req: Option<Request>,
    /// Its ops (`out.ops`) and, for a request, per-block outcomes (`out.blocks`).
    pub(crate) out: Output,
    pub(crate) state: Vec<OpState>,
    /// Write requests: (slot, block key) of the slots the request's blocks held before
    /// it, for repairs; their dirty flags, one per sector, are `pre_dirty[k * spb..]`.
    pub(crate) pre: Vec<(u32, u64)>,
    pub(crate) pre_dirty: Vec<bool>,
    replied: bool,
    failure: Option<Failure>,
    keys: Vec<u64>,
    /// Persistent mode: no op is handed out until an intent commit is durable.
    held: bool,
    /// Op indices in phase order (empty: the ops are in phase order), and how many were
    /// handed out: each completion costs O(1), not a scan of the job (a shrink's job can
    /// hold thousands of ops).
    order: Vec<u32>,
    cursor: usize,
    /// Ops handed out and not ended; sync ops not done; ops done.
    issued: usize,
    sync_left: usize,
    done: usize,
    /// Background jobs of several blocks: op indices by block key, and per key (first
    /// index there, ops, ops not done). A block whose ops all succeeded is released at
    /// once (its slots unpinned, its key free), not when the whole job retires: a shrink
    /// or flush of thousands of blocks never holds the early ones (nor the requests that
    /// want them) for its whole run. Repairs never touch a block whose ops all completed,
    /// so releasing it early changes nothing they do; after a failure nothing more is
    /// released early.
    by_key: Vec<u32>,
    groups: HashMap<u64, (u32, u32, u32)>,
}

impl Job {
    fn in_flight(&self) -> bool {
        self.issued > 0
    }

    /// A job to fill: recycled from `spare` (its buffers keep their capacity) or new.
    #[allow(clippy::vec_box)] // jobs move between the table and the spares as pointers
    fn recycled(spare: &mut Vec<Box<Job>>) -> Box<Job> {
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
const SPARE_JOBS: usize = 256;
const SPARE_OPS_MAX: usize = 256;

/// The in-flight state (inside [`Engine`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Flight {
    next_req: ReqId,
    /// Admitted requests and jobs, by the key their ops carry ([`OpHandle`]): a completion
    /// finds its job without a lookup by id.
    jobs: slab::Slab<Box<Job>>,
    /// Retired jobs for reuse ([`Job::recycled`]), and reply block lists handed back by
    /// the driver ([`Engine::recycle`]).
    #[allow(clippy::vec_box)] // jobs move between the table and the spares as pointers
    spare: Vec<Box<Job>>,
    spare_blocks: Vec<Vec<BlockOutcome>>,
    /// Requests waiting for blocks (by id: arrival order), and per block key the waiting
    /// requests on it in arrival order; a request goes once each of its blocks is free
    /// and it heads each of their queues. Only requests that head a queue whose block was
    /// just freed (or that just arrived) are looked at, so a long backlog on hot blocks
    /// (an open-loop replay past the devices' speed) costs nothing per completion.
    waiting: std::collections::BTreeMap<ReqId, Request>,
    queues: HashMap<u64, VecDeque<ReqId>>,
    /// Requests to look at in the next admission pass: arrived, or heading a queue whose
    /// block was freed; `rescan`: all of them (admission resumed after a hold).
    candidates: Vec<ReqId>,
    freed: Vec<u64>,
    rescan: bool,
    ready: VecDeque<DeviceOp>,
    events: VecDeque<Event>,
    /// Slot → ops of admitted jobs on it (jobs count once per op).
    pins: HashMap<u32, u32>,
    /// Block key → admitted jobs holding it.
    busy: HashMap<u64, u32>,
    /// Failed ops per VM.
    pub(crate) errors: Vec<u64>,
    /// The persistent-mode reserve refill job running, if any.
    pub(crate) refill_job: Option<ReqId>,
    /// Admission held (a checkpoint is waiting for work in flight to drain).
    pub(crate) hold: bool,
    /// Waiting discard requests (TRIM): id → the byte range of whole sectors to drop.
    discards: HashMap<ReqId, (u64, u64)>,
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
    /// Submits a client request at driver time `now_ns`; its ops come from
    /// [`Self::poll_op`], its reply from [`Self::poll_event`]. It waits (no ops yet) while
    /// a block it touches has ops in flight.
    pub fn submit(&mut self, now_ns: u64, req: &Request) -> ReqId {
        let id = self.flight.new_id();
        if self.blocks_free(req) {
            // Nothing holds or waits for its blocks: admitted at once.
            self.admit(now_ns, id, *req);
            if !self.flight.freed.is_empty() {
                self.admit_waiting(now_ns);
            }
        } else {
            self.enqueue(id, *req);
            self.admit_waiting(now_ns);
        }
        id
    }

    /// Whether admission is open and no job holds, and no request waits for, a block of
    /// `req`.
    fn blocks_free(&self, req: &Request) -> bool {
        let f = &self.flight;
        if f.hold {
            return false;
        }
        let Some((vm, lo, hi)) = self.block_span(req) else { return true };
        (f.busy.is_empty() && f.queues.is_empty())
            || (lo..=hi).all(|b| {
                let k = pack_key(vm, b);
                !f.busy.contains_key(&k) && !f.queues.contains_key(&k)
            })
    }

    /// The block range (vm, first, last) a request touches; `None` for an empty one.
    fn block_span(&self, req: &Request) -> Option<(VmId, u64, u64)> {
        let sh = self.shift;
        (req.len > 0).then(|| (req.vm, req.offset >> sh, (req.end() - 1) >> sh))
    }

    /// Puts a request in the waiting queues (admitted by the next admission pass).
    fn enqueue(&mut self, id: ReqId, req: Request) {
        if let Some((vm, lo, hi)) = self.block_span(&req) {
            for b in lo..=hi {
                self.flight.queues.entry(pack_key(vm, b)).or_default().push_back(id);
            }
        }
        self.flight.waiting.insert(id, req);
        self.flight.candidates.push(id);
    }

    /// Submits a discard (NBD TRIM) of `len` bytes of `vm` at `offset`: once no op is in
    /// flight on its blocks (it waits in arrival order like a request), the whole 512-byte
    /// sectors inside the range leave the cache, dirty ones without being written back
    /// (their contents are undefined after a TRIM), and it replies at once (no device op;
    /// the driver hints the backing store after the reply). In persistent mode the dropped
    /// sectors are journaled by the next commit like any change.
    pub fn submit_discard(&mut self, now_ns: u64, vm: VmId, offset: u64, len: u32) -> ReqId {
        let id = self.flight.new_id();
        let (lo, hi) = (offset.div_ceil(512) * 512, (offset + len as u64) / 512 * 512);
        self.flight.discards.insert(id, (lo, hi));
        let req = Request { time_ns: now_ns, vm, op: Op::Write, offset, len };
        self.enqueue(id, req);
        self.admit_waiting(now_ns);
        id
    }

    /// Drops the whole sectors of `lo..hi` of `vm` (an admitted discard).
    fn discard_range(&mut self, vm: VmId, (lo, hi): (u64, u64)) {
        let bs = self.cfg.block_size;
        if lo >= hi {
            return;
        }
        for block in lo / bs..hi.div_ceil(bs) {
            let start = block * bs;
            let range = (((lo.max(start) - start) / 512) as u32, ((hi.min(start + bs) - start) / 512) as u32);
            self.discard(vm, block, range);
        }
    }

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
    fn retire_job(&mut self, mut job: Box<Job>) {
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
        let key = h.job();
        let Some(job) = self.flight.jobs.get_mut(key) else { return };
        let Some(first) = job.out.ops.first() else { return };
        let i = h.id.wrapping_sub(first.id) as usize;
        if job.state.get(i) != Some(&OpState::Issued) {
            return;
        }
        let op = job.out.ops[i];
        job.issued -= 1;
        match result {
            Ok(()) => {
                job.state[i] = OpState::Done;
                job.done += 1;
                job.sync_left -= op.sync as usize;
            }
            Err(f) => {
                job.state[i] = OpState::Failed;
                job.failure.get_or_insert(f);
                // An op a stopping driver never ran (`Shutdown`) is not a device error.
                if f != Failure::Shutdown {
                    let vm = op.vm as usize;
                    let errors = &mut self.flight.errors;
                    if errors.len() <= vm {
                        errors.resize(vm + 1, 0);
                    }
                    errors[vm] += 1;
                }
            }
        }
        // Background jobs of several blocks release each block once its ops succeeded.
        let by_block = job.failure.is_none() && !job.groups.is_empty();
        // Any backing write, even a failed (maybe torn) one, is synced before the next
        // commit: a fill may read those bytes and the journal call them clean.
        if op.kind == crate::output::OpKind::BackingWrite {
            self.note_write_back(op.vm);
        }
        let released = by_block && self.release_block(key, op);
        // Blocks are released when a job retires (or a background job's block is done):
        // only then can a waiting request go.
        if self.advance(key) || released {
            self.admit_waiting(now_ns);
        }
    }

    /// A background job's op on `op`'s block succeeded: once every op of that block did,
    /// its slots are unpinned and its key freed (the caller checked that the job releases
    /// block by block and nothing of it failed).
    fn release_block(&mut self, key: usize, op: DeviceOp) -> bool {
        let bs = self.cfg.block_size;
        let job = &mut self.flight.jobs[key];
        let block = pack_key(op.vm, op.block(bs));
        let g = job.groups.get_mut(&block).expect("every op's block has a group");
        g.2 -= 1;
        if g.2 > 0 {
            return false;
        }
        let (at, len) = (g.0 as usize, g.1 as usize);
        for k in at..at + len {
            let job = &self.flight.jobs[key];
            let slot = job.out.ops[job.by_key[k] as usize].slot;
            if slot != NO_SLOT {
                self.unpin(slot);
            }
        }
        self.unbusy(block);
        true
    }

    /// One op on slot `s` ended for good: the slot is free of it (and back on the free
    /// list if it was set aside there while pinned).
    fn unpin(&mut self, s: u32) {
        let n = self.flight.pins.get_mut(&s).expect("pinned");
        *n -= 1;
        if *n == 0 {
            self.flight.pins.remove(&s);
            if !self.parked.is_empty() && self.parked.remove(&s) {
                self.free.push_back(&mut self.slots, s);
            }
        }
    }

    /// One job holding block key `k` let go of it.
    fn unbusy(&mut self, k: u64) {
        let n = self.flight.busy.get_mut(&k).expect("busy");
        *n -= 1;
        if *n == 0 {
            self.flight.busy.remove(&k);
            if self.flight.queues.contains_key(&k) {
                self.flight.freed.push(k);
            }
        }
    }

    /// Admits waiting requests whose blocks are free, in arrival order on each block (a
    /// request behind a waiting one on the same block keeps waiting too).
    fn admit_waiting(&mut self, now_ns: u64) {
        if self.flight.hold {
            return;
        }
        if self.flight.waiting.is_empty() {
            self.flight.candidates.clear();
            self.flight.freed.clear();
            self.flight.rescan = false;
            return;
        }
        if self.flight.candidates.is_empty() && self.flight.freed.is_empty() && !self.flight.rescan {
            return;
        }
        let mut cands: std::collections::BTreeSet<ReqId> =
            std::mem::take(&mut self.flight.candidates).into_iter().collect();
        if std::mem::take(&mut self.flight.rescan) {
            cands.extend(self.flight.waiting.keys().copied());
        }
        self.take_freed(&mut cands);
        while let Some(id) = cands.pop_first() {
            let Some(&req) = self.flight.waiting.get(&id) else { continue };
            let span = self.block_span(&req);
            if let Some((vm, lo, hi)) = span {
                let f = &self.flight;
                let ready = (lo..=hi).all(|b| {
                    let k = pack_key(vm, b);
                    !f.busy.contains_key(&k) && f.queues.get(&k).and_then(|q| q.front()) == Some(&id)
                });
                if !ready {
                    continue;
                }
                for b in lo..=hi {
                    let k = pack_key(vm, b);
                    let q = self.flight.queues.get_mut(&k).expect("queued");
                    q.pop_front();
                    if q.is_empty() {
                        self.flight.queues.remove(&k);
                    }
                }
            }
            self.flight.waiting.remove(&id);
            self.admit(now_ns, id, req);
            if self.flight.hold {
                self.flight.rescan = true;
                return;
            }
            self.take_freed(&mut cands);
        }
    }

    /// Adds the requests heading the queues of blocks freed since the last look.
    fn take_freed(&mut self, cands: &mut std::collections::BTreeSet<ReqId>) {
        for k in std::mem::take(&mut self.flight.freed) {
            if let Some(&id) = self.flight.queues.get(&k).and_then(|q| q.front()) {
                cands.insert(id);
            }
        }
    }

    /// Runs an admitted request: its engine access (or discard), then its ops.
    fn admit(&mut self, now_ns: u64, id: ReqId, req: Request) {
        let mut job = Job::recycled(&mut self.flight.spare);
        if job.out.blocks.capacity() == 0 {
            if let Some(b) = self.flight.spare_blocks.pop() {
                job.out.blocks = b;
            }
        }
        let discard = if self.flight.discards.is_empty() { None } else { self.flight.discards.remove(&id) };
        if let Some(range) = discard {
            self.discard_range(req.vm, range);
            self.start(id, Some(req), job);
            return;
        }
        if req.op == Op::Write {
            self.pre_states(&req, &mut job);
        }
        let before = if self.dur.on && req.op == Op::Write { self.vouched_before(&req) } else { Vec::new() };
        self.access(now_ns, &req, &mut job.out);
        if !before.is_empty() {
            let intents = self.intents(&before, &job.out);
            if !intents.is_empty() {
                self.dur.intents.extend(intents);
                job.held = true; // until the intent commit is durable (`start`)
            }
        }
        self.start(id, Some(req), job);
        self.refill_reserve(req.vm);
        // S-CAVE's global cleaner keeps a reserve of free slots (§V-B).
        if let Some(goal) = self.cleaner_due() {
            self.submit_job(|e, out| {
                e.clean(goal, out);
            });
        }
    }

    /// The block keys a request touches, in order.
    fn request_keys(&self, req: &Request) -> impl Iterator<Item = u64> + use<> {
        let (sh, vm) = (self.shift, req.vm);
        let (lo, hi) = if req.len == 0 { (1, 0) } else { (req.offset >> sh, (req.end() - 1) >> sh) };
        (lo..=hi).map(move |b| pack_key(vm, b))
    }

    /// Persistent mode: the slots a write would overwrite where the journal may record
    /// valid clean sectors (they need an intent commit first; `durability.rs`).
    fn vouched_before(&self, req: &Request) -> Vec<crate::durability::SlotRecord> {
        self.request_keys(req)
            .filter_map(|key| self.lookup(req.vm, crate::slot_table::key_block(key)))
            .filter(|&s| self.dur.is_vouched(s))
            .map(|s| self.record_of(s))
            .collect()
    }

    /// The intent records a write's ops need, from the vouched-for slots its blocks held
    /// before the request (`before`) and the sectors the journal may record valid and clean
    /// there: a client cache write into the same slot records those it overwrites valid and
    /// dirty (their bytes are the old data until it lands; other sectors it makes valid are
    /// not recorded: a crash before it lands leaves nothing of theirs); a client backing
    /// write records those it covers invalid (a crash after it lands must not leave the old
    /// bytes labelled clean in the cache). Dirty sectors stay dirty either way.
    fn intents(&self, before: &[crate::durability::SlotRecord], out: &Output) -> Vec<crate::durability::SlotRecord> {
        use crate::output::OpKind;
        let bs = self.cfg.block_size;
        let mut records: Vec<crate::durability::SlotRecord> = Vec::new();
        let writes = out.ops.iter().filter(|o| o.client && o.kind == OpKind::SsdWrite);
        let around = out.ops.iter().filter(|o| o.client && o.kind == OpKind::BackingWrite);
        for op in writes.chain(around) {
            let ssd = op.kind == OpKind::SsdWrite;
            // The slot must still hold the block (one evicted by this request is recorded
            // free instead, and its backing write waits for that: `hold_for_vouched`).
            let Some(pre) = before.iter().find(|r| {
                (!ssd || r.slot == op.slot)
                    && r.block == Some((op.vm, op.block(bs)))
                    && self.slot_block(r.slot) == r.block
            }) else {
                continue;
            };
            let r = match records.iter_mut().find(|r| r.slot == pre.slot) {
                Some(r) => r,
                None => {
                    records.push(pre.clone());
                    records.last_mut().expect("just pushed")
                }
            };
            let (lo, hi) = op.sectors(bs);
            let vouched = self.dur.vouched_sectors(pre.slot);
            for i in lo..hi {
                let (w, bit) = ((i / 64) as usize, 1u64 << (i % 64));
                let journal_clean = vouched.get(w).is_some_and(|v| v & bit != 0);
                if ssd && (journal_clean || r.valid[w] & bit != 0) {
                    // Valid here (in the journal or in the record itself): never clean
                    // while the write may land.
                    r.valid[w] |= bit;
                    r.dirty[w] |= bit;
                } else if !ssd && r.dirty[w] & bit == 0 {
                    // Clean here (in the journal or the record): not once the backing
                    // store may hold newer bytes.
                    r.valid[w] &= !bit;
                }
            }
        }
        records.retain(|r| before.iter().any(|p| p.slot == r.slot && (p.dirty != r.dirty || p.valid != r.valid)));
        for r in records.iter_mut().filter(|r| r.valid.iter().all(|&w| w == 0)) {
            r.block = None; // nothing valid left: the slot is free in the journal's eyes
        }
        records
    }

    /// Lets a job held for an intent commit go on (`Some(failure)`: the commit failed, the
    /// job fails without running).
    pub(crate) fn release_held(&mut self, (id, key): (ReqId, usize), failure: Option<Failure>) {
        let Some(job) = self.flight.jobs.get_mut(key).filter(|j| j.id == id && j.held) else { return };
        job.held = false;
        if let Some(f) = failure {
            job.failure.get_or_insert(f);
        }
        self.advance(key);
    }

    /// Persistent mode: a job writing a block to its backing store while the journal may
    /// still record that block clean in a slot in limbo waits for the next commit (which
    /// frees that slot). Returns whether it is held.
    fn hold_for_vouched(&self, ops: &[DeviceOp]) -> bool {
        if self.dur.vouched_elsewhere.is_empty() {
            return false;
        }
        let bs = self.cfg.block_size;
        let clean_in_limbo = |op: &DeviceOp| {
            let (k, (lo, hi)) = (pack_key(op.vm, op.block(bs)), op.sectors(bs));
            op.kind == crate::output::OpKind::BackingWrite
                && self.dur.vouched_elsewhere.get(&k).is_some_and(|&s| {
                    let v = self.dur.vouched_sectors(s);
                    (lo..hi).any(|i| v.get((i / 64) as usize).is_some_and(|w| w >> (i % 64) & 1 == 1))
                })
        };
        ops.iter().any(clean_in_limbo)
    }

    /// After a commit: requests may go on.
    pub(crate) fn admit_after_commit(&mut self, now_ns: u64) {
        self.flight.rescan = true;
        self.admit_waiting(now_ns);
    }

    /// Records in `job` the dirty sectors of the slots a write's blocks hold now.
    fn pre_states(&self, req: &Request, job: &mut Job) {
        for key in self.request_keys(req) {
            let b = crate::slot_table::key_block(key);
            if let Some(s) = self.lookup(req.vm, b) {
                job.pre.push((s, key));
                job.pre_dirty.extend((0..self.spb).map(|i| self.dirty.get(s, i)));
            }
        }
    }

    /// Registers an admitted request's or job's ops (in `job.out`): pins, busy keys,
    /// first phase.
    fn start(&mut self, id: ReqId, req: Option<Request>, mut job: Box<Job>) {
        let bs = self.cfg.block_size;
        job.req = req;
        // The request's own keys (ascending), then those of its ops outside them (victims
        // written back; a background job's), which alone need sorting.
        let own = match &req {
            Some(r) => {
                job.keys.extend(self.request_keys(r));
                (job.keys.first().copied().unwrap_or(1), job.keys.last().copied().unwrap_or(0))
            }
            None => (1, 0),
        };
        let key = self.flight.jobs.vacant_key(); // where it goes (nothing is inserted before)
        for op in &mut job.out.ops {
            op.req = id;
            op.job = key as u32;
            let k = pack_key(op.vm, op.block(bs));
            if !(own.0..=own.1).contains(&k) {
                job.keys.push(k);
            }
            if op.slot != NO_SLOT {
                *self.flight.pins.entry(op.slot).or_default() += 1;
            }
        }
        if !job.keys.is_sorted() {
            job.keys.sort_unstable();
        }
        job.keys.dedup();
        for &k in &job.keys {
            *self.flight.busy.entry(k).or_default() += 1;
        }
        let n = job.out.ops.len();
        // Usually the ops come in phase order already; else an index in phase order
        // (stable: arrival order inside a phase).
        if !job.out.ops.is_sorted_by_key(|o| o.phase) {
            // Few distinct phases: one pass per phase, lowest first (stable, no sort).
            let Job { order, out, .. } = &mut *job;
            let mut phase = out.ops.iter().map(|o| o.phase).min().unwrap_or(0);
            loop {
                order.extend((0..n as u32).filter(|&i| out.ops[i as usize].phase == phase));
                let next = out.ops.iter().map(|o| o.phase).filter(|&p| p > phase).min();
                match next {
                    Some(p) => phase = p,
                    None => break,
                }
            }
        }
        job.sync_left = job.out.ops.iter().filter(|o| o.sync).count();
        if req.is_none() && job.keys.len() > 1 {
            let Job { by_key, groups, out, .. } = &mut *job;
            let key = |i: u32| pack_key(out.ops[i as usize].vm, out.ops[i as usize].block(bs));
            by_key.extend(0..n as u32);
            by_key.sort_by_key(|&i| key(i));
            let mut at = 0;
            while at < n {
                let k = key(by_key[at]);
                let len = by_key[at..].iter().take_while(|&&i| key(i) == k).count();
                groups.insert(k, (at as u32, len as u32, len as u32));
                at += len;
            }
        }
        job.state.resize(n, OpState::Pending);
        job.id = id;
        job.held |= self.hold_for_vouched(&job.out.ops);
        if job.held {
            self.dur.held.push(((id, key), None));
        }
        let at = self.flight.jobs.insert(job);
        debug_assert_eq!(at, key);
        self.advance(key);
    }

    /// Hands out the next phase, replies, repairs and retires as the job's state allows;
    /// whether it retired.
    fn advance(&mut self, key: usize) -> bool {
        let job = &mut self.flight.jobs[key];
        let id = job.id;
        if job.held && job.failure.is_none() {
            return false;
        }
        if job.failure.is_none() {
            // The phase handed out ended: the next one (the lowest with ops not done).
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
                    self.flight.ready.push_back(op);
                }
            }
            if job.sync_left == 0 && !job.replied && job.req.is_some() {
                job.replied = true;
                let blocks = std::mem::take(&mut job.out.blocks); // replied once
                self.flight.events.push_back(Event::Reply { req: id, result: Ok(()), blocks });
            }
            if job.done < n {
                return false;
            }
        } else if job.in_flight() {
            return false;
        }
        let mut job = self.flight.jobs.remove(key);
        if let Some(f) = job.failure {
            self.repair(&job);
            if job.req.is_some() && !job.replied {
                let blocks = std::mem::take(&mut job.out.blocks);
                self.flight.events.push_back(Event::Reply { req: id, result: Err(f), blocks });
            }
        }
        let bs = self.cfg.block_size;
        let released = |k: u64| !job.groups.is_empty() && job.groups.get(&k).is_some_and(|g| g.2 == 0);
        for op in &job.out.ops {
            if op.slot != NO_SLOT && !released(pack_key(op.vm, op.block(bs))) {
                self.unpin(op.slot);
            }
        }
        for &k in &job.keys {
            if !released(k) {
                self.unbusy(k);
            }
        }
        self.settle();
        self.flight.events.push_back(Event::Retired { req: id, failed: job.failure.is_some() });
        self.retire_job(job);
        if self.flight.refill_job == Some(id) {
            self.flight.refill_job = None;
            self.dur.refilling = false;
        }
        self.finish_commands();
        true
    }

    /// A shrink ([`Self::set_target`]) stops at slots with ops in flight; once ops end,
    /// partitions still above their target give back the rest as a background job. Dirty
    /// blocks a flush leaving write-back skipped are written back the same way.
    fn finish_commands(&mut self) {
        if !self.left_dirty.is_empty() && !self.flight.hold {
            let spb = self.spb;
            let (ready, busy): (Vec<u32>, Vec<u32>) =
                std::mem::take(&mut self.left_dirty).into_iter().partition(|&s| !self.flight.pinned(s));
            self.left_dirty = busy;
            if !ready.is_empty() {
                self.submit_job(|e, out| {
                    for s in ready {
                        let k = e.slots.key(s);
                        if k == crate::slot_table::FREE_KEY || !e.dirty.any(s, (0, spb)) {
                            continue;
                        }
                        let vm = crate::slot_table::key_vm(k);
                        let p = &e.vms[vm as usize];
                        if p.write_policy != crate::WritePolicy::Wb && !p.bypass {
                            e.writeback(vm, s, (0, spb), 0, false, out);
                        }
                    }
                });
            }
        }
        if self.shared.is_some() || !std::mem::take(&mut self.shrink_due) {
            return;
        }
        for vm in 0..self.vms.len() as VmId {
            let p = &self.vms[vm as usize];
            if p.used > p.target {
                let target = p.target;
                self.submit_job(|e, out| e.set_target(vm, target, out));
                self.shrink_due = true; // until a pass finds every partition at its target
            }
        }
    }
}
