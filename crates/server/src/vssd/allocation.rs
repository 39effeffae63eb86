//! The allocator over the vSSD region (SymFlex §2.2, §5.2): every interval, each running
//! vSSD's weight, throughput ratio and vSSD throughput (requests it served per second,
//! counted by the service) go into the `policy` crate's `symflex-weighted` or
//! `symflex-proportional` — the same code the simulator runs for host partitions — and the
//! targets it returns, capped at each vSSD's M and at least one block each (taken from
//! the largest), are set: inflates at once, deflates asked
//! of the guests (§2.4.3). Weights and ratios change at run time (`POST
//! /vssds/NAME/share`, Fig. 8's windows).

use super::service::VssdService;
use crate::config::vssd_section::Share;
use cachevisor_policy::allocator::{Allocator, Pool, VmDemand};
use cachevisor_vssd::VssdId;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The running allocator's state others read and change.
#[derive(Debug, Default)]
pub struct Allocation {
    /// Its name (`none` when no allocator runs).
    pub name: String,
    shares: Mutex<BTreeMap<VssdId, Share>>,
    /// Requests per second each vSSD served in the last interval.
    throughput: Mutex<BTreeMap<VssdId, f64>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Allocation {
    /// vSSD `id`'s share.
    pub fn share(&self, id: VssdId) -> Share {
        lock(&self.shares).get(&id).copied().unwrap_or_default()
    }

    /// Sets vSSD `id`'s share (both > 0).
    pub fn set_share(&self, id: VssdId, share: Share) -> Result<(), String> {
        if !(share.weight > 0.0 && share.ratio > 0.0 && share.weight.is_finite() && share.ratio.is_finite()) {
            return Err(format!("weight {} and ratio {} must be above 0", share.weight, share.ratio));
        }
        lock(&self.shares).insert(id, share);
        Ok(())
    }

    /// vSSD `id`'s throughput in the last interval.
    pub fn throughput(&self, id: VssdId) -> f64 {
        lock(&self.throughput).get(&id).copied().unwrap_or(0.0)
    }
}

/// Starts allocator `name` (one of [`ALLOCATORS`]) over `svc`'s region every `interval`;
/// `shares` are the configured devices' by id.
pub fn start(
    svc: Arc<VssdService>,
    name: &str,
    interval: Duration,
    shares: BTreeMap<VssdId, Share>,
) -> Result<Arc<Allocation>, String> {
    let mut alloc = cachevisor_policy::registry::build(name).map_err(|e| format!("vssd.allocator: {e}"))?;
    let a = Arc::new(Allocation { name: name.to_string(), shares: Mutex::new(shares), throughput: Default::default() });
    let shared = a.clone();
    std::thread::Builder::new()
        .name("cv-vssd-alloc".into())
        .spawn(move || {
            let mut last: (Instant, BTreeMap<VssdId, u64>) = (Instant::now(), BTreeMap::new());
            loop {
                std::thread::sleep(interval);
                if svc.halted() {
                    return;
                }
                last = step(&svc, &shared, &mut *alloc, last);
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(a)
}

/// Gives every vSSD the allocator left with no block one, taken from the largest: a vSSD
/// with none serves nothing, so its throughput (what `symflex-proportional` measures)
/// could never call it back. Targets the allocator gave are kept otherwise.
fn at_least_one_block(targets: &mut [u64]) {
    for i in 0..targets.len() {
        if targets[i] == 0 {
            let Some(big) = (0..targets.len()).filter(|&j| targets[j] > 1).max_by_key(|&j| targets[j]) else { return };
            targets[big] -= 1;
            targets[i] = 1;
        }
    }
}

/// One interval: throughputs measured, targets decided and set.
fn step(
    svc: &VssdService,
    a: &Allocation,
    alloc: &mut dyn Allocator,
    (since, served_then): (Instant, BTreeMap<VssdId, u64>),
) -> (Instant, BTreeMap<VssdId, u64>) {
    let vssds = svc.running_vssds();
    let ids: Vec<VssdId> = vssds.iter().map(|&(id, _)| id).collect();
    // A shared budget's split not decided for these vSSDs yet (one just started or
    // stopped): this interval waits, and the next measures over both.
    let Some(capacity) = svc.capacity_for(&ids) else { return (since, served_then) };
    let secs = since.elapsed().as_secs_f64().max(1e-3);
    let now = Instant::now();
    let served: BTreeMap<VssdId, u64> = vssds.iter().map(|&(id, _)| (id, svc.served(id))).collect();
    let (mut demands, mut ids) = (Vec::new(), Vec::new());
    for &(id, max) in &vssds {
        let Some((st, valid)) = svc.status(id) else { continue };
        let delta = served[&id] - served_then.get(&id).copied().unwrap_or(served[&id]);
        let share = a.share(id);
        lock(&a.throughput).insert(id, delta as f64 / secs);
        demands.push(VmDemand {
            weight: share.weight,
            throughput_ratio: share.ratio,
            target_blocks: u64::from(st.target),
            used_blocks: valid.len() as u64,
            window_requests: delta,
            hit_throughput: delta as f64 / secs,
            ..VmDemand::default()
        });
        ids.push((id, max));
    }
    if !demands.is_empty() {
        let pool = Pool { capacity: u64::from(capacity), unit: 1, free_blocks: u64::from(svc.free_blocks()) };
        let mut targets = alloc.allocate(&pool, &demands).targets;
        at_least_one_block(&mut targets);
        for (&(id, max), &t) in ids.iter().zip(&targets) {
            let t = t.min(u64::from(max)) as u32;
            if let Err(e) = svc.set_target(id, t) {
                tracing::warn!(vssd = id, %e, "the allocator's target was refused");
            }
        }
    }
    (now, served)
}

#[cfg(test)]
mod tests {
    use super::at_least_one_block;

    #[test]
    fn a_vssd_left_with_nothing_gets_one_block_from_the_largest_and_others_keep_theirs() {
        let mut t = vec![0, 14, 2, 0];
        at_least_one_block(&mut t);
        assert_eq!(t, vec![1, 12, 2, 1]);
        let mut t = vec![4, 12];
        at_least_one_block(&mut t);
        assert_eq!(t, vec![4, 12], "nothing at 0: unchanged");
        let mut t = vec![0, 1];
        at_least_one_block(&mut t);
        assert_eq!(t, vec![0, 1], "no block to spare");
    }
}
