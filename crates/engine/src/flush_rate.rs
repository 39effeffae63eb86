//! How fast the background flusher writes back: bcache's writeback rate controller
//! (Linux `drivers/md/bcache/writeback.c`, `__update_writeback_rate`), a PI controller
//! on the dirty blocks above the target, so a cache a little over its dirty target is
//! written back a little at a time and the client's I/O keeps the devices.
//!
//! Per flusher step: the error is `dirty − target` blocks; the rate is
//! `error / P + integral / I` blocks per second (bcache's `writeback_rate_p_term_inverse`
//! 40 s and `writeback_rate_i_term_inverse` 10,000 s²), at least [`MIN_BLOCKS_PER_S`]
//! and at most the configured `flush_rate` (the ceiling). The integral sums
//! `error × step` while the rate is below the ceiling (no wind-up) and shrinks back when
//! the cache is under its target. Two cases write at the ceiling, as bcache does: a
//! target of 0 (`writeback_percent = 0` writes everything back at full rate) and an idle
//! cache (no client request for [`IDLE_STEPS`] steps: bcache raises an idle cache set to
//! its maximum rate). Fractions of a block carry to the next step; unused whole blocks
//! do not (the rate is a ceiling, not a debt).
//!
//! The rate depends only on what the daemon and the simulator see alike — dirty
//! blocks, the target, client requests per step — so a recording replayed writes back
//! what the daemon did. A rule on the cache device's measured busy time (the full rate
//! while client ops kept it busy less than half a step) was tried and dropped: the
//! simulated clusters kept their earlier idle-time write-back with it, but the simulator
//! then decided from its device models' busy time and the daemon from its files', and a
//! replayed recording wrote back 6,857 blocks where the daemon had written 960.
//!
//! Written by hand: a dozen lines of arithmetic on the engine's own counters, pure
//! (time arrives as the step length), that no crate offers in this shape.

use crate::timers::Flusher;

/// The proportional term's inverse in seconds: an error of E blocks alone writes E / 40
/// blocks per second (bcache's default `writeback_rate_p_term_inverse`).
pub const P_TERM_INVERSE_S: f64 = 40.0;
/// The integral term's inverse in s² (bcache's default `writeback_rate_i_term_inverse`).
pub const I_TERM_INVERSE_S2: f64 = 10_000.0;
/// The slowest rate while the cache is over its target (bcache's
/// `writeback_rate_minimum` is 8 sectors/s, one 4 KiB block).
pub const MIN_BLOCKS_PER_S: f64 = 1.0;
/// Flusher steps with no client request after which the cache counts as idle and is
/// written back at the ceiling (1 s at the daemon's 100 ms steps).
pub const IDLE_STEPS: u32 = 10;

/// The controller's state (inside the engine's timers).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlushRate {
    /// Σ error × step in block·seconds.
    integral: f64,
    /// Fraction of a block earned and not written yet (< 1).
    credit: f64,
    /// Steps in a row without a client request.
    quiet_steps: u32,
    /// The rate chosen at the last step, blocks per second.
    blocks_per_s: f64,
}

impl FlushRate {
    /// One flusher step of `f`: `dirty` and `target` in blocks, `requests` the client
    /// requests since the last step. Returns the blocks this step may write back.
    pub fn step(&mut self, f: &Flusher, dirty: u64, target: u64, requests: u64) -> u64 {
        let step_s = f.period_ns.max(1) as f64 / 1e9;
        let ceiling = f.blocks_per_period.max(1) as f64 / step_s;
        self.quiet_steps = if requests == 0 { self.quiet_steps.saturating_add(1) } else { 0 };
        let error = dirty as f64 - target as f64;
        self.blocks_per_s = if f.dirty_target <= 0.0 || self.quiet_steps >= IDLE_STEPS {
            ceiling
        } else {
            let below_ceiling = self.blocks_per_s < ceiling;
            if (error < 0.0 && self.integral > 0.0) || (error > 0.0 && below_ceiling) {
                self.integral = (self.integral + error * step_s).max(0.0);
            }
            (error / P_TERM_INVERSE_S + self.integral / I_TERM_INVERSE_S2).clamp(MIN_BLOCKS_PER_S.min(ceiling), ceiling)
        };
        let earned = self.credit + self.blocks_per_s * step_s;
        let blocks = earned.floor();
        self.credit = earned - blocks;
        blocks as u64
    }

    /// Whether the last step found the cache idle (no client request for
    /// [`IDLE_STEPS`] steps).
    pub fn idle(&self) -> bool {
        self.quiet_steps >= IDLE_STEPS
    }

