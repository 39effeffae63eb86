//! `[cluster]`: this node's name and the address its peers reach it at, the etcd
//! endpoints holding the cluster's state, the cluster's key prefix, the lease TTL (a node
//! that stops renewing is dead after it), the fencing margin and the leader's interval.
//! Checked into numbers with messages that name the key. No section: the single-host
//! daemon.

use cachevisor_cluster::membership::Timing;
use cachevisor_cluster::model::{IdealForm, Latencies};
use cachevisor_trace::units::{parse_duration_ns, parse_size};
use serde::{Deserialize, Serialize};

/// `[cluster]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// This node's name, unique in the cluster (letters, digits, `-`, `_`, `.`).
    pub name: String,
    /// `host:port` its peers reach it at.
    pub address: String,
    /// etcd's client URLs (`http://10.0.0.9:2379`).
    pub etcd: Vec<String>,
    /// The cluster's name: its keys live under `/cachevisor/<cluster>/`.
    #[serde(default = "default_cluster")]
    pub cluster: String,
    /// The lease's TTL (whole seconds, etcd's unit; 2s to 60s).
    #[serde(default = "default_ttl")]
    pub lease_ttl: String,
    /// How much earlier than etcd could expire the lease this node fences itself.
    #[serde(default = "default_margin")]
    pub fence_margin: String,
    /// The leader's allocation interval (and the window of the estimates nodes publish).
    #[serde(default = "default_interval")]
    pub interval: String,
    /// ELICA's allocation unit (a multiple of every node's block size).
    #[serde(default = "default_unit")]
    pub unit: String,
    /// Eq. 1's ideal size: the stack distance covering this fraction of a window's
    /// reuses (1.0: the maximum, as the seed writes it).
    #[serde(default = "default_ideal")]
    pub ideal: f64,
    /// Eq. 3's latencies: a hit in an SSD cache, what reaching another node adds, a miss.
    #[serde(default = "default_ssd_latency")]
    pub ssd_latency: String,
    /// See `ssd_latency`.
    #[serde(default = "default_network_latency")]
    pub network_latency: String,
    /// See `ssd_latency`.
    #[serde(default = "default_backing_latency")]
    pub backing_latency: String,
    /// Cache this node lends each peer (`0`: none), as TLS NBD exports only the peer's
    /// certificate opens (needs `listen.tls` with a CA for client certificates).
    #[serde(default = "default_lend")]
    pub lend: String,
    /// The nodes this one may borrow cache from (each lends it `borrow`), by name.
    #[serde(default)]
    pub peers: Vec<String>,
    /// The most this node uses of each peer's lent cache (a store of that many bytes per
    /// peer; at most what the peer lends).
    #[serde(default = "default_lend")]
    pub borrow: String,
    /// This node's client credentials for its peers' lent cache (QEMU's client layout:
    /// ca-cert.pem, client-cert.pem with CN = this node's name, client-key.pem).
    pub peer_tls_dir: Option<std::path::PathBuf>,
    /// A directory every node can read after any node died (beside the backing store,
    /// on the shared storage): each node writes its cache snapshots to `<snapshots>/<name>`
    /// (instead of `prewarm.snapshot_dir`), and a node a vDisk moves to prewarms it from
    /// the snapshots of the node it came from (the Nutanix study's failover).
    pub snapshots: Option<std::path::PathBuf>,
    /// The peer that keeps this node's replica log: a write-back vDisk's client writes
    /// are on that node too before they are acknowledged (each vDisk's `replicate`, on
    /// by default once this is set), so losing either node loses no acknowledged write.
    pub replica: Option<String>,
    /// How big a replica log this node keeps for each peer that names it (`0`: none).
    #[serde(default = "default_lend")]
    pub replica_capacity: String,
    /// How long a write waits for its replica record before the peer counts as lost
    /// (writes then go through to the backing store once the cluster was told): the
    /// stall ceiling of a peer cut off the network. Default: the lease TTL.
    pub replica_timeout: Option<String>,
    /// How a vDisk's cache blocks move when the leader's allocation moves its shares
    /// between this node and its lenders (ELICA §3.6): `auto` (§3.6.3's latency-aware
    /// choice), `gradual`, `instant` or `off` (blocks stay until replaced).
    #[serde(default = "default_migration")]
    pub migration: String,
    /// Migrations that may start per second (§3.6.3's rate limit).
    #[serde(default = "default_migration_rate")]
    pub migration_rate: f64,
    /// Migrations that may start at once after a quiet spell.
    #[serde(default = "default_migration_burst")]
    pub migration_burst: u32,
    /// Instant Migration: blocks per copy job (one in flight per vDisk).
    #[serde(default = "default_migration_batch")]
    pub migration_batch: u64,
    /// The leader keeps its last allocation unless a new one lowers Eq. 4's objective by
    /// at least this fraction (`cachevisor_cluster::hysteresis`; 0: ELICA's re-solve as
    /// is).
    #[serde(default = "default_hysteresis")]
    pub hysteresis: f64,
}

