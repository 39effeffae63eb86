//! The cachevisor simulator: a thin virtual-time driver around the engine. It replays a
//! multi-VM trace (open loop at trace timestamps with a speed-up, or closed loop with a
//! fixed queue depth per VM), executes the engine's device operations against SSD, HDD
//! and link models with queueing, and reports hit ratios, latency percentiles
//! (HdrHistogram), SSD endurance bytes and backing I/O per VM, in total and per window.
//!
//! Entry point: [`simulate`] with a [`Scenario`] (TOML, see [`scenario`]).

mod cluster_migration;
mod cluster_report;
mod cluster_scenario;
pub mod cluster_sim;
pub mod device;
pub mod dsf_objects;
pub mod failover;
mod inputs;
mod instant_copies;
mod lookahead;
pub mod metrics;
pub mod model_choice;
mod node;
pub mod plot;
mod prepass;
mod prewarming;
mod read_ahead;
pub mod report;
pub mod scenario;
mod simulator;
mod store_devices;
pub mod working_set;

pub use inputs::{open_inputs, Inputs, SimError};
pub use report::SimResult;
pub use scenario::Scenario;
pub use simulator::{simulate, Progress};
