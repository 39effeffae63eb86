//! When migrations start and how (ELICA §3.6.3), and what they cost (§3.6: migration
//! time, reserved capacity, bandwidth):
//!
//! - **Rate-limited migration**: at most `rate` migrations start per second (a token
//!   bucket of `burst`); the others wait in arrival order.
//! - **Latency-aware selection**: a migration starting while the network is congested
//!   (the driver's measured link utilization at or above `congested`) is Gradual — it
//!   spreads its traffic over the VM's own accesses —, otherwise Instant. The seed gives
//!   no threshold; 0.5 is ours (`docs/cluster.md`): above half the link busy, queueing
//!   delay on a 10 GbE link starts to grow faster than linearly (M/M/1: ρ / (1 − ρ)).
//! - **Cost**: per migration the time from start to its last block leaving the source,
//!   the reserved capacity (blocks still held at the source — integrated over time, in
//!   block-seconds, and the peak over all migrations in flight) and the bytes moved
//!   (each read from the source SSD, sent over the network and written at the
//!   destination).
//!
//! Pure: the driver passes time in (µs), reports blocks moved, and executes the
//! per-block states of [`crate::migration::Migration`]. Hand-written: a bucket and a few
//! counters, ELICA's own rules.

use crate::migration::Scheme;
use std::collections::VecDeque;

/// The planner's settings.
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlanSettings {
    /// Migrations that may start per second (the bucket's refill).
    pub rate: f64,
    /// Migrations that may start at once after a quiet spell (the bucket's size).
    pub burst: u32,
    /// Link utilization (0..=1) at or above which a migration is Gradual.
    pub congested: f64,
    /// Force one scheme (the experiments compare GM and IM); `None`: by congestion.
    pub scheme: Option<SchemeChoice>,
}

/// A forced scheme, as the scenario names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SchemeChoice {
    /// Always Gradual Migration.
    Gradual,
    /// Always Instant Migration.
    Instant,
}

impl Default for PlanSettings {
    fn default() -> Self {
        PlanSettings { rate: 4.0, burst: 8, congested: 0.5, scheme: None }
    }
}

/// The most migrations per second a rate may let start (a migration is a VM's share
/// moving; ELICA §3.6.3 limits them to keep the links free for VM I/O — beyond this a
/// limit is no limit).
pub const MAX_RATE: f64 = 1000.0;

/// The most migrations a burst may start at once.
pub const MAX_BURST: u32 = 1000;

impl PlanSettings {
    /// Checks the settings; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.rate.is_finite() && self.rate > 0.0 && self.rate <= MAX_RATE) {
            return Err(format!(
                "migration.rate must be a number of migrations per second above 0 and at most {MAX_RATE}, got {}",
                self.rate
            ));
        }
        if !(1..=MAX_BURST).contains(&self.burst) {
            return Err(format!("migration.burst must be 1 to {MAX_BURST}, got {}", self.burst));
        }
        if !(0.0..=1.0).contains(&self.congested) {
            return Err(format!("migration.congested must be a utilization in 0..=1, got {}", self.congested));
        }
        Ok(())
    }
}

/// A migration the planner lets start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Start {
    /// The caller's id for it.
    pub id: u64,
    /// Gradual or Instant.
    pub scheme: Scheme,
}

/// One migration in flight.
#[derive(Debug, Clone, Copy)]
struct Active {
    id: u64,
    scheme: Scheme,
    started: u64,
    /// Blocks still at the source.
    held: u64,
}

/// What migrations have cost so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct MigrationCost {
    /// Migrations started, Gradual and Instant.
    pub started_gradual: u64,
    /// Instant ones.
    pub started_instant: u64,
    /// Migrations whose source is empty.
    pub finished: u64,
    /// Sum of their durations (µs), Gradual and Instant.
    pub time_gradual_us: u64,
    /// Instant ones.
    pub time_instant_us: u64,
    /// Finished Gradual and Instant ones (for the means).
    pub finished_gradual: u64,
    /// Finished Instant ones.
    pub finished_instant: u64,
    /// Reserved capacity integrated over time, block-seconds.
    pub reserved_block_s: f64,
    /// The most blocks held at sources at once.
    pub reserved_peak: u64,
    /// Bytes moved (read at the source, over the network, written at the destination).
    pub bytes_moved: u64,
}

