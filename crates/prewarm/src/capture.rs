//! A snapshot of a live engine's cache state (Nutanix prewarming slides, "Cache
//! mechanics: persisting": one bitmap per vDisk, a set bit per cached block): what the
//! simulator and the daemon take every n requests or t seconds.

use crate::snapshot::Snapshot;
use cachevisor_engine::Engine;
use roaring::RoaringTreemap;

/// The blocks `engine` holds now, one set per VM named by `names` (VM ids past its end are
/// named `vm<id>`); `seq` and `requests` as the caller counts them. Slots are visited in
/// order, so the bitmaps are built with no sort and nothing else grows with the cache.
pub fn capture(engine: &Engine, seq: u64, requests: u64, names: &[String]) -> Snapshot {
    let mut c = Capture::default();
    c.add_slots(engine, 0..engine.slot_count() as u32);
    c.finish(seq, requests, engine.config().block_size as u32, names)
}

/// A capture built a range of slots at a time, so a driver can release the engine
/// between ranges (a daemon's cache of millions of slots is not held still for one
/// pass); blocks that move meanwhile may be seen twice or missed, as in any fuzzy
/// snapshot — the set is a prewarm hint, not data.
#[derive(Debug, Default)]
pub struct Capture {
    per_vm: Vec<RoaringTreemap>,
}

impl Capture {
    /// Adds the blocks held by slots `range` of `engine`.
    pub fn add_slots(&mut self, engine: &Engine, range: std::ops::Range<u32>) {
        for s in range.start..range.end.min(engine.slot_count() as u32) {
            let Some((vm, block)) = engine.slot_block(s) else { continue };
            if self.per_vm.len() <= vm as usize {
                self.per_vm.resize_with(vm as usize + 1, RoaringTreemap::new);
            }
            self.per_vm[vm as usize].insert(block);
        }
    }

    /// The snapshot of what was added.
    pub fn finish(self, seq: u64, requests: u64, block_size: u32, names: &[String]) -> Snapshot {
        let mut snap = Snapshot::new(seq, requests, block_size);
        for (vm, bits) in self.per_vm.into_iter().enumerate() {
            if bits.is_empty() {
                continue;
            }
            let name = names.get(vm).cloned().unwrap_or_else(|| format!("vm{vm}"));
            snap.sets.insert(name, bits);
        }
        snap
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachevisor_engine::{EngineConfig, Output};
    use cachevisor_trace::{Op, Request};

    #[test]
    fn a_capture_holds_exactly_the_cached_blocks_by_vm_name() {
        let mut e = Engine::new(EngineConfig::with_slots(8)).unwrap();
        let mut out = Output::default();
        e.set_target(0, 4, &mut out);
        e.set_target(2, 4, &mut out);
        for (vm, b) in [(0u32, 5u64), (0, 1), (2, 9), (0, 7), (0, 3), (0, 11)] {
            e.access(0, &Request { time_ns: 0, vm, op: Op::Read, offset: b * 4096, len: 4096 }, &mut out);
        }
        let s = capture(&e, 3, 6, &["a".into()]);
        assert_eq!((s.seq, s.requests, s.block_size), (3, 6, 4096));
        let a: Vec<u64> = s.sets["a"].iter().collect();
        assert_eq!(a, [1, 3, 7, 11], "block 5 was evicted (LRU, target 4)");
        assert_eq!(s.sets["vm2"].iter().collect::<Vec<_>>(), [9]);
        assert_eq!(s.sets.len(), 2, "VM 1 holds nothing and has no set");
        // Range by range, the same.
        let mut c = Capture::default();
        for start in (0..8u32).step_by(3) {
            c.add_slots(&e, start..start + 3);
        }
        assert_eq!(c.finish(3, 6, 4096, &["a".into()]), s);
    }
}
