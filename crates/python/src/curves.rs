//! Curves and decisions from Python: per-VM miss-ratio curves of a trace (exact or
//! SHARDS, `analysis::mrc_report`, what `analyze mrc` writes), an allocator of the policy
//! registry run once on given demands (`policy::Allocator::allocate`), and ELICA's Eq. 4
//! solved for given curves (`cluster::allocation::Solver`, ELICA §3.3).

use crate::read_options::PyReadOptions;
use crate::value_error;
use cachevisor_analysis::mrc_report::{MrcOptions, MrcReport};
use cachevisor_analysis::{Kind, Method, Profiler};
use cachevisor_cluster::allocation::{Problem, Solver, VmCurve};
use cachevisor_cluster::model::Latencies;
use cachevisor_engine::WritePolicy;
use cachevisor_policy::allocator::{Pool, VmDemand};
use cachevisor_policy::registry;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

/// Per-VM MRCs of `files` as JSON: the `analyze mrc` summary (`block_size`, `method`,
/// `kind`, `percentile`, `vms`), the curves (`curves`: per VM a list of
/// `{blocks, miss_ratio}` on one size axis) and, with `hit_curve_unit`, each VM's hits
/// of all accesses and of reads at sizes `0, unit, 2·unit, …` up to its working set
/// (`hit_curves`: what an allocator reads as `hit_curve` / `read_curve`).
#[pyfunction]
#[pyo3(signature = (files, *, format=None, vm_mode=None, skip_bad=false, blkparse_action=None, csv_columns=None, rename=None, block_size=4096, method="exact", rate=None, max_blocks=None, seed=0, shards_correction="size-biased", kind="all", percentile=0.95, points=200, hit_curve_unit=None))]
#[allow(clippy::too_many_arguments)]
pub fn mrc(
    py: Python<'_>,
    files: Vec<PathBuf>,
    format: Option<String>,
    vm_mode: Option<String>,
    skip_bad: bool,
    blkparse_action: Option<String>,
    csv_columns: Option<String>,
    rename: Option<HashMap<String, String>>,
    block_size: u64,
    method: &str,
    rate: Option<f64>,
    max_blocks: Option<usize>,
    seed: u64,
    shards_correction: &str,
    kind: &str,
    percentile: f64,
    points: usize,
    hit_curve_unit: Option<u64>,
) -> PyResult<String> {
    if !block_size.is_power_of_two() || block_size < 512 {
        return Err(value_error(format!("block_size {block_size}: must be a power of two of at least 512 B")));
    }
    if hit_curve_unit == Some(0) {
        return Err(value_error("hit_curve_unit must be at least 1 block"));
    }
    let m = Method::choose(method, rate, max_blocks).map_err(value_error)?;
    let opts = MrcOptions::new(kind, percentile, points).map_err(value_error)?;
    let ro =
        PyReadOptions { format, vm_mode, skip_bad, blkparse_action, csv_columns, rename: rename.unwrap_or_default() };
    let c = shards_correction
        .parse::<cachevisor_analysis::Correction>()
        .map_err(|e| value_error(format!("shards_correction {e}")))?;
    let mut trace = ro.open(&files, true)?;
    let (prof, n) = py
        .detach(|| {
            let mut prof = Profiler::new(block_size, m).with_seed(seed).with_correction(c);
            let mut n = 0u64;
            while let Some(r) = trace.next_request()? {
                prof.add(&r);
                n += 1;
            }
            Ok((prof, n))
        })
        .map_err(crate::trace_error)?;
    if n == 0 {
        return Err(value_error(format!("{}: no requests in the trace", names_of(&files))));
    }
    let report = MrcReport::build(&prof, trace.vm_names(), m, opts);
    #[derive(Serialize)]
    struct HitCurves {
        accesses: f64,
        hit_curve: Vec<f64>,
        read_accesses: f64,
        read_curve: Vec<f64>,
    }
    let hit_curves = hit_curve_unit.map(|unit| {
        prof.vms()
            .iter()
            .map(|v| {
                let (all, read) = (v.histogram(Kind::All), v.histogram(Kind::Read));
                let points = v.distinct_blocks().div_ceil(unit) as usize;
                HitCurves {
                    accesses: all.total(),
                    hit_curve: all.hits_curve(unit, points),
                    read_accesses: read.total(),
                    read_curve: read.hits_curve(unit, points),
                }
            })
            .collect::<Vec<_>>()
    });
    #[derive(Serialize)]
    struct Out<'a> {
        #[serde(flatten)]
        report: &'a MrcReport,
        curves: &'a [Vec<cachevisor_analysis::CurvePoint>],
        #[serde(skip_serializing_if = "Option::is_none")]
        hit_curve_unit: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        hit_curves: Option<Vec<HitCurves>>,
    }
    serde_json::to_string(&Out { report: &report, curves: &report.curves, hit_curve_unit, hit_curves })
        .map_err(value_error)
}

