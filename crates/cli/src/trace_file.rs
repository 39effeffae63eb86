//! Writing a trace file in any format the trace crate writes: the file created with a
//! large buffer, and a whole source written through it. `trace convert` and `trace
//! generate` write with it, and so do the lab's benches (the Zipf file `bench sim`
//! hands to `cachesim`).

use anyhow::Context;
use cachevisor_trace::{Format, TraceSource, TraceWriter};
use std::io::BufWriter;
use std::path::Path;

/// A writer of `to` records with block size `block` into a new file `output`.
pub fn writer(to: Format, output: &Path, block: u64) -> anyhow::Result<TraceWriter> {
    let f = std::fs::File::create(output).with_context(|| format!("creating {}", output.display()))?;
    Ok(TraceWriter::new(to, Box::new(BufWriter::with_capacity(1 << 20, f)), block)?)
}

/// Writes a whole source to a file; returns the request count.
pub fn write_source(src: &mut dyn TraceSource, to: Format, output: &Path, block: u64) -> anyhow::Result<u64> {
    let mut w = writer(to, output, block)?;
    let mut n = 0;
    while let Some(r) = src.next_request()? {
        w.write(&r, &src.vm_names()[r.vm as usize])?;
        n += 1;
    }
    w.finish()?;
    Ok(n)
}
