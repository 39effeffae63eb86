//! `cachevisor analyze mrc`: per-VM miss-ratio curves (exact or SHARDS), working sets,
//! wss80, ELICA's ideal sizes and URD sizes, as CSV, JSON and an SVG plot; and
//! `cachevisor analyze windows`: the same estimators per interval, as CSV and SVG plots.

use crate::input_args::{drain, BlockTraceArgs};
use anyhow::Context;
use cachevisor_analysis::mrc_report::{MrcOptions, MrcReport};
use cachevisor_analysis::{Decay, Interval, IntervalProfiler, IntervalRow, Method, Profiler};
use cachevisor_sim::plot::{line_chart_svg, Series};
use cachevisor_trace::units::{format_size, parse_duration_ns, parse_size};
use clap::{Args, Subcommand};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::PathBuf;

/// Analysis subcommands.
#[derive(Debug, Subcommand)]
pub enum AnalyzeCmd {
    /// Miss-ratio curves per VM, with working set, wss80, ELICA ideal size and URD size.
    Mrc(MrcArgs),
    /// Per-interval series per VM: IOPS, WSS, hit ratio at given sizes, URD size, AllocUnit.
    Windows(WindowsArgs),
}

/// Options of `analyze windows`.
#[derive(Debug, Args)]
pub struct WindowsArgs {
    #[command(flatten)]
    trace: BlockTraceArgs,
    /// Interval: a duration (`60s`, `10min`) of trace time, or a request count (`100000`).
    #[arg(long, default_value = "60s")]
    interval: String,
    /// Cache sizes for the hit-ratio columns; the first also gives AllocUnit.
    #[arg(long, value_delimiter = ',', default_value = "64MiB,256MiB,1GiB", value_parser = parse_size)]
    sizes: Vec<u64>,
    /// Past counts at each boundary: reset, keep, or a factor in (0, 1).
    #[arg(long, default_value = "reset")]
    decay: String,
    /// Fraction of useful reuses the URD size covers.
    #[arg(long, default_value_t = 0.95)]
    percentile: f64,
    /// Output directory.
    #[arg(long, default_value = "out/windows")]
    out: PathBuf,
}

/// Options of `analyze mrc`.
#[derive(Debug, Args)]
pub struct MrcArgs {
    #[command(flatten)]
    trace: BlockTraceArgs,
    /// exact, or shards (with --rate or --max-blocks).
    #[arg(long, default_value = "exact", value_parser = ["exact", "shards"])]
    method: String,
    /// SHARDS fixed-rate sampling rate, in (0, 1].
    #[arg(long)]
    rate: Option<f64>,
    /// SHARDS fixed-size: most blocks tracked.
    #[arg(long)]
    max_blocks: Option<usize>,
    /// SHARDS hash seed: another seed samples another, equally likely, set of blocks.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// SHARDS' correction of the sampled count: size-biased (spread over the sample's
    /// accesses by block popularity) or first-bucket (FAST'15's SHARDS_adj).
    #[arg(long, default_value = "size-biased", value_parser = |s: &str| s.parse::<cachevisor_analysis::Correction>())]
    shards_correction: cachevisor_analysis::Correction,
    /// Which accesses the curve counts: all, read, write, or urd (reads, useful reuses).
    #[arg(long, default_value = "all", value_parser = ["all", "read", "write", "urd"])]
    kind: String,
    /// Percentile of reuses for ELICA's ideal size and the URD size.
    #[arg(long, default_value_t = 0.95)]
    percentile: f64,
    /// Points per curve in the CSV and plot.
    #[arg(long, default_value_t = 200)]
    points: usize,
    /// Output directory.
    #[arg(long, default_value = "out/analyze")]
    out: PathBuf,
}

fn method(a: &MrcArgs) -> anyhow::Result<Method> {
    Method::choose(&a.method, a.rate, a.max_blocks).map_err(|e| anyhow::anyhow!("--{e}"))
}

/// Runs an analysis subcommand.
pub fn run(cmd: AnalyzeCmd) -> anyhow::Result<()> {
    match cmd {
        AnalyzeCmd::Mrc(a) => mrc(a),
        AnalyzeCmd::Windows(a) => windows(a),
    }
}

