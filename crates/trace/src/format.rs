//! The registry of trace formats: names, detection from content, and one place that opens
//! a reader or a writer for any of them.

use crate::error::TraceError;
use crate::formats::blkparse::{write_blkparse, BlkparseParser};
use crate::formats::cloudphysics_csv::{self, write_cloudphysics, CloudPhysicsParser};
use crate::formats::generic_csv::{self, write_canonical, CsvColumns, GenericCsvParser};
use crate::formats::mqsim::{write_mqsim, MqsimParser};
use crate::formats::msr::{write_msr, MsrParser};
use crate::formats::oracle_general::{OracleGeneralParser, OracleGeneralWriter};
use crate::formats::vscsi::{write_vscsi_v1, VscsiParser, VscsiVersion};
use crate::input::{open_decompressed, peek, trace_stem};
use crate::request::Request;
use crate::source::{RecordReader, TextReader, TraceSource};
use crate::vm_table::{VmMode, VmTable};
use std::fmt;
use std::io::{self, Write};
use std::path::Path;
use std::str::FromStr;

/// Every trace format cachevisor reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// MSR Cambridge CSV.
    Msr,
    /// blkparse default text output.
    Blkparse,
    /// CloudPhysics VSCSI binary (v1 or v2; v1 when writing).
    Vscsi,
    /// CloudPhysics CSV (`version,time,op,size,lbn`).
    CloudphysicsCsv,
    /// MQSim ASCII.
    Mqsim,
    /// libCacheSim oracleGeneral binary.
    OracleGeneral,
    /// Generic CSV with a column mapping (default: canonical `time_ns,vm,op,offset,len`).
    Csv,
}

impl Format {
    /// All formats, in the order help texts list them.
    pub const ALL: [Format; 7] = [
        Format::Msr,
        Format::Blkparse,
        Format::Vscsi,
        Format::CloudphysicsCsv,
        Format::Mqsim,
        Format::OracleGeneral,
        Format::Csv,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Format::Msr => "msr",
            Format::Blkparse => "blkparse",
            Format::Vscsi => "vscsi",
            Format::CloudphysicsCsv => "cloudphysics-csv",
            Format::Mqsim => "mqsim",
            Format::OracleGeneral => "oracle-general",
            Format::Csv => "csv",
        }
    }

    /// Guesses the format of `path` from its name and first decompressed bytes.
    pub fn detect(path: &Path) -> Result<Format, TraceError> {
        let name = path.file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default();
        if name.contains("oraclegeneral") {
            return Ok(Format::OracleGeneral);
        }
        let head = peek(path, 4096)?;
        let binary = head.iter().take(512).any(|&b| b == 0);
        if binary {
            if VscsiVersion::detect(&head).is_some() {
                return Ok(Format::Vscsi);
            }
            if crate::formats::oracle_general::looks_like(&head) {
                return Ok(Format::OracleGeneral);
            }
            return Err(TraceError::Usage(format!(
                "{}: binary file that is neither VSCSI nor oracleGeneral; pass --format",
                path.display()
            )));
        }
        let text = String::from_utf8_lossy(&head);
        let line = text.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with('#')).unwrap_or("");
        let comma: Vec<&str> = line.split(',').collect();
        let ws: Vec<&str> = line.split_whitespace().collect();
        let format = if line == cloudphysics_csv::HEADER {
            Some(Format::CloudphysicsCsv)
        } else if line.starts_with(generic_csv::CANONICAL_HEADER) {
            Some(Format::Csv)
        } else if comma.len() == 7
            && (comma[0] == "Timestamp"
                || comma[3].eq_ignore_ascii_case("read")
                || comma[3].eq_ignore_ascii_case("write"))
        {
            Some(Format::Msr)
        } else if ws.len() >= 7
            && ws[0].split_once(',').is_some_and(|(a, b)| a.parse::<u32>().is_ok() && b.parse::<u32>().is_ok())
        {
            Some(Format::Blkparse)
        } else if ws.len() == 5 && ws.iter().all(|f| f.parse::<u64>().is_ok()) {
            Some(Format::Mqsim)
        } else {
            None
        };
        format.ok_or_else(|| {
            TraceError::Usage(format!(
                "{}: cannot tell the trace format from its first line `{}`; pass --format ({})",
                path.display(),
                &line[..line.len().min(60)],
                Format::ALL.map(Format::name).join(", ")
            ))
        })
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Format::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| format!("unknown trace format `{s}` (one of {})", Format::ALL.map(Format::name).join(", ")))
    }
}

