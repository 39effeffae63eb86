//! Paced shrinks (`Engine::set_target_paced`), step by step through the asynchronous API:
//! nothing leaves at the command, another VM's misses take the shrinking VM's clean blocks
//! first and wait for no write-back of it, its dirty blocks passed over are written back
//! by background jobs, and it ends at its target with its data on its disk. (The data
//! models of `out_of_order.rs`, `crash_consistency.rs` and `write_semantics.rs` run paced
//! targets among their random steps too.)

use cachevisor_engine::*;
use cachevisor_trace::{Op, Request};
use std::collections::HashSet;

const BLOCK: u64 = 4096;

/// Runs every op as soon as it is issued, in order; returns (ops of the request's own
/// job, background ops) seen until nothing is in flight.
fn settle(e: &mut Engine, req: Option<ReqId>) -> (Vec<DeviceOp>, Vec<DeviceOp>) {
    let (mut own, mut background) = (Vec::new(), Vec::new());
    loop {
        while let Some(ev) = e.poll_event() {
            if let Event::Reply { result, .. } = ev {
                result.expect("no failure");
            }
        }
        let Some(op) = e.poll_op() else { break };
        if Some(op.req) == req {
            own.push(op);
        } else {
            background.push(op);
        }
        e.handle_completion(0, op.handle(), Ok(()));
    }
    assert_eq!(e.in_flight(), 0);
    (own, background)
}

fn io(e: &mut Engine, vm: u32, op: Op, block: u64) -> (Vec<DeviceOp>, Vec<DeviceOp>) {
    let id = e.submit(0, &Request { time_ns: 0, vm, op, offset: block * BLOCK, len: BLOCK as u32 });
    settle(e, Some(id))
}

#[test]
fn a_paced_shrink_gives_clean_blocks_first_and_writes_dirty_ones_back_in_the_background() {
    let cfg = EngineConfig { replacement: ReplacementKind::Lru, ..EngineConfig::with_slots(8) };
    let mut e = Engine::new(cfg).unwrap();
    let mut out = Output::default();
    e.set_target(0, 8, &mut out);
    // VM 0 fills the cache: blocks 0..4 written (dirty), 4..8 read (clean).
    for b in 0..8 {
        io(&mut e, 0, if b < 4 { Op::Write } else { Op::Read }, b);
    }
    assert_eq!((e.partition(0).used, e.partition(0).dirty_blocks, e.free_slots()), (8, 4, 0));

    e.set_target_paced(0, 2);
    e.set_target(1, 6, &mut out);
    assert!(out.ops.is_empty());
    assert_eq!(e.partition(0).used, 8, "a paced shrink evicts nothing at once");
    e.check_invariants().unwrap();

    // VM 1's misses take VM 0's blocks; the clean ones go first, and no miss of VM 1 waits
    // for a write to VM 0's disk.
    let mut written_back = HashSet::new();
    for b in 0..6 {
        let (own, background) = io(&mut e, 1, Op::Read, 100 + b);
        assert!(own.iter().all(|op| op.vm == 1), "VM 1's miss ran an op for VM 0: {own:?}");
        for op in background {
            assert!(op.vm == 0, "{op:?}");
            if op.kind == OpKind::BackingWrite {
                written_back.insert(op.disk_addr / BLOCK);
            }
        }
        e.check_invariants().unwrap();
    }
    assert_eq!(e.partition(1).used, 6);
    assert_eq!(e.partition(0).used, 2, "VM 0 ends at its target");
    // Every dirty block VM 0 lost reached its disk first; the two it keeps may stay dirty.
    let kept: HashSet<u64> = (0..8).filter(|&b| e.lookup(0, b).is_some()).collect();
    for b in 0..4 {
        assert!(kept.contains(&b) || written_back.contains(&b), "dirty block {b} lost: kept {kept:?}");
    }
    // The VM's own misses above its target replace its own blocks, not others'.
    e.set_target_paced(1, 3);
    io(&mut e, 1, Op::Read, 200);
    assert_eq!((e.partition(0).used, e.partition(1).used), (2, 6));
    e.check_invariants().unwrap();
}

/// A steal that finds no clean block among the donor's next victims replaces the stealing
/// VM's own block instead of writing the donor's back on its miss's path; the donor's
/// dirty blocks are written back in the background, and the next misses take them clean.
#[test]
fn a_steal_finding_only_dirty_blocks_replaces_the_stealers_own() {
    let cfg = EngineConfig { replacement: ReplacementKind::Lru, ..EngineConfig::with_slots(8) };
    let mut e = Engine::new(cfg).unwrap();
    let mut out = Output::default();
    e.set_target(0, 6, &mut out);
    e.set_target(1, 2, &mut out);
    for b in 0..6 {
        io(&mut e, 0, Op::Write, b); // all of VM 0's blocks dirty
    }
    for b in 0..2 {
        io(&mut e, 1, Op::Read, 100 + b);
    }
    e.set_target_paced(0, 2);
    e.set_target(1, 6, &mut out);
    // VM 1's first miss: no clean block of VM 0 to take, so it replaces its own (its
    // request runs no op for VM 0); VM 0's dirty blocks go to its disk in the background.
    let (own, background) = io(&mut e, 1, Op::Read, 102);
    assert!(own.iter().all(|op| op.vm == 1), "VM 1's miss ran an op for VM 0: {own:?}");
    assert_eq!(e.partition(1).used, 2, "VM 1 replaced its own block");
    assert!(background.iter().any(|op| op.vm == 0 && op.kind == OpKind::BackingWrite), "{background:?}");
    // Now VM 0's blocks are clean: VM 1's next misses take them and it grows.
    for b in 103..107 {
        let (own, _) = io(&mut e, 1, Op::Read, b);
        assert!(own.iter().all(|op| op.vm == 1), "{own:?}");
    }
    assert_eq!((e.partition(0).used, e.partition(1).used), (2, 6));
    e.check_invariants().unwrap();
}

