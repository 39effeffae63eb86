//! The replica logs a node keeps for its peers (`[cluster] replica_capacity`,
//! "durability beyond ELICA"): one file per owner, `METADATA/replicas/<owner>.log`, opened
//! `O_DSYNC` — a record is on this node's disk when its write is answered, so the owner
//! acknowledges a write only once it is durable on two nodes — and kept across this
//! node's restarts (unlike lent cache, it may be the only other copy of a dirty block).
//! The bytes are `cachevisor_cluster::replica_record`'s; this node never interprets them.
//!
//! Exported over TLS NBD as `replica-<owner>@<epoch>`: while the owner is a live member,
//! to the owner's certificate only, for reading and writing; once it is gone, to every
//! live member's, read-only — the node a dead owner's vDisk restarts on replays the log
//! into the backing store before serving it (`replica_replay.rs`). Fenced like lent
//! cache on every request: this node holds its lease and is at the connection's epoch.

use super::Cluster;
use cachevisor_datapath::Cmd;
use cachevisor_nbd::backend::ClientError;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

/// Export ids of replica logs carry this bit (lent regions bit 30, vSSDs bit 31).
pub(crate) const REPLICA_EXPORT: u32 = 1 << 29;

/// `O_DSYNC` on Linux (every write durable when it returns) without a libc dependency.
const O_DSYNC: i32 = 0o10000;

/// The logs this node keeps.
pub struct ReplicaLogs {
    dir: PathBuf,
    /// A new log's size, bytes.
    pub size: u64,
    /// Owners by index (the export id's low bits), and their open files.
    logs: Mutex<super::lent::Regions>,
    /// Each owner's log opened `O_DIRECT | O_DSYNC` too, where the file system allows:
    /// whole-sector writes go through it (measured: a 13.5 KiB `O_DSYNC` append took
    /// 218 µs through the page cache, 58 µs direct).
    direct: Mutex<std::collections::BTreeMap<String, Arc<File>>>,
}

impl ReplicaLogs {
    /// The logs under `dir` (created; logs kept from earlier runs stay).
    pub fn new(dir: PathBuf, size: u64) -> io::Result<ReplicaLogs> {
        std::fs::create_dir_all(&dir)?;
        Ok(ReplicaLogs { dir, size, logs: Default::default(), direct: Default::default() })
    }

    /// The export name of `owner`'s log at `epoch`.
    pub fn export_name(owner: &str, epoch: u64) -> String {
        format!("replica-{owner}@{epoch}")
    }

    /// The export id of `owner`'s log (assigned on first use).
    pub fn id(&self, owner: &str) -> u32 {
        let mut l = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        match l.0.iter().position(|o| o == owner) {
            Some(i) => REPLICA_EXPORT | i as u32,
            None => {
                l.0.push(owner.to_string());
                REPLICA_EXPORT | (l.0.len() - 1) as u32
            }
        }
    }

    /// The owner of export id `id`.
    pub fn owner(&self, id: u32) -> Option<String> {
        self.logs.lock().unwrap_or_else(|e| e.into_inner()).0.get((id & !REPLICA_EXPORT) as usize).cloned()
    }

    /// Owners whose logs exist here (a dead owner's too).
    pub fn kept(&self) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut v: Vec<String> = rd
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".log").map(str::to_string))
            .filter(|o| crate::config::cluster_section::check_name("replica", o).is_ok())
            .collect();
        v.sort();
        v
    }

    /// Deletes `owner`'s log (the caller checked it is no longer needed:
    /// `Cluster::forget_replica`); the bytes freed, or `None` if none is kept here. If the
    /// owner comes back, its first write starts a new log (the owner's resync).
    pub fn forget(&self, owner: &str) -> io::Result<Option<u64>> {
        if crate::config::cluster_section::check_name("replica", owner).is_err() {
            return Ok(None); // not a node name: no file of ours
        }
        let mut l = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        let path = self.dir.join(format!("{owner}.log"));
        let Ok(m) = std::fs::metadata(&path) else { return Ok(None) };
        l.1.remove(owner);
        self.direct.lock().unwrap_or_else(|e| e.into_inner()).remove(owner);
        std::fs::remove_file(&path)?;
        Ok(Some(m.len()))
    }

    /// `owner`'s log's size: its file's, or a new log's.
    pub fn size_of(&self, owner: &str) -> u64 {
        std::fs::metadata(self.dir.join(format!("{owner}.log"))).map_or(self.size, |m| m.len())
    }

    /// `owner`'s log file, created at first use (`create`; written with zeros), never
    /// truncated.
    fn file(&self, owner: &str, create: bool) -> io::Result<Arc<File>> {
        let mut l = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = l.1.get(owner) {
            return Ok(f.clone());
        }
        let path = self.dir.join(format!("{owner}.log"));
        // Private (0600): another node's written data.
        let f = cachevisor_files::private_files::own_options()
            .read(true)
            .write(true)
            .create(create)
            .custom_flags(O_DSYNC | rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&path)?;
        if f.metadata()?.len() == 0 {
            fill_zeros(&f, self.size)?;
        }
        let f = Arc::new(f);
        l.1.insert(owner.to_string(), f.clone());
        let direct = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(O_DSYNC | (rustix::fs::OFlags::DIRECT | rustix::fs::OFlags::NOFOLLOW).bits() as i32)
            .open(&path);
        match direct {
            Ok(d) => {
                self.direct.lock().unwrap_or_else(|e| e.into_inner()).insert(owner.to_string(), Arc::new(d));
            }
            Err(e) => tracing::info!(%e, "replica log: no O_DIRECT here; appends go through the page cache (O_DSYNC)"),
        }
        Ok(f)
    }

    /// Writes `data` at `at` of `owner`'s log, durably: whole sectors through the
    /// `O_DIRECT` handle (an aligned copy), anything else through the page cache.
    fn write(&self, owner: &str, f: &File, data: &[u8], at: u64) -> io::Result<()> {
        let sector = 512;
        let direct = self.direct.lock().unwrap_or_else(|e| e.into_inner()).get(owner).cloned();
        match direct {
            Some(d) if at.is_multiple_of(sector) && (data.len() as u64).is_multiple_of(sector) => {
                BOUNCE.with_borrow_mut(|bounce| cachevisor_files::aligned_buf::write_at(&d, bounce, data, at))
            }
            _ => f.write_all_at(data, at),
        }
    }
}

