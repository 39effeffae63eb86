//! Write-policy semantics checked by executing the engine's device operations against a
//! versioned model of the SSD and the backing disks: every sector carries the version of
//! the client write that produced it. No read may return data older than the last write,
//! the SSD never serves a sector that belongs to another block, and after a flush the
//! backing disks hold every last write. Structural invariants (slot ownership, targets
//! after shrinks, dirty counts) are checked after every step.

mod model_harness;
use cachevisor_engine::*;
use cachevisor_trace::{Op, Request};
use model_harness::cases;
use proptest::prelude::*;
use std::collections::HashMap;

const BLOCK: u64 = 4096;

/// The local cache store's layout (every engine here has only that store).
static LAYOUT: std::sync::LazyLock<StoreLayout> =
    std::sync::LazyLock::new(|| EngineConfig { block_size: BLOCK, ..EngineConfig::with_slots(1) }.layout());
const SECTORS_PER_DISK: u64 = 64; // 8 blocks per VM keeps collisions frequent

#[derive(Debug, Clone)]
enum Step {
    Io {
        vm: u32,
        write: bool,
        sector: u64,
        count: u64,
    },
    Target {
        vm: u32,
        slots: u64,
    },
    PacedTarget {
        vm: u32,
        slots: u64,
    },
    Policy {
        vm: u32,
        policy: WritePolicy,
    },
    /// `set_write_policy_lazy`: leaving write-back keeps the dirty blocks.
    LazyPolicy {
        vm: u32,
        policy: WritePolicy,
    },
    Flush {
        vm: Option<u32>,
    },
    Drop {
        vm: u32,
    },
    Clean {
        free: u64,
    },
    Cutoff {
        vm: u32,
        bytes: u64,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (0u32..3, any::<bool>(), 0..SECTORS_PER_DISK, 1u64..12).prop_map(|(vm, write, sector, count)| {
            Step::Io { vm, write, sector, count: count.min(SECTORS_PER_DISK - sector) }
        }),
        1 => (0u32..3, 0u64..6).prop_map(|(vm, slots)| Step::Target { vm, slots }),
        1 => (0u32..3, 0u64..6).prop_map(|(vm, slots)| Step::PacedTarget { vm, slots }),
        1 => (0u32..3, prop::sample::select(WritePolicy::ALL.to_vec())).prop_map(|(vm, policy)| Step::Policy { vm, policy }),
        1 => (0u32..3, prop::sample::select(WritePolicy::ALL.to_vec())).prop_map(|(vm, policy)| Step::LazyPolicy { vm, policy }),
        1 => prop::option::of(0u32..3).prop_map(|vm| Step::Flush { vm }),
        1 => (0u32..3).prop_map(|vm| Step::Drop { vm }),
        1 => (0u64..9).prop_map(|free| Step::Clean { free }),
        1 => (0u32..3, prop::sample::select(vec![0u64, 2048, 4096, 8192])).prop_map(|(vm, bytes)| Step::Cutoff { vm, bytes }),
    ]
}

/// The world outside the engine: SSD sectors tagged with the disk sector they hold.
#[derive(Default)]
struct World {
    ssd: HashMap<u64, (u32, u64, u64)>,
    backing: HashMap<(u32, u64), u64>,
    truth: HashMap<(u32, u64), u64>,
}

