//! Which missed blocks enter the cache, per vDisk and per direction: `all` (every miss
//! takes a slot, as before), `second-hit` (a block enters on its Nth miss among the
//! vDisk's recent misses — Open-CAS's `nhit` promotion policy; libCacheSim's bloom-filter
//! admission is the approximate N = 2 form) and `probability` (each miss enters with
//! probability p, CacheLib's random admission) and `write-budget` (a probability a
//! controller adjusts to hold the vDisk's SSD write rate at a target: `write_budget.rs`).
//! A rejected read miss is read from the
//! backing store around the cache; a rejected write miss goes around it (the block is not
//! cached, so no copy of it can go stale). Misses the request's mode already sends around
//! the cache (a sequential run, pass-through) are not counted here.
//!
//! The recent misses are remembered exactly: a ring of the last `window` missed block
//! keys with a count per key, `window` the cache's slot count when the policy is set ("sized
//! by the cache"; measured ~50 bytes a remembered miss with the containers' growth slack:
//! [`Admission::memory_bytes`]). Exact rather than a counting
//! Bloom filter so that what is admitted is a function of the stream alone, checked
//! against brute force (`tests`). The probability draws come from a per-vDisk seeded
//! generator: the same stream, the same decisions.
//!
//! Sans-IO state, like the rest of the engine; `Engine::set_admission` switches a vDisk's
//! policy at run time (its history starts empty).

use crate::write_budget::{BudgetRate, BudgetState, WriteBudget};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;

/// One direction's admission policy.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum AdmissionPolicy {
    /// Every miss enters.
    #[default]
    All,
    /// A block enters on its `n`th miss (n ≥ 2) among the vDisk's recent misses.
    NthMiss {
        /// The miss that admits.
        n: u32,
    },
    /// Each miss enters with probability `p` (0 < p ≤ 1).
    Probability {
        /// The probability.
        p: f64,
    },
    /// Every miss, or the second among the recent misses, as two shadow caches beside
    /// the real one say pays more hits (`admission_shadow.rs`).
    Auto,
    /// Each miss enters with the probability that holds the vDisk's SSD writes at
    /// `rate` (`write_budget.rs`). When both directions name one, it is the same budget.
    WriteBudget {
        /// The target.
        rate: BudgetRate,
    },
}

impl std::fmt::Display for AdmissionPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdmissionPolicy::All => write!(f, "all"),
            AdmissionPolicy::NthMiss { n: 2 } => write!(f, "second-hit"),
            AdmissionPolicy::NthMiss { n } => write!(f, "second-hit:{n}"),
            AdmissionPolicy::Probability { p } => write!(f, "probability:{p}"),
            AdmissionPolicy::WriteBudget { rate } => write!(f, "write-budget:{rate}"),
            AdmissionPolicy::Auto => write!(f, "auto"),
        }
    }
}

impl std::str::FromStr for AdmissionPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n.trim(), Some(a.trim())),
            None => (s.trim(), None),
        };
        match (name, arg) {
            ("all", None) => Ok(AdmissionPolicy::All),
            ("auto", None) => Ok(AdmissionPolicy::Auto),
            ("second-hit", None) => Ok(AdmissionPolicy::NthMiss { n: 2 }),
            ("second-hit", Some(a)) => match a.parse::<u32>() {
                Ok(n) if (2..=255).contains(&n) => Ok(AdmissionPolicy::NthMiss { n }),
                _ => Err(format!("admission `{s}`: second-hit:N takes a whole N from 2 to 255 (the miss that admits)")),
            },
            ("probability", Some(a)) => match a.parse::<f64>() {
                Ok(p) if p > 0.0 && p <= 1.0 => Ok(AdmissionPolicy::Probability { p }),
                _ => Err(format!("admission `{s}`: probability:P takes a P above 0 and at most 1")),
            },
            ("write-budget", Some(a)) => BudgetRate::parse(a)
                .map(|rate| AdmissionPolicy::WriteBudget { rate })
                .map_err(|e| format!("admission `{s}`: {e}")),
            _ => Err(format!(
                "admission `{s}`: expected all, second-hit, second-hit:N (N from 2), probability:P (0 < P <= 1), \
                 write-budget:RATE (like 50MiB/s or 3dwpd) or auto"
            )),
        }
    }
}

impl From<AdmissionPolicy> for String {
    fn from(p: AdmissionPolicy) -> String {
        p.to_string()
    }
}

