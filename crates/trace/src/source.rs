//! The streaming interface every reader implements, and the two generic readers (line
//! based text, fixed-size binary records) that own the loop, error locations and
//! `--skip-bad` accounting so each format file only parses one record.

use crate::error::{FieldError, Location, TraceError};
use crate::request::Request;
use crate::vm_table::VmTable;
use std::io::{BufRead, Read};

/// What a source has seen so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SourceCounts {
    /// Requests emitted.
    pub requests: u64,
    /// Records that carry no request by design (headers, other blkparse actions,
    /// non-read/write SCSI commands, zero-length requests).
    pub ignored: u64,
    /// Malformed records skipped under `--skip-bad`.
    pub skipped_bad: u64,
    /// Where the first skipped record was, for the report.
    pub first_bad: Option<Location>,
}

/// A stream of requests with constant memory.
pub trait TraceSource: Send {
    /// The next request, `Ok(None)` at the end.
    fn next_request(&mut self) -> Result<Option<Request>, TraceError>;
    /// Names of this source's VMs, indexed by the `vm` field of its requests.
    fn vm_names(&self) -> &[String];
    /// Counters so far.
    fn counts(&self) -> SourceCounts;

    /// Appends up to `max` requests to `out`; returns how many (0 only at the end).
    /// Readers override it to amortize per-record overhead; the result is the same as
    /// calling [`next_request`](Self::next_request) that many times.
    fn next_batch(&mut self, out: &mut Vec<Request>, max: usize) -> Result<usize, TraceError> {
        let mut n = 0;
        while n < max {
            match self.next_request()? {
                Some(r) => out.push(r),
                None => break,
            }
            n += 1;
        }
        Ok(n)
    }
}

/// Parses one line of a text format.
pub trait LineParser: Send {
    /// `Ok(None)` when the line carries no request by design (it is counted as ignored).
    fn parse(&mut self, line: &[u8], vms: &mut VmTable) -> Result<Option<Request>, FieldError>;
}

/// Parses one fixed-size record of a binary format.
pub trait RecordParser: Send {
    /// Bytes per record.
    fn record_len(&self) -> usize;
    /// `Ok(None)` when the record carries no request by design.
    fn parse(&mut self, rec: &[u8], vms: &mut VmTable) -> Result<Option<Request>, FieldError>;
}

/// Shared bookkeeping of the two generic readers.
struct Common {
    file: String,
    skip_bad: bool,
    vms: VmTable,
    counts: SourceCounts,
}

impl Common {
    /// Applies the outcome of one record; `Ok(Some)` to emit, `Ok(None)` to continue.
    /// A request whose byte range passes 2^64 is malformed (its end would wrap).
    fn settle(&mut self, r: Result<Option<Request>, FieldError>, at: Location) -> Result<Option<Request>, TraceError> {
        let r = match r {
            Ok(Some(req)) if req.offset.checked_add(req.len as u64).is_none() => Err(FieldError::new(
                "offset",
                format!("{} bytes at offset {} reach past the largest byte address (2^64)", req.len, req.offset),
            )),
            r => r,
        };
        match r {
            Ok(Some(req)) if req.len > 0 => {
                self.counts.requests += 1;
                Ok(Some(req))
            }
            Ok(_) => {
                self.counts.ignored += 1;
                Ok(None)
            }
            Err(e) if self.skip_bad => {
                self.counts.skipped_bad += 1;
                self.counts.first_bad.get_or_insert(at);
                let _ = e;
                Ok(None)
            }
            Err(e) => Err(TraceError::Malformed { file: self.file.clone(), at, field: e.field, msg: e.msg }),
        }
    }
}

/// A line-oriented text trace.
pub struct TextReader<P> {
    input: Box<dyn BufRead + Send>,
    parser: P,
    line: Vec<u8>,
    line_no: u64,
    common: Common,
}

impl<P: LineParser> TextReader<P> {
    /// Reads `input` (already decompressed) named `file` with `parser`.
    pub fn new(input: Box<dyn BufRead + Send>, file: String, parser: P, vms: VmTable, skip_bad: bool) -> Self {
        TextReader {
            input,
            parser,
            line: Vec::with_capacity(256),
            line_no: 0,
            common: Common { file, skip_bad, vms, counts: SourceCounts::default() },
        }
    }
}

