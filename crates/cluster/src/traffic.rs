//! ELICA-Traffic (§3.4): sequential requests use the local cache, random ones the remote
//! cache when the local share is short, because sequential runs are large, predictable
//! and sensitive to network latency, and keeping them local saves the most network bytes.
//!
//! "ELICA-Traffic recognizes a sequence of requests to consecutive addresses as
//! sequential, when the aggregate size of requests surpasses a threshold (64KB in our
//! experiments). The sequential requests use the local cache resources until a change in
//! the pattern is recognized." A request starts a run, or continues it when it begins
//! where the previous one of the same VM ended; once the run's bytes reach the threshold,
//! it and every later request of the run are sequential; a request that does not continue
//! it ends the run. The first requests of a run, below the threshold, count as random:
//! the pattern is not recognized yet (the seed's reading).

use cachevisor_trace::VmId;
use rustc_hash::FxHashMap;

/// Where a request's blocks should be cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The VM's home node.
    Local,
    /// A remote node, when the VM's local share is short.
    RemoteIfShort,
}

/// Per-VM run tracking.
#[derive(Debug, Clone, Default)]
pub struct SequentialDetector {
    /// Bytes a run must reach to count as sequential (64 KiB in ELICA).
    threshold: u64,
    /// Per VM: (end offset of its last request, bytes of its current run).
    runs: FxHashMap<VmId, (u64, u64)>,
}

impl SequentialDetector {
    /// A detector with ELICA's threshold in bytes (64 KiB).
    pub fn new(threshold: u64) -> SequentialDetector {
        SequentialDetector { threshold: threshold.max(1), runs: FxHashMap::default() }
    }

    /// Classifies one request of `vm` (`offset`, `len` bytes) and records it.
    pub fn classify(&mut self, vm: VmId, offset: u64, len: u64) -> Placement {
        let run = self.runs.entry(vm).or_insert((u64::MAX, 0));
        let bytes = if run.0 == offset { run.1.saturating_add(len) } else { len };
        *run = (offset.saturating_add(len), bytes);
        if bytes >= self.threshold {
            Placement::Local
        } else {
            Placement::RemoteIfShort
        }
    }

    /// Forgets `vm` (it left the node).
    pub fn forget(&mut self, vm: VmId) {
        self.runs.remove(&vm);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KIB: u64 = 1024;

    #[test]
    fn a_run_is_sequential_once_it_reaches_64_kib_until_it_breaks() {
        let mut d = SequentialDetector::new(64 * KIB);
        // 16 KiB requests back to back: the fourth brings the run to 64 KiB.
        let got: Vec<_> = (0..6).map(|i| d.classify(1, i * 16 * KIB, 16 * KIB)).collect();
        use Placement::*;
        assert_eq!(got, [RemoteIfShort, RemoteIfShort, RemoteIfShort, Local, Local, Local]);
        // Another VM's requests do not break VM 1's run.
        assert_eq!(d.classify(2, 0, 4 * KIB), RemoteIfShort);
        assert_eq!(d.classify(1, 6 * 16 * KIB, 4 * KIB), Local);
        // A jump ends the run; one large request is sequential alone.
        assert_eq!(d.classify(1, 10 << 20, 4 * KIB), RemoteIfShort);
        assert_eq!(d.classify(1, 20 << 20, 128 * KIB), Local);
        d.forget(1);
        assert_eq!(d.classify(1, (20 << 20) + 128 * KIB, 4 * KIB), RemoteIfShort, "forgotten: a new run");
    }

    proptest! {
        /// Against brute force: a request is local exactly when the bytes of the longest
        /// chain of back-to-back requests of its VM ending with it reach the threshold.
        #[test]
        fn matches_the_definition(reqs in prop::collection::vec((0u32..3, 0u64..8, 1u64..5), 1..60), th in 1u64..12) {
            let mut d = SequentialDetector::new(th);
            let mut seen: Vec<(VmId, u64, u64)> = Vec::new();
            for &(vm, off, len) in &reqs {
                let got = d.classify(vm, off, len);
                // Walk back through this VM's earlier requests while each ends where the next began.
                let mine: Vec<_> = seen.iter().filter(|r| r.0 == vm).collect();
                let mut bytes = len;
                let mut start = off;
                for r in mine.iter().rev() {
                    if r.1 + r.2 == start { bytes += r.2; start = r.1; } else { break; }
                }
                let want = if bytes >= th { Placement::Local } else { Placement::RemoteIfShort };
                prop_assert_eq!(got, want);
                seen.push((vm, off, len));
            }
        }
    }
}
