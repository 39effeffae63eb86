//! cachevisor's data plane: VM disks served over NBD (so QEMU, qemu-io, fio and libnbd use
//! them unchanged) with the engine's managed SSD cache on real files. The engine decides;
//! this crate executes its device operations with real bytes ([`datapath`]), speaks the
//! protocol ([`nbd`]), and owns files, locking and durability ([`daemon`], [`persist`]).

#![warn(unreachable_pub)]

mod api;
mod api_auth;
mod api_conns;
mod api_tls;
mod cluster;
pub mod config;
mod conn_limits;
pub mod daemon;
mod destage_job;
mod guards;
mod job_slot;
mod listen_path;
mod listener;
pub mod log_filter;
pub mod metadata_check;
pub mod metadata_repair;
mod metrics;
pub mod own_files;
mod preauth;
pub mod prewarm_job;
pub mod service;
pub mod snapshot_files;
mod socket_activation;
mod status;
pub mod systemd;
mod vdisk_overlay;
pub mod vhost_user;
pub mod vssd;

pub use config::Config;
pub use daemon::Daemon;

pub use cachevisor_nbd::log_safe;
