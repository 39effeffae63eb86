//! The daemon's TOML configuration, validated with messages that name the key, and the
//! embedded default that makes `cachevisor serve` alone start a working demo under ./var.
//!
//! Every setting, with its default and range, is in [`REFERENCE`] (tested to parse and to
//! name every key), which `cachevisor serve --print-default-config` prints.

use cachevisor_trace::units::parse_size;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
mod cache_section;
pub mod cluster_section;
mod listen_section;
mod prewarm_section;
mod reference;
#[cfg(test)]
mod tests;
mod vdisk_section;
pub mod vssd_section;

use listen_section::check_group_mode;

pub use cache_section::{CacheConfig, CacheDevice};
pub use cachevisor_store::backing::DirectIo;
pub use listen_section::{unix_group, unix_mode, ApiConfig, ListenConfig};
pub use prewarm_section::{LogConfig, PrewarmConfig, SnapshotSchedule};
pub use reference::{default_with_reference, DEFAULT, REFERENCE};
pub use vdisk_section::VdiskConfig;

pub use cachevisor_policy::controller::{check_share, MAX_SHARE};

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Cache.
    pub cache: CacheConfig,
    /// Listeners.
    #[serde(default)]
    pub listen: ListenConfig,
    /// HTTP API (off when absent).
    pub api: Option<ApiConfig>,
    /// Exports.
    #[serde(default)]
    pub vdisk: Vec<VdiskConfig>,
    /// Cache-state snapshots and prewarming (defaults when absent).
    #[serde(default)]
    pub prewarm: PrewarmConfig,
    /// SymFlex's elastic vSSDs (none when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vssd: Option<crate::config::vssd_section::VssdConfig>,
    /// A node of an HCI cluster coordinated through etcd (single host when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<crate::config::cluster_section::ClusterConfig>,
    /// What the daemon logs.
    #[serde(default)]
    pub log: LogConfig,
}
/// Numbers resolved from the strings.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The `[cache]` settings shared with the simulator, checked once
    /// (`cachevisor_policy::cache_settings`).
    pub cache: cachevisor_policy::cache_settings::CacheSettings,
    /// Slots (`cache.size`).
    pub slots: u64,
    /// Slots the engine and the metadata are laid out for (`cache.max_size`): those past
    /// `slots` are withheld until a reload grows the cache.
    pub max_slots: u64,
    /// Slots on each cache device, in store order: `slots` on `cache.path`, then each
    /// `[[cache.device]]`'s (one entry without any).
    pub device_slots: Vec<u64>,
    /// Dirty data mirrored over two devices (`cache.mirror_dirty`, default with two or
    /// more devices).
    pub mirror_dirty: bool,
    /// The RAM tier's blocks (`cache.ram`; 0: none).
    pub ram_slots: u64,
    /// Allocation interval in ns.
    pub interval_ns: u64,
    /// A connection reader's poll before it sleeps, ns (`listen.poll`).
    pub poll_ns: u64,
    /// `listen.handshake_timeout`, ns.
    pub handshake_timeout_ns: u64,
    /// `cache.seal_after`, ns (0: never sealed).
    pub seal_after_ns: u64,
    /// `api.idle_timeout`, ns (0 without an `[api]` section).
    pub api_idle_timeout_ns: u64,
}

impl Resolved {
    /// Slots the engine manages and the metadata is laid out for: every device's with
    /// several, else `max_slots`.
    pub fn engine_slots(&self) -> u64 {
        if self.device_slots.len() > 1 {
            self.device_slots.iter().sum()
        } else {
            self.max_slots
        }
    }
}

