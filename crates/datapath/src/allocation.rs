//! `base:allocation` for NBD BLOCK_STATUS: which parts of a vDisk range are holes that
//! read as zeroes, and which hold data. The backing store answers first — a file's holes
//! by `SEEK_DATA`/`SEEK_HOLE` (what qemu-nbd and nbdkit's file plugin do), the bytes past
//! its end as a hole; a block device or an NBD backing as all data (safe: "data" only
//! means "read it") — then every block the cache holds dirty, or is writing back (marked
//! clean when the write-back was handed out: `Engine::unsettled_blocks_in`), is data
//! whatever the backing says, since its bytes may not have reached the backing yet. A hole is reported only where
//! both agree, so a client that skips holes (`qemu-img convert`, `nbdcopy`, mirror jobs)
//! never skips a byte that was written.

use super::DataPath;
use cachevisor_nbd::structured::{STATE_HOLE, STATE_ZERO};
use cachevisor_trace::VmId;
use std::io;

/// Descriptors in one reply at most (qemu-nbd's limit is similar; a client asks again
/// from where the reply stopped).
pub const MAX_EXTENTS: usize = 1 << 14;

/// Lays `dirty` blocks (sorted, of `bs` bytes) over `pieces` as data, merges neighbours
/// of one kind, and encodes at most `max` `(length, status)` descriptors.
pub(crate) fn merge(pieces: &[(u64, u64, bool)], dirty: &[u64], bs: u64, max: usize) -> Vec<(u32, u32)> {
    let mut spans: Vec<(u64, u64, bool)> = Vec::new();
    let mut push = |s: u64, e: u64, data: bool| {
        if s >= e {
            return;
        }
        match spans.last_mut() {
            Some(last) if last.2 == data && last.1 == s => last.1 = e,
            _ => spans.push((s, e, data)),
        }
    };
    let mut d = 0;
    for &(s, e, data) in pieces {
        if data {
            push(s, e, true);
            continue;
        }
        // A hole, cut where dirty blocks overlap it.
        let mut at = s;
        while d < dirty.len() && (dirty[d] + 1) * bs <= at {
            d += 1;
        }
        let mut k = d;
        while k < dirty.len() && dirty[k] * bs < e {
            let (ds, de) = ((dirty[k] * bs).max(at), ((dirty[k] + 1) * bs).min(e));
            push(at, ds, false);
            push(ds, de, true);
            at = de;
            k += 1;
        }
        push(at, e, false);
    }
    let mut out = Vec::new();
    for (s, e, data) in spans {
        let flags = if data { 0 } else { STATE_HOLE | STATE_ZERO };
        // Descriptor lengths are 32-bit: a longer span is several descriptors.
        let mut at = s;
        while at < e && out.len() < max {
            let n = (e - at).min(u64::from(u32::MAX) / 512 * 512);
            out.push((n as u32, flags));
            at += n;
        }
    }
    out
}

impl DataPath {
    /// The `base:allocation` descriptors of `len` bytes at `offset` of vDisk `vm`
    /// (`offset + len` within the vDisk, checked by the caller): one only with `one`
    /// (NBD_CMD_FLAG_REQ_ONE), at most [`MAX_EXTENTS`]; their lengths never add up to
    /// more than `len`.
    pub fn allocation(&self, vm: VmId, offset: u64, len: u32, one: bool) -> io::Result<Vec<(u32, u32)>> {
        let end = offset + u64::from(len);
        let backing = self
            .shared
            .backings
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(vm as usize)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such vDisk"))?;
        // Dirty blocks first, then the backing's holes: a block written back in between
        // was dirty when looked at, or is on the backing when it is asked (a write-back
        // marks the block clean only after it reached the backing). The other order would
        // report a hole for a block whose write-back finished between the two looks.
        let bs = self.shared.bs;
        let dirty = self.with_engine(|e| e.unsettled_blocks_in(vm, offset / bs, end.div_ceil(bs)));
        let pieces = backing.extents(offset, end)?;
        Ok(merge(&pieces, &dirty, bs, if one { 1 } else { MAX_EXTENTS }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachevisor_store::backing::Backing;
    use proptest::prelude::*;

    /// Per byte (in 512-byte units): data?
    fn brute(pieces: &[(u64, u64, bool)], dirty: &[u64], bs: u64) -> Vec<bool> {
        let (s, e) = (pieces[0].0, pieces.last().unwrap().1);
        (s..e)
            .step_by(512)
            .map(|x| pieces.iter().any(|p| p.2 && (p.0..p.1).contains(&x)) || dirty.contains(&(x / bs)))
            .collect()
    }

    proptest! {
        /// The descriptors cover the range exactly, alternate in kind, and say "hole"
        /// exactly where the backing has a hole and no dirty block lies.
        #[test]
        fn merged_descriptors_match_brute_force(
            cuts in proptest::collection::vec((1u64..40, any::<bool>()), 1..12),
            dirty in proptest::collection::btree_set(0u64..60, 0..10),
            start in 0u64..8,
        ) {
            let bs = 4096;
            let mut at = start * 512;
            let pieces: Vec<(u64, u64, bool)> = cuts.iter().map(|&(n, d)| { let s = at; at += n * 512; (s, at, d) }).collect();
            let dirty: Vec<u64> = dirty.into_iter().collect();
            let out = merge(&pieces, &dirty, bs, MAX_EXTENTS);
            let total: u64 = out.iter().map(|e| u64::from(e.0)).sum();
            prop_assert_eq!(total, at - start * 512);
            prop_assert!(out.windows(2).all(|w| w[0].1 != w[1].1));
            let mut got = Vec::new();
            for (len, flags) in &out {
                got.extend(std::iter::repeat_n(*flags == 0, (*len / 512) as usize));
            }
            prop_assert_eq!(got, brute(&pieces, &dirty, bs));
        }
    }

    #[test]
    fn a_sparse_file_reports_its_holes_and_data() {
        use std::os::unix::fs::FileExt;
        let d = tempfile::tempdir().unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(d.path().join("f"))
            .unwrap();
        f.set_len(16 << 20).unwrap();
        f.write_all_at(&[1u8; 65536], 4 << 20).unwrap();
        f.sync_all().unwrap();
        let b = Backing::file(f).unwrap();
        let ext = b.extents(0, 16 << 20).unwrap();
        assert_eq!(ext.first().unwrap(), &(0, 4 << 20, false), "{ext:?}");
        assert!(ext.iter().any(|&(s, e, d)| d && s <= 4 << 20 && e >= (4 << 20) + 65536), "{ext:?}");
        assert_eq!(ext.last().unwrap().1, 16 << 20);
        // A dirty block in the hole turns into data; REQ_ONE gives the first descriptor only.
        let out = merge(&ext, &[1], 4096, MAX_EXTENTS);
        assert_eq!(out[0], (4096, STATE_HOLE | STATE_ZERO));
        assert_eq!(out[1], (4096, 0));
        assert_eq!(merge(&ext, &[], 4096, 1), vec![(4 << 20, STATE_HOLE | STATE_ZERO)]);
    }
}
