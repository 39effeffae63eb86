//! A prewarm plan: the prewarm set turned into the reads that load it, most important
//! first, neighbouring blocks coalesced into one larger read.
//!
//! The slides load "most important objects first"; InnoDB's buffer-pool load sorts its
//! dump by page id (one sequential sweep, but the hottest pages may come last) and
//! Percona's LRU dump coalesced contiguous pages. We keep the importance order and
//! coalesce: each read starts at the most important block not yet planned and takes the
//! set's other blocks contiguous with it (below and above, up to `max_run` blocks), since
//! they are in the set anyway and one seek serves them all. Every block of the set is
//! planned exactly once.

use crate::scores::ObjectId;
use roaring::RoaringTreemap;

/// One read of the plan: `len` consecutive objects of a set from `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// Index into the ranking's sets.
    pub set: u32,
    /// First object id.
    pub first: u64,
    /// Objects in the run (≥ 1).
    pub len: u32,
}

/// Turns a prewarm set (most important first) into runs of at most `max_run` objects.
pub fn plan(set: &[(ObjectId, u64)], max_run: u32) -> Vec<Run> {
    let max_run = max_run.max(1) as u64;
    let sets = set.iter().map(|(o, _)| o.set as usize + 1).max().unwrap_or(0);
    let mut pending = vec![RoaringTreemap::new(); sets];
    for (o, _) in set {
        pending[o.set as usize].insert(o.id);
    }
    let mut runs = Vec::new();
    for &(o, _) in set {
        let left = &mut pending[o.set as usize];
        if !left.remove(o.id) {
            continue; // planned with a more important neighbour
        }
        let (mut lo, mut hi) = (o.id, o.id);
        while hi - lo + 1 < max_run && hi < u64::MAX && left.remove(hi + 1) {
            hi += 1;
        }
        while hi - lo + 1 < max_run && lo > 0 && left.remove(lo - 1) {
            lo -= 1;
        }
        runs.push(Run { set: o.set, first: lo, len: (hi - lo + 1) as u32 });
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn obj(set: u32, id: u64) -> (ObjectId, u64) {
        (ObjectId { set, id }, 0)
    }

    #[test]
    fn hottest_first_with_neighbours_coalesced() {
        let set = [obj(0, 10), obj(1, 5), obj(0, 11), obj(0, 9), obj(0, 40), obj(0, 12), obj(1, 6)];
        assert_eq!(
            plan(&set, 8),
            [Run { set: 0, first: 9, len: 4 }, Run { set: 1, first: 5, len: 2 }, Run { set: 0, first: 40, len: 1 }]
        );
        // Runs are cut at max_run: upward neighbours first, then downward.
        assert_eq!(
            plan(&set, 2),
            [
                Run { set: 0, first: 10, len: 2 },
                Run { set: 1, first: 5, len: 2 },
                Run { set: 0, first: 9, len: 1 },
                Run { set: 0, first: 40, len: 1 },
                Run { set: 0, first: 12, len: 1 }
            ]
        );
        assert!(plan(&[], 4).is_empty());
    }

    proptest! {
        /// Every object of the set is read exactly once, no run is longer than allowed or
        /// reads outside the set, and the runs start in the order of their most
        /// important object.
        #[test]
        fn every_object_once_in_importance_order(
            ids in prop::collection::btree_set((0u32..3, 0u64..60), 0..80),
            seed in any::<u64>(),
            max_run in 1u32..10,
        ) {
            let mut set: Vec<(ObjectId, u64)> = ids.iter().map(|&(s, i)| obj(s, i)).collect();
            // A shuffled importance order.
            let mut x = seed | 1;
            for i in (1..set.len()).rev() {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                set.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let runs = plan(&set, max_run);
            let mut seen = std::collections::BTreeSet::new();
            let rank = |s: u32, i: u64| set.iter().position(|(o, _)| o.set == s && o.id == i).unwrap();
            let mut last_best = 0;
            for (k, r) in runs.iter().enumerate() {
                prop_assert!(r.len >= 1 && r.len <= max_run);
                let mut best = usize::MAX;
                for id in r.first..r.first + r.len as u64 {
                    prop_assert!(ids.contains(&(r.set, id)), "run reads {} outside the set", id);
                    prop_assert!(seen.insert((r.set, id)), "{} read twice", id);
                    best = best.min(rank(r.set, id));
                }
                if k > 0 { prop_assert!(best > last_best); }
                last_best = best;
            }
            prop_assert_eq!(seen.len(), ids.len());
        }
    }
}
