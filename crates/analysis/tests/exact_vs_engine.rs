//! The exact miss-ratio curve equals an LRU simulation by the engine at every size that
//! holds the largest request (3 blocks here): a request never evicts its own blocks in
//! the engine (their ops may run in the same phase as the eviction's), so a cache smaller
//! than one request keeps the request's first blocks where pure LRU keeps its last.

use cachevisor_analysis::{Kind, Method, Profiler};
use cachevisor_engine::{Engine, EngineConfig, Output, ReplacementKind};
use cachevisor_trace::{Op, Request};
use proptest::prelude::*;

fn reqs() -> impl Strategy<Value = Vec<Request>> {
    prop::collection::vec((any::<bool>(), 0u64..60, 1u64..4), 1..600).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (w, b, n))| Request {
                time_ns: i as u64,
                vm: 0,
                op: if w { Op::Write } else { Op::Read },
                offset: b * 4096,
                len: (n * 4096) as u32,
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn mrc_equals_engine_lru_at_every_size(trace in reqs()) {
        let mut p = Profiler::new(4096, Method::Exact);
        trace.iter().for_each(|r| p.add(r));
        let h = p.vm(0).unwrap().histogram(Kind::All);
        let accesses = p.vm(0).unwrap().accesses(Kind::All);
        for c in 3..=64u64 {
            let mut e = Engine::new(EngineConfig { replacement: ReplacementKind::Lru, ..EngineConfig::with_slots(c) }).unwrap();
            let mut out = Output::default();
            e.set_target(0, c, &mut out);
            let mut hits = 0u64;
            for r in &trace {
                e.access(r.time_ns, r, &mut out);
                hits += out.blocks.iter().filter(|b| b.hit).count() as u64;
            }
            prop_assert_eq!(h.hits_at(c) as u64, hits, "size {}", c);
            prop_assert!((h.miss_ratio_at(c) - (1.0 - hits as f64 / accesses as f64)).abs() < 1e-12);
        }
    }
}
