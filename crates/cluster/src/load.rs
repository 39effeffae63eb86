//! ELICA-Load (§3.5): balance the SSD cache load across nodes without changing any VM's
//! cache capacity, by exchanging cache chunks between the busiest and the idlest node.
//!
//! "ELICA selects n cache chunks from Node A with the maximum load (QD) and exchanges them
//! with n cache chunks from Node B, which has the least load … n cache chunks of Node A
//! are selected from the VM with the maximum load, while n cache chunks of Node B are
//! selected from the VM with the minimum load." Node load is its SSD queue depth (the
//! driver measures it); a chunk's load is the I/O it draws (what the driver counted for
//! it). Where the seed is silent, chosen here: a VM's load on a node is the sum of its
//! chunks' there; of the busy VM the n busiest chunks go, of the idle VM the n idlest;
//! no exchange when it would not narrow the gap (the chunks moved to B draw no more than
//! those coming back), or the two VMs are one, or either has fewer than n chunks there.

use crate::ownership::NodeId;
use cachevisor_trace::VmId;

/// A cache chunk: whose, where, and the load it draws.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Chunk {
    /// The VM whose data it caches.
    pub vm: VmId,
    /// The node whose SSD holds it.
    pub node: NodeId,
    /// Its load (requests per second, or its share of the queue).
    pub load: f64,
}

/// An exchange: the chunks (indices into the caller's list) that swap nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct Exchange {
    /// The busiest node.
    pub busy: NodeId,
    /// The idlest node.
    pub idle: NodeId,
    /// Chunks of the busy node's busiest VM, moving to the idle node.
    pub to_idle: Vec<usize>,
    /// Chunks of the idle node's idlest VM, moving to the busy node.
    pub to_busy: Vec<usize>,
    /// Load leaving the busy node net of what arrives (> 0).
    pub moved: f64,
}

