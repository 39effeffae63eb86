//! Exact LRU stack (reuse) distances in O(log M) per access, streaming, with memory
//! proportional to the number of distinct blocks M (not to the trace length).
//!
//! The distance of an access is the number of distinct other blocks accessed since the
//! previous access to the same block: an LRU cache of C blocks hits exactly the accesses
//! whose distance is below C (Mattson et al. 1970). Each block keeps the logical time of
//! its last access; a Fenwick tree over times holds a 1 at every block's last-access time,
//! so the distance is the count of ones after the previous access (Bennett & Kruskal /
//! Olken's method with a Fenwick tree instead of a balanced tree). When times run past the
//! tree's capacity, live times are renumbered 0..M in order and the tree is rebuilt with
//! capacity 2M, so memory stays O(M) and the amortized cost O(log M).
//!
//! Hand-written: no maintained crate computes streaming stack distances.

use rustc_hash::FxHashMap;

/// Fenwick (binary indexed) tree of counts.
#[derive(Debug, Clone)]
struct Fenwick {
    tree: Vec<u32>,
}

impl Fenwick {
    fn new(n: usize) -> Self {
        Fenwick { tree: vec![0; n + 1] }
    }

    fn len(&self) -> usize {
        self.tree.len() - 1
    }

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

    /// A tree of `n` positions with ones at `0..ones`, built in O(n).
    fn with_ones(n: usize, ones: usize) -> Self {
        let mut tree = vec![0u32; n + 1];
        for (i, slot) in tree.iter_mut().enumerate().skip(1) {
            // Node i covers positions (i − lowbit(i), i]; count the ones among them.
            let lo = i - (i & i.wrapping_neg());
            *slot = (i.min(ones).saturating_sub(lo)) as u32;
        }
        Fenwick { tree }
    }
}

/// Streaming exact stack distances over 64-bit block keys.
#[derive(Debug, Clone)]
pub struct StackDistance {
    last: FxHashMap<u64, u32>,
    tree: Fenwick,
    now: usize,
}

impl Default for StackDistance {
    fn default() -> Self {
        Self::new()
    }
}

impl StackDistance {
    /// An empty stack.
    pub fn new() -> Self {
        StackDistance { last: FxHashMap::default(), tree: Fenwick::new(1024), now: 0 }
    }

    /// Distinct blocks seen (and not removed).
    pub fn distinct(&self) -> usize {
        self.last.len()
    }

    /// Records an access to `key`; returns its stack distance, `None` on a first access.
    #[inline]
    pub fn access(&mut self, key: u64) -> Option<u64> {
        if self.now == self.tree.len() {
            self.compact();
        }
        let t = self.now;
        self.now += 1;
        let d = match self.last.insert(key, t as u32) {
            Some(prev) => {
                let prev = prev as usize;
                let d = self.tree.prefix(t) - self.tree.prefix(prev + 1);
                self.tree.add(prev, -1);
                Some(d)
            }
            None => None,
        };
        self.tree.add(t, 1);
        d
    }

    /// Forgets `key` (for sampling that stops tracking a block).
    pub fn remove(&mut self, key: u64) {
        if let Some(t) = self.last.remove(&key) {
            self.tree.add(t as usize, -1);
        }
    }

    /// Renumbers live last-access times to 0..M in order and rebuilds the tree.
    fn compact(&mut self) {
        let mut live: Vec<(u32, u64)> = self.last.iter().map(|(&k, &t)| (t, k)).collect();
        live.sort_unstable();
        for (i, &(_, k)) in live.iter().enumerate() {
            self.last.insert(k, i as u32);
        }
        let m = live.len();
        let cap = (2 * m).max(1024);
        assert!(cap < u32::MAX as usize, "more distinct blocks than 32-bit times can order");
        self.tree = Fenwick::with_ones(cap, m);
        self.now = m;
    }

    /// Bytes of memory held (map entries estimated at 16 B plus the tree).
    pub fn memory_bytes(&self) -> usize {
        self.last.capacity() * 17 + self.tree.tree.capacity() * 4
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
    fn fenwick_built_with_ones_matches_adds() {
        for n in [1usize, 5, 64, 1000] {
            for ones in [0, 1, n / 2, n] {
                let a = Fenwick::with_ones(n, ones);
                let mut b = Fenwick::new(n);
                (0..ones).for_each(|i| b.add(i, 1));
                for i in 0..=n {
                    assert_eq!(a.prefix(i), b.prefix(i), "n {n} ones {ones} i {i}");
                }
            }
        }
    }

    proptest! {
        #[test]
        fn equals_naive(keys in prop::collection::vec(0u64..40, 0..3000)) {
            let mut s = StackDistance::new();
            let got: Vec<_> = keys.iter().map(|&k| s.access(k)).collect();
            prop_assert_eq!(got, naive(&keys));
        }
    }
}
