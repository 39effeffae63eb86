//! Cache other nodes lend (ELICA's remote cache): a VM's remote share, ELICA-Traffic's
//! choice of local or lent slots, and VMs with no share kept off lent slots.

use cachevisor_engine::*;
use cachevisor_trace::{Op, Request};

const BS: u64 = 4096;

/// 4 local slots and 4 lent by node 1.
fn engine() -> Engine {
    let remote = vec![StoreSpec::lent(1, 4)];
    Engine::new(EngineConfig { stores: remote, ..EngineConfig::with_slots(4) }).unwrap()
}

fn write(e: &mut Engine, vm: u32, block: u64, len: u64) -> Vec<DeviceOp> {
    let mut out = Output::default();
    let req = Request { time_ns: 0, vm, op: Op::Write, offset: block * BS, len: len as u32 };
    e.access(0, &req, &mut out);
    out.ops.clone()
}

fn remote_slots(ops: &[DeviceOp]) -> usize {
    ops.iter().filter(|o| o.kind.is_ssd() && matches!(o.loc, Location::Cache(1))).count()
}

#[test]
fn random_blocks_take_the_remote_share_first_then_local() {
    let mut e = engine();
    let mut out = Output::default();
    e.set_target(0, 6, &mut out);
    e.set_remote_target(0, 3);
    // Scattered single-block writes: the remote share first (ELICA-Traffic: random → lent).
    let lent: Vec<usize> = [0u64, 10, 20, 30, 40, 50].iter().map(|&b| remote_slots(&write(&mut e, 0, b, BS))).collect();
    assert_eq!(lent, [1, 1, 1, 0, 0, 0], "three lent, then local once the share is used");
    let p = e.partition(0);
    assert_eq!((p.used, p.remote_used, p.remote_target), (6, 3, 3));
    e.check_invariants().unwrap();
}

#[test]
fn a_sequential_run_takes_local_slots() {
    let mut e = engine();
    let mut out = Output::default();
    e.set_target(0, 8, &mut out);
    e.set_remote_target(0, 4);
    // 64 KiB as 16 contiguous 4 KiB writes: below the threshold a run is not recognized
    // (lent slots), from 64 KiB on it is sequential (local) — at most the 4 local slots.
    let ops: Vec<Vec<DeviceOp>> = (0..16).map(|b| write(&mut e, 0, 100 + b, BS)).collect();
    let lent: Vec<usize> = ops.iter().map(|o| remote_slots(o)).collect();
    assert_eq!(&lent[..4], [1, 1, 1, 1], "the run's first blocks are random");
    let p = e.partition(0);
    assert_eq!((p.used, p.remote_used), (8, 4));
    // One 64 KiB write is sequential at once: a fresh engine puts its blocks local first.
    let mut e = engine();
    e.set_target(0, 8, &mut out);
    e.set_remote_target(0, 4);
    let ops = write(&mut e, 0, 0, 64 << 10);
    let local = ops.iter().filter(|o| o.kind.is_ssd() && o.loc == Location::Cache(0)).count();
    assert_eq!(local, 4, "the 4 local slots first, the rest lent");
    assert_eq!(remote_slots(&ops), 4);
    e.check_invariants().unwrap();
}

#[test]
fn at_a_full_partition_turnover_keeps_sequential_data_local_and_random_data_lent() {
    for turnover in [false, true] {
        // 16 local slots and 4 lent; VM 0 holds all 20, 4 of them lent.
        let remote = vec![StoreSpec::lent(1, 4)];
        let mut e = Engine::new(EngineConfig { stores: remote, ..EngineConfig::with_slots(16) }).unwrap();
        e.set_traffic_turnover(turnover);
        let mut out = Output::default();
        e.set_target(0, 20, &mut out);
        e.set_remote_target(0, 4);
        // Random blocks fill the lent share, a sequential run (64 KiB) the local one: in LRU
        // order the lent blocks are the coldest.
        for b in [0u64, 10, 20, 30] {
            write(&mut e, 0, b, BS);
        }
        write(&mut e, 0, 100, 16 * BS);
        assert_eq!((e.partition(0).used, e.partition(0).remote_used), (20, 4));
        // Full: a new sequential run.
        write(&mut e, 0, 200, 16 * BS);
        let p = e.partition(0);
        assert_eq!((p.used, p.remote_used), (20, 4), "shares kept");
        let random_kept = [0u64, 10, 20, 30].iter().filter(|&&b| e.lookup(0, b).is_some()).count();
        if turnover {
            // Among its next 8 victims there is always a local one: the run replaced the
            // old run's local blocks and left the random ones lent.
            assert_eq!(random_kept, 4, "turnover: the run stays local");
            // A random miss replaces a lent block, though local ones are as cold.
            write(&mut e, 0, 500, BS);
            let kept = [0u64, 10, 20, 30].iter().filter(|&&b| e.lookup(0, b).is_some()).count();
            assert_eq!(kept, 3);
        } else {
            assert_eq!(random_kept, 0, "the policy's victims: the lent random blocks first");
        }
        e.check_invariants().unwrap();
    }
}

