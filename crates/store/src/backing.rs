//! A vDisk's backing store: a local file (or block device), or another NBD server given
//! by URI (libnbd's forms, `nbd://HOST:PORT/EXPORT`, `nbd+unix:///EXPORT?socket=PATH`, and
//! their `nbds` TLS variants; see `nbd::uri`) — so a deliberately slow backing (nbdkit with its
//! delay filter, standing in for an HDD or a remote node) can sit behind the cache.
//!
//! A vDisk's size is its store's length rounded up to a whole 512-byte sector — QEMU's own
//! view of such an image (`qemu-img info` of a 1,000,000-byte raw file says 1,000,448), and
//! what QEMU's NBD client needs: it reads a partial last sector as a whole one. Images need
//! not be a multiple of the block size (ISO and cloud images): the engine's ops on the
//! last, partial block cover the whole block, so a read is served from the bytes the store
//! holds and zeros past them (up to the rounded size, and past it), and a write writes only
//! the bytes within the vDisk — a file grows into its last sector if that is written; an
//! NBD backing, which cannot grow, refuses a write past its end (ENOSPC), never drops it.
//! An op that starts at or past the vDisk's end is an error (the engine's range checks
//! never make one).

use crate::faults::Faults;
use cachevisor_nbd::client::Client;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Where a vDisk's data lives.
pub enum Backing {
    /// A file or block device, and its length when opened (the vDisk's size is that
    /// rounded up to a sector).
    File(File, u64),
    /// An NBD export (several connections when the server allows multi-conn).
    Nbd(NbdPool),
    /// Closed: the vDisk was removed.
    Removed,
    /// A store whose reads and extent queries misbehave on command, for tests
    /// ([`crate::faults`]).
    Faulty(Arc<Backing>, Arc<Faults>),
}

fn removed() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "the vDisk was removed")
}

/// Connections to one NBD export: requests take an idle one (or wait for one), so reads
/// ahead of the cache (see `prefetch`) wait on the server in parallel. More than one only
/// when the server advertises CAN_MULTI_CONN, which makes a FLUSH on any connection cover
/// writes completed on all of them.
pub struct NbdPool {
    conns: Vec<Mutex<Client>>,
    /// The export's size.
    size: u64,
    next: std::sync::atomic::AtomicUsize,
}

/// Whether a connection error may be a server still starting.
fn not_up_yet(e: &io::Error) -> bool {
    use io::ErrorKind::*;
    matches!(e.kind(), ConnectionRefused | NotFound | TimedOut | WouldBlock | ConnectionReset | UnexpectedEof)
}

/// Connections opened to an NBD backing that allows multi-conn.
const NBD_CONNECTIONS: usize = 16;

