//! `symflex-weighted`: SymFlex's weighted fair share provisioning (SymFlex §2.2, §5.2):
//! each VM's vSSD gets a share of the SSD in proportion to its weight, and what a VM does
//! not use is redistributed to the others by weight (max-min fairness by water-filling).
//!
//! The seed does not define "does not use"; here a VM's demand is the smallest size at
//! which its hit curve stops gaining (the curve's saturation point; unlimited without a
//! curve). Minimums are met first. Space left after every demand is met is shared by
//! weight so none sits idle.

use crate::allocator::{Allocator, Decision, Needs, Pool, VmDemand};
use crate::static_share::{share_leftover, weighted_split};

/// Weighted fair share with redistribution.
#[derive(Debug, Clone, Default)]
pub struct SymflexWeighted;

/// Blocks at which `curve` (hits per `unit` step) reaches its maximum; `None` if no curve.
pub fn saturation_blocks(curve: &[f64], unit: u64) -> Option<u64> {
    (!curve.is_empty()).then(|| crate::optimal::saturation_units(curve) as u64 * unit)
}

/// Max-min fair split of `capacity` by weight with per-VM caps (`None` = no cap).
pub fn water_fill(capacity: u64, weights: &[f64], caps: &[Option<u64>]) -> Vec<u64> {
    let n = weights.len();
    let mut out = vec![0u64; n];
    let mut active: Vec<usize> = (0..n).filter(|&i| caps[i] != Some(0)).collect();
    let mut left = capacity;
    while left > 0 && !active.is_empty() {
        let w: f64 = active.iter().map(|&i| weights[i].max(1e-12)).sum();
        // The VMs whose cap is below their fair share this round are filled to the cap.
        let capped: Vec<usize> = active
            .iter()
            .copied()
            .filter(|&i| caps[i].is_some_and(|c| ((c - out[i]) as f64) <= left as f64 * weights[i].max(1e-12) / w))
            .collect();
        if capped.is_empty() {
            let shares: Vec<VmDemand> =
                active.iter().map(|&i| VmDemand { weight: weights[i].max(1e-12), ..Default::default() }).collect();
            for (&i, s) in active.iter().zip(weighted_split(left, &shares)) {
                out[i] += s;
            }
            break;
        }
        for i in capped {
            let give = caps[i].unwrap() - out[i];
            out[i] += give;
            left -= give;
            active.retain(|&x| x != i);
        }
    }
    out
}

impl Allocator for SymflexWeighted {
    fn name(&self) -> &'static str {
        "symflex-weighted"
    }

    fn needs(&self) -> Needs {
        Needs { hit_curves: true, ..Needs::default() }
    }

    fn allocate(&mut self, pool: &Pool, vms: &[VmDemand]) -> Decision {
        let (capacity, unit) = (pool.capacity, pool.unit);
        let mins: u64 = vms.iter().map(|v| v.min_blocks).sum();
        if mins >= capacity {
            return Decision::targets(weighted_split(capacity, vms));
        }
        let weights: Vec<f64> = vms.iter().map(|v| v.weight).collect();
        let caps: Vec<Option<u64>> =
            vms.iter().map(|v| saturation_blocks(&v.hit_curve, unit).map(|c| c.saturating_sub(v.min_blocks))).collect();
        let fair = water_fill(capacity - mins, &weights, &caps);
        let mut targets: Vec<u64> = vms.iter().zip(&fair).map(|(v, f)| v.min_blocks + f).collect();
        share_leftover(&mut targets, capacity, &vms.iter().map(|v| v.weight).collect::<Vec<_>>());
        Decision::targets(targets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn water_filling_redistributes_unused_share() {
        // Equal weights, 90 blocks: VM 0 needs only 10, the others split the rest.
        assert_eq!(water_fill(90, &[1.0, 1.0, 1.0], &[Some(10), None, None]), [10, 40, 40]);
        // Weights 1:2, no caps.
        assert_eq!(water_fill(90, &[1.0, 2.0], &[None, None]), [30, 60]);
        // Both capped below capacity: each gets its cap.
        assert_eq!(water_fill(100, &[1.0, 1.0], &[Some(20), Some(30)]), [20, 30]);
    }

    #[test]
    fn saturation_is_where_the_curve_stops_gaining() {
        assert_eq!(saturation_blocks(&[0.0, 5.0, 9.0, 9.0, 9.0], 10), Some(20));
        assert_eq!(saturation_blocks(&[], 10), None);
    }
}
