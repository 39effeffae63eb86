//! The fast solver of ELICA's allocation (Eq. 4): a Lagrangian price on the cluster's
//! capacity (constraint (a)), an exact per-node dynamic program for each price, and a
//! greedy fill of what the last price step leaves unused — for 500 VMs on 16 nodes in
//! well under a second (the ILP and the exact tables of `allocation.rs` take ~1 s and
//! ~8 s there; `cachevisor bench cluster`).
//!
//! The structure it rests on (`docs/cluster.md`, "The allocation"):
//! - with the sizes fixed, a node's remote units go to its VMs of lowest hit density
//!   HR(c)/c first (Eq. 3 charges a remote unit the VM's average hits), so at most one
//!   VM per node is partly remote; the others are all local or all remote;
//! - a node that borrows has no local spare at the optimum, and lenders are then any
//!   other nodes (one remote latency), so the cluster couples the nodes only through the
//!   sum of sizes ≤ the sum of caches.
//!
//! So for a price λ per unit of cache each node is independent: a DP over its VMs with
//! the local units used (≤ its cache) and whether its one partial VM is taken as state;
//! a VM's all-remote option does not use local units, so only its best one matters,
//! and its partial options reduce to the best per local amount. The least price whose
//! sizes fit the cluster (bisection) gives a feasible allocation; the units its price
//! step leaves free are then given out one at a time where they lower the objective
//! most. Exact for each node at each price; the Lagrangian step can leave a gap of about
//! one VM's worth of units, which the fill mostly closes — measured against the exact
//! solver and the ILP in the tests and the bench. Hand-written: the problem is ELICA's.

use crate::allocation::{lend, Allocation, Problem, VmCurve};
use cachevisor_analysis::concave::concave_majorant;

/// How many bisection steps the price search takes (the price's range halves each time).
const PRICE_STEPS: usize = 48;

/// One VM's choice: its size and how many of its units are remote.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Choice {
    size: u32,
    remote: u32,
}

/// The least-cost allocation, fast (see the top comment). A curve that is not concave is
/// replaced by its concave majorant for the search (the price step is exact only on
/// concave curves); the result is valued, filled and split on the curves themselves.
pub fn solve_fast(p: &Problem) -> Allocation {
    let hulls = Problem {
        vms: p.vms.iter().map(|vm| VmCurve { home: vm.home, hit_ratio: concave_majorant(&vm.hit_ratio) }).collect(),
        ..p.clone()
    };
    let mut choices = search(&hulls);
    let by_node = vms_by_node(p);
    let used: u64 = choices.iter().map(|x| x.size as u64).sum();
    fill(p, &mut choices, p.capacity.iter().sum::<u64>() - used);
    for (i, vms) in by_node.iter().enumerate() {
        split(p, p.capacity[i], vms, &mut choices);
    }
    exchange(p, &by_node, &mut choices);
    let local: Vec<u64> = choices.iter().map(|c| (c.size - c.remote) as u64).collect();
    let borrowed: Vec<u64> = choices.iter().map(|c| c.remote as u64).collect();
    let mut a = lend(p, local, &borrowed);
    a.total_avl = p.check(&a).expect("the fast solver's allocation meets the constraints");
    a
}

/// The price search, its fill and split, on `p`'s curves as they are.
fn search(p: &Problem) -> Vec<Choice> {
    let by_node = vms_by_node(p);
    let total_cap: u64 = p.capacity.iter().sum();
    let at = |price: f64| -> Vec<Choice> {
        let mut out = vec![Choice::default(); p.vms.len()];
        for (i, vms) in by_node.iter().enumerate() {
            node_at_price(p, p.capacity[i] as usize, vms, price, &mut out);
        }
        out
    };
    let size = |c: &[Choice]| c.iter().map(|x| x.size as u64).sum::<u64>();
    let mut choices = at(0.0);
    if size(&choices) > total_cap {
        // A unit can lower a VM's latency by at most the whole miss penalty.
        let (mut lo, mut hi) = (0.0, p.lat.hdd_us - p.lat.ssd_local_us + 1.0);
        choices = at(hi);
        for _ in 0..PRICE_STEPS {
            let mid = 0.5 * (lo + hi);
            let c = at(mid);
            let used = size(&c);
            if used <= total_cap {
                hi = mid;
                choices = c;
                if used == total_cap {
                    break;
                }
            } else {
                lo = mid;
            }
        }
        let spare = total_cap - size(&choices);
        fill(p, &mut choices, spare);
        for (i, vms) in by_node.iter().enumerate() {
            split(p, p.capacity[i], vms, &mut choices);
        }
    }
    choices
}

