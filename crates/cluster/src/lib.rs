//! The hyperconverged (HCI) cluster of ELICA (`../shared/seeds/elica-hci-cache.md`) as
//! pure code — no clocks, threads, sockets or files: the cluster logic decides, the
//! drivers (the simulator now, the daemons later) execute, as with the engine.
//!
//! - [`ownership`]: the global stripe ownership map (which node caches which stripe of
//!   which vDisk), O(1) lookup, versioned so every change is an explicit, ordered update
//!   (ELICA §3.1);
//! - [`model`]: latencies (Table 3), the ideal size per VM (Eq. 1), the per-node fit check
//!   (Eq. 2), a VM's average latency with local and remote cache (Eq. 3);
//! - [`allocation`]: Eq. 4 — sizes and local/remote parts minimizing the summed average
//!   latency; the exact reference solver;
//! - [`fast`]: Eq. 4 fast — a price on the cluster's capacity, an exact DP per node;
//! - [`hysteresis`]: the last allocation kept unless a new one gains enough (no flips
//!   between near-equal splits, each of which would be a migration);
//! - [`ilp`]: Eq. 4 as written, an ILP on size levels through `good_lp` / `microlp`;
//! - [`load`]: ELICA-Load's chunk exchange between the busiest and the idlest node (§3.5);
//! - [`migration`]: Gradual and Instant Migration of a chunk as per-block states, with
//!   §3.7's coherency and update-safety rules;
//! - [`migration_plan`]: when migrations start (rate limit) and how (GM when the network
//!   is congested, IM otherwise; §3.6.3), and their cost (time, reserved capacity, bytes);
//! - [`ssd_sharing`]: one SSD shared by a lender's own VMs and its borrowers — what the
//!   lender gives back and the caps each side fills to, each period (§3.1);
//! - [`replica_record`], [`replica_log`], [`replica_replay`]: replicated write-back beyond
//!   ELICA — a write-back vDisk's client writes logged on a peer before they are
//!   acknowledged, the owner's trim / degrade / resync steps, and the writes a survivor
//!   replays from a dead owner's log.

pub mod allocation;
pub mod cluster_map;
pub mod estimate;
pub mod fast;
pub mod hysteresis;
pub mod ilp;
pub mod load;
pub mod membership;
pub mod migration;
pub mod migration_driver;
pub mod migration_plan;
pub mod model;
pub mod ownership;
pub mod replica_log;
pub mod replica_record;
pub mod replica_replay;
pub mod ssd_sharing;

pub use ownership::{ApplyError, NodeId, OwnershipMap, StaleVersion, Update};
