//! Every replacement policy against a simple reference model written independently
//! (plain vectors, no intrusive lists): same hit/miss on random access sequences, in a
//! single partition, in several static partitions, and in shared mode.

mod model_harness;
use cachevisor_engine::*;
use cachevisor_trace::{Op, Request};
use model_harness::cases;
use proptest::prelude::*;
use std::collections::{HashSet, VecDeque};

/// A reference cache of `cap` blocks: returns whether the access hit.
trait Model {
    fn access(&mut self, key: u64) -> bool;
}

struct LruModel(Vec<u64>, usize);
impl Model for LruModel {
    fn access(&mut self, k: u64) -> bool {
        if let Some(i) = self.0.iter().position(|&x| x == k) {
            self.0.remove(i);
            self.0.insert(0, k);
            return true;
        }
        if self.0.len() == self.1 {
            self.0.pop();
        }
        self.0.insert(0, k);
        false
    }
}

struct FifoModel(VecDeque<u64>, usize);
impl Model for FifoModel {
    fn access(&mut self, k: u64) -> bool {
        if self.0.contains(&k) {
            return true;
        }
        if self.0.len() == self.1 {
            self.0.pop_front();
        }
        self.0.push_back(k);
        false
    }
}

/// Hand at the front; new blocks join at the back with counter 0.
struct ClockModel(VecDeque<(u64, u8)>, usize);
impl Model for ClockModel {
    fn access(&mut self, k: u64) -> bool {
        if let Some(e) = self.0.iter_mut().find(|e| e.0 == k) {
            e.1 = (e.1 + 1).min(15);
            return true;
        }
        if self.0.len() == self.1 {
            loop {
                let (key, c) = self.0.pop_front().unwrap();
                if c == 0 {
                    break;
                }
                self.0.push_back((key, c - 1));
            }
        }
        self.0.push_back((k, 0));
        false
    }
}

/// Front = most recent.
struct TwoPoolModel {
    single: VecDeque<u64>,
    multi: VecDeque<u64>,
    cap: usize,
}
impl Model for TwoPoolModel {
    fn access(&mut self, k: u64) -> bool {
        if let Some(i) = self.multi.iter().position(|&x| x == k) {
            self.multi.remove(i);
            self.multi.push_front(k);
            return true;
        }
        if let Some(i) = self.single.iter().position(|&x| x == k) {
            self.single.remove(i);
            self.multi.push_front(k);
            return true;
        }
        if self.single.len() + self.multi.len() == self.cap {
            while self.multi.len() > self.cap * 80 / 100 {
                let d = self.multi.pop_back().unwrap();
                self.single.push_front(d);
            }
            if self.single.pop_back().is_none() {
                self.multi.pop_back();
            }
        }
        self.single.push_front(k);
        false
    }
}

/// Queues with the head at the front.
struct S3Model {
    s: VecDeque<(u64, u8)>,
    m: VecDeque<(u64, u8)>,
    g: VecDeque<u64>,
    cap: usize,
}
impl Model for S3Model {
    fn access(&mut self, k: u64) -> bool {
        for e in self.s.iter_mut().chain(self.m.iter_mut()) {
            if e.0 == k {
                e.1 = (e.1 + 1).min(3);
                return true;
            }
        }
        let small_cap = (self.cap / 10).max(1);
        let ghost_cap = self.cap - self.cap / 10;
        if self.s.len() + self.m.len() == self.cap {
            loop {
                if !self.s.is_empty() && (self.s.len() >= small_cap || self.m.is_empty()) {
                    let (key, f) = self.s.pop_back().unwrap();
                    if f > 1 {
                        self.m.push_front((key, f));
                    } else {
                        self.g.retain(|&x| x != key);
                        self.g.push_back(key);
                        while self.g.len() > ghost_cap {
                            self.g.pop_front();
                        }
                        break;
                    }
                } else {
                    let (key, f) = self.m.pop_back().unwrap();
                    if f > 0 {
                        self.m.push_front((key, f - 1));
                    } else {
                        break;
                    }
                }
            }
        }
        if let Some(i) = self.g.iter().position(|&x| x == k) {
            self.g.remove(i);
            self.m.push_front((k, 0));
        } else {
            self.s.push_front((k, 0));
        }
        false
    }
}

fn model(kind: ReplacementKind, cap: usize) -> Box<dyn Model> {
    match kind {
        ReplacementKind::Lru => Box::new(LruModel(Vec::new(), cap)),
        ReplacementKind::Fifo => Box::new(FifoModel(VecDeque::new(), cap)),
        ReplacementKind::Clock => Box::new(ClockModel(VecDeque::new(), cap)),
        ReplacementKind::TwoPool => Box::new(TwoPoolModel { single: VecDeque::new(), multi: VecDeque::new(), cap }),
        ReplacementKind::S3fifo => {
            Box::new(S3Model { s: VecDeque::new(), m: VecDeque::new(), g: VecDeque::new(), cap })
        }
    }
}

