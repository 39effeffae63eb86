//! `cachevisor trace …`: characterize, convert, generate.

use crate::input_args::{drain, report_skipped, BlockTraceArgs, InputArgs};
use crate::progress::Progress;
use anyhow::Context;
use cachevisor_cli::trace_file::{write_source, writer};
use cachevisor_trace::characterize::{Characterizer, VmProfile};
use cachevisor_trace::generator::{Generator, WorkloadConfig};
use cachevisor_trace::units::format_size;
use cachevisor_trace::zipf::ZipfSource;
use cachevisor_trace::Format;
use clap::Subcommand;
use std::path::PathBuf;

/// Trace subcommands.
#[derive(Debug, Subcommand)]
pub enum TraceCmd {
    /// Per VM and total: requests, duration, IOPS, read/write mix, sizes, WSS, sequentiality, reuse.
    Info {
        #[command(flatten)]
        trace: BlockTraceArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Convert traces between formats (several inputs are merged).
    Convert {
        /// Input trace files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[command(flatten)]
        input: InputArgs,
        /// Output format.
        #[arg(long, value_parser = |s: &str| s.parse::<Format>())]
        to: Format,
        /// Output file.
        #[arg(short, long)]
        output: PathBuf,
        /// Object size for oracle-general output.
        #[arg(long, default_value = "4KiB", value_parser = cachevisor_trace::units::parse_block_size)]
        block_size: u64,
        /// Keep absolute timestamps instead of starting each trace at 0.
        #[arg(long)]
        keep_time: bool,
    },
    /// Generate a synthetic trace from a Nutanix-schema YAML workload configuration.
    Generate {
        /// YAML configuration.
        config: PathBuf,
        /// Output file.
        #[arg(short, long)]
        output: PathBuf,
        /// Output format.
        #[arg(long, default_value = "csv", value_parser = |s: &str| s.parse::<Format>())]
        to: Format,
        /// Override the config's seed.
        #[arg(long)]
        seed: Option<u64>,
    },
    /// Generate a Zipf trace of single-block reads (the speed benchmark's workload).
    Zipf {
        /// Requests.
        #[arg(long, default_value_t = 10_000_000)]
        requests: u64,
        /// Distinct blocks.
        #[arg(long, default_value_t = 1_000_000)]
        blocks: u64,
        /// Skew.
        #[arg(long, default_value_t = 1.0)]
        alpha: f64,
        /// Seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Block size.
        #[arg(long, default_value = "4KiB", value_parser = cachevisor_trace::units::parse_block_size)]
        block_size: u64,
        /// Output file.
        #[arg(short, long)]
        output: PathBuf,
        /// Output format.
        #[arg(long, default_value = "oracle-general", value_parser = |s: &str| s.parse::<Format>())]
        to: Format,
    },
}

/// Runs a trace subcommand.
pub fn run(cmd: TraceCmd) -> anyhow::Result<()> {
    match cmd {
        TraceCmd::Info { trace, json } => info(&trace, json),
        TraceCmd::Convert { files, input, to, output, block_size, keep_time } => {
            let mut trace = input.open(&files, !keep_time)?;
            let mut w = writer(to, &output, block_size)?;
            let mut p = Progress::new("converting");
            let mut n = 0u64;
            while let Some(r) = trace.next_request()? {
                let name = &trace.vm_names()[r.vm as usize];
                w.write(&r, name).with_context(|| format!("writing {}", output.display()))?;
                n += 1;
                if n.is_multiple_of(65_536) {
                    p.update(n, None);
                }
            }
            p.finish();
            w.finish()?;
            report_skipped(&files, &trace);
            eprintln!("wrote {n} requests of {} VMs to {} ({to})", trace.vm_names().len(), output.display());
            Ok(())
        }
        TraceCmd::Generate { config, output, to, seed } => {
            let text = std::fs::read_to_string(&config).with_context(|| format!("reading {}", config.display()))?;
            let mut cfg = WorkloadConfig::from_yaml(&text, &config.display().to_string())?;
            if let Some(s) = seed {
                cfg.seed = s;
            }
            let w = cfg.validate().map_err(|e| anyhow::anyhow!("{}: {e}", config.display()))?;
            let n = write_source(&mut Generator::new(w), to, &output, 4096)?;
            eprintln!("wrote {n} requests to {} ({to})", output.display());
            Ok(())
        }
        TraceCmd::Zipf { requests, blocks, alpha, seed, block_size, output, to } => {
            let mut src = ZipfSource::new(requests, blocks, alpha, block_size as u32, seed)?;
            let n = write_source(&mut src, to, &output, block_size)?;
            eprintln!("wrote {n} requests to {} ({to})", output.display());
            Ok(())
        }
    }
}

fn info(args: &BlockTraceArgs, json: bool) -> anyhow::Result<()> {
    let block = args.block_size;
    let mut trace = args.open()?;
    let mut c = Characterizer::new(block);
    drain(&mut trace, &args.files, "reading", |r| c.add(r))?;
    let profiles = c.finish(trace.vm_names());
    if json {
        println!("{}", serde_json::to_string_pretty(&profiles)?);
    } else {
        print!("{}", table(&profiles, block));
    }
    Ok(())
}

fn table(ps: &[VmProfile], block: u64) -> String {
    let mut s = format!(
        "{:<22} {:>9} {:>9} {:>8} {:>7} {:>6} {:>10} {:>11} {:>6} {:>6}\n",
        "vm",
        "requests",
        "dur s",
        "avg IOPS",
        "peak",
        "read%",
        "avg size",
        format!("WSS@{}", format_size(block).replace(".00", "")),
        "seq%",
        "reuse%"
    );
    for p in ps {
        let bytes = p.read_bytes + p.write_bytes;
        s.push_str(&format!(
            "{:<22} {:>9} {:>9.1} {:>8.1} {:>7} {:>6.1} {:>10} {:>11} {:>6.1} {:>6.1}\n",
            p.vm,
            p.requests,
            p.duration_s,
            p.avg_iops,
            p.peak_iops,
            p.read_fraction * 100.0,
            format_size(bytes / p.requests.max(1)),
            format_size(p.wss_bytes),
            p.sequential_fraction * 100.0,
            p.reuse_ratio * 100.0
        ));
    }
    s.push_str("\nrequest sizes (rounded up to powers of two), total:\n");
    if let Some(t) = ps.last() {
        for b in &t.size_histogram {
            s.push_str(&format!(
                "  ≤ {:>10}  {:>9}  {:>5.1}%\n",
                format_size(b.up_to_bytes),
                b.requests,
                b.requests as f64 * 100.0 / t.requests.max(1) as f64
            ));
        }
    }
    s
}
