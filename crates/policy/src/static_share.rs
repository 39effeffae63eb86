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
    let weights: Vec<f64> = vms.iter().map(|v| v.weight).collect();
    let mins: Vec<u64> = vms.iter().map(|v| v.min_blocks).collect();
    split_by_weight(capacity, &weights, &mins)
}

/// Splits `capacity` by `weights` on top of `mins` (minimums that do not fit are scaled
/// down proportionally; the rounding remainder goes to VMs in order).
pub fn split_by_weight(capacity: u64, weights: &[f64], mins: &[u64]) -> Vec<u64> {
    let total_min: u64 = mins.iter().sum();
    if total_min >= capacity {
        // Minimums do not fit: scale them down proportionally.
        return mins
            .iter()
            .map(|&m| if total_min == 0 { 0 } else { (m as u128 * capacity as u128 / total_min as u128) as u64 })
            .collect();
    }
    let rest = capacity - total_min;
    let total_w: f64 = weights.iter().map(|w| w.max(0.0)).sum();
    let mut t: Vec<u64> = weights
        .iter()
        .zip(mins)
        .map(|(w, &m)| {
            m + if total_w > 0.0 {
                (rest as f64 * w.max(0.0) / total_w).floor() as u64
            } else {
                rest / weights.len() as u64
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

/// Adds whatever `targets` leave of `capacity` to them, split by `weights` (minimums are
/// already met), so no capacity sits idle; hits never fall when a VM gets more space.
pub fn share_leftover(targets: &mut [u64], capacity: u64, weights: &[f64]) {
    let left = capacity.saturating_sub(targets.iter().sum::<u64>());
    if left == 0 {
        return;
    }
    for (t, extra) in targets.iter_mut().zip(split_by_weight(left, weights, &vec![0; weights.len()])) {
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