    /// The rate chosen at the last step, blocks per second (0 before the first).
    pub fn blocks_per_s(&self) -> f64 {
        self.blocks_per_s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The daemon's default flusher: 100 ms steps, 16 MiB/s of 4 KiB blocks, 10% dirty.
    fn daemon() -> Flusher {
        Flusher { period_ns: 100_000_000, blocks_per_period: 409, dirty_target: 0.1 }
    }

    #[test]
    fn a_little_over_target_writes_a_little_and_idle_writes_at_the_ceiling() {
        let mut r = FlushRate::default();
        // 4,000 blocks over target under load: 100 blocks/s, 10 per 100 ms step.
        assert_eq!(r.step(&daemon(), 14_000, 10_000, 5), 10);
        assert!((r.blocks_per_s() - 100.0).abs() < 0.5, "{}", r.blocks_per_s());
        // 20 blocks over: half a block per second by P, raised to the minimum of one
        // block per second (a block every 10 steps).
        let mut r = FlushRate::default();
        let written: u64 = (0..41).map(|_| r.step(&daemon(), 10_020, 10_000, 1)).sum();
        assert_eq!((written, r.blocks_per_s()), (4, MIN_BLOCKS_PER_S));
        // No client request for IDLE_STEPS steps: the ceiling.
        let mut r = FlushRate::default();
        for _ in 0..IDLE_STEPS - 1 {
            assert!(r.step(&daemon(), 10_020, 10_000, 0) <= 1);
        }
        assert_eq!(r.step(&daemon(), 10_020, 10_000, 0), 409);
        // One request ends the idle run.
        assert!(r.step(&daemon(), 10_020, 10_000, 1) <= 1);
        // A target of 0 writes at the ceiling whatever the load.
        let zero = Flusher { dirty_target: 0.0, ..daemon() };
        assert_eq!(FlushRate::default().step(&zero, 5, 0, 100), 409);
    }

    #[test]
    fn a_lasting_error_raises_the_rate_and_it_falls_back_under_target() {
        let mut r = FlushRate::default();
        r.step(&daemon(), 20_000, 10_000, 1);
        let first = r.blocks_per_s();
        for _ in 0..6_000 {
            r.step(&daemon(), 20_000, 10_000, 1); // 10 minutes 10,000 blocks over
        }
        let later = r.blocks_per_s();
        // P alone: 250/s; after 600 s the integral adds 10,000 × 600 / 10,000 = 600/s.
        assert!((first - 250.0).abs() < 1.0 && (later - 850.0).abs() < 5.0, "{first} then {later}");
        // 1,000 blocks under target: the integral (6,000,000 block·s) drains by 100 per
        // step, the rate falls back to the minimum.
        for _ in 0..60_100 {
            r.step(&daemon(), 9_000, 10_000, 1);
        }
        assert_eq!(r.blocks_per_s(), MIN_BLOCKS_PER_S, "under target the integral drains");
        assert_eq!(r.integral, 0.0);
    }

    proptest! {
        /// Against the formula written out: every step's rate lies in
        /// [min, ceiling], equals the PI sum when not clamped, and the blocks written over
        /// a run equal the rates' sum over time to within one block.
        #[test]
        fn the_rate_stays_in_bounds_and_the_blocks_follow_it(
            steps in proptest::collection::vec((0u64..50_000, 0u64..3), 1..200),
            per_step in 1u64..1000,
            target in 0u64..20_000,
        ) {
            let f = Flusher { period_ns: 100_000_000, blocks_per_period: per_step, dirty_target: 0.1 };
            let ceiling = per_step as f64 * 10.0;
            let mut r = FlushRate::default();
            let (mut integral, mut quiet, mut last, mut total_rate, mut written) = (0f64, 0u32, 0f64, 0f64, 0u64);
            for &(dirty, requests) in &steps {
                written += r.step(&f, dirty, target, requests);
                quiet = if requests == 0 { quiet + 1 } else { 0 };
                let error = dirty as f64 - target as f64;
                let want = if quiet >= IDLE_STEPS {
                    ceiling
                } else {
                    if (error < 0.0 && integral > 0.0) || (error > 0.0 && last < ceiling) {
                        integral = (integral + error * 0.1).max(0.0);
                    }
                    (error / 40.0 + integral / 10_000.0).max(1.0).min(ceiling)
                };
                last = want;
                prop_assert!((r.blocks_per_s() - want).abs() < 1e-9 * want.max(1.0));
                prop_assert!(r.blocks_per_s() >= 1.0_f64.min(ceiling) && r.blocks_per_s() <= ceiling);
                total_rate += want * 0.1;
            }
            prop_assert!((written as f64 - total_rate).abs() < 1.0 + 1e-6 * total_rate);
        }
    }
}
