//! ELICA's allocation (Eq. 4): each VM's cache size, and how much of it is local or lent
//! by other nodes, minimizing the sum of the VMs' average latencies (Eq. 3) under
//! constraints (a)–(e): cluster capacity, local + remote = size, remote from nodes other
//! than the VM's, each node's cache holding its VMs' local parts and what it lends, no VM
//! above its ideal size.
//!
//! This is the exact reference solver, by dynamic programming on allocation units, for
//! checking faster ones against (`docs/cluster.md`):
//! - per node, over its VMs: the least cost for every (local units used, remote units
//!   borrowed) pair, each VM choosing its size and remote part;
//! - across nodes, over the net each node gives the pool (spare − borrowed): the least
//!   total with a non-negative sum. A node that both lends and borrows is never better
//!   than one that keeps its own VMs' blocks local (a remote unit costs more than a local
//!   one for the same hits), so this relaxation has an optimum in which lenders and
//!   borrowers are distinct nodes — and then any split of the lending is feasible and
//!   costs the same (Eq. 3 has one remote latency).
//!
//! Its cost grows with (units per node)² × units per VM per VM: for tests and small
//! clusters. Hand-written: the problem is ELICA's own.

use crate::model::{avl, Latencies};
use crate::ownership::NodeId;

/// A VM's demand: its home node and its hit ratio at each size in allocation units
/// (`hit_ratio[k]` at k units; the last index is its ideal size, Eq. 1 — constraint (e)).
#[derive(Debug, Clone, PartialEq)]
pub struct VmCurve {
    /// The node it runs on.
    pub home: NodeId,
    /// Hit ratio by size in units, from 0 (whose value is unused: no cache, no hits).
    pub hit_ratio: Vec<f64>,
}

/// An allocation problem.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// Latencies of Eq. 3.
    pub lat: Latencies,
    /// Each node's cache, in units.
    pub capacity: Vec<u64>,
    /// The VMs.
    pub vms: Vec<VmCurve>,
}

/// A solution.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    /// Local units per VM.
    pub local: Vec<u64>,
    /// Remote units per VM, by lending node.
    pub remote: Vec<Vec<(NodeId, u64)>>,
    /// The objective: the sum of the VMs' average latencies (µs).
    pub total_avl: f64,
}

impl Problem {
    /// Eq. 3 for VM `v` with `local` and `remote` units.
    pub fn vm_avl(&self, v: usize, local: u64, remote: u64) -> f64 {
        let c = (local + remote) as usize;
        let hr = if c == 0 { 0.0 } else { self.vms[v].hit_ratio[c] };
        avl(&self.lat, hr, local, remote)
    }

    /// The objective of `a`, and whether it meets every constraint.
    pub fn check(&self, a: &Allocation) -> Result<f64, String> {
        let n = self.capacity.len();
        let mut used = vec![0u64; n];
        let mut total = 0.0;
        for (v, vm) in self.vms.iter().enumerate() {
            let remote: u64 = a.remote[v].iter().map(|r| r.1).sum();
            if (a.local[v] + remote) as usize >= vm.hit_ratio.len().max(1) {
                return Err(format!("VM {v} above its ideal size (e)"));
            }
            used[vm.home as usize] += a.local[v];
            for &(k, units) in &a.remote[v] {
                if k == vm.home {
                    return Err(format!("VM {v} borrows from its own node (c)"));
                }
                used[k as usize] += units;
            }
            total += self.vm_avl(v, a.local[v], remote);
        }
        for (i, (&u, &cap)) in used.iter().zip(&self.capacity).enumerate() {
            if u > cap {
                return Err(format!("node {i} holds {u} units, its cache {cap} (d)"));
            }
        }
        Ok(total)
    }
}

/// The solvers of Eq. 4, behind one interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Solver {
    /// The exact reference: per-node and pool tables ([`solve_exact`]); small clusters.
    Exact,
    /// The ILP as written, through `good_lp` / `microlp` ([`crate::ilp::solve_ilp`]).
    Ilp,
    /// The Lagrangian price with exact per-node DPs ([`crate::fast::solve_fast`]).
    Fast,
}

impl Solver {
    /// Solves `p`; `Err` only if the ILP library fails.
    pub fn solve(self, p: &Problem) -> Result<Allocation, String> {
        match self {
            Solver::Exact => Ok(solve_exact(p)),
            Solver::Ilp => crate::ilp::solve_ilp(p),
            Solver::Fast => Ok(crate::fast::solve_fast(p)),
        }
    }
}

