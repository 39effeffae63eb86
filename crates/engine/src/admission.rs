//! Admission: a submitted request (or discard) goes at once when no admitted job holds,
//! and no earlier request waits for, any of its blocks; otherwise it waits in per-block
//! queues in arrival order and is admitted by the pass that finds all its blocks free and
//! itself at the head of each of their queues (`inflight.rs` states the rules). Admission
//! runs the request's engine access and hands its job to `jobs.rs`.

use crate::engine::Engine;
use crate::inflight::{Event, Failure, Job, ReqId};
use crate::slot_table::pack_key;
use cachevisor_trace::{Op, Request, VmId};

impl Engine {
    /// Submits a client request at driver time `now_ns`; its ops come from
    /// [`Self::poll_op`], its reply from [`Self::poll_event`]. It waits (no ops yet) while
    /// a block it touches has ops in flight. A request outside its vDisk
    /// ([`Self::check_range`]) is answered at once with [`Failure::OutOfRange`] and
    /// touches nothing.
    pub fn submit(&mut self, now_ns: u64, req: &Request) -> ReqId {
        self.ahead.at(now_ns);
        self.seals.at(now_ns);
        let id = self.flight.new_id();
        if self.refuse_out_of_range(id, req.vm, req.offset, req.len) {
            return id;
        }
        let waits = self.waits_for_slot(req);
        self.dur.slot_waits += waits as u64;
        if !waits && self.blocks_free(req) {
            // Nothing holds or waits for its blocks (nor for a slot): admitted at once.
            self.admit(now_ns, id, *req);
            if !self.flight.freed.is_empty() {
                self.admit_waiting(now_ns);
            }
        } else {
            self.enqueue(id, *req);
            self.admit_waiting(now_ns);
        }
        if self.ahead.window > 0 {
            self.ahead_client_request(req.vm);
            self.run_writeback_ahead();
        }
        id
    }

    /// Answers request `id` with [`Failure::OutOfRange`] (a reply, then its retirement)
    /// when its range is outside its vDisk; whether it did.
    fn refuse_out_of_range(&mut self, id: ReqId, vm: VmId, offset: u64, len: u32) -> bool {
        if self.check_range(vm, offset, len as u64).is_ok() {
            return false;
        }
        let f = &mut self.flight;
        f.push_event(Event::Reply { req: id, result: Err(Failure::OutOfRange), blocks: Vec::new() });
        f.push_event(Event::Retired { req: id, failed: false });
        true
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
        if self.refuse_out_of_range(id, vm, offset, len) {
            return id;
        }
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

    /// Admits waiting requests whose blocks are free, in arrival order on each block (a
    /// request behind a waiting one on the same block keeps waiting too).
    pub(crate) fn admit_waiting(&mut self, now_ns: u64) {
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
                if !ready || (!self.flight.discards.contains_key(&id) && self.waits_for_slot(&req)) {
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
        if req.op == Op::Write {
            for op in job.out.ops.iter().filter(|o| o.client && o.kind == crate::output::OpKind::SsdWrite) {
                self.seals.wrote(op.slot);
            }
        }
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

    /// After a commit: requests may go on.
    pub(crate) fn admit_after_commit(&mut self, now_ns: u64) {
        self.flight.rescan = true;
        self.admit_waiting(now_ns);
    }
}