fn check_block_size(b: u64) -> anyhow::Result<()> {
    if !b.is_power_of_two() || b < 512 {
        anyhow::bail!("--block-size {b}: must be a power of two of at least 512 B");
    }
    Ok(())
}

fn windows(a: WindowsArgs) -> anyhow::Result<()> {
    check_block_size(a.trace.block_size)?;
    if a.sizes.is_empty() || a.sizes.iter().any(|&s| s < a.trace.block_size) {
        anyhow::bail!("--sizes: every size must be at least one block ({})", format_size(a.trace.block_size));
    }
    let interval = if a.interval.chars().all(|c| c.is_ascii_digit()) {
        let n: u64 = a.interval.parse()?;
        if n == 0 {
            anyhow::bail!("--interval 0: give a positive request count or a duration");
        }
        Interval::Requests(n)
    } else {
        let ns = parse_duration_ns(&a.interval).map_err(|e| anyhow::anyhow!("--interval: {e}"))?;
        if ns == 0 {
            anyhow::bail!("--interval must be longer than 0");
        }
        Interval::Time(ns)
    };
    let decay = match a.decay.as_str() {
        "reset" => Decay::Reset,
        "keep" => Decay::Keep,
        f => match f.parse::<f64>() {
            Ok(x) if x > 0.0 && x < 1.0 => Decay::Factor(x),
            _ => anyhow::bail!("--decay {f}: use reset, keep, or a factor in (0, 1)"),
        },
    };
    let blocks: Vec<u64> = a.sizes.iter().map(|s| s / a.trace.block_size).collect();
    let mut prof = IntervalProfiler::new(a.trace.block_size, interval, decay, blocks, a.percentile);
    let mut trace = a.trace.open()?;
    let mut rows = Vec::new();
    drain(&mut trace, &a.trace.files, "profiling intervals", |r| rows.extend(prof.add(r).into_iter().flatten()))?;
    rows.extend(prof.close());
    let names = trace.vm_names();
    let bs = a.trace.block_size;
    let mut csv = String::from("interval,t_end_s,vm,requests,iops,wss_bytes");
    for s in &a.sizes {
        let _ = write!(csv, ",hit_ratio_{}", format_size(*s).replace(' ', "").replace(".00", ""));
    }
    csv.push_str(",urd_bytes,alloc_unit_blocks\n");
    for r in &rows {
        let _ = write!(
            csv,
            "{},{},{},{},{:.3},{}",
            r.interval,
            r.t_end_s,
            names[r.vm as usize].replace(',', "_"),
            r.requests,
            r.iops,
            r.wss_blocks * bs
        );
        for h in &r.hit_ratio {
            let _ = write!(csv, ",{h:.6}");
        }
        let _ =
            writeln!(csv, ",{},{}", r.urd_blocks.map_or(String::new(), |u| (u * bs).to_string()), r.alloc_unit_blocks);
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    std::fs::write(a.out.join("windows.csv"), csv)?;
    let x_label = if matches!(interval, Interval::Time(_)) {
        "trace time (s)"
    } else {
        "trace time of the interval's last request (s)"
    };
    let series = |f: &dyn Fn(&IntervalRow) -> f64| -> Vec<Series> {
        (0..names.len())
            .map(|vm| Series {
                name: names[vm].clone(),
                points: rows
                    .iter()
                    .filter(|r| r.vm as usize == vm && r.requests > 0)
                    .map(|r| (r.t_end_s, f(r)))
                    .collect(),
                ..Default::default()
            })
            .collect()
    };
    let charts = [
        ("iops.svg", "requests per second per interval", "IOPS", series(&|r| r.iops), None),
        (
            "wss.svg",
            "working set per interval",
            "WSS (MiB)",
            series(&|r| (r.wss_blocks * bs) as f64 / (1 << 20) as f64),
            None,
        ),
        (
            "hit_ratio.svg",
            &*format!("LRU hit ratio at {}", a.sizes.iter().map(|&b| format_size(b)).collect::<Vec<_>>().join(", ")),
            "hit ratio",
            // One line per VM and size; a VM keeps its colour across sizes.
            (0..a.sizes.len())
                .flat_map(|k| {
                    let size = format_size(a.sizes[k]);
                    series(&|r: &IntervalRow| r.hit_ratio[k]).into_iter().enumerate().map(move |(vm, mut s)| {
                        s.name = format!("{} @ {size}", s.name);
                        s.color = Some(vm);
                        s
                    })
                })
                .collect(),
            Some((0.0, 1.05)),
        ),
        (
            "alloc_unit.svg",
            &*format!("AllocUnit: block misses per interval at {}", format_size(a.sizes[0])),
            "blocks",
            series(&|r| r.alloc_unit_blocks as f64),
            None,
        ),
    ];
    for (file, title, y, s, range) in charts {
        let svg = line_chart_svg(title, x_label, y, &s, range).map_err(anyhow::Error::msg)?;
        std::fs::write(a.out.join(file), svg)?;
    }
    let intervals = rows.iter().map(|r| r.interval).max().map_or(0, |m| m + 1);
    println!(
        "{intervals} intervals × {} VMs; wrote {1}/windows.csv and {1}/{{iops,wss,hit_ratio,alloc_unit}}.svg",
        names.len(),
        a.out.display()
    );
    Ok(())
}

fn mrc(a: MrcArgs) -> anyhow::Result<()> {
    check_block_size(a.trace.block_size)?;
    let opts = MrcOptions::new(&a.kind, a.percentile, a.points).map_err(|e| anyhow::anyhow!("--{e}"))?;
    let m = method(&a)?;
    let mut trace = a.trace.open()?;
    let mut prof = Profiler::new(a.trace.block_size, m).with_seed(a.seed).with_correction(a.shards_correction);
    drain(&mut trace, &a.trace.files, "profiling", |r| prof.add(r))?;
    let names = trace.vm_names();
    let bs = a.trace.block_size;
    let report = MrcReport::build(&prof, names, m, opts);
    let series: Vec<Series> = report
        .vms
        .iter()
        .zip(&report.curves)
        .map(|(v, c)| Series {
            name: v.vm.clone(),
            points: c.iter().map(|p| ((p.blocks * bs) as f64 / (1u64 << 30) as f64, p.miss_ratio)).collect(),
            ..Default::default()
        })
        .collect();
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    std::fs::write(a.out.join("mrc.csv"), report.curves_csv())?;
    #[derive(Serialize)]
    struct Summary<'a> {
        files: &'a [PathBuf],
        #[serde(flatten)]
        report: &'a MrcReport,
    }
    let json = serde_json::to_string_pretty(&Summary { files: &a.trace.files, report: &report })?;
    std::fs::write(a.out.join("summary.json"), json)?;
    let summaries = &report.vms;
    let title = format!("LRU miss-ratio curves ({} accesses, {} blocks, {})", a.kind, format_size(bs), a.method);
    let svg = line_chart_svg(&title, "cache size (GiB)", "miss ratio", &series, Some((0.0, 1.05)))
        .map_err(anyhow::Error::msg)?;
    std::fs::write(a.out.join("mrc.svg"), svg)?;
    let opt = |v: Option<u64>| v.map_or("-".to_string(), format_size);
    println!(
        "{:<22} {:>10} {:>11} {:>11} {:>8} {:>14} {:>14} {:>11}",
        "vm",
        "accesses",
        "WSS",
        "wss80",
        "hit@WSS",
        "ELICA max SD",
        format!("ELICA p{:.0}", a.percentile * 100.0),
        format!("URD p{:.0}", a.percentile * 100.0)
    );
    for s in summaries {
        println!(
            "{:<22} {:>10} {:>11} {:>11} {:>8.3} {:>14} {:>14} {:>11}",
            s.vm,
            s.block_accesses,
            format_size(s.wss_bytes),
            opt(s.wss80_bytes),
            s.hit_ratio_at_wss,
            opt(s.elica_ideal_max_bytes),
            opt(s.elica_ideal_percentile_bytes),
            opt(s.urd_size_bytes)
        );
    }
    println!("wrote {0}/mrc.csv, {0}/summary.json, {0}/mrc.svg", a.out.display());
    Ok(())
}
