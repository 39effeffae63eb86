//! The `[cache]` keys the daemon's config and the simulator's scenario share, with one
//! default, one range and one error text each, so the simulator runs what the daemon
//! runs: the background flusher (bcache's `writeback_rate` / `writeback_percent` shape,
//! the daemon's 100 ms steps) and write-back ahead of eviction. Both sections name these
//! functions in their serde defaults and checks; `tests` in `sim` and `server` compare
//! what each makes of the same keys.

use crate::timers::Flusher;

/// `cache.flush_rate`'s default: background write-back, bytes per second.
pub const DEFAULT_FLUSH_RATE: &str = "16MiB";
/// `cache.writeback_percent`'s default: the share of the cache the flusher leaves dirty.
pub const DEFAULT_WRITEBACK_PERCENT: f64 = 10.0;
/// `cache.writeback_ahead`'s default: victims looked at by write-back ahead of eviction
/// (measured in docs/policies.md "Write-back ahead of eviction").
pub const DEFAULT_WRITEBACK_AHEAD: u32 = 32;
/// The flusher's step (the daemon's ticker period).
pub const FLUSH_STEP_NS: u64 = 100_000_000;

/// `cache.size` and `cache.block_size` read the same way by the daemon and the
/// simulator: the block size first (a power of two, 512 B to 1 MiB), then the size.
/// Returns (cache bytes, block size); the error names the key.
pub fn cache_geometry(size: &str, block_size: &str) -> Result<(u64, u64), String> {
    use cachevisor_trace::units::parse_size;
    let block = parse_size(block_size).map_err(|e| format!("cache.block_size: {e}"))?;
    if !block.is_power_of_two() || !(crate::config::MIN_BLOCK..=crate::config::MAX_BLOCK).contains(&block) {
        return Err(format!("cache.block_size: {block} is not a power of two between 512 B and 1 MiB"));
    }
    let bytes = parse_size(size).map_err(|e| format!("cache.size: {e}"))?;
    Ok((bytes, block))
}

/// Serde default of `cache.flush_rate`.
pub fn default_flush_rate() -> String {
    DEFAULT_FLUSH_RATE.into()
}

/// Serde default of `cache.writeback_percent`.
pub fn default_writeback_percent() -> f64 {
    DEFAULT_WRITEBACK_PERCENT
}

/// Serde default of `cache.writeback_ahead`.
pub fn default_writeback_ahead() -> u32 {
    DEFAULT_WRITEBACK_AHEAD
}

/// The background write-back keys of a `[cache]` section, checked.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Writeback {
    /// Bytes per second the flusher writes back at most (0: no flusher).
    pub flush_rate: u64,
    /// Percent of the cache left dirty.
    pub writeback_percent: f64,
    /// Victims looked at by write-back ahead of eviction (0: off).
    pub writeback_ahead: u32,
}

impl Writeback {
    /// Checks the three keys; the error names the key (`cache.flush_rate: …`).
    pub fn check(flush_rate: &str, writeback_percent: f64, writeback_ahead: u32) -> Result<Writeback, String> {
        let rate = cachevisor_trace::units::parse_size(flush_rate).map_err(|e| format!("cache.flush_rate: {e}"))?;
        if !(0.0..=100.0).contains(&writeback_percent) {
            return Err(format!("cache.writeback_percent: {writeback_percent} is not a percentage (0 to 100)"));
        }
        if writeback_ahead > crate::MAX_WRITEBACK_AHEAD {
            return Err(format!(
                "cache.writeback_ahead: {writeback_ahead} victims is more than {} (0 turns it off)",
                crate::MAX_WRITEBACK_AHEAD
            ));
        }
        Ok(Writeback { flush_rate: rate, writeback_percent, writeback_ahead })
    }

    /// The flusher these settings give with blocks of `block_size` bytes (`None`: a rate
    /// of 0): a step every 100 ms of a tenth of the rate, at least one block.
    pub fn flusher(&self, block_size: u64) -> Option<Flusher> {
        (self.flush_rate > 0).then(|| Flusher {
            period_ns: FLUSH_STEP_NS,
            blocks_per_period: (self.flush_rate / 10 / block_size).max(1),
            dirty_target: self.writeback_percent / 100.0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_make_the_daemon_s_flusher() {
        let w = Writeback::check(DEFAULT_FLUSH_RATE, DEFAULT_WRITEBACK_PERCENT, DEFAULT_WRITEBACK_AHEAD).unwrap();
        let f = w.flusher(4096).unwrap();
        assert_eq!((f.period_ns, f.blocks_per_period, f.dirty_target), (100_000_000, 409, 0.1));
        assert_eq!(Writeback::check("0", 10.0, 0).unwrap().flusher(4096), None);
        // A rate below one block per step still writes one.
        assert_eq!(Writeback::check("1KiB", 0.0, 0).unwrap().flusher(4096).unwrap().blocks_per_period, 1);
    }

    #[test]
    fn each_key_s_error_names_it() {
        assert!(Writeback::check("fast", 10.0, 0).unwrap_err().starts_with("cache.flush_rate"));
        assert!(Writeback::check("1MiB", 100.5, 0).unwrap_err().starts_with("cache.writeback_percent"));
        assert!(Writeback::check("1MiB", -1.0, 0).unwrap_err().starts_with("cache.writeback_percent"));
        let over = crate::MAX_WRITEBACK_AHEAD + 1;
        assert!(Writeback::check("1MiB", 10.0, over).unwrap_err().starts_with("cache.writeback_ahead"));
        Writeback::check("1MiB", 100.0, crate::MAX_WRITEBACK_AHEAD).unwrap();
    }
}
