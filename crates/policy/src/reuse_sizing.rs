//! Reuse-distance sizing shared by ECI-Cache (on URD, read reuses only) and the
//! Centaur-like baseline (on plain reuse distance, every access).
//!
//! Each VM's demand is the smallest size at which its curve stops gaining (the largest
//! reuse distance that still yields hits within the pool, rounded up to allocation
//! units). When the demands fit, each VM gets its demand and the rest of the pool stays
//! unallocated — smaller caches are the point (ECI-Cache abstract: "minimize the allocated
//! cache size for each VM while maintaining the performance"). When they do not fit, the
//! sizes minimize the sum of the VMs' modelled latencies, Σ_i h_i·T_ssd + (1 − h_i)·T_hdd
//! with h_i the VM's hit ratio from its curve; as T_ssd < T_hdd are the same for every VM
//! this is maximizing Σ_i h_i, whatever the two latencies are. Solved exactly by dynamic
//! programming over allocation units ([`crate::optimal::solve`]) when that is small
//! (n·K·K_sat ≤ 4·10⁶ steps), otherwise over concave hulls ([`crate::hull_greedy`]),
//! exact when the curves are concave. Before any VM has a curve (the first interval) the
//! pool is split by weight.

use crate::allocator::{Pool, VmDemand};
use crate::optimal::saturation_units;
use crate::static_share::weighted_split;

/// DP steps above which the hull method is used.
const EXACT_BUDGET: usize = 4_000_000;

/// Targets in blocks for `vms`, sized on `curve(vm)`.
pub fn size_by_reuse(pool: &Pool, vms: &[VmDemand], curve: impl Fn(&VmDemand) -> &[f64]) -> Vec<u64> {
    let unit = pool.unit.max(1);
    let units = (pool.capacity / unit) as usize;
    let min_units: Vec<usize> = vms.iter().map(|v| v.min_blocks.div_ceil(unit) as usize).collect();
    // Minimums that do not fit, or no VM measured yet (a cold start): weighted shares.
    if min_units.iter().sum::<usize>() > units || vms.iter().all(|v| curve(v).is_empty()) {
        return weighted_split(pool.capacity, vms);
    }
    let demand: Vec<usize> =
        vms.iter().zip(&min_units).map(|(v, &m)| saturation_units(curve(v)).min(units).max(m)).collect();
    let chosen = if demand.iter().sum::<usize>() <= units {
        demand
    } else {
        let ratios: Vec<Vec<f64>> =
            vms.iter().map(|v| curve(v).iter().map(|h| h / v.accesses.max(1.0)).collect()).collect();
        let refs: Vec<&[f64]> = ratios.iter().map(|c| c.as_slice()).collect();
        let steps: usize = demand.iter().map(|&d| d * units).sum();
        if steps <= EXACT_BUDGET {
            crate::optimal::solve(units, &refs, &min_units)
        } else {
            crate::hull_greedy::solve(units, &refs, &min_units)
        }
    };
    chosen.into_iter().map(|k| k as u64 * unit).collect()
}