fn vms_by_node(p: &Problem) -> Vec<Vec<usize>> {
    let mut by_node = vec![Vec::new(); p.capacity.len()];
    for (v, vm) in p.vms.iter().enumerate() {
        by_node[vm.home as usize].push(v);
    }
    by_node
}

/// The options of one VM at a price, as a DP step needs them.
struct VmOptions {
    /// Cost with no local units: size 0 or all remote, whichever is cheaper.
    no_local: (f64, Choice),
    /// Cost all local at size k (index k − 1), up to the best size at the price.
    local: Vec<f64>,
    /// Best cost partly remote with k local units (index k − 1): size > k.
    partial: Vec<(f64, Choice)>,
}

fn options(p: &Problem, v: usize, price: f64) -> VmOptions {
    let ideal = p.vms[v].hit_ratio.len().saturating_sub(1);
    let cost = |local: usize, remote: usize| p.vm_avl(v, local as u64, remote as u64) + price * (local + remote) as f64;
    let mut no_local = (cost(0, 0), Choice::default());
    for b in 1..=ideal {
        let x = cost(0, b);
        if x < no_local.0 {
            no_local = (x, Choice { size: b as u32, remote: b as u32 });
        }
    }
    // All local, only up to the size the price alone would choose: a larger one costs
    // more and holds more of the node's cache, so no optimum has it.
    let mut local: Vec<f64> = (1..=ideal).map(|k| cost(k, 0)).collect();
    let best = (0..=ideal).min_by(|&a, &b| {
        let x = |k: usize| if k == 0 { cost(0, 0) } else { local[k - 1] };
        x(a).total_cmp(&x(b)).then(a.cmp(&b))
    });
    local.truncate(best.unwrap_or(0));
    VmOptions { no_local, local, partial: Vec::new() }
}

/// Fills in `o.partial` for VM `v` at `price` (only a node whose cache binds needs it):
/// the best cost partly remote with k local units, for each k.
fn add_partial(p: &Problem, v: usize, price: f64, o: &mut VmOptions) {
    let ideal = p.vms[v].hit_ratio.len().saturating_sub(1);
    let cost = |local: usize, remote: usize| p.vm_avl(v, local as u64, remote as u64) + price * (local + remote) as f64;
    o.partial = (1..=ideal)
        .map(|k| {
            let mut best = (f64::INFINITY, Choice::default());
            for c in k + 1..=ideal {
                let x = cost(k, c - k);
                if x < best.0 {
                    best = (x, Choice { size: c as u32, remote: (c - k) as u32 });
                }
            }
            best
        })
        .collect();
}

