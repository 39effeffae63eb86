//! Histograms of stack distances and the miss-ratio curves they give.
//!
//! Counts are `f64` so sampled estimators (SHARDS) can weight and rescale them; exact
//! histograms hold integers. A histogram may cap its bucket count: past the cap, pairs of
//! buckets merge and the bucket width doubles, bounding memory for sampled estimates.

use serde::Serialize;

/// Counts of stack distances in buckets of `width` blocks, plus first accesses.
#[derive(Debug, Clone, Default)]
pub struct DistanceHistogram {
    counts: Vec<f64>,
    width: u64,
    max_buckets: Option<usize>,
    /// Distances at or beyond this count as misses at every size (coarse histograms).
    horizon: Option<u64>,
    cold: f64,
}

impl DistanceHistogram {
    /// Exact: one bucket per distance, unbounded.
    pub fn exact() -> Self {
        DistanceHistogram { counts: Vec::new(), width: 1, max_buckets: None, horizon: None, cold: 0.0 }
    }

    /// `buckets` buckets of `width` blocks: exact hits at multiples of `width` up to
    /// `width · buckets` blocks, distances beyond that counted as misses. Constant size,
    /// which is what allocators need every interval.
    pub fn coarse(width: u64, buckets: usize) -> Self {
        let width = width.max(1);
        DistanceHistogram {
            counts: Vec::new(),
            width,
            max_buckets: None,
            horizon: Some(width * buckets as u64),
            cold: 0.0,
        }
    }

    /// An empty histogram with the same shape (width, bounds).
    pub fn cleared(&self) -> Self {
        // A bounded histogram restarts at width 1; a coarse one keeps its fixed width.
        let width = if self.horizon.is_some() { self.width } else { 1 };
        DistanceHistogram { counts: Vec::new(), width, max_buckets: self.max_buckets, horizon: self.horizon, cold: 0.0 }
    }

    /// At most `max_buckets` buckets (≥ 2), widening as needed.
    pub fn bounded(max_buckets: usize) -> Self {
        DistanceHistogram {
            counts: Vec::new(),
            width: 1,
            max_buckets: Some(max_buckets.max(2)),
            horizon: None,
            cold: 0.0,
        }
    }

    /// Adds `weight` at distance `d` (in blocks), or a first access for `None`.
    #[inline]
    pub fn add(&mut self, d: Option<u64>, weight: f64) {
        let Some(d) = d.filter(|&d| self.horizon.is_none_or(|h| d < h)) else {
            self.cold += weight;
            return;
        };
        let mut i = (d / self.width) as usize;
        if let Some(max) = self.max_buckets {
            while i >= max {
                self.coarsen();
                i = (d / self.width) as usize;
            }
        }
        if i >= self.counts.len() {
            self.counts.resize(i + 1, 0.0);
        }
        self.counts[i] += weight;
    }

    fn coarsen(&mut self) {
        let merged: Vec<f64> = self.counts.chunks(2).map(|c| c.iter().sum()).collect();
        self.counts = merged;
        self.width *= 2;
    }

    /// Multiplies every count (SHARDS fixed-size rescaling).
    pub fn scale(&mut self, f: f64) {
        self.counts.iter_mut().for_each(|c| *c *= f);
        self.cold *= f;
    }

    /// Adds `delta` to the smallest-distance bucket (SHARDS count correction).
    pub fn adjust_first(&mut self, delta: f64) {
        if self.counts.is_empty() {
            self.counts.push(0.0);
        }
        self.counts[0] += delta;
    }

    /// Adds `other × f` bucket by bucket (first accesses too), at the coarser of the two
    /// widths; both must be bounded or exact histograms (widths powers of two).
    pub fn add_scaled(&mut self, other: &DistanceHistogram, f: f64) {
        debug_assert!(self.horizon.is_none() && other.horizon.is_none());
        while self.width < other.width {
            self.coarsen();
        }
        for (i, &c) in other.counts.iter().enumerate() {
            let j = (i as u64 * other.width / self.width) as usize;
            if j >= self.counts.len() {
                self.counts.resize(j + 1, 0.0);
            }
            self.counts[j] += c * f;
        }
        self.cold += other.cold * f;
    }

