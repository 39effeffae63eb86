//! `cachevisor reload`: asks a running daemon to re-read its configuration file and apply
//! what changed (`POST /reload`, as SIGHUP or `systemctl reload` do), and prints each
//! change — or why nothing changed (a key that cannot change while running, named).

use crate::exit_status::{api_error, exit, FAILED};
use clap::Args;

/// Arguments of `reload`.
#[derive(Debug, Args)]
#[command(after_help = crate::exit_status::HELP)]
pub struct ReloadArgs {
    #[command(flatten)]
    pub call: crate::api_target::ApiCallArgs,
}

/// The daemon's answer.
#[derive(Debug, serde::Deserialize, serde::Serialize)]
struct Report {
    file: String,
    applied: Vec<String>,
}

/// Runs the command.
pub fn run(ReloadArgs { call: a }: ReloadArgs) -> anyhow::Result<()> {
    let token = crate::api_token::resolve(&a.token, &a.token_file, "reloading")?;
    let api = a.api.client()?;
    let url = api.url("/reload");
    let r: Report = api
        .post("/reload")
        .set("Authorization", &format!("Bearer {token}"))
        .call()
        .map_err(|e| api_error(&url, e))?
        .into_json()
        .map_err(|e| exit(FAILED, format!("{url}: an answer that is not a reload report: {e}")))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else if r.applied.is_empty() {
        println!("{}: nothing changed", r.file);
    } else {
        println!("{} reloaded:", r.file);
        for c in &r.applied {
            println!("  {c}");
        }
    }
    Ok(())
}
