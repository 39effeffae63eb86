//! A job's life once dispatched: its ops pin their slots and hold their blocks (`start`),
//! phases are handed out in order as completions come back, the reply goes when every
//! sync op is done, and at retirement (or, for a background job of many blocks, block by
//! block) slots are unpinned and blocks freed for waiting requests. Shrinks and
//! write-backs that had to skip pinned slots are finished here once those ops end.

use crate::engine::Engine;
use crate::inflight::{Event, Job, OpState, ReqId};
use crate::output::{DeviceOp, Location, NO_SLOT};
use crate::slot_table::pack_key;
use cachevisor_trace::{Request, VmId};

impl Engine {
    /// Registers a dispatched request's or a job's ops (in `job.out`): pins, busy keys,
    /// first phase.
    pub(crate) fn start(&mut self, id: ReqId, req: Option<Request>, mut job: Box<Job>) {
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
        let key = self.flight.vacant_key(); // where it goes (nothing is inserted before)
        for op in &mut job.out.ops {
            op.req = id;
            op.job = key as u32;
            let k = pack_key(op.vm, op.block(bs));
            if !(own.0..=own.1).contains(&k) {
                job.keys.push(k);
            }
            if op.loc == Location::Ram {
                self.ram_pin(op.slot);
            } else if op.slot != NO_SLOT {
                self.flight.pin(op.slot);
            }
        }
        for &s in &job.keep {
            self.flight.pin(s);
        }
        if !job.keys.is_sorted() {
            job.keys.sort_unstable();
        }
        job.keys.dedup();
        for &k in &job.keys {
            self.flight.hold_block(k);
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
            self.dur.hold_job(id, key);
        }
        let at = self.flight.insert(job);
        debug_assert_eq!(at, key);
        self.advance(key);
    }

    /// Hands out the next phase, replies, repairs and retires as the job's state allows;
    /// whether it retired.
    pub(crate) fn advance(&mut self, key: usize) -> bool {
        let (ahead, congestion, stores) = (&mut self.ahead, &mut self.congestion, &mut self.stores);
        let now = ahead.now_ns();
        if !self.flight.advance(key, |op| {
            ahead.issued(op);
            congestion.issued(op.id, op.kind, now);
            if let crate::output::Location::Cache(st) = op.loc {
                stores.op_moved(st, false);
            }
        }) {
            return false;
        }
        let mut job = self.flight.remove(key);
        let id = job.id;
        if let Some(f) = job.failure {
            self.repair(&job);
            self.poison_after_repair(key);
            if job.req.is_some() && !job.replied {
                let blocks = std::mem::take(&mut job.out.blocks);
                self.flight.push_event(Event::Reply { req: id, result: Err(f), blocks });
            }
        }
        let bs = self.cfg.block_size;
        let released = |k: u64| !job.groups.is_empty() && job.groups.get(&k).is_some_and(|g| g.2 == 0);
        for op in &job.out.ops {
            if op.slot != NO_SLOT && !released(pack_key(op.vm, op.block(bs))) {
                self.unpin_op(op);
            }
        }
        for &k in &job.keys {
            if !released(k) {
                self.unbusy(k);
            }
        }
        for i in 0..job.keep.len() {
            self.unpin(job.keep[i]);
        }
        self.settle();
        self.flight.push_event(Event::Retired { req: id, failed: job.failure.is_some() });
        match job.req {
            None => {
                self.ahead_retired(id, job.failure.is_some());
                self.prefetcher.retired(id);
            }
            // Its blocks are unpinned now: they may be next victims to write back.
            Some(r) => self.ahead_look_at(r.vm),
        }
        self.retire_job(job);
        self.dur.job_retired(id);
        self.finish_commands();
        true
    }

