//! Persistent mode's relocation of a rewritten clean block: the write goes to a durable
//! free slot at once (no commit first), and the slot it left — still the journal's copy of
//! the block — is not reused until a commit recording it free is durable.

use cachevisor_engine::*;
use cachevisor_trace::{Op, Request};

const BS: u64 = 4096;

/// Runs every op handed out (successfully) and takes the events; returns the ops.
fn run_all(e: &mut Engine) -> Vec<DeviceOp> {
    let mut ran = Vec::new();
    while let Some(op) = e.poll_op() {
        ran.push(op);
        e.handle_completion(0, op.handle(), Ok(()));
    }
    while e.poll_event().is_some() {}
    ran
}

/// Runs the engine's next commit to completion.
fn commit(e: &mut Engine) {
    e.request_commit();
    let c = e.poll_commit().expect("a commit");
    e.handle_commit(0, c.epoch, Ok(()));
    run_all(e);
}

fn req(op: Op, block: u64) -> Request {
    Request { time_ns: 0, vm: 0, op, offset: block * BS, len: BS as u32 }
}

/// A persistent engine (8 slots, VM 0's target 6) with block 0 read into the cache and
/// journaled clean.
fn block_0_journaled_clean() -> (Engine, Output) {
    let mut e = Engine::new(EngineConfig { partition: PartitionMode::Static, ..EngineConfig::with_slots(8) }).unwrap();
    let mut out = Output::default();
    e.set_target(0, 6, &mut out);
    e.set_persistent(1);
    e.submit(0, &req(Op::Read, 0));
    run_all(&mut e);
    commit(&mut e);
    (e, out)
}

#[test]
fn a_rewritten_clean_block_moves_and_its_old_slot_waits_for_the_commit() {
    let (mut e, _) = block_0_journaled_clean();
    let old = e.lookup(0, 0).expect("cached");
    // Rewritten whole: the cache write is handed out at once, into another slot.
    e.submit(0, &req(Op::Write, 0));
    let ops = run_all(&mut e);
    let write =
        ops.iter().find(|o| o.client && o.kind == OpKind::SsdWrite).expect("a cache write without a commit first");
    assert_ne!(write.slot, old, "the rewrite went to a new slot");
    assert_eq!(e.lookup(0, 0), Some(write.slot));
    // New blocks before the next commit never take the old slot.
    for b in 1..5 {
        e.submit(0, &req(Op::Write, b));
        for op in run_all(&mut e) {
            assert_ne!(op.slot, old, "block {b} took the slot the journal still says holds block 0");
        }
    }
    e.check_invariants().unwrap();
}

/// A slot freed while a victim's write-back still reads it makes no commit due until the
/// read ends (before, the driver's committer ran empty commits back to back, two
/// fdatasyncs each, for as long as the op was in flight — forever once a stopping driver
/// left it unrun); then its free record goes in the next commit.
#[test]
fn a_freed_slot_still_being_read_makes_no_commit_due() {
    let mut e = Engine::new(EngineConfig { partition: PartitionMode::Static, ..EngineConfig::with_slots(8) }).unwrap();
    let mut out = Output::default();
    e.set_target(0, 4, &mut out);
    e.set_write_policy(0, WritePolicy::Wb, &mut out);
    e.set_persistent(1);
    // Dirty blocks fill the partition; every op runs but the write-backs' cache reads.
    let mut held = Vec::new();
    for b in 0..12 {
        e.submit(0, &req(Op::Write, b));
        for _ in 0..50 {
            let mut progressed = false;
            while let Some(op) = e.poll_op() {
                progressed = true;
                if op.kind == OpKind::SsdRead && !op.client {
                    held.push(op);
                } else {
                    e.handle_completion(0, op.handle(), Ok(()));
                }
            }
            if let Some(c) = e.poll_commit() {
                progressed = true;
                e.handle_commit(0, c.epoch, Ok(()));
            }
            while e.poll_event().is_some() {}
            if !progressed {
                break;
            }
        }
        if !held.is_empty() {
            break;
        }
    }
    assert!(!held.is_empty(), "a dirty victim's write-back read is in flight");
    // Settled: nothing due while the read is in flight, however often the driver asks.
    for _ in 0..3 {
        assert!(e.poll_commit().is_none(), "a commit is due while the only change is a slot still being read");
    }
    let slot = held[0].slot;
    for op in held {
        e.handle_completion(0, op.handle(), Ok(()));
    }
    let mut freed = false;
    for _ in 0..10 {
        while let Some(op) = e.poll_op() {
            e.handle_completion(0, op.handle(), Ok(()));
        }
        while e.poll_event().is_some() {}
        let Some(c) = e.poll_commit() else { break };
        freed |= c.records.iter().any(|r| r.slot == slot && r.block.is_none());
        e.handle_commit(0, c.epoch, Ok(()));
    }
    assert!(freed, "the slot's free record went in a commit once its read ended");
    e.check_invariants().unwrap();
}

/// Persistent mode: a write around (read-only policy) over sectors the journal still
/// calls clean waits for a commit recording them invalid — also when memory already
/// dropped them (a failed cache read's repair does, without a commit), so the intent
/// changes nothing in memory. Without the wait, the write lands while the journal still
/// vouches the old bytes: a crash then serves them (found by the crash-consistency model
/// with the read-only policy drawn).
#[test]
fn a_write_around_waits_for_the_journal_even_when_memory_already_dropped_the_sectors() {
    let (mut e, mut out) = block_0_journaled_clean();
    assert!(e.lookup(0, 0).is_some());
    // A read of sectors 0..7 whose cache read fails: memory drops them, no commit yet.
    e.submit(0, &Request { time_ns: 0, vm: 0, op: Op::Read, offset: 0, len: 7 * 512 });
    while let Some(op) = e.poll_op() {
        let r = if op.kind == OpKind::SsdRead { Err(Failure::Io) } else { Ok(()) };
        e.handle_completion(0, op.handle(), r);
    }
    while e.poll_event().is_some() {}
    // Read-only now; a write around sectors 4..6.
    e.set_write_policy(0, WritePolicy::Ro, &mut out);
    assert!(out.ops.is_empty());
    e.submit(0, &Request { time_ns: 0, vm: 0, op: Op::Write, offset: 4 * 512, len: 2 * 512 });
    assert_eq!(e.poll_op(), None, "the write around went before a commit recorded its sectors invalid");
    commit(&mut e);
    e.check_invariants().unwrap();
}
