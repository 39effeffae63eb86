//! A VM's demand as ELICA's allocation reads it (§3.2 (c)): its stack distances over a
//! window, in allocation units, turned into the hit-ratio curve of Eq. 4 cut at its ideal
//! size (Eq. 1). One estimator for both drivers: the simulator's cluster mode feeds it the
//! trace's blocks, a daemon node the blocks its vDisks' requests touch, and each publishes
//! [`VmEstimator::curve`] every window; [`problem`] puts the nodes' curves and capacities
//! into Eq. 4's [`Problem`].

use crate::allocation::{Problem, Solver, VmCurve};
use crate::model::{ideal_blocks, IdealForm, Latencies};
use crate::ownership::NodeId;
use cachevisor_analysis::{DistanceHistogram, StackDistance};
use serde::{Deserialize, Serialize};

/// One VM's window of stack distances.
#[derive(Debug, Clone)]
pub struct VmEstimator {
    sd: StackDistance,
    hist: DistanceHistogram,
    unit_blocks: u64,
}

impl VmEstimator {
    /// Distances in units of `unit_blocks` blocks, up to `max_units` units.
    pub fn new(unit_blocks: u64, max_units: u64) -> VmEstimator {
        let unit_blocks = unit_blocks.max(1);
        VmEstimator {
            sd: StackDistance::new(),
            hist: DistanceHistogram::coarse(unit_blocks, max_units as usize + 1),
            unit_blocks,
        }
    }

    /// An access to `block`.
    #[inline]
    pub fn access(&mut self, block: u64) {
        let d = self.sd.access(block);
        self.hist.add(d, 1.0);
    }

    /// Block accesses in the window.
    pub fn accesses(&self) -> f64 {
        self.hist.total()
    }

    /// The window's histogram.
    pub fn histogram(&self) -> &DistanceHistogram {
        &self.hist
    }

    /// The window's hit ratio at 0, 1, … units up to the VM's ideal size (Eq. 1 in the
    /// form `ideal`), at most `max_units`: `VmCurve::hit_ratio`. `[0.0]` with no accesses.
    pub fn curve(&self, ideal: IdealForm, max_units: u64) -> Vec<f64> {
        let total = self.hist.total();
        if total <= 0.0 {
            return vec![0.0];
        }
        let units = ideal_blocks(&self.hist, ideal).div_ceil(self.unit_blocks).min(max_units);
        self.hist.hits_curve(self.unit_blocks, units as usize).into_iter().map(|h| h / total).collect()
    }

    /// A new window: the counts start again, the distances remember the history (a
    /// block's reuse across a window boundary keeps its true distance).
    pub fn next_window(&mut self) {
        self.hist = self.hist.cleared();
    }
}

/// What a node publishes each window (`estimates/<node>` in etcd).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeEstimates {
    /// The allocation unit, bytes.
    pub unit_bytes: u64,
    /// The node's cache in units.
    pub capacity_units: u64,
    /// Its VMs: (vDisk name, hit ratio by units, Eq. 1-cut).
    pub vms: Vec<(String, Vec<f64>)>,
}

/// The most units a node's cache or a VM's curve may span in a published estimate.
pub const MAX_UNITS: u64 = 1 << 20;
/// The most VMs one node may publish.
pub const MAX_VMS: usize = 4096;

impl NodeEstimates {
    /// Whether a record read from etcd can go into Eq. 4: sizes within bounds, every hit
    /// ratio a number in [0, 1] (a foreign or corrupt record is left out, named).
    pub fn well_formed(&self) -> Result<(), String> {
        if self.capacity_units > MAX_UNITS || self.vms.len() > MAX_VMS {
            return Err(format!(
                "{} units, {} VMs: past {MAX_UNITS} units or {MAX_VMS} VMs",
                self.capacity_units,
                self.vms.len()
            ));
        }
        for (name, c) in &self.vms {
            if c.len() as u64 > MAX_UNITS + 1 || c.iter().any(|h| !(0.0..=1.0).contains(h)) {
                return Err(format!("vDisk {name}: a curve of {} points, or a hit ratio outside [0, 1]", c.len()));
            }
        }
        Ok(())
    }
}

