//! Write-back ahead of eviction (`Engine::set_writeback_ahead`), step by step through the
//! asynchronous API: the dirty blocks among a VM's next victims are written back one job
//! at a time while nothing else of the VM is on its backing store, never while a backing
//! op of it is in flight, the blocks stay cached, and a later miss evicts a clean victim
//! without writing anything back on its path. (The data models of `out_of_order.rs` and
//! `crash_consistency.rs` run it among their random steps too.)

use cachevisor_engine::*;
use cachevisor_trace::{Op, Request};

const BLOCK: u64 = 4096;

fn req(vm: u32, op: Op, block: u64) -> Request {
    Request { time_ns: 0, vm, op, offset: block * BLOCK, len: BLOCK as u32 }
}

/// Runs every op as soon as it is issued; returns every op seen until nothing is in flight.
fn settle(e: &mut Engine) -> Vec<DeviceOp> {
    let mut seen = Vec::new();
    loop {
        while let Some(ev) = e.poll_event() {
            if let Event::Reply { result, .. } = ev {
                result.expect("no failure");
            }
        }
        let Some(op) = e.poll_op() else { break };
        seen.push(op);
        e.handle_completion(0, op.handle(), Ok(()));
    }
    assert_eq!(e.in_flight(), 0);
    seen
}

/// VM 0 with 8 LRU slots holding blocks 0..8, all written (dirty), block 0 least recent.
fn full_of_dirty_blocks(window: u32) -> Engine {
    let cfg = EngineConfig { replacement: ReplacementKind::Lru, ..EngineConfig::with_slots(8) };
    let mut e = Engine::new(cfg).unwrap();
    e.set_target(0, 8, &mut Output::default());
    for b in 0..8 {
        e.submit(0, &req(0, Op::Write, b));
        settle(&mut e);
    }
    assert_eq!((e.partition(0).used, e.partition(0).dirty_blocks), (8, 8));
    e.set_writeback_ahead(window);
    e
}

#[test]
fn an_idle_backing_store_has_the_next_victims_written_back_one_job_at_a_time() {
    let mut e = full_of_dirty_blocks(3);
    // A hit moves block 0 to the front; the next victims are 1, 2, 3. The request needs
    // no backing op, so the backing store is idle and write-back ahead starts.
    e.submit(0, &req(0, Op::Read, 0));
    let mut order = Vec::new();
    loop {
        while e.poll_event().is_some() {}
        // Everything handed out before any of it completes.
        let batch: Vec<DeviceOp> = std::iter::from_fn(|| e.poll_op()).collect();
        if batch.is_empty() {
            break;
        }
        let mut jobs: Vec<u64> = batch.iter().filter(|o| o.staged).map(|o| o.req).collect();
        jobs.dedup();
        assert!(jobs.len() <= 1, "one write-back-ahead job at a time: {batch:?}");
        order.extend(batch.iter().filter(|o| o.kind == OpKind::BackingWrite).map(|o| o.disk_addr / BLOCK));
        // A hit while a job reads its block (the backing store idle) starts no second one.
        if batch.iter().any(|o| o.kind == OpKind::SsdRead && o.staged) {
            e.submit(0, &req(0, Op::Read, 7));
        }
        for op in batch {
            e.handle_completion(0, op.handle(), Ok(()));
        }
    }
    assert_eq!(order, [1, 2, 3], "the next three victims, soonest first");
    assert_eq!(e.written_back_ahead(), 3);
    // Written back, still cached: nothing was evicted.
    assert_eq!((e.partition(0).used, e.partition(0).dirty_blocks), (8, 5));
    e.check_invariants().unwrap();
    // A miss now evicts block 1, clean: its path writes nothing back.
    e.submit(0, &req(0, Op::Read, 100));
    let ops = settle(&mut e);
    let own: Vec<_> = ops.iter().filter(|o| o.disk_addr / BLOCK == 1).collect();
    assert!(own.is_empty(), "the clean victim cost an op: {own:?}");
    assert!(e.lookup(0, 1).is_none() && e.lookup(0, 100).is_some());
}

#[test]
fn nothing_is_written_back_ahead_while_a_backing_op_of_the_vm_is_in_flight() {
    let mut e = full_of_dirty_blocks(4);
    e.submit(0, &req(0, Op::Read, 50)); // a miss: backing read, and its victim's write-back
    let mut held = Vec::new();
    while let Some(op) = e.poll_op() {
        if matches!(op.loc, Location::Backing(0)) {
            held.push(op); // not completed: the backing store is busy
        } else {
            e.handle_completion(0, op.handle(), Ok(()));
        }
    }
    assert!(!held.is_empty());
    // Hits meanwhile: the backing store is still busy, nothing starts.
    for b in 4..8 {
        e.submit(0, &req(0, Op::Read, b));
        while let Some(op) = e.poll_op() {
            assert!(!matches!(op.loc, Location::Backing(_)), "write-back ahead on a busy disk: {op:?}");
            e.handle_completion(0, op.handle(), Ok(()));
        }
    }
    assert_eq!(e.written_back_ahead(), 0);
    // The backing ops complete: then the idle store takes the next victims.
    for op in held {
        e.handle_completion(0, op.handle(), Ok(()));
    }
    settle(&mut e);
    assert!(e.written_back_ahead() > 0, "an idle backing store was left with dirty next victims");
    e.check_invariants().unwrap();
}

