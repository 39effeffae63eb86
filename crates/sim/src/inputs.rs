//! A scenario's inputs as one merged request stream: trace files (any format the trace
//! crate reads), synthetic generators (chained phases), VM renames; in the DSF object
//! model, each request's metadata-object lookups instead (`dsf_objects.rs`).

use cachevisor_trace::chain::Chained;
use cachevisor_trace::formats::generic_csv::CsvColumns;
use cachevisor_trace::generator::{Generator, WorkloadConfig};
use cachevisor_trace::units::parse_duration_ns;
use cachevisor_trace::{open_trace, MergeOptions, MergedTrace, ReadOptions, TraceSource, VmMode};
use std::collections::HashMap;

use crate::dsf_objects::{self, DsfObjects};
use crate::scenario::{ObjectModel, Scenario};
use cachevisor_trace::{Request, SourceCounts, TraceError};

/// A failed simulation: bad scenario or bad trace.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The scenario is invalid.
    #[error("scenario: {0}")]
    Scenario(String),
    /// A trace could not be read.
    #[error(transparent)]
    Trace(#[from] cachevisor_trace::TraceError),
    /// A trace request lies outside what the cache can address (`Engine::check_range`):
    /// its blocks would alias another VM's.
    #[error("request {index} of the merged trace (vm `{vm}`): {why}")]
    OutOfRange {
        /// 1-based position in the merged request stream.
        index: u64,
        /// The VM's name.
        vm: String,
        /// What is wrong.
        why: cachevisor_engine::RangeError,
    },
}

/// A scenario's request stream.
pub struct Inputs {
    merged: MergedTrace,
    /// The DSF object model's lookups, when the cache holds objects.
    dsf: Option<DsfObjects>,
    /// Object VM names (`hm3`, then the vDisks').
    names: Vec<String>,
}

impl Inputs {
    /// The next request (or object lookup), in time order.
    pub fn next_request(&mut self) -> Result<Option<Request>, TraceError> {
        let Some(d) = self.dsf.as_mut() else { return self.merged.next_request() };
        loop {
            if let Some(r) = d.next_lookup() {
                return Ok(Some(r));
            }
            let Some(r) = self.merged.next_request()? else { return Ok(None) };
            if self.names.len() != self.merged.vm_names().len() + 1 {
                self.names = dsf_objects::names(self.merged.vm_names());
            }
            d.expand(&r);
        }
    }

    /// VM names by id, as far as seen.
    pub fn vm_names(&self) -> &[String] {
        if self.dsf.is_some() {
            &self.names
        } else {
            self.merged.vm_names()
        }
    }

    /// Per-input counts (requests of the VMs, not object lookups).
    pub fn counts(&self) -> Vec<SourceCounts> {
        self.merged.counts()
    }
}

/// Opens every input of a scenario as one merged stream.
pub fn open_inputs(sc: &Scenario) -> Result<Inputs, SimError> {
    let t = &sc.trace;
    let read = ReadOptions {
        format: t.format,
        vm_mode: t.vm_mode.unwrap_or(VmMode::File),
        skip_bad: t.skip_bad,
        blkparse_action: t.blkparse_action.clone().unwrap_or_else(|| "D".into()),
        csv_columns: t.csv_columns.as_ref().map(|c| c.parse::<CsvColumns>()).transpose().map_err(SimError::Scenario)?,
    };
    let mut sources: Vec<Box<dyn TraceSource>> = Vec::new();
    for f in &t.files {
        sources.push(open_trace(f, &read)?);
    }
    let generator = |path: &std::path::Path| -> Result<Generator, SimError> {
        let text = std::fs::read_to_string(path).map_err(|e| SimError::Scenario(format!("{}: {e}", path.display())))?;
        let cfg = WorkloadConfig::from_yaml(&text, &path.display().to_string())?;
        let w = cfg.validate().map_err(|e| SimError::Scenario(format!("{}: {e}", path.display())))?;
        Ok(Generator::new(w))
    };
    for s in &sc.synthetic {
        if s.then.is_empty() {
            sources.push(Box::new(generator(&s.config)?));
            continue;
        }
        let mut parts: Vec<(Box<dyn TraceSource>, u64)> = vec![(Box::new(generator(&s.config)?), 0)];
        for c in &s.then {
            let at = parse_duration_ns(&c.at).map_err(|e| SimError::Scenario(format!("synthetic.then.at: {e}")))?;
            parts.push((Box::new(generator(&c.config)?), at));
        }
        sources.push(Box::new(Chained::new(parts)));
    }
    let rename: HashMap<String, String> = t.rename.clone().into_iter().collect();
    let merged = MergedTrace::from_sources(sources, MergeOptions { rebase: true, rename });
    let dsf = (sc.cache.objects == ObjectModel::NutanixDsf).then(DsfObjects::default);
    Ok(Inputs { merged, dsf, names: Vec::new() })
}
