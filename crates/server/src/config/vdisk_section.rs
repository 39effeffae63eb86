//! `[[vdisk]]`: one export, its backing store, its share of the cache and its write
//! policy, checked with messages that name the vDisk.

use super::cache_section::one;
use cachevisor_engine::{AdmissionPolicy, WritePolicy};
use cachevisor_policy::controller::check_share;
use cachevisor_trace::units::parse_size;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `[[vdisk]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VdiskConfig {
    /// Export name.
    pub name: String,
    /// Backing file.
    pub backing: PathBuf,
    /// Size of the backing: creates a missing backing file; an existing one must have it.
    pub size: Option<String>,
    /// Allow growing an existing backing file to `size` (never shrunk).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub grow: bool,
    /// Share of the cache.
    #[serde(default = "one")]
    pub weight: f64,
    /// Write policy.
    pub write_policy: Option<WritePolicy>,
    /// Target share of hit throughput (symflex-proportional).
    #[serde(default = "one")]
    pub ratio: f64,
    /// Smallest cache share (`64MiB`).
    pub min: Option<String>,
    /// Contiguous run (`4MiB`) after which the stream stops taking cache slots.
    pub sequential_cutoff: Option<String>,
    /// Which read misses take a cache slot: `all` (unset), `second-hit`, `second-hit:N`,
    /// `probability:P`, `write-budget:RATE` (the engine's `block_admission.rs`,
    /// `write_budget.rs`); a rejected miss is read around the cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionPolicy>,
    /// Which write misses take a slot (a rejected one is written around the cache);
    /// unset: as `admission`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_admission: Option<AdmissionPolicy>,
    /// Prefetch for sequential readers: `none` (unset), `obl`, `amp`, `amp:N` (the
    /// engine's `block_prefetch.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<cachevisor_engine::PrefetchPolicy>,
    /// I/O classes (`[[vdisk.class]]`: match by size, range, op; pinned, max_occupancy,
    /// admission; the engine's `io_class.rs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub class: Vec<cachevisor_engine::IoClassSection>,
    /// Client certificates that may open this export over TLS (`tls_authz.rs`: "CN=host-a",
    /// "CN=h,O=tenant1", "DNS:h.example", "IP:10.0.0.2", "URI:…", "email:…", "*"); empty:
    /// any client the listener lets in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// On a cluster node with `cluster.replica`: whether this vDisk's client writes are
    /// on the replica peer too before they are acknowledged (default: yes; `false` keeps
    /// its write-back data on this node only, and another node then refuses to take it
    /// over from the backing store after this one died).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicate: Option<bool>,
    /// Who may open it over vhost-user-blk: "owner" (0600), "group:NAME" (0660), "none";
    /// unset: the listener's mode and group, or none for an export with `allow` or under
    /// `listen.tls = "require"` (`vhost_access.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost_user: Option<String>,
}

impl VdiskConfig {
    /// Its read and write misses' admission (unset: every miss).
    pub fn admissions(&self) -> (AdmissionPolicy, AdmissionPolicy) {
        let read = self.admission.unwrap_or_default();
        (read, self.write_admission.unwrap_or(read))
    }

    /// Whether this vDisk's writes go to the replica log on a node that keeps one.
    pub fn replicates(&self) -> bool {
        self.replicate != Some(false)
    }

    /// Checks every value for a cache of `block_size` blocks; the message starts with `at`
    /// and names the key.
    pub fn check(&self, at: &str, block_size: u64) -> Result<(), String> {
        let v = self;
        if v.name.is_empty() || v.name.len() > 4096 {
            return Err(format!("{at}.name: must be 1 to 4096 bytes"));
        }
        check_share(&format!("{at}.weight"), v.weight)?;
        let (read, write) = v.admissions();
        AdmissionPolicy::check_pair(read, write).map_err(|e| format!("{at}: {e}"))?;
        cachevisor_engine::IoClassSection::resolve_all(&v.class).map_err(|e| format!("{at}.{e}"))?;
        for (key, val) in [("size", &v.size), ("min", &v.min), ("sequential_cutoff", &v.sequential_cutoff)] {
            if let Some(s) = val {
                parse_size(s).map_err(|e| format!("{at}.{key}: {e}"))?;
            }
        }
        if let Some(size) = v.size.as_deref().map(parse_size).transpose()? {
            if size == 0 || !size.is_multiple_of(512) {
                return Err(format!("{at}.size: {size} bytes is not a positive multiple of 512 (a sector)"));
            }
            cachevisor_engine::check_disk_size(size, block_size).map_err(|e| format!("{at}.size: {e}"))?;
        }
        check_share(&format!("{at}.ratio"), v.ratio)?;
        cachevisor_nbd::tls_authz::check(&v.allow).map_err(|e| format!("{at}.allow: {e}"))?;
        crate::vhost_access::check(v.vhost_user.as_deref(), &format!("{at}.vhost_user"))?;
        if v.replicate == Some(true) && v.name.len() > cachevisor_cluster::replica_record::MAX_NAME {
            return Err(format!("{at}.replicate: a replicated vDisk's name must be at most 400 bytes"));
        }
        if !cachevisor_store::backing::is_uri(&v.backing) && !v.backing.exists() && v.size.is_none() {
            return Err(format!("{at}.backing: {} does not exist (give `size` to create it)", v.backing.display()));
        }
        Ok(())
    }
}