fn names_of(files: &[PathBuf]) -> String {
    files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", ")
}

/// Most steps of `unit` an allocation pool may have (`allocate`).
pub const MAX_STEPS: u64 = 1 << 20;
/// Most units a node's cache may have in `solve_cluster`, and most nodes.
pub const MAX_NODE_UNITS: u64 = 1 << 16;
pub const MAX_NODES: usize = 1024;
/// Most units of the whole cluster for the exact solver (its pool table spans them).
pub const MAX_EXACT_UNITS: u64 = 4096;

/// The registry's allocator names.
#[pyfunction]
pub fn allocators() -> Vec<&'static str> {
    registry::NAMES.to_vec()
}

/// One VM's demand from a dict whose keys are `VmDemand`'s fields (unknown keys refused,
/// by name; `weight` defaults to 1 and `throughput_ratio` to 1).
fn demand(i: usize, d: &Bound<'_, PyDict>) -> PyResult<VmDemand> {
    let mut v = VmDemand { weight: 1.0, throughput_ratio: 1.0, ..Default::default() };
    for (k, val) in d.iter() {
        let key: String = k.extract()?;
        let bad = |e: PyErr| value_error(format!("vms[{i}].{key}: {e}"));
        match key.as_str() {
            "weight" => v.weight = val.extract().map_err(bad)?,
            "min_blocks" => v.min_blocks = val.extract().map_err(bad)?,
            "target_blocks" => v.target_blocks = val.extract().map_err(bad)?,
            "used_blocks" => v.used_blocks = val.extract().map_err(bad)?,
            "dirty_blocks" => v.dirty_blocks = val.extract().map_err(bad)?,
            "window_requests" => v.window_requests = val.extract().map_err(bad)?,
            "hit_curve" => v.hit_curve = val.extract().map_err(bad)?,
            "read_curve" => v.read_curve = val.extract().map_err(bad)?,
            "accesses" => v.accesses = val.extract().map_err(bad)?,
            "recs" => v.recs = val.extract().map_err(bad)?,
            "hit_ratio" => v.hit_ratio = val.extract().map_err(bad)?,
            "alloc_unit" => v.alloc_unit = val.extract().map_err(bad)?,
            "backing_busy" => v.backing_busy = val.extract().map_err(bad)?,
            "hit_throughput" => v.hit_throughput = val.extract().map_err(bad)?,
            "throughput_ratio" => v.throughput_ratio = val.extract().map_err(bad)?,
            "write_policy" => {
                let s: Option<String> = val.extract().map_err(bad)?;
                v.write_policy = s
                    .map(|s| s.parse::<WritePolicy>())
                    .transpose()
                    .map_err(|e| value_error(format!("vms[{i}].write_policy: {e}")))?;
            }
            // Names and other columns of a caller's table ride along unread.
            "vm" | "name" => {}
            _ => return Err(value_error(format!("vms[{i}]: unknown key `{key}`"))),
        }
    }
    if v.weight.is_nan() || v.weight <= 0.0 {
        return Err(value_error(format!("vms[{i}].weight {}: must be > 0", v.weight)));
    }
    if v.hit_curve.windows(2).any(|w| w[1] < w[0]) || v.read_curve.windows(2).any(|w| w[1] < w[0]) {
        return Err(value_error(format!("vms[{i}]: hit curves must be non-decreasing")));
    }
    Ok(v)
}

