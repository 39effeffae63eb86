//! The cache model against the full model (`model_choice.rs`): on every bundled trace and
//! a generated Zipf oracleGeneral trace, every replacement policy, closed loop with one VM
//! (where `auto` takes the cache model), the two give the same hit ratios — exactly at
//! queue depth 1 but for S3-FIFO's 2e-5 on one trace (a request's own blocks in flight),
//! within 1e-4 at queue depth 4 — and the same SSD and backing bytes; `auto`'s choices
//! and the refusal of `model = "cache"` where it cannot run.

use cachevisor_engine::{PartitionMode, ReplacementKind, WritePolicy};
use cachevisor_sim::model_choice::{Model, ModelChoice};
use cachevisor_sim::scenario::ReplayMode;
use cachevisor_sim::{simulate, Scenario, SimResult};
use cachevisor_trace::zipf::ZipfSource;
use cachevisor_trace::Format;
use std::path::{Path, PathBuf};

fn shared(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces").join(name)
}

/// A Zipf(0.9) oracleGeneral trace of 60,000 requests over 20,000 blocks in `dir`.
fn zipf_trace(dir: &Path) -> PathBuf {
    let path = dir.join("zipf.oracleGeneral");
    let mut src = ZipfSource::new(60_000, 20_000, 0.9, 4096, 3).unwrap();
    cachevisor_trace::write_file::write_source(&mut src, Format::OracleGeneral, &path, 4096).unwrap();
    path
}

fn run(file: &Path, repl: ReplacementKind, wp: WritePolicy, qd: u32, model: ModelChoice) -> SimResult {
    let mut s = Scenario::default();
    s.trace.files = vec![file.to_path_buf()];
    s.cache.size = "16MiB".into();
    s.cache.partition = PartitionMode::Shared;
    s.cache.replacement = Some(repl);
    s.cache.write_policy = wp;
    s.replay.queue_depth = qd;
    s.replay.model = model;
    s.replay.max_requests = 60_000;
    simulate(&s, &mut |_| {}).unwrap()
}

#[test]
fn the_cache_model_gives_the_full_models_hit_ratios_in_closed_loop() {
    let dir = tempfile::tempdir().unwrap();
    let zipf = zipf_trace(dir.path());
    let traces =
        [shared("cloudPhysicsIO.vscsi"), shared("tpcc-small.mqsim.txt"), shared("websearch-small.mqsim.txt"), zipf];
    let policies = [
        ReplacementKind::Lru,
        ReplacementKind::Fifo,
        ReplacementKind::Clock,
        ReplacementKind::TwoPool,
        ReplacementKind::S3fifo,
    ];
    let mut worst: [f64; 2] = [0.0; 2];
    for t in &traces {
        for &p in &policies {
            for (i, qd) in [1u32, 4].into_iter().enumerate() {
                // Write-through: nothing dirty, so `auto` may take the cache model.
                let cache = run(t, p, WritePolicy::Wt, qd, ModelChoice::Auto);
                let full = run(t, p, WritePolicy::Wt, qd, ModelChoice::Full);
                let what = format!("{} {p:?} qd {qd}", t.display());
                assert_eq!(cache.model, Model::Cache, "{what}: auto took {}", cache.model_reason);
                assert_eq!(full.model, Model::Full, "{what}");
                assert_eq!(cache.total.requests, full.total.requests, "{what}");
                assert!(cache.total.requests > 5_000, "{what}");
                for (c, f) in cache.vms.iter().zip(&full.vms).chain([(&cache.total, &full.total)]) {
                    for (a, b) in [
                        (c.hit_ratio, f.hit_ratio),
                        (c.read_hit_ratio, f.read_hit_ratio),
                        (c.write_hit_ratio, f.write_hit_ratio),
                    ] {
                        worst[i] = worst[i].max((a - b).abs());
                    }
                }
                let rel = |a: u64, b: u64| (a as f64 - b as f64).abs() / (b.max(1) as f64);
                assert!(rel(cache.total.ssd_write_bytes, full.total.ssd_write_bytes) < 1e-3, "{what}");
                assert!(rel(cache.total.backing_read_bytes, full.total.backing_read_bytes) < 1e-3, "{what}");
                assert_eq!(cache.total.latency.mean_us, 0.0, "{what}: the cache model times nothing");
                assert!(full.total.latency.mean_us > 0.0, "{what}");
            }
        }
    }
    assert!(worst[0] <= 5e-5, "queue depth 1: hit ratios differ by {}", worst[0]);
    assert!(worst[1] <= 1e-4, "queue depth 4: hit ratios differ by {}", worst[1]);
}

#[test]
fn auto_takes_the_full_model_where_device_time_matters_and_says_why() {
    let t = shared("tpcc-small.mqsim.txt");
    let base = || {
        let mut s = Scenario::default();
        s.trace.files = vec![t.clone()];
        s.cache.size = "16MiB".into();
        s.replay.max_requests = 2_000;
        s
    };
    let model = |s: &Scenario| {
        let r = simulate(s, &mut |_| {}).unwrap();
        (r.model, r.model_reason)
    };
    // Write-back with writes in the trace: the flusher's timing.
    let (m, why) = model(&base());
    assert_eq!(m, Model::Full);
    assert!(why.contains("write-back timing"), "{why}");
    // Write-through, closed loop, one VM: the cache model.
    let mut s = base();
    s.cache.write_policy = WritePolicy::Wt;
    assert_eq!(model(&s).0, Model::Cache);
    // Open loop: requests overlap by device time.
    s.replay.mode = ReplayMode::Open;
    let (m, why) = model(&s);
    assert_eq!((m, why.contains("open loop")), (Model::Full, true), "{why}");
    // Two VMs in closed loop: interleaved by their latencies.
    let mut s = base();
    s.cache.write_policy = WritePolicy::Wt;
    s.trace.files.push(shared("websearch-small.mqsim.txt"));
    let (m, why) = model(&s);
    assert_eq!((m, why.contains("several VMs")), (Model::Full, true), "{why}");
    // Asked for, the cache model runs them in trace order and says what it left out.
    s.replay.model = ModelChoice::Cache;
    let (m, why) = model(&s);
    assert_eq!((m, why.contains("not modelled: several VMs")), (Model::Cache, true), "{why}");
    // Asked for where it cannot run at all: refused, naming why.
    let mut s = base();
    s.cache.persistent = true;
    s.replay.model = ModelChoice::Cache;
    let e = simulate(&s, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("replay.model = \"cache\"") && e.contains("persistent"), "{e}");
    // And `full` is the full model whatever the scenario.
    let mut s = base();
    s.cache.write_policy = WritePolicy::Wt;
    s.replay.model = ModelChoice::Full;
    assert_eq!(model(&s).0, Model::Full);
}

#[test]
fn a_scenario_file_names_the_model() {
    let s: Scenario = toml::from_str("[replay]\nmodel = \"cache\"\n").unwrap();
    assert_eq!(s.replay.model, ModelChoice::Cache);
    let e = toml::from_str::<Scenario>("[replay]\nmodel = \"fast\"\n").unwrap_err().to_string();
    assert!(e.contains("model") && e.contains("fast"), "{e}");
}
