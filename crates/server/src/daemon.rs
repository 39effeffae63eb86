//! The daemon: the exports, the data path that serves them (`cachevisor_datapath`: the
//! engine on its asynchronous face), the policy that divides the cache (`policy.rs`), and
//! the operator's changes (vDisks added and removed, resizes, write policies, allocators,
//! destage jobs: `vdisks.rs`), saved to the metadata directory's overlay so they survive
//! restarts. A start that could harm stored data is refused (`start.rs`); a cluster
//! node's part is `cluster_node.rs`.

use crate::config::{Config, Resolved};
use cachevisor_datapath::DataPath;
use cachevisor_engine::{Engine, EngineConfig, Failure, PartitionMode};
use cachevisor_policy::controller::{self, Controller};
use cachevisor_policy::registry;
use cachevisor_trace::VmId;
use std::sync::{Arc, Mutex, RwLock};

mod cache_devices;
mod cache_resize;
mod cache_swap;
mod cluster_node;
mod device_add;
mod device_relayout;
mod device_remove;
pub(crate) mod metrics;
mod policy;
mod prewarming;
pub mod reload;
mod start;
pub(crate) mod status;
mod vdisks;
pub use crate::daemon::status::VdiskStatus;
pub use crate::export::Export;
pub use cache_swap::{CacheDeviceReport, CacheReport};
pub use cachevisor_datapath::ExportStats;
pub use start::StartOptions;
pub use vdisks::ChangeError;

impl cachevisor_nbd::handshake::Exports for Daemon {
    fn exports(&self) -> Vec<cachevisor_nbd::backend::ExportInfo> {
        self.nbd_exports().iter().map(Export::offered).collect()
    }
    fn block_size(&self) -> u64 {
        Daemon::block_size(self)
    }
}

/// What a warm start found in the metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Blocks back in the cache.
    pub blocks: u64,
    /// Of which dirty.
    pub dirty_blocks: u64,
    /// Of the dirty ones, blocks sealed before the stop: their sectors' checksums came
    /// back with them, and every read of them is checked (`block_sums.rs`).
    pub sealed_blocks: u64,
    /// Journal records replayed after the checkpoint.
    pub journal_records: usize,
    /// The journal ended in a torn record (the previous run died while appending).
    pub torn_tail: bool,
    /// Why a start with blocks recorded came up cold: the cache store was not the one its
    /// metadata describes (`cache_label.rs`).
    pub cold_start: Option<String>,
}

/// A failed operation of the running daemon.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// A device operation failed (the log names the device and the error).
    #[error("{}", describe(*.0))]
    Device(Failure),
    /// The change could not be saved for the next start, so it was not made.
    #[error("not changed: saving it for the next start failed: {0}")]
    Unsaved(String),
    /// The request is not valid (the message names what).
    #[error("{0}")]
    Invalid(String),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// What a device failure means, for an operator.
fn describe(f: Failure) -> &'static str {
    match f {
        Failure::NoSpace => "No space left on device: a backing store or the cache's file system is full (the log names it); nothing acknowledged was dropped",
        Failure::Io => "I/O error on a device (the log names it); what did not complete stays as it was",
        Failure::Shutdown => "the vDisk or the daemon is no longer served",
        Failure::OutOfRange => "the range reaches past the vDisk's end",
        Failure::Corrupt => "the cache store returned bytes that fail their checksum (the log names the block; counted in cachevisor_checksum_mismatches_total); they are never written back",
    }
}

impl From<Failure> for OpError {
    fn from(f: Failure) -> Self {
        OpError::Device(f)
    }
}

/// A failed start: which file or setting.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Bad configuration.
    #[error("config: {0}")]
    Config(String),
    /// Starting would harm stored data (the cache is in use, dirty blocks are bound to
    /// another backing store): the message says what to do.
    #[error("{0}")]
    Refused(String),
    /// A file could not be opened or created (the reason is in the message, not chained
    /// again as a source: `{:#}` would print it twice).
    #[error("{path}: {error}")]
    File {
        /// The file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
}

