//! Replacing the cache SSD under a running daemon (day-2 operations:
//! `cachevisor cache detach` / `attach`, `POST /cache/detach` / `attach`). The data path
//! empties the cache and lets go of its file (the data path's `cache_swap.rs`); here the daemon
//! refuses what it cannot do (the vSSD region and a cluster node's lent regions live in
//! the cache file), takes a snapshot of the cache's state first, lets go of the owner
//! lock on the file and — when the metadata directory is on the same file system as the
//! cache (the default `PATH.meta`: it leaves with the SSD) — of the metadata directory
//! too, keeping in memory what must survive the swap (the API's vDisk overlay, the API
//! token file, the newest snapshot). An attach opens the configured `cache.path` anew (a
//! new, empty file or device mounted where the old one was), takes the locks again,
//! writes those files back into a new metadata directory, and prewarms from the snapshot.
//!
//! While the cache is out, every vDisk passes through (each write lands on its backing
//! store before it is answered) and what would need the cache or its metadata waits for
//! the attach: vDisks are neither added nor removed, write policies not changed,
//! snapshots not taken.

use super::{Daemon, OpError};
use cachevisor_datapath::{CacheState, DetachReport};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What the metadata directory held that a new one gets back (it left with the SSD).
#[derive(Debug, Default)]
pub(crate) struct Carried {
    /// Whether the metadata directory left with the cache (closed at the detach).
    with_metadata: bool,
    /// The API token file's bytes.
    api_token: Option<Vec<u8>>,
    /// The newest snapshot: its file name and bytes, when the snapshot directory left too.
    snapshot: Option<(String, Vec<u8>)>,
}

/// The cache's state for `GET /cache` and `cachevisor cache status`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CacheReport {
    /// attached, detaching, detached, attaching.
    pub state: CacheState,
    /// `cache.path`.
    pub path: String,
    /// The metadata directory.
    pub metadata: String,
    /// Whether the metadata directory is on the cache's file system (it leaves with it).
    pub metadata_with_cache: bool,
    /// The cache's size in bytes (`cache.size`, as a reload last resized it).
    pub size_bytes: u64,
    /// The most it can grow to while running (`cache.max_size`).
    pub max_size_bytes: u64,
    /// Blocks cached.
    pub cached_blocks: u64,
    /// Dirty blocks.
    pub dirty_blocks: u64,
    /// The last detach's figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detached: Option<DetachReport>,
    /// What the last attach prewarmed from (or why it did not).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prewarm: Option<String>,
    /// Why the last detach or attach failed (the cache then stayed as it was).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Congestion bypass (`[cache] congested_*_threshold`), when set: the device's
    /// smoothed latencies and whether misses go around it now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub congestion: Option<cachevisor_engine::CongestionState>,
    /// The cache's shared write budget (`[cache] write_budget`), when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_budget: Option<cachevisor_engine::SharedBudgetState>,
    /// Each device of a cache over several (`cache.path`, then each `[[cache.device]]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<CacheDeviceReport>,
    /// Mirrored dirty data (`cache.mirror_dirty`), when on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<MirrorReport>,
    /// The RAM tier (`cache.ram`), when there is one: its blocks, the copies it holds,
    /// reads it served, copies written, evicted and dropped (their block changed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ram: Option<cachevisor_engine::RamStats>,
}

/// Mirrored dirty data's figures (`engine/src/dirty_mirror.rs`).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct MirrorReport {
    /// Dirty blocks with their copy on another device now.
    pub mirrored_blocks: u64,
    /// Write-back writes that went through to the backing store for want of a mirror slot.
    pub fallbacks: u64,
    /// Dirty blocks served from their mirror after their device was dropped.
    pub promoted: u64,
    /// Mirror writes that failed.
    pub failed_writes: u64,
}

/// One device of a cache over several.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CacheDeviceReport {
    /// Its path (absolute).
    pub path: String,
    /// Bytes of it the cache uses.
    pub size_bytes: u64,
    /// Blocks cached on it.
    pub cached_blocks: u64,
    /// Dropped after device errors past the threshold (its dirty blocks, kept, fail
    /// their reads).
    #[serde(default)]
    pub failed: bool,
    /// Being removed or removed online (`cachevisor cache remove`), with its figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removal: Option<cachevisor_datapath::DeviceRemoval>,
}

