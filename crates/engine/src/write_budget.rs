//! The write budget: a vDisk's misses enter the cache with a probability that a controller
//! adjusts so that the SSD bytes the vDisk writes hold a target rate — CacheLib's dynamic
//! random admission (its NVM admission policy held to a flash write rate, an endurance
//! budget), and what ECI-Cache's endurance goal asks for without switching a VM to
//! read-only (ECI-Cache §I: SSD writes wear the drive out).
//!
//! The controller runs on driver time (the request clock the engine already keeps) in
//! periods of [`PERIOD_MS`]. Over a period it counts the vDisk's SSD bytes written (every
//! SSD write the engine emits for it: fills, write hits, write misses, whatever the policy
//! did not ask about) and the misses it was asked about and admitted. At a period's end it
//! splits the bytes into what admission caused (admitted misses × the block size) and
//! what it cannot avoid (the rest: write hits, misses of a direction it does not govern),
//! smooths both as rates, and sets the probability so that the next period's expected
//! writes meet the target plus a share of the run's balance (what was under- or
//! overspent so far, bounded to [`CREDIT_S`] seconds of the target), so that the run's
//! total converges on the target rather than each period's. When the unavoidable writes
//! alone exceed the target, the probability is 0 and the state says so.
//!
//! Written here rather than taken from a library: it is twenty lines of arithmetic on the
//! engine's own counters, and it must be deterministic (the same stream, the same
//! decisions) so that the simulator's figures are the daemon's.

/// A controller period, driver milliseconds.
pub const PERIOD_MS: u32 = 1000;
/// The first period, shorter: until it ends every governed miss enters while what was
/// written stays under a period's worth of the target ([`WriteBudget::first_period_spent`]).
const FIRST_PERIOD_MS: u32 = 100;
/// The run's balance carried at most this many seconds of the target.
pub const CREDIT_S: f64 = 3600.0;
/// The balance is paid back over this many seconds.
const PAYBACK_S: f64 = 5.0;
/// Weight of the newest period in the smoothed rates.
const SMOOTHING: f64 = 0.5;

/// A write budget's target: bytes per second, or drive writes per day of the cache's
/// capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BudgetRate {
    /// Bytes per second.
    BytesPerSec(u64),
    /// Drive writes per day: this many times the cache's capacity every 86,400 s.
    Dwpd(f64),
}

impl BudgetRate {
    /// The rate in bytes per second for a cache of `capacity_bytes`.
    pub fn bytes_per_sec(self, capacity_bytes: u64) -> f64 {
        match self {
            BudgetRate::BytesPerSec(b) => b as f64,
            BudgetRate::Dwpd(d) => d * capacity_bytes as f64 / 86_400.0,
        }
    }

    /// Parses `50MiB/s`, `200KiB/s`, `1000B/s` or `3dwpd`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if let Some(d) = t.strip_suffix("dwpd").or_else(|| t.strip_suffix("DWPD")) {
            return match d.trim().parse::<f64>() {
                Ok(v) if v > 0.0 && v.is_finite() => Ok(BudgetRate::Dwpd(v)),
                _ => Err(format!("`{s}`: drive writes per day must be a number above 0, like 3dwpd")),
            };
        }
        let Some(size) = t.strip_suffix("/s") else {
            return Err(format!("`{s}`: a write budget is a rate like 50MiB/s or drive writes per day like 3dwpd"));
        };
        match cachevisor_trace::units::parse_size(size) {
            Ok(b) if b > 0 => Ok(BudgetRate::BytesPerSec(b)),
            Ok(_) => Err(format!("`{s}`: a write budget must be above 0")),
            Err(e) => Err(format!("write budget {e}")),
        }
    }
}

impl std::fmt::Display for BudgetRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            BudgetRate::Dwpd(d) => write!(f, "{d}dwpd"),
            BudgetRate::BytesPerSec(b) => {
                for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
                    if b % (1 << shift) == 0 {
                        return write!(f, "{}{unit}/s", b >> shift);
                    }
                }
                write!(f, "{b}B/s")
            }
        }
    }
}

/// What a write budget is doing (reported by `Engine::admission`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct BudgetState {
    /// The target, bytes per second.
    pub target_bytes_per_sec: f64,
    /// The probability a governed miss enters now.
    pub probability: f64,
    /// SSD bytes the vDisk wrote since the budget was set.
    pub written_bytes: u64,
    /// Driver seconds from the budget's first write or miss to its last: the span the
    /// vDisk was active in (a VM whose trace ended is not charged the time after).
    pub elapsed_s: f64,
    /// Whether the writes the budget cannot refuse (write hits, ungoverned misses)
    /// alone exceeded the target in the last period.
    pub unreachable: bool,
    /// Budget left unspent in periods that admitted every governed miss: a shortfall
    /// the stream caused (too few misses), not the controller.
    pub unspent_at_full_bytes: u64,
}

