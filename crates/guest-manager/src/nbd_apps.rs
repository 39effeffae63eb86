//! `cachevisor-guest --serve SOCKET`: the guest-side cache served as NBD exports, so fio,
//! qemu-io or a file system drive it instead of the built-in workload. Each application
//! (§5.4's per-application shares) is one export, `app0`, `app1`, …, over its own equal
//! slice of the origin; its requests are tagged with that application, so `--shares`
//! splits the vSSD between the exports. The NBD side is the daemon's own handshake and
//! transmission loop (`cachevisor_nbd::transmission`) over an `ExportBackend` that runs each
//! request on the one cache under a lock; the host's notices (inflates, deflates) are
//! handled between requests and every 20 ms. SIGINT/SIGTERM: every dirty block written
//! back, the map saved with `--state`, the totals printed.

use crate::manager::Dev;
use anyhow::Context;
use cachevisor_guest::GuestCache;
use cachevisor_nbd::backend::ClientError;
use cachevisor_nbd::backend::ExportBackend;
use cachevisor_nbd::backend::ExportInfo;
use cachevisor_nbd::backend::{Cmd, Done};
use cachevisor_nbd::handshake::{negotiate, Exports, Negotiated};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The cache, shared by every connection.
pub type Shared = Arc<Mutex<GuestCache<Dev, Dev>>>;

/// The exports: one per application.
struct AppExports {
    slice: u64,
    apps: u16,
    block: u64,
}

impl Exports for AppExports {
    fn exports(&self) -> Vec<ExportInfo> {
        (0..self.apps)
            .map(|a| ExportInfo { id: a as u32, name: format!("app{a}"), size: self.slice, ..Default::default() })
            .collect()
    }
    fn block_size(&self) -> u64 {
        self.block
    }
}

/// One application's slice of the origin, through the cache.
struct AppExport {
    cache: Shared,
    app: u16,
    base: u64,
}

impl AppExport {
    fn run<T>(&self, f: impl FnOnce(&mut GuestCache<Dev, Dev>) -> std::io::Result<T>) -> Result<T, ClientError> {
        let mut g = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let r = f(&mut g);
        // The host's notices, between requests (an inflate or a deflate's deadline).
        let _ = g.service();
        r.map_err(|e| {
            tracing::warn!(app = self.app, %e, "guest cache request failed");
            ClientError::Io
        })
    }
}

impl ExportBackend for AppExport {
    fn direct(&self) -> bool {
        false
    }
    fn serves(&self) -> bool {
        true
    }
    fn submit(&self, offset: u64, cmd: Cmd, _here: bool, done: Done) {
        let (app, at) = (self.app, self.base + offset);
        done(match cmd {
            Cmd::Read(len) => self
                .run(|g| {
                    let mut buf = vec![0u8; len as usize];
                    g.read(app, at, &mut buf).map(|()| buf)
                })
                .map(|buf| vec![(buf.into(), offset)]),
            Cmd::Write(data) => self.run(|g| g.write(app, at, &data)).map(|()| Vec::new()),
            Cmd::Flush => self.flush_now().map(|()| Vec::new()),
            Cmd::Discard(_) => Ok(Vec::new()),
        })
    }
    fn hint_cache(&self, _offset: u64, _len: u64) {}
    fn allocation(&self, _offset: u64, len: u32, _one: bool) -> std::io::Result<Vec<(u32, u32)>> {
        Ok(vec![(len, 0)])
    }
    fn write_now(&self, offset: u64, data: &[u8]) -> Result<(), ClientError> {
        self.run(|g| g.write(self.app, self.base + offset, data))
    }
    fn flush_now(&self) -> Result<(), ClientError> {
        // Durable: every dirty block written back to the origin, which is flushed.
        self.run(|g| g.flush())
    }
}

/// Serves `cache` as `apps` exports on the unix socket `socket` until SIGINT/SIGTERM.
pub fn serve(cache: Shared, apps: u16, socket: &Path) -> anyhow::Result<()> {
    let (slice, block) = {
        let g = cache.lock().unwrap_or_else(|e| e.into_inner());
        (g.origin_size() / u64::from(apps) / 4096 * 4096, g.block_size())
    };
    anyhow::ensure!(slice > 0, "the origin is too small for {apps} exports");
    let _ = std::fs::remove_file(socket);
    let l = UnixListener::bind(socket).with_context(|| format!("--serve {}", socket.display()))?;
    let exports = Arc::new(AppExports { slice, apps, block });
    for a in 0..apps {
        let p = std::path::absolute(socket).unwrap_or_else(|_| socket.to_path_buf());
        println!("nbd+unix:///app{a}?socket={}", p.display());
    }
    use std::io::Write as _;
    std::io::stdout().flush()?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let ticker = {
        let (cache, stop) = (cache.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
                let _ = cache.lock().unwrap_or_else(|e| e.into_inner()).service();
            }
        })
    };
    l.set_nonblocking(true)?;
    while !stop.load(Ordering::Relaxed) {
        let mut s = match l.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(e) => return Err(e).context("accepting an NBD connection"),
        };
        s.set_nonblocking(false)?;
        let (cache, exports) = (cache.clone(), exports.clone());
        std::thread::spawn(move || {
            let (app, replies) = match negotiate(&mut s, exports.as_ref()) {
                Ok(Negotiated::Export(app, replies)) => (app as u16, replies),
                Ok(_) => return,
                Err(e) => return tracing::info!(%e, "negotiation failed"),
            };
            let backend = Arc::new(AppExport { cache, app, base: u64::from(app) * exports.slice });
            let Ok(w) = s.try_clone() else { return };
            if let Err(e) = cachevisor_nbd::transmission::serve(
                std::io::BufReader::new(s),
                w,
                backend,
                (exports.slice, replies),
                None,
            ) {
                tracing::info!(app, %e, "connection ended");
            }
        });
    }
    let _ = ticker.join();
    let _ = std::fs::remove_file(socket);
    Ok(())
}