/// The least-cost allocation (exact on the units).
pub fn solve_exact(p: &Problem) -> Allocation {
    let n = p.capacity.len();
    let total_cap: u64 = p.capacity.iter().sum();
    // Per node: cost[l][r] over its VMs, with choices to rebuild them.
    struct NodeTable {
        cap: usize,
        emax: usize,
        cost: Vec<f64>,
        /// Per VM of the node (in order), the (size, remote) chosen for each state.
        choice: Vec<Vec<(u32, u32)>>,
        vms: Vec<usize>,
    }
    let mut tables = Vec::with_capacity(n);
    for i in 0..n {
        let cap = p.capacity[i] as usize;
        let emax = (total_cap - p.capacity[i]) as usize;
        let w = emax + 1;
        let vms: Vec<usize> = (0..p.vms.len()).filter(|&v| p.vms[v].home as usize == i).collect();
        let mut cost = vec![f64::INFINITY; (cap + 1) * w];
        cost[0] = 0.0;
        let mut choice = Vec::with_capacity(vms.len());
        for &v in &vms {
            let ideal = p.vms[v].hit_ratio.len().saturating_sub(1);
            let mut next = vec![f64::INFINITY; (cap + 1) * w];
            let mut pick = vec![(0u32, 0u32); (cap + 1) * w];
            for l in 0..=cap {
                for r in 0..w {
                    let base = cost[l * w + r];
                    if !base.is_finite() {
                        continue;
                    }
                    for c in 0..=ideal {
                        for rv in 0..=c {
                            let (nl, nr) = (l + c - rv, r + rv);
                            if nl > cap || nr > emax {
                                continue;
                            }
                            let x = base + p.vm_avl(v, (c - rv) as u64, rv as u64);
                            if x < next[nl * w + nr] {
                                next[nl * w + nr] = x;
                                pick[nl * w + nr] = (c as u32, rv as u32);
                            }
                        }
                    }
                }
            }
            cost = next;
            choice.push(pick);
        }
        tables.push(NodeTable { cap, emax, cost, choice, vms });
    }
    // Across nodes: net = spare − borrowed, in [−emax, cap]; offset by the total borrow.
    let off: usize = tables.iter().map(|t| t.emax).sum();
    let span = off + total_cap as usize + 1;
    let mut pool = vec![f64::INFINITY; span];
    pool[off] = 0.0;
    let mut picks: Vec<Vec<Option<(usize, usize, usize)>>> = Vec::with_capacity(n);
    for t in &tables {
        let w = t.emax + 1;
        let mut next = vec![f64::INFINITY; span];
        let mut pick = vec![None; span];
        for (s, &base) in pool.iter().enumerate() {
            if !base.is_finite() {
                continue;
            }
            for l in 0..=t.cap {
                for r in 0..w {
                    let c = t.cost[l * w + r];
                    if !c.is_finite() {
                        continue;
                    }
                    let net = (t.cap - l) as isize - r as isize;
                    let ns = s as isize + net;
                    if ns < 0 || ns as usize >= span {
                        continue;
                    }
                    let x = base + c;
                    if x < next[ns as usize] {
                        next[ns as usize] = x;
                        pick[ns as usize] = Some((s, l, r));
                    }
                }
            }
        }
        pool = next;
        picks.push(pick);
    }
    // The best end state with a non-negative pool.
    let (mut s, _) = pool
        .iter()
        .enumerate()
        .skip(off)
        .filter(|(_, c)| c.is_finite())
        .min_by(|a, b| a.1.total_cmp(b.1))
        .expect("the empty allocation is always feasible");
    // Rebuild each node's (l, r), then its VMs' choices.
    let mut local = vec![0u64; p.vms.len()];
    let mut borrowed = vec![0u64; p.vms.len()];
    for i in (0..n).rev() {
        let (prev, l, r) = picks[i][s].expect("a reachable state has a choice");
        s = prev;
        let t = &tables[i];
        let w = t.emax + 1;
        let (mut l, mut r) = (l, r);
        for (k, &v) in t.vms.iter().enumerate().rev() {
            let (c, rv) = t.choice[k][l * w + r];
            local[v] = (c - rv) as u64;
            borrowed[v] = rv as u64;
            l -= (c - rv) as usize;
            r -= rv as usize;
        }
    }
    let mut a = lend(p, local, &borrowed);
    a.total_avl = p.check(&a).expect("the solver's allocation meets the constraints");
    a
}

