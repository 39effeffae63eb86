//! Per-object importance from a history of snapshots and the prewarm set it gives
//! (Nutanix prewarming slides, "Cache mechanics: analyzing snapshots").
//!
//! With snapshots numbered 1..=m, oldest first, an object's score is:
//! - **k-Recent**: the number of the last snapshot holding it;
//! - **k-Frequent**: how many snapshots hold it;
//! - **k-Frerecent**: the sum of the weights of the snapshots holding it, weight *i*
//!   (linear, LNR) or *i²* (quadratic, QDR).
//!
//! Scores are global: objects of every set (every vDisk, and HM3) are ranked together.
//! The prewarm set is the objects by descending score, as many as the size limit allows.
//! **Ties**: the slides' worked examples list equal scores in ascending object order
//! (k-Frequent's "0 4 5 6 7 8 9" all at 3); we do the same, with objects ordered by set
//! name, then id — the slides' layout "HM1 (VDISK 0), HM1 (VDISK 1), HM3" is that order.

use crate::snapshot::Snapshot;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// How an object's importance is scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Heuristic {
    /// k-Recent: the last snapshot holding the object.
    #[serde(rename = "k-recent")]
    Recent,
    /// k-Frequent: snapshots holding it.
    #[serde(rename = "k-frequent")]
    Frequent,
    /// k-Frerecent with linear weights (snapshot *i* weighs *i*).
    #[serde(rename = "k-frerecent-lnr")]
    FrerecentLinear,
    /// k-Frerecent with quadratic weights (snapshot *i* weighs *i²*).
    #[serde(rename = "k-frerecent-qdr")]
    FrerecentQuadratic,
}

impl Heuristic {
    /// Every heuristic, in the slides' order.
    pub const ALL: [Heuristic; 4] =
        [Heuristic::Recent, Heuristic::Frequent, Heuristic::FrerecentLinear, Heuristic::FrerecentQuadratic];

    /// The name used in configs and reports.
    pub fn name(self) -> &'static str {
        match self {
            Heuristic::Recent => "k-recent",
            Heuristic::Frequent => "k-frequent",
            Heuristic::FrerecentLinear => "k-frerecent-lnr",
            Heuristic::FrerecentQuadratic => "k-frerecent-qdr",
        }
    }

    /// What snapshot `i` (1-based, oldest first) adds to the score of an object it holds,
    /// given the score so far.
    #[inline]
    fn add(self, score: u64, i: u64) -> u64 {
        match self {
            Heuristic::Recent => i,
            Heuristic::Frequent => score + 1,
            Heuristic::FrerecentLinear => score + i,
            Heuristic::FrerecentQuadratic => score + i * i,
        }
    }
}

impl fmt::Display for Heuristic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Heuristic {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Heuristic::ALL.into_iter().find(|h| h.name() == s).ok_or_else(|| {
            let names: Vec<_> = Heuristic::ALL.iter().map(|h| h.name()).collect();
            format!("unknown prewarm heuristic `{s}` (one of: {})", names.join(", "))
        })
    }
}

/// An object: a set (by its index in [`Ranking::sets`]) and an id inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectId {
    /// Index into [`Ranking::sets`].
    pub set: u32,
    /// Block number (or metadata object id) inside the set.
    pub id: u64,
}

/// Every object any snapshot holds, most important first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ranking {
    /// Set names, sorted (an [`ObjectId`]'s `set` indexes this).
    pub sets: Vec<String>,
    /// Objects with their scores, by descending score, ties in ascending object order.
    pub objects: Vec<(ObjectId, u64)>,
}

