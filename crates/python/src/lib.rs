//! `cachevisor._native`: the Python package's native module, a thin driver over the same
//! crates the CLI runs (no logic of its own beyond converting arguments). Results cross
//! as JSON text (the CLI's own serialization, so a Python run and a CLI run of one
//! scenario give identical JSON) or as little-endian column bytes (trace batches, read by
//! NumPy without a copy per element); the Python layer (`python/cachevisor/`) turns them
//! into DataFrames and arrays. Long calls release the GIL.

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;

mod curves;
mod read_options;
mod simulation;
mod trace_reader;

/// A bad argument, scenario or trace: `ValueError` with the message that names it.
pub(crate) fn value_error(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// A trace error: `OSError` when the file could not be read, else `ValueError` (a
/// malformed record, named by file and line).
pub(crate) fn trace_error(e: cachevisor_trace::TraceError) -> PyErr {
    match e {
        cachevisor_trace::TraceError::Io { .. } => PyOSError::new_err(e.to_string()),
        other => PyValueError::new_err(other.to_string()),
    }
}

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(simulation::simulate, m)?)?;
    m.add_function(wrap_pyfunction!(simulation::simulate_cluster, m)?)?;
    m.add_function(wrap_pyfunction!(simulation::scenario_json, m)?)?;
    m.add_function(wrap_pyfunction!(simulation::working_set_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(simulation::resolve_cache, m)?)?;
    m.add_function(wrap_pyfunction!(curves::mrc, m)?)?;
    m.add_function(wrap_pyfunction!(curves::allocate, m)?)?;
    m.add_function(wrap_pyfunction!(curves::allocators, m)?)?;
    m.add_function(wrap_pyfunction!(curves::solve_cluster, m)?)?;
    m.add_class::<trace_reader::TraceReader>()?;
    Ok(())
}
