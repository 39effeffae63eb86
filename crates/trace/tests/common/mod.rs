//! Helpers shared by this crate's integration tests.
#![allow(dead_code, missing_docs)]

use cachevisor_trace::{open_trace, ReadOptions, Request, TraceError, TraceSource};
use std::path::PathBuf;

/// A file of the shared sample traces.
pub fn shared_trace(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces").join(name)
}

/// Reads a whole source.
pub fn read_all(s: &mut dyn TraceSource) -> Result<Vec<Request>, TraceError> {
    let mut v = Vec::new();
    while let Some(r) = s.next_request()? {
        v.push(r);
    }
    Ok(v)
}

/// Writes `text` to a temp file named `name` and reads it with `opts`.
pub fn read_text(name: &str, text: &[u8], opts: &ReadOptions) -> (Result<Vec<Request>, TraceError>, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    let mut s = open_trace(&p, opts).unwrap();
    let r = read_all(&mut *s);
    (r, s.vm_names().to_vec())
}