/// The controller (inside a vDisk's `Admission`).
#[derive(Debug, Clone)]
pub struct WriteBudget {
    target: f64,
    block_bytes: u64,
    p: f64,
    start_ms: Option<u32>,
    last_ms: u32,
    period_start_ms: u32,
    written: u64,
    period_written: u64,
    period_asked: u64,
    period_admitted: u64,
    /// Smoothed rates: unavoidable bytes per second, governed misses per second.
    unavoidable_rate: Option<f64>,
    asked_rate: Option<f64>,
    unreachable: bool,
    /// Periods ended.
    periods: u64,
    unspent_at_full: f64,
    /// The last period's length, seconds, and the rate of governed writes it left room
    /// for (what a shared budget splits: `shared_budget.rs`).
    last_period_s: f64,
    room: f64,
}

impl WriteBudget {
    /// A budget of `target` bytes per second; each admitted miss writes about
    /// `block_bytes`.
    pub fn new(target: f64, block_bytes: u64) -> Self {
        WriteBudget {
            target,
            block_bytes,
            p: 1.0,
            start_ms: None,
            last_ms: 0,
            period_start_ms: 0,
            written: 0,
            period_written: 0,
            period_asked: 0,
            period_admitted: 0,
            unavoidable_rate: None,
            asked_rate: None,
            unreachable: false,
            periods: 0,
            unspent_at_full: 0.0,
            last_period_s: 0.0,
            room: f64::INFINITY,
        }
    }

    /// Counts `bytes` the vDisk wrote to the SSD at `now_ms`.
    pub fn note_written(&mut self, now_ms: u32, bytes: u64) {
        self.advance(now_ms);
        self.written += bytes;
        self.period_written += bytes;
    }

    /// Whether a governed miss at `now_ms` may enter, given a uniform draw in [0, 1).
    pub fn admit(&mut self, now_ms: u32, draw: f64) -> bool {
        self.advance(now_ms);
        let ok = draw < self.p && !self.first_period_spent();
        self.count_asked(ok);
        ok
    }

    /// Counts a governed miss another decision admitted (`ok`) or not, after
    /// [`Self::tick`] (a shared budget decides per vDisk: `shared_budget.rs`).
    pub(crate) fn count_asked(&mut self, ok: bool) {
        self.period_asked += 1;
        self.period_admitted += ok as u64;
    }

    /// Whether the first period already wrote a full period's worth of the target: until
    /// it ends the controller knows nothing of the stream, so it admits every governed
    /// miss only up to that (a burst at the start cannot spend many seconds of the
    /// budget; a full period's rather than its own 100 ms' share, which cost the tpcc
    /// trace a tenth of its hits in `experiment admission`).
    pub(crate) fn first_period_spent(&self) -> bool {
        self.periods == 0 && self.written as f64 >= self.target * f64::from(PERIOD_MS) / 1000.0
    }

    /// Ends the period when `now_ms` is past it; returns the number of periods ended so
    /// far.
    pub(crate) fn tick(&mut self, now_ms: u32) -> u64 {
        self.advance(now_ms);
        self.periods
    }

    /// Periods ended so far.
    pub(crate) fn periods(&self) -> u64 {
        self.periods
    }

    /// The last period's length, seconds, and the rate of governed SSD writes the target
    /// leaves room for next (bytes per second; 0 or less: none; infinite before the first
    /// period ends).
    pub(crate) fn room(&self) -> (f64, f64) {
        (self.last_period_s, self.room)
    }

