//! Command-line options shared by every command that reads traces.

use crate::progress::Progress;
use cachevisor_trace::formats::generic_csv::CsvColumns;
use cachevisor_trace::{Format, MergeOptions, MergedTrace, ReadOptions, Request, VmMode};
use clap::Args;
use std::collections::HashMap;
use std::path::PathBuf;

/// Trace files, how to read them, and the cache block size: what every analysis reads.
#[derive(Debug, Clone, Args)]
pub struct BlockTraceArgs {
    /// Trace files (several are merged by time, each trace its VMs).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    #[command(flatten)]
    pub input: InputArgs,
    /// Cache block size.
    #[arg(long, default_value = "4KiB", value_parser = cachevisor_trace::units::parse_block_size)]
    pub block_size: u64,
}

impl BlockTraceArgs {
    /// Opens and merges the files, each trace starting at time 0.
    pub fn open(&self) -> anyhow::Result<MergedTrace> {
        self.input.open(&self.files, true)
    }
}

/// How to read trace files.
#[derive(Debug, Clone, Args)]
pub struct InputArgs {
    /// Trace format (detected from content when omitted).
    #[arg(long, value_parser = |s: &str| s.parse::<Format>())]
    pub format: Option<Format>,
    /// One VM per file, or one per device key in the records (MSR host_disk, MQSim device, blkparse maj,min).
    #[arg(long, value_parser = ["file", "device"], default_value = "file")]
    pub vm_mode: String,
    /// Skip malformed records (counted and reported) instead of stopping at the first.
    #[arg(long)]
    pub skip_bad: bool,
    /// blkparse action to keep.
    #[arg(long, default_value = "D")]
    pub blkparse_action: String,
    /// Generic CSV column mapping, e.g. `time=0:us,vm=1,op=2,offset=3:sector,len=4`
    /// (0-based columns; also `header=yes|no|auto`, `sep=comma|tab|space|semicolon`,
    /// `read=TOKEN`, `write=TOKEN`). With `header=auto`, the default, the first line is
    /// skipped only when it does not parse as a record.
    #[arg(long)]
    pub csv_columns: Option<String>,
    /// Rename a VM: `old=new` (repeatable).
    #[arg(long, value_parser = parse_rename)]
    pub rename: Vec<(String, String)>,
}

fn parse_rename(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(a, b)| (a.to_string(), b.to_string())).ok_or_else(|| format!("`{s}` is not old=new"))
}

impl InputArgs {
    /// Reader options.
    pub fn read_options(&self) -> anyhow::Result<ReadOptions> {
        let csv_columns =
            self.csv_columns.as_ref().map(|c| c.parse::<CsvColumns>()).transpose().map_err(anyhow::Error::msg)?;
        Ok(ReadOptions {
            format: self.format,
            vm_mode: if self.vm_mode == "device" { VmMode::Device } else { VmMode::File },
            skip_bad: self.skip_bad,
            blkparse_action: self.blkparse_action.clone(),
            csv_columns,
        })
    }

    /// Opens and merges `files`.
    pub fn open(&self, files: &[PathBuf], rebase: bool) -> anyhow::Result<MergedTrace> {
        let rename: HashMap<String, String> = self.rename.iter().cloned().collect();
        Ok(MergedTrace::open(files, &self.read_options()?, MergeOptions { rebase, rename })?)
    }
}

/// Prints skipped-record counts to stderr, if any.
pub fn report_skipped(files: &[PathBuf], trace: &MergedTrace) {
    for (f, c) in files.iter().zip(trace.counts()) {
        if c.skipped_bad > 0 {
            let at = c.first_bad.map(|l| format!(", first at {l}")).unwrap_or_default();
            eprintln!("warning: {}: skipped {} malformed records{at}", f.display(), c.skipped_bad);
        }
    }
}

/// Feeds every request of `trace` to `f` with a progress display, reports skipped
/// records, and fails on a trace without requests; returns the request count.
pub fn drain(
    trace: &mut MergedTrace,
    files: &[PathBuf],
    what: &str,
    mut f: impl FnMut(&Request),
) -> anyhow::Result<u64> {
    let mut p = Progress::new(what);
    let mut n = 0u64;
    while let Some(r) = trace.next_request()? {
        f(&r);
        n += 1;
        if n.is_multiple_of(65_536) {
            p.update(n, None);
        }
    }
    p.finish();
    report_skipped(files, trace);
    if n == 0 {
        let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        anyhow::bail!("{}: no requests in the trace", names.join(", "));
    }
    Ok(n)
}
