//! How a shared budget (`vssd.budget = "shared"`) splits the SSD's blocks between the
//! host-managed cache and the vSSD region (SymFlex §2.2: one allocator over both kinds of
//! SSD cache; §5.2: weighted share or proportional throughput). Each side is one claimant
//! to the `policy` crate's SymFlex allocators — the same code that shares the region out
//! among vSSDs and the cache among vDisks:
//! - `symflex-weighted`: the region gets the blocks × the running vSSDs' summed weights ÷
//!   (theirs + the vDisks'), looked at every time the budget looks ([`weighted_cap`]).
//! - `symflex-proportional`: every allocation interval, the sides' measured throughput
//!   from the SSD (bytes per second the vSSDs served; bytes per second of the vDisks'
//!   cache hits) is compared with the target shares (the vSSDs' summed ratios against the
//!   vDisks'), and `SymflexProportional`'s feedback resizes the region ([`proportional_cap`]).
//!
//! Either way the region keeps at least a block per running vSSD and at most `vssd.size`.

use cachevisor_policy::allocator::{Allocator, Pool, VmDemand};
use cachevisor_policy::symflex_proportional::SymflexProportional;

/// One side's claim on the SSD, summed over its VMs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Side {
    /// Summed weights (`symflex-weighted`).
    pub weight: f64,
    /// Summed target throughput ratios (`symflex-proportional`).
    pub ratio: f64,
    /// Bytes per second it served from the SSD in the last interval.
    pub bytes_per_sec: f64,
    /// Blocks (vSSD-sized) it has now.
    pub blocks: u32,
    /// The fewest blocks it may be left with.
    pub min: u32,
}

impl Side {
    fn demand(&self) -> VmDemand {
        VmDemand {
            weight: self.weight,
            throughput_ratio: self.ratio,
            hit_throughput: self.bytes_per_sec,
            target_blocks: u64::from(self.blocks),
            min_blocks: u64::from(self.min),
            ..VmDemand::default()
        }
    }
}

/// The region's weighted share of `total` blocks, at most `size_cap`: nothing while no
/// vSSD runs (weight 0), all of it (capped) when no vDisk has weight.
pub fn weighted_cap(total: u32, size_cap: u32, vssds: &Side, cache: &Side) -> u32 {
    if vssds.weight <= 0.0 {
        return 0;
    }
    // The cache first: the rounding's odd block stays with it.
    let t = cachevisor_policy::static_share::weighted_split(u64::from(total), &[cache.demand(), vssds.demand()]);
    (t[1] as u32).min(size_cap)
}

/// The region's next size under proportional-throughput feedback (see the top comment),
/// at most `size_cap`. With nothing measured yet, the two sides split equally (SymFlex
/// starts "with an equal amount of vSSD allocated").
pub fn proportional_cap(p: &mut SymflexProportional, total: u32, size_cap: u32, vssds: &Side, cache: &Side) -> u32 {
    if vssds.weight <= 0.0 {
        return 0;
    }
    let t = p.allocate(&Pool::new(u64::from(total), 1), &[cache.demand(), vssds.demand()]).targets;
    (t[1] as u32).min(size_cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(weight: f64, ratio: f64) -> Side {
        Side { weight, ratio, ..Side::default() }
    }

    #[test]
    fn the_region_gets_its_weighted_share_at_most_its_size() {
        let cap = |total, size, v: f64, c: f64| weighted_cap(total, size, &side(v, 1.0), &side(c, 1.0));
        assert_eq!(cap(16, 16, 1.0, 3.0), 4);
        assert_eq!(cap(16, 16, 3.0, 1.0), 12);
        assert_eq!(cap(16, 8, 3.0, 1.0), 8);
        assert_eq!(cap(16, 16, 0.0, 1.0), 0, "no running vSSD: nothing");
        assert_eq!(cap(16, 16, 2.0, 0.0), 16, "no vDisk weight: all of it, capped");
        assert_eq!(cap(15, 16, 1.0, 1.0), 7, "rounded down: the cache keeps the odd block");
        let min3 = weighted_cap(16, 16, &Side { min: 3, ..side(1.0, 1.0) }, &side(15.0, 1.0));
        assert_eq!(min3, 3, "a block per running vSSD at least");
    }

    /// Both sides' throughput grows as the square root of their blocks (a concave hit
    /// curve), each with its own scale; the feedback must bring the measured shares to
    /// the target ratios and keep them there.
    fn converge(ratios: (f64, f64), scales: (f64, f64), size_cap: u32) -> (u32, f64) {
        let total = 4096;
        let mut p = SymflexProportional::default();
        let (mut cap, mut x) = (0u32, (0.0, 0.0));
        for _ in 0..60 {
            let v = Side { weight: 1.0, ratio: ratios.0, bytes_per_sec: x.0, blocks: cap, min: 1 };
            let c = Side { weight: 1.0, ratio: ratios.1, bytes_per_sec: x.1, blocks: total - cap, min: 0 };
            cap = proportional_cap(&mut p, total, size_cap, &v, &c);
            assert!(cap <= size_cap && cap >= 1);
            x = (scales.0 * f64::from(cap).sqrt(), scales.1 * f64::from(total - cap).sqrt());
        }
        (cap, x.0 / (x.0 + x.1))
    }

    #[test]
    fn proportional_feedback_brings_the_sides_to_their_throughput_ratio() {
        for (ratios, scales) in [((1.0, 1.0), (1.0, 1.0)), ((1.0, 3.0), (1.0, 1.0)), ((3.0, 1.0), (0.5, 2.0))] {
            let (_, share) = converge(ratios, scales, 4096);
            let want = ratios.0 / (ratios.0 + ratios.1);
            assert!((share - want).abs() < 0.02, "ratios {ratios:?} scales {scales:?}: vSSD share {share}");
        }
        // The weights do not decide it: unequal scales at 1:1 end far from half the blocks.
        let (cap, _) = converge((1.0, 1.0), (1.0, 3.0), 4096);
        assert!(cap > 3000, "the slower side needs more blocks for the same throughput: {cap}");
    }

    #[test]
    fn proportional_cap_stays_within_vssd_size_and_starts_equal() {
        let (cap, _) = converge((9.0, 1.0), (1.0, 1.0), 1000);
        assert_eq!(cap, 1000);
        let mut p = SymflexProportional::default();
        let cold = proportional_cap(&mut p, 16, 16, &side(1.0, 1.0), &Side { blocks: 16, ..side(1.0, 1.0) });
        assert_eq!(cold, 8);
        assert_eq!(proportional_cap(&mut p, 16, 16, &side(0.0, 1.0), &side(1.0, 1.0)), 0, "no running vSSD");
    }
}