/// The last swap's outcome, for [`CacheReport`].
#[derive(Debug, Default)]
pub(crate) struct SwapNotes {
    detached: Option<DetachReport>,
    prewarm: Option<String>,
    error: Option<String>,
}

/// Whether `a` and `b` are on one file system (the metadata directory leaves with the
/// cache's SSD).
fn same_file_system(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev(),
        _ => true, // cannot tell: treat it as leaving (the safe side: closed and carried)
    }
}

impl Daemon {
    /// Whether the cache spans several devices (`[[cache.device]]`).
    pub(crate) fn several_cache_devices(&self) -> bool {
        self.dp.with_engine(|e| e.layout().len() > 1 && e.layout().kind(1).is_local())
    }

    /// `cache.path` as configured.
    fn cache_path(&self) -> PathBuf {
        self.file_config.lock().unwrap_or_else(|e| e.into_inner()).cache.path.clone()
    }

    /// The cache's state now.
    pub fn cache_report(&self) -> CacheReport {
        let path = self.cache_path();
        let (cached_blocks, dirty_blocks) = self.dp.with_engine(|e| {
            (0..e.vm_count() as u32)
                .fold((0, 0), |(c, d), v| (c + e.partition(v).used, d + e.partition(v).dirty_blocks))
        });
        let last = self.swap.lock().unwrap_or_else(|e| e.into_inner());
        CacheReport {
            state: self.dp.cache_state(),
            metadata_with_cache: same_file_system(&path, &self.meta_dir),
            path: path.display().to_string(),
            metadata: self.meta_dir.display().to_string(),
            size_bytes: self.cache_blocks() * self.block_size,
            max_size_bytes: self.max_cache_blocks() * self.block_size,
            cached_blocks,
            dirty_blocks,
            detached: last.detached,
            prewarm: last.prewarm.clone(),
            error: last.error.clone(),
            congestion: self.dp.with_engine(|e| e.congestion()),
            write_budget: self.dp.with_engine(|e| e.write_budget()),
            devices: self.device_reports(),
            mirror: self.mirror_report(),
            ram: self.ram_report(),
        }
    }

    /// The RAM tier's figures, when there is one.
    pub(crate) fn ram_report(&self) -> Option<cachevisor_engine::RamStats> {
        self.dp.with_engine(|e| Some(e.ram_stats()).filter(|r| r.slots > 0))
    }

    /// Mirrored dirty data's figures, when it is on.
    pub(crate) fn mirror_report(&self) -> Option<MirrorReport> {
        self.dp.with_engine(|e| {
            e.mirror_dirty().then(|| MirrorReport {
                mirrored_blocks: e.mirrored_blocks(),
                fallbacks: e.mirror_fallbacks(),
                promoted: e.mirrors_promoted(),
                failed_writes: e.mirror_write_failures(),
            })
        })
    }

    /// Each device's share of a cache over several (none for one device).
    pub(crate) fn device_reports(&self) -> Vec<CacheDeviceReport> {
        if !self.several_cache_devices() {
            return Vec::new();
        }
        let removals: std::collections::BTreeMap<u16, cachevisor_datapath::DeviceRemoval> =
            self.dp.device_removals().into_iter().collect();
        self.dp.with_engine(|e| {
            self.cache_device_paths()
                .iter()
                .enumerate()
                .map(|(st, p)| CacheDeviceReport {
                    path: std::path::absolute(p).unwrap_or_else(|_| p.clone()).display().to_string(),
                    size_bytes: e.layout().range(st as u16).1 * self.block_size,
                    cached_blocks: e.store_used(st as u16),
                    failed: e.device_failed(st as u16),
                    removal: removals.get(&(st as u16)).copied(),
                })
                .collect()
        })
    }

    /// Keeps `e` for [`Self::cache_report`]'s `error` (an operation the API runs in the
    /// background failed).
    pub(crate) fn note_cache_error(&self, e: String) {
        self.swap.lock().unwrap_or_else(|e| e.into_inner()).error = Some(e);
    }

