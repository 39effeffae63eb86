//! The block manager driven by random inputs against a model of the region's bytes: every
//! unit of every block carries a tag (which vSSD incarnation, logical block, unit and
//! write version put it there, or zero). Ops run in random order and may fail, I/O stays
//! in flight across resizes (its write lands when it ends), guests answer deflates in
//! parts, with bogus messages, or not at all, and the process crashes at random (the
//! manager rebuilt from the committed records only). Checked after every step:
//! - no block that serves a vSSD holds bytes another vSSD (or another logical block)
//!   wrote — whatever the order of events;
//! - every read returns the last acknowledged write of that unit, or zeros for a block
//!   never written since it was handed out; released blocks that come back after a crash
//!   hold only their own vSSD's bytes;
//! - a refused message changes nothing; the durable state's invariants hold;
//! - once everything settles, each running vSSD holds its target when the region can.

use cachevisor_vssd::io::Io;
use cachevisor_vssd::manager::Counters;
use cachevisor_vssd::{BlockManager, Config, Event, Geometry, Op, OpKind, Record, State, VssdId};
use proptest::prelude::*;
use std::collections::HashMap;

const UNITS: u64 = 4;
const UNIT: u64 = 4096;

/// What a unit of the region holds: zeros, or (incarnation, lbn, unit, version).
type Tag = Option<(u32, u32, u64, u64)>;

/// A request in flight, with what a write puts where when it ends.
type InFlight = (Io, Option<Vec<(u64, Tag)>>);

#[derive(Debug, Clone)]
enum Step {
    Register {
        name: u8,
        max: u32,
        initial: u32,
        persist: bool,
    },
    Stop {
        name: u8,
    },
    Remove {
        name: u8,
    },
    Target {
        name: u8,
        blocks: u32,
    },
    /// The guest resyncs (its hello): blocks taken after a deadline may come back.
    Hello {
        name: u8,
    },
    Release {
        name: u8,
        count: u8,
    },
    BogusRelease {
        name: u8,
        lbns: Vec<u32>,
    },
    StartWrite {
        name: u8,
        lbn: u32,
        unit: u64,
    },
    Read {
        name: u8,
        lbn: u32,
        unit: u64,
    },
    EndIo {
        pick: u8,
    },
    RunOp {
        pick: u8,
        fail: bool,
    },
    Commit,
    /// Every op run, then a commit.
    Pump,
    Tick {
        ns: u64,
    },
    Crash,
    /// The cache engine grants the region one of its blocks (a shared region), having
    /// written its own bytes there.
    Grant {
        pick: u32,
    },
    /// The region gives up to `n` free blocks back to the cache engine.
    Yield {
        n: u32,
    },
    /// The budget wants the region down to `cap` blocks: inactive vSSDs' blocks swap out.
    Shed {
        cap: u32,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let name = 0u8..3;
    prop_oneof![
        3 => (name.clone(), 1u32..8, 0u32..6, proptest::bool::weighted(0.7)).prop_map(|(name, max, initial, persist)| Step::Register { name, max, initial: initial.min(max), persist }),
        2 => name.clone().prop_map(|name| Step::Stop { name }),
        1 => name.clone().prop_map(|name| Step::Remove { name }),
        3 => (name.clone(), 0u32..8).prop_map(|(name, blocks)| Step::Target { name, blocks }),
        2 => name.clone().prop_map(|name| Step::Hello { name }),
        5 => (name.clone(), 0u8..4).prop_map(|(name, count)| Step::Release { name, count }),
        1 => (name.clone(), proptest::collection::vec(0u32..9, 0..4)).prop_map(|(name, lbns)| Step::BogusRelease { name, lbns }),
        8 => (name.clone(), 0u32..8, 0..UNITS).prop_map(|(name, lbn, unit)| Step::StartWrite { name, lbn, unit }),
        8 => (name.clone(), 0u32..8, 0..UNITS).prop_map(|(name, lbn, unit)| Step::Read { name, lbn, unit }),
        4 => any::<u8>().prop_map(|pick| Step::EndIo { pick }),
        6 => (any::<u8>(), proptest::bool::weighted(0.05)).prop_map(|(pick, fail)| Step::RunOp { pick, fail }),
        4 => Just(Step::Commit),
        3 => Just(Step::Pump),
        2 => (0u64..3_000).prop_map(|ns| Step::Tick { ns }),
        1 => Just(Step::Crash),
        3 => any::<u32>().prop_map(|pick| Step::Grant { pick }),
        1 => (0u32..3).prop_map(|n| Step::Yield { n }),
        1 => (0u32..8).prop_map(|cap| Step::Shed { cap }),
    ]
}

/// What a guest expects of a unit.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    Exact(Tag),
    /// Released: zeros or its own bytes (a release a crash undid).
    OwnAny,
}