impl Config {
    /// Parses TOML text (`origin` names it in errors); relative paths are relative to
    /// `base`.
    pub fn parse(text: &str, origin: &str, base: &Path) -> Result<Config, String> {
        let mut c: Config = toml::from_str(text).map_err(|e| format!("{origin}: {e}"))?;
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        fix(&mut c.cache.path);
        c.cache.device.iter_mut().for_each(|d| fix(&mut d.path));
        if let Some(m) = c.cache.metadata.as_mut() {
            fix(m);
        }
        for p in [
            &mut c.listen.unix,
            &mut c.listen.vhost_user,
            &mut c.listen.tls_dir,
            &mut c.listen.tls_cert,
            &mut c.listen.tls_key,
            &mut c.listen.tls_ca,
        ]
        .into_iter()
        .flatten()
        {
            fix(p);
        }
        if let Some(d) = c.prewarm.snapshot_dir.as_mut() {
            fix(d);
        }
        if let Some(d) = c.cluster.as_mut().and_then(|c| c.peer_tls_dir.as_mut()) {
            fix(d);
        }
        if let Some(d) = c.cluster.as_mut().and_then(|c| c.snapshots.as_mut()) {
            fix(d);
        }
        if let Some(d) = c.prewarm.from.as_mut() {
            fix(d);
        }
        c.vdisk.iter_mut().filter(|v| !cachevisor_store::backing::is_uri(&v.backing)).for_each(|v| fix(&mut v.backing));
        if let Some(v) = c.vssd.as_mut() {
            if let Some(d) = v.swap_dir.as_mut() {
                fix(d);
            }
            v.device.iter_mut().filter_map(|d| d.control.as_mut()).for_each(fix);
        }
        Ok(c)
    }

    /// Reads a file.
    pub fn load(path: &Path) -> Result<Config, String> {
        let text = cachevisor_files::bounded_read::read_to_string(path, cachevisor_files::bounded_read::CONFIG_CAP)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Config::parse(&text, &path.display().to_string(), path.parent().unwrap_or(Path::new(".")))
    }

    /// Slots on each cache device (`slots` on `cache.path` first); an error names the
    /// device and key.
    fn device_slots(&self, slots: u64, block_size: u64) -> Result<Vec<u64>, String> {
        let mut all = vec![slots];
        for (i, d) in self.cache.device.iter().enumerate() {
            let at = format!("cache.device[{i}]");
            let bytes = parse_size(&d.size).map_err(|e| format!("{at}.size: {e}"))?;
            if bytes < block_size || !bytes.is_multiple_of(block_size) {
                return Err(format!(
                    "{at}.size: {bytes} bytes is not a whole number of blocks of {block_size} bytes (at least one)"
                ));
            }
            if d.path == self.cache.path {
                return Err(format!("{at}.path: {} is cache.path itself", d.path.display()));
            }
            if let Some(j) = self.cache.device[..i].iter().position(|o| o.path == d.path) {
                return Err(format!("{at}.path: {} is cache.device[{j}]'s too", d.path.display()));
            }
            all.push(bytes / block_size);
        }
        Ok(all)
    }

