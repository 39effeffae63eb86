//! Cache allocation policies for cachevisor: every way the seeds share one SSD among VMs,
//! behind one trait ([`Allocator`]), one file per policy, one [`registry`]. Pure and
//! deterministic: drivers (the simulator's interval controller, the daemon) gather the
//! demand estimates and apply the decisions through engine commands.
//!
//! Built so far: `static` (weighted shares), `optimal` (exact DP upper bound) and
//! `symflex-weighted` (weighted fair share with redistribution).

pub mod allocator;
pub mod optimal;
pub mod registry;
pub mod static_share;
pub mod symflex_weighted;

pub use allocator::{Allocator, Decision, Needs, VmDemand};