#[test]
fn a_vm_with_no_remote_share_never_takes_lent_slots() {
    let mut e = engine();
    let mut out = Output::default();
    e.set_target(0, 4, &mut out);
    e.set_target(1, 4, &mut out);
    e.set_remote_target(0, 4);
    for b in 0..3 {
        write(&mut e, 1, b * 10, BS); // VM 1: three local slots
    }
    for b in 0..4 {
        write(&mut e, 0, b * 10, BS); // VM 0: its four lent slots
    }
    // VM 1's fourth block: one local slot left, then its own blocks are replaced — the
    // free lent slots stay free.
    for b in 3..8 {
        assert_eq!(remote_slots(&write(&mut e, 1, b * 10, BS)), 0);
    }
    let p1 = e.partition(1);
    assert_eq!((p1.used, p1.remote_used), (4, 0));
    assert_eq!(e.partition(0).remote_used, 4);
    e.check_invariants().unwrap();
}

#[test]
fn shares_by_lender_keep_each_vm_in_its_lenders_regions() {
    // 2 local slots; node 1 lends 3, node 5 lends 3.
    let remote = vec![StoreSpec::lent(1, 3), StoreSpec::lent(5, 3)];
    let mut e = Engine::new(EngineConfig { stores: remote, ..EngineConfig::with_slots(2) }).unwrap();
    let mut out = Output::default();
    e.set_target(0, 4, &mut out);
    e.set_target(1, 3, &mut out);
    e.set_remote_shares(0, &[(5, 2)]).unwrap(); // two from node 5, two local
    e.set_remote_shares(1, &[(1, 2), (5, 1)]).unwrap(); // all three lent
    let lender =
        |ops: &[DeviceOp]| -> Vec<Location> { ops.iter().filter(|o| o.kind.is_ssd()).map(|o| o.loc).collect() };
    let mut seen0 = Vec::new();
    for b in 0..4 {
        seen0.extend(lender(&write(&mut e, 0, b * 10, BS)));
    }
    let mut seen1 = Vec::new();
    for b in 0..3 {
        seen1.extend(lender(&write(&mut e, 1, b * 10, BS)));
    }
    let count = |v: &[Location], l: Location| v.iter().filter(|&&x| x == l).count();
    assert_eq!(count(&seen0, Location::Cache(2)), 2, "{seen0:?}");
    assert_eq!(count(&seen0, Location::Cache(0)), 2);
    assert_eq!(count(&seen0, Location::Cache(1)), 0, "VM 0 has no share of node 1's region");
    assert_eq!(count(&seen1, Location::Cache(1)), 2, "{seen1:?}");
    assert_eq!(count(&seen1, Location::Cache(2)), 1);
    let (p0, p1) = (e.partition(0), e.partition(1));
    assert_eq!((p0.remote_target, p0.remote_used, p1.remote_target, p1.remote_used), (2, 2, 3, 3));
    e.check_invariants().unwrap();
    assert!(e.set_remote_shares(0, &[(9, 1)]).unwrap_err().contains("node 9"));
}

/// One SSD for a lender's own VMs and its borrowers (the cluster simulator's use): caps on
/// the local store and on a lent region stop new blocks at the cap; they replace their
/// own instead.
#[test]
fn local_and_region_caps_hold_new_blocks_back() {
    let mut e = engine();
    let mut out = Output::default();
    e.set_target(0, 8, &mut out);
    e.set_remote_target(0, 4);
    e.set_local_limit(2);
    e.set_region_limit(1, 1);
    for b in 0..8 {
        write(&mut e, 0, b * 10, BS);
    }
    assert_eq!((e.used_local(), e.used_in_region(1)), (2, 1), "capped: 2 local, 1 lent");
    assert_eq!(e.partition(0).used, 3, "later misses replaced the VM's own blocks");
    assert_eq!(e.region_shortfall(1), 3, "three lent slots of its share still lacking");
    e.set_region_limit(1, u64::MAX);
    write(&mut e, 0, 100, BS);
    assert_eq!(e.used_in_region(1), 2, "the cap lifted, the next miss takes a lent slot");
    e.check_invariants().unwrap();
}

/// A lender gives back what its own VMs hold above their paced targets: clean blocks
/// first (dropped), then at most the dirty budget, each written back first.
#[test]
fn give_back_frees_clean_blocks_first_and_caps_dirty_ones() {
    let mut e = Engine::new(EngineConfig::with_slots(8)).unwrap();
    let mut out = Output::default();
    e.set_target(0, 8, &mut out);
    for b in 0..4 {
        write(&mut e, 0, b, BS); // dirty (write-back)
    }
    for b in 4..8 {
        let mut out = Output::default();
        e.access(0, &Request { time_ns: 0, vm: 0, op: Op::Read, offset: b * BS, len: BS as u32 }, &mut out);
    }
    e.set_target_paced(0, 2);
    let mut out = Output::default();
    assert_eq!(e.give_back(5, 1, &mut out), 5, "four clean and one dirty");
    assert_eq!(out.ops.iter().filter(|o| o.kind == OpKind::BackingWrite).count(), 1, "one write-back");
    assert_eq!((e.partition(0).used, e.partition(0).dirty_blocks, e.free_slots()), (3, 3, 5));
    let mut out = Output::default();
    assert_eq!(e.give_back(5, 0, &mut out), 0, "only dirty ones left, no budget");
    assert!(out.ops.is_empty());
    e.check_invariants().unwrap();
}
