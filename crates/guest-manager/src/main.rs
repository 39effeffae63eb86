//! `cachevisor-guest`: SymFlex's guest-side cache manager, the binary that runs inside a
//! VM next to its applications (the host's daemon is `cachevisor`). Arguments and what
//! it does: `manager.rs`.

use cachevisor_guest_manager::manager::{run, GuestArgs};
use clap::Parser;

/// cachevisor-guest — SymFlex's guest-side cache manager: a cache on the vSSD the host
/// serves, cooperating with its inflates and deflates, driven by a workload.
#[derive(Debug, Parser)]
#[command(name = "cachevisor-guest", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    args: GuestArgs,
}

fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run(cli.args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
