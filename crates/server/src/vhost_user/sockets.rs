//! One vhost-user socket per export in the `listen.vhost_user` directory, `NAME.sock`,
//! following the exports as they come and go (vDisks added or removed through the API, a
//! vSSD stopped or started): a watcher compares the daemon's exports with the sockets
//! every 200 ms. Each socket serves one QEMU at a time (vhost-user is point to point: a
//! device of one VM), and again after it disconnects; a removed export's connection is
//! shut down and its socket deleted. Sockets get `listen.unix_mode` and `unix_group`,
//! bound as the NBD socket is (`listen_path::bind_unix`).

use super::blk_backend::{BlkBackend, DeviceStats};
use crate::daemon::{Daemon, Export};
use cachevisor_trace::VmId;
use std::collections::BTreeMap;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vhost::vhost_user::Listener;
use vhost_user_backend::{ShutdownHandle, VhostUserDaemon};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

/// How often the watcher compares the exports with the sockets.
const WATCH: Duration = Duration::from_millis(200);

/// The permissions sockets get.
#[derive(Debug, Clone)]
pub struct SocketMode {
    /// File mode.
    pub mode: u32,
    /// Group name and id.
    pub group: Option<(String, u32)>,
}

/// A served export's socket.
struct Served {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    conn: Arc<Mutex<Option<ShutdownHandle>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Served {
    /// Ends the connection and the socket's thread (woken from `accept` by a connection
    /// of our own) and waits for it: its socket file is gone once this returns, so the
    /// export can be added again at once.
    fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.conn.lock().unwrap_or_else(|e| e.into_inner()).take() {
            h.shutdown();
        }
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Opens a socket for every export now (so a VM started once this returns finds its
/// disk), then starts the watcher thread for `dir`. Returns the sockets listening.
pub fn start(d: Arc<Daemon>, dir: PathBuf, mode: SocketMode) -> Vec<PathBuf> {
    let mut w = Watcher { served: BTreeMap::new(), refused: BTreeMap::new() };
    w.follow(&d, &dir, &mode);
    let paths = w.served.values().map(|s| s.path.clone()).collect();
    cachevisor_datapath::named("cv-vhost-user".into(), move || {
        while !d.is_stopped() {
            std::thread::sleep(WATCH);
            w.follow(&d, &dir, &mode);
        }
        w.follow(&d, &dir, &mode); // a stopped daemon has no exports: every socket closes
    });
    paths
}

/// The sockets served, and the exports that cannot have one (each named once in the log).
struct Watcher {
    served: BTreeMap<VmId, Served>,
    refused: BTreeMap<VmId, String>,
}

impl Watcher {
    /// Opens a socket for each new export and closes those of exports gone.
    fn follow(&mut self, d: &Arc<Daemon>, dir: &Path, mode: &SocketMode) {
        let exports: Vec<Export> = if d.is_stopped() { Vec::new() } else { d.nbd_exports() };
        self.served.retain(|id, s| {
            let keep = exports.iter().any(|e| e.id == *id);
            if !keep {
                tracing::info!(socket = %s.path.display(), "export gone: vhost-user socket closed");
                s.stop();
            }
            keep
        });
        self.refused.retain(|id, _| exports.iter().any(|e| e.id == *id));
        for e in &exports {
            if self.served.contains_key(&e.id) || self.refused.contains_key(&e.id) {
                continue;
            }
            match open(d, dir, mode, e) {
                Ok(s) => {
                    tracing::info!(export = %e.name, socket = %s.path.display(), "vhost-user-blk socket listening");
                    self.served.insert(e.id, s);
                }
                Err(why) if e.vhost_user == crate::vhost_access::Access::None => {
                    tracing::info!(export = %crate::log_safe(&e.name), "no vhost-user socket: {why}");
                    self.refused.insert(e.id, why);
                }
                Err(why) => {
                    tracing::warn!(export = %crate::log_safe(&e.name), "no vhost-user socket: {why}");
                    self.refused.insert(e.id, why);
                }
            }
        }
    }
}

/// Binds export `e`'s socket and starts its thread.
fn open(d: &Arc<Daemon>, dir: &Path, mode: &SocketMode, e: &Export) -> Result<Served, String> {
    use crate::vhost_access::Access;
    let path = crate::listen_path::socket_path(dir, &e.name).ok_or_else(|| {
        "its name is not a file name (letters, digits, `.`, `_`, `-`, not starting with `.`)".to_string()
    })?;
    // Who may open it (`vhost_access.rs`): an export that restricts its clients gets no socket
    // unless the operator named who may.
    let (file_mode, group) = match &e.vhost_user {
        Access::None => return Err(crate::vhost_access::describe(&e.vhost_user, &e.allow, d.tls_required(), "")),
        Access::Listen => (mode.mode, mode.group.clone()),
        Access::Owner => (0o600, None),
        Access::Group(g) => (0o660, Some((g.clone(), crate::config::unix_group(g, 0o660)?))),
    };
    let group = group.as_ref().map(|(n, g)| (n.as_str(), *g));
    let l = crate::listen_path::bind_unix(&path, "listen.vhost_user", file_mode, group)?;
    let mut s = Served {
        path: path.clone(),
        stop: Arc::new(AtomicBool::new(false)),
        conn: Arc::new(Mutex::new(None)),
        thread: None,
    };
    let (d, e) = (d.clone(), e.clone());
    let (stop, conn) = (s.stop.clone(), s.conn.clone());
    s.thread = Some(cachevisor_datapath::named(format!("cv-vhost {}", e.name), move || {
        serve(&d, &e, l, (&stop, &conn));
        // Closed: the file goes, unless something else is at the path by now.
        if crate::listen_path::inspect(&path, "").ok() == Some(crate::listen_path::AtPath::StaleSocket) {
            let _ = std::fs::remove_file(&path);
        }
    }));
    Ok(s)
}

/// Serves one connection after another on `l` until stopped.
fn serve(d: &Daemon, e: &Export, l: UnixListener, (stop, conn): (&AtomicBool, &Mutex<Option<ShutdownHandle>>)) {
    while !stop.load(Ordering::SeqCst) {
        let stats = Arc::new(DeviceStats::default());
        let latency = Some(crate::daemon::metrics::latency_of(d.metrics(), &e.name));
        let backend =
            match BlkBackend::new(d.export_backend(e.id), (&e.name, e.size), d.block_size(), stats.clone(), latency) {
                Ok(b) => Arc::new(b),
                Err(err) => return tracing::warn!(export = %e.name, %err, "cannot set up the vhost-user device"),
            };
        let mut daemon =
            match VhostUserDaemon::new(e.name.clone(), backend.clone(), GuestMemoryAtomic::new(GuestMemoryMmap::new()))
            {
                Ok(v) => v,
                Err(err) => return tracing::warn!(export = %e.name, %err, "cannot set up the vhost-user device"),
            };
        let mut listener = match l.try_clone() {
            Ok(c) => Listener::from(c),
            Err(err) => return tracing::warn!(export = %e.name, %err, "cannot use the vhost-user socket"),
        };
        if let Err(err) = daemon.start(&mut listener) {
            tracing::warn!(export = %e.name, %err, "vhost-user connection failed");
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        if stop.load(Ordering::SeqCst) {
            return; // woken to stop: the daemon's drop closes the connection
        }
        *conn.lock().unwrap_or_else(|p| p.into_inner()) = daemon.shutdown_handle();
        tracing::info!(export = %e.name, "vhost-user front end connected");
        let ended = daemon.wait();
        let (requests, errors, malformed) = (
            stats.requests.load(Ordering::Relaxed),
            stats.errors.load(Ordering::Relaxed),
            stats.malformed.load(Ordering::Relaxed),
        );
        match ended {
            Ok(()) => {
                tracing::info!(export = %e.name, requests, errors, malformed, "vhost-user front end disconnected")
            }
            Err(err) => {
                tracing::info!(export = %e.name, requests, errors, malformed, %err, "vhost-user connection ended")
            }
        }
        conn.lock().unwrap_or_else(|p| p.into_inner()).take();
        // The worker thread ends before the daemon (and its handler, which joins it) is
        // dropped; then the socket takes the next front end.
        backend.stop_worker();
        drop(daemon);
    }
}