/// The exact optimum of one node's VMs at `price` per unit, its local units ≤ `cap`;
/// writes each VM's choice into `out`.
fn node_at_price(p: &Problem, cap: usize, vms: &[usize], price: f64, out: &mut [Choice]) {
    if vms.is_empty() {
        return;
    }
    let mut opts: Vec<VmOptions> = vms.iter().map(|&v| options(p, v, price)).collect();
    // A node whose cache holds every VM's best all-local size needs no search: a remote
    // unit costs at least a local one (Eq. 3), so no partial or all-remote option beats a
    // VM's best all-local one, and each VM takes it.
    let remote_dearer = p.lat.ssd_remote_us + p.lat.network_us >= p.lat.ssd_local_us;
    if remote_dearer && opts.iter().map(|o| o.local.len()).sum::<usize>() <= cap {
        for (&v, o) in vms.iter().zip(&opts) {
            let k = o.local.len() as u32;
            out[v] =
                if k == 0 && o.no_local.0 < p.vm_avl(v, 0, 0) { o.no_local.1 } else { Choice { size: k, remote: 0 } };
        }
        return;
    }
    for (&v, o) in vms.iter().zip(opts.iter_mut()) {
        add_partial(p, v, price, o);
    }
    let w = cap + 1;
    // dps[i][flag * w + l]: least cost of the first i VMs with l local units, flag = the
    // partial VM taken. Each step is a (min, +) convolution written as loops over
    // contiguous states, which the compiler vectorizes; which option each state took is
    // found again on the way back (the one whose sum equals the state's cost, in the
    // order a per-state scan would have met it, so ties resolve as before).
    let mut dps = vec![f64::INFINITY; (opts.len() + 1) * 2 * w];
    dps[0] = 0.0;
    for (i, o) in opts.iter().enumerate() {
        let (before, after) = dps.split_at_mut((i + 1) * 2 * w);
        let dp = &before[i * 2 * w..];
        let next = &mut after[..2 * w];
        let relax = |next: &mut [f64], from: &[f64], x: f64| {
            for (n, &b) in next.iter_mut().zip(from) {
                let v = b + x;
                if v < *n {
                    *n = v;
                }
            }
        };
        for flag in 0..2 {
            let (d, n) = (&dp[flag * w..(flag + 1) * w], &mut next[flag * w..(flag + 1) * w]);
            relax(n, d, o.no_local.0);
            for (k, &x) in o.local.iter().enumerate().take(cap) {
                relax(&mut n[k + 1..], &d[..w - k - 1], x);
            }
        }
        for (k, &(x, _)) in o.partial.iter().enumerate().take(cap) {
            relax(&mut next[w + k + 1..], &dp[..w - k - 1], x);
        }
    }
    let last = &dps[opts.len() * 2 * w..];
    let mut s = (0..2 * w).min_by(|&a, &b| last[a].total_cmp(&last[b])).expect("non-empty");
    for (i, &v) in vms.iter().enumerate().rev() {
        let (dp, here) = (&dps[i * 2 * w..(i + 1) * 2 * w], dps[(i + 1) * 2 * w + s]);
        let o = &opts[i];
        let (flag, l) = (s / w, s % w);
        // Sources in the order (flag, l) ascending: partial ones from flag 0 (largest k
        // first), then this flag's local ones (largest k first), then no local.
        let partial = (flag == 1)
            .then(|| (1..=o.partial.len().min(l)).rev().find(|&k| dp[l - k] + o.partial[k - 1].0 == here))
            .flatten();
        let local = || (1..=o.local.len().min(l)).rev().find(|&k| dp[flag * w + l - k] + o.local[k - 1] == here);
        out[v] = if let Some(k) = partial {
            s = l - k;
            o.partial[k - 1].1
        } else if let Some(k) = local() {
            s = flag * w + l - k;
            Choice { size: k as u32, remote: 0 }
        } else {
            debug_assert!(dp[s] + o.no_local.0 == here, "a DP state with no source");
            o.no_local.1
        };
    }
}

/// Gives out `spare` more units of the cluster where they lower the objective most per
/// unit — a VM grown by k units at a time, so a curve that pays only after a flat stretch
/// is still seen (local units where the VM's node has room, else remote) — until none
/// does or none is left.
fn fill(p: &Problem, choices: &mut [Choice], mut spare: u64) {
    let mut room: Vec<u64> = p.capacity.clone();
    for (v, c) in choices.iter().enumerate() {
        room[p.vms[v].home as usize] -= (c.size - c.remote) as u64;
    }
    let cost = |v: usize, c: Choice| p.vm_avl(v, (c.size - c.remote) as u64, c.remote as u64);
    while spare > 0 {
        let mut best: Option<(f64, usize, Choice)> = None;
        for (v, &c) in choices.iter().enumerate() {
            let room = room[p.vms[v].home as usize];
            let most = (p.vms[v].hit_ratio.len() as u64).saturating_sub(1 + c.size as u64).min(spare);
            for k in 1..=most {
                let remote = k.saturating_sub(room) as u32;
                let next = Choice { size: c.size + k as u32, remote: c.remote + remote };
                let gain = (cost(v, c) - cost(v, next)) / k as f64;
                if gain > 1e-12 && best.is_none_or(|b| gain > b.0) {
                    best = Some((gain, v, next));
                }
            }
        }
        let Some((_, v, next)) = best else { break };
        let (grown, remote) = (next.size - choices[v].size, next.remote - choices[v].remote);
        room[p.vms[v].home as usize] -= (grown - remote) as u64;
        choices[v] = next;
        spare -= grown as u64;
    }
}