impl NbdPool {
    /// The first connection is retried for about 3 s while the server looks not started
    /// yet (refused, no socket file, no answer; a refused certificate or export is final
    /// at once); extra
    /// connections stop at the first that is refused or slow (a server's connection
    /// limit), keeping those made.
    /// `patient = false`: one attempt only (a cluster peer: a refused connection is a
    /// peer that is gone, and the request it serves goes to the backing store at once).
    /// Each connection is given up after `limit` (connecting and negotiating).
    fn connect(uri: &cachevisor_nbd::uri::NbdUri, patient: bool, limit: std::time::Duration) -> io::Result<NbdPool> {
        let (addr, export, tls) = (&uri.endpoint, uri.export.as_str(), uri.tls.as_ref());
        let mut wait = std::time::Duration::from_millis(50);
        let first = loop {
            match Client::connect_within(addr, export, tls, limit) {
                Ok(c) => break c,
                Err(e) if patient && wait < std::time::Duration::from_secs(2) && not_up_yet(&e) => {
                    tracing::info!(%e, %addr, "NBD backing not reachable yet: retrying");
                    std::thread::sleep(wait);
                    wait *= 2;
                }
                Err(e) => return Err(e),
            }
        };
        let n = if first.flags & cachevisor_nbd::proto::TFLAG_CAN_MULTI_CONN != 0 { NBD_CONNECTIONS } else { 1 };
        let mut conns = vec![Mutex::new(first)];
        while conns.len() < n {
            match Client::connect_within(addr, export, tls, limit) {
                Ok(c) => conns.push(Mutex::new(c)),
                Err(e) => {
                    tracing::info!(%e, %addr, connections = conns.len(), "NBD backing takes no more connections");
                    break;
                }
            }
        }
        let size = conns[0].get_mut().unwrap_or_else(|e| e.into_inner()).size;
        Ok(NbdPool { conns, size, next: 0.into() })
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

/// A sector: the unit a vDisk's size is rounded up to.
const SECTOR: u64 = 512;

/// The size of a vDisk whose store holds `len` bytes (see the top comment).
pub fn vdisk_size(len: u64) -> u64 {
    len.next_multiple_of(SECTOR)
}

/// Whether a backing spec is an NBD URI ([`cachevisor_nbd::uri`]).
pub fn is_uri(spec: &Path) -> bool {
    cachevisor_nbd::uri::is_uri(spec)
}

/// The NBD server's error as the errno it carries (ENOSPC stays ENOSPC up to the client).
fn nbd_err(e: u32) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// The size of an open file or block device.
pub fn file_size(f: &File) -> io::Result<u64> {
    let m = f.metadata()?;
    if std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()) {
        return Ok(rustix::fs::seek(f, rustix::fs::SeekFrom::End(0))?);
    }
    Ok(m.len())
}

/// Opens a vDisk's backing file for `at` (the config key it came from), checking its size
/// against `size` from the config: a missing file is created with that size (sparse; its
/// directory must exist); an existing one must have that size, unless `grow` allows making
/// it larger (logged). cachevisor never shrinks a backing store. The file is locked
/// exclusively (`flock`) so that a second process cannot cache it at the same time.
pub fn open_backing_file(path: &Path, size: Option<u64>, grow: bool, at: &str) -> Result<File, String> {
    let named = |e: io::Error| format!("{at}: {}: {e}", path.display());
    let f = match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let Some(size) = size else {
                return Err(format!("{at}: {} does not exist (give `size` to create it)", path.display()));
            };
            crate::owner_lock::parent_must_exist(path, &format!("{at}:"))?;
            let f = cachevisor_files::private_files::options()
                .read(true)
                .write(true)
                .create_new(true)
                .open(path)
                .map_err(named)?;
            f.set_len(size).map_err(named)?;
            tracing::info!(path = %path.display(), size, "created the backing file (sparse)");
            f
        }
        Err(e) => return Err(named(e)),
    };
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => return Err(format!("{at}: {} is in use by another cachevisor (it holds the file locked); two caches in front of one image would overwrite each other's data", path.display())),
        Err(e) => return Err(format!("{at}: {}: cannot lock: {e}", path.display())),
    }
    let have = file_size(&f).map_err(named)?;
    match size {
        Some(want) if want > have && grow => {
            f.set_len(want).map_err(named)?;
            tracing::warn!(path = %path.display(), from = have, to = want, "grew the backing file (grow = true)");
        }
        Some(want) if want > have => {
            return Err(format!("{at}.size: {} is {have} bytes but `size` is {want}: set `grow = true` to grow it, or correct `size` (remove it to use the file as it is)", path.display()));
        }
        Some(want) if want < have => {
            return Err(format!("{at}.size: {} is {have} bytes but `size` is {want}: cachevisor never shrinks a backing store; correct `size` (or remove it to use the file as it is)", path.display()));
        }
        _ => {}
    }
    Ok(f)
}

/// Whether the cache store bypasses the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DirectIo {
    /// O_DIRECT where the filesystem and device allow 512-byte aligned I/O.
    #[default]
    Auto,
    /// O_DIRECT or refuse to start.
    On,
    /// Buffered I/O.
    Off,
}

