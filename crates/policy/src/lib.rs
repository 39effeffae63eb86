//! Cache allocation policies for cachevisor: every way the seeds share one SSD among VMs,
//! behind one trait ([`Allocator`]), one file per policy, one [`registry`]. Pure and
//! deterministic: drivers (the simulator's interval controller, the daemon) gather the
//! demand estimates and apply the decisions through engine commands.
//!
//! Policies: `static` (weighted shares), `optimal` (exact DP upper bound),
//! `symflex-weighted` (weighted fair share with redistribution), `symflex-proportional`
//! (throughput ratios by feedback), `s-cave` (Algorithm 1 on rECS), `eci-cache` (URD
//! sizing and per-VM write policy) and `centaur` (plain reuse-distance sizing, the
//! baseline ECI-Cache compares with), and `scave-recs` / `scave-hitratio` (S-CAVE's
//! single-VM demand tracking of §VI-C), and `adaptive`, ours: the exact split on
//! long-memory curves with hysteresis and paced shrinks. `shared` is a partition mode,
//! not an allocator.

pub mod adaptive;
pub mod allocator;
pub mod cache_settings;
pub mod centaur;
pub mod controller;
pub mod eci_cache;
pub mod hull_greedy;
pub mod optimal;
pub mod params;
pub mod passthrough_drain;
pub mod registry;
pub mod reuse_sizing;
pub mod scave;
pub mod scave_tracker;
pub mod static_share;
pub mod symflex_proportional;
pub mod symflex_weighted;

pub use allocator::{Allocator, Decision, Needs, Pool, ReuseMix, VmDemand, Watermarks};
