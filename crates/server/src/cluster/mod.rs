//! A daemon as a node of an HCI cluster (ELICA; ROADMAP §4): its `[cluster]` settings
//! ([`settings`]), its membership driven against etcd ([`agent`]: lease, member key,
//! leader election, the leader's map), and the handle the rest of the daemon asks —
//! whether this node may serve other nodes' data now (fencing), which map epoch a peer
//! request must carry, and the status the API shows (`GET /cluster`). The decisions are
//! `cachevisor_cluster`'s pure code; no `[cluster]` section, no cluster.

pub(crate) mod agent;
pub(crate) mod bad_records;
pub(crate) mod claims;
pub(crate) mod estimates;
pub(crate) mod etcd_once;
pub(crate) mod lent;
pub(crate) mod migrations;
pub(crate) mod peer_device;
pub(crate) mod replica_host;
pub(crate) mod replica_state;
mod replica_writer;
pub(crate) mod replicator;
pub(crate) mod start_check;
pub(crate) mod takeover;
pub(crate) mod takeover_replay;

use crate::config::cluster_section::ClusterSettings;
use cachevisor_cluster::cluster_map::ClusterMap;
use cachevisor_cluster::estimate::{AllocationRecord, NodeEstimates};
use cachevisor_cluster::membership::{EpochRefusal, Event, Leader, Member, MemberInfo};
use serde::Serialize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// What the agent and the daemon share.
pub(crate) struct Shared {
    pub(crate) member: Member,
    pub(crate) map: ClusterMap,
    /// The member record last written.
    pub(crate) published: Option<MemberInfo>,
    /// Each node's last published estimates, by name.
    pub(crate) estimates: std::collections::BTreeMap<String, NodeEstimates>,
    /// The leader's last allocation.
    pub(crate) allocation: Option<AllocationRecord>,
    etcd_reachable: bool,
    last_error: Option<String>,
    /// vDisks being added (`POST /vdisks`): claimed, not served yet.
    pub(crate) adding: std::collections::BTreeSet<String>,
    /// vDisks this node serves whose claim another node holds (`claims.rs`).
    pub(crate) claim_conflicts: Vec<ClaimConflict>,
    /// Records read from etcd and ignored (`bad_records.rs`).
    pub(crate) bad: bad_records::BadRecords,
    /// The mod revision of a leader key no lease holds, for the next campaign to remove.
    pub(crate) stale_leader: Option<i64>,
}

/// A vDisk this node serves whose claim another node holds: it took the vDisk over while
/// this node had no lease (cut from etcd). Both serving it is the VM-level split brain
/// the operator must end (remove it on one of them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClaimConflict {
    /// The vDisk.
    pub vdisk: String,
    /// The node holding its claim.
    pub node: String,
}

/// The node's cluster handle.
pub struct Cluster {
    settings: ClusterSettings,
    start: Instant,
    state: Mutex<Shared>,
    /// What this node publishes about itself.
    source: Box<dyn NodeSource>,
    /// The cache it lends its peers, if any.
    pub lent: Option<Arc<lent::LentRegions>>,
    /// The replica logs it keeps for its peers, if any.
    pub replicas: Option<Arc<replica_host::ReplicaLogs>>,
}

/// A replica log this node exports: its owner, the export name, the certificates that
/// may open it.
pub struct ReplicaExportInfo {
    /// The owner.
    pub owner: String,
    /// `replica-<owner>@<epoch>`.
    pub name: String,
    /// `CN=<node>` of whoever may open it.
    pub allow: Vec<String>,
}

/// What a node publishes, read from the daemon.
pub trait NodeSource: Send + Sync {
    /// Its member record (read at each registration and check).
    fn info(&self) -> MemberInfo;
    /// This window's estimates (taken every interval; the window starts again).
    fn estimates(&self) -> NodeEstimates;
    /// The leader's new allocation: this node's vDisks' local targets and their shares of
    /// the peers' lent cache.
    fn apply(&self, a: &AllocationRecord);
    /// The map as read now (every read of etcd): vDisks that moved here are prewarmed
    /// from the node they came from ([`takeover`]).
    fn map_seen(&self, map: &ClusterMap);
}

