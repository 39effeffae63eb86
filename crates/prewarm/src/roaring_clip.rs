//! Decoding a snapshot's bitmap — roaring's portable treemap format — clipped to the ids
//! below a bound. Written by hand because the `roaring` crate's decoder
//! expands every run container into an array or an 8 KiB bitmap as it reads: a 925 KB
//! snapshot whose run containers claim 2^32 blocks drove the daemon to 6.6 GB for a
//! 32 MiB vDisk. Here a container whose ids all lie at or past the bound is skipped
//! without being expanded, a run is inserted as a range cut at the bound, and the
//! cardinality the bytes claim is summed from the container headers, so the caller can
//! check it against the set's count and say how many ids were cut.
//!
//! The format (CRoaring's portable serialization, which the crate writes): a treemap is a
//! u64 count of 32-bit bitmaps, each a u32 high key then a bitmap: a cookie (12346, then a
//! u32 container count, offsets, no runs; or 12347 | (count − 1) << 16, a run-flag bitmap,
//! offsets when there are at least 4 containers), per container a u16 key and a u16
//! cardinality − 1, then each container: runs (u16 count, then (start, length) u16 pairs,
//! inclusive), an array of u16 ids (at most 4,096), or a 1,024-word bitmap. All
//! little-endian.

use roaring::RoaringTreemap;
use std::io::{self, Read};

const COOKIE_NO_RUNS: u32 = 12346;
const COOKIE: u16 = 12347;
const NO_OFFSET_THRESHOLD: usize = 4;
const ARRAY_LIMIT: u64 = 4096;