/// Runs allocator `name` (with `params` over its seed's defaults) once on a pool of
/// `capacity` blocks whose curves step by `unit` blocks; returns the decision as JSON
/// (`targets` in blocks per VM, `write_policies`, `uncapped`, `paced_shrinks`).
#[pyfunction]
#[pyo3(signature = (name, capacity, vms, *, unit=1, params=None))]
pub fn allocate(
    name: &str,
    capacity: u64,
    vms: Vec<Bound<'_, PyDict>>,
    unit: u64,
    params: Option<BTreeMap<String, f64>>,
) -> PyResult<String> {
    let mut a = registry::build_with(name, &params.unwrap_or_default()).map_err(value_error)?;
    if unit == 0 {
        return Err(value_error("unit must be at least 1 block"));
    }
    // The allocators work on the pool in steps of `unit` (their tables grow with the steps).
    if capacity / unit > MAX_STEPS {
        return Err(value_error(format!(
            "capacity {capacity} is {} steps of unit {unit}: at most {MAX_STEPS} (use a larger unit)",
            capacity / unit
        )));
    }
    let demands = vms.iter().enumerate().map(|(i, d)| demand(i, d)).collect::<PyResult<Vec<_>>>()?;
    let used: u64 = demands.iter().map(|d| d.used_blocks).sum();
    let pool = Pool { capacity, unit, free_blocks: capacity.saturating_sub(used) };
    serde_json::to_string(&a.allocate(&pool, &demands)).map_err(value_error)
}

/// Solves ELICA's Eq. 4 with `solver` (`exact`, `ilp` or `fast`) for VMs given as
/// `(home node, hit ratio by size in units)` on nodes of `capacity` units each, under
/// `latencies` (`ssd_local_us`, `ssd_remote_us`, `network_us`, `hdd_us`: all four);
/// returns `{local, remote: [[node, units], …] per VM, total_avl}` as JSON, checked
/// against the constraints.
#[pyfunction]
pub fn solve_cluster(
    solver: &str,
    latencies: HashMap<String, f64>,
    capacity: Vec<u64>,
    vms: Vec<(u16, Vec<f64>)>,
) -> PyResult<String> {
    let solver: Solver = serde_json::from_value(serde_json::Value::String(solver.into()))
        .map_err(|_| value_error(format!("solver `{solver}`: expected exact, ilp or fast")))?;
    let lat = |k: &str| latencies.get(k).copied().ok_or_else(|| value_error(format!("latencies: `{k}` missing")));
    let lat = Latencies {
        ssd_local_us: lat("ssd_local_us")?,
        ssd_remote_us: lat("ssd_remote_us")?,
        network_us: lat("network_us")?,
        hdd_us: lat("hdd_us")?,
    };
    if capacity.is_empty() || capacity.len() > MAX_NODES {
        return Err(value_error(format!("capacity: {} nodes, expected 1 to {MAX_NODES}", capacity.len())));
    }
    if let Some((i, c)) = capacity.iter().enumerate().find(|(_, &c)| c > MAX_NODE_UNITS) {
        return Err(value_error(format!("capacity[{i}] = {c} units: at most {MAX_NODE_UNITS} (use a larger unit)")));
    }
    let total: u64 = capacity.iter().sum();
    if solver == Solver::Exact && total > MAX_EXACT_UNITS {
        return Err(value_error(format!(
            "the exact solver is for small clusters: {total} units in all, at most {MAX_EXACT_UNITS} (use fast or ilp)"
        )));
    }
    if let Some(k) =
        latencies.keys().find(|k| !["ssd_local_us", "ssd_remote_us", "network_us", "hdd_us"].contains(&k.as_str()))
    {
        return Err(value_error(format!("latencies: unknown key `{k}`")));
    }
    for (i, (home, curve)) in vms.iter().enumerate() {
        if *home as usize >= capacity.len() {
            return Err(value_error(format!("vms[{i}]: home node {home} of {} nodes", capacity.len())));
        }
        if curve.len() as u64 > MAX_NODE_UNITS * capacity.len() as u64 + 1 {
            return Err(value_error(format!("vms[{i}]: {} points, more than the cluster's units + 1", curve.len())));
        }
        if curve.iter().any(|h| !(0.0..=1.0).contains(h)) {
            return Err(value_error(format!("vms[{i}]: hit ratios must be in [0, 1]")));
        }
    }
    let p =
        Problem { lat, capacity, vms: vms.into_iter().map(|(home, hit_ratio)| VmCurve { home, hit_ratio }).collect() };
    let a = solver.solve(&p).map_err(value_error)?;
    let total = p.check(&a).map_err(|e| value_error(format!("the solver's allocation breaks a constraint: {e}")))?;
    #[derive(Serialize)]
    struct Out {
        local: Vec<u64>,
        remote: Vec<Vec<(u16, u64)>>,
        total_avl: f64,
    }
    serde_json::to_string(&Out { local: a.local, remote: a.remote, total_avl: total }).map_err(value_error)
}
