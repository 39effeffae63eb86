//! `cachevisor cache detach | attach | status | add | remove`: replacing the cache SSD
//! under a running daemon (`POST /cache/detach`, `/cache/attach`, `GET /cache`), and
//! adding a cache device or taking one of several out (`POST /cache/devices/add`,
//! `/cache/devices/remove`). A detach writes every
//! dirty block back and lets go of the cache file, the vDisks passing through to their
//! backing stores meanwhile (VMs keep running); it is followed with a progress bar of the
//! blocks still cached. An attach brings a new, empty cache file in at `cache.path` and
//! prewarms it from the newest snapshot.

use crate::exit_status::{api_error, exit, FAILED};
use crate::progress::Progress;
use cachevisor_server::daemon::CacheReport;
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

/// `cache` subcommands.
#[derive(Debug, Subcommand)]
pub enum CacheCmd {
    /// Write every dirty block back and let go of the cache file (the vDisks pass through
    /// to their backing stores until `cache attach`): the SSD can then be removed.
    Detach(SwapArgs),
    /// Bring a new (empty) cache file in at `cache.path` and cache again; prewarm it from
    /// the newest snapshot.
    Attach(AttachArgs),
    /// Show whether the cache is attached, its size (a reload of `cache.size` resizes it
    /// online, up to `cache.max_size`), and its cached and dirty blocks.
    Status(SwapArgs),
    /// Add a cache device under running clients: the allocators see the larger cache at
    /// once and new blocks may land on it. Later starts keep it.
    Add(AddArgs),
    /// Take one of the cache's devices (`[[cache.device]]`) out under running clients:
    /// its clean blocks move to the other devices, its dirty ones are written back, then
    /// its descriptor is closed and it can be pulled. Later starts leave it out.
    Remove(RemoveArgs),
}

/// Arguments of `cache add`.
#[derive(Debug, Args)]
#[command(after_help = crate::exit_status::HELP)]
pub struct AddArgs {
    #[command(flatten)]
    pub common: SwapArgs,
    /// The file (created when missing, mode 0600) or block device.
    pub device: PathBuf,
    /// How much of it the cache uses ("400GiB").
    #[arg(long)]
    pub size: String,
}

/// Arguments of `cache remove`.
#[derive(Debug, Args)]
#[command(after_help = crate::exit_status::HELP)]
pub struct RemoveArgs {
    #[command(flatten)]
    pub common: SwapArgs,
    /// The device's path, as `[[cache.device]] path` names it (or any path to the same
    /// file).
    pub device: PathBuf,
}

/// Arguments every `cache` subcommand takes.
#[derive(Debug, Args)]
#[command(after_help = crate::exit_status::HELP)]
pub struct SwapArgs {
    #[command(flatten)]
    pub call: crate::api_target::ApiCallArgs,
}

/// Arguments of `cache attach`.
#[derive(Debug, Args)]
#[command(after_help = crate::exit_status::HELP)]
pub struct AttachArgs {
    #[command(flatten)]
    pub common: SwapArgs,
    /// Start cold: no prewarm.
    #[arg(long)]
    pub no_prewarm: bool,
    /// Prewarm from the snapshots in this directory (default: the daemon's snapshot
    /// directory).
    #[arg(long, conflicts_with = "no_prewarm")]
    pub prewarm_from: Option<PathBuf>,
}

/// Runs the command.
pub fn run(c: CacheCmd) -> anyhow::Result<()> {
    match c {
        CacheCmd::Status(SwapArgs { call: a }) => {
            let api = a.api.client()?;
            let url = api.url("/cache");
            let r: CacheReport = api.get("/cache").call().map_err(|e| api_error(&url, e))?.into_json()?;
            print(&r, a.json)
        }
        CacheCmd::Detach(a) => detach(a),
        CacheCmd::Attach(a) => attach(a),
        CacheCmd::Remove(a) => remove(a),
        CacheCmd::Add(a) => add(a),
    }
}

