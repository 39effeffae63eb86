//! `optimal`: the allocation maximizing total hits under the capacity, by exact dynamic
//! programming over allocation units (the upper bound every policy is measured against;
//! offline when fed whole-trace curves, per interval when fed each interval's own).
//!
//! With K units of capacity and n VMs, `best[i][k]` = most hits of the first i VMs using
//! k units; O(n·K²) time, O(n·K) memory for the choice table. Minimums are honoured by
//! starting each VM at its minimum unit count. Ties go to the smaller allocation of the
//! earlier VM, so the result is deterministic; capacity the curves do not gain from is
//! then shared by weight rather than left idle.

use crate::allocator::{Allocator, Decision, Needs, Pool, VmDemand};

/// Exact DP over allocation units.
#[derive(Debug, Clone, Default)]
pub struct Optimal;

/// Hits of `curve` at `k` units (the last point beyond the curve's end).
fn hits(curve: &[f64], k: usize) -> f64 {
    match curve.get(k) {
        Some(&h) => h,
        None => curve.last().copied().unwrap_or(0.0),
    }
}

/// First point at which a non-decreasing curve reaches its maximum.
pub fn saturation_units(curve: &[f64]) -> usize {
    let max = curve.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    curve.iter().position(|&h| h >= max - 1e-9).unwrap_or(0)
}

/// The optimal units per VM for curves in units, `units` of capacity, minimum units.
pub fn solve(units: usize, curves: &[&[f64]], min_units: &[usize]) -> Vec<usize> {
    let n = curves.len();
    let neg = f64::NEG_INFINITY;
    let mut best = vec![neg; units + 1];
    best[0] = 0.0;
    let mut choice = vec![vec![0usize; units + 1]; n];
    for i in 0..n {
        // Past its saturation point a curve gains nothing: never try more (exact, and
        // what keeps 1,000-VM calls fast).
        let sat = saturation_units(curves[i]).max(min_units[i]);
        let mut next = vec![neg; units + 1];
        for (used, &b) in best.iter().enumerate() {
            if b == neg {
                continue;
            }
            for k in min_units[i]..=(units - used).min(sat) {
                let v = b + hits(curves[i], k);
                if v > next[used + k] + 1e-12 {
                    next[used + k] = v;
                    choice[i][used + k] = k;
                }
            }
        }
        best = next;
    }
    // The best total over any used amount ≤ units (smallest on ties).
    let mut at = 0;
    for k in 0..=units {
        if best[k] > best[at] + 1e-12 {
            at = k;
        }
    }
    let mut out = vec![0; n];
    for i in (0..n).rev() {
        let k = choice[i][at];
        out[i] = k;
        at -= k;
    }
    out
}

impl Allocator for Optimal {
    fn name(&self) -> &'static str {
        "optimal"
    }

    fn needs(&self) -> Needs {
        Needs { hit_curves: true, ..Needs::default() }
    }

    fn allocate(&mut self, pool: &Pool, vms: &[VmDemand]) -> Decision {
        let (capacity, unit) = (pool.capacity, pool.unit.max(1));
        let units = (capacity / unit) as usize;
        let min_units: Vec<usize> = vms.iter().map(|v| v.min_blocks.div_ceil(unit) as usize).collect();
        let targets = if min_units.iter().sum::<usize>() > units {
            crate::static_share::weighted_split(capacity, vms)
        } else {
            let curves: Vec<&[f64]> = vms.iter().map(|v| v.hit_curve.as_slice()).collect();
            let mut t: Vec<u64> = solve(units, &curves, &min_units).into_iter().map(|k| k as u64 * unit).collect();
            // Space no curve gains from (saturated curves, or no information yet).
            crate::static_share::share_leftover(&mut t, capacity, vms);
            t
        };
        Decision::targets(targets)
    }
}
