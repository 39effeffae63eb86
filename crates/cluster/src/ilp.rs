//! ELICA's Eq. 4 as an integer linear program, solved by a maintained MILP library
//! (`good_lp` over the pure-Rust `microlp`): the formulation "as written" on allocation
//! units, for checking the other solvers against.
//!
//! Eq. 3 is not linear in a VM's size, so sizes become levels: a binary x_{v,k} per VM v
//! and size k (up to its ideal, constraint (e)), exactly one per VM. With the size fixed
//! Eq. 3 is linear in the remote part, so an integer r_{v,k} ≤ k·x_{v,k} carries the
//! remote units at level k, costing (HR_k / k)·ΔL each; integer y_{v,j} ≥ 0 are the units
//! node j ≠ home lends VM v (constraint (c)), Σ_j y_{v,j} = Σ_k r_{v,k} (b). Each node
//! holds its VMs' local parts and what it lends (d); (a) follows from (d).

use crate::allocation::{Allocation, Problem};
use crate::ownership::NodeId;
use good_lp::{constraint, microlp, variable, Expression, ProblemVariables, Solution, SolverModel, Variable};

/// Solves `p` as an ILP; `Err` with the solver's message if it fails.
pub fn solve_ilp(p: &Problem) -> Result<Allocation, String> {
    let n = p.capacity.len();
    let l = &p.lat;
    let delta = l.ssd_remote_us + l.network_us - l.ssd_local_us;
    let mut vars = ProblemVariables::new();
    let mut x: Vec<Vec<Variable>> = Vec::new();
    let mut r: Vec<Vec<Variable>> = Vec::new();
    let mut y: Vec<Vec<(usize, Variable)>> = Vec::new();
    let mut objective = Expression::from(0.0);
    for vm in &p.vms {
        let ideal = vm.hit_ratio.len().saturating_sub(1);
        let mut xs = Vec::new();
        let mut rs = Vec::new();
        for k in 0..=ideal {
            let xv = vars.add(variable().binary());
            let rv = vars.add(variable().integer().min(0).max(k as f64));
            let hr = if k == 0 { 0.0 } else { vm.hit_ratio[k] };
            objective += xv * (l.hdd_us - hr * (l.hdd_us - l.ssd_local_us));
            if k > 0 {
                objective += rv * (hr / k as f64 * delta);
            }
            xs.push(xv);
            rs.push(rv);
        }
        let ys =
            (0..n).filter(|&j| j != vm.home as usize).map(|j| (j, vars.add(variable().integer().min(0)))).collect();
        x.push(xs);
        r.push(rs);
        y.push(ys);
    }
    let mut model = vars.minimise(objective.clone()).using(microlp);
    for v in 0..p.vms.len() {
        let one: Expression = x[v].iter().copied().sum();
        model = model.with(constraint!(one == 1.0));
        for (k, (&xv, &rv)) in x[v].iter().zip(&r[v]).enumerate() {
            model = model.with(constraint!(rv <= xv * k as f64));
        }
        let remote: Expression = r[v].iter().copied().sum();
        let lent: Expression = y[v].iter().map(|&(_, yv)| yv).sum();
        model = model.with(constraint!(lent == remote));
    }
    for i in 0..n {
        let mut held = Expression::from(0.0);
        for (v, vm) in p.vms.iter().enumerate() {
            if vm.home as usize == i {
                for (k, (&xv, &rv)) in x[v].iter().zip(&r[v]).enumerate() {
                    held += xv * k as f64 - rv;
                }
            } else if let Some(&(_, yv)) = y[v].iter().find(|(j, _)| *j == i) {
                held += yv;
            }
        }
        model = model.with(constraint!(held <= p.capacity[i] as f64));
    }
    let sol = model.solve().map_err(|e| format!("ILP: {e}"))?;
    let units = |var: Variable| sol.value(var).round().max(0.0) as u64;
    let mut local = Vec::new();
    let mut remote = Vec::new();
    for v in 0..p.vms.len() {
        let size = x[v].iter().enumerate().find(|(_, &xv)| sol.value(xv) > 0.5).map_or(0, |(k, _)| k as u64);
        let rem: u64 = r[v].iter().map(|&rv| units(rv)).sum();
        local.push(size - rem.min(size));
        remote.push(y[v].iter().filter(|(_, yv)| units(*yv) > 0).map(|&(j, yv)| (j as NodeId, units(yv))).collect());
    }
    let mut a = Allocation { local, remote, total_avl: 0.0 };
    a.total_avl = p.check(&a)?;
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocation::solve_exact;
    use crate::allocation::tests::problem_from_gains;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The ILP as written and the exact solver agree on small clusters.
        #[test]
        fn the_ilp_and_the_exact_solver_agree(
            caps in prop::collection::vec(0u64..5, 2..=3),
            vms in prop::collection::vec((0u16..3, prop::collection::vec(1u32..100, 1..=4)), 1..=4),
        ) {
            let p = problem_from_gains(caps, vms);
            let exact = solve_exact(&p);
            let ilp = solve_ilp(&p).unwrap();
            prop_assert!((ilp.total_avl - exact.total_avl).abs() < 1e-6 * exact.total_avl.max(1.0),
                "ILP {} vs exact {}", ilp.total_avl, exact.total_avl);
        }
    }
}