/// Moves k units from the VM that loses least by giving them to the one that gains most
/// by taking them, while that lowers the objective (after both nodes are split again):
/// on a curve that is not concave the price step can stop short of a jump the
/// majorant promised, and only taking units from another VM reaches it.
fn exchange(p: &Problem, by_node: &[Vec<usize>], choices: &mut [Choice]) {
    let cost = |v: usize, c: Choice| p.vm_avl(v, (c.size - c.remote) as u64, c.remote as u64);
    let node_cost = |i: usize, ch: &[Choice]| by_node[i].iter().map(|&v| cost(v, ch[v])).sum::<f64>();
    let kmax = p.vms.iter().map(|vm| vm.hit_ratio.len()).max().unwrap_or(1).saturating_sub(1);
    for _ in 0..4 * p.vms.len() {
        let mut room: Vec<u64> = p.capacity.clone();
        for (v, c) in choices.iter().enumerate() {
            room[p.vms[v].home as usize] -= (c.size - c.remote) as u64;
        }
        // Per k: the best receiver (gain, VM) and the two cheapest donors (loss, VM).
        let mut recv = vec![(0.0f64, usize::MAX); kmax + 1];
        let mut give = vec![[(f64::INFINITY, usize::MAX); 2]; kmax + 1];
        for (v, &c) in choices.iter().enumerate() {
            let ideal = p.vms[v].hit_ratio.len() - 1;
            for k in 1..=kmax {
                if c.size as usize + k <= ideal {
                    let r = (k as u64).saturating_sub(room[p.vms[v].home as usize]) as u32;
                    let gain = cost(v, c) - cost(v, Choice { size: c.size + k as u32, remote: c.remote + r });
                    if gain > recv[k].0 {
                        recv[k] = (gain, v);
                    }
                }
                if c.size as usize >= k {
                    let r = c.remote.min(k as u32);
                    let loss = cost(v, Choice { size: c.size - k as u32, remote: c.remote - r }) - cost(v, c);
                    let g = &mut give[k];
                    if loss < g[0].0 {
                        g[1] = g[0];
                        g[0] = (loss, v);
                    } else if loss < g[1].0 {
                        g[1] = (loss, v);
                    }
                }
            }
        }
        let best = (1..=kmax)
            .filter_map(|k| {
                let (gain, to) = recv[k];
                let (loss, from) = give[k].into_iter().find(|d| d.1 != to && d.1 != usize::MAX)?;
                (to != usize::MAX && gain - loss > 1e-9).then_some((gain - loss, k, from, to))
            })
            .max_by(|a, b| a.0.total_cmp(&b.0));
        let Some((_, k, from, to)) = best else { return };
        let nodes = [p.vms[from].home as usize, p.vms[to].home as usize];
        let before: f64 = if nodes[0] == nodes[1] {
            node_cost(nodes[0], choices)
        } else {
            nodes.iter().map(|&i| node_cost(i, choices)).sum()
        };
        let saved = (choices[from], choices[to]);
        let c = choices[from];
        choices[from] = Choice { size: c.size - k as u32, remote: c.remote - c.remote.min(k as u32) };
        let c = choices[to];
        choices[to] = Choice { size: c.size + k as u32, remote: c.remote + k as u32 };
        for &i in &nodes {
            split(p, p.capacity[i], &by_node[i], choices);
        }
        let after: f64 = if nodes[0] == nodes[1] {
            node_cost(nodes[0], choices)
        } else {
            nodes.iter().map(|&i| node_cost(i, choices)).sum()
        };
        if after >= before - 1e-9 {
            (choices[from], choices[to]) = saved;
            for &i in &nodes {
                split(p, p.capacity[i], &by_node[i], choices);
            }
            return;
        }
    }
}

