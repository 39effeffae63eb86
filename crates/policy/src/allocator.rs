//! The allocator contract: what a policy reads each interval and what it decides.

use cachevisor_engine::WritePolicy;
use serde::Serialize;

/// What an allocator knows about one VM at an interval boundary. Fields a policy does not
/// declare in [`Needs`] may be left at their defaults by the driver.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VmDemand {
    /// Relative share (static and weighted policies), > 0.
    pub weight: f64,
    /// Blocks the VM must keep at least.
    pub min_blocks: u64,
    /// Its current target.
    pub target_blocks: u64,
    /// Blocks it holds.
    pub used_blocks: u64,
    /// Estimated hits at sizes `0, unit, 2·unit, …` blocks (non-decreasing), if needed.
    pub hit_curve: Vec<f64>,
}

/// Which estimates a policy reads, so drivers compute only those.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Needs {
    /// Per-VM hit curves (`VmDemand::hit_curve`).
    pub hit_curves: bool,
}

/// A decision for one interval.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// Target in blocks per VM (same order as the input).
    pub targets: Vec<u64>,
    /// New write policy per VM where the policy decides one.
    pub write_policies: Vec<Option<WritePolicy>>,
}

/// A cache allocation policy: pure and deterministic (same inputs, same decision).
pub trait Allocator {
    /// Registry name.
    fn name(&self) -> &'static str;
    /// Estimates it reads.
    fn needs(&self) -> Needs {
        Needs::default()
    }
    /// Decides targets for `vms` sharing `capacity` blocks, given curves in steps of
    /// `unit` blocks. The sum of targets must not exceed `capacity`, and every VM gets at
    /// least its `min_blocks` when the minimums fit.
    fn allocate(&mut self, capacity: u64, unit: u64, vms: &[VmDemand]) -> Decision;
}
