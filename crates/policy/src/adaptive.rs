//! `adaptive`: cachevisor's own allocator, beyond the seeds — the exact split of the pool
//! on each VM's recent hit curve, with a long memory, hysteresis, idle VMs let go, and
//! shrinks paced by what they write back.
//!
//! What each part is for (measured on `experiment policy-compare`, docs/policies.md):
//! - **Curves with a long memory.** Exact LRU hit curves at the allocation unit (the
//!   controller's online profiler), counts halved every `half_life` windows (default 20)
//!   rather than every window as `optimal-online` does. A VM whose reuse spans minutes
//!   (CloudPhysics: near-linear gain up to its 1 GiB working set) keeps the cache it will
//!   come back to; with a one-window memory a quiet phase hands its cache to a VM with a
//!   better recent window, and the next busy phase finds it cold.
//! - **The split**: [`crate::optimal::solve`], the exact DP over allocation units (the
//!   same as `optimal`), on those curves.
//! - **Hysteresis**: the split changes only when the new one gains more than `hysteresis`
//!   (default 0.2%) of the VMs' recent accesses over the current targets on the same
//!   curves; noise in the curves does not move blocks.
//! - **Idle VMs let go**: a VM with no requests for `idle_windows` windows (default 3)
//!   counts as gaining nothing, so its cache goes to VMs that use it (a decayed curve
//!   would hold it for many half-lives).
//! - **Paced shrinks** ([`cachevisor_engine::Engine::set_target_paced`]): an eager shrink
//!   evicts to the new target at once and writes the evicted dirty blocks back in one
//!   burst that the VM's disk queues its next requests behind (p99.9 of 190–290 ms for
//!   tpcc and the weak VM at 64 MiB against static's 42–94 ms). Paced, a VM above its
//!   target gives one block up per miss of a growing VM that finds no free slot, so the
//!   write-backs spread over the misses that need the space, as in a shared cache.
//! - Space no curve gains from goes to the VMs active in the last window, in proportion to
//!   their recent accesses (by weight when none is).

use crate::allocator::{Allocator, Decision, Needs, Pool, VmDemand};
use crate::optimal::{hits, solve};
use crate::params::{ParamReader, Params};
use crate::static_share::{share_leftover, weighted_split};

/// Default half-life of the curves' counts, in windows.
pub const HALF_LIFE: f64 = 20.0;
/// Default share of recent accesses a new split must gain to replace the current one.
pub const HYSTERESIS: f64 = 0.002;
/// Default windows without requests after which a VM is idle.
pub const IDLE_WINDOWS: f64 = 3.0;

/// The adaptive allocator and what it remembers between windows.
#[derive(Debug, Clone)]
pub struct Adaptive {
    /// Half-life of the curves' counts in windows.
    pub half_life: u32,
    /// Share of recent accesses a new split must gain.
    pub hysteresis: f64,
    /// Windows without requests after which a VM is idle.
    pub idle_windows: u32,
    /// Consecutive windows without requests, per VM.
    quiet: Vec<u32>,
}

impl Default for Adaptive {
    fn default() -> Self {
        Adaptive {
            half_life: HALF_LIFE as u32,
            hysteresis: HYSTERESIS,
            idle_windows: IDLE_WINDOWS as u32,
            quiet: Vec::new(),
        }
    }
}

impl Adaptive {
    /// With the parameters of `p` over the defaults.
    pub fn from_params(p: &Params) -> Result<Self, String> {
        let mut r = ParamReader::new("adaptive", p);
        let half_life = r.get("half_life", HALF_LIFE, 1.0, 10_000.0)? as u32;
        let hysteresis = r.get("hysteresis", HYSTERESIS, 0.0, 1.0)?;
        let idle_windows = r.get("idle_windows", IDLE_WINDOWS, 1.0, 1e6)? as u32;
        r.finish()?;
        Ok(Adaptive { half_life, hysteresis, idle_windows, quiet: Vec::new() })
    }

    /// Counts quiet windows; a call with no VM's window counted (VMs arriving) changes
    /// nothing.
    fn note_windows(&mut self, vms: &[VmDemand]) {
        self.quiet.resize(vms.len(), 0);
        if vms.iter().all(|v| v.window_requests == 0) {
            return;
        }
        for (q, v) in self.quiet.iter_mut().zip(vms) {
            *q = if v.window_requests == 0 { q.saturating_add(1) } else { 0 };
        }
    }
}

