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
use std::collections::{HashMap, HashSet, VecDeque};

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
}

impl Job {
    fn in_flight(&self) -> bool {
        self.state.contains(&OpState::Issued)
    }
}

/// The in-flight state (inside [`Engine`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Flight {
    next_req: ReqId,
    jobs: HashMap<ReqId, Job>,
    /// Op id → its job.
    owner: HashMap<OpId, ReqId>,
    waiting: VecDeque<(ReqId, Request)>,
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
        self.flight.waiting.push_back((id, *req));
        self.admit_waiting(now_ns);
        id
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
        self.flight.waiting.push_back((id, req));
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
        self.advance(req);
        self.admit_waiting(now_ns);
    }

    /// Admits waiting requests, in order, whose blocks are free; a request behind a waiting
    /// one on the same block keeps waiting too.
    fn admit_waiting(&mut self, now_ns: u64) {
        if self.flight.waiting.is_empty() || self.flight.hold {
            return;
        }
        let mut claimed: HashSet<u64> = HashSet::new();
        let mut i = 0;
        while i < self.flight.waiting.len() {
            let (id, req) = self.flight.waiting[i];
            let keys = self.request_keys(&req);
            if keys.iter().any(|k| self.flight.busy.contains_key(k) || claimed.contains(k)) {
                claimed.extend(keys);
                i += 1;
                continue;
            }
            self.flight.waiting.remove(i);
            if let Some(range) = self.flight.discards.remove(&id) {
                self.discard_range(req.vm, range);
                self.start(id, Some(req), Output::default(), Vec::new());
                continue;
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
        };
        self.flight.jobs.insert(id, job);
        self.advance(id);
    }

    /// Hands out the next phase, replies, repairs and retires as the job's state allows.
    fn advance(&mut self, id: ReqId) {
        let job = self.flight.jobs.get_mut(&id).expect("admitted");
        if job.held && job.failure.is_none() {
            return;
        }
        if job.failure.is_none() {
            let next = job.ops.iter().zip(&job.state).filter(|(_, &s)| s != OpState::Done).map(|(o, _)| o.phase).min();
            if let Some(phase) = next {
                for (op, st) in job.ops.iter().zip(job.state.iter_mut()) {
                    if op.phase == phase && *st == OpState::Pending {
                        *st = OpState::Issued;
                        self.flight.ready.push_back(*op);
                    }
                }
            }
            let sync_done = job.ops.iter().zip(&job.state).all(|(o, &s)| !o.sync || s == OpState::Done);
            if sync_done && !job.replied && job.req.is_some() {
                job.replied = true;
                self.flight.events.push_back(Event::Reply { req: id, result: Ok(()), blocks: job.blocks.clone() });
            }
            if job.state.iter().any(|&s| s != OpState::Done) {
                return;
            }
        } else if job.in_flight() {
            return;
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
                self.flight.events.push_back(Event::Reply { req: id, result: Err(f), blocks: job.blocks.clone() });
            }
        }
        for op in &job.ops {
            if op.slot != NO_SLOT {
                let n = self.flight.pins.get_mut(&op.slot).expect("pinned");
                *n -= 1;
                if *n == 0 {
                    self.flight.pins.remove(&op.slot);
                }
            }
        }
        for k in &job.keys {
            let n = self.flight.busy.get_mut(k).expect("busy");
            *n -= 1;
            if *n == 0 {
                self.flight.busy.remove(k);
            }
        }
        self.settle();
        self.flight.events.push_back(Event::Retired { req: id, failed: job.failure.is_some() });
        if self.flight.refill_job == Some(id) {
            self.flight.refill_job = None;
            self.dur.refilling = false;
        }
        self.finish_shrinks();
    }

    /// A shrink ([`Self::set_target`]) stops at slots with ops in flight; once ops end,
    /// partitions still above their target give back the rest as a background job.
    fn finish_shrinks(&mut self) {
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
