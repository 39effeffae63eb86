//! The allocator contract: what a policy reads each interval and what it decides.

use cachevisor_engine::WritePolicy;
use serde::Serialize;

/// The shared SSD as an allocator sees it at an interval boundary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pool {
    /// Slots in the pool.
    pub capacity: u64,
    /// Step of the hit curves in blocks (curve point k = k·unit blocks), ≥ 1.
    pub unit: u64,
    /// Slots no VM holds.
    pub free_blocks: u64,
}

impl Pool {
    /// A pool of `capacity` blocks, curves in steps of `unit`, all free.
    pub fn new(capacity: u64, unit: u64) -> Self {
        Pool { capacity, unit: unit.max(1), free_blocks: capacity }
    }
}

pub use cachevisor_analysis::ReuseMix;

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
    /// Dirty blocks among them (what shrinking it writes back).
    pub dirty_blocks: u64,
    /// Requests it issued in the last window (0 when the call is not at a window's end).
    pub window_requests: u64,
    /// Estimated hits of all accesses at sizes `0, unit, 2·unit, …` blocks
    /// (non-decreasing), if [`Needs::hit_curves`].
    pub hit_curve: Vec<f64>,
    /// Estimated read hits (useful reuses, ECI-Cache's URD) at the same sizes, if
    /// [`Needs::read_curves`].
    pub read_curve: Vec<f64>,
    /// Block accesses the curves were measured over (their 100%).
    pub accesses: f64,
    /// Sampled rECS of the last window (S-CAVE §IV), `None` while it holds no blocks.
    pub recs: Option<f64>,
    /// Block hit ratio of the last window, `None` before the first.
    pub hit_ratio: Option<f64>,
    /// S-CAVE's AllocUnit (§V-A): blocks read from backing per window, recent average.
    pub alloc_unit: u64,
    /// Kinds of reuse, if [`Needs::reuse_mix`].
    pub reuse_mix: ReuseMix,
    /// Its write policy now (`None`: not known to the caller).
    pub write_policy: Option<WritePolicy>,
    /// Share of the last window its backing store had ops of this cache in flight
    /// (`None`: not known, or not at a window's end).
    pub backing_busy: Option<f64>,
    /// Requests served from the cache per second in the last window (SymFlex's vSSD
    /// throughput).
    pub hit_throughput: f64,
    /// Target share of the summed hit throughput, relative to the others (SymFlex §5.2,
    /// e.g. 1:2:3:3), > 0.
    pub throughput_ratio: f64,
}

/// Which estimates a policy reads, so drivers compute only those.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Needs {
    /// Per-VM hit curves of all accesses (`VmDemand::hit_curve`).
    pub hit_curves: bool,
    /// Per-VM read-reuse curves (`VmDemand::read_curve`).
    pub read_curves: bool,
    /// Per-VM reuse kinds (`VmDemand::reuse_mix`).
    pub reuse_mix: bool,
    /// Half-life of the online curves' counts in windows (0 or 1: each window halves the
    /// past, the default); longer keeps demand seen long ago in the curves.
    pub curve_half_life: u32,
}

/// A decision for one interval.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// Target in blocks per VM (same order as the input).
    pub targets: Vec<u64>,
    /// New write policy per VM where the policy decides one.
    pub write_policies: Vec<Option<WritePolicy>>,
    /// No control this interval: every target is the whole pool and VMs grow freely into
    /// free slots (S-CAVE Alg. 1 lines 2–10, "Cache(VMi) = ∞").
    pub uncapped: bool,
    /// Shrinks are paced ([`cachevisor_engine::Engine::set_target_paced`]): a VM above its
    /// new target gives blocks up as other VMs' misses need them, not all at once.
    pub paced_shrinks: bool,
}

impl Decision {
    /// Targets only, write policies untouched.
    pub fn targets(targets: Vec<u64>) -> Self {
        let n = targets.len();
        Decision { targets, write_policies: vec![None; n], uncapped: false, paced_shrinks: false }
    }
}

/// A global cleaner's watermarks, as fractions of the pool (S-CAVE §V-B): when free slots
/// drop below `low`, reclaim unreferenced blocks of any VM until `high` are free.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Watermarks {
    /// Start cleaning below this free fraction.
    pub low: f64,
    /// Stop once this fraction is free.
    pub high: f64,
}

/// A cache allocation policy: pure and deterministic (same inputs, same decision).
pub trait Allocator: Send {
    /// Registry name.
    fn name(&self) -> &'static str;
    /// Estimates it reads.
    fn needs(&self) -> Needs {
        Needs::default()
    }
    /// Whether the policy is meant to run every interval (an online controller) rather
    /// than once on whole-trace estimates; drivers use it as the default.
    fn every_interval(&self) -> bool {
        false
    }
    /// The global cleaner the policy relies on, if any.
    fn cleaner(&self) -> Option<Watermarks> {
        None
    }
    /// The replacement policy its partitions use when the configuration names none:
    /// CLOCK for a policy whose cleaner reads CLOCK counters (S-CAVE), else LRU.
    fn replacement(&self) -> cachevisor_engine::ReplacementKind {
        if self.cleaner().is_some() {
            cachevisor_engine::ReplacementKind::Clock
        } else {
            cachevisor_engine::ReplacementKind::Lru
        }
    }
    /// Decides targets for `vms` sharing the pool. Unless `uncapped`, the sum of targets
    /// does not exceed the capacity, and every VM gets at least its `min_blocks` when the
    /// minimums fit.
    fn allocate(&mut self, pool: &Pool, vms: &[VmDemand]) -> Decision;
}