/// Opens the cache store (its file already exists: the owner lock created it), sizes it and
/// preallocates it (fallocate), so a file system without room for the whole cache is found
/// at start, not as failed writes while serving. With `direct` not `Off`, the store is
/// opened with O_DIRECT when the filesystem and device take 512-byte aligned I/O (probed
/// with a read), which every cache-store op is. Returns the file and whether it is O_DIRECT.
pub fn open_cache_store(path: &Path, size: u64, direct: DirectIo) -> io::Result<(File, bool)> {
    let buffered = OpenOptions::new().read(true).write(true).open(path)?;
    size_cache_store(&buffered, size, path)?;
    if direct == DirectIo::Off {
        return Ok((buffered, false));
    }
    let probe = || -> io::Result<File> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
            .open(path)?;
        let mut b = cachevisor_files::aligned_buf::AlignedBuf::default();
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

/// Makes the cache store `f` (at `path`) exactly `size` bytes, preallocated — a block
/// device must hold at least that much.
fn size_cache_store(f: &File, size: u64, path: &Path) -> io::Result<()> {
    let is_device = std::os::unix::fs::FileTypeExt::is_block_device(&f.metadata()?.file_type());
    if is_device {
        let have = file_size(f)?;
        if have < size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the block device has {have} bytes, the cache needs {size}"),
            ));
        }
        return Ok(());
    }
    if file_size(f)? != size {
        f.set_len(size)?;
    }
    match rustix::fs::fallocate(f, rustix::fs::FallocateFlags::empty(), 0, size) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => {
            tracing::warn!(path = %path.display(), "the file system cannot preallocate the cache store: a full file system will show as failed cache writes");
            Ok(())
        }
        Err(e) => Err(io::Error::new(io::Error::from(e).kind(), format!("cannot reserve {size} bytes for the cache store: {e} (the cache file is preallocated so that a full file system is found at start)"))),
    }
}

/// Grows an open cache store to `size` bytes (a grow while running): a file is extended
/// and preallocated (a full file system refuses it here, before any slot there is used),
/// a block device must already hold them.
pub fn extend_cache_store(f: &File, size: u64) -> io::Result<()> {
    size_cache_store(f, size, Path::new("the cache file"))
}

impl Backing {
    /// Connects to the NBD backing `spec` ([`cachevisor_nbd::uri`]).
    pub fn connect(spec: &Path) -> io::Result<Backing> {
        let uri = cachevisor_nbd::uri::parse(spec.to_str().unwrap_or_default())?;
        Ok(Backing::Nbd(NbdPool::connect(&uri, true, std::time::Duration::from_secs(2))?))
    }

    /// [`Self::connect`] without waiting for a server that is not up: one attempt.
    pub fn connect_once(spec: &Path) -> io::Result<Backing> {
        Backing::connect_once_within(spec, std::time::Duration::from_secs(2))
    }

    /// [`Self::connect_once`], each connection given up after `limit`: a cluster peer's
    /// connection is part of the request that needs it, whose stall its deadline bounds
    /// (a replica log's first write after an epoch change connects anew; with the peer
    /// cut off, a 2 s connect limit made that write stall 2 s past `replica_timeout`).
    pub fn connect_once_within(spec: &Path, limit: std::time::Duration) -> io::Result<Backing> {
        let uri = cachevisor_nbd::uri::parse(spec.to_str().unwrap_or_default())?;
        Ok(Backing::Nbd(NbdPool::connect(&uri, false, limit)?))
    }

    /// Opens `spec` for config key `at`: an NBD URI (whose export must have `size` bytes
    /// when given), or a file (see [`open_backing_file`]).
    pub fn open(spec: &Path, size: Option<u64>, grow: bool, at: &str) -> Result<Backing, String> {
        if is_uri(spec) {
            let b = Backing::connect(spec).map_err(|e| format!("{at}: {}: {e}", spec.display()))?;
            let have = b.size().map_err(|e| format!("{at}: {}: {e}", spec.display()))?;
            if let Some(want) = size.filter(|&w| w != have) {
                return Err(format!("{at}.size: the NBD export {} has {have} bytes, not {want}", spec.display()));
            }
            return Ok(b);
        }
        Backing::file(open_backing_file(spec, size, grow, at)?).map_err(|e| format!("{at}: {}: {e}", spec.display()))
    }

