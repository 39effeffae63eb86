//! `auto` admission's chooser: whether second-hit pays for this vDisk, decided from two
//! shadow caches run beside the real one (issue 57's per-VM choice). Both are LRU over a
//! spatially hashed sample of the vDisk's blocks (SHARDS's sampling, one block in
//! [`SAMPLE`]: `analysis` has the estimator; here the cache is simulated itself, at the
//! vDisk's partition size scaled down by the sample rate): one admits every miss, the other
//! on the second miss among its recent misses. Every block access of the vDisk (hit or
//! miss, both directions) is fed to both. Every [`WINDOW`] sampled accesses (the first
//! time after 1/16 of it; until then every miss enters) the vDisk takes the policy
//! whose shadow hit more — second-hit on a tie, as it writes less, and it leaves
//! second-hit only for a margin of 1/64 of the window's accesses — and the counts start again, so it follows a workload that changes.
//!
//! Written here rather than taken from a crate: an LRU of a few thousand keys with O(log n)
//! steps (a map of last uses and its inverse) is twelve lines; the point is that it is fed
//! from the engine's request path, deterministically.

use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, VecDeque};

/// One block in this many is sampled.
pub const SAMPLE: u64 = 64;
/// Sampled accesses per decision.
pub const WINDOW: u64 = 1024;

/// A sampled LRU of `capacity` keys.
#[derive(Debug, Clone, Default)]
struct ShadowLru {
    capacity: usize,
    last: FxHashMap<u64, u64>,
    order: BTreeMap<u64, u64>,
    clock: u64,
}

impl ShadowLru {
    /// Accesses `key`: whether it hit; on a miss, `admit` says whether it enters.
    fn access(&mut self, key: u64, admit: impl FnOnce() -> bool) -> bool {
        self.clock += 1;
        if let Some(t) = self.last.insert(key, self.clock) {
            self.order.remove(&t);
            self.order.insert(self.clock, key);
            return true;
        }
        self.last.remove(&key);
        if admit() && self.capacity > 0 {
            if self.last.len() >= self.capacity {
                if let Some((_, old)) = self.order.pop_first() {
                    self.last.remove(&old);
                }
            }
            self.last.insert(key, self.clock);
            self.order.insert(self.clock, key);
        }
        false
    }
}

/// The chooser's state (inside a vDisk's `Admission`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Shadow {
    all: ShadowLru,
    second: ShadowLru,
    /// The second-hit shadow's recent misses (a ring and counts).
    recent: VecDeque<u64>,
    counts: FxHashMap<u64, u32>,
    hits: [u64; 2],
    sampled: u64,
    /// Whether second-hit is chosen now.
    pub(crate) second_hit: bool,
    /// Decisions made, and how many chose second-hit.
    pub(crate) decisions: u64,
    pub(crate) chose_second_hit: u64,
}

/// What `auto` chose and why (`Engine::admission`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct AutoState {
    /// Whether misses are admitted on their second miss now (else every miss).
    pub second_hit: bool,
    /// Decisions made so far, and how many chose second-hit.
    pub decisions: u64,
    /// Of them, second-hit.
    pub chose_second_hit: u64,
    /// The shadows' hits in the current window: every miss admitted, second-hit.
    pub shadow_hits: [u64; 2],
}

/// Whether block key `key` is in the sample (a hash of it, so the same blocks always).
#[inline]
pub(crate) fn sampled(key: u64) -> bool {
    key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58 == 0
}

impl Shadow {
    /// Feeds one block access of `key` (sampled or not) with the vDisk's partition of
    /// `partition` blocks; a decision may change [`Self::second_hit`].
    pub(crate) fn access(&mut self, key: u64, partition: u64) {
        if !sampled(key) {
            return;
        }
        let cap = (partition / SAMPLE).max(1) as usize;
        self.all.capacity = cap;
        self.second.capacity = cap;
        self.hits[0] += self.all.access(key, || true) as u64;
        let (recent, counts) = (&mut self.recent, &mut self.counts);
        let hit = self.second.access(key, || {
            let seen = counts.get(&key).copied().unwrap_or(0) > 0;
            recent.push_back(key);
            *counts.entry(key).or_insert(0) += 1;
            if recent.len() > cap {
                let old = recent.pop_front().expect("longer than the window");
                if let Some(c) = counts.get_mut(&old) {
                    *c -= 1;
                    if *c == 0 {
                        counts.remove(&old);
                    }
                }
            }
            seen
        });
        self.hits[1] += hit as u64;
        self.sampled += 1;
        // The first decision comes after 1/16 of a window: until then every miss enters.
        if self.sampled >= if self.decisions == 0 { WINDOW / 16 } else { WINDOW } {
            // Hysteresis toward second-hit (it writes less): to all only when that hit
            // more by over 1/64 of the window's accesses, back on a tie.
            let margin = self.sampled / 64;
            self.second_hit =
                if self.second_hit { self.hits[0] <= self.hits[1] + margin } else { self.hits[1] >= self.hits[0] };
            self.decisions += 1;
            self.chose_second_hit += self.second_hit as u64;
            self.hits = [0, 0];
            self.sampled = 0;
        }
    }

    pub(crate) fn state(&self) -> AutoState {
        AutoState {
            second_hit: self.second_hit,
            decisions: self.decisions,
            chose_second_hit: self.chose_second_hit,
            shadow_hits: self.hits,
        }
    }

    /// Bytes the shadows take (their maps' capacity).
    pub(crate) fn memory_bytes(&self) -> u64 {
        let lru = |l: &ShadowLru| l.last.capacity() * 17 + l.order.len() * 40;
        (lru(&self.all) + lru(&self.second) + self.recent.capacity() * 8 + self.counts.capacity() * 13) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys that are in the sample, in order.
    fn sampled_keys(n: usize) -> Vec<u64> {
        (0u64..).filter(|&k| sampled(k)).take(n).collect()
    }

    #[test]
    fn the_shadow_lru_is_an_lru() {
        let mut l = ShadowLru { capacity: 2, ..Default::default() };
        assert!(!l.access(1, || true));
        assert!(!l.access(2, || true));
        assert!(l.access(1, || true));
        assert!(!l.access(3, || true), "evicts 2, the least recent");
        assert!(l.access(1, || true) && !l.access(2, || true));
        assert!(!l.access(9, || false) && !l.access(9, || false), "not admitted, never cached");
    }

    /// A scan beside a small hot set: second-hit keeps the hot set and is chosen. Blocks
    /// read exactly twice in a row: only admitting the first miss hits, and all is chosen.
    #[test]
    fn second_hit_is_chosen_under_a_scan_and_all_for_read_twice_blocks() {
        let keys = sampled_keys(200_000);
        let mut s = Shadow::default();
        let partition = 48 * SAMPLE; // 48 sampled slots: the hot set's reuse distance is 64
        for (i, &k) in keys[32..].iter().enumerate() {
            s.access(keys[i % 32], partition); // hot: 32 sampled blocks
            s.access(k, partition); // the scan, never again
        }
        // Every window but the first (where the second-hit shadow misses each hot block twice).
        assert!(s.second_hit && s.decisions > 10 && s.chose_second_hit + 1 >= s.decisions, "{:?}", s.state());
        let mut s = Shadow::default();
        for &k in &keys {
            s.access(k, partition);
            s.access(k, partition);
        }
        assert!(!s.second_hit && s.decisions > 10 && s.chose_second_hit == 0, "{:?}", s.state());
        assert!(s.memory_bytes() > 0);
    }
}
