//! Congestion bypass: while the cache device answers slower than a threshold, misses go
//! around the cache — bcache's `congested_read_threshold_us` / `congested_write_threshold_us`
//! (a cache set whose device is slower than its backing store serves nobody by taking
//! more writes). Read misses are read from the backing store and not inserted while reads
//! are congested; write misses are written around while writes are. Hits are served from
//! the cache as always (a dirty block is only there), and prefetch waits.
//!
//! The latency is the engine's own measure, the same for every driver: from the moment a
//! cache-store op is handed out (driver time, at the last call that carried it) to its
//! completion — its time queued in the driver and on the device, which is what congestion
//! is. It is smoothed per direction (weight 1/8 for the newest op) and decays by half every
//! [`DECAY_NS`] without a sample, so a device nobody uses any more (every miss going
//! around) is tried again. Hysteresis: congested above the threshold, clear again below
//! 3/4 of it.

use crate::output::{OpId, OpKind};
use rustc_hash::FxHashMap;

/// The smoothed latency halves every this many driver nanoseconds without a sample.
pub const DECAY_NS: u64 = 50_000_000;
/// Weight of the newest op in the smoothed latency.
const WEIGHT: f64 = 1.0 / 8.0;

/// One direction's latency and state.
#[derive(Debug, Clone, Copy, Default)]
struct Side {
    threshold_ns: Option<u64>,
    ewma_ns: f64,
    last_ns: u64,
    congested: bool,
    episodes: u64,
}

impl Side {
    /// The smoothed latency at `now_ns`, decayed for the time without a sample.
    fn latency(&self, now_ns: u64) -> f64 {
        let idle = now_ns.saturating_sub(self.last_ns) as f64 / DECAY_NS as f64;
        self.ewma_ns * 0.5f64.powf(idle)
    }

    fn sample(&mut self, now_ns: u64, ns: u64) {
        self.ewma_ns = self.latency(now_ns) + WEIGHT * (ns as f64 - self.latency(now_ns));
        self.last_ns = now_ns;
        self.update(now_ns);
    }

    /// Sets the state from the latency at `now_ns` (hysteresis).
    fn update(&mut self, now_ns: u64) -> bool {
        let Some(t) = self.threshold_ns else { return false };
        let l = self.latency(now_ns);
        if !self.congested && l > t as f64 {
            self.congested = true;
            self.episodes += 1;
        } else if self.congested && l < 0.75 * t as f64 {
            self.congested = false;
        }
        self.congested
    }
}

/// The cache device's congestion, as the engine sees it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Congestion {
    read: Side,
    write: Side,
    /// Cache-store ops handed out and not completed yet: when.
    issued: FxHashMap<OpId, u64>,
    /// Per VM: read and write misses sent around the cache for congestion.
    bypassed: Vec<[u64; 2]>,
}

/// What congestion bypass is doing (`Engine::congestion`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CongestionState {
    /// The read threshold, ns (`None`: off).
    pub read_threshold_ns: Option<u64>,
    /// The write threshold, ns (`None`: off).
    pub write_threshold_ns: Option<u64>,
    /// The cache device's smoothed read latency now, ns.
    pub read_latency_ns: f64,
    /// Its smoothed write latency now, ns.
    pub write_latency_ns: f64,
    /// Whether reads are congested now.
    pub read_congested: bool,
    /// Whether writes are.
    pub write_congested: bool,
    /// Times reads became congested.
    pub read_episodes: u64,
    /// Times writes did.
    pub write_episodes: u64,
}

impl Congestion {
    /// Whether either direction has a threshold.
    #[inline]
    pub(crate) fn on(&self) -> bool {
        self.read.threshold_ns.is_some() || self.write.threshold_ns.is_some()
    }

    pub(crate) fn set(&mut self, read_ns: Option<u64>, write_ns: Option<u64>) {
        self.read.threshold_ns = read_ns;
        self.write.threshold_ns = write_ns;
        if !self.on() {
            self.issued.clear();
            self.read.congested = false;
            self.write.congested = false;
        }
    }

