//! A vDisk's backing store: a local file (or block device), or another NBD server given
//! by URI (`nbd://HOST:PORT/EXPORT`) — so a deliberately slow backing (nbdkit with its
//! delay filter, standing in for an HDD or a remote node) can sit behind the cache.

use crate::nbd::client::Client;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;

/// Where a vDisk's data lives.
pub enum Backing {
    /// A file or block device.
    File(File),
    /// An NBD export (several connections when the server allows multi-conn).
    Nbd(NbdPool),
    /// Closed: the vDisk was removed.
    Removed,
}

fn removed() -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, "the vDisk was removed")
}

/// Connections to one NBD export: requests take an idle one (or wait for one), so reads
/// ahead of the cache (see `prefetch`) wait on the server in parallel. More than one only
/// when the server advertises CAN_MULTI_CONN, which makes a FLUSH on any connection cover
/// writes completed on all of them.
pub struct NbdPool {
    conns: Vec<Mutex<Client>>,
    next: std::sync::atomic::AtomicUsize,
}

/// Connections opened to an NBD backing that allows multi-conn.
const NBD_CONNECTIONS: usize = 16;

impl NbdPool {
    /// The first connection is retried for about 3 s (a server still starting); extra
    /// connections stop at the first that is refused or slow (a server's connection
    /// limit), keeping those made.
    fn connect(addr: std::net::SocketAddr, export: &str) -> io::Result<NbdPool> {
        let limit = std::time::Duration::from_secs(2);
        let mut wait = std::time::Duration::from_millis(50);
        let first = loop {
            match Client::connect_within(addr, export, limit) {
                Ok(c) => break c,
                Err(e) if wait < std::time::Duration::from_secs(2) => {
                    tracing::info!(%e, %addr, "NBD backing not reachable yet: retrying");
                    std::thread::sleep(wait);
                    wait *= 2;
                }
                Err(e) => return Err(e),
            }
        };
        let n = if first.flags & crate::nbd::proto::TFLAG_CAN_MULTI_CONN != 0 { NBD_CONNECTIONS } else { 1 };
        let mut conns = vec![Mutex::new(first)];
        while conns.len() < n {
            match Client::connect_within(addr, export, limit) {
                Ok(c) => conns.push(Mutex::new(c)),
                Err(e) => {
                    tracing::info!(%e, %addr, connections = conns.len(), "NBD backing takes no more connections");
                    break;
                }
            }
        }
        Ok(NbdPool { conns, next: 0.into() })
    }

    /// An idle connection, or the next one in turn when all are busy.
    fn get(&self) -> std::sync::MutexGuard<'_, Client> {
        let start = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let n = self.conns.len();
        for i in 0..n {
            if let Ok(c) = self.conns[(start + i) % n].try_lock() {
                return c;
            }
        }
        self.conns[start % n].lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether a backing spec is an NBD URI.
pub fn is_uri(spec: &Path) -> bool {
    spec.to_str().is_some_and(|s| s.starts_with("nbd://"))
}

fn nbd_err(e: u32) -> io::Error {
    io::Error::other(format!("backing NBD server returned error {e}"))
}

/// Opens a file for reading and writing; when `create_size` is given, creates it (and its
/// directory) if missing and makes it at least that large (sparse).
pub fn open_file(path: &Path, create_size: Option<u64>) -> io::Result<File> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let f = OpenOptions::new().read(true).write(true).create(create_size.is_some()).truncate(false).open(path)?;
    if let Some(size) = create_size {
        if f.metadata()?.len() < size {
            f.set_len(size)?;
        }
    }
    Ok(f)
}

