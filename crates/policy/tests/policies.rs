//! Allocators on hand-built inputs, against exhaustive search, and under invariants.

use cachevisor_engine::WritePolicy;
use cachevisor_policy::registry::{build, NAMES};
use cachevisor_policy::{hull_greedy, optimal::solve, Pool, ReuseMix, VmDemand};
use proptest::prelude::*;

fn vm(weight: f64, min: u64, curve: Vec<f64>) -> VmDemand {
    VmDemand { weight, min_blocks: min, hit_curve: curve, ..Default::default() }
}

#[test]
fn registry_builds_every_policy_by_name() {
    for n in NAMES {
        assert_eq!(build(n).unwrap().name(), n);
    }
    assert!(build("mru").err().unwrap().contains("static"));
}

#[test]
fn each_policy_names_the_replacement_its_partitions_use_by_default() {
    use cachevisor_engine::ReplacementKind;
    for n in NAMES {
        let a = build(n).unwrap();
        let want = match n {
            "adaptive" => ReplacementKind::S3fifo,
            _ if a.cleaner().is_some() => ReplacementKind::Clock,
            _ => ReplacementKind::Lru,
        };
        assert_eq!(a.replacement(), want, "{n}");
    }
    assert_eq!(build("s-cave").unwrap().replacement(), ReplacementKind::Clock);
}

#[test]
fn parameters_are_read_and_checked() {
    use cachevisor_policy::registry::build_with;
    let p = |kv: &[(&str, f64)]| kv.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    assert!(build_with("s-cave", &p(&[("m", 3.0), ("alpha", 0.5)])).is_ok());
    let e = build_with("s-cave", &p(&[("mm", 3.0)])).err().unwrap();
    assert!(e.contains("`mm` is unknown") && e.contains("alpha"), "{e}");
    let e = build_with("eci-cache", &p(&[("raw_threshold", 1.5)])).err().unwrap();
    assert!(e.contains("raw_threshold") && e.contains("outside"), "{e}");
    let e = build_with("static", &p(&[("gain", 1.0)])).err().unwrap();
    assert!(e.contains("takes none"), "{e}");
    let e = build_with("s-cave", &p(&[("cleaner_low", 0.2), ("cleaner_high", 0.1)])).err().unwrap();
    assert!(e.contains("cleaner_low"), "{e}");
}

#[test]
fn static_shares_follow_weights_and_use_everything() {
    let mut s = build("static").unwrap();
    let d = s.allocate(&Pool::new(100, 1), &[vm(1.0, 0, vec![]), vm(3.0, 0, vec![])]);
    assert_eq!(d.targets, [25, 75]);
    let d = s.allocate(&Pool::new(10, 1), &[vm(1.0, 0, vec![]), vm(1.0, 0, vec![]), vm(1.0, 0, vec![])]);
    assert_eq!(d.targets, [4, 3, 3]);
    let d = s.allocate(&Pool::new(100, 1), &[vm(1.0, 50, vec![]), vm(1.0, 0, vec![])]);
    assert_eq!(d.targets, [75, 25]);
}

#[test]
fn optimal_gives_space_where_hits_grow() {
    // VM 0 saturates after 1 unit; VM 1 keeps gaining: 4 units → 1 and 3.
    let a = vec![0.0, 10.0, 10.0, 10.0, 10.0];
    let b = vec![0.0, 4.0, 8.0, 12.0, 16.0];
    assert_eq!(solve(4, &[&a, &b], &[0, 0]), [1, 3]);
    // A minimum forces VM 0 to 2 units.
    assert_eq!(solve(4, &[&a, &b], &[2, 0]), [2, 2]);
}

#[test]
fn optimal_leaves_no_space_idle() {
    let mut o = build("optimal").unwrap();
    // No information yet (flat curves): weighted shares.
    let d = o.allocate(&Pool::new(100, 10), &[vm(1.0, 0, vec![0.0; 11]), vm(3.0, 0, vec![0.0; 11])]);
    assert_eq!(d.targets, [25, 75]);
    // VM 0 saturates at 2 units; the rest is split by weight on top of the optimum.
    let a: Vec<f64> = (0..=10).map(|k| if k >= 2 { 50.0 } else { 25.0 * k as f64 }).collect();
    let d = o.allocate(&Pool::new(100, 10), &[vm(1.0, 0, a), vm(1.0, 0, vec![0.0; 11])]);
    assert_eq!(d.targets, [20 + 40, 40]);
}