struct World {
    config: Config,
    /// The region starts empty and shares its SSD with the cache engine.
    shared: bool,
    /// Blocks the cache engine has (it may write them at any time).
    engine_owned: std::collections::BTreeSet<u32>,
    m: BlockManager,
    region: Vec<Tag>,
    swap: HashMap<(VssdId, u32), Vec<Tag>>,
    durable: Vec<Record>,
    pending: Vec<(u64, Record)>,
    ops: Vec<Op>,
    ios: Vec<InFlight>,
    now: u64,
    version: u64,
    /// Incarnation per vSSD id (a new one at each fresh registration).
    incarnation: HashMap<VssdId, u32>,
    next_incarnation: u32,
    expect: HashMap<(u32, u32, u64), Expect>,
}

impl World {
    fn new(shared: bool) -> World {
        let geometry = Geometry::new(UNITS * UNIT, 10).unwrap();
        let config = Config { geometry, deflate_grace: 1_000 };
        World {
            config,
            m: BlockManager::new(config, if shared { State::shared(geometry) } else { State::new(geometry) }),
            shared,
            engine_owned: if shared { (0..10).collect() } else { Default::default() },
            region: vec![None; (10 * UNITS) as usize],
            swap: HashMap::new(),
            durable: Vec::new(),
            pending: Vec::new(),
            ops: Vec::new(),
            ios: Vec::new(),
            now: 0,
            version: 0,
            incarnation: HashMap::new(),
            next_incarnation: 0,
            expect: HashMap::new(),
        }
    }

    fn id(&self, name: u8) -> Option<VssdId> {
        self.m.state().id_of(&format!("vm{name}"))
    }

    fn drain_outputs(&mut self) {
        while let Some(r) = self.m.poll_record() {
            self.pending.push(r);
        }
        while let Some(op) = self.m.poll_op() {
            self.ops.push(op);
        }
        while let Some(e) = self.m.poll_event() {
            match e {
                Event::Released { id, lbns, .. } => {
                    let inc = self.incarnation[&id];
                    for lbn in lbns {
                        for u in 0..UNITS {
                            self.expect.insert((inc, lbn, u), Expect::OwnAny);
                        }
                    }
                }
                Event::Yielded { pbns } => {
                    for pbn in pbns {
                        assert!(self.engine_owned.insert(pbn), "block {pbn} yielded twice");
                        self.engine_writes(pbn);
                    }
                }
                Event::Removed { id } => {
                    if let Some(inc) = self.incarnation.remove(&id) {
                        self.expect.retain(|k, _| k.0 != inc);
                    }
                }
                _ => {}
            }
        }
    }

    fn unit_of(&self, region_offset: u64) -> usize {
        (region_offset / UNIT) as usize
    }

