//! `cachevisor destage`: asks a running daemon to write every dirty block (of one vDisk or
//! all) back to the backing stores, and follows the job with a progress bar until it ends.

use crate::progress::Progress;
use anyhow::bail;
use cachevisor_trace::units::format_size;
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `destage`.
#[derive(Debug, Args)]
#[command(after_help = crate::exit_status::HELP)]
pub struct DestageArgs {
    #[command(flatten)]
    pub api: crate::api_target::ApiArgs,
    /// Only this vDisk (default: every vDisk).
    #[arg(long)]
    pub vdisk: Option<String>,
    /// The API token (also from CACHEVISOR_API_TOKEN).
    #[arg(long, env = "CACHEVISOR_API_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A file holding the API token (`api-token` in the daemon's metadata directory, as
    /// `cachevisor serve` prints at start).
    #[arg(long, conflicts_with = "token")]
    pub token_file: Option<PathBuf>,
    /// Start the job and return without waiting for it.
    #[arg(long)]
    pub no_wait: bool,
}

/// The job's progress as the API reports it.
#[derive(Debug, serde::Deserialize)]
struct Job {
    running: bool,
    done_blocks: u64,
    total_blocks: u64,
    elapsed_s: f64,
    error: Option<String>,
    block_size: u64,
}

/// Runs the command.
pub fn run(a: DestageArgs) -> anyhow::Result<()> {
    let token = crate::api_token::resolve(&a.token, &a.token_file, "destaging")?;
    let api = a.api.client()?;
    let path = match &a.vdisk {
        Some(v) => format!("/vdisks/{v}/destage"),
        None => "/destage".to_string(),
    };
    let url = api.url(&path);
    match api.post(&path).set("Authorization", &format!("Bearer {token}")).call() {
        Ok(_) => {}
        Err(ureq::Error::Status(409, _)) => eprintln!("a destage job is already running: following it"),
        Err(e) => return Err(crate::exit_status::api_error(&url, e)),
    }
    if a.no_wait {
        println!("destage started");
        return Ok(());
    }
    let progress_url = api.url("/destage");
    let mut bar = Progress::new("destaging blocks");
    let job = loop {
        let j: Job =
            api.get("/destage").call().map_err(|e| crate::exit_status::api_error(&progress_url, e))?.into_json()?;
        bar.update(j.done_blocks, Some(j.total_blocks));
        if !j.running {
            break j;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    bar.finish();
    if let Some(e) = job.error {
        bail!("destage stopped after {} blocks: {e}", job.done_blocks);
    }
    let bytes = job.done_blocks * job.block_size;
    println!("destaged {} blocks ({}) in {:.2} s", job.done_blocks, format_size(bytes), job.elapsed_s);
    Ok(())
}
