//! One VM whose workload changes over time: several sources played one after another,
//! each from its own start time, as a single VM named after the first. A source stops
//! where the next one starts (a working-set change, SymFlex §5.2's fourth window).

use crate::error::TraceError;
use crate::request::Request;
use crate::source::{SourceCounts, TraceSource};

/// Sources in sequence: (source, start time in ns).
pub struct Chained {
    parts: Vec<(Box<dyn TraceSource>, u64)>,
    at: usize,
    names: Vec<String>,
    requests: u64,
}

impl Chained {
    /// `parts` in order of start time; the first starts at its own time 0.
    pub fn new(parts: Vec<(Box<dyn TraceSource>, u64)>) -> Self {
        let names = parts.first().map(|p| p.0.vm_names().first().cloned().unwrap_or_default()).into_iter().collect();
        Chained { parts, at: 0, names, requests: 0 }
    }
}

impl TraceSource for Chained {
    fn next_request(&mut self) -> Result<Option<Request>, TraceError> {
        while self.at < self.parts.len() {
            let end = self.parts.get(self.at + 1).map_or(u64::MAX, |p| p.1);
            let (src, start) = &mut self.parts[self.at];
            if let Some(mut r) = src.next_request()? {
                r.time_ns += *start;
                if r.time_ns < end {
                    r.vm = 0;
                    self.requests += 1;
                    return Ok(Some(r));
                }
            }
            self.at += 1;
        }
        Ok(None)
    }

    fn vm_names(&self) -> &[String] {
        &self.names
    }

    fn counts(&self) -> SourceCounts {
        SourceCounts { requests: self.requests, ..SourceCounts::default() }
    }
}