/// What a clipped decode found.
#[derive(Debug, Default, PartialEq)]
pub struct Clipped {
    /// The ids below the bound.
    pub bits: RoaringTreemap,
    /// How many ids the bytes claim in all (kept and cut).
    pub claimed: u64,
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

fn u16_of(r: &mut impl Read) -> io::Result<u16> {
    let mut b = [0u8; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_le_bytes(b))
}

fn u32_of(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn skip(r: &mut impl Read, n: u64) -> io::Result<()> {
    let got = io::copy(&mut r.take(n), &mut io::sink())?;
    if got != n {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    Ok(())
}

/// An `end` that keeps every id (u64::MAX included): no vDisk has that many blocks.
pub const ALL: u64 = u64::MAX;

/// Decodes a treemap from `r`, keeping the ids below `end` only (every id with [`ALL`]).
pub fn decode(r: &mut impl Read, end: u64) -> io::Result<Clipped> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    let bitmaps = u64::from_le_bytes(b);
    let mut out = Clipped::default();
    let mut last_high = None;
    for _ in 0..bitmaps {
        let high = u32_of(r)?;
        if last_high.is_some_and(|h| h >= high) {
            return Err(bad("32-bit bitmaps out of order"));
        }
        last_high = Some(high);
        decode_bitmap(r, u64::from(high) << 32, end, &mut out)?;
    }
    Ok(out)
}

/// Decodes one 32-bit bitmap whose ids start at `base`.
fn decode_bitmap(r: &mut impl Read, base: u64, end: u64, out: &mut Clipped) -> io::Result<()> {
    let cookie = u32_of(r)?;
    let (size, has_offsets, runs) = if cookie == COOKIE_NO_RUNS {
        (u32_of(r)? as usize, true, None)
    } else if cookie as u16 == COOKIE {
        let size = (cookie >> 16) as usize + 1;
        let mut flags = vec![0u8; size.div_ceil(8)];
        r.read_exact(&mut flags)?;
        (size, size >= NO_OFFSET_THRESHOLD, Some(flags))
    } else {
        return Err(bad("unknown bitmap cookie"));
    };
    if size > 1 << 16 {
        return Err(bad("more than 65536 containers in a bitmap"));
    }
    let mut desc = vec![0u8; size * 4];
    r.read_exact(&mut desc)?;
    if has_offsets {
        skip(r, size as u64 * 4)?;
    }
    let mut last_key = None;
    for i in 0..size {
        let key = u16::from_le_bytes([desc[4 * i], desc[4 * i + 1]]);
        let card = u64::from(u16::from_le_bytes([desc[4 * i + 2], desc[4 * i + 3]])) + 1;
        if last_key.is_some_and(|k| k >= key) {
            return Err(bad("containers out of order"));
        }
        last_key = Some(key);
        out.claimed += card;
        let at = base | u64::from(key) << 16;
        let keep = at < end || end == ALL;
        let below = |v: u64| v < end || end == ALL;
        let is_run = runs.as_ref().is_some_and(|f| f[i / 8] & (1 << (i % 8)) != 0);
        if is_run {
            let n = u16_of(r)?;
            if !keep {
                skip(r, u64::from(n) * 4)?;
                continue;
            }
            let mut seen = 0u64;
            for _ in 0..n {
                let (s, len) = (u64::from(u16_of(r)?), u64::from(u16_of(r)?));
                if s + len > 0xffff {
                    return Err(bad("a run past its container"));
                }
                seen += len + 1;
                let (lo, hi) = (at + s, if end == ALL { at + s + len } else { (at + s + len).min(end - 1) });
                if below(lo) {
                    out.bits.insert_range(lo..=hi);
                }
            }
            if seen != card {
                return Err(bad("a run container's runs disagree with its cardinality"));
            }
        } else if card <= ARRAY_LIMIT {
            if !keep {
                skip(r, card * 2)?;
                continue;
            }
            for _ in 0..card {
                let v = at + u64::from(u16_of(r)?);
                if below(v) {
                    out.bits.insert(v);
                }
            }
        } else {
            if !keep {
                skip(r, 8192)?;
                continue;
            }
            let mut words = vec![0u8; 8192];
            r.read_exact(&mut words)?;
            let mut seen = 0u64;
            for (w, chunk) in words.chunks_exact(8).enumerate() {
                let mut word = u64::from_le_bytes(chunk.try_into().expect("8"));
                seen += u64::from(word.count_ones());
                while word != 0 {
                    let v = at + (w as u64) * 64 + u64::from(word.trailing_zeros());
                    word &= word - 1;
                    if below(v) {
                        out.bits.insert(v);
                    }
                }
            }
            if seen != card {
                return Err(bad("a bitmap container's bits disagree with its cardinality"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bytes(t: &RoaringTreemap) -> Vec<u8> {
        let mut v = Vec::new();
        t.serialize_into(&mut v).unwrap();
        v
    }

    type RunContainer = (u16, Vec<(u16, u16)>, u32);

    /// The portable format with every container written as runs (CRoaring writes them;
    /// this crate's version never does), from the ids themselves.
    fn encode_as_runs(t: &RoaringTreemap) -> Vec<u8> {
        let mut v = (t.bitmaps().count() as u64).to_le_bytes().to_vec();
        for (high, bm) in t.bitmaps() {
            v.extend(high.to_le_bytes());
            // (key, runs as (start, length − 1), cardinality) per container.
            let mut containers: Vec<RunContainer> = Vec::new();
            for id in bm.iter() {
                let (key, low) = ((id >> 16) as u16, id as u16);
                if containers.last().is_none_or(|c| c.0 != key) {
                    containers.push((key, Vec::new(), 0));
                }
                let c = containers.last_mut().unwrap();
                c.2 += 1;
                match c.1.last_mut() {
                    Some((s, len)) if u32::from(*s) + u32::from(*len) + 1 == u32::from(low) => *len += 1,
                    _ => c.1.push((low, 0)),
                }
            }
            let n = containers.len();
            v.extend((u32::from(COOKIE) | ((n as u32 - 1) << 16)).to_le_bytes());
            v.extend(vec![0xffu8; n.div_ceil(8)]);
            for (key, _, card) in &containers {
                v.extend(key.to_le_bytes());
                v.extend(((card - 1) as u16).to_le_bytes());
            }
            if n >= NO_OFFSET_THRESHOLD {
                v.extend(vec![0u8; n * 4]);
            }
            for (_, runs, _) in &containers {
                v.extend((runs.len() as u16).to_le_bytes());
                for (s, len) in runs {
                    v.extend(s.to_le_bytes());
                    v.extend(len.to_le_bytes());
                }
            }
        }
        v
    }

    proptest! {
        /// Against the crate's own decoder (the brute force here): the same ids below the
        /// bound, and the whole cardinality claimed — arrays, bitmaps and runs, across
        /// 32-bit bitmaps.
        #[test]
        fn clipped_decoding_keeps_exactly_the_ids_below_the_bound(
            ranges in prop::collection::vec((0u64..(3 << 32), 1u64..70_000), 0..6),
            singles in prop::collection::vec(prop_oneof![0u64..(3 << 32), Just(u64::MAX)], 0..200),
            end in prop_oneof![0u64..(4 << 32), Just(ALL)],
            runs in any::<bool>(),
        ) {
            let mut t = RoaringTreemap::new();
            for (s, n) in ranges {
                t.insert_range(s..s + n);
            }
            for v in singles {
                t.insert(v);
            }
            let b = if runs { encode_as_runs(&t) } else { bytes(&t) };
            let got = decode(&mut &b[..], end).unwrap();
            let want: RoaringTreemap = t.iter().filter(|&v| v < end || end == ALL).collect();
            prop_assert_eq!(got.bits, want);
            prop_assert_eq!(got.claimed, t.len());
        }
    }

    /// A run-container bitmap as CRoaring writes it: `containers` full containers from key
    /// 0 in one 32-bit bitmap at `high`.
    fn hostile(high: u32, containers: u32) -> Vec<u8> {
        let mut v = 1u64.to_le_bytes().to_vec();
        v.extend(high.to_le_bytes());
        v.extend((u32::from(COOKIE) | (containers - 1) << 16).to_le_bytes());
        v.extend(vec![0xffu8; (containers as usize).div_ceil(8)]);
        for k in 0..containers {
            v.extend((k as u16).to_le_bytes());
            v.extend(0xffffu16.to_le_bytes());
        }
        if containers as usize >= NO_OFFSET_THRESHOLD {
            v.extend(vec![0u8; containers as usize * 4]);
        }
        for _ in 0..containers {
            v.extend(1u16.to_le_bytes());
            v.extend(0u16.to_le_bytes());
            v.extend(0xffffu16.to_le_bytes());
        }
        v
    }

    #[test]
    fn a_run_bitmap_claiming_2_to_the_32_blocks_is_clipped_without_expanding() {
        // 65536 full run containers: 2^32 ids in ~ 850 KB.
        let b = hostile(0, 65536);
        assert!(b.len() < 1 << 20);
        let got = decode(&mut &b[..], 8192).unwrap();
        assert_eq!(got.bits.len(), 8192);
        assert_eq!(got.claimed, 1 << 32);
        // The crate's decoder agrees on what the bytes mean (a small one: it expands).
        let small = hostile(0, 3);
        let t = RoaringTreemap::deserialize_from(&small[..]).unwrap();
        assert_eq!(decode(&mut &small[..], u64::MAX).unwrap().bits, t);
        // Damage is an error, not a panic.
        for cut in 0..small.len() {
            assert!(decode(&mut &small[..cut], u64::MAX).is_err(), "cut at {cut}");
        }
    }
}
