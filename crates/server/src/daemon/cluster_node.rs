//! The daemon as a node of an HCI cluster (`[cluster]`): joining it, the replica log on a
//! peer, the regions it lends and the replica logs it keeps as exports, cache migrations
//! with its lenders, and what it publishes to the leader and applies from it
//! ([`NodeSource`]: ELICA §3.5's per-node estimates in, the leader's allocation out).

use super::{Daemon, Export, StartError};
use cachevisor_datapath::DataPath;
use cachevisor_policy::controller;
use cachevisor_trace::VmId;
use std::sync::{Arc, Mutex};

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

impl Daemon {
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
    pub(super) fn set_replicated(&self, vm: VmId, name: &str) {
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
        settings: crate::config::cluster_section::ClusterSettings,
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

    /// The replica logs this node keeps: a live owner's to its certificate, a gone one's
    /// to every live member's (read-only).
    pub(super) fn replica_exports(&self) -> Vec<Export> {
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
    pub(super) fn lent_exports(&self) -> Vec<Export> {
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
}

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
