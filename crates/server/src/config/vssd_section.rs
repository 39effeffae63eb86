//! `[vssd]` and its `[[vssd.device]]`s: the region carved out of the cache store file
//! after the cache's blocks, its block size and deflate grace, where inactive vSSDs are
//! swapped out, and the vSSDs registered at start with SymFlex's ⟨M, C, P⟩ (§2.4.1).
//! Checked into numbers with messages that name the key.

use cachevisor_trace::units::{parse_duration_ns, parse_size};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `[vssd]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VssdConfig {
    /// Bytes of the region (whole blocks); with `budget = "shared"`, the most of the
    /// cache's SSD it may take.
    pub size: String,
    /// `own`: the region is a range of its own after the cache's blocks; `shared`: it
    /// lives in the cache's blocks, taking them from the host-managed cache as its vSSDs
    /// need them (up to `size`) and giving them back as they shrink — one SSD budget.
    #[serde(default = "default_budget")]
    pub budget: String,
    /// Block size (SymFlex's default 1 MiB).
    #[serde(default = "default_block")]
    pub block_size: String,
    /// How long a guest has to give blocks back before the host picks them.
    #[serde(default = "default_grace")]
    pub deflate_grace: String,
    /// Secondary storage for inactive persistent vSSDs (default METADATA/vssd-swap).
    pub swap_dir: Option<PathBuf>,
    /// The allocator setting targets every interval (`none`, `symflex-weighted`,
    /// `symflex-proportional`).
    #[serde(default = "default_allocator")]
    pub allocator: String,
    /// How often it runs.
    #[serde(default = "default_interval")]
    pub interval: String,
    /// vSSDs registered at start.
    #[serde(default)]
    pub device: Vec<VssdDeviceConfig>,
}

/// `[[vssd.device]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VssdDeviceConfig {
    /// The NBD export name (unique among vDisks and vSSDs).
    pub name: String,
    /// M: the device's size, what its guest sees.
    pub max_size: String,
    /// C: the blocks it gets at registration.
    #[serde(default = "zero")]
    pub initial_size: String,
    /// P: its blocks and data outlive its VM.
    #[serde(default)]
    pub persist: bool,
    /// Client certificates that may open it over TLS (as a vDisk's `allow`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// The guest manager's control socket (default METADATA/NAME.vssd.sock).
    pub control: Option<PathBuf>,
    /// Who may open it over vhost-user-blk (as a vDisk's `vhost_user`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost_user: Option<String>,
    /// Its share of the region under `symflex-weighted`.
    #[serde(default = "one")]
    pub weight: f64,
    /// Its target share of the vSSDs' throughput under `symflex-proportional`.
    #[serde(default = "one")]
    pub ratio: f64,
}

fn default_budget() -> String {
    "own".into()
}
fn default_block() -> String {
    "1MiB".into()
}
fn default_grace() -> String {
    "30s".into()
}
fn zero() -> String {
    "0".into()
}
fn one() -> f64 {
    1.0
}
fn default_allocator() -> String {
    "none".into()
}
fn default_interval() -> String {
    "1s".into()
}

/// A device resolved to blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct Device {
    /// Name.
    pub name: String,
    /// M in blocks.
    pub max_blocks: u32,
    /// C in blocks.
    pub initial_blocks: u32,
    /// P.
    pub persist: bool,
    /// TLS access list.
    pub allow: Vec<String>,
    /// Control socket, if set.
    pub control: Option<PathBuf>,
    /// Its `vhost_user` setting.
    pub vhost_user: Option<String>,
    /// Weight and throughput ratio.
    pub share: Share,
}

/// `[vssd]` resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The region's shape.
    pub geometry: cachevisor_vssd::Geometry,
    /// Deflate grace, ns.
    pub grace_ns: u64,
    /// Swap directory, if set.
    pub swap_dir: Option<PathBuf>,
    /// Devices registered at start.
    pub devices: Vec<Device>,
    /// The allocator (`None`: targets are set through the API only).
    pub allocator: Option<String>,
    /// Its interval, ns.
    pub interval_ns: u64,
    /// The region shares the cache's blocks (`budget = "shared"`); `geometry` is then the
    /// most it may take, and [`Plan::region_geometry`] the whole cache in blocks.
    pub shared: bool,
}

