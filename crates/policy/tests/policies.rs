//! Allocators on hand-built inputs, against exhaustive search, and under invariants.

use cachevisor_policy::registry::{build, NAMES};
use cachevisor_policy::{optimal::solve, VmDemand};
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
fn static_shares_follow_weights_and_use_everything() {
    let mut s = build("static").unwrap();
    let d = s.allocate(100, 1, &[vm(1.0, 0, vec![]), vm(3.0, 0, vec![])]);
    assert_eq!(d.targets, [25, 75]);
    let d = s.allocate(10, 1, &[vm(1.0, 0, vec![]), vm(1.0, 0, vec![]), vm(1.0, 0, vec![])]);
    assert_eq!(d.targets, [4, 3, 3]);
    let d = s.allocate(100, 1, &[vm(1.0, 50, vec![]), vm(1.0, 0, vec![])]);
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
    let d = o.allocate(100, 10, &[vm(1.0, 0, vec![0.0; 11]), vm(3.0, 0, vec![0.0; 11])]);
    assert_eq!(d.targets, [25, 75]);
    // VM 0 saturates at 2 units; the rest is split by weight on top of the optimum.
    let a: Vec<f64> = (0..=10).map(|k| if k >= 2 { 50.0 } else { 25.0 * k as f64 }).collect();
    let d = o.allocate(100, 10, &[vm(1.0, 0, a), vm(1.0, 0, vec![0.0; 11])]);
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
        std::iter::once(0.0).chain(steps.into_iter().map(|s| { acc += s as f64; acc })).collect()
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
    fn every_policy_respects_capacity_and_minimums(capacity in 0u64..500, spec in prop::collection::vec((0.1f64..5.0, 0u64..50), 1..6)) {
        let vms: Vec<VmDemand> = spec.iter().map(|&(w, m)| vm(w, m, (0..=50).map(|k| (k as f64).sqrt()).collect())).collect();
        let mins: u64 = vms.iter().map(|v| v.min_blocks).sum();
        for n in NAMES {
            let d = build(n).unwrap().allocate(capacity, 10, &vms);
            prop_assert!(d.targets.iter().sum::<u64>() <= capacity, "{} over capacity", n);
            if mins <= capacity && (n != "optimal" || vms.iter().map(|v| v.min_blocks.div_ceil(10)).sum::<u64>() * 10 <= capacity) {
                prop_assert!(d.targets.iter().zip(&vms).all(|(t, v)| *t >= v.min_blocks), "{} below a minimum", n);
            }
        }
    }
}
