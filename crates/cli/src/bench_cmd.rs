//! `cachevisor bench …` (placeholder replaced below).
use clap::Subcommand;
/// Bench subcommands.
#[derive(Debug, Subcommand)]
pub enum BenchCmd {}
/// Runs a bench.
pub fn run(c: BenchCmd) -> anyhow::Result<()> {
    match c {}
}