/// The exchange of `n` chunks ELICA-Load makes for node loads `node_load` (by node id),
/// if any.
pub fn choose(node_load: &[f64], chunks: &[Chunk], n: usize) -> Option<Exchange> {
    if n == 0 || node_load.len() < 2 {
        return None;
    }
    let by_load = |a: &(usize, &f64), b: &(usize, &f64)| a.1.total_cmp(b.1).then(b.0.cmp(&a.0));
    let busy = node_load.iter().enumerate().max_by(by_load)?.0 as NodeId;
    let idle = node_load.iter().enumerate().min_by(|a, b| a.1.total_cmp(b.1).then(a.0.cmp(&b.0)))?.0 as NodeId;
    if busy == idle {
        return None;
    }
    // Each VM's load on a node.
    let vm_load = |node: NodeId| {
        let mut per: Vec<(VmId, f64)> = Vec::new();
        for c in chunks.iter().filter(|c| c.node == node) {
            match per.iter_mut().find(|p| p.0 == c.vm) {
                Some(p) => p.1 += c.load,
                None => per.push((c.vm, c.load)),
            }
        }
        per
    };
    let hot_vm = vm_load(busy).into_iter().max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))?.0;
    let cold_vm = vm_load(idle).into_iter().min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))?.0;
    if hot_vm == cold_vm {
        return None;
    }
    let pick = |vm: VmId, node: NodeId, busiest: bool| {
        let mut idx: Vec<usize> = (0..chunks.len()).filter(|&i| chunks[i].vm == vm && chunks[i].node == node).collect();
        idx.sort_by(|&a, &b| {
            let o = chunks[a].load.total_cmp(&chunks[b].load);
            if busiest { o.reverse() } else { o }.then(a.cmp(&b))
        });
        idx.truncate(n);
        idx
    };
    let to_idle = pick(hot_vm, busy, true);
    let to_busy = pick(cold_vm, idle, false);
    if to_idle.len() < n || to_busy.len() < n {
        return None;
    }
    let moved =
        to_idle.iter().map(|&i| chunks[i].load).sum::<f64>() - to_busy.iter().map(|&i| chunks[i].load).sum::<f64>();
    (moved > 0.0).then_some(Exchange { busy, idle, to_idle, to_busy, moved })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Against brute force: the exchange moves n chunks each way, of the busiest
        /// VM on the busiest node (by summed load) and the idlest VM on the idlest node,
        /// the n busiest and n idlest of them, and only when it moves load off the busy
        /// node; otherwise there is a reason in the definition for none.
        #[test]
        fn matches_the_definition(
            raw in prop::collection::vec((0u32..4, 0u16..3, 0u32..20), 1..25),
            loads in prop::collection::vec(0u32..50, 3),
            n in 1usize..3,
        ) {
            let chunks: Vec<Chunk> = raw.iter().map(|&(vm, node, l)| c(vm, node, l as f64)).collect();
            let node_load: Vec<f64> = loads.iter().map(|&l| l as f64).collect();
            let got = choose(&node_load, &chunks, n);
            // Brute force.
            let busy = (0..3u16).max_by(|&a, &b| node_load[a as usize].total_cmp(&node_load[b as usize]).then(b.cmp(&a))).unwrap();
            let idle = (0..3u16).min_by(|&a, &b| node_load[a as usize].total_cmp(&node_load[b as usize]).then(a.cmp(&b))).unwrap();
            let vm_on = |vm: VmId, node: NodeId| chunks.iter().filter(|x| x.vm == vm && x.node == node).map(|x| x.load).sum::<f64>();
            let vms_on = |node: NodeId| { let mut v: Vec<VmId> = chunks.iter().filter(|x| x.node == node).map(|x| x.vm).collect(); v.sort(); v.dedup(); v };
            let hot = vms_on(busy).into_iter().max_by(|&a, &b| vm_on(a, busy).total_cmp(&vm_on(b, busy)).then(b.cmp(&a)));
            let cold = vms_on(idle).into_iter().min_by(|&a, &b| vm_on(a, idle).total_cmp(&vm_on(b, idle)).then(a.cmp(&b)));
            let want = match (busy != idle, hot, cold) {
                (true, Some(h), Some(k)) if h != k => {
                    let mut hs: Vec<f64> = chunks.iter().filter(|x| x.vm == h && x.node == busy).map(|x| x.load).collect();
                    let mut ks: Vec<f64> = chunks.iter().filter(|x| x.vm == k && x.node == idle).map(|x| x.load).collect();
                    hs.sort_by(|a, b| b.total_cmp(a));
                    ks.sort_by(|a, b| a.total_cmp(b));
                    if hs.len() >= n && ks.len() >= n {
                        let moved = hs[..n].iter().sum::<f64>() - ks[..n].iter().sum::<f64>();
                        (moved > 0.0).then_some((h, k, moved))
                    } else { None }
                }
                _ => None,
            };
            match (got, want) {
                (None, None) => {}
                (Some(e), Some((h, k, moved))) => {
                    prop_assert_eq!((e.busy, e.idle), (busy, idle));
                    prop_assert_eq!((e.to_idle.len(), e.to_busy.len()), (n, n));
                    prop_assert!(e.to_idle.iter().all(|&i| chunks[i].vm == h && chunks[i].node == busy));
                    prop_assert!(e.to_busy.iter().all(|&i| chunks[i].vm == k && chunks[i].node == idle));
                    prop_assert!((e.moved - moved).abs() < 1e-9);
                }
                (g, w) => prop_assert!(false, "got {:?}, want {:?}", g, w),
            }
        }
    }

    fn c(vm: VmId, node: NodeId, load: f64) -> Chunk {
        Chunk { vm, node, load }
    }

    #[test]
    fn the_seeds_figure_6b() {
        // Node-0 carries 23 (its busiest VM's chunk C0 draws 9), Node-1 12, Node-2 6 (its
        // idlest VM's chunk C9 draws 1). Exchanging C0 and C9: Node-0 23 → 15 (−35%),
        // Node-2 6 → 14, as the seed reports.
        let chunks = [
            c(0, 0, 9.0), // C0
            c(1, 0, 8.0),
            c(2, 0, 6.0),
            c(3, 1, 7.0),
            c(4, 1, 5.0),
            c(5, 2, 5.0),
            c(6, 2, 1.0), // C9
        ];
        let loads = [23.0, 12.0, 6.0];
        let e = choose(&loads, &chunks, 1).unwrap();
        assert_eq!((e.busy, e.idle, e.to_idle.clone(), e.to_busy.clone()), (0, 2, vec![0], vec![6]));
        assert_eq!((loads[0] - e.moved, loads[2] + e.moved), (15.0, 14.0));
        assert!(((23.0 - 15.0) / 23.0 - 0.35f64).abs() < 0.005);
    }

    #[test]
    fn no_exchange_that_would_not_narrow_the_gap_or_change_capacities() {
        // The idle node's idlest VM draws more per chunk than the busy one's busiest.
        let chunks = [c(0, 0, 1.0), c(1, 1, 2.0)];
        assert_eq!(choose(&[5.0, 1.0], &chunks, 1), None);
        // n = 2 but the idle VM has one chunk there: capacities would change.
        let chunks = [c(0, 0, 5.0), c(0, 0, 4.0), c(1, 1, 0.5)];
        assert_eq!(choose(&[9.0, 0.5], &chunks, 2), None);
        // One node, or the same VM on both ends.
        assert_eq!(choose(&[3.0], &chunks, 1), None);
        assert_eq!(choose(&[9.0, 0.5], &[c(0, 0, 5.0), c(0, 1, 0.5)], 1), None);
        // n chunks of each: the 2 busiest of the hot VM, the 2 idlest of the cold VM.
        let chunks = [c(0, 0, 5.0), c(0, 0, 1.0), c(0, 0, 4.0), c(1, 1, 0.5), c(1, 1, 2.0), c(1, 1, 0.1)];
        let e = choose(&[10.0, 2.6], &chunks, 2).unwrap();
        assert_eq!((e.to_idle, e.to_busy), (vec![0, 2], vec![5, 3]));
        assert!((e.moved - 8.4).abs() < 1e-9);
    }
}
