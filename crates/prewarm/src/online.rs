//! Prewarm parameters decided online, per vDisk, from what the source saw (Nutanix
//! prewarming slides, "Online Estimation of Parameters": hit ratio, IOPS and WSS are
//! known during the cache run). The slides ask three questions and sketch the answers;
//! the rules and their constants are ours:
//!
//! - **Whether** ("high locality → no need"): on a cold cache every first touch misses,
//!   so a vDisk's own traffic brings its working set back in at least working set ÷
//!   block accesses per second (IOPS × blocks per request); when that is under the
//!   horizon the operator cares about (a minute: [`SELF_REWARM_S`]), such a vDisk is
//!   skipped. So is one whose hit
//!   ratio on the source was under [`MIN_HIT`]: it hardly reuses what it caches, and a
//!   prewarm would load blocks nobody reads again.
//! - **How much** ("proportional to WSS"): its working set — the blocks of it the last
//!   snapshot holds — and no more.
//! - **How fast** ("higher than the vDisk's I/O rate"): [`RATE_FACTOR`] times its own
//!   block traffic, so the prewarm brings the working set back that many times faster
//!   than the vDisk's misses would, and at least [`MIN_RATE`] (a vDisk idle before the
//!   failure brings nothing back by itself: its blocks are prewarmed at that floor).

/// A working set that comes back by itself within this many seconds is not prewarmed.
pub const SELF_REWARM_S: f64 = 60.0;
/// A vDisk that hit less than this on the source is not prewarmed.
pub const MIN_HIT: f64 = 0.1;
/// The prewarm rate, as a multiple of the vDisk's own block traffic.
pub const RATE_FACTOR: f64 = 4.0;
/// The smallest prewarm rate for a vDisk that is prewarmed, bytes/s.
pub const MIN_RATE: u64 = 1 << 20;

/// What the source saw of one vDisk before the failure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// Block hit ratio.
    pub hit_ratio: f64,
    /// Requests per second.
    pub iops: f64,
    /// Blocks per request.
    pub blocks_per_request: f64,
    /// Working set: blocks of it in the last snapshot.
    pub wss_blocks: u64,
}

/// What to do for one vDisk.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    /// Prewarm it at all.
    pub prewarm: bool,
    /// Seconds its own traffic takes at least to bring its working set back.
    pub self_rewarm_s: f64,
    /// Blocks to load at most.
    pub limit_blocks: u64,
    /// Bytes per second for it.
    pub rate: u64,
}

/// The decision for `o` with `block_size`-byte blocks; a working set back by itself
/// within `horizon_s` seconds is not prewarmed ([`SELF_REWARM_S`] for a minute).
pub fn decide(o: &Observation, block_size: u64, horizon_s: f64) -> Decision {
    let accesses = (o.iops * o.blocks_per_request.max(1.0)).max(0.0);
    let self_rewarm_s = if accesses > 0.0 { o.wss_blocks as f64 / accesses } else { f64::INFINITY };
    let reuses = o.hit_ratio >= MIN_HIT || accesses == 0.0;
    let prewarm = o.wss_blocks > 0 && self_rewarm_s > horizon_s && reuses;
    let rate = ((RATE_FACTOR * accesses * block_size as f64) as u64).max(MIN_RATE);
    Decision {
        prewarm,
        self_rewarm_s,
        limit_blocks: if prewarm { o.wss_blocks } else { 0 },
        rate: if prewarm { rate } else { 0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn high_locality_is_skipped_and_the_rest_prewarmed_at_a_multiple_of_its_traffic() {
        // A mail server: 5 requests/s, 2 blocks each, 95% hits, 300 blocks: its own
        // traffic (10 blocks/s) brings them back in 30 s on a cold cache: skipped.
        let mail = Observation { hit_ratio: 0.95, iops: 5.0, blocks_per_request: 2.0, wss_blocks: 300 };
        let d = decide(&mail, 4096, SELF_REWARM_S);
        assert!(!d.prewarm && (d.self_rewarm_s - 30.0).abs() < 1e-9 && d.limit_blocks == 0 && d.rate == 0);
        // With 3,000 blocks: 300 s by itself: prewarmed, all of them, at the floor rate
        // (4 × 10 blocks/s × 4 KiB is below 1 MiB/s).
        let d = decide(&Observation { wss_blocks: 3000, ..mail }, 4096, SELF_REWARM_S);
        assert!(d.prewarm);
        assert_eq!((d.limit_blocks, d.rate), (3000, MIN_RATE));
        // A busy vDisk with a large working set: prewarmed at 4 × its traffic.
        let busy = Observation { hit_ratio: 0.5, iops: 200.0, blocks_per_request: 3.0, wss_blocks: 500_000 };
        let d = decide(&busy, 4096, SELF_REWARM_S);
        assert!(d.prewarm);
        assert_eq!(d.rate, (4.0 * 600.0 * 4096.0) as u64);
        // No reuse on the source (a scan): not prewarmed however large its working set.
        assert!(!decide(&Observation { hit_ratio: 0.05, ..busy }, 4096, SELF_REWARM_S).prewarm);
        // A vDisk idle before the failure brings nothing back by itself: its cached
        // blocks are prewarmed at the floor rate. An empty working set: nothing to do.
        let idle = decide(&Observation { iops: 0.0, hit_ratio: 0.0, ..busy }, 4096, SELF_REWARM_S);
        assert!(idle.prewarm && idle.self_rewarm_s.is_infinite() && idle.rate == MIN_RATE);
        assert!(!decide(&Observation { wss_blocks: 0, ..busy }, 4096, SELF_REWARM_S).prewarm);
        // The horizon is the caller's: a scaled-down run's minute of 10 s prewarms the
        // mail server that a real minute skips.
        assert!(decide(&mail, 4096, 10.0).prewarm);
    }
}
