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
        e.handle_completion(0, op.id, Ok(()));
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

#[test]
fn a_rewritten_clean_block_moves_and_its_old_slot_waits_for_the_commit() {
    let mut e = Engine::new(EngineConfig { partition: PartitionMode::Static, ..EngineConfig::with_slots(8) }).unwrap();
    let mut out = Output::default();
    e.set_target(0, 6, &mut out);
    e.set_persistent(1);
    // Block 0 read into the cache and journaled clean.
    e.submit(0, &req(Op::Read, 0));
    run_all(&mut e);
    commit(&mut e);
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
