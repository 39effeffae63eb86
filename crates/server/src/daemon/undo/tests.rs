//! `undo` against a versioned model of the devices: random requests and background
//! write-backs run through the engine, their ops executed on a model SSD and backing store
//! (every sector tagged with the block it belongs to and the write version it holds), with
//! a failure injected at a random op (the failed op writing nothing or all of its data).
//! After each step, every sector of the disk as a reader would see it — from the cache
//! where the engine says it is valid, else from the backing store — must be the block's own
//! data, in a version a client may see: the last acknowledged write, or one of the writes
//! that failed since (their ranges are undefined). The same with `undo` disabled loses
//! acknowledged data (checked below), so the model can fail.

use super::*;
use cachevisor_engine::{EngineConfig, PartitionMode, ReplacementKind, WritePolicy};
use cachevisor_trace::{Op, Request};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use std::collections::{BTreeSet, HashMap};

const BS: u64 = 2048;
const SPB: u64 = BS / 512;
const SLOTS: u64 = 6;
const BLOCKS: u64 = 12;

/// One sector's content: the block it belongs to and the version written.
type Tag = (u64, u64);

struct Model {
    ssd: Vec<Vec<Option<Tag>>>,
    backing: HashMap<u64, u64>,
    /// Versions a reader may see, per disk sector.
    allowed: Vec<BTreeSet<u64>>,
}

#[derive(Debug, Clone)]
enum Step {
    /// Read or write `sectors` sectors from sector `at`; fail at op `fail` (if any) with
    /// the failed op writing its data (`torn`) or not.
    Io { write: bool, at: u64, sectors: u64, fail: Option<prop::sample::Index>, torn: bool },
    /// Write back one dirty block.
    Destage { pick: prop::sample::Index, fail: Option<prop::sample::Index>, sync_fails: bool },
    /// Shrink the partition to `to` slots (evicting), then grow it back.
    Shrink { to: u64, fail: Option<prop::sample::Index> },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (any::<bool>(), 0..BLOCKS * SPB, 1..=2 * SPB, prop::option::weighted(0.3, any::<prop::sample::Index>()), any::<bool>())
            .prop_map(|(write, at, sectors, fail, torn)| Step::Io { write, at, sectors: sectors.min(BLOCKS * SPB - at), fail, torn }),
        2 => (any::<prop::sample::Index>(), prop::option::weighted(0.5, any::<prop::sample::Index>()), prop::bool::weighted(0.2))
            .prop_map(|(pick, fail, sync_fails)| Step::Destage { pick, fail, sync_fails }),
        1 => (0..SLOTS, prop::option::weighted(0.5, any::<prop::sample::Index>())).prop_map(|(to, fail)| Step::Shrink { to, fail }),
    ]
}

impl Model {
    fn new() -> Model {
        Model {
            ssd: vec![vec![None; SPB as usize]; SLOTS as usize],
            backing: HashMap::new(),
            allowed: vec![BTreeSet::from([0]); (BLOCKS * SPB) as usize],
        }
    }

    /// Executes `ops` in order up to op `fail` (which fails, writing its data if `torn`);
    /// `version` is a client write's; returns what a client read got per sector and the
    /// index of the failed op.
    fn execute(
        &mut self,
        ops: &[DeviceOp],
        version: u64,
        fail: Option<usize>,
        torn: bool,
    ) -> (HashMap<u64, Tag>, Option<usize>) {
        let mut staging: Vec<(u64, Vec<Tag>)> = Vec::new();
        let mut got = HashMap::new();
        for (i, op) in ops.iter().enumerate() {
            let first = op.disk_addr / 512;
            let n = (op.len / 512) as u64;
            let failed = fail == Some(i);
            let ssd_at = |k: u64| ((op.ssd_offset(BS) / BS) as usize, ((op.ssd_offset(BS) % BS) / 512 + k) as usize);
            if op.kind.is_write() {
                if failed && !torn {
                    return (got, Some(i));
                }
                let data: Vec<Tag> = if op.staged {
                    let (start, buf) = staging
                        .iter()
                        .rev()
                        .find(|(s, b)| *s <= first && first + n <= s + b.len() as u64)
                        .expect("a staged read before a staged write");
                    buf[(first - start) as usize..(first - start + n) as usize].to_vec()
                } else {
                    (0..n).map(|k| ((first + k) / SPB, version)).collect()
                };
                for (k, t) in data.into_iter().enumerate() {
                    if op.kind == OpKind::SsdWrite {
                        let (s, j) = ssd_at(k as u64);
                        self.ssd[s][j] = Some(t);
                    } else {
                        self.backing.insert(first + k as u64, t.1);
                    }
                }
            } else {
                if failed {
                    return (got, Some(i));
                }
                let data: Vec<Tag> = (0..n)
                    .map(|k| match op.kind {
                        OpKind::SsdRead => {
                            let (s, j) = ssd_at(k);
                            self.ssd[s][j].unwrap_or((u64::MAX, u64::MAX))
                        }
                        _ => ((first + k) / SPB, self.backing.get(&(first + k)).copied().unwrap_or(0)),
                    })
                    .collect();
                if op.staged {
                    staging.push((first, data.clone()));
                }
                for (k, t) in data.into_iter().enumerate() {
                    got.insert(first + k as u64, t);
                }
            }
            if failed {
                return (got, Some(i));
            }
        }
        (got, None)
    }