/// The report's entry for the device at `path` (the daemon's spelling, or the same file).
fn device_of<'a>(
    r: &'a CacheReport,
    path: &std::path::Path,
) -> Option<&'a cachevisor_server::daemon::CacheDeviceReport> {
    let want = std::fs::canonicalize(path).ok();
    r.devices.iter().find(|d| {
        let p = std::path::Path::new(&d.path);
        p == path || (want.is_some() && std::fs::canonicalize(p).ok() == want)
    })
}

fn add(a: AddArgs) -> anyhow::Result<()> {
    let c = a.common.call;
    let token = crate::api_token::resolve(&c.token, &c.token_file, "adding a cache device")?;
    let api = c.api.client()?;
    let url = api.url("/cache/devices/add");
    let path = std::path::absolute(&a.device).unwrap_or(a.device.clone());
    let r: serde_json::Value = api
        .post("/cache/devices/add")
        .set("Authorization", &format!("Bearer {token}"))
        .send_json(serde_json::json!({ "path": path, "size": a.size }))
        .map_err(|e| api_error(&url, e))?
        .into_json()?;
    if c.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    println!("{}", r["added"].as_str().unwrap_or("added"));
    println!("later starts keep it; add it to the configuration file too");
    Ok(())
}

fn remove(a: RemoveArgs) -> anyhow::Result<()> {
    let c = a.common.call;
    let token = crate::api_token::resolve(&c.token, &c.token_file, "removing a cache device")?;
    let api = c.api.client()?;
    let url = api.url("/cache/devices/remove");
    // The daemon resolves relative paths against its own directory: send it whole.
    let path = std::path::absolute(&a.device).unwrap_or(a.device.clone());
    let first: CacheReport = api
        .post("/cache/devices/remove")
        .set("Authorization", &format!("Bearer {token}"))
        .send_json(serde_json::json!({ "path": path }))
        .map_err(|e| api_error(&url, e))?
        .into_json()?;
    let state_url = api.url("/cache");
    let start = device_of(&first, &path).map_or(1, |d| d.cached_blocks.max(1));
    let mut bar = Progress::new("emptying the device (blocks)");
    let mut r = first;
    let removal = loop {
        let d = device_of(&r, &path);
        match d.and_then(|d| d.removal) {
            Some(x) if x.state == cachevisor_datapath::RemovalState::Removed => break x,
            Some(_) => bar.update(start.saturating_sub(d.map_or(0, |d| d.cached_blocks)), Some(start)),
            None => {
                bar.finish();
                let why = r.error.clone().unwrap_or_else(|| "the removal stopped (see the daemon's log)".into());
                return Err(exit(FAILED, why));
            }
        }
        std::thread::sleep(Duration::from_millis(200));
        r = api.get("/cache").call().map_err(|e| api_error(&state_url, e))?.into_json()?;
    };
    bar.finish();
    if c.json {
        return print(&r, true);
    }
    println!(
        "cache device {} removed: {} blocks moved to the other devices, {} written back, {} dropped; its descriptor is closed and it can be pulled",
        path.display(),
        removal.moved,
        removal.written_back,
        removal.blocks.saturating_sub(removal.moved)
    );
    println!("later starts leave it out; take it out of the configuration file too");
    Ok(())
}