    /// A background job's op on `op`'s block succeeded: once every op of that block did,
    /// its slots are unpinned and its key freed (the caller checked that the job releases
    /// block by block and nothing of it failed).
    pub(crate) fn release_block(&mut self, key: usize, op: DeviceOp) -> bool {
        let bs = self.cfg.block_size;
        let job = self.flight.job_mut(key);
        let block = pack_key(op.vm, op.block(bs));
        let g = job.groups.get_mut(&block).expect("every op's block has a group");
        g.2 -= 1;
        if g.2 > 0 {
            return false;
        }
        let (at, len) = (g.0 as usize, g.1 as usize);
        for k in at..at + len {
            let job = self.flight.job(key);
            let op = job.out.ops[job.by_key[k] as usize];
            if op.slot != NO_SLOT {
                self.unpin_op(&op);
            }
        }
        self.unbusy(block);
        true
    }

    /// Op `op` ended for good: its slot (a store's, or the RAM tier's) is free of it.
    fn unpin_op(&mut self, op: &DeviceOp) {
        if op.loc == Location::Ram {
            self.ram_unpin(op.slot);
        } else {
            self.unpin(op.slot);
        }
    }

    /// One op on slot `s` ended for good: the slot is free of it (and back on the free
    /// list if it was set aside there while pinned).
    fn unpin(&mut self, s: u32) {
        if self.flight.unpin(s) && self.stores.unpark(s) {
            self.free_push_back(s);
        }
    }

    /// One job holding block key `k` let go of it.
    fn unbusy(&mut self, k: u64) {
        if self.flight.let_go_block(k) {
            self.queue.block_freed(k);
            if self.mirrors.on() || self.mirrors.len() > 0 {
                self.mirror_block_idle(k); // a clean block's mirror goes (`dirty_mirror.rs`)
            }
        }
    }

    /// Writes back, as one background job, the dirty blocks of `list` with no op in flight
    /// whose partition still `wants` it (blocks gone or clean by now are dropped); returns
    /// the ones with ops in flight, to try again.
    fn write_back_listed(&mut self, list: Vec<u32>, wants: fn(&crate::engine::Partition) -> bool) -> Vec<u32> {
        let spb = self.spb;
        let (ready, busy): (Vec<u32>, Vec<u32>) = list.into_iter().partition(|&s| !self.flight.pinned(s));
        if !ready.is_empty() {
            self.submit_job(|e, out| {
                for s in ready {
                    let k = e.slots.key(s);
                    if k == crate::slot_table::FREE_KEY || !e.dirty.any(s, (0, spb)) {
                        continue;
                    }
                    let vm = crate::slot_table::key_vm(k);
                    if wants(&e.vms[vm as usize]) {
                        e.writeback(vm, s, (0, spb), 0, false, out);
                    }
                }
            });
        }
        busy
    }

    /// A shrink ([`Self::set_target`]) stops at slots with ops in flight; once ops end,
    /// partitions still above their target give back the rest as a background job. Dirty
    /// blocks a flush leaving write-back skipped are written back the same way; those a
    /// steal from a paced shrink passed over, paced per donor (`paced_clean.rs`).
    fn finish_commands(&mut self) {
        if self.shrink.left_dirty_due() && !self.flight.held() {
            let list = self.shrink.take_left_dirty();
            let busy = self.write_back_listed(list, |p| p.write_policy != crate::WritePolicy::Wb && !p.bypass);
            self.shrink.leave_dirty(busy);
        }
        self.run_paced_clean();
        if self.mirrors.len() > 0 || self.mirrors.on() {
            // Blocks left with one copy of their dirty data go back first.
            let single = self.take_single_copies();
            if !single.is_empty() && !self.flight.held() {
                let busy = self.write_back_listed(single, |_| true);
                self.keep_single_copies(busy);
            } else {
                self.keep_single_copies(single);
            }
        }
        if self.moving.moves_due() && !self.flight.held() {
            self.run_gradual_moves();
        }
        if self.shared.is_some() || !self.shrink.take_due() {
            return;
        }
        for vm in 0..self.vms.len() as VmId {
            let p = &self.vms[vm as usize];
            if p.used > p.target && !p.paced {
                let target = p.target;
                self.submit_job(|e, out| e.set_target(vm, target, out));
                self.shrink.set_due(); // until a pass finds every partition at its target
            }
        }
    }
}
