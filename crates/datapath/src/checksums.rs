//! The data path's side of the cache stores' checksums (`block_sums.rs`): a
//! cache write run notes the checksums of what it wrote (or forgets them when it failed),
//! and a cache read run is checked before its bytes go anywhere — to a client, or to a
//! backing store as a write-back — an op whose bytes fail failing with
//! `Failure::Corrupt` (EIO to the client; the engine keeps the block dirty and poisoned,
//! never writing it back). Both device threads and the io_uring thread run these.

use super::{Bytes, Shared, SumAction, Work};
use cachevisor_engine::{Failure, OpKind};

impl Shared {
    /// After a write run of `data` (the run's bytes in device order): `ok`, each cache
    /// write's sectors get their checksums (or none: a fill); failed, none (torn bytes).
    pub(super) fn note_write_sums(&self, run: &[Work], data: &[u8], ok: bool) {
        let mut at = 0usize;
        for w in run {
            let len = w.op.len as usize;
            if w.op.kind == OpKind::SsdWrite {
                let (lo, hi) = w.op.sectors(self.bs);
                match (ok, w.sum) {
                    (true, SumAction::Set) => {
                        if let Some(d) = data.get(at..at + len) {
                            self.sums.wrote(w.op.slot, lo, d);
                        }
                    }
                    _ => self.sums.forget(w.op.slot, lo, hi),
                }
            }
            at += len;
        }
    }

    /// Checks a read run's cache reads against their checksums: an op whose bytes differ
    /// fails `Corrupt` (counted, and logged once per slot).
    pub(super) fn check_read_sums(&self, run: &[Work], results: &mut [Result<Option<Bytes>, Failure>]) {
        for (w, r) in run.iter().zip(results.iter_mut()) {
            let op = &w.op;
            if op.kind != OpKind::SsdRead {
                continue;
            }
            let Ok(Some((buf, base))) = r else { continue };
            let from = (op.disk_addr - *base) as usize;
            let Some(bytes) = buf.get(from..from + op.len as usize) else { continue };
            let (lo, _) = op.sectors(self.bs);
            if let Some(sector) = self.sums.check(op.slot, lo, bytes) {
                if self.sums.first_report(op.slot) {
                    tracing::error!(
                        vm = op.vm,
                        block = op.block(self.bs),
                        slot = op.slot,
                        sector,
                        write_back = !op.client,
                        "the cache store returned bytes that fail their checksum: the block is lost from the cache; reads of it fail (EIO) and it is never written back until the client writes it again (counted in cachevisor_checksum_mismatches_total)"
                    );
                }
                *r = Err(Failure::Corrupt);
            }
        }
    }
}
