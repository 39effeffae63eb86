//! The `cachevisor` command line, the operator's binary: the daemon and the commands that
//! talk to it, trace tools, the simulator and the demo. Benches and the seeds' experiments
//! are the lab binary's (`cachevisor-lab`), reached as `cachevisor bench …` and
//! `cachevisor experiment …` (`lab_forward.rs`); the guest-side cache manager is its own
//! binary (`cachevisor-guest`), built for the guest.

mod analyze_cmd;
mod api_target;
mod api_token;
mod cache_cmd;
mod check_cmd;
mod demo_cmd;
mod destage_cmd;
mod exit_status;
mod input_args;
mod lab_forward;
mod prewarm_cmd;
mod reload_cmd;
mod serve_cmd;
mod shell_cmd;
mod simulate_cmd;
mod status_cmd;
mod sweep_cmd;
mod trace_cmd;

use cachevisor_cli::{bundled, progress};
use clap::{CommandFactory, Parser, Subcommand};

/// cachevisor — hypervisor-side SSD cache manager: the daemon, trace tools, the simulator.
#[derive(Debug, Parser)]
#[command(name = "cachevisor", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Simulate the bundled real traces with several policies and print the comparison.
    Demo(demo_cmd::DemoArgs),
    /// Inspect, convert and generate block I/O traces.
    #[command(subcommand)]
    Trace(trace_cmd::TraceCmd),
    /// Replay traces through the cache engine in virtual time.
    Simulate(Box<simulate_cmd::SimulateArgs>),
    /// Run a policy sweep (traces × sizes × policies × parameters) locally or on Ray.
    Sweep(sweep_cmd::SweepArgs),
    /// Demand estimation: miss-ratio curves, working sets, URD.
    #[command(subcommand)]
    Analyze(analyze_cmd::AnalyzeCmd),
    /// Serve VM disks over NBD with the managed SSD cache.
    Serve(serve_cmd::ServeArgs),
    /// Show a running daemon's vDisks (via its HTTP API).
    Status(status_cmd::StatusArgs),
    /// Write a running daemon's dirty blocks back to their backing stores, with progress.
    Destage(destage_cmd::DestageArgs),
    /// Prewarm a running daemon's cache from snapshots, or follow a prewarm, with progress.
    Prewarm(prewarm_cmd::PrewarmArgs),
    /// Make a running daemon re-read its configuration file and apply what changed.
    Reload(reload_cmd::ReloadArgs),
    /// Replace a running daemon's cache SSD: detach it (write back, pass through), attach a new one.
    #[command(subcommand)]
    Cache(cache_cmd::CacheCmd),
    /// Check a cache's metadata offline: what a start would recover, or why it would refuse.
    Check(check_cmd::CheckArgs),
    /// Reproduce the seeds' experiments and write HTML reports (runs `cachevisor-lab experiment`).
    #[command(disable_help_flag = true)]
    Experiment(lab_forward::LabArgs),
    /// Measure speed and memory (runs `cachevisor-lab bench`).
    #[command(disable_help_flag = true)]
    Bench(lab_forward::LabArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), or write one page per command into a directory.
    Man {
        /// Directory for `cachevisor.1`, `cachevisor-serve.1`, … (printed to stdout when omitted).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Demo(a) => demo_cmd::run(a),
        Cmd::Trace(c) => trace_cmd::run(c),
        Cmd::Simulate(a) => simulate_cmd::run(*a),
        Cmd::Analyze(c) => analyze_cmd::run(c),
        Cmd::Sweep(a) => sweep_cmd::run(a),
        Cmd::Experiment(a) => lab_forward::run("experiment", a),
        Cmd::Serve(a) => serve_cmd::run(a),
        Cmd::Status(a) => status_cmd::run(a),
        Cmd::Destage(a) => destage_cmd::run(a),
        Cmd::Prewarm(a) => prewarm_cmd::run(a),
        Cmd::Reload(a) => reload_cmd::run(a),
        Cmd::Cache(c) => cache_cmd::run(c),
        Cmd::Check(a) => check_cmd::run(a),
        Cmd::Bench(a) => lab_forward::run("bench", a),
        Cmd::Completions { shell } => shell_cmd::completions(shell, Cli::command()),
        Cmd::Man { out } => shell_cmd::man(out, Cli::command()),
    };
    if let Err(e) = r {
        eprintln!("error: {e:#}");
        std::process::exit(exit_status::code_of(&e));
    }
}
