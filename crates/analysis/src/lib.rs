//! Demand estimation for cachevisor, pure and I/O-free: exact LRU stack distances
//! ([`stack_distance`]), SHARDS-sampled distances ([`shards`]), histograms and the
//! miss-ratio curves, percentile sizes and wss80 they give ([`histogram`]), and per-VM
//! profiling of request streams by kind, including ECI-Cache's URD ([`profile`]), and
//! S-CAVE's sampled rECS over the engine's reference counters ([`recs`]), and the
//! read/write kinds of reuse ECI-Cache's write-policy choice reads ([`reuse_mix`]), and
//! concave hulls of hit curves for the allocators exact on concave ones ([`concave`]).

pub mod concave;
pub mod histogram;
pub mod mrc_report;
pub mod online;
pub mod profile;
pub mod recs;
pub mod reuse_mix;
pub mod shards;
pub mod stack_distance;

pub use histogram::{CurvePoint, DistanceHistogram};
pub use online::{Decay, Interval, IntervalProfiler, IntervalRow};
pub use profile::{Kind, Method, Profiler, VmCurves};
pub use recs::RecsEstimator;
pub use reuse_mix::{ReuseMix, ReuseMixTracker};
pub use shards::{Correction, Shards};
pub use stack_distance::StackDistance;

/// ELICA's ideal cache size (ELICA §3.2, Eq. 1): (SD + 1) × block size, where SD is a
/// stack distance — the maximum reuse distance in the interval as the paper writes it, or
/// a percentile of reuses (the maximum is usually unaffordable).
pub fn elica_ideal_bytes(stack_distance: u64, block_size: u64) -> u64 {
    (stack_distance + 1) * block_size
}
