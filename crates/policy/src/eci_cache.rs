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
//! useful reuse at all also runs read-only.

use crate::allocator::{Allocator, Decision, Needs, Pool, VmDemand};
use crate::reuse_sizing::size_by_reuse;
use cachevisor_engine::WritePolicy;

/// Default share of read-after-write among useful reuses from which write-back pays.
pub const RAW_THRESHOLD: f64 = 0.10;

/// ECI-Cache's allocator.
#[derive(Debug, Clone)]
pub struct EciCache {
    /// Read-after-write share of useful reuses at or above which a VM runs write-back.
    pub raw_threshold: f64,
}

impl Default for EciCache {
    fn default() -> Self {
        EciCache { raw_threshold: RAW_THRESHOLD }
    }
}

impl EciCache {
    /// With `raw_threshold` from `p` where given.
    pub fn from_params(p: &crate::params::Params) -> Result<Self, String> {
        let mut r = crate::params::ParamReader::new("eci-cache", p);
        let raw_threshold = r.get("raw_threshold", RAW_THRESHOLD, 0.0, 1.0)?;
        r.finish()?;
        Ok(EciCache { raw_threshold })
    }

    /// The write policy for a VM's reuse mix.
    pub fn write_policy(&self, v: &VmDemand) -> WritePolicy {
        match v.reuse_mix.raw_share() {
            Some(s) if s >= self.raw_threshold => WritePolicy::Wb,
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
        let write_policies = vms.iter().map(|v| Some(self.write_policy(v))).collect();
        Decision { targets, write_policies, uncapped: false }
    }
}