/// The daemon: exports, the data path and the policy.
pub struct Daemon {
    metrics: crate::daemon::metrics::Metrics,
    /// By VM id; `None` once removed (ids are not reused while the daemon runs).
    exports: RwLock<Vec<Option<Export>>>,
    /// vDisks added and removed through the API (serializes those calls).
    overlay: Mutex<crate::vdisk_overlay::Overlay>,
    block_size: u64,
    resolved: Resolved,
    dp: Arc<DataPath>,
    /// Taken inside the data path's lock (its hooks run there), never around it.
    policy: Arc<Mutex<policy::Policy>>,
    /// Each vDisk's backing store by VM id (`None` once removed).
    identities: Mutex<Vec<Option<cachevisor_store::backing_identity::Identity>>>,
    recovery: Recovery,
    meta_dir: std::path::PathBuf,
    job: Arc<crate::destage_job::Job>,
    /// The prewarm job (`prewarming.rs`).
    prewarm: Arc<crate::prewarm_job::Job>,
    /// Where snapshots go (`prewarming.rs`).
    snapshots: Mutex<prewarming::Snapshots>,
    /// The exclusive lock on the cache store and metadata (released by `stop_serving`).
    owner: Mutex<Option<cachevisor_store::owner_lock::OwnerLock>>,
    /// What the daemon's limits refused (`/metrics`).
    pub guards: Arc<crate::guards::Guards>,
    /// NBD over TLS (`listen.tls` on or require).
    tls: Option<Arc<cachevisor_nbd::tls::ServerTls>>,
    /// The vSSD region (`[vssd]`).
    vssd: Option<Arc<crate::vssd::service::VssdService>>,
    /// The vSSDs' NBD exports (ids with `VSSD_EXPORT` set).
    vssd_exports: Vec<Export>,
    /// This node's cluster membership (`[cluster]`), set once the service started it.
    cluster: std::sync::OnceLock<Arc<crate::cluster::Cluster>>,
    /// The lease the start claimed this node's vDisks under, until the agent adopts it.
    start_lease: Mutex<Option<crate::cluster::claims::StartLease>>,
    /// The peers it borrows cache from (`[cluster] peers`), their devices' shared state.
    peer_links: Option<Arc<crate::cluster::peer_device::PeerLinks>>,
    /// vDisks configured with `replicate = false`.
    no_replica: Mutex<std::collections::BTreeSet<String>>,
    /// This node's replica log on a peer (`[cluster] replica`), once joined.
    replicator: std::sync::OnceLock<Arc<crate::cluster::replicator::Replicator>>,
    /// vDisks of the config that moved to another node while this one was down: not
    /// served, their blocks dropped at start (`cluster/start_check.rs`).
    moved_away: Vec<crate::cluster::start_check::MovedAway>,
    /// Cache migrations between this node and its lenders (`[cluster] migration`), once
    /// joined, on a node that borrows.
    migrations: std::sync::OnceLock<Arc<crate::cluster::migrations::NodeMigrations>>,
    /// Where the configuration came from (`reload.rs`).
    source: Option<reload::ConfigSource>,
    /// The configuration as last read (before the overlay), what a reload compares with;
    /// held while a reload runs (one at a time).
    file_config: Mutex<Config>,
    /// The cache's devices by store (`cache.path`, then each `[[cache.device]]` in use
    /// at start: one removed online stays listed, `device_remove.rs`).
    cache_devices: Mutex<Vec<std::path::PathBuf>>,
    /// The daemon's own files, which no vDisk added later may be backed by.
    own: crate::own_files::OwnFiles,
    /// What a detached cache's metadata directory held (`cache_swap.rs`); held while a
    /// detach or attach runs (one at a time).
    carried: Mutex<cache_swap::Carried>,
    /// The last detach's figures and the last attach's prewarm.
    swap: Mutex<cache_swap::SwapNotes>,
}

impl Daemon {
    /// Latency histograms (and the metrics exposition).
    pub fn metrics(&self) -> &crate::daemon::metrics::Metrics {
        &self.metrics
    }

