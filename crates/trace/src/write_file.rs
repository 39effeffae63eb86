//! Writing a whole trace source into a new file, in any format [`TraceWriter`] writes,
//! through a large buffer: `trace convert`, `trace generate`, the lab's benches and the
//! tests that need a trace on disk (a Zipf file for the simulator) all write with it.

use crate::{Format, TraceError, TraceSource, TraceWriter};
use std::io::BufWriter;
use std::path::Path;

/// A writer of `to` records with block size `block` into a new file `output`.
pub fn writer(to: Format, output: &Path, block: u64) -> Result<TraceWriter, TraceError> {
    let io = |source| TraceError::Io { file: output.display().to_string(), source };
    let f = std::fs::File::create(output).map_err(io)?;
    TraceWriter::new(to, Box::new(BufWriter::with_capacity(1 << 20, f)), block).map_err(io)
}

/// Writes every request of `src` into a new file `output`; returns the request count.
pub fn write_source(src: &mut dyn TraceSource, to: Format, output: &Path, block: u64) -> Result<u64, TraceError> {
    let io = |source| TraceError::Io { file: output.display().to_string(), source };
    let mut w = writer(to, output, block)?;
    let mut n = 0;
    while let Some(r) = src.next_request()? {
        w.write(&r, &src.vm_names()[r.vm as usize]).map_err(io)?;
        n += 1;
    }
    w.finish().map_err(io)?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_written_reads_back_and_a_bad_path_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("z.oracleGeneral");
        let mut src = crate::zipf::ZipfSource::new(100, 10, 1.0, 4096, 1).unwrap();
        assert_eq!(write_source(&mut src, Format::OracleGeneral, &path, 4096).unwrap(), 100);
        let mut back = crate::open_trace(&path, &crate::ReadOptions::default()).unwrap();
        let mut n = 0;
        while back.next_request().unwrap().is_some() {
            n += 1;
        }
        assert_eq!(n, 100);
        let bad = dir.path().join("no/such/dir/t.csv");
        let e = write_source(&mut src, Format::Csv, &bad, 4096).unwrap_err().to_string();
        assert!(e.contains("no/such/dir/t.csv"), "{e}");
    }
}