fn default_hysteresis() -> f64 {
    cachevisor_cluster::hysteresis::DEFAULT_MIN_GAIN
}

fn default_migration() -> String {
    "auto".into()
}
fn default_migration_rate() -> f64 {
    cachevisor_cluster::migration_plan::PlanSettings::default().rate
}
fn default_migration_burst() -> u32 {
    cachevisor_cluster::migration_plan::PlanSettings::default().burst
}
fn default_migration_batch() -> u64 {
    64
}

fn default_lend() -> String {
    "0".into()
}

fn default_unit() -> String {
    "1MiB".into()
}
fn default_ideal() -> f64 {
    0.99
}
fn default_ssd_latency() -> String {
    "100us".into()
}
fn default_network_latency() -> String {
    "100us".into()
}
fn default_backing_latency() -> String {
    "5ms".into()
}

fn default_cluster() -> String {
    "default".into()
}
fn default_ttl() -> String {
    "3s".into()
}
fn default_margin() -> String {
    "250ms".into()
}
fn default_interval() -> String {
    "2s".into()
}

/// `[cluster]` checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSettings {
    /// This node's name.
    pub name: String,
    /// Its peer address.
    pub address: String,
    /// etcd's endpoints.
    pub etcd: Vec<String>,
    /// Key prefix, `/cachevisor/<cluster>/`.
    pub prefix: String,
    /// Lease, fencing and interval.
    pub timing: Timing,
    /// Allocation unit, bytes.
    pub unit_bytes: u64,
    /// Eq. 1's form.
    pub ideal: IdealForm,
    /// Eq. 3's latencies.
    pub lat: Latencies,
    /// Bytes lent to each peer.
    pub lend_bytes: u64,
    /// The peers this node borrows from, and how much of each.
    pub peers: Vec<String>,
    /// Bytes borrowed from each peer at most.
    pub borrow_bytes: u64,
    /// Client credentials for the peers.
    pub peer_tls_dir: Option<std::path::PathBuf>,
    /// The shared snapshot directory, every node's under its name.
    pub snapshots: Option<std::path::PathBuf>,
    /// The peer keeping this node's replica log.
    pub replica: Option<String>,
    /// Bytes of replica log kept for each peer naming this node.
    pub replica_capacity: u64,
    /// A replica record's deadline, ms.
    pub replica_timeout_ms: u64,
    /// The migration planner's settings (`None`: `migration = "off"`).
    pub migration: Option<cachevisor_cluster::migration_plan::PlanSettings>,
    /// Instant Migration's blocks per copy job.
    pub migration_batch: u64,
    /// The allocation's hysteresis (least relative gain).
    pub hysteresis: f64,
}

impl ClusterSettings {
    /// Where `node` writes its snapshots, when the cluster shares them.
    pub fn snapshots_of(&self, node: &str) -> Option<std::path::PathBuf> {
        self.snapshots.as_ref().map(|d| d.join(node))
    }
}

fn ms(key: &str, v: &str) -> Result<u64, String> {
    parse_duration_ns(v).map(|ns| ns / 1_000_000).map_err(|e| format!("cluster.{key}: {e}"))
}

pub(crate) fn check_name(key: &str, v: &str) -> Result<(), String> {
    let ok =
        !v.is_empty() && v.len() <= 63 && v.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!("cluster.{key}: `{}` must be 1 to 63 letters, digits, `-`, `_` or `.`", crate::log_safe(v)))
    }
}

