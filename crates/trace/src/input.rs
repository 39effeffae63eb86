//! Opening trace files: transparent `.gz` / `.zst` decompression (detected by magic bytes,
//! not by file name) behind one buffered reader.

use crate::error::TraceError;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
const BUF: usize = 1 << 20;

/// Compression detected on an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Plain bytes.
    None,
    /// gzip (RFC 1952), possibly multi-member.
    Gzip,
    /// Zstandard frame(s).
    Zstd,
}

/// Opens `path`, sniffs its first bytes and returns a buffered reader of the decompressed
/// content.
pub fn open_decompressed(path: &Path) -> Result<(Box<dyn BufRead + Send>, Compression), TraceError> {
    let io = |source| TraceError::Io { file: path.display().to_string(), source };
    let mut raw = BufReader::with_capacity(BUF, File::open(path).map_err(io)?);
    let head = raw.fill_buf().map_err(io)?;
    let kind = if head.starts_with(&GZIP_MAGIC) {
        Compression::Gzip
    } else if head.starts_with(&ZSTD_MAGIC) {
        Compression::Zstd
    } else {
        Compression::None
    };
    let reader: Box<dyn BufRead + Send> = match kind {
        Compression::None => Box::new(raw),
        Compression::Gzip => Box::new(BufReader::with_capacity(BUF, flate2::bufread::MultiGzDecoder::new(raw))),
        Compression::Zstd => {
            let dec = zstd::stream::read::Decoder::with_buffer(raw).map_err(io)?;
            Box::new(BufReader::with_capacity(BUF, dec))
        }
    };
    Ok((reader, kind))
}

/// Reads up to `n` leading decompressed bytes of a file (for format detection).
pub fn peek(path: &Path, n: usize) -> Result<Vec<u8>, TraceError> {
    let (r, _) = open_decompressed(path)?;
    let mut buf = Vec::with_capacity(n);
    r.take(n as u64)
        .read_to_end(&mut buf)
        .map_err(|source| TraceError::Io { file: path.display().to_string(), source })?;
    Ok(buf)
}

/// The file name without directories and without trace/compression extensions, used as
/// the default VM name (`/x/websearch-small.mqsim.txt.gz` → `websearch-small`).
pub fn trace_stem(path: &Path) -> String {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut stem = name.as_str();
    for ext in [".gz", ".zst", ".txt", ".csv", ".mqsim", ".vscsi", ".blkparse", ".msr", ".oracleGeneral", ".bin"] {
        if let Some(s) = stem.strip_suffix(ext) {
            stem = s;
        }
    }
    if stem.is_empty() {
        name
    } else {
        stem.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stems() {
        assert_eq!(trace_stem(Path::new("/a/websearch-small.mqsim.txt")), "websearch-small");
        assert_eq!(trace_stem(Path::new("x.csv.gz")), "x");
        assert_eq!(trace_stem(Path::new("cloudPhysicsIO.vscsi")), "cloudPhysicsIO");
    }
}