/// With one node's sizes fixed, the best split (exact): its cache holds the VMs of
/// highest hit density HR(c)/c whole, the next one in part, the rest are remote.
fn split(p: &Problem, cap: u64, vms: &[usize], choices: &mut [Choice]) {
    let density = |v: usize| {
        let c = choices[v].size as usize;
        if c == 0 {
            0.0
        } else {
            p.vms[v].hit_ratio[c] / c as f64
        }
    };
    let mut order: Vec<usize> = vms.iter().copied().filter(|&v| choices[v].size > 0).collect();
    order.sort_by(|&a, &b| density(b).total_cmp(&density(a)).then(a.cmp(&b)));
    let mut room = cap;
    for v in order {
        let local = room.min(choices[v].size as u64);
        room -= local;
        choices[v].remote = choices[v].size - local as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocation::solve_exact;
    use crate::allocation::tests::problem_from_gains;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Against the exact solver on small clusters of concave curves: a feasible
        /// allocation, never better than the optimum (a check of the check), and within
        /// 0.2% of it (the worst seen in 300,000 cases: 0.1001%).
        #[test]
        fn near_the_exact_optimum(
            caps in prop::collection::vec(0u64..8, 2..=4),
            vms in prop::collection::vec((0u16..4, prop::collection::vec(1u32..100, 1..=5)), 1..=6),
        ) {
            // Concave curves: each VM's gains per unit non-increasing.
            let vms = vms.into_iter().map(|(h, mut g)| { g.sort_unstable_by(|a, b| b.cmp(a)); (h, g) }).collect();
            let p = problem_from_gains(caps, vms);
            let exact = solve_exact(&p);
            let fast = solve_fast(&p);
            prop_assert!(p.check(&fast).is_ok());
            prop_assert!(fast.total_avl >= exact.total_avl - 1e-6);
            let gap = (fast.total_avl - exact.total_avl) / exact.total_avl;
            prop_assert!(gap <= 2e-3, "fast {} vs exact {} ({:+.4}%)", fast.total_avl, exact.total_avl, gap * 100.0);
        }
    }

    /// The per-state DP the vectorized one replaced: for every state, every option
    /// relaxed in turn, the option each state took recorded as it goes.
    fn node_at_price_reference(p: &Problem, cap: usize, vms: &[usize], price: f64, out: &mut [Choice]) {
        let opts: Vec<VmOptions> = vms
            .iter()
            .map(|&v| {
                let mut o = options(p, v, price);
                add_partial(p, v, price, &mut o);
                o
            })
            .collect();
        let w = cap + 1;
        let mut dp = vec![f64::INFINITY; 2 * w];
        dp[0] = 0.0;
        let mut taken: Vec<Vec<i32>> = Vec::new();
        for o in &opts {
            let mut next = vec![f64::INFINITY; 2 * w];
            let mut pick = vec![0i32; 2 * w];
            for flag in 0..2 {
                for l in 0..w {
                    let base = dp[flag * w + l];
                    if !base.is_finite() {
                        continue;
                    }
                    let mut relax = |s: usize, x: f64, code: i32| {
                        if x < next[s] {
                            next[s] = x;
                            pick[s] = code;
                        }
                    };
                    relax(flag * w + l, base + o.no_local.0, 0);
                    for (k, &x) in o.local.iter().enumerate().take(cap - l) {
                        relax(flag * w + l + k + 1, base + x, k as i32 + 1);
                    }
                    if flag == 0 {
                        for (k, &(x, _)) in o.partial.iter().enumerate().take(cap - l) {
                            if x.is_finite() {
                                relax(w + l + k + 1, base + x, -(k as i32 + 1));
                            }
                        }
                    }
                }
            }
            dp = next;
            taken.push(pick);
        }
        let mut s = (0..2 * w).min_by(|&a, &b| dp[a].total_cmp(&dp[b])).expect("non-empty");
        for (i, &v) in vms.iter().enumerate().rev() {
            let (flag, l) = (s / w, s % w);
            out[v] = match taken[i][s] {
                0 => opts[i].no_local.1,
                k if k > 0 => {
                    s = flag * w + l - k as usize;
                    Choice { size: k as u32, remote: 0 }
                }
                k => {
                    let k = (-k) as usize;
                    s = l - k;
                    opts[i].partial[k - 1].1
                }
            };
        }
    }

    /// The vectorized per-node DP (and its shortcut for a node whose cache does not
    /// bind) chooses exactly what the per-state DP does, at prices across the search's
    /// range, on concave and other curves, with ties (integer gains make many).
    #[test]
    fn the_node_dp_chooses_what_the_per_state_dp_does() {
        let mut compared = 0;
        for (i, p) in small_cases(4_000, true).into_iter().chain(small_cases(4_000, false)).enumerate() {
            let by_node = vms_by_node(&p);
            for price in [0.0, 1.0, 7.5, 40.0, 333.0, 2_000.0, 7_999.0] {
                for (n, vms) in by_node.iter().enumerate() {
                    let cap = p.capacity[n] as usize;
                    let (mut a, mut b) = (vec![Choice::default(); p.vms.len()], vec![Choice::default(); p.vms.len()]);
                    node_at_price(&p, cap, vms, price, &mut a);
                    node_at_price_reference(&p, cap, vms, price, &mut b);
                    let cost = |c: &[Choice]| -> f64 {
                        vms.iter()
                            .map(|&v| {
                                let x = c[v];
                                p.vm_avl(v, (x.size - x.remote) as u64, x.remote as u64) + price * x.size as f64
                            })
                            .sum()
                    };
                    // The shortcut may take another of several equal-cost choices.
                    if (cost(&a) - cost(&b)).abs() > 1e-9 || (a != b && !shortcut(&p, cap, vms, price)) {
                        panic!("case {i}, node {n}, price {price}: {a:?} vs {b:?}");
                    }
                    compared += 1;
                }
            }
        }
        assert!(compared > 100_000, "{compared} node DPs compared");
    }

    /// Whether [`node_at_price`] took its shortcut for this node.
    fn shortcut(p: &Problem, cap: usize, vms: &[usize], price: f64) -> bool {
        vms.iter().map(|&v| options(p, v, price).local.len()).sum::<usize>() <= cap
    }

    /// Small random clusters of 2–4 nodes and 1–6 VMs (seeded), as the proptest draws them.
    fn small_cases(n: usize, concave: bool) -> Vec<Problem> {
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let s = (
            prop::collection::vec(0u64..8, 2..=4),
            prop::collection::vec((0u16..4, prop::collection::vec(1u32..100, 1..=5)), 1..=6),
        );
        (0..n)
            .map(|_| {
                let (caps, vms) = s.new_tree(&mut runner).unwrap().current();
                let vms = vms
                    .into_iter()
                    .map(|(h, mut g)| {
                        if concave {
                            g.sort_unstable_by(|a, b| b.cmp(a));
                        }
                        (h, g)
                    })
                    .collect();
                problem_from_gains(caps, vms)
            })
            .collect()
    }

    #[test]
    fn exact_on_almost_every_small_concave_cluster() {
        // Measured: 99,991 of 100,000 (worst 0.068%).
        let cases = small_cases(5_000, true);
        let exact = cases.iter().filter(|p| solve_fast(p).total_avl <= solve_exact(p).total_avl + 1e-9).count();
        assert!(exact >= 4_990, "exact on {exact} of 5,000");
    }

    #[test]
    fn curves_that_are_not_concave_stay_close() {
        // Steps and plateaus (random gains in any order): the majorant's promise is
        // reached by exchanging units. Measured: exact on 95,618 of 100,000, mean gap
        // 0.10%; without the exchange step 4,295 of these 5,000.
        let cases = small_cases(5_000, false);
        let gaps: Vec<f64> = cases
            .iter()
            .map(|p| {
                let e = solve_exact(p).total_avl;
                (solve_fast(p).total_avl - e) / e
            })
            .collect();
        let exact = gaps.iter().filter(|&&g| g < 1e-12).count();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        assert!(exact >= 4_700, "exact on {exact} of 5,000");
        assert!(mean < 0.003, "mean gap {:.4}%", mean * 100.0);
    }
}
