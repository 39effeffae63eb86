//! The daemon: the exports, the data path that serves them (`datapath.rs`: the engine on
//! its asynchronous face, device threads, group commit), the policy that divides the
//! cache (`policy.rs`), and the operator's changes (vDisks added and removed, resizes,
//! write policies, allocators, destage jobs: `vdisks.rs`), saved to the metadata
//! directory's overlay so they survive restarts. A start that could harm stored data is
//! refused (`start.rs`).

use crate::config::{Config, Resolved};
use cachevisor_datapath::DataPath;
use cachevisor_engine::{Engine, EngineConfig, Failure, PartitionMode};
use cachevisor_policy::controller::{self, Controller};
use cachevisor_policy::registry;
use cachevisor_trace::VmId;
use std::sync::{Arc, Mutex, RwLock};

mod cache_resize;
mod cache_swap;
mod policy;
mod prewarming;
pub mod reload;
mod start;
mod vdisks;
pub use crate::api::status::VdiskStatus;
pub use cache_swap::CacheReport;
pub use cachevisor_datapath::ExportStats;
pub use start::StartOptions;
pub use vdisks::ChangeError;

/// One served vDisk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Export {
    /// Its VM id in the engine.
    pub id: VmId,
    /// Export name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Client certificates that may open it (`tls_authz.rs`; empty: any client the
    /// listener's TLS policy lets in).
    pub allow: Vec<String>,
    /// Who may open it over vhost-user-blk (`vhost_user/access.rs`; none by default).
    pub vhost_user: crate::vhost_user::access::Access,
}

impl Export {
    /// How the NBD handshake offers it.
    pub fn offered(&self) -> cachevisor_nbd::backend::ExportInfo {
        cachevisor_nbd::backend::ExportInfo {
            id: self.id,
            name: self.name.clone(),
            size: self.size,
            allow: self.allow.clone(),
        }
    }
}

impl crate::cluster::migrations::NodeOps for Daemon {
    fn stopped(&self) -> bool {
        self.is_stopped()
    }
    fn link_busy_ns(&self) -> u64 {
        Daemon::link_busy_ns(self)
    }
    fn datapath(&self) -> &Arc<DataPath> {
        Daemon::datapath(self)
    }
}

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
    metrics: crate::api::metrics::Metrics,
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
    /// The daemon's own files, which no vDisk added later may be backed by.
    own: crate::process::own_files::OwnFiles,
    /// What a detached cache's metadata directory held (`cache_swap.rs`); held while a
    /// detach or attach runs (one at a time).
    carried: Mutex<cache_swap::Carried>,
    /// The last detach's figures and the last attach's prewarm.
    swap: Mutex<cache_swap::SwapNotes>,
}

