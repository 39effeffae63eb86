//! Kinds of reuse: for every access to a block seen before, whether it and the block's
//! previous access were reads or writes. ECI-Cache's write-policy choice reads this: a VM
//! whose useful (read) reuses almost never follow a write gains nothing from caching its
//! writes. With the block writes and write requests beside them, `adaptive`'s choice
//! between write-back and write-through ([`ReuseMix::writeback_write_ratio`]). Counts are
//! `f64` so online profiling can decay them.

use rustc_hash::FxHashMap;
use serde::Serialize;

/// Reuse counts by (previous access, this access) kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ReuseMix {
    /// Reads whose block was last read (read-after-read).
    pub read_after_read: f64,
    /// Reads whose block was last written (read-after-write).
    pub read_after_write: f64,
    /// Writes whose block was last written (write-after-write).
    pub write_after_write: f64,
    /// Writes whose block was last read (write-after-read).
    pub write_after_read: f64,
    /// Block writes, first ones included.
    pub writes: f64,
    /// Write requests (one may write many blocks).
    pub write_requests: f64,
}

impl ReuseMix {
    /// Read-after-write share of the useful (read) reuses; `None` without any.
    pub fn raw_share(&self) -> Option<f64> {
        let useful = self.read_after_read + self.read_after_write;
        (useful > 0.0).then(|| self.read_after_write / useful)
    }

    /// Backing-store writes under write-back over those under write-through, estimated;
    /// `None` without write requests. Write-through writes each write request to the
    /// backing store as it comes: one write per request, however many blocks it spans.
    /// Write-back writes each dirty block back on its own when it is evicted (or cleaned),
    /// and a rewrite of a block still dirty costs nothing: about one write per block
    /// written that is not a rewrite. Above 1, write-back turns a VM's multi-block writes
    /// into more, scattered single-block writes than it saves by absorbing rewrites — on
    /// a disk, more seeks in the queue its misses wait in (docs/policies.md).
    /// Rewrites are counted at any distance, so the ratio is a lower bound for a cache
    /// that evicts a block before it is rewritten.
    pub fn writeback_write_ratio(&self) -> Option<f64> {
        (self.write_requests > 0.0).then(|| (self.writes - self.write_after_write).max(0.0) / self.write_requests)
    }

    /// Multiplies every count (decay).
    pub fn scale(&mut self, f: f64) {
        self.read_after_read *= f;
        self.read_after_write *= f;
        self.write_after_write *= f;
        self.write_after_read *= f;
        self.writes *= f;
        self.write_requests *= f;
    }
}

/// Tracks each block's last access kind and counts reuses by kind.
#[derive(Debug, Clone, Default)]
pub struct ReuseMixTracker {
    last_write: FxHashMap<u64, bool>,
    /// Counts so far.
    pub mix: ReuseMix,
}

impl ReuseMixTracker {
    /// Records a write request (its blocks are recorded by [`Self::access`]).
    #[inline]
    pub fn write_request(&mut self) {
        self.mix.write_requests += 1.0;
    }

    /// Records an access to `block`.
    #[inline]
    pub fn access(&mut self, block: u64, write: bool) {
        if write {
            self.mix.writes += 1.0;
        }
        if let Some(prev) = self.last_write.insert(block, write) {
            let m = &mut self.mix;
            *match (prev, write) {
                (false, false) => &mut m.read_after_read,
                (true, false) => &mut m.read_after_write,
                (true, true) => &mut m.write_after_write,
                (false, true) => &mut m.write_after_read,
            } += 1.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_kind_of_reuse() {
        let mut t = ReuseMixTracker::default();
        // 1 read, 1 read (RAR), 1 write (WAR), 1 read (RAW), 1 write (WAR), 1 write (WAW).
        for (b, w) in [(1, false), (1, false), (1, true), (1, false), (1, true), (1, true), (2, true)] {
            if w {
                t.write_request();
            }
            t.access(b, w);
        }
        assert_eq!(
            t.mix,
            ReuseMix {
                read_after_read: 1.0,
                read_after_write: 1.0,
                write_after_write: 1.0,
                write_after_read: 2.0,
                writes: 4.0,
                write_requests: 4.0,
            }
        );
        assert_eq!(t.mix.raw_share(), Some(0.5));
        // Four one-block writes, one a rewrite: write-back writes 3 of write-through's 4.
        assert_eq!(t.mix.writeback_write_ratio(), Some(0.75));
    }

    #[test]
    fn multi_block_writes_cost_write_back_more_backing_writes() {
        let mut t = ReuseMixTracker::default();
        assert_eq!(t.mix.writeback_write_ratio(), None);
        // Two 8-block writes of new blocks: write-through 2 writes, write-back 16.
        for r in 0..2u64 {
            t.write_request();
            for b in r * 8..r * 8 + 8 {
                t.access(b, true);
            }
        }
        assert_eq!(t.mix.writeback_write_ratio(), Some(8.0));
        // The same 16 blocks rewritten one by one: every rewrite absorbed.
        for b in 0..16 {
            t.write_request();
            t.access(b, true);
        }
        assert_eq!(t.mix.writeback_write_ratio(), Some(16.0 / 18.0));
        t.mix.scale(0.5);
        assert_eq!(t.mix.writeback_write_ratio(), Some(16.0 / 18.0), "decay keeps the ratio");
    }
}