fn read(vm: u32, block: u64) -> Request {
    Request { time_ns: 0, vm, op: Op::Read, offset: block * 4096, len: 4096 }
}

fn engine(kind: ReplacementKind, slots: u64, partition: PartitionMode) -> Engine {
    let cfg = EngineConfig { replacement: kind, partition, ..EngineConfig::with_slots(slots) };
    Engine::new(cfg).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(64)))]

    #[test]
    fn each_policy_matches_its_model_per_partition(
        caps in prop::collection::vec(1usize..12, 1..4),
        seq in prop::collection::vec((0u32..4, 0u64..24), 1..400),
    ) {
        for kind in ReplacementKind::ALL {
            let total: usize = caps.iter().sum();
            let mut e = engine(kind, total as u64 + 3, PartitionMode::Static);
            let mut out = Output::default();
            let mut models: Vec<_> = caps.iter().map(|&c| model(kind, c)).collect();
            for (vm, &c) in caps.iter().enumerate() {
                e.set_target(vm as u32, c as u64, &mut out);
            }
            for &(vm, block) in &seq {
                let vm = vm % caps.len() as u32;
                e.access(0, &read(vm, block), &mut out);
                let want = models[vm as usize].access(block);
                prop_assert_eq!(out.blocks[0].hit, want, "{} vm {} block {}", kind, vm, block);
            }
            e.check_invariants().map_err(TestCaseError::fail)?;
        }
    }

    #[test]
    fn each_policy_matches_its_model_shared(
        cap in 1usize..20,
        seq in prop::collection::vec((0u32..3, 0u64..30), 1..400),
    ) {
        for kind in ReplacementKind::ALL {
            let mut e = engine(kind, cap as u64, PartitionMode::Shared);
            let mut out = Output::default();
            let mut m = model(kind, cap);
            for &(vm, block) in &seq {
                e.access(0, &read(vm, block), &mut out);
                let want = m.access(((vm as u64) << 32) | block);
                prop_assert_eq!(out.blocks[0].hit, want, "{} vm {} block {}", kind, vm, block);
            }
            e.check_invariants().map_err(TestCaseError::fail)?;
        }
    }
}

#[test]
fn exact_hit_counts_on_hand_made_traces() {
    // Sequence 1 2 3 1 4 1 2 5 1 2 3 4 5 over 3 slots; expected hits worked by hand.
    let seq = [1u64, 2, 3, 1, 4, 1, 2, 5, 1, 2, 3, 4, 5];
    let cases = [
        (ReplacementKind::Lru, 4),  // hits: 1@4, 1@6, 1@9, 2@10
        (ReplacementKind::Fifo, 3), // hits: 1@4, 1@6, 2@10 ... see below
        (ReplacementKind::Clock, 4),
    ];
    for (kind, _) in cases {
        let mut e = engine(kind, 3, PartitionMode::Static);
        let mut out = Output::default();
        e.set_target(0, 3, &mut out);
        let mut hits = Vec::new();
        for (i, &b) in seq.iter().enumerate() {
            e.access(0, &read(0, b), &mut out);
            if out.blocks[0].hit {
                hits.push(i + 1);
            }
        }
        let want: &[usize] = match kind {
            // LRU: [1,2,3] 1 hit; 4 evicts 2 → [4,1,3]; 1 hit; 2 evicts 3; 5 evicts 4;
            // 1 hit; 2 hit; 3 evicts 5; 4 evicts 1; 5 evicts 2.
            ReplacementKind::Lru => &[4, 6, 9, 10],
            // FIFO: [1,2,3]; 1 hit; 4 evicts 1; 1 evicts 2; 2 evicts 3; 5 evicts 4;
            // 1 hit; 2 hit; 3 evicts 1; 4 evicts 2; 5 hit.
            ReplacementKind::Fifo => &[4, 9, 10, 13],
            // CLOCK: 1 gets counter 1 at step 4; 4 sweeps: 1→0 moves behind, evicts 2;
            // ring 3,1,4: 1 hit (counter 1); 2 evicts 3; ring 1,4,2: 5: 1→0, evicts 4;
            // ring 2,1,5: 1 hit, 2 hit; 3: 2→0, 1→0, 5 evicted; ring 2,1,3: 4 evicts 2;
            // ring 1,3,4: 5 evicts 1.
            ReplacementKind::Clock => &[4, 6, 9, 10],
            _ => unreachable!(),
        };
        assert_eq!(hits, want, "{kind}");
    }
}

#[test]
fn clock_counters_saturate_at_four_bits() {
    let mut e = engine(ReplacementKind::Clock, 2, PartitionMode::Static);
    let mut out = Output::default();
    e.set_target(0, 2, &mut out);
    for _ in 0..40 {
        e.access(0, &read(0, 7), &mut out);
    }
    let s = e.lookup(0, 7).unwrap();
    assert_eq!(e.slot_aux(s) & 0xf, 15);
    let mut seen = HashSet::new();
    seen.insert(s);
    assert_eq!(seen.len(), 1);
}