impl Daemon {
    /// Latency histograms (and the metrics exposition).
    pub fn metrics(&self) -> &crate::api::metrics::Metrics {
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
                retry_io: self.peer_links.is_some(),
            }),
        }
    }

    /// Starts this node's replica log on `peer`: every vDisk not configured with
    /// `replicate = false` has its client writes logged there before they are answered
    /// (`cluster/replicator.rs`), and a worker runs the log's trims and resyncs.
    fn start_replicator(self: &Arc<Self>, c: &Arc<crate::cluster::Cluster>, peer: String) {
        let s = c.settings();
        let links = Arc::new(crate::cluster::peer_device::PeerLinks {
            me: s.name.clone(),
            peers: Vec::new(),
            certs: s.peer_tls_dir.clone().expect("checked: a replica needs peer_tls_dir"),
            borrow_slots: 0,
            op_timeout: std::time::Duration::from_millis(s.replica_timeout_ms),
            cluster: std::sync::OnceLock::new(),
            restarted: Default::default(),
            down: Default::default(),
            busy: Default::default(),
        });
        let _ = links.cluster.set(Arc::downgrade(c));
        let r = Arc::new(crate::cluster::replicator::Replicator::new(s, peer, links, self.block_size));
        let _ = self.replicator.set(r.clone());
        for e in self.exports() {
            self.set_replicated(e.id, &e.name);
        }
        self.dp.set_replicator(r.clone());
        let dp = Arc::downgrade(&self.dp);
        std::thread::Builder::new()
            .name("cv-replica".into())
            .spawn(move || r.run(dp))
            .expect("spawning the replica thread");
    }

    /// Whether vDisk `vm` (`name`) replicates, told to the replica log (if any).
    fn set_replicated(&self, vm: VmId, name: &str) {
        let Some(r) = self.replicator.get() else { return };
        let off = self.no_replica.lock().unwrap_or_else(|e| e.into_inner()).contains(name);
        let fits = name.len() <= cachevisor_cluster::replica_record::MAX_NAME;
        if !off && !fits {
            tracing::warn!(vdisk = %crate::log_safe(name), "a vDisk name longer than 400 bytes is not replicated");
        }
        r.set_vdisk(vm, (!off && fits).then(|| name.to_string()));
    }

    /// The replica log's figures, on a node that keeps one on a peer.
    pub fn replica_status(&self) -> Option<crate::cluster::replicator::ReplicaStatus> {
        self.replicator.get().map(|r| r.status())
    }

    /// vDisks of the config that moved to another node while this one was down (not
    /// served; `GET /cluster`'s `moved_away`).
    pub fn moved_away(&self) -> &[crate::cluster::start_check::MovedAway] {
        &self.moved_away
    }

    /// How long this node's link to its lenders was busy so far (ns; 0 when it borrows
    /// from none).
    pub(crate) fn link_busy_ns(&self) -> u64 {
        self.peer_links.as_ref().map_or(0, |p| p.busy.busy_ns())
    }

    /// This node's cache migrations, when it borrows and `cluster.migration` is not off.
    pub fn migration_status(&self) -> Option<cachevisor_cluster::migration_driver::MigrationStatus> {
        self.migrations.get().map(|m| m.status())
    }

    /// This node's cluster membership, when `[cluster]` is configured.
    pub fn cluster(&self) -> Option<&Arc<crate::cluster::Cluster>> {
        self.cluster.get()
    }

    /// Joins the cluster `[cluster]` names: the agent publishes what this daemon
    /// serves and its vDisks' estimates (read through a weak reference: the agent does
    /// not keep the daemon up).
    pub fn join_cluster(
        self: &Arc<Self>,
        settings: crate::cluster::settings::ClusterSettings,
        api: Option<String>,
    ) -> Result<Arc<crate::cluster::Cluster>, StartError> {
        // A VM's curve reaches what it could ever be given: this node's cache and all it
        // may borrow (at least 4 times the cache, for the leader's view of a lender's
        // VMs). Capped lower, Eq. 4 never sees a VM needing more (measured: a VM on a
        // node with a 2 MiB cache and a 32 MiB loan was given 8 MiB in all).
        let local = self.resolved.slots * self.block_size / settings.unit_bytes;
        let borrowable = settings.borrow_bytes / settings.unit_bytes * settings.peers.len() as u64;
        let curve_units = (local + borrowable).max(local.saturating_mul(4));
        self.policy.lock().unwrap_or_else(|e| e.into_inner()).cluster_est =
            Some(crate::cluster::estimates::NodeEstimator::new(
                self.block_size,
                settings.unit_bytes,
                curve_units,
                settings.ideal,
            ));
        let lent = (settings.lend_bytes > 0)
            .then(|| crate::cluster::lent::LentRegions::new(self.meta_dir.join("lent"), settings.lend_bytes))
            .transpose()
            .map_err(|e| StartError::File { path: self.meta_dir.join("lent").display().to_string(), error: e })?
            .map(Arc::new);
        let takeovers = settings
            .snapshots
            .is_some()
            .then(|| crate::cluster::takeover::Takeovers::load(&self.meta_dir))
            .transpose()
            .map_err(StartError::Config)?
            .map(Arc::new);
        let source = NodeSource {
            snapshots: settings.snapshots.clone(),
            takeovers,
            daemon: Arc::downgrade(self),
            name: settings.name.clone(),
            address: settings.address.clone(),
            api,
            unit_bytes: settings.unit_bytes,
            lend_bytes: settings.lend_bytes,
            replica_bytes: settings.replica_capacity,
            incarnation: lent.as_ref().map_or(0, |l| l.incarnation),
            applied: Mutex::new(Vec::new()),
        };
        let replicas = (settings.replica_capacity > 0)
            .then(|| {
                crate::cluster::replica_host::ReplicaLogs::new(
                    self.meta_dir.join("replicas"),
                    settings.replica_capacity,
                )
            })
            .transpose()
            .map_err(|e| StartError::File { path: self.meta_dir.join("replicas").display().to_string(), error: e })?
            .map(Arc::new);
        let replica = settings.replica.clone();
        let migration = settings.migration.filter(|_| self.peer_links.is_some()).map(|p| (p, settings.migration_batch));
        let c = self
            .cluster
            .get_or_init(|| {
                let lease = self.start_lease.lock().unwrap_or_else(|e| e.into_inner()).take().map(|l| l.adopt());
                crate::cluster::Cluster::start(settings, Box::new(source), lent, replicas, lease)
            })
            .clone();
        if let Some(peer) = replica {
            self.start_replicator(&c, peer);
        }
        if let Some((plan, batch)) = migration {
            let m = crate::cluster::migrations::NodeMigrations::new(plan, self.block_size, batch)
                .map_err(|e| StartError::Config(format!("cluster.migration: {e}")))?;
            let m = self.migrations.get_or_init(|| Arc::new(m)).clone();
            let weak: std::sync::Weak<dyn crate::cluster::migrations::NodeOps> = Arc::downgrade(self) as _;
            std::thread::Builder::new()
                .name("cv-migrate".into())
                .spawn(move || m.run(weak))
                .map_err(|e| StartError::Config(format!("starting the migration thread: {e}")))?;
        }
        if let Some(p) = &self.peer_links {
            let _ = p.cluster.set(Arc::downgrade(&c));
            // The leader's allocation divides this node's cache and its peers' (below);
            // the local allocator's decisions are not applied.
            self.policy.lock().unwrap_or_else(|e| e.into_inner()).managed = false;
        }
        Ok(c)
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

    /// The replica logs this node keeps: a live owner's to its certificate, a gone one's
    /// to every live member's (read-only).
    fn replica_exports(&self) -> Vec<Export> {
        let Some((c, r)) = self.cluster().and_then(|c| c.replicas.as_ref().map(|r| (c, r))) else {
            return Vec::new();
        };
        c.replica_exports()
            .into_iter()
            .map(|x| Export {
                id: r.id(&x.owner),
                size: r.size_of(&x.owner),
                name: x.name,
                allow: x.allow,
                ..Default::default()
            })
            .collect()
    }

    /// The regions this node lends its live peers, each to the peer's certificate only.
    fn lent_exports(&self) -> Vec<Export> {
        let Some((c, l)) = self.cluster().and_then(|c| c.lent.as_ref().map(|l| (c, l))) else { return Vec::new() };
        c.lent_exports()
            .into_iter()
            .map(|(borrower, name)| Export {
                id: l.id(&borrower),
                name,
                size: l.size,
                allow: vec![format!("CN={borrower}")],
                ..Default::default() // never over vhost-user: another node's data
            })
            .collect()
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

    /// The metrics exposition (`/metrics`): latency histograms and the state now.
    pub fn render_metrics(&self) -> String {
        let state = crate::api::status::State {
            // Read directly: a scrape takes no engine walk or file stat for them.
            cache: [
                u64::from(self.dp.cache_state() == cachevisor_datapath::CacheState::Attached),
                u64::from(self.dp.cache_slots()) * self.block_size,
                u64::from(self.dp.max_cache_slots()) * self.block_size,
            ],
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
            vssd_region: self.vssd.as_ref().map(|v| crate::api::status::VssdRegionStatus {
                blocks: u64::from(v.budget_view().0),
                cap_blocks: u64::from(v.region_blocks()),
                withheld_slots: self.dp.with_engine_mut(|e| e.withheld_slots()),
            }),
            cluster: self.cluster().map(|c| {
                let s = c.status();
                crate::api::status::ClusterGauges {
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
        let parts: Vec<_> = self
            .dp
            .with_engine(|e| exports.iter().map(|x| (e.partition(x.id), e.written_back_ahead_of(x.id))).collect());
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
            .map(|((e, (p, ahead)), share)| VdiskStatus {
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
    /// [`crate::process::service::Running`] does): every request in flight or later fails, the
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
/// What a cluster node publishes, read from its daemon.
struct NodeSource {
    daemon: std::sync::Weak<Daemon>,
    name: String,
    address: String,
    api: Option<String>,
    unit_bytes: u64,
    lend_bytes: u64,
    replica_bytes: u64,
    incarnation: u64,
    /// The shares last applied.
    applied: Mutex<Vec<Share>>,
    /// The cluster's shared snapshot directory, and the moves prewarmed from it.
    snapshots: Option<std::path::PathBuf>,
    takeovers: Option<Arc<crate::cluster::takeover::Takeovers>>,
}

/// A vDisk's part of the leader's allocation on this node: (vDisk, its slots by lending
/// node, its target).
type Share = (VmId, Vec<(u16, u64)>, u64);

impl crate::cluster::NodeSource for NodeSource {
    fn info(&self) -> cachevisor_cluster::membership::MemberInfo {
        let replicated = self.daemon.upgrade().and_then(|d| d.replicator.get().map(|r| r.names())).unwrap_or_default();
        let (cache_blocks, block_size, vdisks, write_back) = match self.daemon.upgrade() {
            Some(d) => {
                let st = d.status();
                let wb = st
                    .iter()
                    .filter(|v| v.write_policy == cachevisor_engine::WritePolicy::Wb || v.dirty_blocks > 0)
                    .map(|v| v.name.clone())
                    .collect();
                (d.resolved.slots, d.block_size, st.into_iter().map(|v| v.name).collect(), wb)
            }
            None => (0, 0, Vec::new(), Vec::new()),
        };
        cachevisor_cluster::membership::MemberInfo {
            name: self.name.clone(),
            peer_address: self.address.clone(),
            api: self.api.clone(),
            cache_blocks,
            block_size,
            vdisks,
            lend_bytes: self.lend_bytes,
            incarnation: self.incarnation,
            write_back,
            replica_bytes: self.replica_bytes,
            replicated,
        }
    }

    /// The leader's allocation for this node's vDisks, applied as an engine job: each
    /// vDisk's share of each peer's lent region, and its target (local + lent), shrinks
    /// paced as the simulator's cluster mode applies them. Only on a node that borrows.
    fn apply(&self, a: &cachevisor_cluster::estimate::AllocationRecord) {
        let Some(d) = self.daemon.upgrade() else { return };
        let Some(links) = d.peer_links.clone() else { return };
        let unit = (a.unit_bytes / d.block_size).max(1);
        let cluster = d.cluster().cloned();
        // A region takes blocks and shares only while its peer is live, lends, did not
        // restart and did not fail within 1.5 lease TTLs (a region lost moments ago is not
        // reopened by an allocation the leader made before it saw the loss).
        let open: Vec<bool> = links
            .peers
            .iter()
            .map(|p| links.usable(p) && cluster.as_ref().is_some_and(|c| c.peer_target(p).is_some()))
            .collect();
        let mine: Vec<Share> = d
            .exports()
            .into_iter()
            .filter_map(|e| {
                let v = a.vms.get(&e.name).filter(|v| v.node == self.name)?;
                let by_lender: Vec<(u16, u64)> = v
                    .remote
                    .iter()
                    .filter_map(|(peer, u)| {
                        let i = links.peers.iter().position(|p| p == peer)?;
                        open[i].then_some(())?;
                        Some((i as u16 + 1, (u * unit).min(links.borrow_slots)))
                    })
                    .collect();
                let target = v.local_units * unit + by_lender.iter().map(|x| x.1).sum::<u64>();
                Some((e.id, by_lender, target))
            })
            .collect();
        if mine.is_empty() {
            return;
        }
        // Applied every time it is read (it also lifts a lost region's cap), logged when
        // this node's shares changed.
        let mut last = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        if *last != mine {
            tracing::info!(
                vdisks = mine.len(),
                "cluster: applying the leader's allocation (this node's shares changed)"
            );
            last.clone_from(&mine);
        }
        drop(last);
        d.dp.with_engine_mut(|e| {
            let mut targets: Vec<u64> = (0..e.vm_count() as VmId).map(|v| e.partition(v).target).collect();
            for (vm, _, t) in &mine {
                if let Some(x) = targets.get_mut(*vm as usize) {
                    *x = *t;
                }
            }
            let d = cachevisor_policy::allocator::Decision {
                paced_shrinks: true,
                ..cachevisor_policy::allocator::Decision::targets(targets)
            };
            e.submit_job(|e, out| {
                // Regions lost since the last allocation take blocks again (a restarted
                // peer's never does).
                for (i, open) in open.iter().enumerate() {
                    e.set_region_limit(i as u16 + 1, if *open { u64::MAX } else { 0 });
                }
                for (vm, by_lender, _) in &mine {
                    if let Err(err) = e.set_remote_shares(*vm, by_lender) {
                        tracing::warn!(vm, %err, "cluster: a remote share not applied");
                    }
                }
                *out = controller::apply(e, &d);
            });
        });
        if let Some(m) = d.migrations.get() {
            m.allocated();
        }
    }

    /// A vDisk that moved here (its VM restarted here after its node died) is prewarmed
    /// from the snapshots the node it came from left in the cluster's shared directory;
    /// one prewarm at a time (a move waits while another runs).
    fn map_seen(&self, map: &cachevisor_cluster::cluster_map::ClusterMap) {
        let (Some(root), Some(t)) = (&self.snapshots, &self.takeovers) else { return };
        let Some(d) = self.daemon.upgrade() else { return };
        if d.prewarm_job().progress().running || d.is_stopped() {
            return;
        }
        let served = d.exports().into_iter().map(|e| e.name).collect();
        let Some(due) = t.due(map, &self.name, &served) else { return };
        t.mark(&due);
        let from = root.join(&due.from);
        let t = t.clone();
        let names: Vec<String> = due.vdisks.iter().map(|v| v.0.clone()).collect();
        tracing::info!(from = %crate::log_safe(&due.from), vdisks = ?names, "cluster: vDisks moved here; prewarming them from the snapshots of the node they came from");
        // Read and planned off the cluster thread (its keep-alives go on).
        std::thread::spawn(move || {
            if let Err(p) = d.start_prewarm_of(&from, Some(&names)) {
                if p.running {
                    t.unmark(&due); // another prewarm started meanwhile: tried again
                }
            }
        });
    }

    fn estimates(&self) -> cachevisor_cluster::estimate::NodeEstimates {
        let Some(d) = self.daemon.upgrade() else {
            return cachevisor_cluster::estimate::NodeEstimates {
                unit_bytes: self.unit_bytes,
                capacity_units: 0,
                vms: Vec::new(),
            };
        };
        let live: Vec<(VmId, String)> = d.exports().into_iter().map(|e| (e.id, e.name)).collect();
        let capacity = d.resolved.slots * d.block_size / self.unit_bytes;
        let mut p = d.policy.lock().unwrap_or_else(|e| e.into_inner());
        match p.cluster_est.as_mut() {
            Some(e) => e.take(&live, capacity, self.unit_bytes),
            None => cachevisor_cluster::estimate::NodeEstimates {
                unit_bytes: self.unit_bytes,
                capacity_units: capacity,
                vms: Vec::new(),
            },
        }
    }
}

fn engine_config(r: &Resolved) -> EngineConfig {
    r.cache.engine_config(r.max_slots).expect("checked by Config::resolve")
}

/// The controller of `cfg`'s allocator for `r`'s cache, with `engine`'s vDisks enrolled
/// and the first division applied (an empty cache: no device work).
fn first_controller(cfg: &Config, r: &Resolved, engine: &mut Engine) -> Result<Controller, String> {
    let alloc = registry::build_with(&r.cache.allocator, &r.cache.params)?;
    // Laid out for `cache.max_size`: the slots past `cache.size` are withheld, and the
    // controller's capacity is the engine's less what is withheld.
    let mut ctl = Controller::new(alloc, r.max_slots, r.cache.block_size, true);
    for (i, v) in cfg.vdisk.iter().enumerate() {
        policy::enroll(engine, &mut ctl, i as VmId, v, r.cache.block_size)?;
    }
    let first = ctl.decide(engine, None, &[], None);
    controller::apply(engine, &first);
    // S-CAVE's global cleaner runs in the engine as requests are admitted (§V-B), as in
    // the simulator.
    engine.set_cleaner(controller::cleaner_watermarks(
        ctl.allocator(),
        r.max_slots,
        cfg.cache.partition == PartitionMode::Static,
    ));
    Ok(ctl)
}
