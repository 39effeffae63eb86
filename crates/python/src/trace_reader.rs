//! `TraceReader`: any supported trace format (merged by time when several files are
//! given, exactly as the CLI merges them) read in batches of columns — times, VM ids,
//! ops, offsets, lengths as little-endian bytes the Python layer views as NumPy arrays
//! (`cachevisor.read_trace`, `cachevisor.iter_requests`). Reading releases the GIL.

use crate::read_options::PyReadOptions;
use cachevisor_trace::{MergedTrace, Op};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

/// Per input: file, requests, skipped malformed records, where the first was.
type InputCounts = (String, u64, u64, Option<String>);

/// A merged trace read in column batches.
#[pyclass(module = "cachevisor._native")]
pub struct TraceReader {
    /// In a mutex: a Python class must be shareable between threads (free-threaded
    /// Python); one reader is read by one call at a time.
    trace: Mutex<Option<MergedTrace>>,
    files: Vec<PathBuf>,
    requests: u64,
    /// A malformed record met after a batch's first rows: raised by the next call.
    pending: Option<cachevisor_trace::TraceError>,
}

/// One batch's columns.
#[derive(Default)]
struct Columns {
    time_ns: Vec<u8>,
    vm: Vec<u8>,
    op: Vec<u8>,
    offset: Vec<u8>,
    len: Vec<u8>,
    rows: usize,
}

#[pymethods]
impl TraceReader {
    /// Opens `files` (merged by time; each rebased to start at 0 unless `rebase=False`).
    #[new]
    #[pyo3(signature = (files, *, format=None, vm_mode=None, skip_bad=false, blkparse_action=None, csv_columns=None, rename=None, rebase=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        files: Vec<PathBuf>,
        format: Option<String>,
        vm_mode: Option<String>,
        skip_bad: bool,
        blkparse_action: Option<String>,
        csv_columns: Option<String>,
        rename: Option<HashMap<String, String>>,
        rebase: bool,
    ) -> PyResult<Self> {
        let o = PyReadOptions {
            format,
            vm_mode,
            skip_bad,
            blkparse_action,
            csv_columns,
            rename: rename.unwrap_or_default(),
        };
        let trace = o.open(&files, rebase)?;
        Ok(TraceReader { trace: Mutex::new(Some(trace)), files, requests: 0, pending: None })
    }

    /// Up to `n` next requests as a dict of column bytes (`time_ns` u64, `vm` u32, `op`
    /// u8 — 0 read, 1 write —, `offset` u64, `len` u32, little-endian) and `rows`;
    /// `rows == 0` at the end. A malformed record raises `ValueError` naming its file and
    /// line, after the batches before it.
    fn read_batch<'py>(&mut self, py: Python<'py>, n: usize) -> PyResult<Bound<'py, PyDict>> {
        let n = n.max(1);
        if let Some(e) = self.pending.take() {
            return Err(crate::trace_error(e));
        }
        let mut guard = self.lock()?;
        let trace = guard.as_mut().ok_or_else(|| crate::value_error("the reader is closed"))?;
        let (cols, err) = py.detach(|| {
            let mut c = Columns::default();
            let mut err = None;
            while c.rows < n {
                match trace.next_request() {
                    Ok(Some(r)) => {
                        c.time_ns.extend_from_slice(&r.time_ns.to_le_bytes());
                        c.vm.extend_from_slice(&r.vm.to_le_bytes());
                        c.op.push(u8::from(r.op == Op::Write));
                        c.offset.extend_from_slice(&r.offset.to_le_bytes());
                        c.len.extend_from_slice(&r.len.to_le_bytes());
                        c.rows += 1;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        err = Some(e);
                        break;
                    }
                }
            }
            (c, err)
        });
        drop(guard);
        self.requests += cols.rows as u64;
        // Requests before a malformed record are returned first; the error comes with
        // the next call (the reader stays at the bad record).
        if let Some(e) = err {
            if cols.rows == 0 {
                return Err(crate::trace_error(e));
            }
            self.pending = Some(e);
        }
        let d = PyDict::new(py);
        d.set_item("time_ns", PyBytes::new(py, &cols.time_ns))?;
        d.set_item("vm", PyBytes::new(py, &cols.vm))?;
        d.set_item("op", PyBytes::new(py, &cols.op))?;
        d.set_item("offset", PyBytes::new(py, &cols.offset))?;
        d.set_item("len", PyBytes::new(py, &cols.len))?;
        d.set_item("rows", cols.rows)?;
        Ok(d)
    }

    /// VM names so far, indexed by the `vm` column (complete once the trace is read).
    fn vm_names(&self) -> PyResult<Vec<String>> {
        Ok(self.lock()?.as_ref().map_or_else(Vec::new, |t| t.vm_names().to_vec()))
    }

    /// Requests returned so far.
    #[getter]
    fn requests(&self) -> u64 {
        self.requests
    }

    /// Per input file: `(file, requests, skipped_bad, first_bad)`.
    fn counts(&self) -> PyResult<Vec<InputCounts>> {
        let guard = self.lock()?;
        let Some(t) = guard.as_ref() else { return Ok(Vec::new()) };
        Ok(self
            .files
            .iter()
            .zip(t.counts())
            .map(|(f, c)| (f.display().to_string(), c.requests, c.skipped_bad, c.first_bad.map(|l| l.to_string())))
            .collect())
    }

    /// Closes the files.
    fn close(&mut self) -> PyResult<()> {
        *self.lock()? = None;
        Ok(())
    }
}

impl TraceReader {
    /// The trace, if no other thread is reading it: `read_batch` holds the lock with the
    /// GIL released, so a second thread waiting for it here with the GIL held would
    /// deadlock the two; it gets `RuntimeError` instead.
    fn lock(&self) -> PyResult<MutexGuard<'_, Option<MergedTrace>>> {
        match self.trace.try_lock() {
            Ok(g) => Ok(g),
            // A panic while reading poisons the lock; the trace is still usable or closed.
            Err(std::sync::TryLockError::Poisoned(p)) => Ok(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => {
                Err(PyRuntimeError::new_err("this TraceReader is being read by another thread"))
            }
        }
    }
}
