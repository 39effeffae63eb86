//! The cache a node lends its peers (ELICA §3.1), as NBD exports over TLS: one region per
//! borrowing node, `METADATA/lent/<borrower>.img` (`cluster.lend` bytes, sparse, emptied
//! at every start: nothing a borrower cached survives the lender's restart, and the
//! export's name carries the lender's incarnation so a borrower can tell), exported as
//! `lent-<borrower>@<epoch>@<incarnation>` to the borrower's certificate only
//! (`allow = ["CN=<borrower>"]`, the listener's mutual TLS).
//!
//! Fencing on every request, not only at connection time: a region serves only while
//! this node holds its lease, the borrower is a live member in this node's view, and the
//! map is still at the epoch the connection was opened at (its name) — a lender that
//! lost its lease, or a borrower that decided on an older map, gets EIO and no byte.
//! (NBD has no per-request header for the epoch; a connection is opened at one, and a
//! new epoch means a new connection, as Ceph's clients reopen sessions on a new OSD map.)

use super::Cluster;
use cachevisor_datapath::{Cmd, Done};
use cachevisor_nbd::backend::ClientError;
use cachevisor_nbd::backend::ExportBackend;
use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

/// Export ids of lent regions carry this bit (vSSDs carry bit 31).
pub(crate) const LENT_EXPORT: u32 = 1 << 30;

/// The regions this node lends.
pub struct LentRegions {
    dir: PathBuf,
    /// Each region's size, bytes.
    pub size: u64,
    /// This process's incarnation.
    pub incarnation: u64,
    /// Borrowers by index (the export id's low bits), and their open regions.
    regions: Mutex<Regions>,
}

/// Peers by index (an export id's low bits), and their open files (lent regions here,
/// replica logs in `replica_host.rs`).
pub(crate) type Regions = (Vec<String>, BTreeMap<String, Arc<File>>);

impl LentRegions {
    /// Regions of `size` bytes under `dir` (created; regions from an earlier run are
    /// removed: a borrower's blocks do not outlive this process).
    pub fn new(dir: PathBuf, size: u64) -> io::Result<LentRegions> {
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        Ok(LentRegions { dir, size, incarnation: rand::random::<u64>() >> 1, regions: Default::default() })
    }

    /// The export name of `borrower`'s region at `epoch`.
    pub fn export_name(&self, borrower: &str, epoch: u64) -> String {
        format!("lent-{borrower}@{epoch}@{}", self.incarnation)
    }

    /// The export id of `borrower`'s region (assigned on first use).
    pub fn id(&self, borrower: &str) -> u32 {
        let mut r = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        match r.0.iter().position(|b| b == borrower) {
            Some(i) => LENT_EXPORT | i as u32,
            None => {
                r.0.push(borrower.to_string());
                LENT_EXPORT | (r.0.len() - 1) as u32
            }
        }
    }

    /// The borrower of export id `id`.
    pub fn borrower(&self, id: u32) -> Option<String> {
        let r = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        r.0.get((id & !LENT_EXPORT) as usize).cloned()
    }

    /// `borrower`'s region file, created empty at first use.
    fn file(&self, borrower: &str) -> io::Result<Arc<File>> {
        let mut r = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = r.1.get(borrower) {
            return Ok(f.clone());
        }
        let path = self.dir.join(format!("{borrower}.img"));
        // Private: another node's cached data (0600).
        let f = cachevisor_files::private_files::own_options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        f.set_len(self.size)?;
        let f = Arc::new(f);
        r.1.insert(borrower.to_string(), f.clone());
        Ok(f)
    }
}

/// One connection to a borrower's region, opened at map epoch `epoch`.
pub(crate) struct LentExport {
    /// The lender's cluster handle (weak: a connection does not keep it up).
    pub cluster: Weak<Cluster>,
    /// The regions.
    pub regions: Arc<LentRegions>,
    /// The borrower.
    pub borrower: String,
    /// The epoch the connection was opened at.
    pub epoch: u64,
}

impl LentExport {
    /// Whether a request may be served now (see the module doc); the refusal is logged.
    fn admitted(&self) -> Result<Arc<File>, ClientError> {
        let Some(c) = self.cluster.upgrade() else { return Err(ClientError::Shutdown) };
        if let Err(e) = c.check_peer(&self.borrower, self.epoch) {
            tracing::warn!(borrower = %self.borrower, error = %e, "lent cache: request refused");
            return Err(ClientError::Io);
        }
        self.regions.file(&self.borrower).map_err(|e| {
            tracing::warn!(borrower = %self.borrower, %e, "lent cache: region file");
            ClientError::Io
        })
    }

    fn run(&self, offset: u64, cmd: Cmd) -> Result<Vec<cachevisor_datapath::Bytes>, ClientError> {
        let f = self.admitted()?;
        let io = |e: io::Error| {
            tracing::warn!(borrower = %self.borrower, %e, "lent cache: region I/O");
            ClientError::Io
        };
        match cmd {
            Cmd::Read(len) => {
                let mut buf = vec![0u8; len as usize];
                f.read_exact_at(&mut buf, offset).map_err(io)?;
                // Checked again after the read: a lease that ran out meanwhile serves nothing.
                self.admitted()?;
                Ok(vec![(buf.into(), offset)])
            }
            Cmd::Write(data) => f.write_all_at(&data, offset).map(|()| Vec::new()).map_err(io),
            Cmd::Flush => f.sync_data().map(|()| Vec::new()).map_err(io),
            Cmd::Discard(_) => Ok(Vec::new()),
        }
    }
}

/// A peer's file exported over NBD — a lent region here, a replica log in
/// `replica_host.rs` —: its requests run at once on the connection's thread, each
/// admitted by the export's own rule in `run`.
pub(crate) trait PeerFileExport: Send + Sync {
    /// Whether the node still runs (the export is served).
    fn alive(&self) -> bool;
    /// Runs one request.
    fn run(&self, offset: u64, cmd: Cmd) -> Result<Vec<cachevisor_datapath::Bytes>, ClientError>;
}

impl PeerFileExport for LentExport {
    fn alive(&self) -> bool {
        self.cluster.upgrade().is_some()
    }
    fn run(&self, offset: u64, cmd: Cmd) -> Result<Vec<cachevisor_datapath::Bytes>, ClientError> {
        LentExport::run(self, offset, cmd)
    }
}

/// A [`PeerFileExport`] as the protocol's backend.
pub(crate) struct PeerFile<T>(pub T);

impl<T: PeerFileExport + 'static> ExportBackend for PeerFile<T> {
    fn direct(&self) -> bool {
        false
    }
    fn serves(&self) -> bool {
        self.0.alive()
    }
    fn submit(&self, offset: u64, cmd: Cmd, _here: bool, done: Done) {
        done(self.0.run(offset, cmd));
    }
    fn hint_cache(&self, _offset: u64, _len: u64) {}
    fn allocation(&self, _offset: u64, len: u32, _one: bool) -> io::Result<Vec<(u32, u32)>> {
        Ok(vec![(len, 0)])
    }
    fn write_now(&self, offset: u64, data: &[u8]) -> Result<(), ClientError> {
        self.0.run(offset, Cmd::Write(data.to_vec())).map(|_| ())
    }
    fn flush_now(&self) -> Result<(), ClientError> {
        self.0.run(0, Cmd::Flush).map(|_| ())
    }
}