    /// The same histogram with every distance multiplied by `f` (> 0): each bucket's count
    /// spread evenly over its stretched span, as [`Self::hits_at`] reads a bucket (SHARDS'
    /// size axis rescaled to the counted working set). First accesses stay.
    pub fn stretched(&self, f: f64) -> Self {
        debug_assert!(self.horizon.is_none() && f > 0.0);
        let mut out = DistanceHistogram { counts: Vec::new(), ..self.clone() };
        for (i, &c) in self.counts.iter().enumerate() {
            if c == 0.0 {
                continue;
            }
            let (lo, hi) = (i as f64 * self.width as f64 * f, (i + 1) as f64 * self.width as f64 * f);
            let mut x = lo;
            while x < hi {
                // Up to the end of the destination bucket `x` is in (its width may grow).
                let w = out.width as f64;
                let end = (((x / w).floor() + 1.0) * w).min(hi);
                out.add(Some(x as u64), c * (end - x) / (hi - lo));
                x = end;
            }
        }
        out
    }

    /// Reuses (accesses with a finite distance).
    pub fn reuses(&self) -> f64 {
        self.counts.iter().sum()
    }

    /// All accesses.
    pub fn total(&self) -> f64 {
        self.reuses() + self.cold
    }

    /// First accesses.
    pub fn cold(&self) -> f64 {
        self.cold
    }

    /// Bucket width in blocks.
    pub fn width(&self) -> u64 {
        self.width
    }

    /// (bucket start in blocks, count) for non-empty buckets.
    pub fn buckets(&self) -> impl Iterator<Item = (u64, f64)> + '_ {
        self.counts.iter().enumerate().filter(|(_, &c)| c != 0.0).map(move |(i, &c)| (i as u64 * self.width, c))
    }

    /// Hits of an LRU cache of `c` blocks (interpolated inside a bucket wider than 1).
    pub fn hits_at(&self, c: u64) -> f64 {
        let full = (c / self.width) as usize;
        let mut h: f64 = self.counts.iter().take(full).sum();
        if let Some(&part) = self.counts.get(full) {
            h += part * (c % self.width) as f64 / self.width as f64;
        }
        h
    }

    /// Hits at sizes `0, unit, 2·unit, …, points·unit` blocks in one pass over the
    /// buckets (what allocators read as a VM's hit curve).
    pub fn hits_curve(&self, unit: u64, points: usize) -> Vec<f64> {
        let unit = unit.max(1);
        let mut out = Vec::with_capacity(points + 1);
        let mut acc = 0.0; // hits of buckets fully below the current size
        let mut next = 0usize; // first bucket not yet in `acc`
        for k in 0..=points as u64 {
            let c = k * unit;
            let full = (c / self.width) as usize;
            while next < full.min(self.counts.len()) {
                acc += self.counts[next];
                next += 1;
            }
            let part = self.counts.get(full).map_or(0.0, |&p| p * (c % self.width) as f64 / self.width as f64);
            out.push(acc + part);
        }
        out
    }

    /// Miss ratio of an LRU cache of `c` blocks (1 for an empty histogram).
    pub fn miss_ratio_at(&self, c: u64) -> f64 {
        let t = self.total();
        if t <= 0.0 {
            return 1.0;
        }
        (1.0 - self.hits_at(c) / t).clamp(0.0, 1.0)
    }

    /// Largest finite distance seen (bucket end for wide buckets), if any.
    pub fn max_distance(&self) -> Option<u64> {
        let last = self.counts.iter().rposition(|&c| c > 0.0)?;
        Some(last as u64 * self.width + self.width - 1)
    }

    /// Smallest cache (blocks) that hits at least `fraction` of the reuses: the distance
    /// at that percentile of reuses, plus one.
    pub fn size_covering_reuses(&self, fraction: f64) -> Option<u64> {
        let want = self.reuses() * fraction.clamp(0.0, 1.0);
        if self.reuses() <= 0.0 {
            return None;
        }
        let mut acc = 0.0;
        for (i, &c) in self.counts.iter().enumerate() {
            acc += c;
            if acc >= want - 1e-9 {
                return Some((i as u64 + 1) * self.width);
            }
        }
        self.max_distance().map(|d| d + 1)
    }

    /// Smallest cache (blocks) with a hit ratio of at least `h` over all accesses
    /// (`None` when cold misses alone keep it below `h`).
    pub fn size_for_hit_ratio(&self, h: f64) -> Option<u64> {
        let t = self.total();
        if t <= 0.0 {
            return None;
        }
        let mut acc = 0.0;
        for (i, &c) in self.counts.iter().enumerate() {
            acc += c;
            if acc / t >= h - 1e-12 {
                return Some((i as u64 + 1) * self.width);
            }
        }
        None
    }

    /// Bytes of memory held.
    pub fn memory_bytes(&self) -> usize {
        self.counts.capacity() * 8
    }

    /// The curve at `points` evenly spaced sizes up to `max_blocks`, plus size 0.
    pub fn curve(&self, max_blocks: u64, points: usize) -> Vec<CurvePoint> {
        let points = points.max(1) as u64;
        let mut sizes: Vec<u64> = (0..=points).map(|i| max_blocks * i / points).collect();
        sizes.dedup();
        sizes.into_iter().map(|c| CurvePoint { blocks: c, miss_ratio: self.miss_ratio_at(c) }).collect()
    }
}

