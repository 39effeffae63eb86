//! SHARDS: spatially hashed sampling for miss-ratio curves (Waldspurger, Park, Garthwaite
//! and Ahmad, "Efficient MRC Construction with SHARDS", FAST'15).
//!
//! A block is sampled when `hash(key) mod P < T`, i.e. at rate R = T/P, so every access
//! to a sampled block is seen and reuse distances among sampled blocks are exact; each
//! distance is scaled by 1/R. Two modes:
//! - **fixed-rate** (§3): T fixed; the histogram of scaled distances is corrected with
//!   SHARDS_adj: the difference between the expected sampled accesses N·R and the
//!   actual count is added to the first bucket (§4.3);
//! - **fixed-size** (§3.2): at most S tracked blocks; when a new sampled block would
//!   exceed S, the tracked block with the largest hash is evicted and T drops to that
//!   hash, and existing counts are rescaled by R_new/R_old.
//!
//! The size axis is scaled to the working set counted apart (an addition to FAST'15): a
//! HyperLogLog++ sketch (`hyperloglockless`, 2^16 one-byte registers at most, sparse
//! while small) counts the distinct blocks of the whole stream, and the histogram's
//! distances are stretched by that count over the sample's own estimate (sampled
//! distinct blocks / R). The sample's share of the blocks varies with which blocks the
//! hash picked (±2% at R = 0.01 on a 250 K-block trace), and on a flat curve every
//! percent of it is a percent of the miss ratio; the sketch's error is 0.4%.
//!
//! Memory is O(S) (or O(M·R)) for the stack plus a bounded histogram and the sketch.

use crate::histogram::DistanceHistogram;
use crate::stack_distance::StackDistance;
use hyperloglockless::HyperLogLogPlus;
use rustc_hash::FxHashMap;
use std::collections::BinaryHeap;

/// Most histogram buckets kept (they widen past this; bounded memory).
pub const HISTOGRAM_BUCKETS: usize = 1024;

/// Hash modulus P (2^24, as in the paper's implementation).
pub const MODULUS: u64 = 1 << 24;

/// Precision of the distinct-block sketch: 2^16 registers, 0.4% standard error.
const SKETCH_PRECISION: u8 = 16;

/// splitmix64's finalizer of `key` under `seed`: uniform enough that sampled sets are
/// unbiased.
#[inline]
fn mix(key: u64, seed: u64) -> u64 {
    let mut z = (key ^ seed.wrapping_mul(0xd6e8_feb8_6659_fd93)).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[inline]
fn spatial_hash(key: u64, seed: u64) -> u64 {
    mix(key, seed) % MODULUS
}

/// The sketch's hash: another seed, so its error is independent of the sample's.
#[inline]
fn sketch_hash(key: u64, seed: u64) -> u64 {
    mix(key, seed ^ 0x5bd1_e995_5bd1_e995)
}

/// How [`Shards::histogram`] corrects the difference between the expected sampled
/// accesses N·R and the actual count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Correction {
    /// Spread over the sample's accesses, each weighted by its block's accesses so far
    /// (the default; see [`Shards::histogram`]).
    #[default]
    SizeBiased,
    /// FAST'15's SHARDS_adj (§4.3): all of it added to the first bucket.
    FirstBucket,
}

impl std::str::FromStr for Correction {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "size-biased" => Ok(Correction::SizeBiased),
            "first-bucket" | "adj" => Ok(Correction::FirstBucket),
            other => Err(format!("`{other}`: expected size-biased or first-bucket")),
        }
    }
}

/// A SHARDS sampler feeding one histogram.
#[derive(Debug, Clone)]
pub struct Shards {
    stack: StackDistance,
    threshold: u64,
    max_tracked: Option<usize>,
    heap: BinaryHeap<(u64, u64)>,
    hist: DistanceHistogram,
    /// The same accesses, each weighted by its block's sampled accesses so far (1 for a
    /// first access): the size-biased mix the count correction is spread over.
    weighted: DistanceHistogram,
    /// Sampled accesses per tracked block.
    per_block: FxHashMap<u64, u32>,
    seen: u64,
    sampled: f64,
    seed: u64,
    correction: Correction,
    /// Distinct blocks of the whole stream (`None`: a per-kind sampler, whose owner
    /// passes the count in, [`Self::histogram_for`]).
    distinct: Option<HyperLogLogPlus>,
}

impl Shards {
    /// Fixed-rate sampling at `rate` in (0, 1].
    pub fn fixed_rate(rate: f64) -> Self {
        let threshold = ((rate.clamp(0.0, 1.0) * MODULUS as f64).round() as u64).max(1);
        Shards {
            // The sampled stack is small: a short time axis keeps its memory small too.
            stack: StackDistance::with_min_capacity(1024),
            threshold,
            max_tracked: None,
            heap: BinaryHeap::new(),
            hist: DistanceHistogram::bounded(HISTOGRAM_BUCKETS),
            weighted: DistanceHistogram::bounded(HISTOGRAM_BUCKETS),
            per_block: FxHashMap::default(),
            seen: 0,
            sampled: 0.0,
            seed: 0,
            correction: Correction::default(),
            distinct: Some(HyperLogLogPlus::seeded(SKETCH_PRECISION, 0)),
        }
    }

    /// The same sampler with no distinct-block sketch of its own: one of several over the
    /// same stream (per-kind curves), scaled by the count the caller passes to
    /// [`Self::histogram_for`].
    pub fn without_distinct_count(mut self) -> Self {
        self.distinct = None;
        self
    }

