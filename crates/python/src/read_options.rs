//! How Python callers say how to read traces: the keyword arguments the CLI's trace
//! flags have (`--format`, `--vm-mode`, `--skip-bad`, `--blkparse-action`,
//! `--csv-columns`, `--rename`), checked the same way, into the trace crate's options.

use crate::value_error;
use cachevisor_trace::formats::generic_csv::CsvColumns;
use cachevisor_trace::{Format, MergeOptions, MergedTrace, ReadOptions, VmMode};
use pyo3::prelude::*;
use std::collections::HashMap;
use std::path::PathBuf;

/// Trace-reading options as Python passes them.
#[derive(Debug, Clone, Default)]
pub struct PyReadOptions {
    pub format: Option<String>,
    pub vm_mode: Option<String>,
    pub skip_bad: bool,
    pub blkparse_action: Option<String>,
    pub csv_columns: Option<String>,
    pub rename: HashMap<String, String>,
}

impl PyReadOptions {
    /// The trace crate's reader options; errors name the argument.
    pub fn read_options(&self) -> PyResult<ReadOptions> {
        let mut o = ReadOptions::default();
        if let Some(f) = &self.format {
            o.format = Some(f.parse::<Format>().map_err(|e| value_error(format!("format: {e}")))?);
        }
        o.vm_mode = match self.vm_mode.as_deref() {
            None | Some("file") => VmMode::File,
            Some("device") => VmMode::Device,
            Some(other) => return Err(value_error(format!("vm_mode `{other}`: expected `file` or `device`"))),
        };
        o.skip_bad = self.skip_bad;
        if let Some(a) = &self.blkparse_action {
            o.blkparse_action = a.clone();
        }
        if let Some(c) = &self.csv_columns {
            o.csv_columns = Some(c.parse::<CsvColumns>().map_err(|e| value_error(format!("csv_columns: {e}")))?);
        }
        Ok(o)
    }

    /// Opens and merges `files` (each starting at time 0 when `rebase`).
    pub fn open(&self, files: &[PathBuf], rebase: bool) -> PyResult<MergedTrace> {
        if files.is_empty() {
            return Err(value_error("no trace files given"));
        }
        let opts = MergeOptions { rebase, rename: self.rename.clone() };
        MergedTrace::open(files, &self.read_options()?, opts).map_err(crate::trace_error)
    }
}
