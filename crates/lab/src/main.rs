//! `cachevisor-lab`: the lab, kept out of the operator's binary. Benches measure speed
//! and memory side by side against the strongest peers (`bench/`), and the seeds'
//! experiments reproduce their figures and check their claims (`experiment/`). The
//! operator binary reaches both as `cachevisor bench …` and `cachevisor experiment …`;
//! the lab drives the operator binary as a process where it measures the daemon
//! (`operator.rs`).

mod bench;
mod experiment;
mod operator;

use clap::{Parser, Subcommand};

/// cachevisor-lab — benches and the seeds' experiments for cachevisor.
#[derive(Debug, Parser)]
#[command(name = "cachevisor-lab", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Reproduce the seeds' experiments and write HTML reports.
    Experiment(experiment::ExperimentArgs),
    /// Measure speed and memory.
    #[command(subcommand)]
    Bench(bench::BenchCmd),
}

fn main() {
    let r = match Cli::parse().cmd {
        Cmd::Experiment(a) => experiment::run(a),
        Cmd::Bench(c) => bench::run(c),
    };
    if let Err(e) = r {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
