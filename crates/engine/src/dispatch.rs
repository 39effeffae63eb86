//! Dispatch: a submitted request (or discard) runs at once when no running job holds, and
//! no earlier request waits for, any of its blocks; otherwise it waits in the request
//! queue (`request_queue.rs`) and is dispatched by the pass that finds all its blocks free
//! and itself at the head of each of their queues (`inflight.rs` states the rules).
//! Dispatch runs the request's engine access and hands its job to `jobs.rs`. (Dispatch
//! decides *when* a request runs; what may enter the cache is another question.)

use crate::engine::Engine;
use crate::inflight::{Failure, Job, ReqId};
use crate::slot_table::pack_key;
use cachevisor_trace::{Op, Request, VmId};

impl Engine {
    /// Submits a client request at driver time `now_ns`; its ops come from
    /// [`Self::poll_op`], its reply from [`Self::poll_event`]. It waits (no ops yet) while
    /// a block it touches has ops in flight. A request outside its vDisk
    /// ([`Self::check_range`]) is answered at once with [`Failure::OutOfRange`] and
    /// touches nothing.
    pub fn submit(&mut self, now_ns: u64, req: &Request) -> ReqId {
        self.submit_with(now_ns, req, false)
    }

    /// [`Self::submit`] for a write the client asked to be durable at once when `sync`
    /// (NBD's FUA): I/O classes may match it (`io_class.rs`); the durability itself is the
    /// driver's flush after it.
    pub fn submit_with(&mut self, now_ns: u64, req: &Request, sync: bool) -> ReqId {
        self.ahead.at(now_ns);
        self.seals.at(now_ns);
        let id = self.flight.new_id();
        if self.refuse_out_of_range(id, req.vm, req.offset, req.len) {
            return id;
        }
        if sync && req.op == Op::Write {
            self.classes.note_sync(id);
        }
        let prefetch = self.prefetch_due(req);
        let waits = self.waits_for_slot(req);
        if waits {
            self.dur.count_slot_wait();
        }
        if !waits && self.blocks_free(req) {
            // Nothing holds or waits for its blocks (nor for a slot): dispatched at once.
            self.dispatch(now_ns, id, *req);
            if self.queue.any_freed() {
                self.dispatch_waiting(now_ns);
            }
        } else {
            self.enqueue(id, *req);
            self.dispatch_waiting(now_ns);
        }
        if self.ahead.on() {
            self.ahead_client_request(req.vm);
            self.run_writeback_ahead();
        }
        if let Some((a, n)) = prefetch {
            self.start_prefetch(req.vm, a, n);
        }
        id
    }

    /// Answers request `id` with [`Failure::OutOfRange`] (a reply, then its retirement)
    /// when its range is outside its vDisk; whether it did.
    fn refuse_out_of_range(&mut self, id: ReqId, vm: VmId, offset: u64, len: u32) -> bool {
        if self.check_range(vm, offset, len as u64).is_ok() {
            return false;
        }
        self.flight.answer_at_once(id, Err(Failure::OutOfRange), false);
        true
    }

    /// Whether dispatch is open and no job holds, and no request waits for, a block of
    /// `req`.
    fn blocks_free(&self, req: &Request) -> bool {
        if self.flight.held() {
            return false;
        }
        (!self.flight.any_block_held() && self.queue.no_block_waited_on())
            || self.request_keys(req).all(|k| !self.block_taken(k))
    }

    /// Whether a running job holds, or a waiting request waits for, block key `k`: a block
    /// nothing may move or drop meanwhile.
    #[inline]
    pub(crate) fn block_taken(&self, k: u64) -> bool {
        self.flight.holds_block(k) || self.queue.waits_on(k)
    }

    /// Puts a request in the request queue (dispatched by a later pass).
    fn enqueue(&mut self, id: ReqId, req: Request) {
        self.queue.push(id, req, self.request_keys(&req));
    }

    /// Submits a discard (NBD TRIM) of `len` bytes of `vm` at `offset`: once no op is in
    /// flight on its blocks (it waits in arrival order like a request), the whole 512-byte
    /// sectors inside the range leave the cache, dirty ones without being written back
    /// (their contents are undefined after a TRIM), and it replies at once (no device op;
    /// the driver hints the backing store after the reply). In persistent mode the dropped
    /// sectors are journaled by the next commit like any change.
    pub fn submit_discard(&mut self, now_ns: u64, vm: VmId, offset: u64, len: u32) -> ReqId {
        let id = self.flight.new_id();
        if self.refuse_out_of_range(id, vm, offset, len) {
            return id;
        }
        let (lo, hi) = (offset.div_ceil(512) * 512, (offset + len as u64) / 512 * 512);
        let req = Request { time_ns: now_ns, vm, op: Op::Write, offset, len };
        self.enqueue(id, req);
        self.queue.mark_discard(id, (lo, hi));
        self.dispatch_waiting(now_ns);
        id
    }

    /// Drops the whole sectors of `lo..hi` of `vm` (a dispatched discard).
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

    /// Dispatches waiting requests whose blocks are free, in arrival order on each block
    /// (a request behind a waiting one on the same block keeps waiting too).
    pub(crate) fn dispatch_waiting(&mut self, now_ns: u64) {
        if self.flight.held() {
            return;
        }
        let mut cands = self.queue.take_candidates();
        while let Some(id) = cands.pop_first() {
            let Some(req) = self.queue.get(id) else { continue };
            let ready = self.request_keys(&req).all(|k| !self.flight.holds_block(k) && self.queue.heads(id, k));
            if !ready || (!self.queue.is_discard(id) && self.waits_for_slot(&req)) {
                continue;
            }
            self.queue.pop(id, self.request_keys(&req));
            self.dispatch(now_ns, id, req);
            if self.flight.held() {
                self.queue.rescan();
                return;
            }
            self.queue.take_freed(&mut cands);
        }
    }

    /// Runs a dispatched request: its engine access (or discard), then its ops.
    fn dispatch(&mut self, now_ns: u64, id: ReqId, req: Request) {
        let mut job = self.flight.new_request_job();
        if let Some(range) = self.queue.take_discard(id) {
            self.discard_range(req.vm, range);
            self.start(id, Some(req), job);
            return;
        }
        if req.op == Op::Write {
            self.pre_states(&req, &mut job);
        }
        let before = match req.op {
            _ if !self.dur.on() => Vec::new(),
            Op::Write => self.vouched_before(&req),
            // A read's fill into a sealed slot waits for an unsealing record too.
            _ => self.sealed_before(&req),
        };
        self.req.sync = self.classes.take_sync(id);
        self.run_access(now_ns, &req, &mut job.out);
        std::mem::swap(&mut job.keep, &mut self.req.keep);
        if req.op == Op::Write {
            for op in job.out.ops.iter().filter(|o| o.client && o.kind == crate::output::OpKind::SsdWrite) {
                self.seals.wrote(op.slot);
            }
        }
        if !before.is_empty() {
            let intents = self.intents(&before, &job.out);
            if !intents.is_empty() {
                self.dur.add_intents(intents);
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
    pub(crate) fn request_keys(&self, req: &Request) -> impl Iterator<Item = u64> + use<> {
        let (sh, vm) = (self.shift, req.vm);
        let (lo, hi) = if req.len == 0 { (1, 0) } else { (req.offset >> sh, (req.end() - 1) >> sh) };
        (lo..=hi).map(move |b| pack_key(vm, b))
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

    /// After a commit (or a hold ends): every waiting request may go on.
    pub(crate) fn dispatch_after_commit(&mut self, now_ns: u64) {
        self.queue.rescan();
        self.dispatch_waiting(now_ns);
    }
}
