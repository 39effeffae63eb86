//! Starting the service: the daemon, then its listeners on background threads. Returns
//! the bound addresses (a `:0` TCP port is resolved) and the NBD URIs to connect to.

use crate::config::Config;
use crate::daemon::{Daemon, StartError};
use crate::process::listener;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;

/// A running service.
pub struct Running {
    /// The daemon (for stats, flushes and a clean stop).
    pub daemon: Arc<Daemon>,
    /// Bound TCP address.
    pub tcp: Option<SocketAddr>,
    /// Unix socket path.
    pub unix: Option<PathBuf>,
    /// The vhost-user-blk sockets listening at the start (one per export).
    pub vhost_user: Vec<PathBuf>,
    /// HTTP API address and its bearer token.
    pub api: Option<(SocketAddr, String)>,
    /// The unix listener's thread, and whether its socket is ours to remove (not one
    /// systemd passed in).
    unix_thread: Option<(std::thread::JoinHandle<()>, bool)>,
}

/// Dropping a running service stops it as a crash would ([`Daemon::stop_serving`]): no
/// more device I/O, the cache's owner lock released. A clean stop calls
/// [`Daemon::shutdown`] first.
impl Drop for Running {
    fn drop(&mut self) {
        self.daemon.stop_serving();
        // The unix listener ends (woken by a connection of our own) and its socket goes:
        // a daemon started again in this process binds the path anew.
        if let (Some((h, ours)), Some(path)) = (self.unix_thread.take(), &self.unix) {
            let _ = std::os::unix::net::UnixStream::connect(path);
            let _ = h.join();
            if ours && crate::listen_path::inspect(path, "").ok() == Some(crate::listen_path::AtPath::StaleSocket) {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

impl Running {
    /// One NBD URI per export and listener (libnbd's `nbds://` forms when TLS is
    /// required).
    pub fn uris(&self) -> Vec<String> {
        let s =
            if self.daemon.tls().is_some_and(|t| t.mode == cachevisor_nbd::tls::TlsMode::Require) { "s" } else { "" };
        let mut v = Vec::new();
        for e in self.daemon.nbd_exports() {
            if let Some(a) = self.tcp {
                v.push(format!("nbd{s}://{a}/{}", e.name));
            }
            if let Some(p) = &self.unix {
                // Absolute: the URI must work from any directory.
                let p = std::path::absolute(p).unwrap_or_else(|_| p.clone());
                v.push(format!("nbd{s}+unix:///{}?socket={}", e.name, p.display()));
            }
        }
        v
    }
}

/// Starts the daemon and its listeners.
pub fn start(cfg: &Config) -> Result<Running, StartError> {
    start_with(cfg, &crate::daemon::StartOptions::default())
}

/// Starts the daemon (with the operator's start options) and its listeners. The daemon
/// takes its cache's owner lock first, so nothing here (the unix socket, the API token
/// file) touches another running daemon's files.
pub fn start_with(cfg: &Config, opts: &crate::daemon::StartOptions) -> Result<Running, StartError> {
    let daemon = Arc::new(Daemon::start_with(cfg, opts)?);
    // A generated API token is written to a file only its user can read; an existing one
    // others can read is refused before anything listens (`create` keeps an existing
    // file's mode).
    let token_file = daemon.metadata_dir().join("api-token");
    if cfg.api.as_ref().is_some_and(|a| a.token.is_none()) {
        cachevisor_files::private_files::check_private_file(
            &token_file,
            "api token file",
            "the API token (it lets them change the cache and its vDisks)",
        )
        .map_err(StartError::Refused)?;
    }
    daemon
        .restore_api_targets()
        .map_err(|e| StartError::Config(format!("partition targets saved from the API: {e}")))?;
    // The interval controller and the background flusher run on the engine's timers
    // (`Schedule`), driven by the data path's ticker.
    let r = cfg.resolve().map_err(StartError::Config)?;
    let polling = listener::Polling {
        poll: std::time::Duration::from_nanos(r.poll_ns),
        pollers: cachevisor_nbd::polling::Pollers::for_this_machine(),
        limit: crate::process::conn_limits::ConnLimit::new("nbd", cfg.listen.max_connections, daemon.guards.clone()),
        preauth: crate::process::preauth::PreAuth::for_nbd(cfg.listen.max_connections, daemon.guards.clone()),
        handshake_timeout: std::time::Duration::from_nanos(r.handshake_timeout_ns),
        tls: daemon.tls().cloned(),
    };
    // Sockets systemd passed (socket activation) replace the configured ones.
    let mut inherited = crate::process::socket_activation::take().map_err(StartError::Config)?;
    if inherited.api.is_some() && cfg.api.is_none() {
        return Err(StartError::Config(
            "socket activation: systemd passed an API socket, but the config has no [api] section".into(),
        ));
    }
    let (listen_tcp, listen_unix) = if inherited.has_nbd() {
        if cfg.listen.tcp.is_some() || cfg.listen.unix.is_some() {
            tracing::info!(
                "socket activation: NBD is served on the sockets systemd passed, not on listen.tcp / listen.unix"
            );
        }
        (None, None)
    } else {
        (cfg.listen.tcp.as_ref(), cfg.listen.unix.as_ref())
    };
    let mut tcp = None;
    let tcp_listener = match (inherited.nbd_tcp.take(), listen_tcp) {
        (Some(l), _) => Some((l, "socket activation".to_string())),
        (None, Some(addr)) => {
            let addr: SocketAddr =
                addr.parse().map_err(|e| StartError::Config(format!("listen.tcp: `{addr}`: {e}")))?;
            let l = TcpListener::bind(addr)
                .map_err(|source| StartError::File { path: format!("listen.tcp {addr}"), error: source })?;
            Some((l, format!("listen.tcp {addr}")))
        }
        (None, None) => None,
    };
    if let Some((l, what)) = tcp_listener {
        let addr = l.local_addr().map_err(|source| StartError::File { path: what, error: source })?;
        if !addr.ip().is_loopback() {
            tracing::warn!(%addr, "listening on a non-loopback address");
        }
        tcp = Some(addr);
        let (d, p) = (daemon.clone(), polling.clone());
        std::thread::spawn(move || listener::tcp(l, d, p));
    }
    let mut unix = None;
    let inherited_unix = inherited.nbd_unix.is_some();
    let unix_listener = match (inherited.nbd_unix.take(), listen_unix) {
        (Some(l), _) => Some(l),
        (None, Some(p)) => {
            let mode = crate::config::unix_mode(&cfg.listen.unix_mode).map_err(StartError::Config)?;
            let group = match &cfg.listen.unix_group {
                Some(g) => Some((g.as_str(), crate::config::unix_group(g, mode).map_err(StartError::Config)?)),
                None => None,
            };
            Some((crate::listen_path::bind_unix(p, "listen.unix", mode, group).map_err(StartError::Config)?, p.clone()))
        }
        (None, None) => None,
    };
    let mut unix_thread = None;
    if let Some((l, path)) = unix_listener {
        unix = Some(path);
        let (d, p) = (daemon.clone(), polling.clone());
        unix_thread = Some((std::thread::spawn(move || listener::unix(l, d, p)), !inherited_unix));
    }
    let mut vhost_user = Vec::new();
    if let Some(dir) = &cfg.listen.vhost_user {
        if !dir.is_dir() {
            return Err(StartError::Config(format!(
                "listen.vhost_user: {} is not a directory (create it first)",
                dir.display()
            )));
        }
        let mode = crate::config::unix_mode(&cfg.listen.unix_mode).map_err(StartError::Config)?;
        let group = match &cfg.listen.unix_group {
            Some(g) => Some((g.clone(), crate::config::unix_group(g, mode).map_err(StartError::Config)?)),
            None => None,
        };
        let mode = crate::vhost_user::sockets::SocketMode { mode, group };
        vhost_user = crate::vhost_user::sockets::start(daemon.clone(), dir.clone(), mode);
    }
    let mut api = None;
    if let Some(a) = &cfg.api {
        let addr: SocketAddr =
            a.listen.parse().map_err(|e| StartError::Config(format!("api.listen: `{}`: {e}", a.listen)))?;
        let token = a.token.clone().unwrap_or_else(crate::api::random_token);
        let bound = crate::api::start(
            daemon.clone(),
            addr,
            inherited.api.take(),
            token.clone(),
            std::time::Duration::from_nanos(r.api_idle_timeout_ns),
            a.tls,
        )?;
        if a.token.is_none() {
            let path = token_file;
            cachevisor_files::private_files::create(&path)
                .and_then(|mut f| std::io::Write::write_all(&mut f, token.as_bytes()))
                .map_err(|source| StartError::File { path: path.display().to_string(), error: source })?;
        }
        api = Some((bound, token));
    }
    if let Some(c) = &cfg.cluster {
        let settings = c.check().map_err(StartError::Config)?;
        daemon.join_cluster(settings, api.as_ref().map(|(a, _)| a.to_string()))?;
    }
    daemon.start_snapshots();
    if let Some(from) = opts.prewarm_from.as_ref().or(cfg.prewarm.from.as_ref()) {
        // A refused prewarm (missing or corrupt snapshots) is logged and shown in the
        // status; the daemon serves on with a cold cache.
        let _ = daemon.start_prewarm(from);
    } else if let Some(pending) = daemon.interrupted_prewarm() {
        tracing::info!(from = %pending.display(), "resuming the prewarm the last run did not finish");
        let _ = daemon.start_prewarm(&pending);
    }
    Ok(Running { daemon, tcp, unix, vhost_user, api, unix_thread })
}
