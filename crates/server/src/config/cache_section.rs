//! `[cache]`: the cache store, its block size, policies and background jobs, as the
//! operator writes them (strings; [`super::Config::resolve`] turns them into numbers).

use cachevisor_engine::{ReplacementKind, WritePolicy};
use cachevisor_store::backing::DirectIo;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `[cache]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    /// Cache store file (the cache's first device).
    pub path: PathBuf,
    /// Size of the cache on `path`.
    pub size: String,
    /// More cache devices (`[[cache.device]]`): files or block devices beside `path`, one
    /// allocation over all (the engine's `device_placement.rs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device: Vec<CacheDevice>,
    /// Dirty data on two devices (`true`, the default with two or more): a write-back
    /// write is answered once it is on two devices, so one device lost loses no
    /// acknowledged write; clean blocks live once (the engine's `dirty_mirror.rs`).
    /// `false`: one copy. With one device, `true` is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror_dirty: Option<bool>,
    /// A RAM tier in front of the cache devices (`"4GiB"`; unset or `"0"`: none): clean
    /// copies of the hottest cached blocks in memory, never the only copy of anything
    /// (the engine's `ram_tier.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ram: Option<String>,
    /// Which SSD hits copy a block into the RAM tier: `every-hit` (the default,
    /// CacheLib's rule) or `second-hit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ram_fill: Option<cachevisor_engine::RamFill>,
    /// Block size.
    #[serde(default = "default_block")]
    pub block_size: String,
    /// Replacement policy. Unset: the allocator's own ([`CacheConfig::replacement`]).
    #[serde(default)]
    pub replacement: Option<ReplacementKind>,
    /// Write policy of vDisks that do not set one.
    #[serde(default = "default_write_policy")]
    pub write_policy: WritePolicy,
    /// Per-vDisk partitions the allocator sizes (`static`), or one shared pool with no
    /// targets (`shared`: the unmanaged baseline; no allocator runs).
    #[serde(default)]
    pub partition: cachevisor_engine::PartitionMode,
    /// Allocation policy.
    #[serde(default = "default_allocator")]
    pub allocator: String,
    /// Metadata directory (checkpoint and journal); default `PATH.meta` beside the store.
    pub metadata: Option<PathBuf>,
    /// The largest `size` a reload may grow the cache to while running (default `size`):
    /// the engine's slot table and the metadata's geometry are laid out for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_size: Option<String>,
    /// Device errors after which a vDisk stops using the cache (pass-through).
    #[serde(default = "default_error_threshold")]
    pub error_threshold: u64,
    /// Background destaging of dirty blocks, bytes per second at most (`16MiB`; `0` =
    /// off): the rate once no client request came for 1 s, or with a `writeback_percent`
    /// of 0; under load bcache's controller writes less (`engine/src/flush_rate.rs`).
    #[serde(default = "cachevisor_engine::cache_settings::default_flush_rate")]
    pub flush_rate: String,
    /// Percent of the cache the flusher lets stay dirty (bcache's `writeback_percent`):
    /// hot blocks rewritten often stay dirty and cost no write-back (`10`; `0` writes
    /// everything back).
    #[serde(default = "cachevisor_engine::cache_settings::default_writeback_percent")]
    pub writeback_percent: f64,
    /// Write-back ahead of eviction: the dirty blocks among each vDisk's next this many
    /// victims are written back, one at a time, while nothing else of the vDisk is on its
    /// backing store (`32`; `0` = off).
    #[serde(default = "cachevisor_engine::cache_settings::default_writeback_ahead")]
    pub writeback_ahead: u32,
    /// How often the allocator runs on the traffic it has seen (`1s`).
    #[serde(default = "default_interval")]
    pub interval: String,
    /// The allocator's parameters over its seed's defaults.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub params: std::collections::BTreeMap<String, f64>,
    /// O_DIRECT on the cache store: `auto` (where the filesystem allows), `on` (fail
    /// where it does not), `off` (through the page cache).
    #[serde(default)]
    pub direct: DirectIo,
    /// An O_DIRECT cache store's I/O through io_uring where the kernel allows (`true`);
    /// `false`: a pool of threads.
    #[serde(default = "default_io_uring")]
    pub io_uring: bool,
    /// How long a dirty block's region goes without a write before its checksums are
    /// sealed into the metadata, so a restart after a crash checks it too (`30s`; `0s`:
    /// never — checksums are then checked while the daemon runs only). The first write
    /// into a sealed region waits for one metadata commit (`engine/src/seals.rs`).
    #[serde(default = "default_seal_after")]
    pub seal_after: String,
    /// Read misses go around the cache while its device's reads take longer than this on
    /// average (`"2ms"`; bcache's `congested_read_threshold_us`; the engine's
    /// `congestion.rs`); unset: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub congested_read_threshold: Option<String>,
    /// The same for write misses and the device's writes (`"20ms"`); unset: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub congested_write_threshold: Option<String>,
    /// The cache's SSD write budget, shared across the vDisks by marginal hits per SSD
    /// write (`"50MiB/s"`, or `"3dwpd"` drive writes per day of the cache; the engine's
    /// `shared_budget.rs`); unset: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_budget: Option<String>,
}

/// `[[cache.device]]`: one more cache device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheDevice {
    /// The file (created when missing) or block device.
    pub path: PathBuf,
    /// How much of it the cache uses.
    pub size: String,
}

impl CacheConfig {
    /// The shared write budget's rate (`None`: none); an error names the key.
    pub fn write_budget(&self) -> Result<Option<cachevisor_engine::BudgetRate>, String> {
        self.write_budget
            .as_deref()
            .map(|s| cachevisor_engine::BudgetRate::parse(s).map_err(|e| format!("cache.write_budget: {e}")))
            .transpose()
    }

    /// The congestion thresholds in ns (read, write); an error names the key.
    pub fn congestion_thresholds(&self) -> Result<(Option<u64>, Option<u64>), String> {
        let parse = |key: &str, v: &Option<String>| {
            v.as_deref()
                .map(|s| match cachevisor_trace::units::parse_duration_ns(s) {
                    Ok(ns) if (10_000..=60_000_000_000).contains(&ns) => Ok(ns),
                    Ok(_) => Err(format!("cache.{key}: `{s}` is outside 10us to 60s")),
                    Err(e) => Err(format!("cache.{key}: {e}")),
                })
                .transpose()
        };
        Ok((
            parse("congested_read_threshold", &self.congested_read_threshold)?,
            parse("congested_write_threshold", &self.congested_write_threshold)?,
        ))
    }
}

fn default_io_uring() -> bool {
    true
}

fn default_seal_after() -> String {
    "30s".into()
}

fn default_interval() -> String {
    "1s".into()
}

impl CacheConfig {
    /// The keys it shares with the simulator's `[cache]`, for their one check.
    pub fn keys(&self) -> cachevisor_policy::cache_settings::CacheKeys<'_> {
        cachevisor_policy::cache_keys!(self)
    }

    /// The replacement policy in force: the one set, else the allocator's own
    /// (`Allocator::replacement`; LRU for a name the registry does not know, which
    /// validation reports).
    pub fn replacement(&self) -> ReplacementKind {
        self.replacement.unwrap_or_else(|| cachevisor_policy::registry::replacement_for(&self.allocator))
    }
}

fn default_error_threshold() -> u64 {
    8
}

fn default_block() -> String {
    "4KiB".into()
}
fn default_write_policy() -> WritePolicy {
    WritePolicy::Wt
}
fn default_allocator() -> String {
    "static".into()
}
pub(super) fn one() -> f64 {
    1.0
}
