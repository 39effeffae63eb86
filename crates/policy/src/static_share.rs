//! `static`: fixed shares of the cache in proportion to configured weights (equal shares
//! when all weights are 1), the baseline every seed compares against. Minimums are met
//! first; the rest is split by weight, rounding down, with the remainder going to VMs in
//! order so the whole capacity is used.

use crate::allocator::{Allocator, Decision, Pool, VmDemand};

/// Weighted static shares.
#[derive(Debug, Clone, Default)]
pub struct StaticShare;

/// Splits `capacity` by weight on top of each VM's minimum.
pub fn weighted_split(capacity: u64, vms: &[VmDemand]) -> Vec<u64> {
    let mins: u64 = vms.iter().map(|v| v.min_blocks).sum();
    if mins >= capacity {
        // Minimums do not fit: scale them down proportionally.
        return vms
            .iter()
            .map(|v| if mins == 0 { 0 } else { (v.min_blocks as u128 * capacity as u128 / mins as u128) as u64 })
            .collect();
    }
    let rest = capacity - mins;
    let total_w: f64 = vms.iter().map(|v| v.weight.max(0.0)).sum();
    let mut t: Vec<u64> = vms
        .iter()
        .map(|v| {
            v.min_blocks
                + if total_w > 0.0 {
                    (rest as f64 * v.weight.max(0.0) / total_w).floor() as u64
                } else {
                    rest / vms.len() as u64
                }
        })
        .collect();
    let mut left = capacity - t.iter().sum::<u64>().min(capacity);
    for ti in t.iter_mut() {
        if left == 0 {
            break;
        }
        *ti += 1;
        left -= 1;
    }
    t
}

/// Adds whatever `targets` leave of `capacity` to them, split by weight (minimums are
/// already met), so no capacity sits idle; hits never fall when a VM gets more space.
pub fn share_leftover(targets: &mut [u64], capacity: u64, vms: &[VmDemand]) {
    let left = capacity.saturating_sub(targets.iter().sum::<u64>());
    if left == 0 {
        return;
    }
    let shares: Vec<VmDemand> = vms.iter().map(|v| VmDemand { min_blocks: 0, ..v.clone() }).collect();
    for (t, extra) in targets.iter_mut().zip(weighted_split(left, &shares)) {
        *t += extra;
    }
}

impl Allocator for StaticShare {
    fn name(&self) -> &'static str {
        "static"
    }

    fn allocate(&mut self, pool: &Pool, vms: &[VmDemand]) -> Decision {
        Decision::targets(weighted_split(pool.capacity, vms))
    }
}