impl TryFrom<String> for AdmissionPolicy {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl AdmissionPolicy {
    /// Checks that a vDisk's read and write policies go together: two write budgets must
    /// be the same one (a vDisk's SSD writes have one rate).
    pub fn check_pair(read: AdmissionPolicy, write: AdmissionPolicy) -> Result<(), String> {
        match (read, write) {
            (AdmissionPolicy::WriteBudget { rate: a }, AdmissionPolicy::WriteBudget { rate: b }) if a != b => Err(format!(
                "admission write-budget:{a} and write_admission write-budget:{b} differ: a vDisk's SSD writes have one budget \
                 (name it on both, or on one)"
            )),
            _ => Ok(()),
        }
    }

    fn budget(self) -> Option<BudgetRate> {
        match self {
            AdmissionPolicy::WriteBudget { rate } => Some(rate),
            _ => None,
        }
    }
}

/// A vDisk's admission at one moment (`Engine::admission`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AdmissionState {
    /// Its read misses' policy.
    pub read: AdmissionPolicy,
    /// Its write misses' policy.
    pub write: AdmissionPolicy,
    /// Misses admitted and rejected since the policy was set.
    #[serde(flatten)]
    pub counts: AdmissionCounts,
    /// Bytes its history of recent misses takes.
    pub memory_bytes: u64,
    /// Misses its history remembers at most: the cache's usable slots.
    pub window: u64,
    /// Its write budget's controller, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetState>,
    /// What `auto` chose, when a direction has it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto: Option<crate::admission_shadow::AutoState>,
}

/// What a vDisk's admission did: misses admitted and rejected, by direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct AdmissionCounts {
    /// Read misses that took a slot.
    pub read_admitted: u64,
    /// Read misses sent around the cache.
    pub read_rejected: u64,
    /// Write misses that took a slot.
    pub write_admitted: u64,
    /// Write misses sent around the cache.
    pub write_rejected: u64,
}

/// A vDisk's admission: its two policies, its recent misses and its draws.
#[derive(Debug, Clone)]
pub struct Admission {
    read: AdmissionPolicy,
    write: AdmissionPolicy,
    /// The last `window` missed keys, oldest first, and how often each is among them.
    recent: VecDeque<u64>,
    counts: FxHashMap<u64, u32>,
    window: usize,
    rng: u64,
    counts_by_outcome: AdmissionCounts,
    budget: Option<WriteBudget>,
    shadow: Option<Box<crate::admission_shadow::Shadow>>,
}

