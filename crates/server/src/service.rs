//! Starting the service: the daemon, then its listeners on background threads. Returns
//! the bound addresses (a `:0` TCP port is resolved) and the NBD URIs to connect to.

use crate::config::Config;
use crate::daemon::{Daemon, StartError};
use crate::listener;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::UnixListener;
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
}

impl Running {
    /// One NBD URI per export and listener.
    pub fn uris(&self) -> Vec<String> {
        let mut v = Vec::new();
        for e in self.daemon.exports() {
            if let Some(a) = self.tcp {
                v.push(format!("nbd://{a}/{}", e.name));
            }
            if let Some(p) = &self.unix {
                v.push(format!("nbd+unix:///{}?socket={}", e.name, p.display()));
            }
        }
        v
    }
}

/// Starts the daemon and its listeners.
pub fn start(cfg: &Config) -> Result<Running, StartError> {
    let daemon = Arc::new(Daemon::start(cfg)?);
    let mut tcp = None;
    if let Some(addr) = &cfg.listen.tcp {
        let addr: SocketAddr = addr.parse().map_err(|e| StartError::Config(format!("listen.tcp: `{addr}`: {e}")))?;
        if !addr.ip().is_loopback() {
            tracing::warn!(%addr, "listening on a non-loopback address");
        }
        let l = TcpListener::bind(addr).map_err(|source| StartError::File { path: format!("listen.tcp {addr}"), source })?;
        tcp = Some(l.local_addr().map_err(|source| StartError::File { path: format!("listen.tcp {addr}"), source })?);
        let d = daemon.clone();
        std::thread::spawn(move || listener::tcp(l, d));
    }
    let mut unix = None;
    if let Some(p) = &cfg.listen.unix {
        let _ = std::fs::remove_file(p); // a stale socket from an earlier run
        let l = UnixListener::bind(p).map_err(|source| StartError::File { path: p.display().to_string(), source })?;
        unix = Some(p.clone());
        let d = daemon.clone();
        std::thread::spawn(move || listener::unix(l, d));
    }
    Ok(Running { daemon, tcp, unix })
}
