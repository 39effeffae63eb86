//! Several traces as one multi-VM stream, merged by timestamp.
//!
//! Each source's local VM ids get global ids in first-seen order; names can be renamed
//! (`old=new`) and are made unique. With `rebase`, every trace starts at time 0, so traces
//! recorded at different dates co-run (the default); otherwise absolute times are kept.

use crate::error::TraceError;
use crate::format::{open_trace, ReadOptions};
use crate::request::{Request, VmId};
use crate::source::{SourceCounts, TraceSource};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::path::PathBuf;

/// How to merge.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct MergeOptions {
    /// Shift each trace so its first request is at time 0.
    pub rebase: bool,
    /// VM renames, `old name → new name`.
    pub rename: HashMap<String, String>,
}

struct Input {
    source: Box<dyn TraceSource>,
    global: Vec<Option<VmId>>,
    origin: Option<u64>,
    pending: Option<Request>,
}

/// A time-ordered merge of several sources.
pub struct MergedTrace {
    inputs: Vec<Input>,
    heap: BinaryHeap<Reverse<(u64, usize)>>,
    names: Vec<String>,
    opts: MergeOptions,
    started: bool,
}

impl MergedTrace {
    /// Opens every path with `read` and merges them.
    pub fn open(paths: &[PathBuf], read: &ReadOptions, opts: MergeOptions) -> Result<Self, TraceError> {
        let sources = paths.iter().map(|p| open_trace(p, read)).collect::<Result<Vec<_>, _>>()?;
        Ok(Self::from_sources(sources, opts))
    }

    /// Merges already-open sources.
    pub fn from_sources(sources: Vec<Box<dyn TraceSource>>, opts: MergeOptions) -> Self {
        let inputs = sources
            .into_iter()
            .map(|source| Input { source, global: Vec::new(), origin: None, pending: None })
            .collect();
        MergedTrace { inputs, heap: BinaryHeap::new(), names: Vec::new(), opts, started: false }
    }

    fn fetch(&mut self, i: usize) -> Result<(), TraceError> {
        let input = &mut self.inputs[i];
        if let Some(mut r) = input.source.next_request()? {
            let origin = *input.origin.get_or_insert(r.time_ns);
            if self.opts.rebase {
                r.time_ns = r.time_ns.saturating_sub(origin);
            }
            input.pending = Some(r);
            self.heap.push(Reverse((r.time_ns, i)));
        }
        Ok(())
    }

    fn global_vm(&mut self, i: usize, local: VmId) -> VmId {
        let input = &mut self.inputs[i];
        if input.global.len() <= local as usize {
            input.global.resize(local as usize + 1, None);
        }
        if let Some(g) = input.global[local as usize] {
            return g;
        }
        let raw = &input.source.vm_names()[local as usize];
        let base = self.opts.rename.get(raw).cloned().unwrap_or_else(|| raw.clone());
        let mut name = base.clone();
        let mut n = 2;
        while self.names.contains(&name) {
            name = format!("{base}#{n}");
            n += 1;
        }
        let g = self.names.len() as VmId;
        self.names.push(name);
        self.inputs[i].global[local as usize] = Some(g);
        g
    }

    /// The next request in time order, with a global VM id.
    pub fn next_request(&mut self) -> Result<Option<Request>, TraceError> {
        if self.inputs.len() == 1 {
            // One input: its own order, no heap (a push and a pop per request cost ~5% of
            // a cache-model simulation).
            let input = &mut self.inputs[0];
            let Some(mut r) = input.source.next_request()? else { return Ok(None) };
            let origin = *input.origin.get_or_insert(r.time_ns);
            if self.opts.rebase {
                r.time_ns = r.time_ns.saturating_sub(origin);
            }
            r.vm = self.global_vm(0, r.vm);
            return Ok(Some(r));
        }
        if !self.started {
            self.started = true;
            for i in 0..self.inputs.len() {
                self.fetch(i)?;
            }
        }
        let Some(Reverse((_, i))) = self.heap.pop() else { return Ok(None) };
        let mut r = self.inputs[i].pending.take().expect("pending request of a heap entry");
        r.vm = self.global_vm(i, r.vm);
        self.fetch(i)?;
        Ok(Some(r))
    }

    /// Global VM names seen so far, by id.
    pub fn vm_names(&self) -> &[String] {
        &self.names
    }

    /// Counters of each input, in the order given.
    pub fn counts(&self) -> Vec<SourceCounts> {
        self.inputs.iter().map(|i| i.source.counts()).collect()
    }
}

/// The merged stream as one source (what a writer takes: `trace convert`, the lab's
/// merged oracleGeneral files); its counts are the inputs' summed, the first bad record
/// the first input's that has one.
impl crate::source::TraceSource for MergedTrace {
    fn next_request(&mut self) -> Result<Option<Request>, TraceError> {
        MergedTrace::next_request(self)
    }

    fn vm_names(&self) -> &[String] {
        MergedTrace::vm_names(self)
    }

    fn counts(&self) -> SourceCounts {
        MergedTrace::counts(self).into_iter().fold(SourceCounts::default(), |a, c| SourceCounts {
            requests: a.requests + c.requests,
            ignored: a.ignored + c.ignored,
            skipped_bad: a.skipped_bad + c.skipped_bad,
            first_bad: a.first_bad.or(c.first_bad),
        })
    }
}

impl Iterator for MergedTrace {
    type Item = Result<Request, TraceError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_request().transpose()
    }
}
