//! `cachevisor status`: asks a running daemon's HTTP API for its vDisks and prints them
//! (a table, or the API's JSON with `--json`); exits 5 when a vDisk runs in pass-through
//! (`exit_status.rs`).

use anyhow::Context;
use cachevisor_trace::units::format_size;
use clap::Args;

/// Arguments of `status`.
#[derive(Debug, Args)]
#[command(after_help = crate::exit_status::HELP)]
pub struct StatusArgs {
    #[command(flatten)]
    pub api: crate::api_target::ApiArgs,
    /// Print the raw JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs the command.
pub fn run(a: StatusArgs) -> anyhow::Result<()> {
    let api = a.api.client()?;
    let url = api.url("/vdisks");
    let body: serde_json::Value = api
        .get("/vdisks")
        .call()
        .map_err(|e| crate::exit_status::api_error(&url, e))?
        .into_json()
        .with_context(|| format!("{url}: an answer that is not JSON"))?;
    let degraded: Vec<&str> = body
        .as_array()
        .context("unexpected answer")?
        .iter()
        .filter(|v| v["stats"]["passthrough"].as_bool().unwrap_or(false))
        .map(|v| v["name"].as_str().unwrap_or("?"))
        .collect();
    let verdict = || match degraded.as_slice() {
        [] => Ok(()),
        names => Err(crate::exit_status::exit(
            crate::exit_status::DEGRADED,
            format!(
                "in pass-through (served without the cache: device errors, or the cache detached): {}",
                names.join(", ")
            ),
        )),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&body)?);
        return verdict();
    }
    println!(
        "{:<12} {:>10} {:>12} {:>10} {:>10} {:>10} {:>7} {:>10} {:>10} {:>7}",
        "vdisk", "size", "policy", "cached", "target", "dirty", "hit%", "reads", "writes", "errors"
    );
    // Sizes without a space, so each column is one word for scripts (`awk '{print $6}'`).
    let size = |b: u64| format_size(b).replace(' ', "");
    for v in body.as_array().context("unexpected answer")? {
        let n = |k: &str| v[k].as_u64().unwrap_or(0);
        let s = &v["stats"];
        let sn = |k: &str| s[k].as_u64().unwrap_or(0);
        let hit = if sn("blocks") > 0 { 100.0 * sn("hit_blocks") as f64 / sn("blocks") as f64 } else { 0.0 };
        let bs = n("block_size").max(1);
        let policy = if s["passthrough"].as_bool().unwrap_or(false) {
            "pass-through".to_string()
        } else {
            v["write_policy"].as_str().unwrap_or("?").to_string()
        };
        println!(
            "{:<12} {:>10} {:>12} {:>10} {:>10} {:>10} {:>7.1} {:>10} {:>10} {:>7}",
            v["name"].as_str().unwrap_or("?"),
            size(n("size")),
            policy,
            size(n("used_blocks") * bs),
            size(n("target_blocks") * bs),
            size(n("dirty_blocks") * bs),
            hit,
            sn("reads"),
            sn("writes"),
            sn("errors"),
        );
    }
    // The cache file, when it is not in (`cachevisor cache attach` brings it back).
    if let Ok(c) = api.get("/cache").call().map(|r| r.into_json::<serde_json::Value>()) {
        let c = c.unwrap_or_default();
        if let Some(state) = c["state"].as_str().filter(|s| *s != "attached") {
            println!(
                "cache {}: {state}: every vDisk passes through to its backing store until `cachevisor cache attach`",
                c["path"].as_str().unwrap_or("?")
            );
        }
    }
    // The running (or last) prewarm, when there was one.
    if let Ok(p) =
        api.get("/prewarm").call().map_err(anyhow::Error::from).and_then(|r| Ok(r.into_json::<serde_json::Value>()?))
    {
        let n = |k: &str| p[k].as_u64().unwrap_or(0);
        if let Some(from) = p["from"].as_str().filter(|f| !f.is_empty()) {
            let state = match (p["running"].as_bool().unwrap_or(false), p["error"].as_str()) {
                (true, _) => "running".to_string(),
                (false, Some(e)) => format!("stopped: {e}"),
                (false, None) => "done".to_string(),
            };
            println!(
                "prewarm from {from}: {state}; {} of {} blocks loaded, {} already cached",
                n("loaded_blocks"),
                n("planned_blocks"),
                n("skipped_blocks")
            );
        }
    }
    verdict()
}