    /// Refused while the cache is out (or going), naming what to do.
    pub(crate) fn cache_must_be_in(&self, what: &str) -> Result<(), String> {
        match self.dp.cache_state() {
            CacheState::Attached => Ok(()),
            s => Err(format!("the cache is {}: {what} waits for `cachevisor cache attach`", s.as_str())),
        }
    }

    /// Detaches the cache (see the module doc): `progress(cached, dirty)` while it
    /// empties. Every vDisk passes through from the first moment. A failure is also kept
    /// for [`Self::cache_report`] (a detach the API runs in the background).
    pub fn detach_cache(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<DetachReport, OpError> {
        let r = self.detach_cache_now(progress);
        let mut notes = self.swap.lock().unwrap_or_else(|e| e.into_inner());
        match &r {
            Ok(report) => *notes = SwapNotes { detached: Some(*report), ..SwapNotes::default() },
            Err(e) => notes.error = Some(format!("detach: {e}")),
        }
        r
    }

    fn detach_cache_now(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<DetachReport, OpError> {
        if self.several_cache_devices() {
            return Err(OpError::Invalid(
                "the cache spans several devices ([[cache.device]]): a detach takes one device out, not yet built; stop the daemon to replace one".into(),
            ));
        }
        if self.vssd.is_some() {
            return Err(OpError::Invalid(
                "the vSSD region ([vssd]) lives in the cache file: stop the daemon to replace the SSD".into(),
            ));
        }
        if self.file_config.lock().unwrap_or_else(|e| e.into_inner()).cluster.is_some() {
            return Err(OpError::Invalid(
                "a cluster node ([cluster]) lends parts of its cache file to other nodes: drain it (move its vDisks away) and stop it to replace the SSD".into(),
            ));
        }
        // The configuration before the swap's lock (a reload holds it while it takes
        // the swap's).
        let path = self.cache_path();
        let mut carried = self.carried.lock().unwrap_or_else(|e| e.into_inner());
        if self.dp.cache_state() != CacheState::Attached {
            return Err(OpError::Invalid(format!("the cache is {} already", self.dp.cache_state().as_str())));
        }
        let with_metadata = same_file_system(&path, &self.meta_dir);
        // The cache's state before it goes, for the attach's prewarm.
        let snapshot = match self.take_snapshot() {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(error = %e, "no cache snapshot before the detach: the attach starts cold");
                None
            }
        };
        let report = self.dp.detach_cache(with_metadata, progress).map_err(OpError::Other)?;
        let mut next = Carried { with_metadata, ..Carried::default() };
        if with_metadata {
            next.api_token = cachevisor_files::bounded_read::read(
                &self.meta_dir.join("api-token"),
                cachevisor_files::bounded_read::STATE_CAP,
            )
            .ok();
        }
        let snap_dir = self.snapshot_dir();
        if let Some(p) = snapshot.filter(|_| same_file_system(&path, &snap_dir)) {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            next.snapshot =
                name.zip(cachevisor_files::bounded_read::read(&p, cachevisor_files::bounded_read::STATE_CAP).ok());
        }
        let mut owner = self.owner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(o) = owner.as_mut() {
            o.release_cache();
            if with_metadata {
                o.release_meta();
            }
        }
        *carried = next;
        tracing::info!(
            path = %path.display(),
            written_back = report.written_back,
            dropped = report.dropped,
            metadata = %if with_metadata { "closed (it is on the cache's file system)" } else { "kept open" },
            "the cache SSD can be removed: every vDisk passes through to its backing store"
        );
        Ok(report)
    }

    /// Attaches a new cache file at `cache.path` (see the module doc) and, with `prewarm`,
    /// prewarms it from the newest snapshot (`from`, or the snapshot directory). Returns
    /// what the prewarm does (or why there is none).
    pub fn attach_cache(self: &Arc<Self>, prewarm: bool, from: Option<&Path>) -> Result<String, OpError> {
        let r = self.attach_cache_now(prewarm, from);
        let mut notes = self.swap.lock().unwrap_or_else(|e| e.into_inner());
        match &r {
            Ok(note) => {
                notes.prewarm = Some(note.clone());
                notes.error = None;
            }
            Err(e) => notes.error = Some(format!("attach: {e}")),
        }
        r
    }

    fn attach_cache_now(self: &Arc<Self>, prewarm: bool, from: Option<&Path>) -> Result<String, OpError> {
        let cfg = self.file_config.lock().unwrap_or_else(|e| e.into_inner()).cache.clone();
        let mut carried = self.carried.lock().unwrap_or_else(|e| e.into_inner());
        if self.dp.cache_state() != CacheState::Detached {
            return Err(OpError::Invalid(format!(
                "the cache is {}: only a detached cache can be attached",
                self.dp.cache_state().as_str()
            )));
        }
        let path = cfg.path.clone();
        let mut owner = self.owner.lock().unwrap_or_else(|e| e.into_inner());
        let o = owner.as_mut().ok_or_else(|| OpError::Other("the daemon is stopping".into()))?;
        o.lock_cache(&path, &self.meta_dir).map_err(OpError::Invalid)?;
        let bytes = cachevisor_store::cache_label::DATA_OFFSET + u64::from(self.dp.cache_slots()) * self.block_size;
        let opened = cachevisor_store::backing::open_cache_store(&path, bytes, cfg.direct)
            .map_err(|e| format!("cache.path {}: {e}", path.display()));
        let (file, direct) = match opened {
            Ok(f) => f,
            Err(e) => {
                o.release_cache();
                return Err(OpError::Invalid(e));
            }
        };
        if carried.with_metadata {
            if let Err(e) = o.lock_meta(&path, &self.meta_dir) {
                o.release_cache();
                return Err(OpError::Invalid(e));
            }
        }
        if let Err(e) = self.dp.attach_cache(file, direct, carried.with_metadata, cfg.io_uring) {
            o.release_cache();
            if carried.with_metadata {
                o.release_meta();
            }
            return Err(OpError::Other(e));
        }
        drop(owner);
        if carried.with_metadata {
            self.write_back_carried(&carried);
        }
        let carried_snapshot = carried.snapshot.take();
        *carried = Carried::default();
        drop(carried);
        let snap_dir = self.snapshot_dir();
        if let Some((name, bytes)) = carried_snapshot {
            let p = snap_dir.join(&name);
            if !p.exists() {
                let r = std::fs::create_dir_all(&snap_dir).and_then(|()| {
                    cachevisor_store::journal::replace_file(&p, &mut |w| std::io::Write::write_all(w, &bytes))
                });
                if let Err(e) = r {
                    tracing::warn!(error = %e, path = %p.display(), "cannot put the detach's snapshot back");
                }
            }
        }
        let note = if !prewarm {
            "no prewarm (asked for none)".to_string()
        } else {
            let dir = from.map(Path::to_path_buf).unwrap_or(snap_dir);
            match crate::snapshot_files::list(&dir) {
                Ok(l) if !l.is_empty() => match self.start_prewarm(&dir) {
                    Ok(_) => format!("prewarming from {}", dir.display()),
                    Err(p) => format!("no prewarm: {}", p.error.unwrap_or_else(|| "refused".into())),
                },
                Ok(_) => format!("no prewarm: {} holds no snapshot (the cache starts cold)", dir.display()),
                Err(e) => format!("no prewarm: {}: {e}", dir.display()),
            }
        };
        tracing::info!(path = %path.display(), prewarm = %note, "cache attached");
        Ok(note)
    }

    /// Writes what the old metadata directory held into the new one: the API's vDisk
    /// overlay and the API token file (the journal and checkpoint are the data path's).
    fn write_back_carried(&self, carried: &Carried) {
        let overlay = self.overlay.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = overlay.save(&self.meta_dir) {
            tracing::error!(error = %e, dir = %self.meta_dir.display(), "cannot save the vDisk overlay into the new metadata directory: API changes are lost at the next restart");
        }
        if let Some(token) = &carried.api_token {
            let p = self.meta_dir.join("api-token");
            if !p.exists() {
                let r = cachevisor_files::private_files::create(&p)
                    .and_then(|mut f| std::io::Write::write_all(&mut f, token));
                if let Err(e) = r {
                    tracing::warn!(error = %e, path = %p.display(), "cannot write the API token file back");
                }
            }
        }
    }
}