    fn apply(&mut self, s: &Step) {
        match s.clone() {
            Step::Register { name, max, initial, persist } => {
                let fresh = self.id(name).is_none();
                if let Ok(id) = self.m.register(&format!("vm{name}"), max, initial, persist, self.now) {
                    if fresh {
                        self.incarnation.insert(id, self.next_incarnation);
                        self.next_incarnation += 1;
                    }
                }
            }
            Step::Stop { name } => {
                if let Some(id) = self.id(name) {
                    let _ = self.m.stop(id, self.now);
                }
            }
            Step::Remove { name } => {
                if let Some(id) = self.id(name) {
                    let _ = self.m.remove(id);
                }
            }
            Step::Hello { name } => {
                if let Some(id) = self.id(name) {
                    self.m.hello(id);
                    self.drain_outputs();
                }
            }
            Step::Target { name, blocks } => {
                if let Some(id) = self.id(name) {
                    let _ = self.m.set_target(id, blocks, self.now);
                }
            }
            Step::Release { name, count } => {
                // The named guest, or one that is asked for blocks.
                let asked = |w: &World, id: VssdId| w.m.resize_status(id).is_some_and(|s| s.asked > 0);
                let id = self.id(name).filter(|&id| asked(self, id)).or_else(|| {
                    let ids: Vec<VssdId> = self.m.state().vssds().keys().copied().collect();
                    ids.into_iter().find(|&id| asked(self, id))
                });
                if let Some(id) = id {
                    let asked = self.m.resize_status(id).map_or(0, |s| s.asked);
                    let lbns: Vec<u32> =
                        self.m.valid_lbns(id).into_iter().rev().take(asked.min(u32::from(count)) as usize).collect();
                    let before = self.m.state().clone();
                    let r = self.m.release(id, &lbns);
                    if r.is_err() {
                        assert_eq!(self.m.state(), &before);
                    }
                }
            }
            Step::BogusRelease { name, lbns } => {
                if let Some(id) = self.id(name) {
                    let before = (self.m.state().clone(), self.m.valid_lbns(id), self.m.resize_status(id));
                    if self.m.release(id, &lbns).is_err() {
                        assert_eq!((self.m.state().clone(), self.m.valid_lbns(id), self.m.resize_status(id)), before);
                    }
                }
            }
            Step::StartWrite { name, lbn, unit } => {
                if let Some(id) = self.id(name) {
                    let lbn = self.aim(id, lbn);
                    let off = u64::from(lbn) * UNITS * UNIT + unit * UNIT;
                    if let Ok(io) = self.m.start_io(id, off, UNIT, self.now) {
                        self.version += 1;
                        let tag = Some((self.incarnation[&id], lbn, unit, self.version));
                        let at = io.extents[0].region_offset;
                        self.ios.push((io, Some(vec![(at, tag)])));
                    }
                }
            }
            Step::Read { name, lbn, unit } => {
                if let Some(id) = self.id(name) {
                    let lbn = self.aim(id, lbn);
                    let off = u64::from(lbn) * UNITS * UNIT + unit * UNIT;
                    if let Ok(io) = self.m.start_io(id, off, UNIT, self.now) {
                        let got = self.region[self.unit_of(io.extents[0].region_offset)];
                        let inc = self.incarnation[&id];
                        match self.expect.get(&(inc, lbn, unit)).copied().unwrap_or(Expect::Exact(None)) {
                            Expect::Exact(t) => assert_eq!(got, t, "vSSD {id} lbn {lbn} unit {unit}"),
                            Expect::OwnAny => assert!(
                                got.is_none_or(|(i, l, u, _)| i == inc && l == lbn && u == unit),
                                "vSSD {id} lbn {lbn} unit {unit} reads {got:?}"
                            ),
                        }
                        self.ios.push((io, None));
                    }
                }
            }
            Step::EndIo { pick } => {
                if !self.ios.is_empty() {
                    let (io, write) = self.ios.remove(pick as usize % self.ios.len());
                    if let Some(w) = write {
                        for (at, tag) in w {
                            let u = self.unit_of(at);
                            let pbn = (at / (UNITS * UNIT)) as u32;
                            assert!(
                                !self.engine_owned.contains(&pbn),
                                "a vSSD write landed on block {pbn}, the engine's"
                            );
                            self.region[u] = tag;
                            let (inc, lbn, unit, _) = tag.expect("writes carry tags");
                            // A write that ends after its block was given back landed on
                            // the block it started on, which its vSSD no longer reads.
                            let pbn = (at / (UNITS * UNIT)) as u32;
                            let still = self.m.state().vssd(io.id).and_then(|v| v.map.get(&lbn)) == Some(&pbn)
                                && self.m.valid_lbns(io.id).contains(&lbn);
                            self.expect
                                .insert((inc, lbn, unit), if still { Expect::Exact(tag) } else { Expect::OwnAny });
                        }
                    }
                    self.m.end_io(io);
                }
            }
            Step::RunOp { pick, fail } => {
                if !self.ops.is_empty() {
                    let op = self.ops.remove(pick as usize % self.ops.len());
                    if fail {
                        self.m.op_done(op.id, Err("injected".into()));
                    } else {
                        self.run(&op);
                        self.m.op_done(op.id, Ok(()));
                    }
                }
            }
            Step::Commit => {
                if let Some(&(seq, _)) = self.pending.last() {
                    self.durable.extend(self.pending.drain(..).map(|(_, r)| r));
                    self.m.committed(seq);
                }
            }
            Step::Pump => {
                while !self.ops.is_empty() {
                    let op = self.ops.remove(0);
                    self.run(&op);
                    self.m.op_done(op.id, Ok(()));
                    self.drain_outputs();
                }
                self.apply(&Step::Commit);
            }
            Step::Tick { ns } => {
                self.now += ns;
                if self.m.poll_timeout().is_some_and(|t| t <= self.now) {
                    self.m.handle_timeout(self.now);
                }
            }
            Step::Grant { pick } => {
                let outside = self.m.outside_blocks();
                if !outside.is_empty() {
                    let pbn = outside[pick as usize % outside.len()];
                    assert!(self.engine_owned.remove(&pbn), "block {pbn} is outside the region but not the engine's");
                    self.engine_writes(pbn);
                    self.m.grant(pbn).unwrap();
                } else {
                    assert!(self.m.grant(pick % 12).is_err());
                }
            }
            Step::Yield { n } => {
                self.m.yield_free(n);
            }
            Step::Shed { cap } => {
                self.m.shed_inactive(cap);
            }
            Step::Crash => {
                let state = State::replay_onto(self.start(), &self.durable).expect("the durable records replay");
                self.m = BlockManager::new(self.config, state);
                self.pending.clear();
                self.ops.clear();
                // In-flight writes were never acknowledged: they did not land.
                self.ios.clear();
                // The durable state is what each vSSD maps: exactly the blocks its
                // committed records give it — but a removal the crash interrupted goes
                // on at once (its records are the only ones a fresh manager writes).
                let mut replayed = State::replay_onto(self.start(), &self.durable).unwrap();
                while let Some((seq, r)) = self.m.poll_record() {
                    let id = match r {
                        Record::Free { pbn } => replayed.owner(pbn).map(|o| o.0),
                        Record::SwapDropped { id, .. } | Record::Remove { id } => Some(id),
                        _ => None,
                    };
                    assert!(
                        id.and_then(|id| replayed.vssd(id)).is_some_and(|v| v.removing),
                        "a restarted manager wrote {r:?}, not part of a removal it resumed"
                    );
                    replayed.apply(&r).unwrap();
                    self.pending.push((seq, r));
                }
                assert_eq!(self.m.state(), &replayed);
                let ids: Vec<VssdId> = self.incarnation.keys().copied().collect();
                for id in ids {
                    if self.m.state().vssd(id).is_none() {
                        let inc = self.incarnation.remove(&id).unwrap();
                        self.expect.retain(|k, _| k.0 != inc);
                    }
                }
                // A fresh registration that did not reach the journal is forgotten.
                // Blocks whose `Yield` was not durable are the region's again (the
                // engine never had them); a `Grant` that was not is the engine's.
                self.engine_owned = (0..10).filter(|&p| !self.m.state().inside(p)).collect();
            }
        }
        self.drain_outputs();
        self.check();
    }