    /// The same sampler with another hash seed (another, equally likely, sample set).
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The same sampler with another count correction.
    pub fn with_correction(mut self, c: Correction) -> Self {
        self.correction = c;
        self
    }

    /// Fixed-size sampling tracking at most `max_blocks` blocks.
    pub fn fixed_size(max_blocks: usize) -> Self {
        Shards { max_tracked: Some(max_blocks.max(1)), threshold: MODULUS, ..Self::fixed_rate(1.0) }
    }

    /// The current sampling rate R = T/P.
    pub fn rate(&self) -> f64 {
        self.threshold as f64 / MODULUS as f64
    }

    /// Records an access.
    #[inline]
    pub fn access(&mut self, key: u64) {
        self.access_as(key, true);
    }

    /// Records an access that moves the block in the stack; only when `count` is true is
    /// its distance added to the histogram (per-kind curves over a shared stream).
    #[inline]
    pub fn access_as(&mut self, key: u64, count: bool) {
        self.seen += count as u64;
        if let Some(d) = &mut self.distinct {
            d.insert_hash(sketch_hash(key, self.seed));
        }
        let h = spatial_hash(key, self.seed);
        if h >= self.threshold {
            return;
        }
        let d = self.stack.access(key);
        if d.is_none() {
            if let Some(max) = self.max_tracked {
                self.heap.push((h, key));
                if self.stack.distinct() > max {
                    self.lower_threshold(max);
                    if h >= self.threshold {
                        return; // the new block itself was dropped
                    }
                }
            }
        }
        if count {
            self.sampled += 1.0;
            let r = self.rate();
            let d = d.map(|d| (d as f64 / r) as u64);
            self.hist.add(d, 1.0);
            let n = self.per_block.entry(key).or_insert(0);
            *n += 1;
            self.weighted.add(d, *n as f64);
        }
    }

    /// Evicts the largest-hash blocks until at most `max` remain, lowering T.
    fn lower_threshold(&mut self, max: usize) {
        let old = self.rate();
        while self.stack.distinct() > max {
            let Some((h, _)) = self.heap.peek().copied() else { break };
            while let Some(&(h2, k)) = self.heap.peek() {
                if h2 != h {
                    break;
                }
                self.heap.pop();
                self.stack.remove(k);
                self.per_block.remove(&k);
            }
            self.threshold = h;
        }
        let f = self.rate() / old;
        self.hist.scale(f);
        self.weighted.scale(f);
        self.sampled *= f;
    }

    /// The estimated histogram, corrected for the difference between the expected
    /// sampled accesses N·R and the actual count. FAST'15's SHARDS_adj (§4.3) adds it
    /// all to the first bucket, on the premise that the blocks the sample missed (or
    /// caught too many of) are hot ones with short reuses; that holds for skewed
    /// workloads (on a Zipf trace the uncorrected curve is off by 0.075 on average at
    /// R = 0.01) and fails where the difference is just the number of ordinary blocks
    /// sampled (a uniform workload: off by 0.023 after SHARDS_adj, 0.007 without).
    /// Here the difference is spread over the sample's accesses *size-biased*, each
    /// weighted by its block's accesses so far (how much a block moves the count grows
    /// with its accesses): in a skewed trace that is the hot blocks' short reuses,
    /// SHARDS_adj's premise; in a uniform one the sample's own mix, no correction of the
    /// ratios. Distances are then stretched to the counted working set (module doc).
    /// Measured in docs/analysis.md ("SHARDS").
    pub fn histogram(&self) -> DistanceHistogram {
        self.histogram_for(self.counted_distinct())
    }

    /// [`Self::histogram`] with the size axis scaled to `distinct` blocks in the stream
    /// (`None`: not scaled, the sample's own estimate stands).
    pub fn histogram_for(&self, distinct: Option<f64>) -> DistanceHistogram {
        let h = self.corrected();
        let sampled = self.stack.distinct() as f64 / self.rate();
        match distinct {
            Some(d) if d > 0.0 && sampled > 0.0 => h.stretched(d / sampled),
            _ => h,
        }
    }

    /// Distinct blocks of the stream by the sketch, if this sampler keeps one.
    pub fn counted_distinct(&self) -> Option<f64> {
        self.distinct.clone().map(|mut d| d.raw_count())
    }

    /// The histogram with the count correction applied (the sample's size axis).
    fn corrected(&self) -> DistanceHistogram {
        let mut h = self.hist.clone();
        let delta = self.seen as f64 * self.rate() - self.sampled;
        let weight = self.weighted.total();
        if weight > 0.0 && self.correction == Correction::SizeBiased {
            h.add_scaled(&self.weighted, delta / weight);
        } else {
            h.adjust_first(delta);
        }
        h
    }

    /// Estimated distinct blocks: the sketch's count, or sampled first accesses / R
    /// without one.
    pub fn estimated_distinct(&self) -> f64 {
        self.counted_distinct().unwrap_or(self.hist.cold() / self.rate())
    }

    /// Bytes of memory held (stack, heap, histogram).
    pub fn memory_bytes(&self) -> usize {
        self.stack.memory_bytes()
            + self.heap.capacity() * 16
            + self.hist.memory_bytes()
            + self.weighted.memory_bytes()
            + self.per_block.capacity() * 16
            + self.distinct.as_ref().map_or(0, |_| 1 << SKETCH_PRECISION) // at most: sparse turns dense at this size
    }
}
