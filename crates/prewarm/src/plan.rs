//! A prewarm plan: the prewarm set turned into the reads that load it, most important
//! first, neighbouring blocks coalesced into one larger read.
//!
//! The slides load "most important objects first"; InnoDB's buffer-pool load sorts its
//! dump by page id (one sequential sweep, but the hottest pages may come last) and
//! Percona's LRU dump coalesced contiguous pages. We keep the importance order and
//! coalesce: each read starts at the most important block not yet planned and takes the
//! set's blocks of the same score contiguous with it (below and above, up to `max_run`
//! blocks) — one seek serves them all, and no less important block is pulled ahead of a
//! more important one (with a large limit, neighbours of lower score would otherwise
//! delay the hottest blocks). Every block of the set is planned exactly once.

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
    let mut runs = Vec::new();
    // The set comes by descending score: one score tier at a time, each with its own
    // pending bitmaps, so a run only joins blocks of its head's score.
    let mut at = 0;
    while at < set.len() {
        let score = set[at].1;
        let len = set[at..].iter().take_while(|x| x.1 == score).count();
        plan_tier(&set[at..at + len], max_run, &mut runs);
        at += len;
    }
    runs
}

/// Plans one tier of equal scores (in its given order) into `runs`.
fn plan_tier(tier: &[(ObjectId, u64)], max_run: u64, runs: &mut Vec<Run>) {
    let sets = tier.iter().map(|(o, _)| o.set as usize + 1).max().unwrap_or(0);
    let mut pending = vec![RoaringTreemap::new(); sets];
    for (o, _) in tier {
        pending[o.set as usize].insert(o.id);
    }
    for &(o, _) in tier {
        let left = &mut pending[o.set as usize];
        if !left.remove(o.id) {
            continue; // planned with a neighbour earlier in the tier
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn obj(set: u32, id: u64) -> (ObjectId, u64) {
        (ObjectId { set, id }, 0)
    }

    #[test]
    fn a_run_joins_only_neighbours_of_its_heads_score() {
        let s = |set, id, score| (ObjectId { set, id }, score);
        // Block 5 (score 9) has neighbours 4 (9) and 6 (2): 6 waits for its own tier.
        let set = [s(0, 5, 9), s(0, 4, 9), s(0, 20, 9), s(0, 6, 2), s(0, 7, 2)];
        assert_eq!(
            plan(&set, 8),
            [Run { set: 0, first: 4, len: 2 }, Run { set: 0, first: 20, len: 1 }, Run { set: 0, first: 6, len: 2 }]
        );
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
        /// Every object of the set is read exactly once, no run is longer than allowed,
        /// reads outside the set or mixes scores, and the runs start in the order of
        /// their most important object.
        #[test]
        fn every_object_once_in_importance_order(
            ids in prop::collection::btree_set((0u32..3, 0u64..60), 0..80),
            seed in any::<u64>(),
            max_run in 1u32..10,
            tiers in 1u64..4,
        ) {
            let mut set: Vec<(ObjectId, u64)> = ids.iter().map(|&(s, i)| obj(s, i)).collect();
            // A shuffled importance order, then scores falling in `tiers` steps along it.
            let mut x = seed | 1;
            for i in (1..set.len()).rev() {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                set.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let n = set.len() as u64;
            for (k, e) in set.iter_mut().enumerate() {
                e.1 = tiers - (k as u64 * tiers) / n.max(1);
            }
            let score = |s: u32, i: u64| set.iter().find(|(o, _)| o.set == s && o.id == i).unwrap().1;
            let runs = plan(&set, max_run);
            let mut seen = std::collections::BTreeSet::new();
            let rank = |s: u32, i: u64| set.iter().position(|(o, _)| o.set == s && o.id == i).unwrap();
            let mut last_best = 0;
            for (k, r) in runs.iter().enumerate() {
                prop_assert!(r.len >= 1 && r.len <= max_run);
                let mut best = usize::MAX;
                for id in r.first..r.first + r.len as u64 {
                    prop_assert!(ids.contains(&(r.set, id)), "run reads {} outside the set", id);
                    prop_assert_eq!(score(r.set, id), score(r.set, r.first), "a run mixes scores");
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
