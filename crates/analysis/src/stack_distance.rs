//! Exact LRU stack (reuse) distances in O(log M) per access, streaming, with memory
//! proportional to the number of distinct blocks M (not to the trace length).
//!
//! The distance of an access is the number of distinct other blocks accessed since the
//! previous access to the same block: an LRU cache of C blocks hits exactly the accesses
//! whose distance is below C (Mattson et al. 1970). Each block keeps the logical time of
//! its last access; a Fenwick tree over times holds a 1 at every block's last-access time,
//! so the distance is the count of ones after the previous access (Bennett & Kruskal /
//! Olken's method with a Fenwick tree instead of a balanced tree; the marks are a bitmap and
//! the tree counts 64-bit words, so it is 64× smaller and cache-resident). When times run past the
//! tree's capacity, live times are renumbered 0..M in order and the tree is rebuilt with
//! capacity 8M, so memory stays O(M) and the amortized cost O(log M).
//!
//! Hand-written: no maintained crate computes streaming stack distances.

use rustc_hash::FxHashMap;

/// Fenwick (binary indexed) tree of counts.
#[derive(Debug, Clone)]
struct Fenwick {
    tree: Vec<u32>,
}

impl Fenwick {
    #[inline]
    fn add(&mut self, i: usize, delta: i32) {
        let mut i = i + 1;
        while i < self.tree.len() {
            self.tree[i] = self.tree[i].wrapping_add_signed(delta);
            i += i & i.wrapping_neg();
        }
    }

    /// Sum of positions `0..i`.
    #[inline]
    fn prefix(&self, i: usize) -> u64 {
        let mut i = i;
        let mut s = 0u64;
        while i > 0 {
            s += self.tree[i] as u64;
            i &= i - 1;
        }
        s
    }

    /// A tree over `counts`, built in O(n).
    fn from_counts(counts: &[u32]) -> Self {
        let mut tree = vec![0u32; counts.len() + 1];
        for i in 1..tree.len() {
            tree[i] = tree[i].wrapping_add(counts[i - 1]);
            let parent = i + (i & i.wrapping_neg());
            if parent < tree.len() {
                tree[parent] = tree[parent].wrapping_add(tree[i]);
            }
        }
        Fenwick { tree }
    }
}

/// Marks on a time axis: one bit per time, and a Fenwick tree over the 64-bit words'
/// popcounts, so the tree is 64× smaller than the axis and stays in cache.
#[derive(Debug, Clone)]
struct Marks {
    bits: Vec<u64>,
    words: Fenwick,
}

impl Marks {
    fn new(n: usize) -> Self {
        Self::with_ones(n, 0)
    }

    /// Capacity in times.
    fn len(&self) -> usize {
        self.bits.len() * 64
    }

    /// Marks at times `0..ones` of `n`.
    fn with_ones(n: usize, ones: usize) -> Self {
        let words = n.div_ceil(64);
        let mut bits = vec![0u64; words];
        for (w, b) in bits.iter_mut().enumerate() {
            let lo = w * 64;
            if ones >= lo + 64 {
                *b = u64::MAX;
            } else if ones > lo {
                *b = (1u64 << (ones - lo)) - 1;
            }
        }
        let counts: Vec<u32> = bits.iter().map(|b| b.count_ones()).collect();
        Marks { words: Fenwick::from_counts(&counts), bits }
    }

    #[inline]
    fn set(&mut self, t: usize) {
        self.bits[t / 64] |= 1 << (t % 64);
        self.words.add(t / 64, 1);
    }

    #[inline]
    fn clear(&mut self, t: usize) {
        self.bits[t / 64] &= !(1 << (t % 64));
        self.words.add(t / 64, -1);
    }

    /// Marks at times `0..t`.
    #[inline]
    fn prefix(&self, t: usize) -> u64 {
        let (w, b) = (t / 64, t % 64);
        let partial = if b == 0 { 0 } else { (self.bits[w] & ((1u64 << b) - 1)).count_ones() as u64 };
        self.words.prefix(w) + partial
    }

