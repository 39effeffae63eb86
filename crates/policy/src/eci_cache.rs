//! `eci-cache`: ECI-Cache (../shared/seeds/eci-cache-abstract.txt): per-VM cache size
//! from the Useful Reuse Distance (URD: reuse distances of reads only, so writes never
//! read again claim no space) and a per-VM write policy for SSD endurance.
//!
//! Sizes: [`crate::reuse_sizing::size_by_reuse`] on each VM's read-reuse curve (its URD
//! demand when the demands fit, the latency-minimizing split when they do not).
//!
//! Write policy (the abstract names the choice, not the rule; this is ours): a VM whose
//! useful reuses are almost all read-after-read gains nothing from keeping its writes in
//! the SSD, so it runs read-only (writes go to the backing store and invalidate cached
//! copies; no SSD writes for them). It runs write-back when at least `raw_threshold`
//! (default 10%) of its useful reuses are reads of blocks it last wrote. A VM with no
//! useful reuse at all also runs read-only. Once chosen, a policy changes only when the
//! share crosses the threshold by `raw_band` (default 3 points: to write-back at ≥ 13%,
//! back to read-only under 7%): a VM whose share sits near 10% (90% reads spread over a
//! hot set) otherwise flipped every few windows on the policy-compare mix, and each
//! switch to read-only flushed its dirty blocks to its disk in one burst — the p99.9 of
//! such VMs reached 0.45–2.5 s against 20–65 ms for their p99 (docs/policies.md).

use crate::allocator::{Allocator, Decision, Needs, Pool, VmDemand};
use crate::reuse_sizing::size_by_reuse;
use cachevisor_engine::WritePolicy;

/// Default share of read-after-write among useful reuses from which write-back pays.
pub const RAW_THRESHOLD: f64 = 0.10;

/// Default hysteresis around the threshold (share points).
pub const RAW_BAND: f64 = 0.03;

/// ECI-Cache's allocator.
#[derive(Debug, Clone)]
pub struct EciCache {
    /// Read-after-write share of useful reuses at or above which a VM runs write-back.
    pub raw_threshold: f64,
    /// How far past the threshold the share must go to change a VM's policy.
    pub raw_band: f64,
    /// Each VM's policy so far (none before its first decision).
    current: Vec<Option<WritePolicy>>,
}

impl Default for EciCache {
    fn default() -> Self {
        EciCache { raw_threshold: RAW_THRESHOLD, raw_band: RAW_BAND, current: Vec::new() }
    }
}

impl EciCache {
    /// With `raw_threshold` from `p` where given.
    pub fn from_params(p: &crate::params::Params) -> Result<Self, String> {
        let mut r = crate::params::ParamReader::new("eci-cache", p);
        let raw_threshold = r.get("raw_threshold", RAW_THRESHOLD, 0.0, 1.0)?;
        let raw_band = r.get("raw_band", RAW_BAND, 0.0, 1.0)?;
        r.finish()?;
        Ok(EciCache { raw_threshold, raw_band, current: Vec::new() })
    }

    /// The write policy for a VM's reuse mix, given the one it runs (`None`: its first).
    pub fn write_policy(&self, v: &VmDemand, now: Option<WritePolicy>) -> WritePolicy {
        let bar = match now {
            None => self.raw_threshold,
            Some(WritePolicy::Wb) => self.raw_threshold - self.raw_band,
            Some(_) => self.raw_threshold + self.raw_band,
        };
        match v.reuse_mix.raw_share() {
            Some(s) if s >= bar => WritePolicy::Wb,
            _ => WritePolicy::Ro,
        }
    }
}

impl Allocator for EciCache {
    fn name(&self) -> &'static str {
        "eci-cache"
    }

    fn every_interval(&self) -> bool {
        true
    }

    fn needs(&self) -> Needs {
        Needs { read_curves: true, reuse_mix: true, ..Needs::default() }
    }

    fn allocate(&mut self, pool: &Pool, vms: &[VmDemand]) -> Decision {
        let targets = size_by_reuse(pool, vms, |v| &v.read_curve);
        self.current.resize(vms.len(), None);
        for (i, v) in vms.iter().enumerate() {
            self.current[i] = Some(self.write_policy(v, self.current[i]));
        }
        let write_policies = self.current.clone();
        Decision { targets, write_policies, uncapped: false, paced_shrinks: false }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachevisor_analysis::reuse_mix::ReuseMix;

    fn with_share(raw: f64) -> VmDemand {
        let mix = ReuseMix { read_after_read: 1.0 - raw, read_after_write: raw, ..Default::default() };
        VmDemand { reuse_mix: mix, ..Default::default() }
    }

    #[test]
    fn a_share_near_the_threshold_does_not_flip_the_policy() {
        let mut e = EciCache::default();
        let pool = Pool::new(100, 1);
        let policies = |e: &mut EciCache, share: f64| e.allocate(&pool, &[with_share(share)]).write_policies[0];
        // First decision: the threshold alone.
        assert_eq!(policies(&mut e, 0.11), Some(WritePolicy::Wb));
        // Noise around 10% keeps write-back; only under 7% is it read-only.
        for s in [0.09, 0.11, 0.08, 0.12, 0.071] {
            assert_eq!(policies(&mut e, s), Some(WritePolicy::Wb), "share {s}");
        }
        assert_eq!(policies(&mut e, 0.06), Some(WritePolicy::Ro));
        // And back to write-back only from 13%.
        for s in [0.10, 0.12, 0.129] {
            assert_eq!(policies(&mut e, s), Some(WritePolicy::Ro), "share {s}");
        }
        assert_eq!(policies(&mut e, 0.13), Some(WritePolicy::Wb));
        // No band: the threshold alone every window.
        let mut plain = EciCache { raw_band: 0.0, ..EciCache::default() };
        assert_eq!(policies(&mut plain, 0.11), Some(WritePolicy::Wb));
        assert_eq!(policies(&mut plain, 0.09), Some(WritePolicy::Ro));
    }
}
