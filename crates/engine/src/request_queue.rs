//! The queue of submitted requests that may not be dispatched yet: a request touching a
//! block that a running job holds, or that an earlier request waits for, waits here in
//! per-block queues, in arrival order. A request is dispatched by the pass that finds all
//! its blocks free and itself at the head of each of their queues (`inflight.rs` states
//! the rules; `dispatch.rs` runs the passes).
//!
//! Only requests worth a look are looked at in a pass: ones that just arrived, and ones
//! heading the queue of a block just freed (`rescan`: all of them, after a hold). So a
//! long backlog on hot blocks (an open-loop replay past the devices' speed) costs nothing
//! per completion.

use crate::inflight::ReqId;
use cachevisor_trace::Request;
use rustc_hash::FxHashMap as HashMap;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Waiting requests (inside [`crate::engine::Engine`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct RequestQueue {
    /// Waiting requests by id (arrival order).
    waiting: BTreeMap<ReqId, Request>,
    /// Per block key, the waiting requests on it in arrival order.
    queues: HashMap<u64, VecDeque<ReqId>>,
    /// Requests to look at in the next pass, and blocks freed since the last one.
    candidates: Vec<ReqId>,
    freed: Vec<u64>,
    rescan: bool,
    /// Waiting discards (TRIM): id → the byte range of whole sectors to drop.
    discards: HashMap<ReqId, (u64, u64)>,
}

impl RequestQueue {
    /// Requests waiting.
    pub(crate) fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether a request waits for block key `k`.
    #[inline]
    pub(crate) fn waits_on(&self, k: u64) -> bool {
        !self.queues.is_empty() && self.queues.contains_key(&k)
    }

    /// Whether no request waits for any block.
    pub(crate) fn no_block_waited_on(&self) -> bool {
        self.queues.is_empty()
    }

    /// Queues request `id` on its block keys `keys`; the next pass looks at it.
    pub(crate) fn push(&mut self, id: ReqId, req: Request, keys: impl Iterator<Item = u64>) {
        for k in keys {
            self.queues.entry(k).or_default().push_back(id);
        }
        self.waiting.insert(id, req);
        self.candidates.push(id);
    }

    /// Marks request `id` a discard of the byte range `range`.
    pub(crate) fn mark_discard(&mut self, id: ReqId, range: (u64, u64)) {
        self.discards.insert(id, range);
    }

    /// Whether request `id` is a discard.
    pub(crate) fn is_discard(&self, id: ReqId) -> bool {
        !self.discards.is_empty() && self.discards.contains_key(&id)
    }

    /// The byte range of discard `id`, taken out (it is being dispatched).
    pub(crate) fn take_discard(&mut self, id: ReqId) -> Option<(u64, u64)> {
        if self.discards.is_empty() {
            None
        } else {
            self.discards.remove(&id)
        }
    }

    /// Block key `k` was freed: the request heading its queue is worth a look.
    pub(crate) fn block_freed(&mut self, k: u64) {
        if self.waits_on(k) {
            self.freed.push(k);
        }
    }

    /// Whether blocks were freed since the last pass.
    pub(crate) fn any_freed(&self) -> bool {
        !self.freed.is_empty()
    }

    /// Every waiting request is worth a look in the next pass (dispatch resumed).
    pub(crate) fn rescan(&mut self) {
        self.rescan = true;
    }

    /// The requests a pass looks at, lowest id first; empty when none is worth a look
    /// (and then nothing is left pending).
    pub(crate) fn take_candidates(&mut self) -> BTreeSet<ReqId> {
        if self.waiting.is_empty() {
            self.candidates.clear();
            self.freed.clear();
            self.rescan = false;
            return BTreeSet::new();
        }
        let mut cands: BTreeSet<ReqId> = std::mem::take(&mut self.candidates).into_iter().collect();
        if std::mem::take(&mut self.rescan) {
            cands.extend(self.waiting.keys().copied());
        }
        self.take_freed(&mut cands);
        cands
    }

    /// Adds to `cands` the requests heading the queues of blocks freed since the last look.
    pub(crate) fn take_freed(&mut self, cands: &mut BTreeSet<ReqId>) {
        for k in std::mem::take(&mut self.freed) {
            if let Some(&id) = self.queues.get(&k).and_then(|q| q.front()) {
                cands.insert(id);
            }
        }
    }

    /// Waiting request `id`, if it still waits.
    pub(crate) fn get(&self, id: ReqId) -> Option<Request> {
        self.waiting.get(&id).copied()
    }

    /// Whether request `id` heads the queue of block key `k`.
    #[inline]
    pub(crate) fn heads(&self, id: ReqId, k: u64) -> bool {
        self.queues.get(&k).and_then(|q| q.front()) == Some(&id)
    }

    /// Takes request `id` out, off the head of the queues of its block keys `keys`.
    pub(crate) fn pop(&mut self, id: ReqId, keys: impl Iterator<Item = u64>) {
        for k in keys {
            let q = self.queues.get_mut(&k).expect("queued");
            debug_assert_eq!(q.front(), Some(&id), "it heads the queue");
            q.pop_front();
            if q.is_empty() {
                self.queues.remove(&k);
            }
        }
        self.waiting.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachevisor_trace::Op;

    fn req(vm: u32) -> Request {
        Request { time_ns: 0, vm, op: Op::Read, offset: 0, len: 4096 }
    }

    #[test]
    fn a_freed_block_brings_only_the_head_of_its_queue() {
        let mut q = RequestQueue::default();
        q.push(1, req(0), [10, 11].into_iter());
        q.push(2, req(0), [11].into_iter());
        assert_eq!(q.take_candidates().into_iter().collect::<Vec<_>>(), vec![1, 2]);
        assert!(q.take_candidates().is_empty(), "nothing new to look at");
        q.block_freed(11);
        assert_eq!(q.take_candidates().into_iter().collect::<Vec<_>>(), vec![1]);
        assert!(q.heads(1, 10) && q.heads(1, 11) && !q.heads(2, 11));
        q.pop(1, [10, 11].into_iter());
        assert!(!q.waits_on(10) && q.waits_on(11) && q.heads(2, 11));
        q.block_freed(10); // nobody waits there: not worth a look
        assert!(!q.any_freed());
        q.rescan();
        assert_eq!(q.take_candidates().into_iter().collect::<Vec<_>>(), vec![2]);
        q.pop(2, [11].into_iter());
        assert_eq!(q.len(), 0);
        assert!(q.no_block_waited_on());
    }

    #[test]
    fn a_discard_is_known_until_dispatched() {
        let mut q = RequestQueue::default();
        q.push(7, req(1), [3].into_iter());
        q.mark_discard(7, (512, 4096));
        assert!(q.is_discard(7) && !q.is_discard(8));
        assert_eq!(q.take_discard(7), Some((512, 4096)));
        assert_eq!(q.take_discard(7), None);
    }
}
