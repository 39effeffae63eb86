//! A scenario's working set: the distinct blocks its inputs touch (up to
//! `replay.max_requests`), so a cache size can be given as a fraction of it
//! (`simulate --cache-size 0.01,0.05,0.1`, the way libCacheSim's `cachesim` takes sizes).
//! One pass over the inputs; memory is one hash-set entry per distinct block.

use crate::inputs::{open_inputs, SimError};
use crate::scenario::Scenario;
use cachevisor_trace::units::parse_size;

/// Bytes of the distinct blocks (`cache.block_size`) the scenario's inputs touch, per VM
/// (two VMs' block 0 are two blocks). `progress` sees requests read so far, last with
/// the number read in all.
pub fn working_set_bytes(sc: &Scenario, progress: &mut dyn FnMut(u64)) -> Result<u64, SimError> {
    let bs = parse_size(&sc.cache.block_size).map_err(|e| SimError::Scenario(format!("cache.block_size: {e}")))?;
    if bs == 0 {
        return Err(SimError::Scenario("cache.block_size: must not be 0".into()));
    }
    let limit = if sc.replay.max_requests == 0 { u64::MAX } else { sc.replay.max_requests };
    let mut inputs = open_inputs(sc)?;
    // Compressed bitmaps, one per VM: a dense block range is a few cache-resident bitmap
    // containers (a hash set of 1 M blocks missed the cache on every insert: 25% of a run).
    let mut seen: Vec<roaring::RoaringTreemap> = Vec::new();
    let mut n = 0u64;
    while n < limit {
        let Some(r) = inputs.next_request()? else { break };
        let vm = r.vm as usize;
        if seen.len() <= vm {
            seen.resize_with(vm + 1, Default::default);
        }
        let (first, end) = (r.offset / bs, r.end().div_ceil(bs));
        if end - first == 1 {
            seen[vm].insert(first);
        } else {
            seen[vm].insert_range(first..end);
        }
        n += 1;
        if n.is_multiple_of(1 << 20) {
            progress(n);
        }
    }
    progress(n);
    Ok(seen.iter().map(|m| m.len()).sum::<u64>() * bs)
}

/// A cache size as a fraction of the working set: a unitless decimal (`0.05`) or a
/// percentage (`5%`), in (0, 1]; `None` for anything else (an absolute size such as
/// `400MiB`, whose errors `parse_size` reports).
pub fn fraction(s: &str) -> Result<Option<f64>, String> {
    let t = s.trim();
    let (num, pct) = match t.strip_suffix('%') {
        Some(n) => (n.trim(), true),
        None if t.contains('.') && t.chars().all(|c| c.is_ascii_digit() || c == '.') => (t, false),
        None => return Ok(None),
    };
    let v: f64 = num.parse().map_err(|_| format!("`{s}` is not a fraction like 0.05 or 5%"))?;
    let f = if pct { v / 100.0 } else { v };
    if !(f > 0.0 && f <= 1.0) {
        return Err(format!("`{s}`: a fraction of the working set must be in (0, 1] (0 < x% <= 100%)"));
    }
    Ok(Some(f))
}

/// `fraction` of `ws_bytes`, rounded down to whole blocks of `block` bytes (at least one):
/// the cache `cachesim` builds for the same fraction holds the same objects.
pub fn fraction_bytes(fraction: f64, ws_bytes: u64, block: u64) -> u64 {
    let blocks = (ws_bytes / block.max(1)) as f64 * fraction;
    (blocks as u64).max(1) * block.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_and_sizes_are_told_apart() {
        assert_eq!(fraction("0.05").unwrap(), Some(0.05));
        assert_eq!(fraction("5%").unwrap(), Some(0.05));
        assert_eq!(fraction("1.0").unwrap(), Some(1.0));
        assert_eq!(fraction("400MiB").unwrap(), None);
        assert_eq!(fraction("4096").unwrap(), None);
        assert!(fraction("1.5").unwrap_err().contains("(0, 1]"));
        assert!(fraction("0%").is_err() && fraction("x%").is_err() && fraction("0.0").is_err());
        assert_eq!(fraction("100%").unwrap(), Some(1.0));
        assert!(fraction("100.5%").is_err() && fraction("1.0000001").is_err());
    }

    #[test]
    fn the_working_set_counts_each_vm_s_distinct_blocks_once() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.csv");
        // Blocks 0, 1 (twice), 2..=3 (an 8 KiB request at 8 KiB), 0 again.
        std::fs::write(&p, "0,a,R,0,4096\n1,a,R,4096,4096\n2,a,R,4096,4096\n3,a,R,8192,8192\n4,a,W,0,512\n").unwrap();
        let mut sc = Scenario::default();
        sc.trace.files = vec![p];
        sc.trace.format = Some(cachevisor_trace::Format::Csv);
        let mut calls = 0;
        assert_eq!(working_set_bytes(&sc, &mut |_| calls += 1).unwrap(), 4 * 4096);
        sc.replay.max_requests = 2;
        assert_eq!(working_set_bytes(&sc, &mut |_| ()).unwrap(), 2 * 4096);
        assert_eq!(fraction_bytes(0.5, 4 * 4096, 4096), 2 * 4096);
        assert_eq!(fraction_bytes(0.01, 4 * 4096, 4096), 4096, "at least one block");
    }
}