    fn memory_bytes(&self) -> usize {
        self.bits.capacity() * 8 + self.words.tree.capacity() * 4
    }
}

/// Streaming exact stack distances over 64-bit block keys.
#[derive(Debug, Clone)]
pub struct StackDistance {
    last: FxHashMap<u64, u32>,
    marks: Marks,
    now: usize,
    min_capacity: usize,
}

impl Default for StackDistance {
    fn default() -> Self {
        Self::new()
    }
}

impl StackDistance {
    /// An empty stack.
    pub fn new() -> Self {
        Self::with_min_capacity(1 << 16)
    }

    /// An empty stack whose time axis holds at least `n` accesses between compactions
    /// (small values make tests exercise compaction).
    pub fn with_min_capacity(n: usize) -> Self {
        StackDistance { last: FxHashMap::default(), marks: Marks::new(n.max(64)), now: 0, min_capacity: n.max(64) }
    }

    /// Distinct blocks seen (and not removed).
    pub fn distinct(&self) -> usize {
        self.last.len()
    }

    /// Records an access to `key`; returns its stack distance, `None` on a first access.
    #[inline]
    pub fn access(&mut self, key: u64) -> Option<u64> {
        if self.now == self.marks.len() {
            self.compact();
        }
        let t = self.now;
        self.now += 1;
        let d = match self.last.insert(key, t as u32) {
            Some(prev) => {
                let prev = prev as usize;
                let d = self.marks.prefix(t) - self.marks.prefix(prev + 1);
                self.marks.clear(prev);
                Some(d)
            }
            None => None,
        };
        self.marks.set(t);
        d
    }

    /// Forgets `key` (for sampling that stops tracking a block).
    pub fn remove(&mut self, key: u64) {
        if let Some(t) = self.last.remove(&key) {
            self.marks.clear(t as usize);
        }
    }

    /// Renumbers live last-access times to 0..M in order (a time's new number is the count
    /// of live marks before it, so no sort is needed) and rebuilds the marks with room for
    /// 8·M more accesses before the next compaction.
    fn compact(&mut self) {
        for t in self.last.values_mut() {
            *t = self.marks.prefix(*t as usize) as u32;
        }
        let m = self.last.len();
        let cap = (8 * m).max(self.min_capacity);
        assert!(cap < u32::MAX as usize, "more distinct blocks than 32-bit times can order");
        self.marks = Marks::with_ones(cap, m);
        self.now = m;
    }

    /// Bytes of memory held (map entries estimated at 16 B plus the tree).
    pub fn memory_bytes(&self) -> usize {
        self.last.capacity() * 17 + self.marks.memory_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// O(N·M): the position of the key in an LRU stack.
    fn naive(keys: &[u64]) -> Vec<Option<u64>> {
        let mut stack: Vec<u64> = Vec::new();
        keys.iter()
            .map(|&k| {
                let d = stack.iter().position(|&x| x == k).map(|p| p as u64);
                if let Some(p) = d {
                    stack.remove(p as usize);
                }
                stack.insert(0, k);
                d
            })
            .collect()
    }

    #[test]
    fn marks_built_with_ones_match_sets() {
        for n in [1usize, 5, 64, 130, 1000] {
            for ones in [0, 1, n / 2, n] {
                let a = Marks::with_ones(n, ones);
                let mut b = Marks::new(n);
                (0..ones).for_each(|i| b.set(i));
                for i in 0..=n.min(a.len() - 1) {
                    assert_eq!(a.prefix(i), b.prefix(i), "n {n} ones {ones} i {i}");
                }
            }
        }
    }

    proptest! {
        #[test]
        fn equals_naive(keys in prop::collection::vec(0u64..40, 0..3000)) {
            let mut s = StackDistance::with_min_capacity(64);
            let got: Vec<_> = keys.iter().map(|&k| s.access(k)).collect();
            prop_assert_eq!(got, naive(&keys));
        }
    }
}
