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
use crate::output::{BlockOutcome, DeviceOp, OpId, Output, NO_SLOT};
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
#[derive(Debug, Clone)]
pub(crate) struct Job {
    /// The client request (`None`: a background job).
    pub(crate) req: Option<Request>,
    pub(crate) ops: Vec<DeviceOp>,
    pub(crate) state: Vec<OpState>,
    pub(crate) blocks: Vec<BlockOutcome>,
    /// Write requests: (slot, block key, dirty flag per sector) of the slots the request's
    /// blocks held before it, for repairs.
    pub(crate) pre: Vec<(u32, u64, Vec<bool>)>,
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
}

/// The in-flight state (inside [`Engine`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Flight {
    next_req: ReqId,
    jobs: HashMap<ReqId, Box<Job>>,
    /// Op id → its job.
    owner: HashMap<OpId, ReqId>,
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
        let bs = self.cfg.block_size;
        (req.len > 0).then(|| (req.vm, req.offset / bs, (req.end() - 1) / bs))
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
        let mut out = Output::default();
        f(self, &mut out);
        if out.ops.is_empty() {
            return None;
        }
        let id = self.flight.new_id();
        self.start(id, None, out, Vec::new());
        Some(id)
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

    /// Device ops that failed for `vm` so far.
    pub fn device_errors(&self, vm: VmId) -> u64 {
        self.flight.errors.get(vm as usize).copied().unwrap_or(0)
    }

    /// Reports that op `id` completed (`Ok`) or failed, at driver time `now_ns`. Unknown
    /// ids (already reported) are ignored.
    pub fn handle_completion(&mut self, now_ns: u64, id: OpId, result: Result<(), Failure>) {
        let Some(req) = self.flight.owner.remove(&id) else { return };
        let job = self.flight.jobs.get_mut(&req).expect("an op's job is admitted");
        let i = (id - job.ops[0].id) as usize;
        job.state[i] = if result.is_ok() { OpState::Done } else { OpState::Failed };
        job.issued -= 1;
        if result.is_ok() {
            job.done += 1;
            job.sync_left -= job.ops[i].sync as usize;
        }
        let op = job.ops[i];
        // Any backing write, even a failed (maybe torn) one, is synced before the next
        // commit: a fill may read those bytes and the journal call them clean.
        if op.kind == crate::output::OpKind::BackingWrite {
            self.note_write_back(op.vm);
        }
        let job = self.flight.jobs.get_mut(&req).expect("an op's job is admitted");
        if let Err(f) = result {
            job.failure.get_or_insert(f);
            let vm = job.ops[i].vm as usize;
            let errors = &mut self.flight.errors;
            if errors.len() <= vm {
                errors.resize(vm + 1, 0);
            }
            errors[vm] += 1;
        }
        let released = result.is_ok() && self.release_block(req, op);
        // Blocks are released when a job retires (or a background job's block is done):
        // only then can a waiting request go.
        if self.advance(req) || released {
            self.admit_waiting(now_ns);
        }
    }

    /// A background job's op on `op`'s block succeeded: once every op of that block did
    /// (and nothing of the job failed), its slots are unpinned and its key freed.
    fn release_block(&mut self, req: ReqId, op: DeviceOp) -> bool {
        let bs = self.cfg.block_size;
        let Some(job) = self.flight.jobs.get_mut(&req) else { return false };
        if job.failure.is_some() || job.groups.is_empty() {
            return false;
        }
        let key = pack_key(op.vm, op.block(bs));
        let g = job.groups.get_mut(&key).expect("every op's block has a group");
        g.2 -= 1;
        if g.2 > 0 {
            return false;
        }
        let (at, len) = (g.0 as usize, g.1 as usize);
        for k in at..at + len {
            let job = &self.flight.jobs[&req];
            let slot = job.ops[job.by_key[k] as usize].slot;
            if slot != NO_SLOT {
                self.unpin(slot);
            }
        }
        self.unbusy(key);
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
        if let Some(range) = self.flight.discards.remove(&id) {
            self.discard_range(req.vm, range);
            self.start(id, Some(req), Output::default(), Vec::new());
            return;
        }
        let pre = if req.op == Op::Write { self.pre_states(&req) } else { Vec::new() };
        let before = if self.dur.on && req.op == Op::Write { self.vouched_before(&req) } else { Vec::new() };
        let mut out = Output::default();
        self.access(now_ns, &req, &mut out);
        let intents = self.intents(&before, &out);
        if !intents.is_empty() {
            self.dur.intents.extend(intents);
            self.dur.held.push((id, None));
        }
        self.start(id, Some(req), out, pre);
        self.refill_reserve(req.vm);
        // S-CAVE's global cleaner keeps a reserve of free slots (§V-B).
        if let Some(goal) = self.cleaner_due() {
            self.submit_job(|e, out| {
                e.clean(goal, out);
            });
        }
    }

    /// The block keys a request touches.
    fn request_keys(&self, req: &Request) -> Vec<u64> {
        if req.len == 0 {
            return Vec::new();
        }
        let bs = self.cfg.block_size;
        (req.offset / bs..=(req.end() - 1) / bs).map(|b| pack_key(req.vm, b)).collect()
    }

    /// Persistent mode: the slots a write would overwrite where the journal may record
    /// valid clean sectors (they need an intent commit first; `durability.rs`).
    fn vouched_before(&self, req: &Request) -> Vec<crate::durability::SlotRecord> {
        self.request_keys(req)
            .into_iter()
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
    pub(crate) fn release_held(&mut self, id: ReqId, failure: Option<Failure>) {
        let Some(job) = self.flight.jobs.get_mut(&id) else { return };
        job.held = false;
        if let Some(f) = failure {
            job.failure.get_or_insert(f);
        }
        self.advance(id);
    }

    /// Persistent mode: a job writing a block to its backing store while the journal may
    /// still record that block clean in a slot in limbo waits for the next commit (which
    /// frees that slot). Returns whether it is held.
    fn hold_for_vouched(&mut self, id: ReqId, backing_writes: &[(u64, (u32, u32))]) -> bool {
        if self.dur.vouched_elsewhere.is_empty() {
            return false;
        }
        let clean_in_limbo = |&(k, (lo, hi)): &(u64, (u32, u32))| {
            self.dur.vouched_elsewhere.get(&k).is_some_and(|&s| {
                let v = self.dur.vouched_sectors(s);
                (lo..hi).any(|i| v.get((i / 64) as usize).is_some_and(|w| w >> (i % 64) & 1 == 1))
            })
        };
        if !backing_writes.iter().any(clean_in_limbo) {
            return false;
        }
        self.dur.held.push((id, None));
        true
    }

    /// After a commit: requests may go on.
    pub(crate) fn admit_after_commit(&mut self, now_ns: u64) {
        self.flight.rescan = true;
        self.admit_waiting(now_ns);
    }

    /// The dirty sectors of the slots a write's blocks hold now.
    fn pre_states(&self, req: &Request) -> Vec<(u32, u64, Vec<bool>)> {
        let mut pre = Vec::new();
        for key in self.request_keys(req) {
            let b = crate::slot_table::key_block(key);
            if let Some(s) = self.lookup(req.vm, b) {
                pre.push((s, key, (0..self.spb).map(|i| self.dirty.get(s, i)).collect()));
            }
        }
        pre
    }

    /// Registers an admitted request's or job's ops: pins, busy keys, first phase.
    fn start(&mut self, id: ReqId, req: Option<Request>, mut out: Output, pre: Vec<(u32, u64, Vec<bool>)>) {
        let bs = self.cfg.block_size;
        let mut keys: Vec<u64> = req.map(|r| self.request_keys(&r)).unwrap_or_default();
        for op in &mut out.ops {
            op.req = id;
            keys.push(pack_key(op.vm, op.block(bs)));
            if op.slot != NO_SLOT {
                *self.flight.pins.entry(op.slot).or_default() += 1;
            }
            self.flight.owner.insert(op.id, id);
        }
        keys.sort_unstable();
        keys.dedup();
        for &k in &keys {
            *self.flight.busy.entry(k).or_default() += 1;
        }
        let n = out.ops.len();
        // Usually the ops come in phase order already; else an index in phase order
        // (stable: arrival order inside a phase).
        let order: Vec<u32> = if out.ops.is_sorted_by_key(|o| o.phase) {
            Vec::new()
        } else {
            let mut order: Vec<u32> = (0..n as u32).collect();
            order.sort_by_key(|&i| out.ops[i as usize].phase);
            order
        };
        let sync_left = out.ops.iter().filter(|o| o.sync).count();
        let (mut by_key, mut groups) = (Vec::new(), HashMap::default());
        if req.is_none() && keys.len() > 1 {
            let key = |i: u32| pack_key(out.ops[i as usize].vm, out.ops[i as usize].block(bs));
            by_key = (0..n as u32).collect();
            by_key.sort_by_key(|&i| key(i));
            let mut at = 0;
            while at < n {
                let k = key(by_key[at]);
                let len = by_key[at..].iter().take_while(|&&i| key(i) == k).count();
                groups.insert(k, (at as u32, len as u32, len as u32));
                at += len;
            }
        }
        let out_keys: Vec<(u64, (u32, u32))> = out
            .ops
            .iter()
            .filter(|o| o.kind == crate::output::OpKind::BackingWrite)
            .map(|o| (pack_key(o.vm, o.block(bs)), o.sectors(bs)))
            .collect();
        let job = Job {
            req,
            ops: out.ops,
            state: vec![OpState::Pending; n],
            blocks: out.blocks,
            pre,
            replied: false,
            failure: None,
            keys,
            held: self.hold_for_vouched(id, &out_keys) || self.dur.held.iter().any(|h| h.0 == id),
            order,
            cursor: 0,
            issued: 0,
            sync_left,
            done: 0,
            by_key,
            groups,
        };
        self.flight.jobs.insert(id, Box::new(job));
        self.advance(id);
    }

    /// Hands out the next phase, replies, repairs and retires as the job's state allows;
    /// whether it retired.
    fn advance(&mut self, id: ReqId) -> bool {
        let job = self.flight.jobs.get_mut(&id).expect("admitted");
        if job.held && job.failure.is_none() {
            return false;
        }
        if job.failure.is_none() {
            // The phase handed out ended: the next one (the lowest with ops not done).
            let at = |job: &Job, k: usize| if job.order.is_empty() { k } else { job.order[k] as usize };
            if job.issued == 0 && job.cursor < job.ops.len() {
                let phase = job.ops[at(job, job.cursor)].phase;
                while job.cursor < job.ops.len() {
                    let i = at(job, job.cursor);
                    let op = job.ops[i];
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
                let blocks = std::mem::take(&mut job.blocks); // replied once
                self.flight.events.push_back(Event::Reply { req: id, result: Ok(()), blocks });
            }
            if job.done < job.ops.len() {
                return false;
            }
        } else if job.in_flight() {
            return false;
        }
        let job = self.flight.jobs.remove(&id).expect("admitted");
        if let Some(f) = job.failure {
            for (op, st) in job.ops.iter().zip(&job.state) {
                if *st == OpState::Pending {
                    self.flight.owner.remove(&op.id);
                }
            }
            self.repair(&job);
            if job.req.is_some() && !job.replied {
                self.flight.events.push_back(Event::Reply { req: id, result: Err(f), blocks: job.blocks });
            }
        }
        let bs = self.cfg.block_size;
        let released = |k: u64| job.groups.get(&k).is_some_and(|g| g.2 == 0);
        for op in &job.ops {
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
        if self.shared.is_some() {
            return;
        }
        for vm in 0..self.vms.len() as VmId {
            let p = &self.vms[vm as usize];
            if p.used > p.target {
                let target = p.target;
                self.submit_job(|e, out| e.set_target(vm, target, out));
            }
        }
    }
}