    /// Op `id` of `kind` was handed out at `now_ns`.
    #[inline]
    pub(crate) fn issued(&mut self, id: OpId, kind: OpKind, now_ns: u64) {
        if self.on() && kind.is_ssd() {
            self.issued.insert(id, now_ns);
        }
    }

    /// Op `id` of `kind` completed at `now_ns`.
    #[inline]
    pub(crate) fn completed(&mut self, id: OpId, kind: OpKind, now_ns: u64) {
        if self.issued.is_empty() {
            return;
        }
        if let Some(t) = self.issued.remove(&id) {
            let side = if kind.is_write() { &mut self.write } else { &mut self.read };
            side.sample(now_ns, now_ns.saturating_sub(t));
        }
    }

    /// Whether a miss of `vm` (a write when `write`) at `now_ns` goes around the cache
    /// for congestion (counted when it does).
    #[inline]
    pub(crate) fn bypass(&mut self, vm: u32, write: bool, now_ns: u64) -> bool {
        let side = if write { &mut self.write } else { &mut self.read };
        if !side.update(now_ns) {
            return false;
        }
        let v = vm as usize;
        if self.bypassed.len() <= v {
            self.bypassed.resize(v + 1, [0; 2]);
        }
        self.bypassed[v][write as usize] += 1;
        true
    }

    /// Whether reads are congested at `now_ns` (prefetch waits meanwhile).
    pub(crate) fn reads_congested(&mut self, now_ns: u64) -> bool {
        self.read.update(now_ns)
    }

    /// `vm`'s read and write misses sent around the cache for congestion.
    pub(crate) fn bypassed(&self, vm: u32) -> [u64; 2] {
        self.bypassed.get(vm as usize).copied().unwrap_or_default()
    }

    pub(crate) fn state(&self, now_ns: u64) -> CongestionState {
        CongestionState {
            read_threshold_ns: self.read.threshold_ns,
            write_threshold_ns: self.write.threshold_ns,
            read_latency_ns: self.read.latency(now_ns),
            write_latency_ns: self.write.latency(now_ns),
            read_congested: self.read.congested,
            write_congested: self.write.congested,
            read_episodes: self.read.episodes,
            write_episodes: self.write.episodes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slow cache reads congest reads (not writes); once the device answers fast again,
    /// or nobody uses it for a while, the state clears below 3/4 of the threshold.
    #[test]
    fn slow_reads_congest_reads_and_clear_with_hysteresis_or_idle_time() {
        let mut c = Congestion::default();
        c.set(Some(1_000_000), Some(10_000_000));
        let mut t = 0;
        for i in 0..40 {
            c.issued(i, OpKind::SsdRead, t);
            t += 3_000_000;
            c.completed(i, OpKind::SsdRead, t);
        }
        assert!(c.bypass(0, false, t) && !c.bypass(0, true, t));
        assert_eq!(c.bypassed(0), [1, 0]);
        // Fast again: the average falls under 0.75 ms after a while, not at once.
        let mut cleared_after = None;
        for i in 40..200 {
            c.issued(i, OpKind::SsdRead, t);
            t += 10_000;
            c.completed(i, OpKind::SsdRead, t);
            if cleared_after.is_none() && !c.reads_congested(t) {
                cleared_after = Some(i - 40);
            }
        }
        let n = cleared_after.expect("cleared");
        assert!(n > 5, "hysteresis: {n} fast ops");
        assert!(!c.bypass(0, false, t));
        // Congested again, then idle: decays away.
        for i in 200..260 {
            c.issued(i, OpKind::SsdRead, t);
            t += 3_000_000;
            c.completed(i, OpKind::SsdRead, t);
        }
        assert!(c.reads_congested(t));
        assert!(!c.reads_congested(t + 4 * DECAY_NS), "a device nobody used for 200 ms is tried again");
        assert_eq!(c.state(t).read_episodes, 2);
        // Off: nothing is tracked.
        c.set(None, None);
        c.issued(999, OpKind::SsdWrite, t);
        assert!(c.issued.is_empty() && !c.bypass(0, true, t));
    }
}
