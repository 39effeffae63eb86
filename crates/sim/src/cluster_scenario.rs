//! Cluster scenarios (ELICA): the `[[node]]` and `[cluster]` sections a
//! scenario gains, and the checked settings the cluster simulator (`cluster_sim.rs`) runs
//! on — every bad value refused with the key named.

use crate::device::{Device, DeviceSpec};
use crate::scenario::{DeviceChoice, Scenario};
use cachevisor_cluster::allocation::Solver;
use cachevisor_cluster::migration_plan::{PlanSettings, SchemeChoice};
use cachevisor_cluster::model::Latencies;
use cachevisor_engine::PartitionMode;
use cachevisor_trace::units::parse_size;
use serde::{Deserialize, Serialize};

/// One node of a cluster scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSection {
    /// Its name (VMs name it in `node = …`).
    pub name: String,
    /// Its SSD cache (`256MiB`).
    pub cache: String,
    /// Its SSD model (default: `[devices] ssd`).
    #[serde(default)]
    pub ssd: Option<DeviceChoice>,
    /// Its network link (default: the `remote` preset, 10 GbE: 150 µs round trip,
    /// 1,250 MB/s).
    #[serde(default)]
    pub link: Option<DeviceChoice>,
}

/// How a cluster shares cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ClusterMode {
    /// ELICA-Traffic (§3.4): Eq. 4 across the nodes, remote cache where a node is short,
    /// sequential runs kept local.
    #[default]
    Elica,
    /// ELICA-Load (§3.5): Eq. 4 across the nodes, then every window `load_chunks` units
    /// exchanged between the busiest VM of the node whose SSD is busiest and the idlest
    /// VM of the least busy node (each VM's capacity unchanged); no local preference for
    /// sequential runs.
    ElicaLoad,
    /// Each node its own cache only (the ECI-like baseline of ELICA §4).
    Local,
}

/// `[cluster]`: the allocation's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSection {
    /// ELICA or local-only.
    pub mode: ClusterMode,
    /// Which Eq. 4 solver.
    pub solver: Solver,
    /// Allocation unit (`1MiB`), a multiple of the block size.
    pub unit: String,
    /// Eq. 1's ideal size: the distance covering this fraction of a window's reuses
    /// (1 = the maximum distance, Eq. 1 as written).
    pub ideal: f64,
    /// ELICA-Load: units exchanged per window (the seed's n, which it does not give: 4
    /// units of 1 MiB move a few percent of a busy VM's cache per window, so a VM's data
    /// moves gradually rather than all at once).
    pub load_chunks: u64,
    /// ELICA-Traffic's local/lent choice also as a full partition turns over
    /// (`Engine::set_traffic_turnover`); off: only while a VM's parts fill.
    pub traffic_turnover: bool,
    /// Migration when an allocation moves a VM's cache between nodes (§3.6).
    pub migration: MigrationSection,
    /// The last allocation is kept unless a new one lowers Eq. 4's objective by at least
    /// this fraction (`cachevisor_cluster::hysteresis`, as the daemon's leader; 0: ELICA's
    /// re-solve as is).
    pub hysteresis: f64,
    /// Check every byte's version through a model of the devices (every reply against
    /// the last acknowledged write; the backing stores after a final flush): ELICA's
    /// coherency check (Table 5). Costs memory per sector touched.
    pub verify_data: bool,
    /// Writes to blocks in lent caches: `back` (ELICA as written: write-back data may sit
    /// in another node's SSD) or `through` (the daemon's rule, `Engine::set_lent_write_through`:
    /// a block in a lent store is never dirty, so a lost lender loses no acknowledged write).
    pub remote_writes: RemoteWrites,
}

/// How writes to blocks in lent caches are handled (`cluster.remote_writes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum RemoteWrites {
    /// As the cache's write policy says (ELICA §3: write-back data in a remote SSD).
    #[default]
    Back,
    /// Written through to the backing store before the reply (what the daemon runs).
    Through,
}

/// Which migration scheme moves a VM's blocks when its shares change (ELICA §3.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum MigrationChoice {
    /// Latency-aware (§3.6.3): Gradual while the links are congested, else Instant.
    #[default]
    Auto,
    /// Always Gradual Migration (§3.6.1).
    Gradual,
    /// Always Instant Migration (§3.6.2).
    Instant,
    /// No migration: blocks at a store above the VM's share stay until replaced.
    Off,
}

/// `[cluster.migration]`: how and how fast caches move between nodes (§3.6, §3.6.3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MigrationSection {
    /// The scheme.
    pub scheme: MigrationChoice,
    /// Migrations that may start per second (rate-limited migration, §3.6.3).
    pub rate: f64,
    /// Migrations that may start at once after a quiet spell.
    pub burst: u32,
    /// Link utilization (0..=1) at or above which `auto` picks Gradual.
    pub congested: f64,
    /// Instant Migration: blocks per copy job (one job in flight per VM).
    pub batch: u64,
}

impl Default for MigrationSection {
    fn default() -> Self {
        let p = PlanSettings::default();
        MigrationSection {
            scheme: MigrationChoice::Auto,
            rate: p.rate,
            burst: p.burst,
            congested: p.congested,
            batch: 64,
        }
    }
}