impl Plan {
    /// The region's geometry in a cache store of `cache_bytes` in `cache_block`-byte
    /// slots: its own blocks, or — shared — every whole block of the cache (a vSSD block
    /// is a run of slots), checked.
    pub fn region_geometry(&self, cache_bytes: u64, cache_block: u64) -> Result<cachevisor_vssd::Geometry, String> {
        if !self.shared {
            return Ok(self.geometry);
        }
        let block = self.geometry.block_bytes;
        if !block.is_multiple_of(cache_block) {
            return Err(format!(
                "vssd.block_size: {block} bytes is not a whole number of the cache's {cache_block}-byte blocks (vssd.budget = \"shared\" carves vSSD blocks out of cache blocks)"
            ));
        }
        let blocks = cache_bytes / block;
        if blocks < u64::from(self.geometry.blocks) {
            return Err(format!(
                "vssd.size: {} bytes is more than the cache's {cache_bytes} (vssd.budget = \"shared\")",
                self.geometry.bytes()
            ));
        }
        cachevisor_vssd::Geometry::new(block, blocks as u32).map_err(|e| format!("vssd.block_size: {e}"))
    }
}

impl VssdConfig {
    /// Checks every value; errors name the key (`vssd.…`).
    pub fn resolve(&self) -> Result<Plan, String> {
        let block = parse_size(&self.block_size).map_err(|e| format!("vssd.block_size: {e}"))?;
        let size = parse_size(&self.size).map_err(|e| format!("vssd.size: {e}"))?;
        if size == 0 || !size.is_multiple_of(block) || size / block >= u64::from(u32::MAX) {
            return Err(format!("vssd.size: {size} bytes is not a positive whole number of {block}-byte blocks"));
        }
        let geometry = cachevisor_vssd::Geometry::new(block, (size / block) as u32)
            .map_err(|e| format!("vssd.block_size: {e}"))?;
        let grace_ns = parse_duration_ns(&self.deflate_grace).map_err(|e| format!("vssd.deflate_grace: {e}"))?;
        if !(1_000_000..=3_600_000_000_000).contains(&grace_ns) {
            return Err(format!("vssd.deflate_grace: `{}` is outside 1ms to 1h", self.deflate_grace));
        }
        let mut devices = Vec::new();
        for (i, d) in self.device.iter().enumerate() {
            let at = format!("vssd.device[{i}] ({})", d.name);
            crate::vhost_access::check(d.vhost_user.as_deref(), &format!("{at}.vhost_user"))?;
            let blocks = |key: &str, v: &str| -> Result<u32, String> {
                let b = parse_size(v).map_err(|e| format!("{at}.{key}: {e}"))?;
                if !b.is_multiple_of(block) {
                    return Err(format!("{at}.{key}: {b} bytes is not a whole number of {block}-byte blocks"));
                }
                u32::try_from(b / block).map_err(|_| format!("{at}.{key}: too large"))
            };
            let (max_blocks, initial_blocks) =
                (blocks("max_size", &d.max_size)?, blocks("initial_size", &d.initial_size)?);
            if max_blocks == 0 {
                return Err(format!("{at}.max_size: must be at least one block ({block} bytes)"));
            }
            if initial_blocks > max_blocks {
                return Err(format!("{at}.initial_size: more than max_size"));
            }
            if d.name.is_empty() || d.name.len() > cachevisor_vssd::lifecycle::MAX_NAME || d.name.contains('/') {
                return Err(format!("{at}.name: 1 to {} bytes, no `/`", cachevisor_vssd::lifecycle::MAX_NAME));
            }
            if devices.iter().any(|x: &Device| x.name == d.name) {
                return Err(format!("{at}.name: `{}` is used twice", d.name));
            }
            cachevisor_nbd::tls_authz::check(&d.allow).map_err(|e| format!("{at}.allow: {e}"))?;
            for (key, v) in [("weight", d.weight), ("ratio", d.ratio)] {
                if !(v > 0.0 && v.is_finite()) {
                    return Err(format!("{at}.{key}: {v} must be above 0"));
                }
            }
            devices.push(Device {
                name: d.name.clone(),
                max_blocks,
                initial_blocks,
                persist: d.persist,
                allow: d.allow.clone(),
                control: d.control.clone(),
                vhost_user: d.vhost_user.clone(),
                share: Share { weight: d.weight, ratio: d.ratio },
            });
        }
        let allocator = match self.allocator.as_str() {
            "none" => None,
            a if ALLOCATORS.contains(&a) => Some(a.to_string()),
            a => return Err(format!("vssd.allocator: `{a}` is not one of none, {}", ALLOCATORS.join(", "))),
        };
        let interval_ns = parse_duration_ns(&self.interval).map_err(|e| format!("vssd.interval: {e}"))?;
        if !(10_000_000..=3_600_000_000_000).contains(&interval_ns) {
            return Err(format!("vssd.interval: `{}` is outside 10ms to 1h", self.interval));
        }
        let shared = match self.budget.as_str() {
            "own" => false,
            "shared" => true,
            b => return Err(format!("vssd.budget: `{b}` is not one of own, shared")),
        };
        Ok(Plan { geometry, grace_ns, swap_dir: self.swap_dir.clone(), devices, allocator, interval_ns, shared })
    }
}