/// splitmix64: the draws' generator (deterministic, no dependency for 3 lines).
pub(crate) fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Admission {
    /// Policies `read` and `write` for a vDisk whose seed is `seed`, remembering up to
    /// `window` misses, in a cache of `block_bytes` blocks and `capacity_bytes` (a write
    /// budget's scale). Two write budgets that differ ([`AdmissionPolicy::check_pair`]):
    /// the read's.
    pub fn new(
        read: AdmissionPolicy,
        write: AdmissionPolicy,
        window: usize,
        seed: u64,
        block_bytes: u64,
        capacity_bytes: u64,
    ) -> Self {
        let budget = read
            .budget()
            .or(write.budget())
            .map(|rate| WriteBudget::new(rate.bytes_per_sec(capacity_bytes), block_bytes));
        let auto = read == AdmissionPolicy::Auto || write == AdmissionPolicy::Auto;
        Admission {
            shadow: auto.then(Default::default),
            budget,
            read,
            write,
            recent: VecDeque::new(),
            counts: FxHashMap::default(),
            window: window.max(1),
            rng: seed,
            counts_by_outcome: AdmissionCounts::default(),
        }
    }

    /// The read and write policies.
    pub fn policies(&self) -> (AdmissionPolicy, AdmissionPolicy) {
        (self.read, self.write)
    }

    /// Whether a miss of block `key` (a write when `write`) at driver time `now_ms`
    /// enters the cache; the miss is remembered and counted either way.
    pub fn admit(&mut self, key: u64, write: bool, now_ms: u32) -> bool {
        let policy = if write { self.write } else { self.read };
        let ok = match policy {
            AdmissionPolicy::All => true,
            AdmissionPolicy::NthMiss { n } => self.counts.get(&key).copied().unwrap_or(0) + 1 >= n,
            AdmissionPolicy::Probability { p } => self.draw() <= p,
            AdmissionPolicy::WriteBudget { .. } => {
                let draw = self.draw();
                self.budget.as_mut().expect("a write budget has its controller").admit(now_ms, draw)
            }
            AdmissionPolicy::Auto => {
                !self.shadow.as_ref().expect("auto has its shadows").second_hit
                    || self.counts.get(&key).copied().unwrap_or(0) >= 1
            }
        };
        if self.remembers() {
            self.remember(key);
        }
        let c = &mut self.counts_by_outcome;
        match (write, ok) {
            (false, true) => c.read_admitted += 1,
            (false, false) => c.read_rejected += 1,
            (true, true) => c.write_admitted += 1,
            (true, false) => c.write_rejected += 1,
        }
        ok
    }

    /// A uniform draw in [0, 1).
    fn draw(&mut self) -> f64 {
        (splitmix(&mut self.rng) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Counts `bytes` the vDisk wrote to the SSD at `now_ms` (a write budget's input).
    #[inline]
    pub fn note_written(&mut self, now_ms: u32, bytes: u64) {
        if let Some(b) = self.budget.as_mut() {
            b.note_written(now_ms, bytes);
        }
    }

    /// The vDisk's admission now.
    pub fn state(&self) -> AdmissionState {
        AdmissionState {
            read: self.read,
            write: self.write,
            counts: self.counts_by_outcome,
            memory_bytes: self.memory_bytes() + self.shadow.as_ref().map_or(0, |s| s.memory_bytes()),
            window: self.window as u64,
            budget: self.budget.as_ref().map(|b| b.state()),
            auto: self.shadow.as_ref().map(|s| s.state()),
        }
    }

    /// Whether either policy reads the recent misses.
    fn remembers(&self) -> bool {
        let reads = |p: AdmissionPolicy| matches!(p, AdmissionPolicy::NthMiss { .. } | AdmissionPolicy::Auto);
        reads(self.read) || reads(self.write)
    }

    /// Whether `auto` needs every block access (`observe`).
    #[inline]
    pub(crate) fn observes(&self) -> bool {
        self.shadow.is_some()
    }

    /// A block access of `key` (hit or miss), for `auto`'s shadows, with the vDisk's
    /// partition of `partition` blocks.
    pub(crate) fn observe(&mut self, key: u64, partition: u64) {
        if let Some(s) = self.shadow.as_mut() {
            s.access(key, partition);
        }
    }

    fn remember(&mut self, key: u64) {
        self.recent.push_back(key);
        *self.counts.entry(key).or_insert(0) += 1;
        self.trim();
    }

    /// Forgets the oldest misses past the window.
    fn trim(&mut self) {
        while self.recent.len() > self.window {
            let old = self.recent.pop_front().expect("longer than the window");
            if let Some(c) = self.counts.get_mut(&old) {
                *c -= 1;
                if *c == 0 {
                    self.counts.remove(&old);
                }
            }
        }
    }

    /// Remembers at most `window` misses from now on (the cache's usable slots changed:
    /// resized online, lent to a vSSD or given back); the oldest past it are forgotten.
    pub(crate) fn set_window(&mut self, window: usize) {
        self.window = window.max(1);
        self.trim();
    }

    /// Misses admitted and rejected so far.
    pub fn counts(&self) -> AdmissionCounts {
        self.counts_by_outcome
    }

    /// Bytes the recent misses take (the ring's and the counts' capacity).
    pub fn memory_bytes(&self) -> u64 {
        (self.recent.capacity() * 8 + self.counts.capacity() * (8 + 4 + 1)) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn policies_parse_and_print_back() {
        for s in ["all", "second-hit", "second-hit:3", "second-hit:255", "probability:0.25", "probability:1"] {
            let p: AdmissionPolicy = s.parse().unwrap();
            assert_eq!(p.to_string(), s);
        }
        assert_eq!("second-hit:2".parse::<AdmissionPolicy>().unwrap(), AdmissionPolicy::NthMiss { n: 2 });
        for bad in [
            "second-hit:0",
            "second-hit:1",
            "second-hit:256",
            "second-hit:4294967296",
            "second-hit:x",
            "probability:0",
            "probability:1.5",
            "probability:NaN",
            "probability",
            "lru",
            "all:2",
            "",
        ] {
            let e = bad.parse::<AdmissionPolicy>().unwrap_err();
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }

    /// The history follows the cache's usable slots: a 64-slot cache remembers 64 misses;
    /// with half its slots withheld (a cache shrunk online) 32, so a block's second miss
    /// 40 misses after its first no longer admits it; given back, 64 again.
    #[test]
    fn the_history_follows_the_caches_usable_slots() {
        use cachevisor_trace::Op::Read;
        let mut e = engine(64);
        let nth = AdmissionPolicy::NthMiss { n: 2 };
        e.set_admission(0, nth, nth);
        assert_eq!(e.admission(0).unwrap().window, 64);
        // Misses of blocks 0..40, then block 0 again: its second miss, within 64.
        let second_miss_admits = |e: &mut crate::Engine, base: u64| {
            for b in base..base + 40 {
                io(e, Read, b);
            }
            io(e, Read, base).inserted
        };
        assert!(second_miss_admits(&mut e, 1000));
        e.withhold(32, 32, &mut crate::Output::default()).unwrap();
        assert_eq!(e.admission(0).unwrap().window, 32);
        assert!(!second_miss_admits(&mut e, 2000), "40 misses back: past a 32-miss history");
        e.return_slots(32, 32);
        assert_eq!(e.admission(0).unwrap().window, 64);
        assert!(second_miss_admits(&mut e, 3000));
    }

    fn engine(slots: u64) -> crate::Engine {
        let mut e = crate::Engine::new(crate::EngineConfig::with_slots(slots)).unwrap();
        e.set_target(0, slots, &mut crate::Output::default());
        e
    }

    fn io(e: &mut crate::Engine, op: cachevisor_trace::Op, block: u64) -> crate::BlockOutcome {
        let mut out = crate::Output::default();
        let r = cachevisor_trace::Request { time_ns: 0, vm: 0, op, offset: block * 4096, len: 4096 };
        e.access(0, &r, &mut out);
        out.blocks[0]
    }

    /// In the engine: under second-hit a first read miss goes around the cache, the
    /// second takes a slot, the third hits; a rejected write miss goes to the backing
    /// store only, and a later read of it is a miss (nothing cached of it) — its second,
    /// which admits it (reads and writes share the history).
    #[test]
    fn the_engine_admits_a_read_on_its_second_miss_and_sends_a_rejected_write_around() {
        use cachevisor_trace::Op::{Read, Write};
        let mut e = engine(64);
        let nth = AdmissionPolicy::NthMiss { n: 2 };
        e.set_admission(0, nth, nth);
        let first = io(&mut e, Read, 1);
        assert!(first.bypassed && !first.inserted && !first.hit);
        let second = io(&mut e, Read, 1);
        assert!(second.inserted && !second.bypassed);
        assert!(io(&mut e, Read, 1).hit);
        let w = io(&mut e, Write, 2);
        assert!(w.bypassed && !w.inserted);
        assert_eq!(e.partition(0).dirty_blocks, 0, "a rejected write-back write leaves nothing dirty");
        // Not cached; the write's miss counts in the history, so this is its second miss.
        let r = io(&mut e, Read, 2);
        assert!(!r.hit && r.inserted);
        let st = e.admission(0).unwrap();
        assert_eq!(
            st.counts,
            AdmissionCounts { read_admitted: 2, read_rejected: 1, write_admitted: 0, write_rejected: 1 }
        );
        assert!(st.memory_bytes > 0 && st.budget.is_none());
        e.set_admission(0, AdmissionPolicy::All, AdmissionPolicy::All);
        assert!(e.admission(0).is_none());
        assert!(io(&mut e, Read, 3).inserted, "back to all: the first miss enters");
    }

    proptest! {
        /// Against brute force: a block is admitted on a miss exactly when it was missed at
        /// least n − 1 times among the `window` misses before this one.
        #[test]
        fn nth_miss_matches_brute_force(
            stream in prop::collection::vec((0u64..12, any::<bool>()), 0..300),
            n in 2u32..5,
            window in 1usize..20,
        ) {
            let mut a = Admission::new(AdmissionPolicy::NthMiss { n }, AdmissionPolicy::NthMiss { n }, window, 7, 4096, 1 << 20);
            let mut past: Vec<u64> = Vec::new();
            for &(key, write) in &stream {
                let recent = &past[past.len().saturating_sub(window)..];
                let want = recent.iter().filter(|&&k| k == key).count() as u32 + 1 >= n;
                prop_assert_eq!(a.admit(key, write, 0), want);
                past.push(key);
            }
            let c = a.counts();
            prop_assert_eq!(c.read_admitted + c.read_rejected + c.write_admitted + c.write_rejected, stream.len() as u64);
            prop_assert!(a.counts.len() <= window && a.recent.len() <= window);
        }

        /// `all` admits everything; a probability admits about p of the misses, the
        /// same ones for the same seed.
        #[test]
        fn probability_admits_its_share_deterministically(p in 0.05f64..1.0, seed in any::<u64>()) {
            let pol = AdmissionPolicy::Probability { p };
            let mut a = Admission::new(pol, AdmissionPolicy::All, 16, seed, 4096, 1 << 20);
            let mut b = Admission::new(pol, AdmissionPolicy::All, 16, seed, 4096, 1 << 20);
            let n = 20_000;
            let mut admitted = 0;
            for k in 0..n {
                let x = a.admit(k, false, 0);
                prop_assert_eq!(x, b.admit(k, false, 0));
                admitted += x as u64;
                prop_assert!(a.admit(k, true, 0), "writes: all");
            }
            // 5 standard deviations of a binomial at this n.
            let sd = (n as f64 * p * (1.0 - p)).sqrt();
            prop_assert!((admitted as f64 - n as f64 * p).abs() <= 5.0 * sd + 1.0, "{} of {} at p {}", admitted, n, p);
            prop_assert_eq!(a.memory_bytes(), 0, "a probability remembers nothing");
        }
    }
}