/// The planner (see the top comment).
#[derive(Debug, Clone)]
pub struct MigrationPlanner {
    settings: PlanSettings,
    tokens: f64,
    last: u64,
    /// (id, blocks at its source) in request order.
    waiting: VecDeque<(u64, u64)>,
    active: Vec<Active>,
    held_now: u64,
    cost: MigrationCost,
}

impl MigrationPlanner {
    /// A planner with a full bucket at time 0.
    pub fn new(settings: PlanSettings) -> Result<MigrationPlanner, String> {
        settings.validate()?;
        Ok(MigrationPlanner {
            settings,
            tokens: settings.burst as f64,
            last: 0,
            waiting: VecDeque::new(),
            active: Vec::new(),
            held_now: 0,
            cost: MigrationCost::default(),
        })
    }

    /// Moves the clock to `now`: refills the bucket, integrates reserved capacity.
    fn tick(&mut self, now: u64) {
        let dt = now.saturating_sub(self.last);
        self.tokens = (self.tokens + dt as f64 * 1e-6 * self.settings.rate).min(self.settings.burst as f64);
        self.cost.reserved_block_s += self.held_now as f64 * dt as f64 * 1e-6;
        self.last = self.last.max(now);
    }

    /// Asks to migrate `id`, `blocks` of it at its source (it waits behind earlier
    /// requests).
    pub fn request(&mut self, now: u64, id: u64, blocks: u64) {
        self.tick(now);
        self.waiting.push_back((id, blocks));
    }

    /// Migrations waiting for the rate limit.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The next migration allowed to start at `now`, given the link utilization
    /// `utilization`; `None` while the bucket is empty or nothing waits.
    pub fn poll(&mut self, now: u64, utilization: f64) -> Option<Start> {
        self.tick(now);
        if self.waiting.is_empty() || self.tokens < 1.0 {
            return None;
        }
        self.tokens -= 1.0;
        let (id, held) = self.waiting.pop_front().expect("not empty");
        let scheme = match self.settings.scheme {
            Some(SchemeChoice::Gradual) => Scheme::Gradual,
            Some(SchemeChoice::Instant) => Scheme::Instant,
            None if utilization >= self.settings.congested => Scheme::Gradual,
            None => Scheme::Instant,
        };
        match scheme {
            Scheme::Gradual => self.cost.started_gradual += 1,
            Scheme::Instant => self.cost.started_instant += 1,
        }
        self.active.push(Active { id, scheme, started: now, held });
        self.held_now += held;
        self.cost.reserved_peak = self.cost.reserved_peak.max(self.held_now);
        if held == 0 {
            self.moved(now, id, 0, 0);
        }
        Some(Start { id, scheme })
    }

    /// When the next waiting migration may start, if one waits (for the driver's timer).
    pub fn next_start(&self) -> Option<u64> {
        if self.waiting.is_empty() {
            return None;
        }
        let short = (1.0 - self.tokens).max(0.0);
        Some(self.last + (short / self.settings.rate * 1e6).ceil() as u64)
    }

    /// `blocks` of migration `id` left its source at `now` (moved, or dropped there by
    /// a write), `bytes` of them copied; the migration ends when none is left.
    pub fn moved(&mut self, now: u64, id: u64, blocks: u64, bytes: u64) {
        self.tick(now);
        self.cost.bytes_moved += bytes;
        let Some(i) = self.active.iter().position(|a| a.id == id) else { return };
        let a = &mut self.active[i];
        let gone = blocks.min(a.held);
        a.held -= gone;
        self.held_now -= gone;
        if a.held == 0 {
            let a = self.active.swap_remove(i);
            let took = now - a.started;
            self.cost.finished += 1;
            match a.scheme {
                Scheme::Gradual => {
                    self.cost.finished_gradual += 1;
                    self.cost.time_gradual_us += took;
                }
                Scheme::Instant => {
                    self.cost.finished_instant += 1;
                    self.cost.time_instant_us += took;
                }
            }
        }
    }

    /// Migrations in flight.
    pub fn active(&self) -> usize {
        self.active.len()
    }

