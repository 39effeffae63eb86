//! The cachevisor cache engine: a deterministic, sans-IO state machine that decides what
//! a hypervisor-side SSD cache does, and nothing else. It owns no clock, thread, socket or
//! file; the simulator and the daemon are drivers around it (quinn-proto style).
//!
//! # Method groups, in the order a driver uses them
//! 1. **Build**: [`Engine::new`] with an [`EngineConfig`] (validated: block size, slots).
//! 2. **Commands** (any time): [`Engine::set_target`] (partition size; shrinks evict the
//!    coldest blocks and write dirty ones back), [`Engine::set_write_policy`] (leaving WB
//!    flushes), [`Engine::flush`], [`Engine::drop_vm`].
//! 3. **Inputs**: [`Engine::access`] for each request, with the driver's current time.
//! 4. **Outputs**: every input and command fills an [`Output`]: per-block outcomes (hit,
//!    inserted, bypassed, evicted) and the [`DeviceOp`]s the driver must perform, in a
//!    safe sequential order with phases for parallelism (see [`output`]).
//! 5. **Getters**: [`Engine::partition`], [`Engine::lookup`], [`Engine::metadata_bytes`],
//!    [`Engine::check_invariants`] (tests).
//!
//! # The asynchronous face (a driver with real devices, ops in flight)
//! [`Engine::submit`] a request or [`Engine::submit_job`] a command, take ops with
//! [`Engine::poll_op`], report each with [`Engine::handle_completion`] in any order, take
//! [`Event`]s with [`Engine::poll_event`] (reply, retirement, interval); timers through
//! [`Engine::poll_timeout`] / [`Engine::handle_timeout`]. The engine decides what waits on
//! what and repairs its state after a failed op (see `inflight.rs`, `repair.rs`).
//!
//! Blocks are split from requests here (not by trace readers). Valid and dirty state is
//! tracked per 512-byte sector, so partial-block reads and writes are exact.

pub mod admission_shadow;
pub mod block_admission;
pub mod block_index;
mod block_ops;
pub mod block_prefetch;
pub mod cache_settings;
mod commands;
pub mod config;
pub mod congestion;
pub mod data_model;
pub mod device;
mod device_added;
mod device_failure;
mod device_placement;
mod dirty_mirror;
mod disk_range;
mod dispatch;
mod durability;
mod engine;
pub mod flush_rate;
mod global_cleaner;
mod growable;
mod inflight;
mod intents;
mod interval;
pub mod io_class;
mod jobs;
mod migration;
mod mode;
pub mod output;
mod paced_clean;
mod prefetch;
mod prewarm_load;
pub mod ram_tier;
mod remote_regions;
mod repair;
pub mod replacement;
mod request_queue;
mod restore;
mod seals;
pub mod sector_bits;
pub mod sequential_cutoff;
pub mod shared_budget;
mod slot_alloc;
pub mod slot_table;
mod slot_wait;
pub mod stores;
mod timers;
mod withheld;
pub mod write_budget;
pub mod write_policy;
mod writeback_ahead;

pub use block_admission::{AdmissionCounts, AdmissionPolicy, AdmissionState};
pub use block_prefetch::{PrefetchCounts, PrefetchPolicy, PrefetchState};
pub use commands::{EntryState, VmEntry};
pub use config::{EngineConfig, FillMode, PartitionMode, StoreKind, StoreSpec};
pub use congestion::CongestionState;
pub use device::{Device, Io, Unserved};
pub use device_failure::DeviceLoss;
pub use disk_range::{check_disk_size, RangeError, MAX_DISK_BLOCKS};
pub use durability::{durable_reserve, Commit, SlotRecord, Syncs};
pub use engine::{Engine, PartitionInfo};
pub use inflight::{Event, Failure, ReqId};
pub use interval::WindowCounts;
pub use io_class::{ClassCounts, IoClass, IoClassSection};
pub use migration::{MigrationScheme, MigrationStats};
pub use mode::BypassCause;
pub use output::{BlockOutcome, DeviceOp, Evicted, Location, OpHandle, OpId, OpKind, Output, MAX_RUN_BYTES, NO_SLOT};
pub use prewarm_load::PrewarmOutcome;
pub use ram_tier::{RamFill, RamStats};
pub use replacement::{Replacement, ReplacementKind};
pub use seals::MAX_SEALS_PER_COMMIT;
pub use shared_budget::{BudgetShare, SharedBudgetState};
pub use stores::{StoreId, StoreLayout, LOCAL};
pub use timers::{Flusher, Schedule};
pub use withheld::WithholdCost;
pub use write_budget::{BudgetRate, BudgetState};
pub use write_policy::WritePolicy;
pub use writeback_ahead::MAX_WRITEBACK_AHEAD;
