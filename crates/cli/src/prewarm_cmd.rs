//! `cachevisor prewarm`: prewarms a running daemon's cache from a snapshot directory
//! (`start --from DIR`), or follows the running (or last) prewarm (`status`), with a
//! progress bar until it ends. `serve --prewarm-from DIR` starts one at the daemon's start.

use crate::progress::Progress;
use anyhow::bail;
use cachevisor_trace::units::format_size;
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `prewarm`.
#[derive(Debug, Args)]
#[command(after_help = crate::exit_status::HELP)]
pub struct PrewarmArgs {
    #[command(subcommand)]
    pub cmd: PrewarmCmd,
    #[command(flatten)]
    pub api: crate::api_target::ApiArgs,
    /// Print the progress once and return (do not follow it).
    #[arg(long, global = true)]
    pub no_wait: bool,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum PrewarmCmd {
    /// Follow the running (or last) prewarm.
    Status,
    /// Prewarm from another cache's snapshot directory (its `prewarm.snapshot_dir`).
    Start {
        /// The snapshot directory (as the daemon sees it).
        #[arg(long)]
        from: PathBuf,
        /// Only this vDisk (default: every vDisk the snapshots name that is served).
        #[arg(long)]
        vdisk: Option<String>,
        /// The API token (also from CACHEVISOR_API_TOKEN).
        #[arg(long, env = "CACHEVISOR_API_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// A file holding the API token (`api-token` in the daemon's metadata directory).
        #[arg(long, conflicts_with = "token")]
        token_file: Option<PathBuf>,
    },
}

/// The prewarm's progress as the API reports it.
#[derive(Debug, serde::Deserialize)]
struct Job {
    running: bool,
    from: String,
    snapshots: usize,
    planned_blocks: u64,
    loaded_blocks: u64,
    skipped_blocks: u64,
    read_bytes: u64,
    elapsed_s: f64,
    error: Option<String>,
}

/// Runs the command.
pub fn run(a: PrewarmArgs) -> anyhow::Result<()> {
    let api = a.api.client()?;
    let url = api.url("/prewarm");
    if let PrewarmCmd::Start { from, vdisk, token, token_file } = &a.cmd {
        let token = crate::api_token::resolve(token, token_file, "prewarming")?;
        let body = serde_json::json!({ "from": from, "vdisk": vdisk });
        match api.post("/prewarm").set("Authorization", &format!("Bearer {token}")).send_json(body) {
            Ok(_) => {}
            Err(ureq::Error::Status(409, _)) => eprintln!("a prewarm is already running: following it"),
            Err(e) => return Err(crate::exit_status::api_error(&url, e)),
        }
    }
    let get = || -> anyhow::Result<Job> {
        Ok(api.get("/prewarm").call().map_err(|e| crate::exit_status::api_error(&url, e))?.into_json()?)
    };
    let mut bar = (!a.no_wait).then(|| Progress::new("prewarming blocks"));
    let job = loop {
        let j = get()?;
        if let Some(b) = bar.as_mut() {
            b.update(j.loaded_blocks + j.skipped_blocks, Some(j.planned_blocks));
        }
        if !j.running || a.no_wait {
            break j;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if let Some(b) = bar {
        b.finish();
    }
    if job.from.is_empty() {
        println!("no prewarm has run");
        return Ok(());
    }
    let state = if job.running { "running" } else { "done" };
    println!(
        "prewarm from {} ({} snapshots): {state}, {} of {} blocks loaded, {} already cached, {} read in {:.1} s",
        job.from,
        job.snapshots,
        job.loaded_blocks,
        job.planned_blocks,
        job.skipped_blocks,
        format_size(job.read_bytes),
        job.elapsed_s
    );
    if let Some(e) = job.error {
        bail!("prewarm: {e}");
    }
    Ok(())
}
