//! Persistent mode's relocation of a rewritten clean block (the write goes to a durable
//! free slot at once, no commit first, and the slot it left — still the journal's copy
//! of the block — is not reused until a commit recording it free is durable), and the
//! journal's rules for writes around the cache (read-only, pass-through): intents, free
//! records and write-backs ordered so a crash never finds old bytes labelled clean nor a
//! flushed write lost.

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

/// A persistent engine: 8 slots, VM 0's target 6 (write-back).
fn persistent_engine() -> (Engine, Output) {
    let mut e = Engine::new(EngineConfig { partition: PartitionMode::Static, ..EngineConfig::with_slots(8) }).unwrap();
    let mut out = Output::default();
    e.set_target(0, 6, &mut out);
    e.set_persistent(1);
    (e, out)
}

/// [`persistent_engine`] with block 0 read into the cache and journaled clean.
fn block_0_journaled_clean() -> (Engine, Output) {
    let (mut e, out) = persistent_engine();
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

/// Persistent mode: an intent taken for a held write around is older than a state the
/// slot settles into afterwards (here the slot is evicted while the write waits): the
/// commit carries that newer state — the slot free — not the intent. (The intent used to
/// win: the free record was lost, the slot stayed in limbo, and the held write went on
/// by a commit that never freed it — the crash-consistency model with read-only drawn.)
#[test]
fn a_slot_freed_after_its_intent_is_committed_free() {
    let (mut e, mut out) = block_0_journaled_clean();
    let slot = e.lookup(0, 0).expect("cached");
    e.set_write_policy(0, WritePolicy::Ro, &mut out);
    // A write around half of block 0: held for an intent commit.
    e.submit(0, &Request { time_ns: 0, vm: 0, op: Op::Write, offset: 0, len: 4 * 512 });
    assert_eq!(e.poll_op(), None, "held for its intent");
    // The slot is evicted meanwhile (a shrink): its state is now free.
    e.set_target(0, 0, &mut out);
    run_all(&mut e);
    assert_eq!(e.lookup(0, 0), None);
    e.request_commit();
    let c = e.poll_commit().expect("a commit");
    let r = c.records.iter().find(|r| r.slot == slot).expect("the slot's record");
    assert_eq!(r.block, None, "the stale intent went instead of the free record: {r:?}");
    e.handle_commit(0, c.epoch, Ok(()));
    run_all(&mut e);
    e.check_invariants().unwrap();
}

/// Persistent mode: a write around (read-only policy) over a block whose dirty sectors a
/// flush made durable: until the write's backing write has landed, no commit journals
/// those sectors invalid or the slot free (a crash would find neither the cached copy
/// nor the data on the backing store). The dirty sectors are written back first, pinning
/// the slot, and the write's own backing write goes after them.
#[test]
fn a_write_around_over_dirty_sectors_keeps_them_in_the_journal_until_it_lands() {
    let (mut e, _) = persistent_engine();
    // Block 0 written (write-back: dirty) and flushed: the journal records it dirty.
    e.submit(0, &req(Op::Write, 0));
    run_all(&mut e);
    let flush = e.submit_flush();
    let c = e.poll_commit().expect("the flush's commit");
    e.handle_commit(0, c.epoch, Ok(()));
    let mut flushed = false;
    while let Some(ev) = e.poll_event() {
        flushed |= matches!(ev, Event::Reply { req, result: Ok(()), .. } if req == flush);
    }
    assert!(flushed, "the flush replied once its commit was durable");
    let slot = e.lookup(0, 0).expect("cached");
    // Read-only without a flush of the partition (as a bypassed vDisk keeps its dirty
    // blocks): the write around covers the whole dirty block.
    e.set_bypass(0, true);
    e.submit(0, &req(Op::Write, 0));
    let mut landed = None; // the write around's backing write, once completed
    let mut ops = Vec::new();
    for round in 0..20 {
        // Commits run while the write is in flight: none may drop the dirty sectors
        // before the write around has completed.
        e.request_commit();
        if let Some(c) = e.poll_commit() {
            for r in c.records.iter().filter(|r| r.slot == slot) {
                assert!(
                    landed.is_some() && r.block.is_none() || r.dirty == r.valid && r.valid[0] == 0xff,
                    "round {round}: the slot journaled {r:?} before the write around landed"
                );
            }
            e.handle_commit(0, c.epoch, Ok(()));
        }
        let Some(op) = e.poll_op() else { continue };
        ops.push(op);
        e.handle_completion(0, op.handle(), Ok(()));
        if op.client && op.kind == OpKind::BackingWrite {
            landed = Some(op);
        }
        while e.poll_event().is_some() {}
    }
    let client = landed.expect("the write around ran");
    let back = ops.iter().find(|o| o.kind == OpKind::BackingWrite && o.staged).expect("the dirty sectors written back");
    assert!(back.phase < client.phase, "the old data after the new: {ops:?}");
    assert_eq!(e.lookup(0, 0), None, "invalidated");
    commit(&mut e);
    e.check_invariants().unwrap();
}

/// Persistent mode: a write around emptying a slot the journal calls part dirty, part
/// clean: its write-back of the dirty part pins the slot (the free record waits for the
/// write), so the commit the write waits for carries an intent instead — the clean
/// sectors invalid, the dirty ones still dirty. Without it the write went on while the
/// journal still called the old bytes clean.
#[test]
fn a_write_around_emptying_a_part_dirty_slot_waits_for_an_intent() {
    let (mut e, _) = block_0_journaled_clean();
    let slot = e.lookup(0, 0).expect("cached");
    // Sectors 0..4 rewritten (write-back) and journaled dirty; 4..8 stay journaled clean.
    e.submit(0, &Request { time_ns: 0, vm: 0, op: Op::Write, offset: 0, len: 4 * 512 });
    commit(&mut e);
    commit(&mut e);
    e.set_bypass(0, true);
    e.submit(0, &req(Op::Write, 0));
    // The journal's word on the slot, commit by commit, until the write around is issued.
    let mut journal = None;
    for _ in 0..20 {
        e.request_commit();
        if let Some(c) = e.poll_commit() {
            if let Some(r) = c.records.iter().find(|r| r.slot == slot) {
                journal = Some(r.clone());
            }
            e.handle_commit(0, c.epoch, Ok(()));
        }
        let Some(op) = e.poll_op() else { continue };
        if op.client && op.kind == OpKind::BackingWrite {
            let r = journal.as_ref().expect("a record of the slot before the write around");
            let clean = if r.block.is_some() { r.valid[0] & !r.dirty[0] } else { 0 };
            assert_eq!(clean, 0, "the write around went while the journal called sectors clean: {r:?}");
            assert_eq!(r.dirty[0], 0x0f, "the dirty sectors stay dirty until it lands: {r:?}");
            break;
        }
        e.handle_completion(0, op.handle(), Ok(()));
        while e.poll_event().is_some() {}
    }
    run_all(&mut e);
    commit(&mut e);
    e.check_invariants().unwrap();
}
