//! Sequential cutoff (the knob bcache and dm-cache users reach for first): once a VM's
//! requests have run contiguously for more than its cutoff, further requests of the
//! stream do not take new cache slots — misses go to the backing store, while blocks
//! already cached are still served and updated there (so no stale data is ever read).
//! A request that does not start where the previous one ended starts a new run.
//!
//! The same detector is ELICA-Traffic's (§3.4, `Partition::traffic` at
//! `TRAFFIC_RUN` − 1): "a sequence of requests to consecutive addresses [is] sequential,
//! when the aggregate size of requests surpasses a threshold (64KB)"; the first requests
//! of a run, below it, count as random (the pattern is not recognized yet).
/// Per-VM stream state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SequentialCutoff {
    /// Bytes of contiguous run after which misses bypass the cache; 0 = off.
    pub cutoff: u64,
    next: u64,
    run: u64,
}

impl SequentialCutoff {
    /// A detector whose runs count as long once above `cutoff` bytes.
    pub fn new(cutoff: u64) -> Self {
        SequentialCutoff { cutoff, ..Default::default() }
    }

    /// Accounts a request of `len` bytes at `offset`; returns whether it bypasses the cache
    /// for new blocks.
    #[inline]
    pub fn bypass(&mut self, offset: u64, len: u64) -> bool {
        if self.cutoff == 0 {
            return false;
        }
        self.run = if offset == self.next { self.run.saturating_add(len) } else { len };
        self.next = offset + len;
        self.run > self.cutoff
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Against brute force (ELICA-Traffic's definition, §3.4): a request is in a long
        /// run exactly when the bytes of the longest chain of back-to-back requests ending
        /// with it reach the threshold.
        #[test]
        fn matches_the_definition(reqs in prop::collection::vec((0u64..8, 1u64..5), 1..60), th in 2u64..12) {
            let mut d = SequentialCutoff::new(th - 1);
            let mut seen: Vec<(u64, u64)> = Vec::new();
            for &(off, len) in &reqs {
                let got = d.bypass(off, len);
                let mut bytes = len;
                let mut start = off;
                for r in seen.iter().rev() {
                    if r.0 + r.1 == start { bytes += r.1; start = r.0; } else { break; }
                }
                prop_assert_eq!(got, bytes >= th);
                seen.push((off, len));
            }
        }
    }

    #[test]
    fn long_contiguous_runs_bypass_and_a_jump_resets() {
        let mut s = SequentialCutoff { cutoff: 16384, ..Default::default() };
        let got: Vec<bool> = (0..6).map(|i| s.bypass(i * 4096, 4096)).collect();
        assert_eq!(got, [false, false, false, false, true, true]);
        assert!(!s.bypass(1 << 20, 4096), "a jump starts a new run");
        let mut off = SequentialCutoff::default();
        assert!((0..100).all(|i| !off.bypass(i * 4096, 4096)), "0 = off");
    }
}