impl Ranking {
    /// Scores the objects of `history` (oldest first) with `h`.
    pub fn new(history: &[&Snapshot], h: Heuristic) -> Ranking {
        let mut sets: Vec<String> = history.iter().flat_map(|s| s.sets.keys().cloned()).collect();
        sets.sort_unstable();
        sets.dedup();
        let mut objects = Vec::new();
        for (si, name) in sets.iter().enumerate() {
            let mut score: FxHashMap<u64, u64> = FxHashMap::default();
            for (i, snap) in history.iter().enumerate() {
                let Some(bits) = snap.sets.get(name) else { continue };
                for id in bits.iter() {
                    let e = score.entry(id).or_insert(0);
                    *e = h.add(*e, i as u64 + 1);
                }
            }
            objects.extend(score.into_iter().map(|(id, s)| (ObjectId { set: si as u32, id }, s)));
        }
        objects.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        Ranking { sets, objects }
    }

    /// The prewarm set under a limit of `limit` objects: the first `limit` of the ranking.
    pub fn prewarm_set(&self, limit: u64) -> &[(ObjectId, u64)] {
        &self.objects[..self.objects.len().min(limit.min(usize::MAX as u64) as usize)]
    }

    /// The index of set `name`, if any snapshot had it.
    pub fn set_index(&self, name: &str) -> Option<u32> {
        self.sets.binary_search_by(|s| s.as_str().cmp(name)).ok().map(|i| i as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The slides' five snapshots of ten objects (rows oldest first).
    const SLIDES: [&str; 5] = ["1000011001", "0001101100", "1100001011", "0001110111", "1010110110"];

    fn history(rows: &[&str]) -> Vec<Snapshot> {
        rows.iter()
            .enumerate()
            .map(|(i, row)| {
                let mut s = Snapshot::new(i as u64 + 1, 0, 4096);
                let ids = row.bytes().enumerate().filter(|(_, b)| *b == b'1').map(|(j, _)| j as u64);
                s.sets.insert("hm1".into(), ids.collect());
                s
            })
            .collect()
    }

    /// Scores in object order, the ranking's order, and the prewarm set as a bit row.
    fn worked(h: Heuristic) -> (Vec<u64>, Vec<u64>, Vec<u64>, String) {
        let snaps = history(&SLIDES);
        let r = Ranking::new(&snaps.iter().collect::<Vec<_>>(), h);
        let mut by_object = vec![0; 10];
        for &(o, s) in &r.objects {
            by_object[o.id as usize] = s;
        }
        let order = r.objects.iter().map(|(o, _)| o.id).collect();
        let values = r.objects.iter().map(|&(_, s)| s).collect();
        let mut set = vec![b'0'; 10];
        for (o, _) in r.prewarm_set(5) {
            set[o.id as usize] = b'1';
        }
        (by_object, values, order, String::from_utf8(set).unwrap())
    }

    #[test]
    fn the_slides_k_frequent_example() {
        let (scores, values, order, set) = worked(Heuristic::Frequent);
        assert_eq!(scores, [3, 1, 1, 2, 3, 3, 3, 3, 3, 3]);
        assert_eq!(values, [3, 3, 3, 3, 3, 3, 3, 2, 1, 1]);
        assert_eq!(order, [0, 4, 5, 6, 7, 8, 9, 3, 1, 2]);
        assert_eq!(set, "1000111100");
    }

    #[test]
    fn the_slides_k_recent_example() {
        let (scores, values, order, set) = worked(Heuristic::Recent);
        assert_eq!(scores, [5, 3, 5, 4, 5, 5, 3, 5, 5, 4]);
        assert_eq!(values, [5, 5, 5, 5, 5, 5, 4, 4, 3, 3]);
        assert_eq!(order, [0, 2, 4, 5, 7, 8, 3, 9, 1, 6]);
        assert_eq!(set, "1010110100");
    }

    #[test]
    fn the_slides_k_frerecent_qdr_example() {
        let (scores, values, order, set) = worked(Heuristic::FrerecentQuadratic);
        assert_eq!(scores, [35, 9, 25, 20, 45, 42, 14, 45, 50, 26]);
        assert_eq!(values, [50, 45, 45, 42, 35, 26, 25, 20, 14, 9]);
        assert_eq!(order, [8, 4, 7, 5, 0, 9, 2, 3, 6, 1]);
        assert_eq!(set, "1000110110");
    }

    #[test]
    fn k_frerecent_lnr_on_the_slides_snapshots() {
        // No worked example in the slides; weights 1..5 by hand: object 0 is in 1, 3, 5.
        let (scores, _, order, set) = worked(Heuristic::FrerecentLinear);
        assert_eq!(scores, [9, 3, 5, 6, 11, 10, 6, 11, 12, 8]);
        assert_eq!(order, [8, 4, 7, 5, 0, 9, 3, 6, 2, 1]);
        assert_eq!(set, "1000110110");
    }

    #[test]
    fn sets_rank_together_and_names_parse() {
        let mut a = Snapshot::new(1, 0, 4096);
        a.sets.insert("vdisk1".into(), [7u64].into_iter().collect());
        a.sets.insert("vdisk0".into(), [9u64, 2].into_iter().collect());
        let mut b = Snapshot::new(2, 0, 4096);
        b.sets.insert("vdisk1".into(), [7u64].into_iter().collect());
        let r = Ranking::new(&[&a, &b], Heuristic::Frequent);
        assert_eq!(r.sets, ["vdisk0", "vdisk1"]);
        let ids: Vec<_> = r.objects.iter().map(|&(o, s)| (o.set, o.id, s)).collect();
        assert_eq!(ids, [(1, 7, 2), (0, 2, 1), (0, 9, 1)]);
        assert_eq!(r.set_index("vdisk1"), Some(1));
        assert_eq!(r.prewarm_set(100).len(), 3);
        for h in Heuristic::ALL {
            assert_eq!(h.name().parse::<Heuristic>(), Ok(h));
            // Configs spell it as `name()` too.
            #[derive(serde::Deserialize)]
            struct C {
                h: Heuristic,
            }
            let c: C = serde_json::from_str(&format!("{{\"h\": \"{}\"}}", h.name())).unwrap();
            assert_eq!(c.h, h);
        }
        assert!("k-lru".parse::<Heuristic>().unwrap_err().contains("k-recent, k-frequent"));
    }

    proptest! {
        /// Against brute force: each score from its definition, and the order a full sort
        /// by (−score, set, id) gives.
        #[test]
        fn scores_and_order_match_brute_force(
            rows in prop::collection::vec(prop::collection::vec((0u32..3, 0u64..40), 0..30), 1..8),
            h in prop::sample::select(Heuristic::ALL.to_vec()),
        ) {
            let snaps: Vec<Snapshot> = rows.iter().enumerate().map(|(i, objs)| {
                let mut s = Snapshot::new(i as u64, 0, 4096);
                for &(set, id) in objs {
                    s.sets.entry(format!("s{set}")).or_default().insert(id);
                }
                s
            }).collect();
            let r = Ranking::new(&snaps.iter().collect::<Vec<_>>(), h);
            let mut want = Vec::new();
            for set in 0..3u32 {
                for id in 0..40u64 {
                    let name = format!("s{set}");
                    let held: Vec<u64> = (1..=snaps.len() as u64)
                        .filter(|&i| snaps[i as usize - 1].sets.get(&name).is_some_and(|b| b.contains(id)))
                        .collect();
                    if held.is_empty() { continue; }
                    let score = match h {
                        Heuristic::Recent => *held.iter().max().unwrap(),
                        Heuristic::Frequent => held.len() as u64,
                        Heuristic::FrerecentLinear => held.iter().sum(),
                        Heuristic::FrerecentQuadratic => held.iter().map(|i| i * i).sum(),
                    };
                    want.push((name, id, score));
                }
            }
            want.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)).then(a.1.cmp(&b.1)));
            let got: Vec<_> = r.objects.iter().map(|&(o, s)| (r.sets[o.set as usize].clone(), o.id, s)).collect();
            prop_assert_eq!(got, want);
        }
    }
}