impl Allocator for Adaptive {
    fn name(&self) -> &'static str {
        "adaptive"
    }

    fn every_interval(&self) -> bool {
        true
    }

    fn needs(&self) -> Needs {
        Needs { hit_curves: true, curve_half_life: self.half_life, ..Needs::default() }
    }

    fn allocate(&mut self, pool: &Pool, vms: &[VmDemand]) -> Decision {
        let (capacity, unit) = (pool.capacity, pool.unit.max(1));
        let units = (capacity / unit) as usize;
        let min_units: Vec<usize> = vms.iter().map(|v| v.min_blocks.div_ceil(unit) as usize).collect();
        if min_units.iter().sum::<usize>() > units || vms.iter().all(|v| v.hit_curve.is_empty()) {
            // Minimums that do not fit, or nothing measured yet: weighted shares.
            return Decision::targets(weighted_split(capacity, vms));
        }
        self.note_windows(vms);
        let idle: Vec<bool> = self.quiet.iter().map(|&q| q >= self.idle_windows).collect();
        let curves: Vec<&[f64]> =
            vms.iter().zip(&idle).map(|(v, &i)| if i { &[][..] } else { v.hit_curve.as_slice() }).collect();
        let ideal: Vec<u64> = solve(units, &curves, &min_units).into_iter().map(|k| k as u64 * unit).collect();

        let current: Vec<u64> = vms.iter().map(|v| v.target_blocks).collect();
        let valid = current.iter().sum::<u64>() <= capacity
            && current.iter().any(|&t| t > 0)
            && vms.iter().zip(&current).all(|(v, &t)| t >= v.min_blocks);
        let total = |t: &[u64]| -> f64 { curves.iter().zip(t).map(|(c, &b)| hits(c, (b / unit) as usize)).sum() };
        let accesses: f64 = vms.iter().zip(&idle).filter(|(_, &i)| !i).map(|(v, _)| v.accesses).sum();
        let keep = valid && total(&ideal) - total(&current) <= self.hysteresis * accesses;
        let mut targets = if keep { current } else { ideal };
        // Space no curve gains from: to the VMs active in the last window, by their
        // accesses (weights only: no VM's curves are copied).
        let active: Vec<f64> = vms.iter().zip(&idle).map(|(v, &i)| if i { 0.0 } else { v.accesses.max(0.0) }).collect();
        if active.iter().any(|&w| w > 0.0) {
            share_leftover(&mut targets, capacity, &active);
        } else {
            share_leftover(&mut targets, capacity, &vms.iter().map(|v| v.weight).collect::<Vec<_>>());
        }
        Decision { paced_shrinks: true, ..Decision::targets(targets) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A VM with a linear curve (hits `slope` per unit up to `sat` units), holding `target`.
    fn vm(slope: f64, sat: usize, target: u64, window_requests: u64) -> VmDemand {
        VmDemand {
            weight: 1.0,
            hit_curve: (0..=8).map(|k| slope * k.min(sat) as f64).collect(),
            accesses: slope * 10.0,
            target_blocks: target,
            used_blocks: target,
            window_requests,
            ..Default::default()
        }
    }

    fn pool() -> Pool {
        Pool::new(800, 100)
    }

    #[test]
    fn splits_as_the_exact_dp_and_paces_its_shrinks() {
        let mut a = Adaptive::default();
        let d = a.allocate(&pool(), &[vm(10.0, 6, 0, 1), vm(5.0, 8, 0, 1)]);
        assert_eq!(d.targets, [600, 200]);
        assert!(d.paced_shrinks);
    }

    #[test]
    fn a_small_gain_keeps_the_current_split_and_a_large_one_moves_it() {
        let mut a = Adaptive { hysteresis: 0.05, ..Adaptive::default() };
        // Optimal is 600/200; 500/300 loses 10 − 5 = 5 hits of 150 accesses (3.3% < 5%).
        let d = a.allocate(&pool(), &[vm(10.0, 6, 500, 1), vm(5.0, 8, 300, 1)]);
        assert_eq!(d.targets, [500, 300]);
        // 200/600 loses 4 × 5 = 20 hits (13% > 5%): it moves to the optimum.
        let d = a.allocate(&pool(), &[vm(10.0, 6, 200, 1), vm(5.0, 8, 600, 1)]);
        assert_eq!(d.targets, [600, 200]);
        // Without hysteresis the smallest gain moves it.
        let mut a = Adaptive { hysteresis: 0.0, ..Adaptive::default() };
        assert_eq!(a.allocate(&pool(), &[vm(10.0, 6, 500, 1), vm(5.0, 8, 300, 1)]).targets, [600, 200]);
    }

    #[test]
    fn an_idle_vm_lets_its_cache_go_after_its_quiet_windows() {
        let mut a = Adaptive { idle_windows: 2, ..Adaptive::default() };
        let busy = |t| vm(5.0, 8, t, 10);
        // VM 0 has the better curve but stops issuing requests.
        let mut t = [600u64, 200];
        let mut history = Vec::new();
        for _ in 0..3 {
            let d = a.allocate(&pool(), &[vm(10.0, 6, t[0], 0), busy(t[1])]);
            t = [d.targets[0], d.targets[1]];
            history.push(t);
        }
        assert_eq!(history[0], [600, 200], "one quiet window changes nothing");
        assert_eq!(history[1], [0, 800], "idle after two: all of it to the busy VM");
        // A call between windows (VMs arriving: nobody's requests counted) does not age it.
        let mut b = Adaptive { idle_windows: 1, ..Adaptive::default() };
        let d = b.allocate(&pool(), &[vm(10.0, 6, 600, 0), vm(5.0, 8, 200, 0)]);
        assert_eq!(d.targets, [600, 200]);
    }

    #[test]
    fn space_no_curve_gains_from_goes_to_the_active_vms() {
        let mut a = Adaptive::default();
        // Both saturate at 2 units; VM 1 is idle for good.
        let mut quiet = vm(10.0, 2, 0, 0);
        a.quiet = vec![0, 10];
        quiet.hit_curve = vec![0.0; 9];
        let d = a.allocate(&pool(), &[vm(10.0, 2, 0, 5), quiet]);
        assert_eq!(d.targets, [800, 0]);
    }

    #[test]
    fn parameters_are_checked() {
        let p: Params = [("half_life".to_string(), 0.0)].into();
        assert!(Adaptive::from_params(&p).unwrap_err().contains("half_life"));
        let p: Params = [("shrink".to_string(), 1.0)].into();
        assert!(Adaptive::from_params(&p).unwrap_err().contains("unknown"));
        let p: Params = [("half_life".to_string(), 5.0)].into();
        assert_eq!(Adaptive::from_params(&p).unwrap().needs().curve_half_life, 5);
    }
}
