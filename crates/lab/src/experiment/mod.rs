//! `cachevisor experiment NAME|all`: runs the seeds' experiments on the simulator (see
//! `cachevisor_lab::seeds`) or, for `symflex-vssd`, on a real daemon and guests
//! (`vssd.rs`), and writes each one's HTML report, JSON and CSVs.

pub(crate) mod persist;
pub(crate) mod vssd;

use anyhow::Context;
use cachevisor_cli::bundled;
use cachevisor_lab::seeds::{self, Options, Size};
use clap::Args;
use std::path::PathBuf;

/// Arguments of `experiment`.
#[derive(Debug, Args)]
pub struct ExperimentArgs {
    /// Experiment name, or `all`.
    #[arg(value_parser = ["all", "scave-corun", "recs-tracking", "eci-endurance", "symflex-proportional", "policy-compare", "prewarm-failover", "elica", "admission", "symflex-vssd"])]
    pub name: String,
    /// Longer runs (more passes, longer phases).
    #[arg(long, conflicts_with = "quick")]
    pub full: bool,
    /// The reduced size the test suite runs (seconds each).
    #[arg(long)]
    pub quick: bool,
    /// libCacheSim's `cachesim` binary (built in Release from its source beside the
    /// project) for the experiments that compare with it (`admission`).
    #[arg(long)]
    pub cachesim: Option<PathBuf>,
    /// Output directory; each experiment writes into DIR/NAME.
    #[arg(long, default_value = "out/experiments")]
    pub out: PathBuf,
}

/// Runs the command.
pub fn run(a: ExperimentArgs) -> anyhow::Result<()> {
    let size = if a.full {
        Size::Full
    } else if a.quick {
        Size::Quick
    } else {
        Size::Default
    };
    let traces = bundled::traces_dir()?;
    let mut names: Vec<&str> = if a.name == "all" { seeds::NAMES.to_vec() } else { vec![a.name.as_str()] };
    if a.name == "all" {
        names.push("symflex-vssd");
    }
    for name in names {
        let opts = Options { size, out: a.out.join(name), traces: traces.clone(), cachesim: a.cachesim.clone() };
        eprintln!("== {name} ({})", size.name());
        let t = std::time::Instant::now();
        let report = if name == "symflex-vssd" {
            let r = crate::experiment::vssd::run(size, &opts.out, &mut |line| eprintln!("  {line}"))
                .with_context(|| format!("experiment {name}"))?;
            r.write(&opts.out).with_context(|| format!("writing {}", opts.out.display()))?;
            r
        } else {
            seeds::run(name, &opts, &mut |line| eprintln!("  {line}"))
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("experiment {name}"))?
        };
        println!("{}: {} ({:.1} s)", name, report.title, t.elapsed().as_secs_f64());
        for c in &report.claims {
            println!("  [{}] {} — {}", if c.holds { "holds" } else { "DOES NOT HOLD" }, c.text, c.evidence);
        }
        println!("  report: {}", opts.out.join("report.html").display());
    }
    Ok(())
}