    /// Every sector as a reader would see it is its block's, in an allowed version.
    fn check(&self, e: &Engine, when: &str) -> Result<(), TestCaseError> {
        for sector in 0..BLOCKS * SPB {
            let (b, i) = (sector / SPB, (sector % SPB) as u32);
            let seen = match e.lookup(0, b).filter(|&s| e.sector_state(s, i).0) {
                Some(slot) => self.ssd[slot as usize][i as usize].unwrap_or((u64::MAX, u64::MAX)),
                None => (b, self.backing.get(&sector).copied().unwrap_or(0)),
            };
            prop_assert_eq!(seen.0, b, "{}: sector {} reads another block's data", when, sector);
            prop_assert!(
                self.allowed[sector as usize].contains(&seen.1),
                "{}: sector {} reads version {}, allowed {:?}",
                when,
                sector,
                seen.1,
                self.allowed[sector as usize]
            );
        }
        e.check_invariants().map_err(TestCaseError::fail)?;
        Ok(())
    }
}

fn engine() -> Engine {
    let cfg = EngineConfig {
        block_size: BS,
        slots: SLOTS,
        partition: PartitionMode::Static,
        replacement: ReplacementKind::Lru,
        write_policy: WritePolicy::Wb,
        fill: cachevisor_engine::FillMode::Block,
        track_last_access: false,
    };
    let mut e = Engine::new(cfg).unwrap();
    e.set_target(0, SLOTS, &mut Output::default());
    e
}

/// Runs `steps`; with `fix` false, failures are not undone (to show the model catches it).
fn run(steps: &[Step], fix: bool) -> Result<(), TestCaseError> {
    let mut e = engine();
    let mut m = Model::new();
    let mut out = Output::default();
    let undo_if = |e: &mut Engine, ops: &[DeviceOp], at: usize, pre: &HashMap<u32, Pre>, w: Option<WriteRange>| {
        if fix {
            undo(e, ops, at, pre, w);
        }
    };
    for (n, st) in steps.iter().enumerate() {
        let version = n as u64 + 1;
        match st {
            Step::Io { write, at, sectors, fail, torn } => {
                let (offset, len) = (at * 512, sectors * 512);
                let req = Request {
                    time_ns: 0,
                    vm: 0,
                    op: if *write { Op::Write } else { Op::Read },
                    offset,
                    len: len as u32,
                };
                let blocks = offset / BS..(offset + len).div_ceil(BS);
                let pre: HashMap<u32, Pre> = if *write {
                    blocks
                        .clone()
                        .filter_map(|b| e.lookup(0, b))
                        .map(|s| (s, Pre::State(crate::persist::SlotState::of(&e, s))))
                        .collect()
                } else {
                    HashMap::new()
                };
                e.access(0, &req, &mut out);
                let fail_at = fail.as_ref().filter(|_| !out.ops.is_empty()).map(|i| i.index(out.ops.len()));
                let (got, failed) = m.execute(&out.ops, version, fail_at, *torn);
                match failed {
                    Some(op_at) => {
                        undo_if(&mut e, &out.ops, op_at, &pre, write.then_some((0, offset, len)));
                        if *write {
                            (*at..at + sectors).for_each(|s| {
                                m.allowed[s as usize].insert(version);
                            });
                        }
                    }
                    None if *write => {
                        (*at..at + sectors).for_each(|s| m.allowed[s as usize] = BTreeSet::from([version]))
                    }
                    None => {
                        for s in *at..at + sectors {
                            let t = got.get(&s).copied().unwrap_or((u64::MAX, u64::MAX));
                            prop_assert!(
                                t.0 == s / SPB && m.allowed[s as usize].contains(&t.1),
                                "step {}: read of sector {} got {:?}, allowed {:?}",
                                n,
                                s,
                                t,
                                m.allowed[s as usize]
                            );
                        }
                    }
                }
            }
            Step::Destage { pick, fail, sync_fails } => {
                let dirty = e.dirty_batch(Some(0), &mut 0, 64);
                if dirty.is_empty() {
                    continue;
                }
                let key = dirty[pick.index(dirty.len())];
                e.destage_block(0, cachevisor_engine::slot_table::key_block(key), &mut out);
                let fail_at = fail.as_ref().filter(|_| !out.ops.is_empty()).map(|i| i.index(out.ops.len()));
                match m.execute(&out.ops, version, fail_at, false).1 {
                    Some(at) => undo_if(&mut e, &out.ops, at, &HashMap::new(), None),
                    None if *sync_fails => undo_if(&mut e, &out.ops, out.ops.len(), &HashMap::new(), None),
                    None => {}
                }
            }
            Step::Shrink { to, fail } => {
                e.set_target(0, *to, &mut out);
                let fail_at = fail.as_ref().filter(|_| !out.ops.is_empty()).map(|i| i.index(out.ops.len()));
                if let Some(at) = m.execute(&out.ops, version, fail_at, false).1 {
                    undo_if(&mut e, &out.ops, at, &HashMap::new(), None);
                }
                e.set_target(0, SLOTS, &mut out);
            }
        }
        m.check(&e, &format!("after step {n} {st:?}"))?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn failed_ops_never_lose_or_mix_acknowledged_data(steps in prop::collection::vec(step(), 1..40)) {
        run(&steps, true)?;
    }
}

#[test]
fn without_undo_the_model_sees_data_lost() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 400,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let lost = (0..400).any(|_| {
        let steps = prop::collection::vec(step(), 1..40).new_tree(&mut runner).unwrap().current();
        run(&steps, false).is_err()
    });
    assert!(lost, "the model never caught a lost write with undo disabled");
}
