//! rECS, the ratio of effective cache space (S-CAVE §IV-A, §IV-B): for each VM, the share
//! of its allocated blocks that were hit, estimated at run time by sampled scans of the
//! blocks' reference counters.
//!
//! Each time window is split into sampling periods spread over it (the seed: five 0.1 s
//! periods in a 1 s window, footnote 3): a driver calls [`RecsEstimator::sample_due`] as
//! time passes, and [`RecsEstimator::sample_window`] at the window's end takes the
//! periods still missing. A period starts at a random block of the global pool and scans
//! a fixed number of consecutive blocks, counting per VM the
//! blocks it owns (N_all) and those whose reference counter is above zero (N_e). A VM's
//! sampled rECS is the mean of N_e/N_all over the periods that saw its blocks, and the
//! reported value is smoothed: rECS = α·rECS_old + (1 − α)·rECS_sampled, α = 0.8 (§IV-B).
//!
//! The estimator reads engine state through a probe closure (slot → owner and whether
//! its counter is non-zero), so this crate stays independent of the engine. Deviation:
//! counters are not reset at window boundaries (the seed does not say they are; CLOCK's
//! hand ages them as it sweeps). Not for policies without a reference counter.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Default smoothing parameter α (S-CAVE §IV-B).
pub const ALPHA: f64 = 0.8;

/// Sampled, smoothed rECS per VM.
#[derive(Debug, Clone)]
pub struct RecsEstimator {
    alpha: f64,
    periods: u32,
    blocks_per_period: u64,
    rng: ChaCha8Rng,
    value: Vec<Option<f64>>,
    sampled: Vec<Option<f64>>,
    /// This window's periods so far: per VM the sum of N_e/N_all and the periods that
    /// saw its blocks, and how many periods ran.
    sum: Vec<f64>,
    seen: Vec<u32>,
    taken: u32,
}

impl RecsEstimator {
    /// `periods` sampling periods per window, each scanning `blocks_per_period` blocks.
    pub fn new(alpha: f64, periods: u32, blocks_per_period: u64, seed: u64) -> Self {
        RecsEstimator {
            alpha,
            periods: periods.max(1),
            blocks_per_period: blocks_per_period.max(1),
            rng: ChaCha8Rng::seed_from_u64(seed),
            value: Vec::new(),
            sampled: Vec::new(),
            sum: Vec::new(),
            seen: Vec::new(),
            taken: 0,
        }
    }

    /// The share of the window (0 to 1) at which the next period run by
    /// [`Self::sample_due`] is due; `None` when only the window's end is left.
    pub fn next_due(&self) -> Option<f64> {
        (self.taken + 1 < self.periods).then(|| f64::from(self.taken + 1) / f64::from(self.periods))
    }

    /// Runs the periods due by `elapsed` (the share of the window gone, 0 to 1): period k
    /// of n is due at k/n, the last one at the window's end ([`Self::sample_window`]).
    pub fn sample_due(&mut self, elapsed: f64, slots: u64, probe: impl Fn(u64) -> Option<(u32, bool)>) {
        while self.taken + 1 < self.periods && f64::from(self.taken + 1) / f64::from(self.periods) <= elapsed {
            self.sample_period(slots, &probe);
        }
    }

    /// Ends the window over a pool of `slots` blocks: runs the periods not yet run,
    /// then averages them. `probe(slot)` gives the owner VM of a resident slot and
    /// whether its reference counter is non-zero. Returns the smoothed rECS by VM id
    /// (`None` for VMs never seen holding blocks).
    pub fn sample_window(&mut self, slots: u64, probe: impl Fn(u64) -> Option<(u32, bool)>) -> &[Option<f64>] {
        while self.taken < self.periods {
            self.sample_period(slots, &probe);
        }
        let (sum, seen) = (std::mem::take(&mut self.sum), std::mem::take(&mut self.seen));
        self.taken = 0;
        if self.value.len() < sum.len() {
            self.value.resize(sum.len(), None);
        }
        self.sampled.clear();
        self.sampled.resize(self.value.len(), None);
        for (v, (&s, &k)) in sum.iter().zip(&seen).enumerate() {
            if k > 0 {
                let sampled = s / k as f64;
                self.sampled[v] = Some(sampled);
                self.value[v] = Some(match self.value[v] {
                    Some(old) => self.alpha * old + (1.0 - self.alpha) * sampled,
                    None => sampled,
                });
            }
        }
        &self.value
    }