    /// A file or block device as it is now.
    pub fn file(f: File) -> io::Result<Backing> {
        let size = file_size(&f)?;
        Ok(Backing::File(f, size))
    }

    /// An NBD store's request deadline (`None`: wait as long as the server takes): a
    /// request unanswered by then fails (and its connection is not to be used again).
    pub fn set_op_timeout(&self, t: Option<std::time::Duration>) -> io::Result<()> {
        match self {
            Backing::Nbd(p) => {
                for c in &p.conns {
                    c.lock().unwrap_or_else(|e| e.into_inner()).socket().set_timeouts(t)?;
                }
            }
            Backing::Faulty(b, _) => b.set_op_timeout(t)?,
            Backing::File(..) | Backing::Removed => {}
        }
        Ok(())
    }

    /// Size in bytes.
    /// The vDisk's size: the store's length rounded up to a sector (see the top comment).
    pub fn size(&self) -> io::Result<u64> {
        match self {
            Backing::File(_, len) => Ok(vdisk_size(*len)),
            Backing::Nbd(c) => Ok(vdisk_size(c.size)),
            Backing::Removed => Err(removed()),
            Backing::Faulty(b, _) => b.size(),
        }
    }

    /// How many of `len` bytes at `addr` exist (the rest are past the end); an error when
    /// none do.
    fn existing(&self, addr: u64, len: usize) -> io::Result<usize> {
        let end = self.size()?;
        if addr >= end && len > 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{len} bytes at {addr}: past the end of the backing store ({end} bytes)"),
            ));
        }
        Ok((end - addr).min(len as u64) as usize)
    }

    /// Reads `buf.len()` bytes at `addr`: the bytes the store holds, zeros past its end.
    pub fn read_at(&self, buf: &mut [u8], addr: u64) -> io::Result<()> {
        let n = self.existing(addr, buf.len())?;
        let (buf, past) = buf.split_at_mut(n);
        past.fill(0);
        match self {
            Backing::File(f, len) => {
                // Short at the file's end (its last, partial sector): the rest is zeros. A
                // file shorter than when it was opened (truncated behind our back) is an
                // error, never zeros.
                let mut got = 0;
                while got < buf.len() {
                    match f.read_at(&mut buf[got..], addr + got as u64) {
                        Ok(0) => break,
                        Ok(k) => got += k,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                if got < buf.len() && addr + (got as u64) < *len {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "the backing file ends at {} bytes, shorter than the {len} it had when opened",
                            addr + got as u64
                        ),
                    ));
                }
                buf[got..].fill(0);
                Ok(())
            }
            Backing::Nbd(c) => {
                let held = c.size.saturating_sub(addr).min(buf.len() as u64) as usize;
                let (buf, past) = buf.split_at_mut(held);
                past.fill(0);
                if buf.is_empty() {
                    return Ok(());
                }
                let d = c.get().read(addr, buf.len() as u32)?.map_err(nbd_err)?;
                buf.copy_from_slice(&d);
                Ok(())
            }
            Backing::Removed => Err(removed()),
            Backing::Faulty(b, faults) => {
                faults.before_read();
                b.read_at(buf, addr)
            }
        }
    }

    /// Writes `data` at `addr`: the bytes within the vDisk (nothing past its end).
    pub fn write_at(&self, data: &[u8], addr: u64) -> io::Result<()> {
        let data = &data[..self.existing(addr, data.len())?];
        match self {
            Backing::File(f, _) => f.write_all_at(data, addr),
            Backing::Nbd(c) => {
                if addr + data.len() as u64 > c.size {
                    return Err(io::Error::new(
                        io::ErrorKind::StorageFull,
                        format!("{} bytes at {addr}: past the end of the NBD backing ({} bytes), which cannot grow into its last sector", data.len(), c.size),
                    ));
                }
                c.get().write(addr, data, false)?.map_err(nbd_err)
            }
            Backing::Removed => Err(removed()),
            Backing::Faulty(b, _) => b.write_at(data, addr),
        }
    }

    /// Tells the store that `len` bytes at `addr` are no longer needed (TRIM): a hole is
    /// punched in a file or block device, an NBD backing gets TRIM if it accepts it.
    /// Returns whether the store took the hint; a store that cannot is not an error.
    pub fn discard(&self, addr: u64, len: u64) -> io::Result<bool> {
        if len == 0 {
            return Ok(false);
        }
        let len = self.size()?.saturating_sub(addr).min(len);
        if len == 0 {
            return Ok(false);
        }
        match self {
            Backing::File(f, _) => {
                use rustix::fs::FallocateFlags as F;
                match rustix::fs::fallocate(f, F::PUNCH_HOLE | F::KEEP_SIZE, addr, len) {
                    Ok(()) => Ok(true),
                    Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
            Backing::Nbd(c) => {
                let mut c = c.get();
                if c.flags & cachevisor_nbd::proto::TFLAG_SEND_TRIM == 0 {
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
            Backing::Faulty(b, _) => b.discard(addr, len),
        }
    }

    /// Makes completed writes durable (fdatasync, or NBD FLUSH).
    pub fn sync(&self) -> io::Result<()> {
        match self {
            Backing::File(f, _) => f.sync_data(),
            Backing::Nbd(c) => c.get().flush()?.map_err(nbd_err),
            Backing::Removed => Ok(()), // nothing left to make durable
            Backing::Faulty(b, _) => b.sync(),
        }
    }

    /// `store` wrapped with `faults` (its reads delayed, its extent queries paused on
    /// command; [`crate::faults`]).
    pub fn with_faults(store: Arc<Backing>, faults: Arc<Faults>) -> Backing {
        Backing::Faulty(store, faults)
    }

    /// `(start, end, data)` pieces of `start..end`, in order, covering it: a file's holes
    /// by `SEEK_DATA`/`SEEK_HOLE` (what qemu-nbd and nbdkit's file plugin do), a block
    /// device or an NBD store all data (safe: "data" only means "read it").
    pub fn extents(&self, start: u64, end: u64) -> io::Result<Vec<(u64, u64, bool)>> {
        let f = match self {
            Backing::Faulty(b, faults) => {
                faults.before_extents();
                return b.extents(start, end);
            }
            Backing::File(f, _) if f.metadata()?.file_type().is_file() => f,
            _ => return Ok(vec![(start, end, true)]), // a block device or NBD: no holes to ask about
        };
        use rustix::fs::{seek, SeekFrom};
        let mut out = Vec::new();
        let mut at = start;
        while at < end {
            // The next data at or after `at` (ENXIO: none before the end of the file).
            let data = match seek(f, SeekFrom::Data(at)) {
                Ok(d) => d.min(end),
                Err(rustix::io::Errno::NXIO) => end,
                Err(rustix::io::Errno::INVAL) => return Ok(vec![(start, end, true)]), // no SEEK_DATA here
                Err(e) => return Err(e.into()),
            };
            if data > at {
                out.push((at, data, false));
            }
            if data >= end {
                break;
            }
            let hole = match seek(f, SeekFrom::Hole(data)) {
                Ok(h) => h.min(end),
                Err(rustix::io::Errno::NXIO) => end,
                Err(e) => return Err(e.into()),
            };
            out.push((data, hole.max(data + 1).min(end), true));
            at = hole.max(data + 1);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_last_sector_reads_as_zeros_and_a_truncated_file_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("img");
        std::fs::write(&p, vec![7u8; 1000]).unwrap();
        let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
        let b = Backing::file(f.try_clone().unwrap()).unwrap();
        assert_eq!(b.size().unwrap(), 1024, "rounded up to a sector");
        let mut buf = vec![1u8; 1024];
        b.read_at(&mut buf, 0).unwrap();
        assert!(buf[..1000].iter().all(|&x| x == 7) && buf[1000..].iter().all(|&x| x == 0));
        assert!(b.read_at(&mut [0u8; 512], 1024).is_err(), "starts past the end");
        // A write into the last sector grows the file; nothing past the vDisk is written.
        b.write_at(&[9u8; 512], 512).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 1024);
        // Truncated behind the daemon's back: an error, not zeros.
        f.set_len(500).unwrap();
        let e = b.read_at(&mut [0u8; 512], 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
    }
}