impl MigrationSection {
    /// The planner's settings (`None`: migration off); the error names the key.
    pub(crate) fn settings(&self) -> Result<Option<PlanSettings>, String> {
        let scheme = match self.scheme {
            MigrationChoice::Off => return Ok(None),
            MigrationChoice::Auto => None,
            MigrationChoice::Gradual => Some(SchemeChoice::Gradual),
            MigrationChoice::Instant => Some(SchemeChoice::Instant),
        };
        let s = PlanSettings { rate: self.rate, burst: self.burst, congested: self.congested, scheme };
        s.validate().map_err(|e| format!("cluster.{e}"))?;
        if self.batch == 0 {
            return Err("cluster.migration.batch must be at least 1 block".into());
        }
        Ok(Some(s))
    }
}

impl Default for ClusterSection {
    fn default() -> Self {
        ClusterSection {
            mode: ClusterMode::Elica,
            solver: Solver::Fast,
            unit: "1MiB".into(),
            ideal: 0.99,
            load_chunks: 4,
            traffic_turnover: false,
            migration: MigrationSection::default(),
            hysteresis: cachevisor_cluster::hysteresis::DEFAULT_MIN_GAIN,
            verify_data: false,
            remote_writes: RemoteWrites::Back,
        }
    }
}

/// A cluster scenario's settings, checked.
pub(crate) struct Plan {
    pub(crate) cl: ClusterSection,
    /// The `[cache]` settings, checked (each node's cache has its own size).
    pub(crate) cache: cachevisor_policy::cache_settings::CacheSettings,
    pub(crate) block: u64,
    pub(crate) unit_blocks: u64,
    pub(crate) window_ns: u64,
    pub(crate) slots: Vec<u64>,
    pub(crate) lat: Latencies,
    /// Migration's planner settings (`None`: off, or a local-only cluster).
    pub(crate) migration: Option<PlanSettings>,
}

pub(crate) fn plan(sc: &Scenario) -> Result<Plan, String> {
    let res = sc.resolve()?;
    let cl = sc.cluster.clone().unwrap_or_default();
    if sc.node.is_empty() {
        return Err("node: a cluster needs at least one [[node]]".into());
    }
    if sc.cache.partition != PartitionMode::Static || sc.cache.persistent || sc.failover.is_some() {
        return Err("cache: cluster mode needs static partitions, no persistent mode and no [failover]".into());
    }
    if sc.replay.repeat_for.is_some() {
        return Err("replay.repeat_for: cluster mode replays each trace once".into());
    }
    if res.window_requests.is_some() {
        return Err("replay.window: cluster mode windows by time (`60s`)".into());
    }
    let block = res.cache.block_size;
    let unit = parse_size(&cl.unit).map_err(|e| format!("cluster.unit: {e}"))?;
    if unit == 0 || unit % block != 0 {
        return Err(format!("cluster.unit: {} is not a multiple of the block size ({block} B)", cl.unit));
    }
    if !(cl.ideal > 0.0 && cl.ideal <= 1.0) {
        return Err(format!("cluster.ideal: {} is not a fraction of reuses in (0, 1]", cl.ideal));
    }
    cachevisor_cluster::hysteresis::validate(cl.hysteresis).map_err(|e| format!("cluster.{e}"))?;
    let mut slots = Vec::new();
    for (i, n) in sc.node.iter().enumerate() {
        if sc.node[..i].iter().any(|m| m.name == n.name) {
            return Err(format!("node[{i}]: the name `{}` is taken", n.name));
        }
        let bytes = parse_size(&n.cache).map_err(|e| format!("node[{i}] ({}).cache: {e}", n.name))?;
        if bytes < block {
            return Err(format!("node[{i}] ({}).cache: {} holds no block", n.name, n.cache));
        }
        slots.push(bytes / block);
        for d in [&n.ssd, &n.link].into_iter().flatten() {
            d.resolve().map_err(|e| format!("node[{i}] ({}): {e}", n.name))?;
        }
    }
    for v in &sc.vm {
        match &v.node {
            Some(n) if sc.node.iter().any(|m| m.name == *n) => {}
            Some(n) => return Err(format!("vm {}: no [[node]] is named `{n}`", v.name)),
            None => return Err(format!("vm {}: cluster mode needs its node (node = \"…\")", v.name)),
        }
    }
    let ssd = sc.devices.ssd.resolve()?;
    let link = DeviceSpec::preset("remote")?;
    let hdd = sc.devices.backing.resolve()?;
    let us = |spec: &DeviceSpec| Device::nominal_ns(spec, false, block as u32) as f64 / 1e3;
    let lat = Latencies { ssd_local_us: us(&ssd), ssd_remote_us: us(&ssd), network_us: us(&link), hdd_us: us(&hdd) };
    if res.window_requests.is_some() {
        return Err(format!(
            "replay.window: `{}`: a cluster's windows are virtual time (`1s`), not requests",
            sc.replay.window
        ));
    }
    let window_ns = res.window_ns;
    let migration = cl.migration.settings()?.filter(|_| cl.mode != ClusterMode::Local);
    Ok(Plan { unit_blocks: unit / block, cl, cache: res.cache, block, window_ns, slots, lat, migration })
}