impl World {
    /// Executes `ops` in order. `client` is the version a write request carries for its
    /// own sectors. Returns what read ops delivered per (vm, disk sector).
    fn execute(
        &mut self,
        ops: &[DeviceOp],
        client: Option<(u32, u64, u64, u64)>,
    ) -> Result<HashMap<(u32, u64), u64>, String> {
        let mut read: HashMap<(u32, u64), u64> = HashMap::new();
        let mut staged: HashMap<(u32, u64), u64> = HashMap::new();
        for op in ops {
            let n = op.len as u64 / 512;
            let (d0, s0) = (op.disk_addr / 512, if op.kind.is_ssd() { LAYOUT.offset(op) / 512 } else { 0 });
            for i in 0..n {
                let key = (op.vm, d0 + i);
                match op.kind {
                    OpKind::SsdRead => {
                        let (vm, ds, v) =
                            *self.ssd.get(&(s0 + i)).ok_or(format!("{op:?} reads a never-written SSD sector"))?;
                        if (vm, ds) != key {
                            return Err(format!("{op:?}: SSD sector holds vm {vm} sector {ds}, not {key:?}"));
                        }
                        read.insert(key, v);
                        if op.staged {
                            staged.insert(key, v);
                        }
                    }
                    OpKind::BackingRead => {
                        let v = self.backing.get(&key).copied().unwrap_or(0);
                        read.insert(key, v);
                        if op.staged {
                            staged.insert(key, v);
                        }
                    }
                    OpKind::SsdWrite | OpKind::BackingWrite => {
                        if op.staged
                            && !ops.iter().any(|o| Some(o.id) == op.source_id() && o.staged && !o.kind.is_write())
                        {
                            return Err(format!("{op:?}: a staged write whose source is not a staged read"));
                        }
                        let v = match (op.staged, staged.get(&key), client) {
                            (true, Some(&v), _) => v,
                            (false, _, Some((vm, lo, hi, v))) if vm == op.vm && (lo..hi).contains(&(d0 + i)) => v,
                            _ => return Err(format!("{op:?} writes sector {key:?} with no data source")),
                        };
                        if op.kind == OpKind::SsdWrite {
                            self.ssd.insert(s0 + i, (op.vm, d0 + i, v));
                        } else {
                            self.backing.insert(key, v);
                        }
                    }
                    OpKind::RamRead | OpKind::RamWrite => return Err(format!("{op:?}: no RAM tier here")),
                }
            }
        }
        Ok(read)
    }

    fn check_backing(&self, vm: Option<u32>) -> Result<(), String> {
        for (&(v, s), &want) in &self.truth {
            if vm.is_none_or(|x| x == v) && self.backing.get(&(v, s)).copied().unwrap_or(0) != want {
                return Err(format!("backing of vm {v} sector {s} is stale after flush"));
            }
        }
        Ok(())
    }
}

