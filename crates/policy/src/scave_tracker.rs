//! `scave-recs` and `scave-hitratio`: S-CAVE's single-VM demand tracking (S-CAVE §VI-C,
//! Fig. 4). Each VM is sized on its own behaviour, not against the others: its cache grows
//! by AllocUnit when its metric rose over the last window and shrinks by AllocUnit when it
//! fell, with Algorithm 1's feedback (more than m = 5 decreases in a row → a test increase
//! of 2 × AllocUnit). The metric is rECS (`scave-recs`) or the window's hit ratio
//! (`scave-hitratio`), both smoothed with α = 0.8 as Alg. 1 line 13 smooths rECS, so the
//! two differ only in the metric. A VM starts small: 1% of the pool (the seed: "started
//! with a small cache size"). If the VMs together ask for more than the pool, every
//! target is scaled down in proportion.

use crate::allocator::{Allocator, Decision, Pool, VmDemand};
use crate::scave::ScaveParams;

/// Which signal drives the tracker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// Sampled rECS.
    Recs,
    /// Block hit ratio of the window.
    HitRatio,
}

/// Per-VM demand tracking by a metric's change.
#[derive(Debug, Clone)]
pub struct ScaveTracker {
    metric: Metric,
    params: ScaveParams,
    e_old: Vec<Option<f64>>,
    dcounter: Vec<u32>,
}

impl ScaveTracker {
    /// A tracker on `metric` with S-CAVE's default parameters.
    pub fn new(metric: Metric) -> Self {
        Self::with_params(metric, ScaveParams::default())
    }

    /// A tracker with explicit parameters (`alpha` and `m` are read).
    pub fn with_params(metric: Metric, params: ScaveParams) -> Self {
        ScaveTracker { metric, params, e_old: Vec::new(), dcounter: Vec::new() }
    }
}

impl Allocator for ScaveTracker {
    fn name(&self) -> &'static str {
        match self.metric {
            Metric::Recs => "scave-recs",
            Metric::HitRatio => "scave-hitratio",
        }
    }

    fn every_interval(&self) -> bool {
        true
    }

    fn allocate(&mut self, pool: &Pool, vms: &[VmDemand]) -> Decision {
        let n = vms.len();
        self.e_old.resize(n, None);
        self.dcounter.resize(n, 0);
        let start = (pool.capacity / 100).max(1);
        let mut targets: Vec<u64> = Vec::with_capacity(n);
        for (i, v) in vms.iter().enumerate() {
            let sample = match self.metric {
                Metric::Recs => v.recs,
                Metric::HitRatio => v.hit_ratio,
            };
            let old = self.e_old[i];
            let e = match (old, sample) {
                (Some(o), Some(s)) => Some(o * self.params.alpha + s * (1.0 - self.params.alpha)),
                (o, s) => s.or(o),
            };
            self.e_old[i] = e;
            let score = match (e, old) {
                (Some(e), Some(o)) => e - o,
                _ => 0.0,
            };
            let unit = v.alloc_unit.max(1);
            let current = if v.target_blocks == 0 || v.target_blocks >= pool.capacity {
                start.max(v.min_blocks)
            } else {
                v.target_blocks
            };
            let t = if score > 0.0 {
                self.dcounter[i] = 0;
                current + unit
            } else if score < 0.0 && self.dcounter[i] > self.params.m {
                self.dcounter[i] = 0;
                current + 2 * unit
            } else if score < 0.0 {
                self.dcounter[i] += 1;
                current.saturating_sub(unit)
            } else {
                current
            };
            targets.push(t.clamp(v.min_blocks.min(pool.capacity), pool.capacity));
        }
        let sum: u64 = targets.iter().sum();
        if sum > pool.capacity {
            let w: Vec<VmDemand> =
                vms.iter().zip(&targets).map(|(v, &t)| VmDemand { weight: t as f64, ..v.clone() }).collect();
            targets = crate::static_share::weighted_split(pool.capacity, &w);
        }
        Decision::targets(targets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(target: u64, recs: f64, hit: f64) -> VmDemand {
        VmDemand {
            target_blocks: target,
            recs: Some(recs),
            hit_ratio: Some(hit),
            alloc_unit: 10,
            weight: 1.0,
            ..Default::default()
        }
    }

    #[test]
    fn grows_when_the_metric_rises_and_shrinks_when_it_falls() {
        let pool = Pool::new(1000, 1);
        let mut r = ScaveTracker::new(Metric::Recs);
        assert_eq!(r.allocate(&pool, &[vm(0, 0.5, 0.1)]).targets, [10], "starts at 1% of the pool");
        assert_eq!(r.allocate(&pool, &[vm(10, 0.9, 0.1)]).targets, [20]);
        assert_eq!(r.allocate(&pool, &[vm(20, 0.1, 0.9)]).targets, [10]);
        // The hit-ratio tracker reads the other signal.
        let mut h = ScaveTracker::new(Metric::HitRatio);
        h.allocate(&pool, &[vm(100, 0.5, 0.1)]);
        assert_eq!(h.allocate(&pool, &[vm(100, 0.1, 0.9)]).targets, [110]);
    }
}