    /// Whether NBD clients must use TLS (`listen.tls = "require"`).
    pub fn tls_required(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.mode == cachevisor_nbd::tls::TlsMode::Require)
    }

    /// The NBD listeners' TLS, when on.
    pub fn tls(&self) -> Option<&Arc<cachevisor_nbd::tls::ServerTls>> {
        self.tls.as_ref()
    }

    /// Re-reads the TLS certificate, key and CA files (SIGHUP, `POST /tls/reload`): new
    /// connections use them, established ones keep theirs; a bad file keeps the old ones.
    pub fn reload_tls(&self) -> Result<(), String> {
        match &self.tls {
            Some(t) => t.reload(),
            None => Err("TLS is off (listen.tls): nothing to reload".into()),
        }
    }

    /// The data path serving the exports.
    pub fn datapath(&self) -> &Arc<DataPath> {
        &self.dp
    }

    /// What export `vm` is served from.
    pub fn export_backend(&self, vm: VmId) -> Arc<dyn cachevisor_nbd::backend::ExportBackend> {
        use crate::vssd::startup::VSSD_EXPORT;
        if vm & VSSD_EXPORT == 0 && vm & crate::cluster::lent::LENT_EXPORT != 0 {
            if let Some((c, l)) = self.cluster().and_then(|c| c.lent.clone().map(|l| (c, l))) {
                return Arc::new(crate::cluster::lent::PeerFile(crate::cluster::lent::LentExport {
                    cluster: Arc::downgrade(c),
                    borrower: l.borrower(vm).unwrap_or_default(),
                    regions: l,
                    epoch: c.epoch(),
                }));
            }
        }
        if vm & VSSD_EXPORT == 0 && vm & crate::cluster::replica_host::REPLICA_EXPORT != 0 {
            if let Some((c, r)) = self.cluster().and_then(|c| c.replicas.clone().map(|r| (c, r))) {
                let owner = r.owner(vm).unwrap_or_default();
                return Arc::new(crate::cluster::lent::PeerFile(crate::cluster::replica_host::ReplicaExport {
                    cluster: Arc::downgrade(c),
                    read_only: !c.is_member(&owner),
                    owner,
                    logs: r,
                    epoch: c.epoch(),
                }));
            }
        }
        match &self.vssd {
            Some(svc) if vm & VSSD_EXPORT != 0 => {
                Arc::new(crate::vssd::export::VssdExport { svc: svc.clone(), id: vm & !VSSD_EXPORT })
            }
            _ => Arc::new(cachevisor_datapath::vdisk_export::VdiskExport {
                dp: self.dp.clone(),
                vm,
                // An EIO is tried again where a failed store's clean blocks are dropped
                // and read from the backing store: a lost peer's region, one of several
                // cache devices (the engine's `device_failure.rs`).
                retry_io: self.peer_links.is_some() || self.several_cache_devices(),
            }),
        }
    }

    /// The vSSD region, when `[vssd]` is configured.
    pub fn vssd(&self) -> Option<&Arc<crate::vssd::service::VssdService>> {
        self.vssd.as_ref()
    }

    /// Every NBD export: the vDisks, then the vSSDs.
    pub fn nbd_exports(&self) -> Vec<Export> {
        let mut e = self.exports();
        if !self.is_stopped() {
            e.extend(self.vssd_exports.iter().cloned());
            e.extend(self.lent_exports());
            e.extend(self.replica_exports());
        }
        e
    }

    /// The metadata directory.
    pub fn metadata_dir(&self) -> &std::path::Path {
        &self.meta_dir
    }

    /// Whether the cache store is O_DIRECT.
    pub fn direct_io(&self) -> bool {
        self.dp.direct()
    }

    /// What the warm start recovered.
    pub fn recovery(&self) -> Recovery {
        self.recovery.clone()
    }

    /// The vDisks being served, by VM id.
    pub fn exports(&self) -> Vec<Export> {
        self.exports.read().unwrap_or_else(|e| e.into_inner()).iter().flatten().cloned().collect()
    }

    /// Export `vm` (a vDisk unless it was removed, or a vSSD).
    pub fn export(&self, vm: VmId) -> Option<Export> {
        if vm & crate::vssd::startup::VSSD_EXPORT != 0 {
            return self.vssd_exports.iter().find(|e| e.id == vm).cloned();
        }
        if vm & crate::cluster::lent::LENT_EXPORT != 0 {
            return self.lent_exports().into_iter().find(|e| e.id == vm);
        }
        if vm & crate::cluster::replica_host::REPLICA_EXPORT != 0 {
            return self.replica_exports().into_iter().find(|e| e.id == vm);
        }
        self.exports.read().unwrap_or_else(|e| e.into_inner()).get(vm as usize).cloned().flatten()
    }

    /// Whether vDisk `vm` is still served.
    pub fn is_live(&self, vm: VmId) -> bool {
        self.export(vm).is_some()
    }

    /// The numbers the configuration resolved to (with the API's vDisk changes laid over).
    pub fn resolved(&self) -> Resolved {
        self.resolved.clone()
    }

    /// Cache block size.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Counters of export `vm`.
    pub fn stats(&self, vm: VmId) -> ExportStats {
        self.dp.stats(vm)
    }

    /// The VM id of the served vDisk `name`.
    pub fn vdisk(&self, name: &str) -> Option<VmId> {
        self.exports().into_iter().find(|e| e.name == name).map(|e| e.id)
    }

    /// Slots on the cache's devices after the first (`[[cache.device]]`, fixed while it
    /// runs).
    fn more_device_slots(&self) -> u64 {
        let removed: Vec<u16> = self
            .dp
            .device_removals()
            .into_iter()
            .filter(|(_, r)| r.state == cachevisor_datapath::RemovalState::Removed)
            .map(|(st, _)| st)
            .collect();
        self.dp.with_engine(|e| {
            let l = e.layout();
            (1..l.len() as u16)
                .filter(|&st| l.kind(st).is_local() && !removed.contains(&st))
                .map(|st| l.range(st).1)
                .sum()
        })
    }

    /// The cache's devices by store, as they are now.
    pub(crate) fn cache_device_paths(&self) -> Vec<std::path::PathBuf> {
        self.cache_devices.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The cache's blocks now, over every device.
    pub(crate) fn cache_blocks(&self) -> u64 {
        u64::from(self.dp.cache_slots()) + self.more_device_slots()
    }

    /// The most blocks the cache may hold while running, over every device.
    pub(crate) fn max_cache_blocks(&self) -> u64 {
        u64::from(self.dp.max_cache_slots()) + self.more_device_slots()
    }

    /// The metrics exposition (`/metrics`): latency histograms and the state now.
    pub fn render_metrics(&self) -> String {
        let state = crate::daemon::status::State {
            // Read directly: a scrape takes no engine walk or file stat for them.
            cache: [
                u64::from(self.dp.cache_state() == cachevisor_datapath::CacheState::Attached),
                self.cache_blocks() * self.block_size,
                self.max_cache_blocks() * self.block_size,
            ],
            ring: self.dp.ring_counts(),
            congestion: self.dp.with_engine(|e| e.congestion()),
            write_budget: self.dp.with_engine(|e| e.write_budget()),
            mirror: self.mirror_report(),
            ram: self.ram_report(),
            devices: self.device_reports(),
            vdisks: self.status(),
            destaged_blocks: self.destaged_blocks(),
            flush_rate_bytes: self.dp.flush_rate_bytes(),
            destage_job: self.job.progress(),
            prewarm: self.prewarm.progress(),
            guards: self.guards.read(self.dp.counts()),
            cache_hints: {
                let h = self.dp.hint_counts();
                [&h.queued, &h.loaded, &h.skipped, &h.dropped].map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
            },
            vssd_region: self.vssd.as_ref().map(|v| crate::daemon::status::VssdRegionStatus {
                blocks: u64::from(v.budget_view().0),
                cap_blocks: u64::from(v.region_blocks()),
                withheld_slots: self.dp.with_engine_mut(|e| e.withheld_slots()),
            }),
            cluster: self.cluster().map(|c| {
                let s = c.status();
                crate::daemon::status::ClusterGauges {
                    serving: u64::from(s.serving),
                    leading: u64::from(s.leading),
                    epoch: s.epoch,
                    members: s.members.len() as u64,
                    etcd_errors: s.etcd_errors,
                    claim_conflicts: s.claim_conflicts.len() as u64,
                    bad_records: s.bad_records,
                }
            }),
        };
        self.metrics.render(state)
    }

    /// Every vDisk's state and counters.
    pub fn status(&self) -> Vec<VdiskStatus> {
        let exports = self.exports();
        let parts: Vec<_> = self.dp.with_engine(|e| {
            exports
                .iter()
                .map(|x| (e.partition(x.id), (e.written_back_ahead_of(x.id), e.ram_of(x.id)), e.entry_state(x.id)))
                .collect()
        });
        let shares: Vec<_> = {
            let mut p = self.policy.lock().unwrap_or_else(|p| p.into_inner());
            exports.iter().map(|x| *p.ctl.settings_mut(x.id as usize)).collect()
        };
        // A detached cache passes every vDisk through (`cache_swap.rs`).
        let cache_out = self.dp.cache_state() != cachevisor_datapath::CacheState::Attached;
        exports
            .into_iter()
            .zip(parts)
            .zip(shares)
            .map(|((e, (p, (ahead, (ram_blocks, ram_hit_blocks)), entry)), share)| VdiskStatus {
                entry,
                weight: share.weight,
                ratio: share.ratio,
                stats: ExportStats { passthrough: self.dp.stats(e.id).passthrough || cache_out, ..self.dp.stats(e.id) },
                name: e.name,
                size: e.size,
                write_policy: p.write_policy,
                used_blocks: p.used,
                target_blocks: p.target,
                dirty_blocks: p.dirty_blocks,
                written_back_ahead: ahead,
                ram_blocks,
                ram_hit_blocks,
                block_size: self.block_size,
            })
            .collect()
    }

    /// Blocks export `vm` holds in the cache and its dirty blocks.
    pub fn occupancy(&self, vm: VmId) -> (u64, u64) {
        let p = self.dp.with_engine(|e| e.partition(vm));
        (p.used, p.dirty_blocks)
    }

    /// One allocation interval now (the engine's timer runs them every `interval`), and
    /// the work it started finished (at most 30 s).
    pub fn tick(&self) {
        self.dp.interval_now();
        self.dp.wait_idle(std::time::Duration::from_secs(30));
    }

    /// The allocation policy's name.
    pub fn allocator_name(&self) -> &'static str {
        self.policy.lock().unwrap_or_else(|e| e.into_inner()).ctl.allocator().name()
    }

    /// Records every request from now on to `path` in `format`.
    pub fn record_to(&self, path: &std::path::Path, format: cachevisor_trace::Format) -> std::io::Result<()> {
        let f = std::io::BufWriter::new(cachevisor_files::private_files::create(path)?);
        let w = cachevisor_trace::TraceWriter::new(format, Box::new(f), self.block_size)?;
        if let Some(old) = self.dp.set_recorder(Some(w)) {
            old.finish()?;
        }
        Ok(())
    }

    /// Stops all device I/O at once, as if the process had died here (what dropping a
    /// `process::service::Running` does): every request in flight or later fails, the
    /// exports are withdrawn, and once no device call or commit is under way the owner
    /// lock is released, so another daemon may take over the cache. Nothing is written:
    /// the next start recovers from the metadata like after a SIGKILL.
    pub fn stop_serving(&self) {
        self.dp.halt();
        if let Some(r) = self.replicator.get() {
            r.stop(); // writes waiting for the log fail; its worker thread ends
        }
        if let Some(v) = &self.vssd {
            v.halt();
        }
        self.exports.write().unwrap_or_else(|e| e.into_inner()).iter_mut().for_each(|e| *e = None);
        self.owner.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Whether [`Self::stop_serving`] ran (the background threads then end).
    pub fn is_stopped(&self) -> bool {
        self.dp.halted()
    }

    /// A clean stop: every acknowledged write durable, the trace recording finished, and
    /// a checkpoint written, so the next start is warm without replaying a journal.
    pub fn shutdown(&self) -> Result<(), OpError> {
        let dirty: Vec<String> = self
            .status()
            .into_iter()
            .filter(|s| s.stats.passthrough && s.dirty_blocks > 0)
            .map(|s| format!("{} ({} dirty blocks)", s.name, s.dirty_blocks))
            .collect();
        if !dirty.is_empty() {
            tracing::warn!(vdisks = %dirty.join(", "), "stopping with vDisks in pass-through that still hold dirty blocks: they stay in the cache and are written back after the next start");
        }
        if let Some(w) = self.dp.set_recorder(None) {
            w.finish().map_err(|e| OpError::Other(format!("trace recording: {e}")))?;
        }
        if self.dp.cache_state() != cachevisor_datapath::CacheState::Attached {
            // Detached: the metadata names no block (written at the detach), and the
            // backing stores hold every write; nothing to snapshot.
            return Ok(());
        }
        self.dp.flush(0)?;
        self.dp.checkpoint_now().map_err(OpError::Other)?;
        // The cache's state for a later prewarm elsewhere; the stop itself is done.
        if let Err(e) = self.take_snapshot() {
            tracing::warn!(error = %e, "no cache snapshot at shutdown");
        }
        Ok(())
    }

    /// Starts the periodic snapshots (`prewarm.snapshot_every`, read again at every tick:
    /// a reload may change it) on a thread that ends with the daemon.
    pub fn start_snapshots(self: &Arc<Self>) {
        let d = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("snapshots".into())
            .spawn(move || prewarming::snapshot_loop(d))
            .expect("spawning the snapshot thread");
    }

    /// The snapshot schedule now (at shutdown only when `snapshot_every` is 0 or bad).
    pub(crate) fn snapshot_schedule(&self) -> crate::config::SnapshotSchedule {
        let every = self.snapshots.lock().unwrap_or_else(|e| e.into_inner()).config.resolve(self.block_size);
        every.map_or(crate::config::SnapshotSchedule::AtShutdown, |(s, _)| s)
    }
}

