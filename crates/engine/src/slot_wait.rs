//! Persistent mode's wait for a free slot: a request that may need a new slot while no
//! durable free slot is left waits in the request queue for the commit that returns slots from
//! limbo, instead of bypassing the cache (bcache's allocator waits for a free bucket the
//! same way). It waits only when slots will come back — some are in limbo waiting for a
//! commit, or a refill job is evicting ahead (`durability.rs`) — and the last commit did
//! not fail; otherwise the miss bypasses as before, so neither a cache whose blocks cannot
//! be evicted nor a metadata file system that is full (commits failing until space is
//! made) ever leaves a client without an answer.
//! The daemon's commit takes a disk flush, the simulator's a device model's time; waiting
//! in both keeps what they cache, and write back, the same for the same requests.

use crate::engine::Engine;
use crate::slot_table::key_block;
use cachevisor_trace::Request;

impl Engine {
    /// Whether `req` must wait for the next commit before it is dispatched: persistent mode,
    /// not passing through, no durable free slot, slots on their way back, and a block of
    /// it not cached (a miss that would take a slot).
    pub(crate) fn waits_for_slot(&mut self, req: &Request) -> bool {
        if req.len == 0 || !self.dur.slots_coming() {
            return false;
        }
        if self.vms.get(req.vm as usize).is_none_or(|p| p.bypass) || self.free_available() {
            return false;
        }
        self.request_keys(req).any(|k| self.lookup(req.vm, key_block(k)).is_none())
    }

    /// Requests that arrived to find no durable free slot for their miss and waited for a
    /// commit (persistent mode), since the engine started.
    pub fn slot_waits(&self) -> u64 {
        self.dur.slot_waits()
    }
}

#[cfg(test)]
mod tests {
    use crate::inflight::Event;
    use crate::{Engine, EngineConfig, PartitionMode};
    use cachevisor_trace::{Op, Request};

    /// Runs every op and event to rest without committing; returns the replies' bypass
    /// counts by request.
    fn run_ops(e: &mut Engine) -> Vec<(crate::inflight::ReqId, usize)> {
        let mut replies = Vec::new();
        loop {
            let mut any = false;
            while let Some(op) = e.poll_op() {
                e.handle_completion(0, op.handle(), Ok(()));
                any = true;
            }
            while let Some(ev) = e.poll_event() {
                if let Event::Reply { req, blocks, .. } = ev {
                    replies.push((req, blocks.iter().filter(|b| b.bypassed).count()));
                }
                any = true;
            }
            if !any {
                return replies;
            }
        }
    }

    fn commit(e: &mut Engine) {
        while let Some(c) = e.poll_commit() {
            e.handle_commit(0, c.epoch, Ok(()));
        }
    }

    fn read(block: u64) -> Request {
        Request { time_ns: 0, vm: 0, op: Op::Read, offset: block * 4096, len: 4096 }
    }

    /// A persistent engine of 4 slots with no durable free slot left and slots in limbo,
    /// and the id of a miss (block 12) waiting for them.
    fn starved() -> (Engine, crate::inflight::ReqId) {
        let cfg = EngineConfig { partition: PartitionMode::Shared, ..EngineConfig::with_slots(4) };
        let mut e = Engine::new(cfg).unwrap();
        e.set_persistent(1);
        for b in 0..4 {
            e.submit(0, &read(b));
            run_ops(&mut e);
            commit(&mut e);
        }
        // Four blocks in four slots, two of them evicted ahead and committed free. Two
        // more misses take those; the refill evicts ahead again, into limbo (not yet
        // committed free): the next miss waits, with no op and no reply.
        for b in [10, 11] {
            e.submit(0, &read(b));
            run_ops(&mut e);
        }
        assert!(e.free_slots() == 0 && e.dur.limbo_len() > 0, "free {}, limbo {}", e.free_slots(), e.dur.limbo_len());
        let id = e.submit(0, &read(12));
        assert!(run_ops(&mut e).iter().all(|r| r.0 != id), "answered before a slot was durable");
        assert_eq!(e.slot_waits(), 1);
        (e, id)
    }

    #[test]
    fn a_miss_with_no_durable_free_slot_waits_for_the_commit_then_takes_a_slot() {
        let (mut e, id) = starved();
        // The commit frees the limbo slots: the miss is dispatched and cached, not bypassed.
        commit(&mut e);
        let replies = run_ops(&mut e);
        assert_eq!(replies.iter().find(|r| r.0 == id).map(|r| r.1), Some(0), "{replies:?}");
        assert!(e.lookup(0, 12).is_some(), "block 12 was not cached");
    }

    #[test]
    fn a_waiting_miss_is_answered_when_the_commit_fails_and_none_waits_until_one_succeeds() {
        let (mut e, id) = starved();
        // The metadata's file system is full: the commit fails, and the waiting miss goes
        // on, bypassing the cache, instead of waiting for a commit that may never come.
        let c = e.poll_commit().expect("a commit is due");
        e.handle_commit(0, c.epoch, Err(crate::Failure::NoSpace));
        let replies = run_ops(&mut e);
        assert_eq!(replies.iter().find(|r| r.0 == id).map(|r| r.1), Some(1), "{replies:?}");
        let id = e.submit(0, &read(13));
        assert_eq!(run_ops(&mut e).iter().find(|r| r.0 == id).map(|r| r.1), Some(1), "no wait while commits fail");
        assert_eq!(e.slot_waits(), 1);
        // Space again: the retried commit succeeds, slots come back, misses are cached.
        commit(&mut e);
        let id = e.submit(0, &read(14));
        assert_eq!(run_ops(&mut e).iter().find(|r| r.0 == id).map(|r| r.1), Some(0));
    }

    #[test]
    fn with_no_slot_on_its_way_back_a_miss_bypasses_at_once() {
        let cfg = EngineConfig { partition: PartitionMode::Shared, ..EngineConfig::with_slots(4) };
        let mut e = Engine::new(cfg).unwrap();
        e.set_persistent(1);
        // Every block pinned by a read in flight: nothing can be evicted ahead.
        let ids: Vec<_> = (0..4).map(|b| e.submit(0, &read(b))).collect();
        assert_eq!(ids.len(), 4);
        let id = e.submit(0, &read(20));
        assert_eq!(e.slot_waits(), 0, "nothing in limbo, no refill: no reason to wait");
        let replies = run_ops(&mut e);
        assert_eq!(replies.iter().find(|r| r.0 == id).map(|r| r.1), Some(1), "{replies:?}");
    }
}