fn brute(units: usize, curves: &[Vec<f64>], mins: &[usize]) -> f64 {
    fn go(i: usize, left: usize, curves: &[Vec<f64>], mins: &[usize]) -> f64 {
        if i == curves.len() {
            return 0.0;
        }
        let mut best = f64::NEG_INFINITY;
        for k in mins[i]..=left {
            let h = curves[i].get(k).copied().unwrap_or(*curves[i].last().unwrap());
            best = best.max(h + go(i + 1, left - k, curves, mins));
        }
        best
    }
    go(0, units, curves, mins)
}

fn curve(len: usize) -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(0u32..20, len).prop_map(|steps| {
        let mut acc = 0.0;
        std::iter::once(0.0)
            .chain(steps.into_iter().map(|s| {
                acc += s as f64;
                acc
            }))
            .collect()
    })
}

proptest! {
    #[test]
    fn optimal_equals_exhaustive_search(units in 0usize..9, curves in prop::collection::vec(curve(9), 1..4), mins in prop::collection::vec(0usize..3, 4)) {
        let mins = &mins[..curves.len()];
        prop_assume!(mins.iter().sum::<usize>() <= units);
        let refs: Vec<&[f64]> = curves.iter().map(|c| c.as_slice()).collect();
        let got = solve(units, &refs, mins);
        prop_assert!(got.iter().sum::<usize>() <= units);
        prop_assert!(got.iter().zip(mins).all(|(g, m)| g >= m));
        let total: f64 = got.iter().zip(&curves).map(|(&k, c)| c[k]).sum();
        prop_assert!((total - brute(units, &curves, mins)).abs() < 1e-9);
    }

    #[test]
    fn every_policy_respects_capacity_and_minimums(capacity in 0u64..500, free in 0u64..500, spec in prop::collection::vec((0.1f64..5.0, 0u64..50, 0u64..600, 0.0f64..1.0, 0.0f64..100.0), 1..6)) {
        let vms: Vec<VmDemand> = spec
            .iter()
            .map(|&(w, m, t, recs, x)| VmDemand {
                target_blocks: t.min(capacity),
                used_blocks: t.min(capacity),
                recs: Some(recs),
                alloc_unit: 7,
                hit_throughput: x,
                throughput_ratio: w,
                read_curve: (0..=50).map(|k| (k as f64).sqrt() * recs).collect(),
                accesses: 100.0,
                ..vm(w, m, (0..=50).map(|k| (k as f64).sqrt()).collect())
            })
            .collect();
        let pool = Pool { capacity, unit: 10, free_blocks: free.min(capacity) };
        let mins: u64 = vms.iter().map(|v| v.min_blocks).sum();
        for n in NAMES {
            let mut a = build(n).unwrap();
            a.allocate(&pool, &vms); // stateful policies: a second call sees their state
            let d = a.allocate(&pool, &vms);
            if d.uncapped {
                prop_assert!(d.targets.iter().all(|&t| t == capacity), "{} uncapped but not the whole pool", n);
                continue;
            }
            prop_assert!(d.targets.iter().sum::<u64>() <= capacity, "{} over capacity", n);
            let unit_mins = vms.iter().map(|v| v.min_blocks.div_ceil(10)).sum::<u64>() * 10 <= capacity;
            if mins <= capacity && (!["optimal", "eci-cache", "centaur"].contains(&n) || unit_mins) {
                prop_assert!(d.targets.iter().zip(&vms).all(|(t, v)| *t >= v.min_blocks), "{} below a minimum", n);
            }
        }
    }
}

