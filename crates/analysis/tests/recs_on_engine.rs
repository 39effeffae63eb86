//! rECS over a real engine's reference counters.

use cachevisor_analysis::RecsEstimator;
use cachevisor_engine::{Engine, EngineConfig, Output, ReplacementKind};
use cachevisor_trace::{Op, Request};

fn read(vm: u32, b: u64) -> Request {
    Request { time_ns: 0, vm, op: Op::Read, offset: b * 4096, len: 4096 }
}

#[test]
fn full_scan_counts_hit_blocks_per_vm() {
    for kind in [
        ReplacementKind::Clock,
        ReplacementKind::Lru,
        ReplacementKind::Fifo,
        ReplacementKind::TwoPool,
        ReplacementKind::S3fifo,
    ] {
        let mut e = Engine::new(EngineConfig { replacement: kind, ..EngineConfig::with_slots(100) }).unwrap();
        let mut out = Output::default();
        e.set_target(0, 50, &mut out);
        e.set_target(1, 50, &mut out);
        // VM 0 loads 40 blocks and re-reads 10 of them; VM 1 loads 20 and re-reads all.
        (0..40).for_each(|b| e.access(0, &read(0, b), &mut out));
        (0..10).for_each(|b| e.access(0, &read(0, b), &mut out));
        (0..20).for_each(|b| e.access(0, &read(1, b), &mut out));
        (0..20).for_each(|b| e.access(0, &read(1, b), &mut out));
        let mut r = RecsEstimator::new(0.8, 1, 100, 3);
        let v = r.sample_window(e.slot_count(), |s| e.slot_referenced(s as u32)).to_vec();
        assert_eq!(v, [Some(0.25), Some(1.0)], "{kind}");
    }
}