/// `GET /cluster`.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterStatus {
    /// This node.
    pub name: String,
    /// Its peer address.
    pub address: String,
    /// Whether it holds a valid lease (may serve other nodes' data).
    pub serving: bool,
    /// Whether it leads.
    pub leading: bool,
    /// The leader etcd names.
    pub leader: Option<Leader>,
    /// The map epoch this node is at.
    pub epoch: u64,
    /// The members etcd lists.
    pub members: Vec<MemberInfo>,
    /// The map.
    pub map: ClusterMap,
    /// The leader's last allocation (ELICA's Eq. 4 on the published estimates).
    pub allocation: Option<AllocationRecord>,
    /// The nodes whose estimates this node has read.
    pub estimates_from: Vec<String>,
    /// Whether the last request to etcd was answered.
    pub etcd_reachable: bool,
    /// Requests to etcd that failed so far.
    pub etcd_errors: u64,
    /// The last failure.
    pub last_error: Option<String>,
    /// Lease TTL (ms).
    pub lease_ttl_ms: u64,
    /// This node's replica log on a peer (`[cluster] replica`).
    pub replica: Option<replicator::ReplicaStatus>,
    /// vDisks of this node's config that moved to another node while it was down: not
    /// served here, their cached blocks dropped at start (`start_check.rs`).
    pub moved_away: Vec<start_check::MovedAway>,
    /// Cache migrations on this node (`migration`; a node that borrows): waiting,
    /// running, blocks moved.
    pub migration: Option<cachevisor_cluster::migration_driver::MigrationStatus>,
    /// vDisks served here whose claim another node holds (`claims.rs`).
    pub claim_conflicts: Vec<ClaimConflict>,
    /// Records read from etcd and ignored since start (too large, unreadable, a leader
    /// key no lease holds), each change of a record once.
    pub bad_records: u64,
}

impl Cluster {
    /// Starts the agent thread for `settings`; `info` says what this node serves; `lease`
    /// is the start's (its vDisks claimed under it), renewed by the agent from now on.
    pub fn start(
        settings: ClusterSettings,
        source: Box<dyn NodeSource>,
        lent: Option<Arc<lent::LentRegions>>,
        replicas: Option<Arc<replica_host::ReplicaLogs>>,
        lease: Option<claims::Adopted>,
    ) -> Arc<Cluster> {
        let mut member = Member::new(&settings.name, settings.timing);
        let start = lease.map_or_else(Instant::now, |l| l.origin);
        if let Some(l) = lease {
            let now = start.elapsed().as_millis() as u64;
            member.lease_granted(now, l.sent.duration_since(start).as_millis() as u64, l.id, l.ttl_s);
        }
        let c = Arc::new(Cluster {
            state: Mutex::new(Shared {
                member,
                map: ClusterMap::default(),
                published: None,
                estimates: Default::default(),
                allocation: None,
                etcd_reachable: false,
                last_error: None,
                adding: Default::default(),
                claim_conflicts: Vec::new(),
                bad: Default::default(),
                stale_leader: None,
            }),
            settings,
            start,
            source,
            lent,
            replicas,
        });
        let weak = Arc::downgrade(&c);
        std::thread::Builder::new()
            .name("cv-cluster".into())
            .spawn(move || agent::run(weak))
            .expect("spawning the cluster thread");
        c
    }

