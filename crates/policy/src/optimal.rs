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
pub(crate) fn hits(curve: &[f64], k: usize) -> f64 {
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
///
/// Layer i holds the best total of the first i VMs at every capacity used; each layer is
/// a max-plus pass (`next[u + k] = max(next[u + k], best[u] + h(k))`) over slices, which
/// vectorizes, and choices are recovered afterwards by walking the layers back (the
/// largest k reproducing the optimum, so earlier VMs keep the smaller totals on ties).
pub fn solve(units: usize, curves: &[&[f64]], min_units: &[usize]) -> Vec<usize> {
    let n = curves.len();
    let neg = f64::NEG_INFINITY;
    let mut layers: Vec<Vec<f64>> = Vec::with_capacity(n + 1);
    let mut first = vec![neg; units + 1];
    first[0] = 0.0;
    layers.push(first);
    let sats: Vec<usize> = (0..n).map(|i| saturation_units(curves[i]).max(min_units[i]).min(units)).collect();
    for i in 0..n {
        // Past its saturation point a curve gains nothing: never try more (exact, and
        // what keeps 1,000-VM calls fast).
        let best = &layers[i];
        let mut next = vec![neg; units + 1];
        for k in min_units[i]..=sats[i] {
            let h = hits(curves[i], k);
            let lim = units - k;
            for (d, &b) in next[k..].iter_mut().zip(&best[..=lim]) {
                // A plain compare-select, not `f64::max` (whose NaN rule costs extra
                // instructions per lane): the values are never NaN (−∞ + finite = −∞).
                let x = b + h;
                *d = if x > *d { x } else { *d };
            }
        }
        layers.push(next);
    }
    // The best total over any used amount ≤ units (smallest on ties).
    let last = &layers[n];
    let mut at = 0;
    for k in 0..=units {
        if last[k] > last[at] + 1e-12 {
            at = k;
        }
    }
    let mut out = vec![0; n];
    for i in (0..n).rev() {
        let target = layers[i + 1][at];
        let k = (min_units[i]..=sats[i].min(at))
            .rev()
            .find(|&k| layers[i][at - k] + hits(curves[i], k) == target)
            .expect("the optimum is reproduced by some choice");
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
            let weights: Vec<f64> = vms.iter().map(|v| v.weight).collect();
            crate::static_share::share_leftover(&mut t, capacity, &weights);
            t
        };
        Decision::targets(targets)
    }
}
