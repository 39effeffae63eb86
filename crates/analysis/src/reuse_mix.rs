//! Kinds of reuse: for every access to a block seen before, whether it and the block's
//! previous access were reads or writes. ECI-Cache's write-policy choice reads this: a VM
//! whose useful (read) reuses almost never follow a write gains nothing from caching its
//! writes. Counts are `f64` so online profiling can decay them.

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
}

impl ReuseMix {
    /// Read-after-write share of the useful (read) reuses; `None` without any.
    pub fn raw_share(&self) -> Option<f64> {
        let useful = self.read_after_read + self.read_after_write;
        (useful > 0.0).then(|| self.read_after_write / useful)
    }

    /// Multiplies every count (decay).
    pub fn scale(&mut self, f: f64) {
        self.read_after_read *= f;
        self.read_after_write *= f;
        self.write_after_write *= f;
        self.write_after_read *= f;
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
    /// Records an access to `block`.
    #[inline]
    pub fn access(&mut self, block: u64, write: bool) {
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
            t.access(b, w);
        }
        assert_eq!(
            t.mix,
            ReuseMix { read_after_read: 1.0, read_after_write: 1.0, write_after_write: 1.0, write_after_read: 2.0 }
        );
        assert_eq!(t.mix.raw_share(), Some(0.5));
    }
}
