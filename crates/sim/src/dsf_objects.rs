//! The Nutanix DSF metadata model as an object cache (prewarming slides, "Base model:
//! Nutanix DSF" and "Inside the cache: objects"): the cache holds metadata objects, not
//! data. A VM request looks up, for each 1 MiB vBlock it touches, the vDisk's **HM1**
//! object (vDisk, vBlock → egroup id), then the **HM3** object of that egroup (egroup id →
//! its slices); both are cached, a miss fetches the object from the metadata store.
//!
//! As simulator inputs: every VM request becomes its object lookups, each a 4 KiB read of
//! an object "block" — HM1 objects under the vDisk's own VM (block = vBlock number), HM3
//! objects under one extra VM named `hm3` (block = egroup id), VM id 0. Lookups are reads
//! whatever the request was: "we only cache metadata reads".
//!
//! Where the slides are silent, chosen here: a vBlock gets its egroup when first touched,
//! four vBlocks per 4 MiB egroup in first-touch order (so, as the slides say, vBlocks of
//! different vDisks share egroups); a cache of B bytes holds B / (1 MiB / 45) objects —
//! the slides' "1 MB worth of objects in cache represent 36 MB of the vDisk space", with
//! 36 HM1 and 9 HM3 objects per 36 MiB.

use cachevisor_trace::{Op, Request, VmId};
use std::collections::{HashMap, VecDeque};

/// Bytes of vDisk an HM1 object maps (a vBlock).
pub const VBLOCK: u64 = 1 << 20;
/// vBlocks per egroup (4 MiB egroups of 1 MiB vBlocks).
pub const VBLOCKS_PER_EGROUP: u64 = 4;
/// Objects a MiB of cache holds (36 HM1 + 9 HM3 objects per 36 MiB of vDisk, in 1 MiB).
pub const OBJECTS_PER_MIB: u64 = 45;
/// Name of the HM3 object set (VM id 0).
pub const HM3: &str = "hm3";
/// Bytes an object lookup reads (the object "block").
const OBJECT_BYTES: u32 = 4096;

/// Turns VM requests into object lookups.
#[derive(Debug, Default)]
pub struct DsfObjects {
    /// (vDisk, vBlock) → egroup.
    egroups: HashMap<(VmId, u64), u64>,
    /// vBlocks given an egroup so far.
    placed: u64,
    pending: VecDeque<Request>,
}

impl DsfObjects {
    /// The lookups of `r` (a request of vDisk `r.vm`), appended to the queue: for each
    /// vBlock, HM1 (VM `r.vm + 1`) then HM3 (VM 0).
    pub fn expand(&mut self, r: &Request) {
        if r.len == 0 {
            return;
        }
        for vb in r.offset / VBLOCK..=(r.end() - 1) / VBLOCK {
            let next = &mut self.placed;
            let eg = *self.egroups.entry((r.vm, vb)).or_insert_with(|| {
                *next += 1;
                (*next - 1) / VBLOCKS_PER_EGROUP
            });
            let lookup = |vm: VmId, id: u64| Request {
                time_ns: r.time_ns,
                vm,
                op: Op::Read,
                offset: id * OBJECT_BYTES as u64,
                len: OBJECT_BYTES,
            };
            self.pending.push_back(lookup(r.vm + 1, vb));
            self.pending.push_back(lookup(0, eg));
        }
    }

    /// The next lookup queued.
    pub fn next_lookup(&mut self) -> Option<Request> {
        self.pending.pop_front()
    }
}

/// Object VM names: `hm3`, then the vDisks'.
pub fn names(vdisks: &[String]) -> Vec<String> {
    std::iter::once(HM3.to_string()).chain(vdisks.iter().cloned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(vm: VmId, offset: u64, len: u32) -> Request {
        Request { time_ns: 7, vm, op: Op::Write, offset, len }
    }

    #[test]
    fn each_vblock_is_an_hm1_then_an_hm3_lookup_and_egroups_fill_in_first_touch_order() {
        let mut d = DsfObjects::default();
        // vDisk 0: vBlocks 0 and 1 (a request across the boundary); vDisk 1: vBlock 5;
        // vDisk 0 again: vBlock 0 (same egroup), then vBlocks 2, 3 (the next egroup's first).
        d.expand(&req(0, VBLOCK - 512, 1024));
        d.expand(&req(1, 5 * VBLOCK, 4096));
        d.expand(&req(0, 100, 8));
        d.expand(&req(0, 2 * VBLOCK, 2 * VBLOCK as u32));
        let mut got = Vec::new();
        while let Some(l) = d.next_lookup() {
            assert_eq!((l.op, l.len, l.time_ns), (Op::Read, 4096, 7), "lookups are object reads");
            got.push((l.vm, l.offset / 4096));
        }
        assert_eq!(
            got,
            [(1, 0), (0, 0), (1, 1), (0, 0), (2, 5), (0, 0), (1, 0), (0, 0), (1, 2), (0, 0), (1, 3), (0, 1)],
            "four vBlocks per egroup, vDisks mixed: 0/0, 0/1, 1/5, 0/2 in egroup 0, 0/3 in egroup 1"
        );
        assert_eq!(names(&["a".into(), "b".into()]), ["hm3", "a", "b"]);
    }
}
