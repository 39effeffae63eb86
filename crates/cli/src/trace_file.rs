//! Writing a trace file in any format the trace crate writes (`cachevisor_trace::write_file`),
//! with `anyhow` errors: `trace convert` and `trace generate` write with it, and so do the
//! lab's benches (the Zipf file `bench sim` hands to `cachesim`).

use cachevisor_trace::{Format, TraceSource, TraceWriter};
use std::path::Path;

/// A writer of `to` records with block size `block` into a new file `output`.
pub fn writer(to: Format, output: &Path, block: u64) -> anyhow::Result<TraceWriter> {
    Ok(cachevisor_trace::write_file::writer(to, output, block)?)
}

/// Writes a whole source to a file; returns the request count.
pub fn write_source(src: &mut dyn TraceSource, to: Format, output: &Path, block: u64) -> anyhow::Result<u64> {
    Ok(cachevisor_trace::write_file::write_source(src, to, output, block)?)
}
