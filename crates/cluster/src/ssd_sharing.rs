//! One SSD per node, shared by the node's own VMs and the borrowers it lends to (ELICA
//! §3.1: a node's cache serves its VMs and, through the regions it lends, other nodes').
//! The allocation (Eq. 4) keeps each node's own VMs' local targets plus what it lends
//! within its SSD, but the two sides change at different speeds — a paced shrink gives
//! blocks up only as they are needed, borrowers fill their shares as they miss — so a
//! driver must keep them from holding more than the SSD in between. Each period this
//! decides, for one lender, from what each side holds now:
//!
//! - how many blocks the lender's own VMs give back (those above their targets; at most
//!   `give_back_max` a period, so the turnover stays gradual), when its borrowers lack
//!   more than the free room;
//! - the cap on its own VMs' local blocks: the SSD less what its borrowers hold;
//! - each borrower's cap in the lender's region: what it holds plus its part of the free
//!   room, in proportion to what its VMs' shares lack.
//!
//! Pure: the simulator runs it every 100 ms, the daemons of part 2 will on their own
//! timers. Hand-written: a few lines of arithmetic, ELICA's capacity rule.

/// What one lender and its borrowers hold and lack now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holdings {
    /// The lender's SSD, blocks.
    pub capacity: u64,
    /// Blocks its own VMs hold on it.
    pub own: u64,
    /// Per borrower: blocks it holds in the lender's region, and blocks its VMs' shares
    /// there still lack.
    pub borrowers: Vec<(u64, u64)>,
}

/// The period's decision for one lender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sharing {
    /// Blocks the lender's own VMs above their targets give back now.
    pub give_back: u64,
    /// Cap on the lender's own VMs' blocks (applied after the give-back).
    pub local_limit: u64,
    /// Per borrower: cap on its blocks in the lender's region.
    pub region_limits: Vec<u64>,
}

impl Holdings {
    /// The decision, given that the lender's own VMs will hold `own_after` blocks once
    /// they gave back what they could of [`Self::wanted_back`] (a driver asks for that
    /// many, then passes how many it got).
    pub fn share(&self, own_after: u64) -> Sharing {
        let lent: u64 = self.borrowers.iter().map(|b| b.0).sum();
        let want: u64 = self.borrowers.iter().map(|b| b.1).sum();
        let room = self.capacity.saturating_sub(own_after + lent);
        let region_limits: Vec<u64> = self
            .borrowers
            .iter()
            .map(|&(held, short)| {
                let part = if want == 0 { 0 } else { (room as u128 * short as u128 / want as u128) as u64 };
                held + part
            })
            .collect();
        // The lender's own VMs may use what its borrowers do not hold. Reserving the room
        // handed to borrowers as well (so both sides growing in one period cannot
        // overlap) kept it idle until borrowers' misses filled it and starved the lender's
        // VMs: on `experiment elica` (MSR) p99.9 52 → 95 ms, p99.99 0.4 → 1.5 s, for an
        // overlap of at most 7 blocks measured the other way.
        let local_limit = self.capacity.saturating_sub(lent);
        Sharing { give_back: self.own.saturating_sub(own_after), local_limit, region_limits }
    }

    /// Blocks the lender's own VMs should give back now: what the borrowers lack beyond
    /// the free room, at most `max`.
    pub fn wanted_back(&self, max: u64) -> u64 {
        let lent: u64 = self.borrowers.iter().map(|b| b.0).sum();
        let want: u64 = self.borrowers.iter().map(|b| b.1).sum();
        let room = self.capacity.saturating_sub(self.own + lent);
        want.saturating_sub(room).min(max).min(self.own)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn room_goes_to_borrowers_by_what_they_lack() {
        let h = Holdings { capacity: 100, own: 60, borrowers: vec![(10, 30), (0, 10)] };
        // 30 free, 40 lacking: 10 wanted back.
        assert_eq!(h.wanted_back(256), 10);
        assert_eq!(h.wanted_back(4), 4, "at most the period's give-back");
        let s = h.share(50);
        assert_eq!(s, Sharing { give_back: 10, local_limit: 90, region_limits: vec![10 + 30, 10] });
    }

    proptest! {
        /// Whatever each side holds: the borrowers grown to their caps beside what the
        /// lender holds, and the lender grown to its cap beside what the borrowers hold,
        /// each fit the SSD (or what it held already, if it was over) — only both growing
        /// in the same period can overlap, by at most the room handed out; no borrower's
        /// cap is below what it holds; a borrower lacking more gets no less room.
        #[test]
        fn the_caps_keep_the_ssd_within_its_size(
            capacity in 0u64..200,
            own in 0u64..200,
            borrowers in prop::collection::vec((0u64..60, 0u64..60), 0..4),
            max in 0u64..50,
            got_frac in 0.0f64..=1.0,
        ) {
            let h = Holdings { capacity, own, borrowers: borrowers.clone() };
            let back = h.wanted_back(max);
            prop_assert!(back <= max);
            let own_after = own - (back as f64 * got_frac) as u64;
            let s = h.share(own_after);
            let lent: u64 = borrowers.iter().map(|b| b.0).sum();
            let bound = capacity.max(own_after + lent);
            let borrowers_grown = own_after + s.region_limits.iter().sum::<u64>();
            prop_assert!(borrowers_grown <= bound, "{borrowers_grown} > {bound}");
            let lender_grown = own_after.max(s.local_limit) + lent;
            prop_assert!(lender_grown <= bound, "{lender_grown} > {bound}");
            for (b, &l) in borrowers.iter().zip(&s.region_limits) {
                prop_assert!(l >= b.0);
            }
            for (i, a) in borrowers.iter().enumerate() {
                for (j, b) in borrowers.iter().enumerate() {
                    if a.1 > b.1 {
                        prop_assert!(s.region_limits[i] - a.0 >= s.region_limits[j] - b.0);
                    }
                }
            }
        }
    }
}
