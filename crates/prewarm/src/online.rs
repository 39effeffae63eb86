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

use crate::scores::{ObjectId, Ranking};
use crate::snapshot::{Activity, Snapshot};

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

impl Observation {
    /// The observation of `a` (a stretch of a vDisk's activity) with a working set of
    /// `wss_blocks`.
    pub fn of(a: &Activity, wss_blocks: u64) -> Observation {
        let span_s = a.span_ns as f64 / 1e9;
        Observation {
            hit_ratio: if a.accesses > 0 { a.hits as f64 / a.accesses as f64 } else { 0.0 },
            iops: if span_s > 0.0 { a.requests as f64 / span_s } else { 0.0 },
            blocks_per_request: if a.requests > 0 { a.accesses as f64 / a.requests as f64 } else { 1.0 },
            wss_blocks,
        }
    }
}

/// What the source saw of `set` over the newest snapshots of `history` (oldest first)
/// that together cover at least `span_ns` (all of them when they cover less), and its
/// working set in the newest. A set no snapshot knows the activity of counts as idle.
pub fn observe(history: &[&Snapshot], set: &str, span_ns: u64) -> Observation {
    let mut sum = Activity::default();
    for s in history.iter().rev() {
        if sum.span_ns >= span_ns {
            break;
        }
        if let Some(a) = s.activity.get(set) {
            sum = sum.plus(*a);
        }
    }
    let wss = history.last().and_then(|s| s.sets.get(set)).map_or(0, |b| b.len());
    Observation::of(&sum, wss)
}

/// Whether any snapshot of `history` carries activity (format 2 and a source that
/// records it; not format 1 files or a simulator's in-memory history).
pub fn has_activity(history: &[&Snapshot]) -> bool {
    history.iter().any(|s| !s.activity.is_empty())
}

/// The prewarm set and total rate of an online prewarm.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OnlineChoice {
    /// The objects to load, best first.
    pub chosen: Vec<(ObjectId, u64)>,
    /// The total prewarm rate, bytes/s (the sum over the sets prewarmed).
    pub rate: u64,
    /// Sets left out, by name.
    pub skipped: Vec<String>,
}

/// The objects of `ranking` that `decisions` (one per set of `ranking.sets`, in its
/// order) prewarm — each set's best up to its own limit — at most `limit` in all, and
/// the sum of their rates.
pub fn choose(ranking: &Ranking, decisions: &[Decision], limit: u64) -> OnlineChoice {
    assert_eq!(ranking.sets.len(), decisions.len(), "one decision per set");
    let mut taken = vec![0u64; decisions.len()];
    let chosen = ranking
        .objects
        .iter()
        .filter(|(o, _)| {
            let i = o.set as usize;
            let keep = decisions[i].prewarm && taken[i] < decisions[i].limit_blocks;
            taken[i] += keep as u64;
            keep
        })
        .take(limit as usize)
        .copied()
        .collect();
    let rate = decisions.iter().filter(|d| d.prewarm).fold(0u64, |r, d| r.saturating_add(d.rate));
    let skipped = ranking.sets.iter().zip(decisions).filter(|(_, d)| !d.prewarm).map(|(n, _)| n.clone()).collect();
    OnlineChoice { chosen, rate, skipped }
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

    fn snap(seq: u64, blocks: u64, a: Option<Activity>) -> Snapshot {
        let mut s = Snapshot::new(seq, 0, 4096);
        s.sets.insert("a".into(), (0..blocks).collect());
        if let Some(a) = a {
            s.activity.insert("a".into(), a);
        }
        s
    }

    #[test]
    fn the_observation_sums_the_newest_snapshots_covering_the_span() {
        let a = |req: u64, s: u64| Activity { requests: req, accesses: 2 * req, hits: req, span_ns: s * 1_000_000_000 };
        let h = [snap(1, 10, Some(a(1000, 60))), snap(2, 20, Some(a(600, 60))), snap(3, 30, Some(a(300, 60)))];
        let refs: Vec<&Snapshot> = h.iter().collect();
        // 100 s: the newest two (120 s), 900 requests.
        let o = observe(&refs, "a", 100_000_000_000);
        assert_eq!(o, Observation { hit_ratio: 0.5, iops: 900.0 / 120.0, blocks_per_request: 2.0, wss_blocks: 30 });
        // More than they cover: all three.
        assert!((observe(&refs, "a", u64::MAX).iops - 1900.0 / 180.0).abs() < 1e-9);
        assert!(has_activity(&refs));
        // A set with no activity: idle, its working set from the newest snapshot.
        let idle = Observation { hit_ratio: 0.0, iops: 0.0, blocks_per_request: 1.0, wss_blocks: 0 };
        assert_eq!(observe(&refs, "b", 1), idle);
        let old = [snap(1, 10, None)];
        let old: Vec<&Snapshot> = old.iter().collect();
        assert!(!has_activity(&old));
        assert_eq!(observe(&old, "a", 1), Observation { wss_blocks: 10, ..idle });
    }

    /// A snapshot's activity comes from a file: the largest counts a checksummed file can
    /// carry give finite observations and a rate held at u64::MAX, never a panic.
    #[test]
    fn the_largest_activity_a_file_can_carry_is_decided_without_overflow() {
        let max = Activity { requests: u64::MAX, accesses: u64::MAX, hits: u64::MAX, span_ns: 1 };
        let h = [snap(1, 10, Some(max)), snap(2, 10, Some(max))];
        let refs: Vec<&Snapshot> = h.iter().collect();
        let o = observe(&refs, "a", u64::MAX);
        assert!(o.iops.is_finite() && o.hit_ratio == 1.0, "{o:?}");
        let d = decide(&o, 1 << 20, SELF_REWARM_S);
        assert!(!d.prewarm && d.rate == 0, "re-warms itself at once: {d:?}");
        let d = decide(&Observation { hit_ratio: 0.5, wss_blocks: u64::MAX, iops: 1e300, ..o }, 1 << 20, 0.0);
        assert_eq!(d.rate, u64::MAX);
    }

    #[test]
    fn choose_takes_each_prewarmed_set_s_best_up_to_its_limit() {
        let mut s = Snapshot::new(1, 0, 4096);
        s.sets.insert("a".into(), (0..5u64).collect());
        s.sets.insert("b".into(), (0..5u64).collect());
        s.sets.insert("c".into(), (0..5u64).collect());
        let r = Ranking::new(&[&s], crate::Heuristic::Recent);
        let d = |p: bool, limit: u64, rate: u64| Decision { prewarm: p, self_rewarm_s: 0.0, limit_blocks: limit, rate };
        let c = choose(&r, &[d(true, 2, 10), d(false, 0, 0), d(true, 5, 5)], 6);
        let per_set = |set: u32| c.chosen.iter().filter(|(o, _)| o.set == set).count();
        assert_eq!((per_set(0), per_set(1), per_set(2), c.chosen.len()), (2, 0, 4, 6));
        assert_eq!((c.rate, c.skipped.clone()), (15, vec!["b".to_string()]));
        // Brute force: every chosen object is of a prewarmed set, within its limit, in
        // ranking order.
        let pos: Vec<usize> = c.chosen.iter().map(|x| r.objects.iter().position(|y| y == x).unwrap()).collect();
        assert!(pos.windows(2).all(|w| w[0] < w[1]));
    }
}
