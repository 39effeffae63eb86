//! A cluster node's per-vDisk demand estimates (ELICA §3.2 (c)): each request's blocks
//! go to the vDisk's `cachevisor_cluster::estimate::VmEstimator` — the estimator the
//! simulator's cluster mode runs — in allocation units, and every cluster interval the
//! window's Eq. 1-cut curves are taken for the etcd driver to publish, and the window
//! starts again. Fed from the data path's request hook under the policy's lock.

use cachevisor_cluster::estimate::{NodeEstimates, VmEstimator};
use cachevisor_cluster::model::IdealForm;
use cachevisor_trace::{Request, VmId};

/// The estimators of one node's vDisks.
pub(crate) struct NodeEstimator {
    block_size: u64,
    unit_blocks: u64,
    /// How far a curve reaches (units): what a VM could be given by the cluster.
    max_units: u64,
    ideal: IdealForm,
    vms: Vec<Option<VmEstimator>>,
}

impl NodeEstimator {
    /// Blocks of `block_size` bytes, units of `unit_bytes`, curves up to `max_units`.
    pub(crate) fn new(block_size: u64, unit_bytes: u64, max_units: u64, ideal: IdealForm) -> NodeEstimator {
        NodeEstimator {
            block_size,
            unit_blocks: (unit_bytes / block_size).max(1),
            max_units: max_units.max(1),
            ideal,
            vms: Vec::new(),
        }
    }

    /// A request's blocks.
    pub(crate) fn observe(&mut self, r: &Request) {
        let vm = r.vm as usize;
        if self.vms.len() <= vm {
            self.vms.resize_with(vm + 1, || None);
        }
        let (unit, max) = (self.unit_blocks, self.max_units);
        let e = self.vms[vm].get_or_insert_with(|| VmEstimator::new(unit, max));
        let bs = self.block_size;
        let (first, last) = (r.offset / bs, (r.offset + u64::from(r.len).max(1) - 1) / bs);
        for b in first..=last {
            e.access(b);
        }
    }

    /// This window's curves of the vDisks `live` names (id, name), for a node whose
    /// cache holds `capacity_units`; the windows start again.
    pub(crate) fn take(&mut self, live: &[(VmId, String)], capacity_units: u64, unit_bytes: u64) -> NodeEstimates {
        let vms = live
            .iter()
            .map(|(id, name)| {
                let curve = match self.vms.get_mut(*id as usize).and_then(Option::as_mut) {
                    Some(e) => {
                        let c = e.curve(self.ideal, self.max_units);
                        e.next_window();
                        c
                    }
                    None => vec![0.0],
                };
                (name.clone(), curve)
            })
            .collect();
        NodeEstimates { unit_bytes, capacity_units, vms }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachevisor_trace::Op;

    #[test]
    fn a_vdisk_looping_over_three_units_asks_for_three_units() {
        let mut n = NodeEstimator::new(4096, 16384, 10, IdealForm::Max);
        for _ in 0..5 {
            // 12 blocks in 4 requests of 3 blocks.
            for i in 0..4u64 {
                n.observe(&Request { time_ns: 0, vm: 1, op: Op::Read, offset: i * 3 * 4096, len: 3 * 4096 });
            }
        }
        let e = n.take(&[(0, "idle".into()), (1, "busy".into())], 7, 16384);
        assert_eq!(e.vms[0], ("idle".to_string(), vec![0.0]));
        assert_eq!(e.vms[1].1.len(), 4, "{:?}", e.vms[1]);
        assert!((e.vms[1].1[3] - 48.0 / 60.0).abs() < 1e-9);
        assert_eq!(e.capacity_units, 7);
        let again = n.take(&[(1, "busy".into())], 7, 16384);
        assert_eq!(again.vms[0].1, vec![0.0], "a new window");
    }
}
