//! Per-vSSD counts of blocks by live state, and the op → block index, kept by the one
//! setter of a block's live state ([`BlockManager::set_live`]). What a vSSD holds, its
//! resize status, whether it is busy and which of its logical blocks are being filled are
//! then O(1) or O(its own blocks), not a scan of the region: on a 256 GiB region of 1 MiB
//! blocks a scan per block moved made a 1,024-block inflate cost seconds (`benches/
//! inflate.rs`). Hand-written: bookkeeping over the manager's own states.

use crate::geometry::{Lbn, Pbn};
use crate::manager::{BlockManager, Live};
use crate::record::VssdId;
use std::collections::BTreeMap;

/// One vSSD's blocks by live state.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tally {
    pub(crate) valid: u32,
    pub(crate) committing: u32,
    /// Blocks being zeroed or copied back in, by logical block.
    pub(crate) filling: BTreeMap<Lbn, Pbn>,
    /// Of those, copies of swapped-out data.
    pub(crate) filling_swap_in: u32,
    pub(crate) draining: u32,
    pub(crate) swapping_out: u32,
}

impl Tally {
    /// Whether any block of the vSSD is on the SSD or on its way (not yet free).
    pub(crate) fn busy(&self) -> bool {
        self.valid + self.committing + self.draining + self.swapping_out > 0 || !self.filling.is_empty()
    }
}

impl BlockManager {
    /// Sets block `pbn`'s live state: the only place it changes.
    pub(crate) fn set_live(&mut self, pbn: Pbn, new: Live) {
        let old = std::mem::replace(&mut self.live[pbn as usize], new);
        self.count(old, pbn, false);
        self.count(new, pbn, true);
    }

    /// The block of the op `op` runs on, if it runs.
    pub(crate) fn block_of_op(&self, op: crate::manager::OpId) -> Option<Pbn> {
        self.op_blocks.get(&op).copied()
    }

    /// The vSSD's tally (an empty one for a vSSD the manager does not know).
    pub(crate) fn tally(&self, id: VssdId) -> Option<&Tally> {
        self.vssds.get(&id).map(|l| &l.tally)
    }

    fn count(&mut self, l: Live, pbn: Pbn, add: bool) {
        if let Live::Filling { op, .. } | Live::SwappingOut { op, .. } = l {
            if add {
                self.op_blocks.insert(op, pbn);
            } else {
                self.op_blocks.remove(&op);
            }
        }
        let id = match l {
            Live::Valid { id, .. }
            | Live::Committing { id, .. }
            | Live::Filling { id, .. }
            | Live::Draining { id, .. }
            | Live::SwappingOut { id, .. } => id,
            Live::Free | Live::Freeing | Live::Failed | Live::Outside | Live::Yielding => return,
        };
        let t = &mut self.vssds.get_mut(&id).expect("a block's owner is known").tally;
        let step = |x: &mut u32| {
            if add {
                *x += 1
            } else {
                *x -= 1
            }
        };
        match l {
            Live::Valid { .. } => step(&mut t.valid),
            Live::Committing { .. } => step(&mut t.committing),
            Live::Draining { .. } => step(&mut t.draining),
            Live::SwappingOut { .. } => step(&mut t.swapping_out),
            Live::Filling { lbn, swap_in, .. } => {
                if swap_in {
                    step(&mut t.filling_swap_in);
                }
                if add {
                    t.filling.insert(lbn, pbn);
                } else {
                    t.filling.remove(&lbn);
                }
            }
            _ => unreachable!("owned states only"),
        }
    }

    /// Panics unless every tally matches a scan of the region (tests).
    pub fn check_tallies(&self) {
        let mut scan: BTreeMap<VssdId, Tally> = BTreeMap::new();
        for (pbn, l) in self.live.iter().enumerate() {
            let pbn = pbn as Pbn;
            match *l {
                Live::Valid { id, .. } => scan.entry(id).or_default().valid += 1,
                Live::Committing { id, .. } => scan.entry(id).or_default().committing += 1,
                Live::Draining { id, .. } => scan.entry(id).or_default().draining += 1,
                Live::SwappingOut { id, op, .. } => {
                    scan.entry(id).or_default().swapping_out += 1;
                    assert_eq!(self.op_blocks.get(&op), Some(&pbn), "op {op}");
                }
                Live::Filling { id, lbn, op, swap_in } => {
                    let t = scan.entry(id).or_default();
                    t.filling.insert(lbn, pbn);
                    t.filling_swap_in += u32::from(swap_in);
                    assert_eq!(self.op_blocks.get(&op), Some(&pbn), "op {op}");
                }
                _ => {}
            }
        }
        let ops = scan.values().map(|t| t.filling.len() + t.swapping_out as usize).sum::<usize>();
        assert_eq!(self.op_blocks.len(), ops, "ops indexed");
        for (id, l) in &self.vssds {
            let s = scan.remove(id).unwrap_or_default();
            let t = &l.tally;
            assert_eq!(
                (t.valid, t.committing, &t.filling, t.filling_swap_in, t.draining, t.swapping_out),
                (s.valid, s.committing, &s.filling, s.filling_swap_in, s.draining, s.swapping_out),
                "vSSD {id}'s tally"
            );
        }
        assert!(scan.is_empty(), "blocks of unknown vSSDs: {scan:?}");
    }
}