    /// Checks every value; the message names the key.
    pub fn resolve(&self) -> Result<Resolved, String> {
        crate::log_filter::check(&self.log.level).map_err(|e| format!("log.level: `{}`: {e}", self.log.level))?;
        let settings = cachevisor_policy::cache_settings::CacheSettings::check(&self.cache.keys())?;
        let (cache_bytes, block_size) = (settings.cache_bytes, settings.block_size);
        let slots = cache_bytes / block_size;
        // The cache file is whole blocks (the simulator rounds a size down).
        if !cache_bytes.is_multiple_of(block_size) {
            return Err(format!(
                "cache.size: {cache_bytes} bytes is not a multiple of block_size ({block_size}): use {} or {}",
                cache_bytes / block_size * block_size,
                cache_bytes.div_ceil(block_size) * block_size
            ));
        }
        settings.engine_config(slots)?;
        if !(1..=1_000_000).contains(&self.cache.error_threshold) {
            return Err(format!("cache.error_threshold: {} is outside 1 to 1000000", self.cache.error_threshold));
        }
        let interval = cachevisor_trace::units::parse_duration_ns(&self.cache.interval)
            .map_err(|e| format!("cache.interval: {e}"))?;
        if interval < 1_000_000 {
            return Err("cache.interval: at least 1ms".into());
        }
        self.cache.congestion_thresholds()?;
        self.cache.write_budget()?;
        let seal_after_ns = cachevisor_trace::units::parse_duration_ns(&self.cache.seal_after)
            .map_err(|e| format!("cache.seal_after: {e}"))?;
        if seal_after_ns != 0 && !(1_000_000_000..=3_600_000_000_000).contains(&seal_after_ns) {
            return Err(format!("cache.seal_after: `{}` is outside 1s to 1h (or 0s: never)", self.cache.seal_after));
        }
        if self.listen.tcp.is_none() && self.listen.unix.is_none() && self.listen.vhost_user.is_none() {
            return Err("listen: give `tcp`, `unix` and/or `vhost_user`".into());
        }

        if let Some(t) = &self.listen.tcp {
            t.parse::<SocketAddr>().map_err(|e| format!("listen.tcp: `{t}`: {e}"))?;
        }
        let mode = unix_mode(&self.listen.unix_mode)?;
        if let Some(g) = &self.listen.unix_group {
            // The name is looked up at start, on the host that binds the socket.
            check_group_mode(g, mode)?;
        }
        self.listen.tls_credentials()?;
        let poll_ns =
            cachevisor_trace::units::parse_duration_ns(&self.listen.poll).map_err(|e| format!("listen.poll: {e}"))?;
        if poll_ns > 1_000_000 {
            return Err(format!("listen.poll: `{}` is over 1ms (polling longer wastes CPU)", self.listen.poll));
        }
        if !(1..=65_536).contains(&self.listen.max_connections) {
            return Err(format!("listen.max_connections: {} is outside 1 to 65536", self.listen.max_connections));
        }
        let handshake_ns = cachevisor_trace::units::parse_duration_ns(&self.listen.handshake_timeout)
            .map_err(|e| format!("listen.handshake_timeout: {e}"))?;
        if !(100_000_000..=600_000_000_000).contains(&handshake_ns) {
            return Err(format!(
                "listen.handshake_timeout: `{}` is outside 100ms to 10min",
                self.listen.handshake_timeout
            ));
        }
        if let Some(c) = &self.cluster {
            let s = c.check()?;
            if s.lend_bytes > 0 || s.replica_capacity > 0 {
                let ca = self.listen.tls_credentials()?.and_then(|c| c.ca);
                if ca.is_none() {
                    let key = if s.lend_bytes > 0 { "cluster.lend" } else { "cluster.replica_capacity" };
                    return Err(format!("{key}: lent cache and replica logs are served over TLS to each peer's certificate only: set listen.tls (\"on\" or \"require\") with a CA for client certificates (listen.tls_dir's ca-cert.pem or listen.tls_ca)"));
                }
            }
            if s.unit_bytes % block_size != 0 {
                return Err(format!(
                    "cluster.unit: `{}` is not a multiple of cache.block_size ({block_size} B)",
                    c.unit
                ));
            }
        }
        let mut api_idle_ns = 0;
        if let Some(a) = &self.api {
            a.listen.parse::<SocketAddr>().map_err(|e| format!("api.listen: `{}`: {e}", a.listen))?;
            api_idle_ns = cachevisor_trace::units::parse_duration_ns(&a.idle_timeout)
                .map_err(|e| format!("api.idle_timeout: {e}"))?;
            if !(1_000_000_000..=3_600_000_000_000).contains(&api_idle_ns) {
                return Err(format!("api.idle_timeout: `{}` is outside 1s to 1h", a.idle_timeout));
            }
            if a.tls && self.listen.tls == cachevisor_nbd::tls::TlsMode::Off {
                return Err("api.tls: HTTPS uses [listen]'s certificate and key: set listen.tls (\"on\" or \"require\") and listen.tls_dir".into());
            }
            if let Some(t) = &a.token {
                if !(16..=4096).contains(&t.len()) || !t.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err("api.token: use 16 to 4096 visible ASCII characters (no spaces, tabs or newlines: clients send it in a header)".into());
                }
            }
        }
        if self.vdisk.is_empty() {
            return Err("vdisk: no [[vdisk]] to serve".into());
        }
        self.prewarm.resolve(block_size)?;
        for (i, v) in self.vdisk.iter().enumerate() {
            let at = format!("vdisk[{i}] ({})", v.name);
            if self.vdisk[..i].iter().any(|o| o.name == v.name) {
                return Err(format!("{at}.name: used twice"));
            }
            v.check(&at, block_size)?;
            if let Some(min) = v.min.as_deref().map(parse_size).transpose()? {
                if min > cache_bytes {
                    return Err(format!("{at}.min: {min} bytes is more than the cache ({cache_bytes} bytes)"));
                }
            }
        }
        if let Some(v) = &self.vssd {
            let plan = v.resolve()?;
            if let Some(d) = plan.devices.iter().find(|d| self.vdisk.iter().any(|v| v.name == d.name)) {
                return Err(format!("vssd.device ({}).name: a vDisk has that name", d.name));
            }
        }
        let mins: u64 = self.vdisk.iter().filter_map(|v| v.min.as_deref().and_then(|m| parse_size(m).ok())).sum();
        if mins > cache_bytes {
            return Err(format!(
                "vdisk.min: the minimums add up to {mins} bytes, more than the cache ({cache_bytes} bytes)"
            ));
        }
        let max_slots = match &self.cache.max_size {
            None => slots,
            Some(m) => {
                let max = parse_size(m).map_err(|e| format!("cache.max_size: {e}"))?;
                if max < cache_bytes || !max.is_multiple_of(block_size) {
                    return Err(format!(
                        "cache.max_size: {max} bytes must be at least cache.size ({cache_bytes}) and a multiple of block_size ({block_size})"
                    ));
                }
                if max > cache_bytes && (self.vssd.is_some() || self.cluster.is_some()) {
                    return Err("cache.max_size: a cache that grows online cannot hold a vSSD region ([vssd]) or lend to a cluster ([cluster]) (both are laid out after its blocks)".into());
                }
                settings.engine_config(max / block_size).map_err(|e| format!("cache.max_size: {e}"))?;
                max / block_size
            }
        };
        let device_slots = self.device_slots(slots, block_size)?;
        if device_slots.len() > 1 {
            settings
                .engine_config(slots)
                .map(|c| c.over_devices(&device_slots))
                .and_then(|c| c.validate())
                .map_err(|e| format!("cache.device: {e}"))?;
            if max_slots > slots {
                return Err("cache.max_size: a cache over several devices ([[cache.device]]) is not resized online yet: leave max_size unset".into());
            }
            if self.cluster.is_some() {
                return Err("cache.device: a cluster node ([cluster]) uses one cache device yet".into());
            }
            if self.vssd.is_some() {
                return Err("cache.device: a cache with a vSSD region ([vssd]) uses one cache device yet".into());
            }
        }
        let mirror_dirty = match (self.cache.mirror_dirty, device_slots.len() > 1) {
            (Some(true), false) => {
                return Err("cache.mirror_dirty: mirroring dirty data needs two or more cache devices (add a [[cache.device]]), or leave it unset".into())
            }
            (Some(m), _) => m,
            (None, several) => several,
        };
        let ram_slots = match &self.cache.ram {
            None => 0,
            Some(s) => {
                let bytes = parse_size(s).map_err(|e| format!("cache.ram: {e}"))?;
                if bytes != 0 && bytes < block_size {
                    return Err(format!("cache.ram: {s} holds no block of block_size ({block_size} bytes)"));
                }
                if bytes / block_size >= u64::from(u32::MAX) {
                    return Err(format!("cache.ram: {s} is more than 2^32 blocks of {block_size} bytes"));
                }
                let cache: u64 = device_slots.iter().sum::<u64>().max(max_slots);
                if bytes / block_size > cache {
                    return Err(format!(
                        "cache.ram: {s} is more than the cache ({cache} blocks of {block_size} bytes): the RAM tier holds copies of cached blocks only"
                    ));
                }
                bytes / block_size
            }
        };
        if self.cache.ram_fill.is_some() && ram_slots == 0 {
            return Err("cache.ram_fill: there is no RAM tier to fill (set cache.ram)".into());
        }
        Ok(Resolved {
            cache: settings,
            slots,
            max_slots,
            device_slots,
            mirror_dirty,
            ram_slots,
            interval_ns: interval,
            seal_after_ns,
            poll_ns,
            handshake_timeout_ns: handshake_ns,
            api_idle_timeout_ns: api_idle_ns,
        })
    }
}
