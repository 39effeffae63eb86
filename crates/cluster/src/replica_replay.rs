//! What a surviving node writes to a dead owner's backing store from the owner's replica
//! log ("dirty data whose only remaining copy is a replica is written back
//! first"): per sector, the live record with the highest sequence number decides — its
//! bytes when it is data, nothing when it is a tombstone (that write went to the backing
//! store itself, which holds it or something newer).
//!
//! Why that is the last acknowledged write: the owner logs every client write of a
//! replicated vDisk (data for a cache write, a tombstone for a backing write) before it
//! acknowledges it, and voids records only below a tail every block dirty under them was
//! written back before. So the highest live record of a sector belongs to the last
//! acknowledged write of it or to a later, unacknowledged one (either may be read back);
//! a sector with no live record was clean at the tail, its bytes on the backing store.

use crate::replica_record::{Found, Kind, SECTOR};

/// One write to the backing store: a disk byte offset and the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extent {
    /// Disk byte offset.
    pub offset: u64,
    /// The bytes.
    pub data: Vec<u8>,
}

/// The writes that bring `vdisk`'s backing store up to its replica log's live records
/// (`found`, from [`crate::replica_record::scan`]), in disk order, neighbours merged.
pub fn plan(vdisk: &str, found: &[Found]) -> Vec<Extent> {
    let mut mine: Vec<&Found> = found.iter().filter(|f| f.record.vdisk == vdisk).collect();
    mine.sort_by_key(|f| std::cmp::Reverse(f.record.seq)); // newest first
                                                           // Sector ranges a newer record already decided, sorted and disjoint.
    let mut decided: Vec<(u64, u64)> = Vec::new();
    let mut out: Vec<Extent> = Vec::new();
    for f in mine {
        let r = &f.record;
        let (lo, hi) = (r.offset / SECTOR, (r.offset + u64::from(r.len)) / SECTOR);
        for (a, b) in gaps(&decided, lo, hi) {
            if r.kind == Kind::Data {
                let from = ((a - lo) * SECTOR) as usize;
                let to = ((b - lo) * SECTOR) as usize;
                out.push(Extent { offset: a * SECTOR, data: f.data[from..to].to_vec() });
            }
        }
        insert(&mut decided, lo, hi);
    }
    out.sort_by_key(|e| e.offset);
    let mut merged: Vec<Extent> = Vec::with_capacity(out.len());
    for e in out {
        match merged.last_mut() {
            Some(last) if last.offset + last.data.len() as u64 == e.offset => last.data.extend_from_slice(&e.data),
            _ => merged.push(e),
        }
    }
    merged
}

/// The parts of `lo..hi` no range of `decided` covers.
fn gaps(decided: &[(u64, u64)], lo: u64, hi: u64) -> Vec<(u64, u64)> {
    let mut at = lo;
    let mut out = Vec::new();
    let first = decided.partition_point(|&(_, b)| b <= lo);
    for &(a, b) in &decided[first..] {
        if a >= hi {
            break;
        }
        if a > at {
            out.push((at, a));
        }
        at = at.max(b);
    }
    if at < hi {
        out.push((at, hi));
    }
    out
}

/// `lo..hi` added to the sorted, disjoint `ranges` (merged with what it touches).
fn insert(ranges: &mut Vec<(u64, u64)>, lo: u64, hi: u64) {
    let first = ranges.partition_point(|&(_, b)| b < lo);
    let last = ranges.partition_point(|&(a, _)| a <= hi);
    let (mut a, mut b) = (lo, hi);
    if first < last {
        a = a.min(ranges[first].0);
        b = b.max(ranges[last - 1].1);
    }
    ranges.splice(first..last, [(a, b)]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica_record::{crc, Record};
    use proptest::prelude::*;

    fn found(seq: u64, kind: Kind, vdisk: &str, sector: u64, sectors: u64, fill: u8) -> Found {
        let data = if kind == Kind::Data { vec![fill; (sectors * SECTOR) as usize] } else { Vec::new() };
        let record = Record {
            log_id: 1,
            seq,
            kind,
            vdisk: vdisk.into(),
            offset: sector * SECTOR,
            len: (sectors * SECTOR) as u32,
            data_crc: crc(&data),
        };
        Found { record, data }
    }

    #[test]
    fn the_newest_record_of_each_sector_wins_and_tombstones_write_nothing() {
        let f = [
            found(1, Kind::Data, "a", 0, 8, 1),
            found(2, Kind::Data, "a", 2, 2, 2),
            found(3, Kind::Tombstone, "a", 6, 4, 0),
            found(4, Kind::Data, "b", 0, 8, 9),
        ];
        let p = plan("a", &f);
        let mut want = vec![1u8; 6 * 512];
        want[1024..2048].fill(2);
        assert_eq!(p, [Extent { offset: 0, data: want }]);
    }

    proptest! {
        /// Against brute force: each sector's newest record, by a map of sectors.
        #[test]
        fn plan_matches_the_newest_record_per_sector(
            recs in prop::collection::vec((any::<bool>(), 0u64..40, 1u64..9, 0usize..2), 0..30),
        ) {
            let names = ["a", "b"];
            let found: Vec<Found> = recs
                .iter()
                .enumerate()
                .map(|(i, &(data, s, n, v))| {
                    let kind = if data { Kind::Data } else { Kind::Tombstone };
                    found(i as u64 * 3 + 1, kind, names[v], s, n, i as u8 + 1)
                })
                .collect();
            let mut newest: std::collections::BTreeMap<u64, (u64, Option<u8>)> = Default::default();
            for f in found.iter().filter(|f| f.record.vdisk == "a") {
                let r = &f.record;
                for s in r.offset / 512..(r.offset + u64::from(r.len)) / 512 {
                    let v = (r.kind == Kind::Data).then(|| f.data[0]);
                    let e = newest.entry(s).or_insert((r.seq, v));
                    if r.seq >= e.0 {
                        *e = (r.seq, v);
                    }
                }
            }
            let mut got: std::collections::BTreeMap<u64, u8> = Default::default();
            let mut last_end = None;
            for e in plan("a", &found) {
                prop_assert!(last_end.is_none_or(|end| end < e.offset), "extents sorted, merged");
                last_end = Some(e.offset + e.data.len() as u64);
                for (i, c) in e.data.chunks(512).enumerate() {
                    prop_assert!(c.iter().all(|&b| b == c[0]));
                    got.insert(e.offset / 512 + i as u64, c[0]);
                }
            }
            let want: std::collections::BTreeMap<u64, u8> =
                newest.into_iter().filter_map(|(s, (_, v))| v.map(|v| (s, v))).collect();
            prop_assert_eq!(got, want);
        }
    }
}
