//! cachevisor's data plane: VM disks served over NBD (so QEMU, qemu-io, fio and libnbd use
//! them unchanged) with the engine's managed SSD cache on real files. The engine decides;
//! this crate executes its device operations with real bytes ([`datapath`]), speaks the
//! protocol ([`nbd`]), and owns files, locking and durability ([`daemon`], [`persist`]).

#![warn(unreachable_pub)]

mod api;
mod cluster;
pub mod config;
pub mod daemon;
mod destage_job;
mod export;
mod guards;
mod job_slot;
mod listen_path;
pub mod log_filter;
pub mod metadata_check;
pub mod metadata_repair;
pub mod own_files;
pub mod prewarm_job;
pub mod process;
pub mod snapshot_files;
mod vdisk_overlay;
pub mod vhost_access;
pub mod vhost_user;
pub mod vssd;

pub use config::Config;
pub use daemon::Daemon;
pub use process::{service, systemd};

pub use cachevisor_nbd::log_safe;
