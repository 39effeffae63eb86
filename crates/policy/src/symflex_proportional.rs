//! `symflex-proportional`: SymFlex's proportionate-throughput provisioning (SymFlex §2.2,
//! §5.2): the controller resizes each VM's vSSD so that the VMs' measured vSSD (cache hit)
//! throughputs follow target ratios such as 1:2:3:3; ratios may change at run time.
//!
//! The seed gives the goal, not the control law; ours is multiplicative feedback. With
//! target share s_i = r_i / Σr and measured share a_i = x_i / Σx of hit throughput, each
//! VM's size is multiplied by (s_i / a_i)^gain, clamped to [1/2, 2] per interval (gain
//! 0.5 damps the oscillation a one-window measurement would cause), and the results are
//! rescaled to fill the pool above every minimum. Throughput grows with cache size, so a
//! VM below its share grows and one above shrinks until the shares meet; within a
//! `deadband` (1 percentage point) of every target nothing moves. Before any VM has
//! measured throughput (a cold start) and whenever every target is 0, the pool is split
//! equally — SymFlex starts "with an equal amount of vSSD allocated across all VMs".

use crate::allocator::{Allocator, Decision, Pool, VmDemand};
use crate::static_share::weighted_split;

/// Proportional-throughput controller.
#[derive(Debug, Clone)]
pub struct SymflexProportional {
    /// Exponent of the correction factor.
    pub gain: f64,
    /// Largest factor per interval (its inverse is the smallest).
    pub max_step: f64,
    /// Share error below which nothing moves.
    pub deadband: f64,
}

impl Default for SymflexProportional {
    fn default() -> Self {
        SymflexProportional { gain: 0.5, max_step: 2.0, deadband: 0.01 }
    }
}

impl SymflexProportional {
    /// With `gain`, `max_step` and `deadband` from `p` where given.
    pub fn from_params(p: &crate::params::Params) -> Result<Self, String> {
        let d = SymflexProportional::default();
        let mut r = crate::params::ParamReader::new("symflex-proportional", p);
        let out = SymflexProportional {
            gain: r.get("gain", d.gain, 0.01, 1.0)?,
            max_step: r.get("max_step", d.max_step, 1.0, 100.0)?,
            deadband: r.get("deadband", d.deadband, 0.0, 1.0)?,
        };
        r.finish()?;
        Ok(out)
    }
}

impl Allocator for SymflexProportional {
    fn name(&self) -> &'static str {
        "symflex-proportional"
    }

    fn every_interval(&self) -> bool {
        true
    }

    fn allocate(&mut self, pool: &Pool, vms: &[VmDemand]) -> Decision {
        let equal = |vms: &[VmDemand]| {
            let w: Vec<VmDemand> = vms.iter().map(|v| VmDemand { weight: 1.0, ..v.clone() }).collect();
            weighted_split(pool.capacity, &w)
        };
        let total_x: f64 = vms.iter().map(|v| v.hit_throughput.max(0.0)).sum();
        let total_r: f64 = vms.iter().map(|v| v.throughput_ratio.max(0.0)).sum();
        if total_x <= 0.0 || total_r <= 0.0 || vms.iter().all(|v| v.target_blocks == 0) {
            return Decision::targets(equal(vms));
        }
        let errors: Vec<(f64, f64)> =
            vms.iter().map(|v| (v.throughput_ratio.max(0.0) / total_r, v.hit_throughput.max(0.0) / total_x)).collect();
        let settled = errors.iter().all(|(s, a)| (s - a).abs() < self.deadband);
        let raw: Vec<VmDemand> = vms
            .iter()
            .zip(&errors)
            .map(|(v, &(s, a))| {
                let f = if settled {
                    1.0 // sizes kept (only rescaled to the pool)
                } else if a > 0.0 {
                    (s / a).powf(self.gain)
                } else {
                    self.max_step
                };
                let size = (v.target_blocks.max(1)) as f64 * f.clamp(1.0 / self.max_step, self.max_step);
                VmDemand { weight: size, ..v.clone() }
            })
            .collect();
        Decision::targets(weighted_split(pool.capacity, &raw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hit throughput of a VM with a concave hit curve: scale · √size.
    fn run(ratios: &[f64], scales: &[f64], windows: usize, start: Option<Vec<u64>>) -> (Vec<u64>, Vec<f64>) {
        let pool = Pool::new(10_000, 1);
        let mut p = SymflexProportional::default();
        let mut t = start.unwrap_or(vec![0; ratios.len()]);
        let mut x = vec![0.0; ratios.len()];
        for _ in 0..windows {
            let vms: Vec<VmDemand> = (0..ratios.len())
                .map(|i| VmDemand {
                    target_blocks: t[i],
                    hit_throughput: x[i],
                    throughput_ratio: ratios[i],
                    weight: 1.0,
                    ..Default::default()
                })
                .collect();
            t = p.allocate(&pool, &vms).targets;
            assert_eq!(t.iter().sum::<u64>(), 10_000);
            x = t.iter().zip(scales).map(|(&s, k)| k * (s as f64).sqrt()).collect();
        }
        let sum: f64 = x.iter().sum();
        (t, x.iter().map(|v| v / sum).collect())
    }

    #[test]
    fn converges_to_target_ratios() {
        let (_, shares) = run(&[1.0, 2.0, 3.0, 3.0], &[1.0, 1.0, 1.0, 1.0], 40, None);
        for (s, want) in shares.iter().zip([1.0 / 9.0, 2.0 / 9.0, 3.0 / 9.0, 3.0 / 9.0]) {
            assert!((s - want).abs() < 0.015, "{shares:?}");
        }
    }

    #[test]
    fn retracks_after_a_ratio_change_and_unequal_vms() {
        let (t, _) = run(&[1.0, 2.0, 3.0, 3.0], &[2.0, 1.0, 1.0, 0.5], 40, None);
        let (_, shares) = run(&[4.0, 2.0, 1.0, 1.0], &[2.0, 1.0, 1.0, 0.5], 40, Some(t));
        for (s, want) in shares.iter().zip([0.5, 0.25, 0.125, 0.125]) {
            assert!((s - want).abs() < 0.015, "{shares:?}");
        }
    }

    #[test]
    fn cold_start_is_an_equal_split() {
        let (t, _) = run(&[1.0, 2.0], &[1.0, 1.0], 1, None);
        assert_eq!(t, [5000, 5000]);
    }
}
