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
//! Memory is O(S) (or O(M·R)) for the stack plus a bounded histogram.

use crate::histogram::DistanceHistogram;
use crate::stack_distance::StackDistance;
use std::collections::BinaryHeap;

/// Most histogram buckets kept (they widen past this; bounded memory).
pub const HISTOGRAM_BUCKETS: usize = 1024;

/// Hash modulus P (2^24, as in the paper's implementation).
pub const MODULUS: u64 = 1 << 24;

#[inline]
fn spatial_hash(key: u64, seed: u64) -> u64 {
    // splitmix64 finalizer: uniform enough that sampled sets are unbiased.
    let mut z = (key ^ seed.wrapping_mul(0xd6e8_feb8_6659_fd93)).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) % MODULUS
}

/// A SHARDS sampler feeding one histogram.
#[derive(Debug, Clone)]
pub struct Shards {
    stack: StackDistance,
    threshold: u64,
    max_tracked: Option<usize>,
    heap: BinaryHeap<(u64, u64)>,
    hist: DistanceHistogram,
    seen: u64,
    sampled: f64,
    seed: u64,
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
            seen: 0,
            sampled: 0.0,
            seed: 0,
        }
    }

    /// The same sampler with another hash seed (another, equally likely, sample set).
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
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
            self.hist.add(d.map(|d| (d as f64 / r) as u64), 1.0);
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
            }
            self.threshold = h;
        }
        let f = self.rate() / old;
        self.hist.scale(f);
        self.sampled *= f;
    }

    /// The estimated histogram with the SHARDS_adj correction applied.
    pub fn histogram(&self) -> DistanceHistogram {
        let mut h = self.hist.clone();
        let expected = self.seen as f64 * self.rate();
        h.adjust_first(expected - self.sampled);
        h
    }

    /// Estimated distinct blocks among counted accesses: sampled first accesses / R.
    pub fn estimated_distinct(&self) -> f64 {
        self.hist.cold() / self.rate()
    }

    /// Bytes of memory held (stack, heap, histogram).
    pub fn memory_bytes(&self) -> usize {
        self.stack.memory_bytes() + self.heap.capacity() * 16 + self.hist.memory_bytes()
    }
}