    /// A valid logical block of `id` most of the time (`pick` % 8 == 7: `pick` as is).
    fn aim(&self, id: VssdId, pick: u32) -> u32 {
        let valid = self.m.valid_lbns(id);
        if valid.is_empty() || pick == 7 {
            return pick;
        }
        valid[pick as usize % valid.len()]
    }

    fn run(&mut self, op: &Op) {
        let pbn = match op.kind {
            OpKind::Zero { pbn } | OpKind::SwapOut { pbn, .. } | OpKind::SwapIn { pbn, .. } => pbn,
        };
        assert!(!self.engine_owned.contains(&pbn), "{op:?} on a block the cache engine has");
        let bs = UNITS as usize;
        let units = |pbn: u32| (pbn as usize * bs)..(pbn as usize * bs + bs);
        match op.kind {
            OpKind::Zero { pbn } => units(pbn).for_each(|u| self.region[u] = None),
            OpKind::SwapOut { id, lbn, pbn } => {
                let copy = self.region[units(pbn)].to_vec();
                self.swap.insert((id, lbn), copy);
            }
            OpKind::SwapIn { id, lbn, pbn } => {
                let copy = self.swap.get(&(id, lbn)).cloned().expect("swapped-out data exists");
                self.region[units(pbn)].copy_from_slice(&copy);
            }
        }
    }