/// Where the region starts in the cache store file: after the cache's `cache_bytes`,
/// rounded up to a whole vSSD block.
pub fn region_base(cache_bytes: u64, block: u64) -> u64 {
    cache_bytes.div_ceil(block) * block
}

/// The allocators that run on vSSDs (the others need hit curves a vSSD's host cannot see).
pub const ALLOCATORS: [&str; 2] = ["symflex-weighted", "symflex-proportional"];

/// A vSSD's share settings.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Share {
    /// Relative share of the region (`symflex-weighted`).
    pub weight: f64,
    /// Target share of the vSSDs' summed throughput (`symflex-proportional`).
    pub ratio: f64,
}

impl Default for Share {
    fn default() -> Self {
        Share { weight: 1.0, ratio: 1.0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(size: &str, max: &str, initial: &str) -> VssdConfig {
        VssdConfig {
            size: size.into(),
            budget: "own".into(),
            block_size: "1MiB".into(),
            deflate_grace: "30s".into(),
            swap_dir: None,
            allocator: "none".into(),
            interval: "1s".into(),
            device: vec![VssdDeviceConfig {
                name: "d".into(),
                max_size: max.into(),
                initial_size: initial.into(),
                persist: false,
                allow: Vec::new(),
                control: None,
                vhost_user: None,
                weight: 1.0,
                ratio: 1.0,
            }],
        }
    }

    #[test]
    fn sizes_at_zero_the_edges_and_past_them_are_errors_naming_the_key() {
        assert_eq!(cfg("8MiB", "4MiB", "4MiB").resolve().unwrap().devices[0].max_blocks, 4);
        let e = |c: VssdConfig| c.resolve().unwrap_err();
        assert!(e(cfg("0", "4MiB", "0")).starts_with("vssd.size"));
        assert!(e(cfg("1500KiB", "4MiB", "0")).starts_with("vssd.size"));
        assert!(e(cfg("8MiB", "0", "0")).contains("max_size: must be at least one block"));
        assert!(e(cfg("8MiB", "1000", "0")).contains("max_size: 1000 bytes is not a whole number"));
        assert!(e(cfg("8MiB", "4MiB", "5MiB")).contains("initial_size: more than max_size"));
        assert!(e(cfg("8MiB", "8192TiB", "0")).contains("max_size: too large"));
        assert!(e(cfg("8MiB", "4 potatoes", "0")).contains("max_size"));
        let mut c = cfg("8MiB", "4MiB", "0");
        c.deflate_grace = "0".into();
        assert!(e(c).starts_with("vssd.deflate_grace"));
        let mut c = cfg("8MiB", "4MiB", "0");
        c.device.push(c.device[0].clone());
        assert!(e(c).contains("used twice"));
        let mut c = cfg("8MiB", "4MiB", "0");
        c.allocator = "s-cave".into();
        assert!(e(c).contains("vssd.allocator: `s-cave` is not one of none, symflex-weighted"));
        let mut c = cfg("8MiB", "4MiB", "0");
        c.device[0].ratio = 0.0;
        assert!(e(c).contains("(d).ratio: 0 must be above 0"));
        let mut c = cfg("8MiB", "4MiB", "0");
        c.interval = "1ms".into();
        assert!(e(c).starts_with("vssd.interval"));
        let mut c = cfg("8MiB", "4MiB", "0");
        c.allocator = "symflex-proportional".into();
        assert_eq!(c.resolve().unwrap().allocator.as_deref(), Some("symflex-proportional"));
        let mut c = cfg("8MiB", "4MiB", "0");
        c.budget = "half".into();
        assert!(e(c).contains("vssd.budget: `half` is not one of own, shared"));
    }

    #[test]
    fn a_shared_region_is_the_cache_in_blocks_and_its_size_a_cap() {
        let mut c = cfg("8MiB", "4MiB", "0");
        c.budget = "shared".into();
        let p = c.resolve().unwrap();
        assert!(p.shared);
        let g = p.region_geometry(20 << 20, 64 << 10).unwrap();
        assert_eq!((g.blocks, g.block_bytes), (20, 1 << 20));
        assert!(p.region_geometry(7 << 20, 64 << 10).unwrap_err().starts_with("vssd.size: 8388608 bytes is more than"));
        assert!(p.region_geometry(20 << 20, 3 << 20).unwrap_err().starts_with("vssd.block_size"));
        let own = cfg("8MiB", "4MiB", "0").resolve().unwrap();
        assert_eq!(own.region_geometry(20 << 20, 64 << 10).unwrap(), own.geometry);
    }
}
