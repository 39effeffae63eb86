//! The `[cache]` settings the daemon's config and the simulator's scenario share, checked
//! in one place into one typed struct that both drivers' resolved settings embed: the
//! geometry (size and block size), the replacement, write policy and partitioning, the
//! allocator and its parameters (with the "S-CAVE's cleaner needs CLOCK" rule), and the
//! background write-back. Each key is parsed once, its range checked once, and its error
//! text written once (`cachevisor-cli`'s `the_daemon_and_the_simulator_read_shared_cache_keys_alike`
//! compares what both drivers make of the same keys). The raw keys stay in each driver's
//! section, since each has keys of its own (the daemon's file paths and O_DIRECT, the
//! simulator's oracle and object model) and serde refuses unknown keys only per struct.

use crate::params::Params;
use cachevisor_engine::cache_settings::{cache_geometry, Writeback};
use cachevisor_engine::{PartitionMode, ReplacementKind, WritePolicy};

/// The shared `[cache]` keys as written (borrowed from a driver's section).
#[derive(Debug, Clone, Copy)]
pub struct CacheKeys<'a> {
    /// `size`.
    pub size: &'a str,
    /// `block_size`.
    pub block_size: &'a str,
    /// `replacement` (unset: the allocator's own).
    pub replacement: Option<ReplacementKind>,
    /// `write_policy`.
    pub write_policy: WritePolicy,
    /// `partition`.
    pub partition: PartitionMode,
    /// `allocator`.
    pub allocator: &'a str,
    /// `params`.
    pub params: &'a Params,
    /// `flush_rate`.
    pub flush_rate: &'a str,
    /// `writeback_percent`.
    pub writeback_percent: f64,
    /// `writeback_ahead`.
    pub writeback_ahead: u32,
}

/// The [`CacheKeys`] of a driver's `[cache]` section `$s`, a struct with a field of each
/// shared key's name (the daemon's `CacheConfig`, the simulator's `CacheSection`).
#[macro_export]
macro_rules! cache_keys {
    ($s:expr) => {
        $crate::cache_settings::CacheKeys {
            size: &$s.size,
            block_size: &$s.block_size,
            replacement: $s.replacement,
            write_policy: $s.write_policy,
            partition: $s.partition,
            allocator: &$s.allocator,
            params: &$s.params,
            flush_rate: &$s.flush_rate,
            writeback_percent: $s.writeback_percent,
            writeback_ahead: $s.writeback_ahead,
        }
    };
}

/// The shared `[cache]` settings, checked.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CacheSettings {
    /// Cache bytes (`size`; a driver may round it to whole blocks or objects).
    pub cache_bytes: u64,
    /// Block bytes: a power of two, 512 B to 1 MiB.
    pub block_size: u64,
    /// The replacement in force: the one set, else the allocator's own.
    pub replacement: ReplacementKind,
    /// Default write policy.
    pub write_policy: WritePolicy,
    /// Per-VM partitions or one shared pool.
    pub partition: PartitionMode,
    /// Allocation policy, a name the registry knows.
    pub allocator: String,
    /// Its parameters, each known to it and in range.
    pub params: Params,
    /// The flusher and write-back ahead.
    pub writeback: Writeback,
}

impl CacheSettings {
    /// Checks the keys; the error names the key (`cache.block_size: …`).
    pub fn check(k: &CacheKeys<'_>) -> Result<CacheSettings, String> {
        let (cache_bytes, block_size) = cache_geometry(k.size, k.block_size)?;
        let replacement = k.replacement.unwrap_or_else(|| crate::registry::replacement_for(k.allocator));
        crate::registry::check_cache_policy(k.allocator, k.params, replacement, k.partition)?;
        let writeback = Writeback::check(k.flush_rate, k.writeback_percent, k.writeback_ahead)?;
        Ok(CacheSettings {
            cache_bytes,
            block_size,
            replacement,
            write_policy: k.write_policy,
            partition: k.partition,
            allocator: k.allocator.to_string(),
            params: k.params.clone(),
            writeback,
        })
    }

    /// The engine configuration of `slots` slots with these settings (whole blocks, no
    /// last-access tracking, no lent stores), checked.
    pub fn engine_config(&self, slots: u64) -> Result<cachevisor_engine::EngineConfig, String> {
        let cfg = cachevisor_engine::EngineConfig {
            block_size: self.block_size,
            slots,
            partition: self.partition,
            replacement: self.replacement,
            write_policy: self.write_policy,
            ..cachevisor_engine::EngineConfig::with_slots(1)
        };
        cfg.validate().map_err(|e| format!("cache: {e}"))?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(p: &Params) -> CacheKeys<'_> {
        CacheKeys {
            size: "64MiB",
            block_size: "4KiB",
            replacement: None,
            write_policy: WritePolicy::Wb,
            partition: PartitionMode::Static,
            allocator: "static",
            params: p,
            flush_rate: "16MiB",
            writeback_percent: 10.0,
            writeback_ahead: 32,
        }
    }

    #[test]
    fn the_keys_resolve_and_each_error_names_its_key() {
        let p = Params::new();
        let s = CacheSettings::check(&keys(&p)).unwrap();
        assert_eq!((s.cache_bytes, s.block_size, s.replacement), (64 << 20, 4096, ReplacementKind::Lru));
        assert_eq!(s.writeback.flush_rate, 16 << 20);
        assert_eq!(s.engine_config(100).unwrap().slots, 100);
        let scave = CacheSettings::check(&CacheKeys { allocator: "s-cave", ..keys(&p) }).unwrap();
        assert_eq!(scave.replacement, ReplacementKind::Clock, "the allocator's own replacement");
        let m = [("m".to_string(), 5.0)].into_iter().collect();
        for (k, key) in [
            (CacheKeys { size: "big", ..keys(&p) }, "cache.size"),
            (CacheKeys { block_size: "3000", ..keys(&p) }, "cache.block_size"),
            (CacheKeys { allocator: "nope", ..keys(&p) }, "cache.allocator"),
            (CacheKeys { params: &m, ..keys(&p) }, "cache.params"),
            (
                CacheKeys { allocator: "s-cave", replacement: Some(ReplacementKind::Lru), ..keys(&p) },
                "cache.replacement",
            ),
            (CacheKeys { flush_rate: "fast", ..keys(&p) }, "cache.flush_rate"),
            (CacheKeys { writeback_percent: 101.0, ..keys(&p) }, "cache.writeback_percent"),
            (CacheKeys { writeback_ahead: u32::MAX, ..keys(&p) }, "cache.writeback_ahead"),
        ] {
            let e = CacheSettings::check(&k).unwrap_err();
            assert!(e.starts_with(&format!("{key}: ")), "{e}");
        }
    }
}