/// How to read a trace file.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReadOptions {
    /// Format, or `None` to detect it.
    pub format: Option<Format>,
    /// One VM per file or per device key.
    pub vm_mode: VmMode,
    /// Skip (and count) malformed records instead of stopping.
    pub skip_bad: bool,
    /// blkparse action to keep.
    pub blkparse_action: String,
    /// Column mapping for `csv` (`None`: canonical columns).
    pub csv_columns: Option<CsvColumns>,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            format: None,
            vm_mode: VmMode::Device,
            skip_bad: false,
            blkparse_action: "D".into(),
            csv_columns: None,
        }
    }
}

/// Opens one trace file as a stream of requests.
pub fn open_trace(path: &Path, opts: &ReadOptions) -> Result<Box<dyn TraceSource>, TraceError> {
    let format = match (opts.format, &opts.csv_columns) {
        (Some(f), _) => f,
        (None, Some(_)) => Format::Csv,
        (None, None) => Format::detect(path)?,
    };
    let file = path.display().to_string();
    let stem = trace_stem(path);
    let (input, _) = open_decompressed(path)?;
    let vms = |prefix| VmTable::new(opts.vm_mode, &stem, prefix);
    let skip = opts.skip_bad;
    Ok(match format {
        Format::Msr => Box::new(TextReader::new(input, file, MsrParser::default(), vms(false), skip)),
        Format::Blkparse => {
            Box::new(TextReader::new(input, file, BlkparseParser::new(&opts.blkparse_action), vms(true), skip))
        }
        Format::CloudphysicsCsv => Box::new(TextReader::new(input, file, CloudPhysicsParser, vms(true), skip)),
        Format::Mqsim => Box::new(TextReader::new(input, file, MqsimParser, vms(true), skip)),
        Format::Csv => {
            let cols = opts.csv_columns.clone().unwrap_or_default();
            let prefix = opts.csv_columns.is_some();
            Box::new(TextReader::new(input, file, GenericCsvParser::new(cols), vms(prefix), skip))
        }
        Format::Vscsi => {
            let head = peek(path, 64)?;
            let version = VscsiVersion::detect(&head)
                .ok_or_else(|| TraceError::Usage(format!("{file}: first record has neither VSCSI v1 nor v2 layout")))?;
            Box::new(RecordReader::new(input, file, VscsiParser::new(version), vms(true), skip))
        }
        Format::OracleGeneral => Box::new(RecordReader::new(input, file, OracleGeneralParser, vms(true), skip)),
    })
}

/// Writes requests in any format.
pub struct TraceWriter {
    format: Format,
    out: Box<dyn Write + Send>,
    seq: u64,
    oracle: Option<OracleGeneralWriter>,
}

impl TraceWriter {
    /// A writer of `format` to `out`; `block` is the object size for oracleGeneral.
    pub fn new(format: Format, mut out: Box<dyn Write + Send>, block: u64) -> io::Result<Self> {
        match format {
            Format::CloudphysicsCsv => writeln!(out, "{}", cloudphysics_csv::HEADER)?,
            Format::Csv => writeln!(out, "{}", generic_csv::CANONICAL_HEADER)?,
            _ => {}
        }
        let oracle = (format == Format::OracleGeneral).then(|| OracleGeneralWriter::new(block));
        Ok(TraceWriter { format, out, seq: 0, oracle })
    }

    /// Writes one request; `vm_name` is its VM's name.
    pub fn write(&mut self, req: &Request, vm_name: &str) -> io::Result<()> {
        self.seq += 1;
        let w = &mut *self.out;
        match self.format {
            Format::Msr => write_msr(w, req, vm_name),
            Format::Blkparse => write_blkparse(w, req, self.seq),
            Format::Vscsi => write_vscsi_v1(w, req, self.seq),
            Format::CloudphysicsCsv => write_cloudphysics(w, req),
            Format::Mqsim => write_mqsim(w, req),
            Format::Csv => write_canonical(w, req, vm_name),
            Format::OracleGeneral => {
                self.oracle.as_mut().expect("oracle writer").push(req);
                Ok(())
            }
        }
    }

    /// Pushes buffered records to the output (not for oracleGeneral, which is written
    /// whole by `finish`).
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Writes anything buffered and flushes.
    pub fn finish(mut self) -> io::Result<()> {
        if let Some(o) = self.oracle.take() {
            o.finish(&mut *self.out)?;
        }
        self.out.flush()
    }
}