fn run(steps: &[Step], partition: PartitionMode, fill: FillMode, kind: ReplacementKind) -> Result<(), String> {
    let cfg = EngineConfig { partition, fill, replacement: kind, ..EngineConfig::with_slots(8) };
    let mut e = Engine::new(cfg).unwrap();
    e.track_changes(true);
    let mut out = Output::default();
    let mut w = World::default();
    // Every slot whose key or sector bits change must be reported (persistence relies on it).
    let snapshot = |e: &Engine| -> Vec<SlotView> {
        (0..e.slot_count() as u32).map(|s| (e.slot_block(s), (0..8).map(|i| e.sector_state(s, i)).collect())).collect()
    };
    let mut changed = Vec::new();
    for vm in 0..3 {
        e.set_target(vm, 3, &mut out);
    }
    let mut version = 0;
    for (i, st) in steps.iter().enumerate() {
        let ctx = |m: String| format!("step {i} {st:?}: {m}");
        let before = snapshot(&e);
        e.take_changed(&mut changed);
        changed.clear();
        match *st {
            Step::Io { vm, write, sector, count } => {
                let req = Request {
                    time_ns: i as u64,
                    vm,
                    op: if write { Op::Write } else { Op::Read },
                    offset: sector * 512,
                    len: (count * 512) as u32,
                };
                e.access(i as u64, &req, &mut out);
                let blocks = (sector * 512 / BLOCK..=((sector + count) * 512 - 1) / BLOCK).count();
                if out.blocks.len() != blocks {
                    return Err(ctx(format!("{} outcomes for {blocks} blocks", out.blocks.len())));
                }
                if write {
                    version += 1;
                    w.execute(&out.ops, Some((vm, sector, sector + count, version))).map_err(ctx)?;
                    for s in sector..sector + count {
                        w.truth.insert((vm, s), version);
                    }
                } else {
                    let got = w.execute(&out.ops, None).map_err(ctx)?;
                    for s in sector..sector + count {
                        let want = w.truth.get(&(vm, s)).copied().unwrap_or(0);
                        match got.get(&(vm, s)) {
                            Some(&v) if v == want => {}
                            Some(&v) => return Err(ctx(format!("sector {s} read version {v}, last write was {want}"))),
                            None => return Err(ctx(format!("sector {s} was not read by any op"))),
                        }
                    }
                }
            }
            Step::Target { vm, slots } => {
                e.set_target(vm, slots, &mut out);
                w.execute(&out.ops, None).map_err(ctx)?;
                if partition == PartitionMode::Static && e.partition(vm).used > slots {
                    return Err(ctx("VM above its target after shrink".into()));
                }
            }
            Step::PacedTarget { vm, slots } => e.set_target_paced(vm, slots),
            Step::Policy { vm, policy } => {
                let was_wb = e.partition(vm).write_policy == WritePolicy::Wb;
                e.set_write_policy(vm, policy, &mut out);
                w.execute(&out.ops, None).map_err(ctx)?;
                if was_wb && policy != WritePolicy::Wb {
                    if e.partition(vm).dirty_blocks != 0 {
                        return Err(ctx("dirty blocks left after leaving write-back".into()));
                    }
                    w.check_backing(Some(vm)).map_err(ctx)?;
                }
            }
            Step::LazyPolicy { vm, policy } => {
                let (dirty, was) = (e.partition(vm).dirty_blocks, e.partition(vm).write_policy);
                let done = e.set_write_policy_lazy(vm, policy);
                let lazy = |p: WritePolicy| matches!(p, WritePolicy::Wb | WritePolicy::Wt);
                if done != (lazy(policy) && lazy(was)) || e.partition(vm).dirty_blocks != dirty {
                    return Err(ctx(format!(
                        "lazy change {was} → {policy}: done {done}, dirty {dirty} → {}",
                        e.partition(vm).dirty_blocks
                    )));
                }
            }
            Step::Flush { vm } => {
                e.flush(vm, &mut out);
                w.execute(&out.ops, None).map_err(ctx)?;
                w.check_backing(vm).map_err(ctx)?;
            }
            Step::Drop { vm } => {
                e.drop_vm(vm, &mut out);
                w.execute(&out.ops, None).map_err(ctx)?;
                w.check_backing(Some(vm)).map_err(ctx)?;
                if e.partition(vm).used != 0 {
                    return Err(ctx("dropped VM still holds slots".into()));
                }
                e.set_target(vm, 2, &mut out);
            }
            Step::Cutoff { vm, bytes } => e.set_sequential_cutoff(vm, bytes),
            Step::Clean { free } => {
                let before = e.free_slots();
                let n = e.clean(free, &mut out);
                w.execute(&out.ops, None).map_err(ctx)?;
                let active = kind == ReplacementKind::Clock && partition == PartitionMode::Static;
                if e.free_slots() != before + n || (active && e.free_slots() < free.min(8)) || (!active && n != 0) {
                    return Err(ctx(format!("cleaner reclaimed {n}: free {before} → {}", e.free_slots())));
                }
            }
        }
        e.check_invariants().map_err(ctx)?;
        e.take_changed(&mut changed);
        for (s, (b, a)) in before.iter().zip(snapshot(&e)).enumerate() {
            if *b != a && !changed.contains(&(s as u32)) {
                return Err(ctx(format!("slot {s} changed without being reported")));
            }
        }
    }
    e.flush(None, &mut out);
    w.execute(&out.ops, None)?;
    w.check_backing(None)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(200)))]

    #[test]
    fn reads_never_return_stale_data(
        steps in prop::collection::vec(step(), 1..120),
        shared in any::<bool>(),
        fill_block in any::<bool>(),
        kind in prop::sample::select(ReplacementKind::ALL.to_vec()),
    ) {
        let partition = if shared { PartitionMode::Shared } else { PartitionMode::Static };
        let fill = if fill_block { FillMode::Block } else { FillMode::Request };
        run(&steps, partition, fill, kind).map_err(TestCaseError::fail)?;
    }
}