/// The engine configuration of `r`'s cache (checked when `r` was resolved).
fn engine_config(r: &Resolved) -> EngineConfig {
    let cfg = r.cache.engine_config(r.max_slots).expect("checked by Config::resolve");
    if r.device_slots.len() > 1 {
        cfg.over_devices(&r.device_slots) // the cache's devices, one store each
    } else {
        cfg
    }
}

/// The controller of `cfg`'s allocator for `r`'s cache, with `engine`'s vDisks enrolled
/// and the first division applied (an empty cache: no device work).
fn first_controller(cfg: &Config, r: &Resolved, engine: &mut Engine) -> Result<Controller, String> {
    let alloc = registry::build_with(&r.cache.allocator, &r.cache.params)?;
    // Laid out for `cache.max_size`: the slots past `cache.size` are withheld, and the
    // controller's capacity is the engine's less what is withheld.
    let mut ctl = Controller::new(alloc, r.engine_slots(), r.cache.block_size, true);
    for (i, v) in cfg.vdisk.iter().enumerate() {
        policy::enroll(engine, &mut ctl, i as VmId, v, r.cache.block_size)?;
    }
    let first = ctl.decide(engine, None, &[], None);
    controller::apply(engine, &first);
    // S-CAVE's global cleaner runs in the engine as requests are admitted (§V-B), as in
    // the simulator.
    engine.set_cleaner(controller::cleaner_watermarks(
        ctl.allocator(),
        r.engine_slots(),
        cfg.cache.partition == PartitionMode::Static,
    ));
    Ok(ctl)
}