    /// One sampling period: a run of consecutive blocks from a random one.
    fn sample_period(&mut self, slots: u64, probe: &impl Fn(u64) -> Option<(u32, bool)>) {
        self.taken += 1;
        if slots == 0 {
            return;
        }
        let n = self.blocks_per_period.min(slots);
        let start = self.rng.gen_range(0..slots);
        let mut all: Vec<u64> = Vec::new();
        let mut eff: Vec<u64> = Vec::new();
        // Slots start.. then from 0 (a wrap, not a division per probe).
        let (head, tail) = (start..(start + n).min(slots), 0..(start + n).saturating_sub(slots));
        for slot in head.chain(tail) {
            if let Some((vm, referenced)) = probe(slot) {
                let v = vm as usize;
                if all.len() <= v {
                    all.resize(v + 1, 0);
                    eff.resize(v + 1, 0);
                }
                all[v] += 1;
                eff[v] += referenced as u64;
            }
        }
        for (v, (&a, &e)) in all.iter().zip(&eff).enumerate() {
            if a > 0 {
                if self.sum.len() <= v {
                    self.sum.resize(v + 1, 0.0);
                    self.seen.resize(v + 1, 0);
                }
                self.sum[v] += e as f64 / a as f64;
                self.seen[v] += 1;
            }
        }
    }

    /// The last window's unsmoothed samples by VM id (`None` where no block was seen):
    /// what S-CAVE's Algorithm 1 smooths itself (line 13).
    pub fn sampled(&self) -> &[Option<f64>] {
        &self.sampled
    }

    /// Current smoothed values by VM id.
    pub fn values(&self) -> &[Option<f64>] {
        &self.value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_run_when_due_and_the_window_end_takes_the_rest() {
        // Two full-scan periods per window over 100 slots of VM 0.
        let hot = |_: u64| Some((0, true));
        let cold = |_: u64| Some((0, false));
        let mut r = RecsEstimator::new(0.8, 2, 100, 1);
        r.sample_due(0.3, 100, hot); // not due before half the window
        r.sample_due(0.6, 100, hot); // period 1 of 2, on the state at 60%
        r.sample_due(0.9, 100, hot); // the last is the window end's
        r.sample_window(100, cold);
        assert_eq!(r.sampled(), [Some(0.5)], "one period hot, one cold");
        // Without calls during the window, both periods see the state at its end.
        r.sample_window(100, hot);
        assert_eq!(r.sampled(), [Some(1.0)]);
    }

    #[test]
    fn full_scan_is_exact_and_smoothing_follows_the_formula() {
        // 100 slots: VM 0 owns 0..60 with 15 referenced, VM 1 owns 60..100 with 30 referenced.
        let probe = |s: u64| Some(if s < 60 { (0, s < 15) } else { (1, s < 90) });
        let mut r = RecsEstimator::new(0.8, 1, 100, 1);
        let v = r.sample_window(100, probe).to_vec();
        assert_eq!(v, [Some(0.25), Some(0.75)]);
        // Next window everything is referenced: 0.8·old + 0.2·1.
        let v = r.sample_window(100, |s| Some(if s < 60 { (0, true) } else { (1, true) })).to_vec();
        assert!((v[0].unwrap() - (0.8 * 0.25 + 0.2)).abs() < 1e-12);
        assert!((v[1].unwrap() - (0.8 * 0.75 + 0.2)).abs() < 1e-12);
    }

    #[test]
    fn sampled_periods_estimate_the_ratio() {
        // Every 4th slot referenced: rECS 0.25 whatever the start.
        let probe = |s: u64| Some((0, s.is_multiple_of(4)));
        let mut r = RecsEstimator::new(0.0, 5, 1000, 7);
        let v = r.sample_window(1_000_000, probe)[0].unwrap();
        assert!((v - 0.25).abs() < 0.002, "{v}");
        // Free slots are skipped.
        let mut r = RecsEstimator::new(0.0, 5, 1000, 7);
        let v = r.sample_window(1000, |s| (s % 2 == 0).then_some((0, s % 4 == 0)))[0].unwrap();
        assert!((v - 0.5).abs() < 1e-12);
    }
}