/// One point of a miss-ratio curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CurvePoint {
    /// Cache size in blocks.
    pub blocks: u64,
    /// LRU miss ratio at that size.
    pub miss_ratio: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curve_and_sizes() {
        let mut h = DistanceHistogram::exact();
        for d in [None, None, Some(0), Some(1), Some(1), Some(3)] {
            h.add(d, 1.0);
        }
        assert_eq!(h.miss_ratio_at(0), 1.0);
        assert!((h.miss_ratio_at(1) - 5.0 / 6.0).abs() < 1e-12);
        assert!((h.miss_ratio_at(2) - 3.0 / 6.0).abs() < 1e-12);
        assert!((h.miss_ratio_at(4) - 2.0 / 6.0).abs() < 1e-12);
        assert_eq!(h.max_distance(), Some(3));
        assert_eq!(h.size_covering_reuses(1.0), Some(4));
        assert_eq!(h.size_covering_reuses(0.5), Some(2));
        assert_eq!(h.size_for_hit_ratio(0.5), Some(2));
        assert_eq!(h.size_for_hit_ratio(0.8), None);
    }

    #[test]
    fn hits_curve_matches_hits_at() {
        let mut h = DistanceHistogram::bounded(8);
        for d in 0..100u64 {
            h.add(Some(d * 7 % 61), 1.0);
        }
        let curve = h.hits_curve(5, 20);
        for (k, &v) in curve.iter().enumerate() {
            assert!((v - h.hits_at(k as u64 * 5)).abs() < 1e-9, "k {k}");
        }
    }

    #[test]
    fn bounded_histograms_widen() {
        let mut h = DistanceHistogram::bounded(4);
        for d in 0..64 {
            h.add(Some(d), 1.0);
        }
        assert!(h.width() >= 16);
        assert_eq!(h.reuses(), 64.0);
        assert!((h.hits_at(32) - 32.0).abs() < 1e-9);
    }

    proptest::proptest! {
        /// A stretched histogram against the brute force of reading the original at the
        /// shrunk size: hits at `c` after stretching by `f` are the original's (linearly
        /// interpolated, as `hits_at` reads a wide bucket) at `c / f`; totals and first
        /// accesses stay; a bounded histogram stays within its bound.
        #[test]
        fn stretching_reads_the_original_at_the_shrunk_size(
            ds in proptest::collection::vec(0u64..400, 1..200),
            cold in 0u32..20,
            f in 0.25f64..4.0,
            bounded in proptest::bool::ANY,
        ) {
            let mut h = if bounded { DistanceHistogram::bounded(16) } else { DistanceHistogram::exact() };
            ds.iter().for_each(|&d| h.add(Some(d), 1.0));
            h.add(None, cold as f64);
            let s = h.stretched(f);
            proptest::prop_assert!((s.total() - h.total()).abs() < 1e-6 && s.cold() == h.cold());
            proptest::prop_assert!(!bounded || s.counts.len() <= 16);
            // The original's hits at a fractional size: its piecewise-linear cumulative.
            let at = |x: f64| {
                let lo = x.floor() as u64;
                h.hits_at(lo) + (h.hits_at(lo + 1) - h.hits_at(lo)) * (x - lo as f64)
            };
            // At the stretched histogram's bucket edges its hits are the mass below: exact.
            for c in (0..=(500.0 * f) as u64 + s.width).step_by(s.width as usize) {
                let (got, want) = (s.hits_at(c), at(c as f64 / f));
                proptest::prop_assert!((got - want).abs() <= 1e-6 * h.total(), "c {}: {} vs {}", c, got, want);
            }
        }
    }
}