impl ClusterConfig {
    /// Checks every key.
    pub fn check(&self) -> Result<ClusterSettings, String> {
        check_name("name", &self.name)?;
        check_name("cluster", &self.cluster)?;
        self.address
            .parse::<std::net::SocketAddr>()
            .map_err(|e| format!("cluster.address: `{}` is not host:port ({e})", crate::log_safe(&self.address)))?;
        if self.etcd.is_empty() {
            return Err("cluster.etcd: give at least one etcd endpoint (`http://HOST:2379`)".into());
        }
        for e in &self.etcd {
            let u = url::Url::parse(e).map_err(|x| format!("cluster.etcd: `{}`: {x}", crate::log_safe(e)))?;
            if u.scheme() != "http" || u.host().is_none() || u.port().is_none() {
                return Err(format!("cluster.etcd: `{}` must be http://HOST:PORT", crate::log_safe(e)));
            }
        }
        let ttl = ms("lease_ttl", &self.lease_ttl)?;
        if !(2000..=60_000).contains(&ttl) || ttl % 1000 != 0 {
            return Err(format!("cluster.lease_ttl: `{}` must be whole seconds from 2s to 60s", self.lease_ttl));
        }
        let margin = ms("fence_margin", &self.fence_margin)?;
        if margin < 50 || margin * 4 > ttl {
            return Err(format!(
                "cluster.fence_margin: `{}` must be at least 50ms and at most a quarter of lease_ttl",
                self.fence_margin
            ));
        }
        let interval = ms("interval", &self.interval)?;
        if !(100..=3_600_000).contains(&interval) {
            return Err(format!("cluster.interval: `{}` is outside 100ms to 1h", self.interval));
        }
        let unit_bytes = parse_size(&self.unit).map_err(|e| format!("cluster.unit: {e}"))?;
        if !(4096..=(1 << 30)).contains(&unit_bytes) || !unit_bytes.is_power_of_two() {
            return Err(format!("cluster.unit: `{}` must be a power of two from 4KiB to 1GiB", self.unit));
        }
        if !(self.ideal > 0.0 && self.ideal <= 1.0) {
            return Err(format!("cluster.ideal: {} is not a fraction of reuses in (0, 1]", self.ideal));
        }
        let us = |key: &str, v: &str| -> Result<f64, String> {
            let ns = parse_duration_ns(v).map_err(|e| format!("cluster.{key}: {e}"))?;
            if !(1_000..=10_000_000_000).contains(&ns) {
                return Err(format!("cluster.{key}: `{v}` is outside 1us to 10s"));
            }
            Ok(ns as f64 / 1000.0)
        };
        let ssd = us("ssd_latency", &self.ssd_latency)?;
        let lat = Latencies {
            ssd_local_us: ssd,
            ssd_remote_us: ssd,
            network_us: us("network_latency", &self.network_latency)?,
            hdd_us: us("backing_latency", &self.backing_latency)?,
        };
        let lend_bytes = parse_size(&self.lend).map_err(|e| format!("cluster.lend: {e}"))?;
        if lend_bytes % unit_bytes != 0 || lend_bytes > 1 << 50 {
            return Err(format!("cluster.lend: `{}` is not whole units of {} (at most 1PiB)", self.lend, self.unit));
        }
        let borrow_bytes = parse_size(&self.borrow).map_err(|e| format!("cluster.borrow: {e}"))?;
        if borrow_bytes % unit_bytes != 0 || borrow_bytes > 1 << 50 {
            return Err(format!(
                "cluster.borrow: `{}` is not whole units of {} (at most 1PiB)",
                self.borrow, self.unit
            ));
        }
        for p in &self.peers {
            check_name("peers", p)?;
            if *p == self.name {
                return Err(format!("cluster.peers: `{p}` is this node"));
            }
        }
        if self.peers.len() > 64 {
            return Err("cluster.peers: at most 64".into());
        }
        if borrow_bytes > 0 && !self.peers.is_empty() && self.peer_tls_dir.is_none() {
            return Err("cluster.peer_tls_dir: borrowing from peers needs this node's client certificate (a directory with ca-cert.pem, client-cert.pem, client-key.pem)".into());
        }
        if let Some(r) = &self.replica {
            check_name("replica", r)?;
            if *r == self.name {
                return Err(format!("cluster.replica: `{r}` is this node: a replica is kept by another one"));
            }
            if self.peer_tls_dir.is_none() {
                return Err("cluster.peer_tls_dir: a replica log on a peer needs this node's client certificate (a directory with ca-cert.pem, client-cert.pem, client-key.pem)".into());
            }
        }
        let replica_capacity =
            parse_size(&self.replica_capacity).map_err(|e| format!("cluster.replica_capacity: {e}"))?;
        if replica_capacity != 0 && !(1 << 20..=1 << 40).contains(&replica_capacity) {
            return Err(format!("cluster.replica_capacity: `{}` must be 0 or 1MiB to 1TiB", self.replica_capacity));
        }
        let replica_timeout_ms = match &self.replica_timeout {
            None => ttl,
            Some(v) => {
                let t = ms("replica_timeout", v)?;
                if !(100..=ttl).contains(&t) {
                    return Err(format!("cluster.replica_timeout: `{v}` must be from 100ms to lease_ttl"));
                }
                t
            }
        };
        use cachevisor_cluster::migration_plan::{PlanSettings, SchemeChoice};
        let scheme = match self.migration.as_str() {
            "auto" => Some(None),
            "gradual" => Some(Some(SchemeChoice::Gradual)),
            "instant" => Some(Some(SchemeChoice::Instant)),
            "off" => None,
            other => {
                return Err(format!(
                    "cluster.migration: `{}` is not auto, gradual, instant or off",
                    crate::log_safe(other)
                ))
            }
        };
        let migration = match scheme {
            Some(scheme) => {
                let p = PlanSettings {
                    rate: self.migration_rate,
                    burst: self.migration_burst,
                    scheme,
                    ..PlanSettings::default()
                };
                p.validate().map_err(|e| format!("cluster.{}", e.replace("migration.", "migration_")))?;
                Some(p)
            }
            None => None,
        };
        if !(1..=4096).contains(&self.migration_batch) {
            return Err(format!("cluster.migration_batch: {} is outside 1 to 4096 blocks", self.migration_batch));
        }
        cachevisor_cluster::hysteresis::validate(self.hysteresis).map_err(|e| format!("cluster.{e}"))?;
        Ok(ClusterSettings {
            migration,
            migration_batch: self.migration_batch,
            hysteresis: self.hysteresis,
            name: self.name.clone(),
            address: self.address.clone(),
            etcd: self.etcd.clone(),
            prefix: format!("/cachevisor/{}/", self.cluster),
            timing: Timing { lease_ttl_ms: ttl, margin_ms: margin, interval_ms: interval },
            unit_bytes,
            ideal: if self.ideal >= 1.0 { IdealForm::Max } else { IdealForm::Percentile(self.ideal) },
            lat,
            lend_bytes,
            peers: if borrow_bytes > 0 { self.peers.clone() } else { Vec::new() },
            borrow_bytes,
            peer_tls_dir: self.peer_tls_dir.clone(),
            snapshots: self.snapshots.clone(),
            replica: self.replica.clone(),
            replica_capacity,
            replica_timeout_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &str) -> Result<ClusterSettings, String> {
        let text = format!("name = \"a\"\naddress = \"10.0.0.1:10809\"\netcd = [\"http://10.0.0.9:2379\"]\n{extra}");
        toml::from_str::<ClusterConfig>(&text).map_err(|e| e.to_string())?.check()
    }

    #[test]
    fn defaults_and_every_bad_key_named() {
        let s = cfg("").unwrap();
        assert_eq!(s.prefix, "/cachevisor/default/");
        assert_eq!(s.migration.map(|m| (m.rate, m.burst, m.scheme)), Some((4.0, 8, None)), "auto by default");
        assert_eq!(s.migration_batch, 64);
        assert_eq!(cfg("migration = \"off\"").unwrap().migration, None);
        assert_eq!(cfg("hysteresis = 0.5").unwrap().hysteresis, 0.5, "the maximum");
        assert_eq!(cfg("").unwrap().hysteresis, 0.0, "off by default");
        let g = cfg("migration = \"gradual\"\nmigration_rate = 0.5").unwrap().migration.unwrap();
        assert_eq!((g.rate, g.scheme), (0.5, Some(cachevisor_cluster::migration_plan::SchemeChoice::Gradual)));
        // The replica log's bounds, both ends in.
        for (v, bytes) in [("0", 0), ("1MiB", 1 << 20), ("1TiB", 1 << 40)] {
            assert_eq!(cfg(&format!("replica_capacity = \"{v}\"")).unwrap().replica_capacity, bytes);
        }
        assert_eq!(cfg("replica_timeout = \"100ms\"").unwrap().replica_timeout_ms, 100);
        assert_eq!(cfg("replica_timeout = \"3s\"").unwrap().replica_timeout_ms, 3000);
        assert_eq!(s.timing, Timing { lease_ttl_ms: 3000, margin_ms: 250, interval_ms: 2000 });
        for (extra, key) in [
            ("lease_ttl = \"1s\"", "cluster.lease_ttl"),
            ("lease_ttl = \"2500ms\"", "cluster.lease_ttl"),
            ("fence_margin = \"1s\"", "cluster.fence_margin"),
            ("interval = \"1ms\"", "cluster.interval"),
            ("cluster = \"a/b\"", "cluster.cluster"),
            ("unit = \"3KiB\"", "cluster.unit"),
            ("ideal = 0.0", "cluster.ideal"),
            ("network_latency = \"0s\"", "cluster.network_latency"),
            ("backing_latency = \"soon\"", "cluster.backing_latency"),
            ("lend = \"1500KiB\"", "cluster.lend"),
            ("peers = [\"a\"]\nborrow = \"1MiB\"\npeer_tls_dir = \"x\"", "cluster.peers"),
            ("peers = [\"b\"]\nborrow = \"1MiB\"", "cluster.peer_tls_dir"),
            ("borrow = \"3KiB\"", "cluster.borrow"),
            ("replica = \"a\"\npeer_tls_dir = \"x\"", "cluster.replica"),
            ("replica = \"b\"", "cluster.peer_tls_dir"),
            ("replica_capacity = \"4KiB\"", "cluster.replica_capacity"),
            ("replica_timeout = \"10s\"", "cluster.replica_timeout"),
            ("replica_capacity = \"2TiB\"", "cluster.replica_capacity"),
            ("replica_timeout = \"99ms\"", "cluster.replica_timeout"),
            ("migration = \"fast\"", "cluster.migration"),
            ("migration_rate = 0.0", "cluster.migration_rate"),
            ("migration_burst = 0", "cluster.migration_burst"),
            ("migration_rate = 1e9", "cluster.migration_rate"),
            ("migration_burst = 100000", "cluster.migration_burst"),
            ("migration_batch = 0", "cluster.migration_batch"),
            ("hysteresis = 0.9", "cluster.hysteresis"),
            ("hysteresis = -0.01", "cluster.hysteresis"),
            ("migration_batch = 5000", "cluster.migration_batch"),
        ] {
            let e = cfg(extra).unwrap_err();
            assert!(e.contains(key), "{extra}: {e}");
        }
        let bad_name = toml::from_str::<ClusterConfig>("name = \"\"\naddress = \"1.2.3.4:1\"\netcd = [\"http://h:1\"]")
            .unwrap()
            .check()
            .unwrap_err();
        assert!(bad_name.contains("cluster.name"), "{bad_name}");
        let bad_etcd = toml::from_str::<ClusterConfig>("name = \"a\"\naddress = \"1.2.3.4:1\"\netcd = [\"https://h\"]")
            .unwrap()
            .check()
            .unwrap_err();
        assert!(bad_etcd.contains("cluster.etcd"), "{bad_etcd}");
        let no_etcd =
            toml::from_str::<ClusterConfig>("name = \"a\"\naddress = \"1.2.3.4:1\"\netcd = []").unwrap().check();
        assert!(no_etcd.unwrap_err().contains("cluster.etcd"));
    }
}