    /// Ends the period when `now_ms` is past it and sets the next probability.
    fn advance(&mut self, now_ms: u32) {
        let start = *self.start_ms.get_or_insert_with(|| {
            self.period_start_ms = now_ms;
            self.last_ms = now_ms;
            now_ms
        });
        if now_ms.wrapping_sub(self.last_ms) < u32::MAX / 2 {
            self.last_ms = now_ms;
        }
        let dt_ms = now_ms.wrapping_sub(self.period_start_ms);
        let period = if self.periods == 0 { FIRST_PERIOD_MS } else { PERIOD_MS };
        if dt_ms < period || dt_ms > u32::MAX / 2 {
            return; // Within the period (or a clock that went back: wait for it).
        }
        let dt = f64::from(dt_ms) / 1000.0;
        if self.period_admitted == self.period_asked {
            self.unspent_at_full += (self.target * dt - self.period_written as f64).max(0.0);
        }
        let caused = (self.period_admitted * self.block_bytes).min(self.period_written);
        let unavoidable = (self.period_written - caused) as f64 / dt;
        let asked = self.period_asked as f64 / dt;
        let smooth = |old: Option<f64>, new: f64| Some(old.map_or(new, |o| o + SMOOTHING * (new - o)));
        self.unavoidable_rate = smooth(self.unavoidable_rate, unavoidable);
        self.asked_rate = smooth(self.asked_rate, asked);
        let elapsed = f64::from(now_ms.wrapping_sub(start)) / 1000.0;
        let credit = CREDIT_S * self.target;
        let balance = (self.target * elapsed - self.written as f64).clamp(-credit, credit);
        let allowed = (self.target + balance / PAYBACK_S).max(0.0);
        let room = allowed - self.unavoidable_rate.unwrap_or(0.0);
        self.room = room;
        self.last_period_s = dt;
        self.unreachable = unavoidable > self.target;
        let demand = self.asked_rate.unwrap_or(0.0) * self.block_bytes as f64;
        if room <= 0.0 {
            self.p = 0.0;
        } else if demand > 0.0 {
            self.p = (room / demand).min(1.0);
        }
        self.periods += 1;
        self.period_start_ms = now_ms;
        self.period_written = 0;
        self.period_asked = 0;
        self.period_admitted = 0;
    }

    /// What the budget is doing.
    pub fn state(&self) -> BudgetState {
        BudgetState {
            target_bytes_per_sec: self.target,
            probability: self.p,
            written_bytes: self.written,
            elapsed_s: self.start_ms.map_or(0.0, |s| f64::from(self.last_ms.wrapping_sub(s)) / 1000.0),
            unreachable: self.unreachable,
            unspent_at_full_bytes: self.unspent_at_full as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rates_parse_and_print_back() {
        for s in ["50MiB/s", "200KiB/s", "1000B/s", "3dwpd", "0.5dwpd", "2GiB/s"] {
            assert_eq!(BudgetRate::parse(s).unwrap().to_string(), s);
        }
        assert_eq!(BudgetRate::parse("1MB/s").unwrap(), BudgetRate::BytesPerSec(1 << 20));
        assert_eq!(BudgetRate::Dwpd(1.0).bytes_per_sec(86_400 * 4096), 4096.0);
        for bad in ["50MiB", "0B/s", "-1MiB/s", "xdwpd", "0dwpd", "infdwpd", "5furlongs/s", ""] {
            assert!(BudgetRate::parse(bad).is_err(), "{bad}");
        }
    }

    /// Drives a budget with `misses` governed misses and `hits` unavoidable block writes
    /// per second for `secs` seconds, events spread evenly; returns the bytes written.
    fn drive(b: &mut WriteBudget, misses: u64, hits: u64, secs: u64, seed: u64) -> u64 {
        let mut rng = seed;
        let mut written = 0;
        for s in 0..secs {
            let n = misses + hits;
            for i in 0..n {
                let now = (s * 1000 + i * 1000 / n.max(1)) as u32;
                // Hits spread among the misses (Bresenham).
                let write_hit = (i + 1) * hits / n != i * hits / n;
                if write_hit {
                    b.note_written(now, 4096);
                    written += 4096;
                } else {
                    let draw = (crate::block_admission::splitmix(&mut rng) >> 11) as f64 / (1u64 << 53) as f64;
                    if b.admit(now, draw) {
                        b.note_written(now, 4096);
                        written += 4096;
                    }
                }
            }
        }
        written
    }

    proptest! {
        /// Over a run the budget holds the written bytes within 5% of the target whenever
        /// the target lies between what cannot be refused and what admitting everything
        /// would write; outside it, at those bounds.
        #[test]
        fn the_run_total_meets_the_target(misses in 200u64..2000, hits in 0u64..400, share in 0.05f64..1.5, seed in any::<u64>()) {
            let all = (misses + hits) * 4096;
            let target = share * all as f64;
            let mut b = WriteBudget::new(target, 4096);
            let secs = 120;
            let written = drive(&mut b, misses, hits, secs, seed) as f64;
            let floor = (hits * 4096 * secs) as f64;
            let ceiling = (all * secs) as f64;
            let want = (target * secs as f64).clamp(floor, ceiling);
            prop_assert!((written - want).abs() <= 0.05 * want, "wrote {} want {} (floor {} ceiling {})", written, want, floor, ceiling);
            let unreachable = b.state().unreachable;
            if floor > 1.1 * target * secs as f64 {
                prop_assert!(unreachable);
            } else if floor < 0.9 * target * secs as f64 {
                prop_assert!(!unreachable);
            }
        }
    }
}
