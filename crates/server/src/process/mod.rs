//! The daemon as a process: its service (the listeners, the API server, the signals and
//! the stop), the NBD listener and each connection's handshake, the pool of handshakes in
//! progress and the connection limits, socket paths and systemd socket activation, the
//! readiness and watchdog notifications, the log filter, and the files it owns. The top
//! layer: it composes the daemon, the API, the vSSD service and vhost-user; nothing below
//! it names it.

pub(crate) mod conn_limits;
pub(crate) mod listener;
pub(crate) mod preauth;
pub mod service;
pub(crate) mod socket_activation;
pub mod systemd;