thread_local! {
    /// Each connection thread's aligned buffer for `O_DIRECT` appends (one allocation per
    /// thread, not one per write).
    static BOUNCE: std::cell::RefCell<cachevisor_files::aligned_buf::AlignedBuf> = Default::default();
}

/// Writes a new log's `size` bytes as zeros, then syncs: every block allocated and
/// written once, so an `O_DSYNC` append is a data write only — into a hole, or an
/// unwritten extent, each append would also commit the file system's journal (measured:
/// appends into a sparse log ran at half the rate), and a full disk fails now, not an
/// acknowledged write later.
fn fill_zeros(f: &File, size: u64) -> io::Result<()> {
    let chunk = vec![0u8; 4 << 20];
    let mut at = 0;
    while at < size {
        let n = (size - at).min(chunk.len() as u64) as usize;
        f.write_all_at(&chunk[..n], at)?;
        at += n as u64;
    }
    f.sync_all()
}

/// One connection to `owner`'s log, opened at map epoch `epoch`.
pub(crate) struct ReplicaExport {
    /// The host's cluster handle (weak: a connection does not keep it up).
    pub cluster: Weak<Cluster>,
    /// The logs.
    pub logs: Arc<ReplicaLogs>,
    /// The log's owner.
    pub owner: String,
    /// The epoch the connection was opened at.
    pub epoch: u64,
    /// Opened while the owner was gone: a survivor's, for reading.
    pub read_only: bool,
}

impl ReplicaExport {
    /// The log file, if a request may be served now; the refusal is logged.
    fn admitted(&self, write: bool) -> Result<Arc<File>, ClientError> {
        let Some(c) = self.cluster.upgrade() else { return Err(ClientError::Shutdown) };
        if let Err(e) = c.check_replica(&self.owner, self.epoch, write && !self.read_only) {
            tracing::warn!(owner = %self.owner, error = %e, "replica log: request refused");
            return Err(ClientError::Io);
        }
        if write && self.read_only {
            tracing::warn!(owner = %self.owner, "replica log: a write on a survivor's read-only connection refused");
            return Err(ClientError::Io);
        }
        self.logs.file(&self.owner, write).map_err(|e| {
            tracing::warn!(owner = %self.owner, %e, "replica log: file");
            ClientError::Io
        })
    }

    fn run(&self, offset: u64, cmd: Cmd) -> Result<Vec<cachevisor_datapath::Bytes>, ClientError> {
        let io = |e: io::Error| {
            tracing::warn!(owner = %self.owner, %e, "replica log: I/O");
            ClientError::Io
        };
        match cmd {
            Cmd::Read(len) => {
                let f = self.admitted(false)?;
                let mut buf = vec![0u8; len as usize];
                f.read_exact_at(&mut buf, offset).map_err(io)?;
                self.admitted(false)?; // a lease that ran out meanwhile serves nothing
                Ok(vec![(buf.into(), offset)])
            }
            Cmd::Write(data) => {
                let f = self.admitted(true)?;
                self.logs.write(&self.owner, &f, &data, offset).map(|()| Vec::new()).map_err(io)
            }
            Cmd::Flush => self.admitted(true)?.sync_data().map(|()| Vec::new()).map_err(io),
            Cmd::Discard(_) => Ok(Vec::new()),
        }
    }
}

impl super::lent::PeerFileExport for ReplicaExport {
    fn alive(&self) -> bool {
        self.cluster.upgrade().is_some()
    }
    fn run(&self, offset: u64, cmd: Cmd) -> Result<Vec<cachevisor_datapath::Bytes>, ClientError> {
        ReplicaExport::run(self, offset, cmd)
    }
}