impl<P: LineParser> TraceSource for TextReader<P> {
    fn next_request(&mut self) -> Result<Option<Request>, TraceError> {
        loop {
            self.line.clear();
            let n = self
                .input
                .read_until(b'\n', &mut self.line)
                .map_err(|source| TraceError::Io { file: self.common.file.clone(), source })?;
            if n == 0 {
                return Ok(None);
            }
            self.line_no += 1;
            let mut line = self.line.as_slice();
            while let [rest @ .., b'\n' | b'\r'] = line {
                line = rest;
            }
            if line.is_empty() || line[0] == b'#' {
                continue;
            }
            let r = self.parser.parse(line, &mut self.common.vms);
            if let Some(req) = self.common.settle(r, Location::Line(self.line_no))? {
                return Ok(Some(req));
            }
        }
    }

    fn vm_names(&self) -> &[String] {
        self.common.vms.names()
    }

    fn counts(&self) -> SourceCounts {
        self.common.counts
    }
}

/// A binary trace of fixed-size records.
pub struct RecordReader<P> {
    input: Box<dyn BufRead + Send>,
    parser: P,
    rec: Vec<u8>,
    index: u64,
    common: Common,
}

impl<P: RecordParser> RecordReader<P> {
    /// Reads `input` (already decompressed) named `file` with `parser`.
    pub fn new(input: Box<dyn BufRead + Send>, file: String, parser: P, vms: VmTable, skip_bad: bool) -> Self {
        let rec = vec![0; parser.record_len()];
        RecordReader {
            input,
            parser,
            rec,
            index: 0,
            common: Common { file, skip_bad, vms, counts: SourceCounts::default() },
        }
    }
}

impl<P: RecordParser> TraceSource for RecordReader<P> {
    fn next_batch(&mut self, out: &mut Vec<Request>, max: usize) -> Result<usize, TraceError> {
        let len = self.rec.len();
        let start = out.len();
        while out.len() - start < max {
            let buf =
                self.input.fill_buf().map_err(|source| TraceError::Io { file: self.common.file.clone(), source })?;
            let whole = (buf.len() / len).min(max - (out.len() - start));
            if whole == 0 {
                // A record straddles the buffer's end, or the input ended.
                match self.next_request()? {
                    Some(r) => {
                        out.push(r);
                        continue;
                    }
                    None => break,
                }
            }
            for rec in buf[..whole * len].chunks_exact(len) {
                let at = Location::Record { offset: self.index * len as u64, index: self.index };
                self.index += 1;
                let r = self.parser.parse(rec, &mut self.common.vms);
                if let Some(req) = self.common.settle(r, at)? {
                    out.push(req);
                }
            }
            self.input.consume(whole * len);
        }
        Ok(out.len() - start)
    }

    fn next_request(&mut self) -> Result<Option<Request>, TraceError> {
        let len = self.rec.len();
        loop {
            let offset = self.index * len as u64;
            let at = Location::Record { offset, index: self.index };
            // Parse straight from the reader's buffer when a whole record is there; copy
            // only records that straddle buffer refills (or short decompressor reads).
            let buf =
                self.input.fill_buf().map_err(|source| TraceError::Io { file: self.common.file.clone(), source })?;
            if buf.len() >= len {
                let r = self.parser.parse(&buf[..len], &mut self.common.vms);
                self.input.consume(len);
                self.index += 1;
                if let Some(req) = self.common.settle(r, at)? {
                    return Ok(Some(req));
                }
                continue;
            }
            let mut got = 0;
            while got < len {
                let n = self
                    .input
                    .read(&mut self.rec[got..])
                    .map_err(|source| TraceError::Io { file: self.common.file.clone(), source })?;
                if n == 0 {
                    break;
                }
                got += n;
            }
            if got == 0 {
                return Ok(None);
            }
            self.index += 1;
            if got < len {
                let e = FieldError::new("record", format!("truncated: {got} of {len} bytes at end of file"));
                self.common.settle(Err(e), at)?;
                return Ok(None);
            }
            let r = self.parser.parse(&self.rec, &mut self.common.vms);
            if let Some(req) = self.common.settle(r, at)? {
                return Ok(Some(req));
            }
        }
    }

    fn vm_names(&self) -> &[String] {
        self.common.vms.names()
    }

    fn counts(&self) -> SourceCounts {
        self.common.counts
    }
}

/// Adapts a source into an iterator of results.
pub struct Requests<S>(pub S);

impl<S: TraceSource> Iterator for Requests<S> {
    type Item = Result<Request, TraceError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.0.next_request().transpose()
    }
}