#[test]
fn unaligned_write_passes_through_after_writing_back_dirty_sectors() {
    let mut e = Engine::new(EngineConfig::with_slots(4)).unwrap();
    let mut out = Output::default();
    e.set_target(0, 4, &mut out);
    e.access(0, &Request { time_ns: 0, vm: 0, op: Op::Write, offset: 0, len: 4096 }, &mut out);
    assert_eq!(e.partition(0).dirty_blocks, 1);
    e.access(0, &Request { time_ns: 0, vm: 0, op: Op::Write, offset: 100, len: 10 }, &mut out);
    let kinds: Vec<_> = out.ops.iter().map(|o| (o.kind, o.len, o.phase)).collect();
    assert_eq!(kinds, [(OpKind::SsdRead, 512, 0), (OpKind::BackingWrite, 512, 1), (OpKind::BackingWrite, 10, 2)]);
    assert!(out.blocks[0].bypassed);
    // Sector 0 is invalid now; the other seven stay cached and dirty.
    let s = e.lookup(0, 0).unwrap();
    assert_eq!(e.sector_state(s, 0), (false, false));
    assert_eq!(e.sector_state(s, 1), (true, true));
    e.check_invariants().unwrap();
}

#[test]
fn read_only_policy_sends_writes_around_and_invalidates() {
    let mut e = Engine::new(EngineConfig { write_policy: WritePolicy::Ro, ..EngineConfig::with_slots(4) }).unwrap();
    let mut out = Output::default();
    e.set_target(0, 4, &mut out);
    let rd = Request { time_ns: 0, vm: 0, op: Op::Read, offset: 0, len: 4096 };
    e.access(0, &rd, &mut out);
    assert!(out.blocks[0].inserted);
    e.access(0, &Request { op: Op::Write, ..rd }, &mut out);
    assert!(out.ops.iter().all(|o| o.kind == OpKind::BackingWrite));
    assert_eq!(e.lookup(0, 0), None, "fully overwritten block is invalidated");
    e.access(0, &Request { op: Op::Write, offset: 8192, ..rd }, &mut out);
    assert_eq!(e.partition(0).used, 0, "write misses are not allocated");
}

/// A slot's block and its (valid, dirty) sectors.
type SlotView = (Option<(u32, u64)>, Vec<(bool, bool)>);

#[test]
fn a_request_that_evicts_its_own_later_blocks_writes_them_after_their_write_back() {
    // FIFO partition of 4 holding dirty blocks 1..=4 (1 oldest); a write of blocks 0..=4:
    // block 0 evicts block 1, block 1 (now a miss) evicts block 2, and so on.
    let cfg = EngineConfig { replacement: ReplacementKind::Fifo, ..EngineConfig::with_slots(4) };
    let mut e = Engine::new(cfg).unwrap();
    let mut out = Output::default();
    e.set_target(0, 4, &mut out);
    for b in 1..=4u64 {
        e.access(0, &Request { time_ns: 0, vm: 0, op: Op::Write, offset: b * BLOCK, len: BLOCK as u32 }, &mut out);
    }
    e.access(0, &Request { time_ns: 0, vm: 0, op: Op::Write, offset: 0, len: 5 * BLOCK as u32 }, &mut out);
    for b in 1..=4u64 {
        let at = |staged: bool| {
            out.ops
                .iter()
                .filter(|o| o.disk_addr / BLOCK == b && o.staged == staged && o.kind.is_write())
                .map(|o| o.phase)
                .collect::<Vec<_>>()
        };
        let (writeback, client) = (at(true), at(false));
        assert!(!writeback.is_empty() && !client.is_empty(), "block {b}: {:?}", out.ops);
        assert!(client.iter().all(|c| writeback.iter().all(|w| c > w)), "block {b}: {writeback:?} then {client:?}");
    }
    e.check_invariants().unwrap();
}