/// Eq. 4's problem from each node's estimates (`nodes[i]` is node index i of the
/// problem); returns it with the (node index, vDisk name) of each VM in order.
pub fn problem(lat: Latencies, nodes: &[&NodeEstimates]) -> (Problem, Vec<(usize, String)>) {
    let mut vms = Vec::new();
    let mut names = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        for (name, curve) in &n.vms {
            vms.push(VmCurve {
                home: i as NodeId,
                hit_ratio: if curve.is_empty() { vec![0.0] } else { curve.clone() },
            });
            names.push((i, name.clone()));
        }
    }
    (Problem { lat, capacity: nodes.iter().map(|n| n.capacity_units).collect(), vms }, names)
}

/// A VM's share in the leader's decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmShare {
    /// Its node.
    pub node: String,
    /// Units in its node's cache.
    pub local_units: u64,
    /// Units other nodes lend it, by node.
    pub remote: Vec<(String, u64)>,
}

/// The leader's decision each interval (`allocation` in etcd): Eq. 4 on the nodes'
/// published estimates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct AllocationRecord {
    /// The allocation unit, bytes.
    pub unit_bytes: u64,
    /// Each VM's share, by vDisk name.
    pub vms: std::collections::BTreeMap<String, VmShare>,
    /// Eq. 4's objective, the summed average latency (µs).
    pub total_avl_us: f64,
    /// Nodes whose estimates were left out (another unit), by name.
    pub ignored: Vec<String>,
}

/// The leader's step: Eq. 4 by `solver` on the estimates `(node name, estimates)` of
/// the nodes that published in `unit_bytes` units (others are listed as ignored); the
/// `last` decision is kept unless the new one gains `min_gain` ([`crate::hysteresis`]).
pub fn decide(
    lat: Latencies,
    solver: Solver,
    unit_bytes: u64,
    estimates: &[(String, NodeEstimates)],
    last: Option<&AllocationRecord>,
    min_gain: f64,
) -> Result<AllocationRecord, String> {
    let (used, ignored): (Vec<_>, Vec<_>) =
        estimates.iter().partition(|(_, e)| e.unit_bytes == unit_bytes && e.well_formed().is_ok());
    let nodes: Vec<&NodeEstimates> = used.iter().map(|(_, e)| e).collect();
    let (p, names) = problem(lat, &nodes);
    let next = solver.solve(&p)?;
    let node_index = |n: &str| used.iter().position(|(m, _)| m == n).map(|i| i as NodeId);
    let last = last.filter(|l| l.unit_bytes == unit_bytes).and_then(|l| as_allocation(l, &names, node_index));
    let a = crate::hysteresis::keep_or_take(&p, last.as_ref(), next, min_gain);
    let vms = names
        .into_iter()
        .enumerate()
        .map(|(v, (i, vdisk))| {
            let remote = a.remote[v].iter().map(|&(k, u)| (used[k as usize].0.clone(), u)).collect();
            (vdisk, VmShare { node: used[i].0.clone(), local_units: a.local[v], remote })
        })
        .collect();
    Ok(AllocationRecord {
        unit_bytes,
        vms,
        total_avl_us: a.total_avl,
        ignored: ignored.into_iter().map(|(n, _)| n.clone()).collect(),
    })
}