proptest! {
    #[test]
    fn hull_greedy_equals_exact_dp_on_concave_curves(units in 0usize..40, gains in prop::collection::vec(prop::collection::vec(0u32..30, 12), 1..5), mins in prop::collection::vec(0usize..3, 5)) {
        // Concave: sorted decreasing gains.
        let curves: Vec<Vec<f64>> = gains.iter().map(|g| {
            let mut g = g.clone();
            g.sort_unstable_by(|a, b| b.cmp(a));
            let mut acc = 0.0;
            std::iter::once(0.0).chain(g.into_iter().map(|s| { acc += s as f64; acc })).collect()
        }).collect();
        let mins = &mins[..curves.len()];
        prop_assume!(mins.iter().sum::<usize>() <= units);
        let refs: Vec<&[f64]> = curves.iter().map(|c| c.as_slice()).collect();
        let value = |ks: &[usize]| ks.iter().zip(&curves).map(|(&k, c)| c[k.min(c.len() - 1)]).sum::<f64>();
        let fast = hull_greedy::solve(units, &refs, mins);
        prop_assert!(fast.iter().sum::<usize>() <= units);
        prop_assert!(fast.iter().zip(mins).all(|(g, m)| g >= m));
        prop_assert!((value(&fast) - value(&solve(units, &refs, mins))).abs() < 1e-9);
    }
}

fn mix(rar: f64, raw: f64) -> ReuseMix {
    ReuseMix { read_after_read: rar, read_after_write: raw, ..Default::default() }
}

#[test]
fn eci_sizes_by_urd_when_it_fits_and_chooses_write_policies() {
    let mut eci = build("eci-cache").unwrap();
    // Read reuses saturate at 3 units (VM 0) and 1 unit (VM 1); all-access curves at 8.
    let all: Vec<f64> = (0..=10).map(|k| (k.min(8) * 10) as f64).collect();
    let r0: Vec<f64> = (0..=10).map(|k| (k.min(3) * 5) as f64).collect();
    let r1: Vec<f64> = (0..=10).map(|k| (k.min(1) * 9) as f64).collect();
    let vms = [
        VmDemand {
            read_curve: r0,
            hit_curve: all.clone(),
            accesses: 100.0,
            reuse_mix: mix(80.0, 20.0),
            weight: 1.0,
            ..Default::default()
        },
        VmDemand {
            read_curve: r1,
            hit_curve: all,
            accesses: 100.0,
            reuse_mix: mix(99.0, 1.0),
            weight: 1.0,
            ..Default::default()
        },
    ];
    let d = eci.allocate(&Pool::new(100, 10), &vms);
    assert_eq!(d.targets, [30, 10], "URD sizes, the rest left unallocated");
    assert_eq!(d.write_policies, [Some(WritePolicy::Wb), Some(WritePolicy::Ro)]);
    // Centaur sizes on every access (8 units each: 16 > 10 units, so it splits) and runs WB.
    let d = build("centaur").unwrap().allocate(&Pool::new(100, 10), &vms);
    assert_eq!(d.targets.iter().sum::<u64>(), 100);
    assert_eq!(d.write_policies, [Some(WritePolicy::Wb); 2]);
    // No useful reuse at all: read-only.
    let d = eci.allocate(
        &Pool::new(100, 10),
        &[VmDemand { reuse_mix: ReuseMix { write_after_write: 50.0, ..Default::default() }, ..vms[0].clone() }],
    );
    assert_eq!(d.write_policies, [Some(WritePolicy::Ro)]);
}

#[test]
fn eci_minimizes_summed_latency_when_urd_sizes_do_not_fit() {
    // 4 units. VM 0: 1,000 accesses, gains 100 hits per unit up to 4 units (10% each);
    // VM 1: 100 accesses, 50 hits in its first unit (50%), then flat. Per-VM latency sum
    // favours VM 1's first unit; a total-hits objective would give VM 0 everything.
    let a: Vec<f64> = (0..=4).map(|k| (k * 100) as f64).collect();
    let b: Vec<f64> = (0..=4).map(|k| if k >= 1 { 50.0 } else { 0.0 }).collect();
    let vms = [
        VmDemand { read_curve: a.clone(), hit_curve: a, accesses: 1000.0, ..Default::default() },
        VmDemand { read_curve: b.clone(), hit_curve: b, accesses: 100.0, ..Default::default() },
    ];
    let d = build("eci-cache").unwrap().allocate(&Pool::new(4, 1), &vms);
    assert_eq!(d.targets, [3, 1]);
    let d = build("optimal").unwrap().allocate(&Pool::new(4, 1), &vms);
    assert_eq!(d.targets, [4, 0]);
}