    /// The cost so far (reserved capacity integrated up to `now`).
    pub fn cost(&mut self, now: u64) -> MigrationCost {
        self.tick(now);
        self.cost
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn planner(rate: f64, burst: u32) -> MigrationPlanner {
        MigrationPlanner::new(PlanSettings { rate, burst, ..PlanSettings::default() }).unwrap()
    }

    #[test]
    fn congestion_picks_gradual_and_a_quiet_link_instant() {
        let mut p = planner(10.0, 4);
        p.request(0, 1, 10);
        p.request(0, 2, 10);
        assert_eq!(p.poll(0, 0.8), Some(Start { id: 1, scheme: Scheme::Gradual }));
        assert_eq!(p.poll(0, 0.2), Some(Start { id: 2, scheme: Scheme::Instant }));
        let forced = PlanSettings { scheme: Some(SchemeChoice::Instant), ..PlanSettings::default() };
        let mut p = MigrationPlanner::new(forced).unwrap();
        p.request(0, 7, 1);
        assert_eq!(p.poll(0, 1.0).unwrap().scheme, Scheme::Instant, "forced");
    }

    #[test]
    fn cost_counts_time_reserved_capacity_and_bytes() {
        let mut p = planner(10.0, 4);
        p.request(0, 1, 100);
        p.poll(0, 0.0).unwrap();
        p.moved(1_000_000, 1, 50, 50 * 4096); // half gone after 1 s
        p.moved(3_000_000, 1, 50, 50 * 4096); // the rest 2 s later
        let c = p.cost(5_000_000);
        assert_eq!((c.started_instant, c.finished_instant, c.time_instant_us), (1, 1, 3_000_000));
        assert!((c.reserved_block_s - (100.0 * 1.0 + 50.0 * 2.0)).abs() < 1e-9);
        assert_eq!((c.reserved_peak, c.bytes_moved), (100, 100 * 4096));
        assert_eq!(p.active(), 0);
    }

    #[test]
    fn bad_settings_are_named() {
        let bad = |s: PlanSettings| MigrationPlanner::new(s).unwrap_err();
        assert!(bad(PlanSettings { rate: 0.0, ..Default::default() }).contains("migration.rate"));
        assert!(bad(PlanSettings { burst: 0, ..Default::default() }).contains("migration.burst"));
        assert!(bad(PlanSettings { rate: 1001.0, ..Default::default() }).contains("at most 1000"));
        assert!(bad(PlanSettings { burst: 1001, ..Default::default() }).contains("1 to 1000"));
        assert!(PlanSettings { rate: MAX_RATE, burst: MAX_BURST, ..Default::default() }.validate().is_ok());
        assert!(bad(PlanSettings { congested: 1.5, ..Default::default() }).contains("migration.congested"));
    }

    proptest! {
        /// The rate limit against its definition: over any span of T seconds at most
        /// burst + rate·T migrations start; they start in request order; a waiting one
        /// starts by the time `next_start` says.
        #[test]
        fn starts_respect_the_rate(
            rate in 0.5f64..20.0,
            burst in 1u32..5,
            gaps in prop::collection::vec(0u64..400_000, 1..60),
        ) {
            let mut p = planner(rate, burst);
            let mut now = 0;
            let mut starts = Vec::new();
            for (id, g) in gaps.iter().enumerate() {
                now += g;
                p.request(now, id as u64, 1);
                while let Some(s) = p.poll(now, 0.0) {
                    starts.push((now, s.id));
                }
            }
            while let Some(t) = p.next_start() {
                prop_assert!(t >= now);
                now = t;
                let s = p.poll(now, 0.0);
                prop_assert!(s.is_some(), "next_start said {} but nothing started", t);
                starts.push((now, s.unwrap().id));
            }
            prop_assert_eq!(starts.len(), gaps.len());
            prop_assert!(starts.windows(2).all(|w| w[0].1 < w[1].1), "request order");
            for (i, &(t0, _)) in starts.iter().enumerate() {
                for (j, &(t1, _)) in starts.iter().enumerate().skip(i) {
                    let span = (t1 - t0) as f64 * 1e-6;
                    prop_assert!((j - i + 1) as f64 <= burst as f64 + rate * span + 1e-6,
                        "{} starts in {:.3} s", j - i + 1, span);
                }
            }
        }
    }
}