#[test]
fn a_burst_of_writes_is_written_back_once_it_retired() {
    // One request writes every block (all pinned while it runs); nothing else comes.
    let cfg = EngineConfig { replacement: ReplacementKind::Lru, ..EngineConfig::with_slots(8) };
    let mut e = Engine::new(cfg).unwrap();
    e.set_target(0, 8, &mut Output::default());
    e.set_writeback_ahead(8);
    e.submit(0, &Request { time_ns: 0, vm: 0, op: Op::Write, offset: 0, len: 8 * BLOCK as u32 });
    settle(&mut e);
    assert_eq!((e.written_back_ahead(), e.partition(0).dirty_blocks, e.partition(0).used), (8, 0, 8));
}

#[test]
fn a_failing_backing_store_is_retried_at_the_clients_pace_not_in_a_loop() {
    let mut e = full_of_dirty_blocks(4);
    e.submit(0, &req(0, Op::Read, 7)); // a hit: write-back ahead starts
    let mut failed = 0;
    let mut ops = 0;
    while let Some(op) = e.poll_op() {
        ops += 1;
        assert!(ops < 100, "write-back ahead loops on a failing store");
        let result = if op.kind == OpKind::BackingWrite {
            failed += 1;
            Err(Failure::Io)
        } else {
            Ok(())
        };
        e.handle_completion(0, op.handle(), result);
        while e.poll_event().is_some() {}
    }
    assert_eq!(failed, 1, "one failed write, then it waits");
    assert_eq!(e.written_back_ahead(), 0, "a failed write-back is not counted as written");
    assert_eq!(e.partition(0).dirty_blocks, 8, "the failed block is dirty again");
    e.check_invariants().unwrap();
    // A client request: one more try.
    e.submit(0, &req(0, Op::Read, 6));
    let again = settle(&mut e).iter().filter(|o| o.kind == OpKind::BackingWrite).count();
    assert!(again > 0, "a client request resumes write-back ahead");
}

#[test]
fn write_back_ahead_off_writes_nothing_ahead() {
    let mut e = full_of_dirty_blocks(0);
    e.submit(0, &req(0, Op::Read, 0));
    let ops = settle(&mut e);
    assert!(ops.iter().all(|o| o.kind != OpKind::BackingWrite), "{ops:?}");
    assert_eq!((e.written_back_ahead(), e.partition(0).dirty_blocks), (0, 8));
}

#[test]
fn peeked_victims_are_the_ones_evicted_next_for_list_policies() {
    for kind in [ReplacementKind::Lru, ReplacementKind::Fifo, ReplacementKind::TwoPool] {
        let mut t = slot_table::SlotTable::new(32, false);
        let mut r = kind.build(32);
        for s in 0..32 {
            r.insert(&mut t, s);
        }
        for s in [3, 7, 11, 3, 20] {
            r.touch(&mut t, s);
        }
        let mut peeked = Vec::new();
        r.peek_victims(&t, 10, &mut peeked);
        let evicted: Vec<u32> = (0..10).map(|_| r.evict(&mut t).unwrap()).collect();
        assert_eq!(peeked, evicted, "{kind}");
    }
}

/// `backing_busy_ns`: the time a VM's backing store had this engine's ops in flight, in
/// the driver's time — overlapping ops counted once, idle gaps not at all, a busy period
/// still open counted up to the driver's last call.
#[test]
fn backing_busy_time_counts_overlapping_ops_once_and_idle_gaps_not_at_all() {
    let cfg = EngineConfig { replacement: ReplacementKind::Lru, ..EngineConfig::with_slots(8) };
    let mut e = Engine::new(cfg).unwrap();
    e.set_target(0, 8, &mut Output::default());
    let ms = 1_000_000;
    // Two read misses at 0 ms: their backing reads end at 3 and 5 ms.
    e.submit(0, &req(0, Op::Read, 0));
    e.submit(0, &req(0, Op::Read, 1));
    let mut reads = Vec::new();
    while let Some(op) = e.poll_op() {
        if op.kind == OpKind::BackingRead {
            reads.push(op);
        } else {
            e.handle_completion(0, op.handle(), Ok(()));
        }
    }
    assert_eq!(reads.len(), 2);
    e.handle_completion(3 * ms, reads[0].handle(), Ok(()));
    assert_eq!(e.backing_busy_ns(0), 3 * ms, "a busy period still open counts up to now");
    e.handle_completion(5 * ms, reads[1].handle(), Ok(()));
    while let Some(op) = e.poll_op() {
        assert_ne!(op.kind, OpKind::BackingRead);
        e.handle_completion(5 * ms, op.handle(), Ok(()));
    }
    assert_eq!(e.backing_busy_ns(0), 5 * ms);
    // Idle until 10 ms; a miss then, done at 12 ms.
    e.submit(10 * ms, &req(0, Op::Read, 2));
    while let Some(op) = e.poll_op() {
        let at = if op.kind == OpKind::BackingRead { 12 * ms } else { 10 * ms };
        e.handle_completion(at, op.handle(), Ok(()));
    }
    assert_eq!(e.backing_busy_ns(0), 7 * ms);
    assert_eq!(e.backing_busy_ns(1), 0, "a VM never seen");
}