/// A decision as an allocation of the problem whose VMs are `names` (node index, vDisk),
/// if it names every one of them at its node and lenders that are in the problem.
fn as_allocation(
    r: &AllocationRecord,
    names: &[(usize, String)],
    node_index: impl Fn(&str) -> Option<NodeId>,
) -> Option<crate::allocation::Allocation> {
    let mut local = Vec::with_capacity(names.len());
    let mut remote = Vec::with_capacity(names.len());
    for (i, name) in names {
        let share = r.vms.get(name)?;
        if node_index(&share.node)? as usize != *i {
            return None;
        }
        local.push(share.local_units);
        remote.push(share.remote.iter().map(|(n, u)| Some((node_index(n)?, *u))).collect::<Option<Vec<_>>>()?);
    }
    Some(crate::allocation::Allocation { local, remote, total_avl: r.total_avl_us })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_over_k_units_hits_once_the_cache_holds_it_and_windows_start_again() {
        let mut e = VmEstimator::new(4, 16);
        for _ in 0..10 {
            for b in 0..12 {
                e.access(b);
            }
        }
        // 120 accesses, 12 cold; every reuse at distance 11 (3 units of 4 blocks).
        let c = e.curve(IdealForm::Max, 16);
        assert_eq!(c.len(), 4, "0..=3 units: the ideal size is 12 blocks = 3 units: {c:?}");
        assert_eq!(c[2], 0.0);
        assert!((c[3] - 108.0 / 120.0).abs() < 1e-9, "{c:?}");
        assert_eq!(e.curve(IdealForm::Max, 2).len(), 3, "capped at max_units");
        e.next_window();
        assert_eq!(e.accesses(), 0.0);
        e.access(0);
        assert_eq!(e.histogram().reuses(), 1.0, "the history outlives the window");
    }

    #[test]
    fn the_problem_lists_every_nodes_vms_with_their_home_and_the_capacities() {
        let a = NodeEstimates { unit_bytes: 1 << 20, capacity_units: 4, vms: vec![("x".into(), vec![0.0, 0.5])] };
        let b = NodeEstimates { unit_bytes: 1 << 20, capacity_units: 8, vms: vec![("y".into(), vec![])] };
        let lat = Latencies { ssd_local_us: 100.0, ssd_remote_us: 100.0, network_us: 50.0, hdd_us: 5000.0 };
        let (p, names) = problem(lat, &[&a, &b]);
        assert_eq!(p.capacity, vec![4, 8]);
        assert_eq!((p.vms[0].home, p.vms[1].home), (0, 1));
        assert_eq!(p.vms[1].hit_ratio, vec![0.0]);
        assert_eq!(names, vec![(0, "x".to_string()), (1, "y".to_string())]);
    }

    #[test]
    fn malformed_estimates_are_left_out_by_name() {
        let ok = NodeEstimates { unit_bytes: 1 << 20, capacity_units: 4, vms: vec![("x".into(), vec![0.0, 1.0])] };
        assert!(ok.well_formed().is_ok());
        let lat = Latencies { ssd_local_us: 100.0, ssd_remote_us: 100.0, network_us: 50.0, hdd_us: 5000.0 };
        for bad in [
            NodeEstimates { vms: vec![("x".into(), vec![0.0, f64::NAN])], ..ok.clone() },
            NodeEstimates { vms: vec![("x".into(), vec![0.0, 1.5])], ..ok.clone() },
            NodeEstimates { vms: vec![("x".into(), vec![-0.1])], ..ok.clone() },
            NodeEstimates { capacity_units: MAX_UNITS + 1, ..ok.clone() },
            NodeEstimates { vms: vec![("x".into(), vec![0.0; MAX_UNITS as usize + 2])], ..ok.clone() },
        ] {
            assert!(bad.well_formed().is_err(), "{:?}", bad.capacity_units);
            let r =
                decide(lat, Solver::Fast, 1 << 20, &[("a".into(), ok.clone()), ("b".into(), bad)], None, 0.0).unwrap();
            assert_eq!(r.ignored, vec!["b".to_string()]);
            assert!(r.vms.contains_key("x"));
        }
        let edge = NodeEstimates { capacity_units: MAX_UNITS, ..ok.clone() };
        assert!(edge.well_formed().is_ok(), "the maximum is allowed");
    }

    #[test]
    fn a_vm_that_outgrows_its_node_borrows_from_an_idle_one_and_the_record_names_the_lender() {
        // x reuses everything at 8 units; its node has 4; node b's VM does not reuse.
        let ramp: Vec<f64> = (0..=8).map(|k| if k < 8 { 0.0 } else { 0.9 }).collect();
        let a = NodeEstimates { unit_bytes: 1 << 20, capacity_units: 4, vms: vec![("x".into(), ramp)] };
        let b = NodeEstimates { unit_bytes: 1 << 20, capacity_units: 8, vms: vec![("y".into(), vec![0.0])] };
        let odd = NodeEstimates { unit_bytes: 1 << 21, capacity_units: 8, vms: vec![] };
        let lat = Latencies { ssd_local_us: 100.0, ssd_remote_us: 100.0, network_us: 50.0, hdd_us: 5000.0 };
        let est = [("a".to_string(), a), ("b".to_string(), b), ("c".to_string(), odd)];
        for solver in [Solver::Exact, Solver::Fast] {
            let r = decide(lat, solver, 1 << 20, &est, None, 0.0).unwrap();
            let x = &r.vms["x"];
            assert_eq!((x.node.as_str(), x.local_units), ("a", 4), "{r:?}");
            assert_eq!(x.remote, vec![("b".to_string(), 4)], "{r:?}");
            assert_eq!(r.ignored, vec!["c".to_string()]);
        }
    }

    #[test]
    fn the_last_decision_is_kept_by_name_until_a_new_one_gains_enough() {
        // Two VMs on one node, near-alike curves: the split flips with a small change.
        let node = |x: Vec<f64>, y: Vec<f64>| NodeEstimates {
            unit_bytes: 1 << 20,
            capacity_units: 4,
            vms: vec![("x".into(), x), ("y".into(), y)],
        };
        let lat = Latencies { ssd_local_us: 100.0, ssd_remote_us: 100.0, network_us: 50.0, hdd_us: 5000.0 };
        // 3 + 1 units: 0.81 + 0.3 hits against 2 + 2: 0.6 + 0.5; then 0.8 + 0.3 against 0.6 + 0.51.
        let first = [("a".to_string(), node(vec![0.0, 0.4, 0.6, 0.81, 0.9], vec![0.0, 0.3, 0.5, 0.65, 0.9]))];
        let then = [("a".to_string(), node(vec![0.0, 0.4, 0.6, 0.8, 0.9], vec![0.0, 0.3, 0.51, 0.65, 0.9]))];
        let r1 = decide(lat, Solver::Exact, 1 << 20, &first, None, 0.02).unwrap();
        let flipped = decide(lat, Solver::Exact, 1 << 20, &then, None, 0.02).unwrap();
        assert_ne!(r1.vms, flipped.vms, "without a last decision the split follows the curves");
        let kept = decide(lat, Solver::Exact, 1 << 20, &then, Some(&r1), 0.02).unwrap();
        assert_eq!(kept.vms, r1.vms, "within 2%: kept");
        assert_eq!(decide(lat, Solver::Exact, 1 << 20, &then, Some(&r1), 0.0).unwrap().vms, flipped.vms);
        // A last decision naming a node that did not publish, or in another unit: not kept.
        let mut elsewhere = r1.clone();
        elsewhere.vms.get_mut("x").unwrap().node = "b".into();
        assert_eq!(decide(lat, Solver::Exact, 1 << 20, &then, Some(&elsewhere), 0.02).unwrap().vms, flipped.vms);
        let other_unit = AllocationRecord { unit_bytes: 1 << 21, ..r1.clone() };
        assert_eq!(decide(lat, Solver::Exact, 1 << 20, &then, Some(&other_unit), 0.02).unwrap().vms, flipped.vms);
    }
}
