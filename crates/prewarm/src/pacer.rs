//! How fast prewarm reads may go: a token bucket at the prewarm rate (the slides' "prewarm
//! rate", MB/s; unlimited allowed), and a second, slower one that alone applies while the
//! backing disk is serving the VM's own requests.
//!
//! The second bucket is a guaranteed minimum, not a pause: InnoDB's buffer-pool load
//! slept whenever the server was busy, so the lightest client load cut loading to about
//! one page a second and a load took over an hour (MariaDB removed that throttle,
//! MDEV-25417, MDEV-29343). Here a busy disk slows prewarming to `busy_rate`, never to
//! nothing, and an idle disk lets it run at the full rate. Over any interval of length T
//! the bytes let through are at most `burst + rate · T` (the bound the tests check from
//! the backing's side).
//!
//! Hand-written: a token bucket in virtual time is a dozen lines, and the crates that
//! offer one (governor, leaky-bucket) read a clock or sleep, which a sans-IO core may not.

/// Bytes per second, per direction of pacing.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PaceConfig {
    /// The prewarm rate ceiling, bytes/s (`None`: unlimited).
    pub rate: Option<u64>,
    /// The rate while the disk serves client requests, bytes/s (≥ 1; capped by `rate`).
    pub busy_rate: u64,
    /// Bytes the buckets hold at most (at least one read's worth is always allowed).
    pub burst: u64,
}

#[derive(Debug, Clone)]
struct Bucket {
    /// Bytes per ns; `None` = unlimited.
    per_ns: Option<f64>,
    cap: f64,
    tokens: f64,
    at_ns: u64,
}

impl Bucket {
    fn new(rate: Option<u64>, cap: f64) -> Bucket {
        Bucket { per_ns: rate.map(|r| r.max(1) as f64 / 1e9), cap, tokens: cap, at_ns: 0 }
    }

    fn refill(&mut self, now_ns: u64) {
        if let Some(r) = self.per_ns {
            if now_ns > self.at_ns {
                self.tokens = (self.tokens + (now_ns - self.at_ns) as f64 * r).min(self.cap);
            }
        }
        self.at_ns = self.at_ns.max(now_ns);
    }

    /// When `bytes` may go (`now_ns` if at once).
    fn ready_at(&self, now_ns: u64, bytes: f64) -> u64 {
        let Some(r) = self.per_ns else { return now_ns };
        let tokens = (self.tokens + now_ns.saturating_sub(self.at_ns) as f64 * r).min(self.cap);
        if tokens >= bytes {
            now_ns
        } else {
            now_ns + ((bytes - tokens) / r).ceil() as u64
        }
    }

    fn take(&mut self, now_ns: u64, bytes: f64) {
        self.refill(now_ns);
        if self.per_ns.is_some() {
            self.tokens -= bytes;
        }
    }
}

/// The two buckets.
#[derive(Debug, Clone)]
pub struct Pacer {
    full: Bucket,
    busy: Bucket,
}

impl Pacer {
    /// A pacer whose buckets start full; `max_read` bytes (the largest read it will be
    /// asked for) always fit in a bucket.
    pub fn new(cfg: PaceConfig, max_read: u64) -> Pacer {
        let cap = cfg.burst.max(max_read).max(1) as f64;
        let busy = cfg.rate.map_or(cfg.busy_rate, |r| cfg.busy_rate.min(r)).max(1);
        Pacer { full: Bucket::new(cfg.rate, cap), busy: Bucket::new(Some(busy), cap) }
    }

    /// When a read of `bytes` may be issued, given whether its disk is busy with client
    /// requests.
    pub fn ready_at(&self, now_ns: u64, bytes: u64, busy: bool) -> u64 {
        let full = self.full.ready_at(now_ns, bytes as f64);
        if busy {
            full.max(self.busy.ready_at(now_ns, bytes as f64))
        } else {
            full
        }
    }

    /// Records a read of `bytes` issued at `now_ns` (after [`Self::ready_at`] allowed it).
    pub fn take(&mut self, now_ns: u64, bytes: u64, busy: bool) {
        self.full.take(now_ns, bytes as f64);
        if busy {
            self.busy.take(now_ns, bytes as f64);
        } else {
            self.busy.refill(now_ns);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_full_rate_when_idle_the_busy_rate_when_busy_never_zero() {
        // 1 MB/s, 100 kB/s busy, 64 kB burst; reads of 64 kB.
        let mut p = Pacer::new(PaceConfig { rate: Some(1_000_000), busy_rate: 100_000, burst: 64_000 }, 64_000);
        assert_eq!(p.ready_at(0, 64_000, false), 0);
        p.take(0, 64_000, false);
        assert_eq!(p.ready_at(0, 64_000, false), 64 * MS);
        // Busy: the busy bucket (full, since idle reads do not drain it) and the full one.
        assert_eq!(p.ready_at(0, 64_000, true), 64 * MS);
        p.take(64 * MS, 64_000, true);
        assert_eq!(p.ready_at(64 * MS, 64_000, true), 64 * MS + 640 * MS);
        assert_eq!(p.ready_at(64 * MS, 64_000, false), 128 * MS);
        // Unlimited rate: idle reads go at once; busy ones still at the busy rate.
        let mut u = Pacer::new(PaceConfig { rate: None, busy_rate: 1_000_000, burst: 0 }, 4096);
        for _ in 0..1000 {
            assert_eq!(u.ready_at(5, 4096, false), 5);
            u.take(5, 4096, false);
        }
        u.take(5, 4096, true);
        assert_eq!(u.ready_at(5, 4096, true), 5 + 4_096_000);
    }

    proptest! {
        /// Whatever the busy pattern and read sizes, a caller that issues as soon as it is
        /// allowed never lets more than burst + rate·T through in any interval T, and the
        /// busy periods alone get at least busy_rate over the long run.
        #[test]
        fn never_above_the_rate_and_never_starved(
            reads in prop::collection::vec((1u64..=64, any::<bool>()), 1..200),
            rate_kb in 50u64..2000,
            busy_kb in 1u64..100,
        ) {
            let cfg = PaceConfig { rate: Some(rate_kb * 1000), busy_rate: busy_kb * 1000, burst: 128_000 };
            let mut p = Pacer::new(cfg, 64 * 1024);
            let mut now = 0u64;
            let mut issued = Vec::new();
            for &(kb, busy) in &reads {
                let bytes = kb * 1024;
                let at = p.ready_at(now, bytes, busy);
                prop_assert!(at >= now);
                // Waiting is bounded by what the rate in force needs for this read.
                let r = if busy { busy_kb.min(rate_kb) } else { rate_kb } * 1000;
                prop_assert!(at - now <= bytes * 1_000_000_000 / r + 1);
                now = at;
                p.take(now, bytes, busy);
                issued.push((now, bytes));
            }
            let cap = 128_000f64.max(64.0 * 1024.0);
            for i in 0..issued.len() {
                let mut sum = 0u64;
                for &(t, b) in &issued[i..] {
                    sum += b;
                    let span = (t - issued[i].0) as f64 / 1e9;
                    prop_assert!(sum as f64 <= cap + (rate_kb * 1000) as f64 * span + 1.0,
                        "{} bytes in {} s", sum, span);
                }
            }
        }
    }
}