/// The dirty blocks a steal passed over are written back paced: one background job of
/// at most 4 blocks in flight for the donor at a time, not all at once (an HDD would
/// serve them all ahead of the donor's next miss).
#[test]
fn dirty_blocks_a_steal_passed_over_are_written_back_a_batch_at_a_time() {
    let cfg = EngineConfig { replacement: ReplacementKind::Lru, ..EngineConfig::with_slots(64) };
    let mut e = Engine::new(cfg).unwrap();
    let mut out = Output::default();
    e.set_target(0, 64, &mut out);
    // VM 0: 40 dirty blocks, the coldest, then 24 clean ones.
    for b in 0..64 {
        io(&mut e, 0, if b < 40 { Op::Write } else { Op::Read }, b);
    }
    e.set_target_paced(0, 0);
    e.set_target(1, 64, &mut out);
    // VM 1's miss takes a clean block past the 40 dirty ones, which are queued.
    let id = e.submit(0, &Request { time_ns: 0, vm: 1, op: Op::Read, offset: 1000 * BLOCK, len: BLOCK as u32 });
    let (mut most, mut written) = (0, HashSet::new());
    loop {
        let mut held = Vec::new();
        while let Some(op) = e.poll_op() {
            if op.req == id {
                e.handle_completion(0, op.handle(), Ok(()));
            } else {
                held.push(op);
            }
        }
        while e.poll_event().is_some() {}
        let writes = held.iter().filter(|op| op.kind == OpKind::BackingWrite).count();
        most = most.max(writes);
        if held.is_empty() {
            break;
        }
        for op in held {
            if op.kind == OpKind::BackingWrite {
                assert_eq!(op.vm, 0);
                written.insert(op.disk_addr / BLOCK);
            }
            e.handle_completion(0, op.handle(), Ok(()));
        }
    }
    assert_eq!(e.in_flight(), 0);
    assert_eq!(written, (0..40).collect::<HashSet<u64>>(), "every passed-over block written back once");
    assert!(most <= 4, "{most} write-backs in flight at once");
    assert_eq!(e.partition(0).dirty_blocks, 0);
    e.check_invariants().unwrap();
}

/// `set_write_policy_lazy` off write-back writes nothing back: the dirty blocks stay
/// cached and dirty, reads hit them, a write through one cleans it, an eviction writes
/// one back first, and a flush writes back the rest.
#[test]
fn a_lazy_switch_to_write_through_keeps_dirty_blocks_until_they_leave() {
    let cfg = EngineConfig { replacement: ReplacementKind::Lru, ..EngineConfig::with_slots(4) };
    let mut e = Engine::new(cfg).unwrap();
    let mut out = Output::default();
    e.set_target(0, 4, &mut out);
    for b in 0..4 {
        io(&mut e, 0, Op::Write, b);
    }
    assert!(!e.set_write_policy_lazy(0, WritePolicy::Ro), "only write-back ↔ write-through is lazy");
    assert!(e.set_write_policy_lazy(0, WritePolicy::Wt));
    assert_eq!(e.in_flight(), 0, "no device work at the switch");
    assert_eq!((e.partition(0).write_policy, e.partition(0).dirty_blocks), (WritePolicy::Wt, 4));
    // A read of a dirty block is a hit from the SSD.
    let (own, _) = io(&mut e, 0, Op::Read, 1);
    assert!(own.iter().all(|op| op.kind == OpKind::SsdRead), "{own:?}");
    // A write through block 1 writes both copies and leaves it clean.
    let (own, _) = io(&mut e, 0, Op::Write, 1);
    assert!(own.iter().any(|op| op.kind == OpKind::BackingWrite) && own.iter().any(|op| op.kind == OpKind::SsdWrite));
    assert_eq!(e.partition(0).dirty_blocks, 3);
    // A miss evicts the coldest block, 0, dirty: written back on the way.
    let (own, background) = io(&mut e, 0, Op::Read, 10);
    let wrote_0 = own.iter().chain(&background).any(|op| op.kind == OpKind::BackingWrite && op.disk_addr / BLOCK == 0);
    assert!(wrote_0, "{own:?} {background:?}");
    assert_eq!(e.partition(0).dirty_blocks, 2);
    e.flush(Some(0), &mut out);
    assert_eq!(out.ops.iter().filter(|op| op.kind == OpKind::BackingWrite).count(), 2);
    assert_eq!(e.partition(0).dirty_blocks, 0);
    e.check_invariants().unwrap();
}