    /// The settings.
    pub fn settings(&self) -> &ClusterSettings {
        &self.settings
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Shared> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Whether this node may serve other nodes' data now.
    pub fn serving(&self) -> bool {
        let now = self.now_ms();
        self.lock().member.serving(now)
    }

    /// A peer request made at map epoch `sent`: accepted now, or why not.
    pub fn check_epoch(&self, sent: u64) -> Result<(), EpochRefusal> {
        let now = self.now_ms();
        self.lock().member.check_epoch(now, sent)
    }

    /// Whether `borrower` may be served this node's lent cache on a connection opened at
    /// `epoch`: this node holds its lease, is at that epoch, and sees `borrower` live.
    pub fn check_peer(&self, borrower: &str, epoch: u64) -> Result<(), String> {
        let now = self.now_ms();
        let s = self.lock();
        s.member.check_epoch(now, epoch).map_err(|e| e.to_string())?;
        if !s.member.members().iter().any(|m| m.name == borrower) {
            return Err(format!("{} is not a live member of the cluster", crate::log_safe(borrower)));
        }
        Ok(())
    }

    /// Whether a request on `owner`'s replica log, on a connection opened at `epoch`, may
    /// be served: this node holds its lease and is at that epoch; a write (`write`) only
    /// while the owner is a live member.
    pub fn check_replica(&self, owner: &str, epoch: u64, write: bool) -> Result<(), String> {
        let now = self.now_ms();
        let s = self.lock();
        s.member.check_epoch(now, epoch).map_err(|e| e.to_string())?;
        if write && !s.member.members().iter().any(|m| m.name == owner) {
            return Err(format!("{} is not a live member of the cluster", crate::log_safe(owner)));
        }
        Ok(())
    }

    /// Whether `owner` is a live member now.
    pub fn is_member(&self, owner: &str) -> bool {
        self.lock().member.members().iter().any(|m| m.name == owner)
    }

    /// The replica-log exports now: each live peer's log, to its certificate; each log
    /// of a peer that is gone, to every live member's (read-only).
    pub fn replica_exports(&self) -> Vec<ReplicaExportInfo> {
        let Some(r) = &self.replicas else { return Vec::new() };
        let now = self.now_ms();
        let s = self.lock();
        if !s.member.serving(now) {
            return Vec::new();
        }
        let epoch = s.member.epoch();
        let me = &self.settings.name;
        let live: Vec<&str> = s.member.members().iter().map(|m| m.name.as_str()).filter(|n| n != me).collect();
        let mut out: Vec<ReplicaExportInfo> = live
            .iter()
            .map(|o| ReplicaExportInfo {
                owner: o.to_string(),
                name: replica_host::ReplicaLogs::export_name(o, epoch),
                allow: vec![format!("CN={o}")],
            })
            .collect();
        for o in r.kept().into_iter().filter(|o| o != me && !live.contains(&o.as_str())) {
            out.push(ReplicaExportInfo {
                name: replica_host::ReplicaLogs::export_name(&o, epoch),
                owner: o,
                allow: live.iter().map(|n| format!("CN={n}")).collect(),
            });
        }
        out
    }

    /// Where `peer`'s replica log for this node is: (address, epoch), if it is a live
    /// member that keeps logs and this node holds a lease.
    pub fn replica_target(&self, peer: &str) -> Option<(String, u64)> {
        let now = self.now_ms();
        let s = self.lock();
        if !s.member.serving(now) {
            return None;
        }
        let m = s.member.members().iter().find(|m| m.name == peer && m.replica_bytes > 0)?;
        Some((m.peer_address.clone(), s.member.epoch()))
    }

    /// The lent-cache exports now: (borrower, export name) for every live peer.
    pub fn lent_exports(&self) -> Vec<(String, String)> {
        let Some(l) = &self.lent else { return Vec::new() };
        let now = self.now_ms();
        let s = self.lock();
        if !s.member.serving(now) {
            return Vec::new();
        }
        let epoch = s.member.epoch();
        s.member
            .members()
            .iter()
            .filter(|m| m.name != self.settings.name)
            .map(|m| (m.name.clone(), l.export_name(&m.name, epoch)))
            .collect()
    }

    /// Where `peer`'s lent cache is now: (address, incarnation, epoch), if it is a live
    /// member that lends and this node holds a lease.
    pub fn peer_target(&self, peer: &str) -> Option<(String, u64, u64)> {
        let now = self.now_ms();
        let s = self.lock();
        if !s.member.serving(now) {
            return None;
        }
        let m = s.member.members().iter().find(|m| m.name == peer && m.lend_bytes > 0 && m.incarnation > 0)?;
        Some((m.peer_address.clone(), m.incarnation, s.member.epoch()))
    }

    /// Whether this node may start serving the vDisk `name` (a VM restarted here),
    /// before its claim is taken ([`Self::claim`]: one node at a time): not when its last
    /// home is gone while it was write-back there (acknowledged writes may be on that node's
    /// SSD only) — unless that home's replica log is valid in etcd and its keeper live:
    /// then the log is replayed first (`Ok(Some(replay))`, `takeover_replay.rs`) — nor
    /// before the map was read (unknown). `Err` says why and what to do.
    pub fn may_serve(&self, name: &str) -> Result<Option<takeover_replay::Replay>, String> {
        let v = crate::log_safe(name);
        let home = {
            let s = self.lock();
            if s.map.epoch == 0 {
                let why = if s.etcd_reachable { "not read yet" } else { "not read (etcd unreachable)" };
                return Err(format!("the cluster map is {why}: whether another node serves `{v}` is not known; try again, or add it with force"));
            }
            let Some(e) = s.map.vdisks.get(name).filter(|e| e.home != self.settings.name) else { return Ok(None) };
            // A live home that serves it holds its claim, which `claim` finds; one that
            // removed it wrote its dirty blocks back first.
            if !e.write_back || s.member.members().iter().any(|m| m.name == e.home) {
                return Ok(None);
            }
            if !e.replicated {
                let home = crate::log_safe(&e.home);
                return Err(format!("vDisk `{v}` was write-back on node {home}, which is gone: writes it acknowledged may be in {home}'s cache only (it was not replicated: no valid replica log). Bring {home} back (its cache writes them back), or add it with force to serve what the backing store holds"));
            }
            e.home.clone()
        };
        let shown = crate::log_safe(&home);
        let lost = format!("vDisk `{v}` was write-back on node {shown}, which is gone: writes it acknowledged may be in {shown}'s cache only");
        let state = replica_state::read(&self.settings, &home, std::time::Duration::from_secs(2))
            .map_err(|e| format!("{lost}, and whether its replica log holds them is not known ({e}); try again"))?;
        match state {
            Some(st) if st.valid && self.replica_target(&st.peer).is_some() => {
                Ok(Some(takeover_replay::Replay { owner: home, state: st }))
            }
            Some(st) if st.valid => Err(format!("{lost}; its replica log is on {}, which is not live now: bring either back, or add it with force to serve what the backing store holds", crate::log_safe(&st.peer))),
            _ => Err(format!("{lost} (no valid replica log). Bring {shown} back (its cache writes them back), or add it with force to serve what the backing store holds")),
        }
    }

    /// Deletes the replica log this node keeps for `owner`, once it can hold nothing
    /// needed: the owner is not a live member (a live one writes it), and the map homes
    /// none of the owner's replicated write-back vDisks on it (those not yet restarted on
    /// another node, where the log is replayed first). `Ok(None)`: no log of `owner`
    /// here; `Err` says why not (and what to do). A gone owner's log otherwise stays
    /// (`replica_capacity` bytes of this node's disk) until the owner returns.
    pub fn forget_replica(&self, owner: &str) -> Result<Option<u64>, String> {
        let o = crate::log_safe(owner);
        let Some(r) = &self.replicas else { return Ok(None) };
        if !r.kept().iter().any(|k| k == owner) {
            return Ok(None);
        }
        {
            let s = self.lock();
            if s.map.epoch == 0 {
                return Err(format!(
                    "the cluster map is not read yet: whether {o}'s log is still needed is not known; try again"
                ));
            }
            if s.member.members().iter().any(|m| m.name == owner) {
                return Err(format!("{o} is a live member: its replica log is in use"));
            }
            let needed: Vec<String> = s
                .map
                .vdisks
                .iter()
                .filter(|(_, e)| e.home == owner && e.write_back && e.replicated)
                .map(|(v, _)| format!("`{}`", crate::log_safe(v)))
                .collect();
            if !needed.is_empty() {
                return Err(format!(
                    "{o}'s log may hold acknowledged writes of {} not yet on the backing store: restart them on a node first (the log is replayed there), or bring {o} back",
                    needed.join(", ")
                ));
            }
        }
        let freed = r.forget(owner).map_err(|e| format!("deleting {o}'s replica log: {e}"))?;
        if let Some(b) = freed {
            tracing::info!(owner = %o, bytes = b, "replica log of a gone owner deleted");
        }
        Ok(freed)
    }

    /// The map epoch this node is at.
    pub fn epoch(&self) -> u64 {
        self.lock().member.epoch()
    }

    /// The status.
    pub fn status(&self) -> ClusterStatus {
        let now = self.now_ms();
        let s = self.lock();
        ClusterStatus {
            name: self.settings.name.clone(),
            address: self.settings.address.clone(),
            serving: s.member.serving(now),
            leading: s.member.leading(now),
            leader: s.member.leader().cloned(),
            epoch: s.member.epoch(),
            members: s.member.members().to_vec(),
            map: s.map.clone(),
            allocation: s.allocation.clone(),
            estimates_from: s.estimates.keys().cloned().collect(),
            etcd_reachable: s.etcd_reachable,
            etcd_errors: s.member.etcd_errors(),
            last_error: s.last_error.clone(),
            lease_ttl_ms: self.settings.timing.lease_ttl_ms,
            replica: None,
            moved_away: Vec::new(),
            migration: None,
            claim_conflicts: s.claim_conflicts.clone(),
            bad_records: s.bad.count,
        }
    }

    /// Takes vDisk `name`'s claim before it is served here (`claims.rs`): refused while
    /// another node holds it, or (unless `force`) when etcd does not answer or this node
    /// holds no lease. The guard marks it as being added until dropped (its claim is
    /// released by the agent if it is not served by then).
    pub fn claim(self: &Arc<Self>, name: &str, force: bool) -> Result<ClaimGuard, String> {
        let v = crate::log_safe(name);
        let guard = ClaimGuard { cluster: self.clone(), name: name.to_string() };
        let lease = {
            let mut s = self.lock();
            s.adding.insert(name.to_string());
            s.member.lease().map(|(id, _)| id)
        };
        let unknown = |why: String| {
            if force {
                tracing::warn!(vdisk = %v, "cluster: {why}; served anyway (force)");
                Ok(())
            } else {
                Err(format!("{why}: whether another node is adding `{v}` at the same moment is not known; try again, or add it with force"))
            }
        };
        let Some(lease) = lease else {
            unknown("this node holds no cluster lease now (etcd unreachable?)".into())?;
            return Ok(guard);
        };
        let (prefix, me, k) = (self.settings.prefix.clone(), self.settings.name.clone(), name.to_string());
        let found = etcd_once::block_on(&self.settings, std::time::Duration::from_secs(3), async move |c| {
            claims::take(c, &prefix, &me, lease, &k).await
        });
        match found {
            Ok(claims::Claim::Taken) => Ok(guard),
            Ok(claims::Claim::HeldBy(n)) => Err(format!(
                "vDisk `{v}` is claimed by node {}, which serves it or is adding it now: a vDisk is served by one node at a time (remove it there first; a node that is gone drops its claims when its lease ends, within {} ms)",
                crate::log_safe(&n),
                self.settings.timing.lease_ttl_ms
            )),
            Err(e) => unknown(format!("its claim could not be taken in etcd ({e})")).map(|_| guard),
        }
    }

    /// Releases vDisk `name`'s claim (it was removed here); if etcd does not answer, the
    /// agent releases it at a later read of the keys.
    pub fn release(&self, name: &str) {
        let (prefix, me, k) = (self.settings.prefix.clone(), self.settings.name.clone(), name.to_string());
        let done = etcd_once::block_on(&self.settings, std::time::Duration::from_secs(2), async move |c| {
            claims::release(c, &prefix, &me, &k).await
        });
        if let Err(e) = done {
            tracing::warn!(vdisk = %crate::log_safe(name), error = %e, "cluster: releasing a removed vDisk's claim (retried by the agent)");
        }
    }

    fn etcd_ok(&self) {
        let mut s = self.lock();
        if !s.etcd_reachable {
            tracing::info!("cluster: etcd reachable");
        }
        s.etcd_reachable = true;
    }

    fn etcd_error(&self, e: String) {
        let mut s = self.lock();
        if s.etcd_reachable || s.last_error.is_none() {
            tracing::warn!(error = %e, "cluster: etcd request failed (the node serves its own vDisks on; it fences itself when its lease runs out)");
        }
        s.etcd_reachable = false;
        s.last_error = Some(e);
    }

    fn log_events(&self) {
        let mut s = self.lock();
        while let Some(e) = s.member.poll_event() {
            match e {
                Event::Serving => tracing::info!("cluster: lease held, serving peers"),
                Event::Fenced => tracing::warn!(
                    "cluster: lease lost or expired: fenced — this node serves no other node's data until it holds a lease again"
                ),
                Event::Leading(term) => tracing::info!(term, "cluster: leading"),
                Event::NotLeading => tracing::info!("cluster: not leading"),
            }
        }
    }
}

/// A vDisk being added under its claim ([`Cluster::claim`]); dropped once it is served or
/// the add failed.
pub struct ClaimGuard {
    cluster: Arc<Cluster>,
    name: String,
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        self.cluster.lock().adding.remove(&self.name);
    }
}
