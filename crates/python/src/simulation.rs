//! Simulations from Python: a scenario (a TOML file, TOML text, or the JSON of a dict)
//! run by the simulator the CLI runs, the result as the CLI's `result.json` text. The
//! GIL is released for the run; an optional progress callback is called with the GIL
//! held at most ten times a second.

use crate::value_error;
use cachevisor_sim::working_set::{fraction, fraction_bytes};
use cachevisor_sim::{Scenario, SimError};
use pyo3::prelude::*;
use std::path::Path;
use std::time::{Duration, Instant};

/// Reads a scenario: `source` says whether `text` is a file path (`file`: relative trace
/// paths inside are relative to the file, as `simulate --scenario` reads it), TOML text
/// (`toml`) or JSON text (`json`, what the Python layer makes of a dict); paths in text
/// are relative to the working directory.
fn load(text: &str, source: &str) -> PyResult<Scenario> {
    match source {
        "file" => Scenario::load(Path::new(text)).map_err(value_error),
        "toml" => toml::from_str(text).map_err(|e| value_error(format!("scenario: {e}"))),
        "json" => serde_json::from_str(text).map_err(|e| value_error(format!("scenario: {e}"))),
        other => Err(value_error(format!("source `{other}`: expected file, toml or json"))),
    }
}

/// A simulator error as a Python exception: a trace that cannot be read is `OSError`,
/// everything else `ValueError` with the simulator's message.
fn sim_error(e: SimError) -> PyErr {
    match e {
        SimError::Trace(t) => crate::trace_error(t),
        other => value_error(other),
    }
}

/// `cache_size` over the scenario's: absolute (`4GiB`) or a fraction of the working set
/// (`0.01`, `5%`), whole blocks as `simulate --cache-size` resolves it.
/// `wss`: the working set when the caller counted it already.
fn set_cache_size(py: Python<'_>, sc: &mut Scenario, size: &str, wss: Option<u64>) -> PyResult<()> {
    let Some(f) = fraction(size).map_err(|e| value_error(format!("cache_size {e}")))? else {
        sc.cache.size = size.to_string();
        return Ok(());
    };
    let block = cachevisor_trace::units::parse_size(&sc.cache.block_size)
        .map_err(|e| value_error(format!("cache.block_size: {e}")))?;
    let ws = match wss {
        Some(w) => w,
        None => py.detach(|| cachevisor_sim::working_set::working_set_bytes(sc, &mut |_| {})).map_err(sim_error)?,
    };
    if ws == 0 {
        return Err(value_error(format!("cache_size {size}: the inputs touch no block (an empty working set)")));
    }
    sc.cache.size = format!("{}B", fraction_bytes(f, ws, block));
    Ok(())
}

/// Calls a Python progress callback `(done, total)` at most every 100 ms; the first
/// exception it raises is kept and raised after the run.
struct Callback {
    f: Option<Py<PyAny>>,
    last: Option<Instant>,
    error: Option<PyErr>,
}

impl Callback {
    fn new(f: Option<Py<PyAny>>) -> Self {
        Callback { f, last: None, error: None }
    }

    fn call(&mut self, done: u64, total: Option<u64>, last: bool) {
        let Some(f) = &self.f else { return };
        if self.error.is_some() || (!last && self.last.is_some_and(|t| t.elapsed() < Duration::from_millis(100))) {
            return;
        }
        self.last = Some(Instant::now());
        if let Err(e) = Python::attach(|py| f.call1(py, (done, total))) {
            self.error = Some(e);
        }
    }

    fn finish<T>(self, r: PyResult<T>) -> PyResult<T> {
        match self.error {
            Some(e) => Err(e),
            None => r,
        }
    }
}

/// Runs a one-host scenario; returns the result as JSON (the CLI's `result.json`).
#[pyfunction]
#[pyo3(signature = (scenario, source, cache_size=None, progress=None))]
pub fn simulate(
    py: Python<'_>,
    scenario: &str,
    source: &str,
    cache_size: Option<String>,
    progress: Option<Py<PyAny>>,
) -> PyResult<String> {
    let mut sc = load(scenario, source)?;
    if let Some(s) = cache_size {
        set_cache_size(py, &mut sc, &s, None)?;
    }
    sc.resolve().map_err(|e| value_error(format!("scenario: {e}")))?;
    let mut cb = Callback::new(progress);
    let r = py.detach(|| {
        let r = cachevisor_sim::simulate(&sc, &mut |p| cb.call(p.done, p.total, false));
        if let Ok(r) = &r {
            cb.call(r.total.requests, Some(r.total.requests), true);
        }
        r
    });
    cb.finish(r.map(|r| r.to_json()).map_err(sim_error))
}

/// Runs a cluster scenario (`[[node]]`); returns the result as JSON (the CLI's
/// `cluster.json`).
#[pyfunction]
#[pyo3(signature = (scenario, source, progress=None))]
pub fn simulate_cluster(py: Python<'_>, scenario: &str, source: &str, progress: Option<Py<PyAny>>) -> PyResult<String> {
    let sc = load(scenario, source)?;
    let mut cb = Callback::new(progress);
    let r = py.detach(|| cachevisor_sim::cluster_sim::simulate_cluster(&sc, &mut |n| cb.call(n, None, false)));
    let r = cb.finish(r.map_err(sim_error))?;
    serde_json::to_string_pretty(&r).map_err(value_error)
}

/// The scenario as JSON with every default filled in (to inspect or change it as a dict).
#[pyfunction]
pub fn scenario_json(scenario: &str, source: &str) -> PyResult<String> {
    serde_json::to_string(&load(scenario, source)?).map_err(value_error)
}

/// The scenario's working set in bytes (its VMs' distinct blocks × the block size) and
/// the requests it replays (up to `replay.max_requests`): `(wss_bytes, requests)`.
#[pyfunction]
pub fn working_set_bytes(py: Python<'_>, scenario: &str, source: &str) -> PyResult<(u64, u64)> {
    let sc = load(scenario, source)?;
    let mut requests = 0;
    let wss =
        py.detach(|| cachevisor_sim::working_set::working_set_bytes(&sc, &mut |n| requests = n)).map_err(sim_error)?;
    Ok((wss, requests))
}

/// The cache a run would have, without running it: `(cache bytes, block size)` after
/// `cache_size` (a fraction resolved against `wss_bytes` when given, else counted).
#[pyfunction]
#[pyo3(signature = (scenario, source, cache_size=None, wss_bytes=None))]
pub fn resolve_cache(
    py: Python<'_>,
    scenario: &str,
    source: &str,
    cache_size: Option<String>,
    wss_bytes: Option<u64>,
) -> PyResult<(u64, u64)> {
    let mut sc = load(scenario, source)?;
    if let Some(s) = cache_size {
        set_cache_size(py, &mut sc, &s, wss_bytes)?;
    }
    let r = sc.resolve().map_err(|e| value_error(format!("scenario: {e}")))?;
    Ok((r.cache.cache_bytes, r.cache.block_size))
}
