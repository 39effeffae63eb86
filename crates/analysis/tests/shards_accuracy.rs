//! SHARDS against exact curves: mean absolute error of the miss ratio over sizes up to the
//! working set, on real and generated traces (FAST'15 reports ≈ 0.002–0.01 at R = 0.01).

use cachevisor_analysis::{Correction, DistanceHistogram, Kind, Method, Profiler, Shards};
use cachevisor_trace::zipf::ZipfSource;
use cachevisor_trace::{open_trace, Op, ReadOptions, Request, TraceSource};
use rand::{Rng, SeedableRng};
use std::path::PathBuf;

fn profile(reqs: &[Request], m: Method, seed: u64) -> DistanceHistogram {
    let mut p = Profiler::new(4096, m).with_seed(seed);
    reqs.iter().for_each(|r| p.add(r));
    p.vm(0).unwrap().histogram(Kind::All)
}

fn mae(reqs: &[Request], m: Method) -> f64 {
    mae_seeds(reqs, m, 0..1)[0]
}

/// MAE with each hash seed (the exact curve computed once).
fn mae_seeds(reqs: &[Request], m: Method, seeds: std::ops::Range<u64>) -> Vec<f64> {
    let exact = profile(reqs, Method::Exact, 0);
    seeds.map(|seed| mae_against(&exact, &profile(reqs, m, seed))).collect()
}

fn mae_against(exact: &DistanceHistogram, est: &DistanceHistogram) -> f64 {
    let wss = exact.cold() as u64;
    let points = 100u64;
    (1..=points)
        .map(|i| (exact.miss_ratio_at(wss * i / points) - est.miss_ratio_at(wss * i / points)).abs())
        .sum::<f64>()
        / points as f64
}

fn zipf(n: u64, blocks: u64, alpha: f64) -> Vec<Request> {
    let mut z = ZipfSource::new(n, blocks, alpha, 4096, 3).unwrap();
    std::iter::from_fn(|| z.next_request().unwrap()).collect()
}

fn scan_mix(n: u64, blocks: u64) -> Vec<Request> {
    // Loops over a region interleaved with uniform random accesses.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
    (0..n)
        .map(|i| {
            let b = if i % 2 == 0 { (i / 2) % (blocks / 4) } else { rng.gen_range(0..blocks) };
            Request { time_ns: i, vm: 0, op: Op::Read, offset: b * 4096, len: 4096 }
        })
        .collect()
}

fn cloudphysics() -> Vec<Request> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces/cloudPhysicsIO.vscsi");
    let mut s = open_trace(&p, &ReadOptions::default()).unwrap();
    std::iter::from_fn(|| s.next_request().unwrap()).collect()
}

#[test]
fn fixed_rate_one_percent() {
    // The scan's cliff needs enough sampled region blocks: a 1 M-block loop at R = 0.01.
    for (name, reqs) in [("zipf", zipf(2_000_000, 200_000, 0.9)), ("scan+random", scan_mix(4_000_000, 4_000_000))] {
        let e = mae(&reqs, Method::ShardsRate { rate: 0.01 });
        assert!(e <= 0.01, "{name}: MAE {e} at R = 0.01");
    }
}

/// The bundled CloudPhysics trace has only 269 K distinct blocks: at R = 0.01 SHARDS
/// samples ~2,700 of them and the MAE is variance-bound (over 12 hash seeds: mean 0.015,
/// worst 0.028 with the size-biased correction, 0.019 / 0.053 with SHARDS_adj;
/// docs/analysis.md), so the real trace is checked at R = 0.1.
#[test]
fn fixed_rate_on_the_real_trace() {
    let e = mae(&cloudphysics(), Method::ShardsRate { rate: 0.1 });
    assert!(e <= 0.01, "cloudphysics: MAE {e} at R = 0.1");
}

#[test]
fn fixed_rate_one_per_mille() {
    // R = 0.001 samples ~1,000 blocks of a 1 M-block working set: the smallest that is
    // "large enough to sample" for the 0.02 bound (measured MAE 0.017–0.018 here).
    for (name, reqs) in [("zipf", zipf(10_000_000, 1_000_000, 0.9)), ("scan+random", scan_mix(4_000_000, 4_000_000))] {
        let e = mae(&reqs, Method::ShardsRate { rate: 0.001 });
        assert!(e <= 0.02, "{name}: MAE {e} at R = 0.001");
    }
}

