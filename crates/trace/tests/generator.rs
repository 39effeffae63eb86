//! The Nutanix-schema generator against the slides' example configuration.

use cachevisor_trace::generator::{Generator, WorkloadConfig};
use cachevisor_trace::{Request, TraceSource};

fn fixture() -> WorkloadConfig {
    let text = include_str!("fixtures/nutanix-example.yaml");
    WorkloadConfig::from_yaml(text, "nutanix-example.yaml").unwrap()
}

fn generate(cfg: &WorkloadConfig) -> Vec<Request> {
    let mut g = Generator::new(cfg.validate().unwrap());
    let mut v = Vec::new();
    while let Some(r) = g.next_request().unwrap() {
        v.push(r);
    }
    v
}

#[test]
fn matches_the_slides_configuration() {
    let cfg = fixture();
    let w = cfg.validate().unwrap();
    let reqs = generate(&cfg);
    // IOPS: mean 100 per second over 3600 s.
    let iops = reqs.len() as f64 / 3600.0;
    assert!((iops - 100.0).abs() < 1.0, "mean IOPS {iops}");
    let mut per_sec = vec![0f64; 3600];
    for r in &reqs {
        per_sec[(r.time_ns / 1_000_000_000) as usize] += 1.0;
    }
    let var = per_sec.iter().map(|n| (n - iops).powi(2)).sum::<f64>() / 3600.0;
    assert!((var.sqrt() - 20.0).abs() < 2.0, "IOPS stddev {}", var.sqrt());
    // Size mix 80/10/5/5 %.
    for (bytes, share) in [(4096u32, 0.80), (8192, 0.10), (16384, 0.05), (131072, 0.05)] {
        let got = reqs.iter().filter(|r| r.len == bytes).count() as f64 / reqs.len() as f64;
        assert!((got - share).abs() < 0.01, "{bytes} B: {got} vs {share}");
    }
    // Hotspot shares: each region's listed I/O share plus its part of the uniform rest (67%).
    let disk = w.disk_sectors as f64;
    let bounds = [0.0, 0.1, 0.2, 0.5, 0.9, 1.0];
    let io = [0.01, 0.01, 0.10, 0.20, 0.01];
    for i in 0..5 {
        let want = io[i] + 0.67 * (bounds[i + 1] - bounds[i]);
        let got = reqs
            .iter()
            .filter(|r| {
                let s = r.offset as f64 / 512.0 / disk;
                s >= bounds[i] && s < bounds[i + 1]
            })
            .count() as f64
            / reqs.len() as f64;
        assert!((got - want).abs() < 0.01, "region {i}: {got} vs {want}");
    }
    let reads = reqs.iter().filter(|r| !r.op.is_write()).count() as f64 / reqs.len() as f64;
    assert!((reads - 0.7).abs() < 0.01);
    assert!(reqs.windows(2).all(|p| p[0].time_ns <= p[1].time_ns));
    assert!(reqs.iter().all(|r| r.end() <= w.disk_sectors * 512));
}

#[test]
fn same_seed_same_trace_other_seed_other_trace() {
    let mut cfg = fixture();
    cfg.duration = cachevisor_trace::generator::Scalar::Text("60s".into());
    let a = generate(&cfg);
    assert_eq!(a, generate(&cfg));
    cfg.seed += 1;
    assert_ne!(a, generate(&cfg));
}

#[test]
fn bad_configs_say_which_key() {
    let base = include_str!("fixtures/nutanix-example.yaml");
    for (from, to, want) in [
        ("max: 10\n  stride", "max: 0\n  stride", "cluster.size"),
        ("[5%, 131072b]", "[15%, 131072b]", "iosizes"),
        ("size: 512b", "size: 500b", "sector.size"),
        ("duration: 3600s", "duration: 1 fortnight", "duration"),
    ] {
        let cfg = WorkloadConfig::from_yaml(&base.replace(from, to), "x.yaml").unwrap();
        let e = cfg.validate().unwrap_err();
        assert!(e.contains(want), "{e}");
    }
    let e = WorkloadConfig::from_yaml(&base.replace("iops:", "ioops:"), "x.yaml").unwrap_err().to_string();
    assert!(e.contains("x.yaml") && e.contains("ioops"), "{e}");
}