fn print(r: &CacheReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(r)?);
        return Ok(());
    }
    println!("cache {}: {}", r.path, r.state.as_str());
    let size = |b: u64| cachevisor_trace::units::format_size(b);
    println!("  size {} (up to {} while running: cache.max_size)", size(r.size_bytes), size(r.max_size_bytes));
    println!("  {} blocks cached, {} dirty", r.cached_blocks, r.dirty_blocks);
    for d in &r.devices {
        let state = match d.removal.map(|x| x.state) {
            Some(cachevisor_datapath::RemovalState::Removed) => " — removed (closed; left out at the next start)",
            Some(cachevisor_datapath::RemovalState::Removing) => " — being removed",
            None if d.failed => " — FAILED, dropped (its dirty blocks fail their reads)",
            None => "",
        };
        println!("  device {}: {}, {} blocks cached{state}", d.path, size(d.size_bytes), d.cached_blocks);
    }
    if let Some(m) = &r.mirror {
        println!(
            "  dirty data mirrored: {} blocks with a copy on another device, {} writes went through for want of a mirror slot, {} served from their mirror after a device was dropped, {} mirror writes failed",
            m.mirrored_blocks, m.fallbacks, m.promoted, m.failed_writes
        );
    }
    if let Some(m) = &r.ram {
        println!(
            "  RAM tier: {} blocks, {} held; {} block reads served from it, {} copies written, {} evicted, {} dropped as their blocks changed",
            m.slots, m.used, m.hits, m.fills, m.evictions, m.dropped
        );
    }
    println!(
        "  metadata {}{}",
        r.metadata,
        if r.metadata_with_cache { " (on the cache's file system: it leaves with the SSD)" } else { "" }
    );
    if let Some(d) = &r.detached {
        println!("  last detach: {} blocks written back, {} blocks dropped", d.written_back, d.dropped);
    }
    if let Some(p) = &r.prewarm {
        println!("  last attach: {p}");
    }
    if let Some(e) = &r.error {
        println!("  failed: {e}");
    }
    Ok(())
}

fn detach(SwapArgs { call: a }: SwapArgs) -> anyhow::Result<()> {
    let token = crate::api_token::resolve(&a.token, &a.token_file, "detaching the cache")?;
    let api = a.api.client()?;
    let url = api.url("/cache/detach");
    let first: CacheReport = api
        .post("/cache/detach")
        .set("Authorization", &format!("Bearer {token}"))
        .call()
        .map_err(|e| api_error(&url, e))?
        .into_json()?;
    let state_url = api.url("/cache");
    let start = first.cached_blocks.max(1);
    let mut bar = Progress::new("emptying the cache (blocks)");
    let mut r = first;
    while r.state == cachevisor_datapath::CacheState::Detaching {
        bar.update(start.saturating_sub(r.cached_blocks), Some(start));
        std::thread::sleep(Duration::from_millis(200));
        r = api.get("/cache").call().map_err(|e| api_error(&state_url, e))?.into_json()?;
    }
    bar.finish();
    if r.state != cachevisor_datapath::CacheState::Detached {
        return Err(exit(FAILED, r.error.clone().unwrap_or_else(|| format!("the cache is {}", r.state.as_str()))));
    }
    if a.json {
        return print(&r, true);
    }
    let d = r.detached.unwrap_or_default();
    println!(
        "cache {} detached: {} blocks written back, {} dropped; every vDisk passes through to its backing store",
        r.path, d.written_back, d.dropped
    );
    println!("the SSD can be removed; `cachevisor cache attach` brings a new one in at {}", r.path);
    Ok(())
}

fn attach(a: AttachArgs) -> anyhow::Result<()> {
    let c = a.common.call;
    let token = crate::api_token::resolve(&c.token, &c.token_file, "attaching the cache")?;
    let api = c.api.client()?;
    let url = api.url("/cache/attach");
    let body = serde_json::json!({ "prewarm": !a.no_prewarm, "from": a.prewarm_from });
    let r: CacheReport = api
        .post("/cache/attach")
        .set("Authorization", &format!("Bearer {token}"))
        .send_json(body)
        .map_err(|e| api_error(&url, e))?
        .into_json()?;
    if c.json {
        return print(&r, true);
    }
    println!("cache {} attached", r.path);
    if let Some(p) = &r.prewarm {
        println!("  {p}{}", if p.starts_with("prewarming") { " (follow it: cachevisor prewarm status)" } else { "" });
    }
    Ok(())
}