#[test]
fn fixed_size() {
    let reqs = zipf(2_000_000, 200_000, 0.9);
    let e = mae(&reqs, Method::ShardsSize { max_blocks: 8_192 });
    assert!(e <= 0.01, "fixed-size MAE {e}");
}

fn uniform(n: u64, blocks: u64) -> Vec<Request> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    (0..n)
        .map(|i| Request { time_ns: i, vm: 0, op: Op::Read, offset: rng.gen_range(0..blocks) * 4096, len: 4096 })
        .collect()
}

/// Per seed, the MAE of a fixed-rate sampler with `c` against the exact curve, feeding
/// `Shards` directly (one VM of single-block reads).
fn mae_correction(reqs: &[Request], rate: f64, c: Correction, seeds: std::ops::Range<u64>) -> Vec<f64> {
    let exact = profile(reqs, Method::Exact, 0);
    seeds
        .map(|seed| {
            let mut s = Shards::fixed_rate(rate).with_seed(seed).with_correction(c);
            reqs.iter().for_each(|r| s.access(r.offset / 4096));
            mae_against(&exact, &s.histogram())
        })
        .collect()
}

fn worst(e: &[f64]) -> f64 {
    e.iter().cloned().fold(0.0, f64::max)
}

/// The count correction (`Shards::histogram`) over eight hash seeds, at R = 0.01 on
/// ≥ 200 K-block traces at the two ends of its premise: skewed ones, where the sampled
/// count's error comes from hot blocks (FAST'15's SHARDS_adj is right there), and a
/// uniform one, where it comes from how many ordinary blocks were sampled (SHARDS_adj
/// then moves the whole curve: 0.023–0.028 worst). The size-biased spread keeps both
/// near the sampling noise.
#[test]
fn the_count_correction_holds_on_skewed_and_uniform_traces_over_seeds() {
    let (sized, first) = (Correction::SizeBiased, Correction::FirstBucket);
    for (name, reqs) in [("zipf 0.9", zipf(2_000_000, 200_000, 0.9)), ("zipf 1.0", zipf(2_000_000, 400_000, 1.0))] {
        let (a, b) = (mae_correction(&reqs, 0.01, sized, 0..8), mae_correction(&reqs, 0.01, first, 0..8));
        eprintln!("{name}: size-biased {a:.4?}, first bucket {b:.4?}");
        assert!(worst(&a) <= 0.02 && worst(&b) <= 0.02, "{name}: worst MAE {} / {}", worst(&a), worst(&b));
    }
    let reqs = uniform(600_000, 240_000);
    let (a, b) = (mae_correction(&reqs, 0.01, sized, 0..8), mae_correction(&reqs, 0.01, first, 0..8));
    eprintln!("uniform: size-biased {a:.4?}, first bucket {b:.4?}");
    assert!(worst(&a) <= 0.01, "uniform: worst MAE {} over 8 seeds (each: {a:?})", worst(&a));
    assert!(worst(&a) <= 0.6 * worst(&b), "uniform: size-biased {} against first bucket {}", worst(&a), worst(&b));
}

/// The size axis scaled to the working set the sketch counts (`Shards::histogram`),
/// against the sample's own estimate (`histogram_for(None)`), over 12 hash seeds on a
/// uniform 240 K-block trace at R = 0.01: there the sample's share of the blocks (±2%)
/// is the error, a percent of it a percent of the miss ratio at every size.
#[test]
fn the_size_axis_follows_the_counted_working_set() {
    let reqs = uniform(600_000, 240_000);
    let exact = profile(&reqs, Method::Exact, 0);
    let (mut scaled, mut own) = (Vec::new(), Vec::new());
    for seed in 0..12 {
        let mut s = Shards::fixed_rate(0.01).with_seed(seed);
        reqs.iter().for_each(|r| s.access(r.offset / 4096));
        let d = s.estimated_distinct();
        assert!((d / exact.cold() - 1.0).abs() < 0.015, "seed {seed}: {d} distinct blocks counted of {}", exact.cold());
        scaled.push(mae_against(&exact, &s.histogram()));
        own.push(mae_against(&exact, &s.histogram_for(None)));
    }
    eprintln!("uniform: scaled {scaled:.4?}, own {own:.4?}");
    assert!(worst(&scaled) <= 0.01, "worst MAE {} over 12 seeds (each: {scaled:?})", worst(&scaled));
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    assert!(mean(&scaled) < 0.8 * mean(&own), "scaled {scaled:?} against the sample's own {own:?}");
}
