//! The prewarm settings as an operator writes them (`limit = "50%"`, `rate = "100MiB"`,
//! `busy_rate`, `max_read`), checked and resolved into what the loader needs — one parser
//! for the simulator's `[failover]` and the daemon's `[prewarm]`, with messages naming
//! the key under the caller's section.

use crate::pacer::PaceConfig;
use cachevisor_trace::units::{parse_percent, parse_size};

/// What the settings resolve to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pacing {
    /// The prewarm set's size limit as a fraction of the destination cache.
    pub limit: f64,
    /// Rates and burst for the loader.
    pub pace: PaceConfig,
    /// Largest coalesced read, in blocks.
    pub max_run: u32,
}

/// Largest coalesced read a prewarm may issue (a read is one burst of the pacer).
pub const MAX_READ: u64 = 64 << 20;

/// Busy rate when none is set and the rate is unlimited, bytes/s.
pub const UNLIMITED_BUSY_RATE: u64 = 64 << 20;

/// Resolves the four settings for `block_size`-byte blocks; `section` prefixes the key
/// in messages (`failover`, `prewarm`). Rates are sizes per second (`"100MiB"`, an
/// optional `/s`), or `"unlimited"`; the busy rate defaults to a quarter of the rate
/// (64 MiB/s with an unlimited rate).
pub fn resolve(
    section: &str,
    limit: &str,
    rate: &str,
    busy_rate: Option<&str>,
    max_read: &str,
    block_size: u64,
) -> Result<Pacing, String> {
    let limit_f = parse_percent(limit).map_err(|e| format!("{section}.limit: {e}"))?;
    if !(0.0..=1.0).contains(&limit_f) {
        return Err(format!("{section}.limit: `{limit}` is outside 0%..=100%"));
    }
    let per_sec = |key: &str, s: &str| -> Result<Option<u64>, String> {
        let t = s.trim().trim_end_matches("/s");
        if matches!(t, "unlimited" | "inf" | "∞") {
            return Ok(None);
        }
        let b = parse_size(t).map_err(|e| format!("{section}.{key}: {e} (a size per second, or \"unlimited\")"))?;
        if b == 0 {
            return Err(format!("{section}.{key}: must be > 0 (or \"unlimited\")"));
        }
        Ok(Some(b))
    };
    let rate_b = per_sec("rate", rate)?;
    let busy = match busy_rate {
        Some(b) => per_sec("busy_rate", b)?.unwrap_or(u64::MAX),
        None => rate_b.map_or(UNLIMITED_BUSY_RATE, |r| (r / 4).max(block_size)),
    };
    let max_read_b = parse_size(max_read).map_err(|e| format!("{section}.max_read: {e}"))?;
    if max_read_b < block_size {
        return Err(format!("{section}.max_read: `{max_read}` is smaller than a cache block"));
    }
    if max_read_b > MAX_READ {
        return Err(format!(
            "{section}.max_read: `{max_read}` is over 64MiB (one read is one burst on the backing store)"
        ));
    }
    Ok(Pacing {
        limit: limit_f,
        pace: PaceConfig { rate: rate_b, busy_rate: busy, burst: max_read_b },
        max_run: (max_read_b / block_size).min(u32::MAX as u64) as u32,
    })
}

/// `protect` (how long a prewarmed block is kept from eviction before its first touch,
/// `"5min"`) in ms, checked; `None` when absent. `section` prefixes the key.
pub fn protect_ms(section: &str, protect: Option<&str>) -> Result<Option<u32>, String> {
    let Some(p) = protect else { return Ok(None) };
    let ns = cachevisor_trace::units::parse_duration_ns(p).map_err(|e| format!("{section}.protect: {e}"))?;
    if ns < 1_000_000 {
        return Err(format!("{section}.protect: `{p}` is under 1ms (leave the key out for no protection)"));
    }
    Ok(Some((ns / 1_000_000).min(u32::MAX as u64) as u32))
}

/// `minute` (how long the prewarming slides' minute lasts in a run, `"60s"`) in
/// seconds, checked: at least 1 ms. `section` prefixes the key.
pub fn minute_s(section: &str, minute: &str) -> Result<f64, String> {
    let ns = cachevisor_trace::units::parse_duration_ns(minute).map_err(|e| format!("{section}.minute: {e}"))?;
    if ns < 1_000_000 {
        return Err(format!("{section}.minute: `{minute}` is under 1ms"));
    }
    Ok(ns as f64 / 1e9)
}

/// The pacing of an online prewarm whose sets together want `rate` bytes/s: that rate,
/// and a quarter of it (at least a block) while a vDisk serves its clients.
pub fn online_pace(base: PaceConfig, rate: u64, block_size: u64) -> PaceConfig {
    PaceConfig { rate: Some(rate.max(1)), busy_rate: (rate / 4).max(block_size), ..base }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protect_is_a_duration_of_at_least_a_millisecond() {
        assert_eq!(protect_ms("prewarm", None), Ok(None));
        assert_eq!(protect_ms("prewarm", Some("5min")), Ok(Some(300_000)));
        assert_eq!(protect_ms("prewarm", Some("1ms")), Ok(Some(1)), "the least");
        assert_eq!(protect_ms("prewarm", Some("2000000h")), Ok(Some(u32::MAX)), "longer than u32 ms: held at the most");
        assert!(protect_ms("failover", Some("soon")).unwrap_err().starts_with("failover.protect: "));
        assert!(protect_ms("prewarm", Some("0")).unwrap_err().starts_with("prewarm.protect: `0` is under 1ms"));
        assert_eq!(minute_s("prewarm", "2s"), Ok(2.0));
        assert!(minute_s("failover", "0").unwrap_err().starts_with("failover.minute: `0` is under 1ms"));
    }

    #[test]
    fn settings_resolve_and_bad_ones_name_their_key() {
        let p = resolve("prewarm", "50%", "100MiB/s", None, "128KiB", 4096).unwrap();
        assert_eq!(p.limit, 0.5);
        assert_eq!(p.pace, PaceConfig { rate: Some(100 << 20), busy_rate: 25 << 20, burst: 128 << 10 });
        assert_eq!(p.max_run, 32);
        let u = resolve("prewarm", "100%", "unlimited", Some("8MiB"), "4KiB", 4096).unwrap();
        assert_eq!((u.pace.rate, u.pace.busy_rate, u.max_run), (None, 8 << 20, 1));
        assert_eq!(resolve("p", "5%", "inf", None, "4KiB", 4096).unwrap().pace.busy_rate, UNLIMITED_BUSY_RATE);
        for (args, want) in [
            (("150%", "1MiB", None, "4KiB"), "failover.limit"),
            (("5%", "fast", None, "4KiB"), "failover.rate"),
            (("5%", "0", None, "4KiB"), "failover.rate: must be > 0"),
            (("5%", "1MiB", Some("x"), "4KiB"), "failover.busy_rate"),
            (("5%", "1MiB", None, "1KiB"), "failover.max_read"),
            (("5%", "1MiB", None, "1TiB"), "failover.max_read: `1TiB` is over 64MiB"),
        ] {
            let e = resolve("failover", args.0, args.1, args.2, args.3, 4096).unwrap_err();
            assert!(e.starts_with(want), "{e}");
        }
    }
}