/// An allocation from each VM's local units and remote units to borrow: each borrower's
/// units from the other nodes' spare, largest spare first (which node lends does not
/// change Eq. 3: one remote latency). `total_avl` is left 0 for the caller's check.
pub(crate) fn lend(p: &Problem, mut local: Vec<u64>, borrowed: &[u64]) -> Allocation {
    let n = p.capacity.len();
    let mut spare: Vec<u64> = p.capacity.clone();
    for (v, vm) in p.vms.iter().enumerate() {
        spare[vm.home as usize] -= local[v];
    }
    let mut remote = vec![Vec::new(); p.vms.len()];
    for (v, vm) in p.vms.iter().enumerate() {
        let mut need = borrowed[v];
        while need > 0 {
            let k = (0..n)
                .filter(|&k| k != vm.home as usize && spare[k] > 0)
                .max_by_key(|&k| (spare[k], std::cmp::Reverse(k)));
            let Some(k) = k else { break };
            let take = need.min(spare[k]);
            spare[k] -= take;
            need -= take;
            remote[v].push((k as NodeId, take));
        }
        // A node with spare of its own never needs to borrow at the optimum (see the
        // top comment); what the pool could not place becomes local there.
        if need > 0 {
            let home = vm.home as usize;
            let take = need.min(spare[home]);
            spare[home] -= take;
            local[v] += take;
        }
    }
    Allocation { local, remote, total_avl: 0.0 }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) const LAT: Latencies =
        Latencies { ssd_local_us: 100.0, ssd_remote_us: 100.0, network_us: 60.0, hdd_us: 5000.0 };

    /// A problem from proptest values: per VM (home, positive hit gains per unit), each
    /// made a monotone hit-ratio curve; homes wrap to the nodes there are.
    pub(crate) fn problem_from_gains(capacity: Vec<u64>, vms: Vec<(u16, Vec<u32>)>) -> Problem {
        let n = capacity.len() as u16;
        let vms = vms
            .into_iter()
            .map(|(home, gains)| {
                let total: u32 = gains.iter().sum::<u32>() + 20;
                let mut hr = vec![0.0];
                let mut acc = 0;
                for g in gains {
                    acc += g;
                    hr.push(acc as f64 / total as f64);
                }
                VmCurve { home: home % n, hit_ratio: hr }
            })
            .collect();
        Problem { lat: LAT, capacity, vms }
    }

    /// A VM's local units and remote units by lending node.
    type VmOption = (u64, Vec<(NodeId, u64)>);

    /// Every allocation, by enumeration: each VM's (local, remote from each other node).
    fn brute(p: &Problem) -> f64 {
        let n = p.capacity.len();
        let mut options: Vec<Vec<VmOption>> = Vec::new();
        for vm in &p.vms {
            let ideal = vm.hit_ratio.len() as u64 - 1;
            let mut o = Vec::new();
            // Remote units from each other node: enumerate per-node amounts up to ideal.
            let others: Vec<usize> = (0..n).filter(|&k| k != vm.home as usize).collect();
            let mut rem = vec![0u64; others.len()];
            loop {
                let rsum: u64 = rem.iter().sum();
                if rsum <= ideal {
                    for l in 0..=ideal - rsum {
                        let lent =
                            others.iter().zip(&rem).filter(|(_, &u)| u > 0).map(|(&k, &u)| (k as NodeId, u)).collect();
                        o.push((l, lent));
                    }
                }
                // Next combination.
                let mut i = 0;
                while i < rem.len() {
                    rem[i] += 1;
                    if rem[i] <= ideal {
                        break;
                    }
                    rem[i] = 0;
                    i += 1;
                }
                if i == rem.len() {
                    break;
                }
            }
            options.push(o);
        }
        let mut best = f64::INFINITY;
        let mut idx = vec![0usize; p.vms.len()];
        loop {
            let a = Allocation {
                local: idx.iter().enumerate().map(|(v, &i)| options[v][i].0).collect(),
                remote: idx.iter().enumerate().map(|(v, &i)| options[v][i].1.clone()).collect(),
                total_avl: 0.0,
            };
            if let Ok(x) = p.check(&a) {
                best = best.min(x);
            }
            let mut v = 0;
            while v < idx.len() {
                idx[v] += 1;
                if idx[v] < options[v].len() {
                    break;
                }
                idx[v] = 0;
                v += 1;
            }
            if v == idx.len() {
                break;
            }
        }
        best
    }

    #[test]
    fn a_busy_node_borrows_from_an_idle_one() {
        // Node 0 has two VMs that want 3 units each and room for 2; node 1 is empty with 4.
        let hr = vec![0.0, 0.5, 0.7, 0.8];
        let p = Problem {
            lat: LAT,
            capacity: vec![2, 4],
            vms: vec![VmCurve { home: 0, hit_ratio: hr.clone() }, VmCurve { home: 0, hit_ratio: hr }],
        };
        let a = solve_exact(&p);
        assert_eq!(a.local.iter().sum::<u64>(), 2, "node 0's cache fully used locally");
        let lent: u64 = a.remote.iter().flatten().map(|r| r.1).sum();
        assert_eq!(lent, 4, "both VMs at their ideal 3, the rest from node 1");
        assert!(a.remote.iter().flatten().all(|r| r.0 == 1));
        assert!((a.total_avl - brute(&p)).abs() < 1e-6);
    }

    proptest! {
        /// Against brute force on small clusters: the same optimum, and the solver's
        /// allocation meets every constraint.
        #[test]
        fn optimal_against_enumeration(
            caps in prop::collection::vec(0u64..4, 2..=3),
            vms in prop::collection::vec((0u16..3, prop::collection::vec(1u32..100, 1..=3)), 1..=3),
        ) {
            let p = problem_from_gains(caps, vms);
            let a = solve_exact(&p);
            let got = p.check(&a);
            prop_assert!(got.is_ok(), "{:?}", got);
            let want = brute(&p);
            prop_assert!((a.total_avl - want).abs() < 1e-6, "solver {} vs enumeration {}", a.total_avl, want);
        }
    }
}
