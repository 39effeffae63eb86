//! `cachevisor check --metadata DIR`: the cache's metadata (checkpoint and journal)
//! checked offline, reading only — what a start would recover per vDisk, or why it would
//! refuse (`cachevisor_server::metadata_check`); with `--repair`, what is consistent
//! salvaged first (`metadata_repair`). Exit 0 when consistent, 1 with problems.

use clap::Args;
use std::path::PathBuf;

/// Arguments of `check`.
#[derive(Debug, Args)]
#[command(after_help = "Exit status: 0 consistent; 1 problems found (listed), or no metadata there; 2 bad arguments.")]
pub struct CheckArgs {
    /// The metadata directory (`cache.metadata`; by default the cache file's path + `.meta`).
    #[arg(long)]
    pub metadata: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Salvage what is consistent (whole records, the newer of two copies) into a new
    /// checkpoint, the old files kept in DIR/salvaged-TIME/; no daemon may run on it.
    #[arg(long)]
    pub repair: bool,
}

/// Runs the command.
pub fn run(a: CheckArgs) -> anyhow::Result<()> {
    if a.repair {
        let r = cachevisor_server::metadata_repair::repair(&a.metadata).map_err(anyhow::Error::msg)?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&r)?);
        } else {
            print!("{}", r.text());
        }
    }
    let r = cachevisor_server::metadata_check::check(&a.metadata).map_err(anyhow::Error::msg)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", r.text());
    }
    if r.problems.is_empty() {
        Ok(())
    } else {
        Err(crate::exit_status::exit(
            crate::exit_status::FAILED,
            format!("{}: {} problem(s) in the metadata", a.metadata.display(), r.problems.len()),
        ))
    }
}
