//! cachevisor's data plane: VM disks served over NBD (so QEMU, qemu-io, fio and libnbd use
//! them unchanged) with the engine's managed SSD cache on real files. The engine decides;
//! this crate executes its device operations with real bytes ([`datapath`]), speaks the
//! protocol ([`nbd`]), and owns files, locking and durability ([`daemon`], [`persist`]).

pub mod api;
pub mod api_auth;
pub mod api_conns;
pub mod api_tls;
pub mod cluster;
pub mod config;
pub mod conn_limits;
pub mod daemon;
pub mod destage_job;
pub mod export_backends;
pub mod guards;
pub mod job_slot;
pub mod listen_path;
pub mod listener;
pub mod log_filter;
pub mod metadata_check;
pub mod metadata_repair;
pub mod metrics;
pub mod own_files;
pub mod preauth;
pub mod prewarm_job;
pub mod service;
pub mod snapshot_files;
pub mod socket_activation;
pub mod status;
pub mod systemd;
pub mod vdisk_overlay;
pub mod vhost_user;
pub mod vssd;

pub use config::Config;
pub use daemon::Daemon;

pub use cachevisor_nbd::log_safe;