/// Opens (creating and sizing) the cache store; with `direct` not `Off`, with O_DIRECT
/// when the filesystem and device take 512-byte aligned I/O (probed with a read), which
/// every cache-store op is. Returns the file and whether it is O_DIRECT.
pub fn open_cache_store(path: &Path, size: u64, direct: crate::config::DirectIo) -> io::Result<(File, bool)> {
    use crate::config::DirectIo;
    let buffered = open_file(path, Some(size))?;
    if direct == DirectIo::Off {
        return Ok((buffered, false));
    }
    let probe = || -> io::Result<File> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = OpenOptions::new().read(true).write(true).custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32).open(path)?;
        let mut b = crate::aligned_buf::AlignedBuf::default();
        f.read_exact_at(&mut b.slice(4096)[..512], 512)?;
        Ok(f)
    };
    match probe() {
        Ok(f) => Ok((f, true)),
        Err(e) if direct == DirectIo::Auto => {
            tracing::info!(%e, path = %path.display(), "O_DIRECT not available on the cache store: buffered I/O");
            Ok((buffered, false))
        }
        Err(e) => Err(io::Error::new(e.kind(), format!("O_DIRECT (cache.direct = \"on\"): {e}"))),
    }
}

impl Backing {
    /// Opens `spec`: an `nbd://HOST:PORT/EXPORT` URI, or a file (created sparse with
    /// `create_size` when missing).
    pub fn open(spec: &Path, create_size: Option<u64>) -> io::Result<Backing> {
        if let Some(rest) = spec.to_str().and_then(|s| s.strip_prefix("nbd://")) {
            let (host, export) = rest.split_once('/').unwrap_or((rest, ""));
            let addr = host.parse().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("`{host}` is not IP:PORT ({e})")))?;
            return Ok(Backing::Nbd(NbdPool::connect(addr, export)?));
        }
        Ok(Backing::File(open_file(spec, create_size)?))
    }

    /// Size in bytes.
    pub fn size(&self) -> io::Result<u64> {
        match self {
            Backing::File(f) => Ok(f.metadata()?.len()),
            Backing::Nbd(c) => Ok(c.get().size),
            Backing::Removed => Err(removed()),
        }
    }

    /// Reads `buf.len()` bytes at `addr`.
    pub fn read_at(&self, buf: &mut [u8], addr: u64) -> io::Result<()> {
        match self {
            Backing::File(f) => f.read_exact_at(buf, addr),
            Backing::Nbd(c) => {
                let d = c.get().read(addr, buf.len() as u32)?.map_err(nbd_err)?;
                buf.copy_from_slice(&d);
                Ok(())
            }
            Backing::Removed => Err(removed()),
        }
    }

    /// Writes `data` at `addr`.
    pub fn write_at(&self, data: &[u8], addr: u64) -> io::Result<()> {
        match self {
            Backing::File(f) => f.write_all_at(data, addr),
            Backing::Nbd(c) => c.get().write(addr, data, false)?.map_err(nbd_err),
            Backing::Removed => Err(removed()),
        }
    }

    /// Tells the store that `len` bytes at `addr` are no longer needed (TRIM): a hole is
    /// punched in a file or block device, an NBD backing gets TRIM if it accepts it.
    /// Returns whether the store took the hint; a store that cannot is not an error.
    pub fn discard(&self, addr: u64, len: u64) -> io::Result<bool> {
        if len == 0 {
            return Ok(false);
        }
        match self {
            Backing::File(f) => {
                use rustix::fs::FallocateFlags as F;
                match rustix::fs::fallocate(f, F::PUNCH_HOLE | F::KEEP_SIZE, addr, len) {
                    Ok(()) => Ok(true),
                    Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
            Backing::Nbd(c) => {
                let mut c = c.get();
                if c.flags & crate::nbd::proto::TFLAG_SEND_TRIM == 0 {
                    return Ok(false);
                }
                let mut at = 0;
                while at < len {
                    let n = (len - at).min(1 << 30);
                    c.trim(addr + at, n as u32)?.map_err(nbd_err)?;
                    at += n;
                }
                Ok(true)
            }
            Backing::Removed => Err(removed()),
        }
    }

    /// Makes completed writes durable (fdatasync, or NBD FLUSH).
    pub fn sync(&self) -> io::Result<()> {
        match self {
            Backing::File(f) => f.sync_data(),
            Backing::Nbd(c) => c.get().flush()?.map_err(nbd_err),
            Backing::Removed => Ok(()), // nothing left to make durable
        }
    }
}