    /// The empty durable state this world's region started from.
    fn start(&self) -> State {
        if self.shared {
            State::shared(self.config.geometry)
        } else {
            State::new(self.config.geometry)
        }
    }

    /// The cache engine writes its own bytes over block `pbn`.
    fn engine_writes(&mut self, pbn: u32) {
        self.version += 1;
        for u in 0..UNITS {
            self.region[(u64::from(pbn) * UNITS + u) as usize] = Some((u32::MAX, pbn, u, self.version));
        }
    }

    /// No block that serves a vSSD holds another's bytes.
    fn check(&self) {
        self.m.check_tallies();
        for pbn in &self.engine_owned {
            assert!(!self.m.state().inside(*pbn), "block {pbn} is the engine's and in the region");
        }
        self.m.state().check();
        for (&id, v) in self.m.state().vssds() {
            let Some(&inc) = self.incarnation.get(&id) else { continue };
            let valid = self.m.valid_lbns(id);
            for lbn in valid {
                let pbn = v.map[&lbn];
                for u in 0..UNITS {
                    let got = self.region[(u64::from(pbn) * UNITS + u) as usize];
                    assert!(
                        got.is_none_or(|(i, l, un, _)| i == inc && l == lbn && un == u),
                        "vSSD {id} lbn {lbn} (block {pbn}) unit {u} holds {got:?}"
                    );
                }
            }
        }
    }

    /// Runs every op, commits, and lets deadlines pass, until nothing is left to do.
    fn settle(&mut self) -> Counters {
        for _ in 0..100 {
            let running: Vec<VssdId> = self.m.state().vssds().values().filter(|v| v.active).map(|v| v.id).collect();
            for id in running {
                self.m.hello(id);
            }
            while let Some(io) = self.ios.pop() {
                self.m.end_io(io.0);
            }
            self.apply(&Step::Pump);
            if let Some(t) = self.m.poll_timeout() {
                self.now = t;
                self.m.handle_timeout(t);
                self.drain_outputs();
            }
            if self.ops.is_empty() && self.pending.is_empty() && self.m.poll_timeout().is_none() {
                break;
            }
        }
        self.m.counters()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn no_vssd_sees_another_ones_bytes_and_acknowledged_data_survives(steps in proptest::collection::vec(step(), 1..200), shared in proptest::bool::weighted(0.4)) {
        let mut w = World::new(shared);
        for s in &steps {
            w.apply(s);
        }
        let c = w.settle();
        prop_assert!(w.ops.is_empty() && w.pending.is_empty());
        // Every removal finished.
        let stuck: Vec<&str> = w.m.state().vssds().values().filter(|v| v.removing).map(|v| v.name.as_str()).collect();
        prop_assert!(stuck.is_empty(), "removals never finished: {:?}", stuck);
        // Settled: each running vSSD holds its target when the region can give it.
        let running: Vec<VssdId> = w.m.state().vssds().values().filter(|v| v.active).map(|v| v.id).collect();
        let wanted: u32 = running.iter().map(|&id| w.m.resize_status(id).unwrap().target).sum();
        if wanted <= w.m.region_blocks() && c.failed_ops == 0 {
            for id in running {
                let s = w.m.resize_status(id).unwrap();
                prop_assert_eq!(s.valid, s.target, "vSSD {}: {:?}", id, s);
            }
        }
    }
}
