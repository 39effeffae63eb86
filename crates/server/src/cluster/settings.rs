//! `[cluster]`: this node's name and the address its peers reach it at, the etcd
//! endpoints holding the cluster's state, the cluster's key prefix, the lease TTL (a node
//! that stops renewing is dead after it), the fencing margin and the leader's interval.
//! Checked into numbers with messages that name the key. No section: the single-host
//! daemon.

use cachevisor_cluster::membership::Timing;
use cachevisor_trace::units::parse_duration_ns;
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
    /// The leader's allocation interval.
    #[serde(default = "default_interval")]
    pub interval: String,
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
}

fn ms(key: &str, v: &str) -> Result<u64, String> {
    parse_duration_ns(v).map(|ns| ns / 1_000_000).map_err(|e| format!("cluster.{key}: {e}"))
}

fn check_name(key: &str, v: &str) -> Result<(), String> {
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
        Ok(ClusterSettings {
            name: self.name.clone(),
            address: self.address.clone(),
            etcd: self.etcd.clone(),
            prefix: format!("/cachevisor/{}/", self.cluster),
            timing: Timing { lease_ttl_ms: ttl, margin_ms: margin, interval_ms: interval },
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
        assert_eq!(s.timing, Timing { lease_ttl_ms: 3000, margin_ms: 250, interval_ms: 2000 });
        for (extra, key) in [
            ("lease_ttl = \"1s\"", "cluster.lease_ttl"),
            ("lease_ttl = \"2500ms\"", "cluster.lease_ttl"),
            ("fence_margin = \"1s\"", "cluster.fence_margin"),
            ("interval = \"1ms\"", "cluster.interval"),
            ("cluster = \"a/b\"", "cluster.cluster"),
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
