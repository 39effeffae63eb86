//! `cachevisor serve`: runs the daemon — VM disks over NBD with the managed SSD cache.
//! Without `--config` it starts the embedded demo configuration under ./var and prints the
//! NBD URIs to connect to. SIGINT/SIGTERM stop cleanly: files fsynced and a metadata checkpoint written.

use anyhow::Context;
use cachevisor_server::{service, systemd};
use clap::Args;
use std::path::PathBuf;

/// Arguments of `serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Configuration file (TOML); the embedded demo configuration when omitted.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// TCP address to listen on (overrides the config), e.g. 127.0.0.1:10809.
    #[arg(long)]
    pub tcp: Option<String>,
    /// Unix socket to listen on (overrides the config).
    #[arg(long)]
    pub unix: Option<PathBuf>,
    /// Record every request to this trace file (replayable with `cachevisor simulate`).
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Format of `--record` (csv keeps vDisk names; any writable trace format).
    #[arg(long, default_value = "csv")]
    pub record_format: String,
    /// Print the embedded default configuration, then every setting with its default and
    /// range (commented), and exit.
    #[arg(long)]
    pub print_default_config: bool,
    /// Check the configuration (every key and value) and exit without starting: no file
    /// is created or opened but the configuration itself (exit 1 naming the key when bad).
    #[arg(long)]
    pub check_config: bool,
    /// Drop this vDisk's dirty cached blocks when they cannot go back to the backing store
    /// they belong to (its backing changed, or it left the config). Their data is lost:
    /// only for an image that is gone for good. Repeat for several vDisks.
    #[arg(long, value_name = "VDISK")]
    pub discard_dirty: Vec<String>,
    /// Prewarm the cache from another cache's snapshot directory (its
    /// `prewarm.snapshot_dir`); VM I/O is served throughout. Follow it with
    /// `cachevisor prewarm status`.
    #[arg(long, value_name = "DIR")]
    pub prewarm_from: Option<PathBuf>,
}

/// Runs the command.
pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    if a.print_default_config {
        print!("{}", cachevisor_server::config::default_with_reference());
        return Ok(());
    }
    let source = cachevisor_server::daemon::reload::ConfigSource {
        path: a.config.clone(),
        tcp: a.tcp.clone(),
        unix: a.unix.clone(),
    };
    if a.config.is_none() {
        // The demo keeps its files under ./var, created here (a config's own paths must
        // exist: cachevisor does not create directories for them).
        std::fs::create_dir_all("var").context("creating ./var for the embedded demo config")?;
    }
    let cfg = source.load().map_err(anyhow::Error::msg)?;
    init_logging(&cfg.log.level)?;
    if a.check_config {
        cfg.resolve().map_err(anyhow::Error::msg)?;
        cachevisor_server::own_files::check_paths(&cfg).map_err(anyhow::Error::msg)?;
        for l in cachevisor_server::vhost_access::report(&cfg) {
            println!("{l}");
        }
        println!("{}: configuration OK ({} vDisks)", source.name(), cfg.vdisk.len());
        return Ok(());
    }
    let opts = cachevisor_server::daemon::StartOptions {
        discard_dirty: a.discard_dirty.clone(),
        prewarm_from: a.prewarm_from.clone(),
        source: Some(source),
        faults: None,
    };
    let running = service::start_with(&cfg, &opts).context("starting the daemon")?;
    if let Some(p) = &a.record {
        let f: cachevisor_trace::Format = a.record_format.parse().map_err(anyhow::Error::msg)?;
        running.daemon.record_to(p, f).with_context(|| format!("--record {}", p.display()))?;
        println!("# recording every request to {} ({})", p.display(), a.record_format);
    }
    let d = &running.daemon;
    println!(
        "# cache: {} ({} in {} blocks, {})",
        cfg.cache.path.display(),
        cachevisor_trace::units::format_size(d.resolved().cache.cache_bytes),
        cachevisor_trace::units::format_size(d.block_size()),
        if d.direct_io() { "O_DIRECT" } else { "through the page cache" }
    );
    let r = running.daemon.recovery();
    if let Some(why) = &r.cold_start {
        println!("# cold start: the cache store is not the one its metadata describes: {why}");
    }
    if r.blocks > 0 {
        let sealed = match r.sealed_blocks {
            0 => String::new(),
            n => format!(", {n} of them sealed with checksums"),
        };
        println!(
            "# warm start: {} blocks cached ({} dirty{sealed}), {} journal records replayed{}",
            r.blocks,
            r.dirty_blocks,
            r.journal_records,
            if r.torn_tail { ", torn tail cut" } else { "" }
        );
    }
    println!(
        "# cache snapshots (for prewarming elsewhere): {} every {}",
        d.snapshot_dir().display(),
        cfg.prewarm.snapshot_every
    );
    let p = d.prewarm_job().progress();
    if p.running {
        println!(
            "# prewarming from {} ({} blocks planned): follow with `cachevisor prewarm status`",
            p.from, p.planned_blocks
        );
    } else if let Some(e) = &p.error {
        println!("# prewarm refused, starting cold: {e}");
    }
    for l in cachevisor_server::vhost_access::report(&cfg) {
        println!("# {l}");
    }
    for u in running.uris() {
        println!("{u}");
    }
    for p in &running.vhost_user {
        let p = std::path::absolute(p).unwrap_or_else(|_| p.clone());
        println!("vhost-user-blk: {}", p.display());
    }
    if let Some((addr, _)) = &running.api {
        let token = match cfg.api.as_ref().and_then(|a| a.token.as_ref()) {
            Some(_) => "api.token in the config".to_string(),
            None => running.daemon.metadata_dir().join("api-token").display().to_string(),
        };
        let scheme = if cfg.api.as_ref().is_some_and(|a| a.tls) { "https" } else { "http" };
        println!("# API: {scheme}://{addr}/vdisks and /metrics (token for changes in {token})");
    }
    use std::io::Write as _;
    std::io::stdout().flush()?;
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]).context("installing signal handlers")?;
    // Under systemd (`Type=notify`): ready now that every export listens and recovery
    // is done, and the watchdog fed while the engine loop ticks.
    let status = format!("serving {} exports", running.daemon.nbd_exports().len());
    systemd::ready(&status);
    if let Some(p) = systemd::start_watchdog(running.daemon.clone()) {
        tracing::info!("systemd watchdog: fed every {:?} while the engine loop runs", p / 2);
    }
    for sig in signals.forever() {
        if sig == SIGHUP {
            // A hang-up never stops a cache holding dirty data: it re-reads the config
            // file and applies what changed (`daemon/reload.rs`), as `cachevisor reload`
            // does — on a thread of its own, so a SIGTERM meanwhile (a vDisk removed by
            // the reload may take a while to write its dirty blocks back) is not held up.
            let (d, status) = (running.daemon.clone(), status.clone());
            std::thread::spawn(move || {
                systemd::reloading();
                match d.reload() {
                    Ok(r) if r.applied.is_empty() => tracing::info!("SIGHUP: {}: nothing changed", r.file),
                    Ok(r) => tracing::info!("SIGHUP: {} reloaded: {}", r.file, r.applied.join("; ")),
                    Err(e) => tracing::error!("SIGHUP: reload refused or stopped: {e}"),
                }
                systemd::ready(&status);
            });
            continue;
        }
        systemd::stopping();
        tracing::info!(sig, "stopping: fsync and checkpoint");
        running.daemon.shutdown().map_err(|e| anyhow::anyhow!("clean stop: {e}"))?;
        break;
    }
    Ok(())
}

/// Logs to journald when systemd connected stderr to the journal (`JOURNAL_STREAM` names
/// stderr's device and inode), with each event's fields as journal fields (`VDISK=vm1`);
/// plain text on stderr otherwise, coloured only on a terminal. The filter is `log.level`
/// (RUST_LOG wins), swapped by a reload (`cachevisor_server::log_filter`).
fn init_logging(level: &str) -> anyhow::Result<()> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let (filter, text) = cachevisor_server::log_filter::filter(level).map_err(|e| anyhow::anyhow!("log.level: {e}"))?;
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let registry = tracing_subscriber::registry().with(filter);
    let journald = under_journald().then(tracing_journald::layer).and_then(Result::ok);
    let _ = match journald {
        Some(j) => {
            // Syslog's levels: info is 6 (tracing-journald makes it 5, notice).
            let levels = tracing_journald::PriorityMappings {
                info: tracing_journald::Priority::Informational,
                debug: tracing_journald::Priority::Debug,
                ..tracing_journald::PriorityMappings::new()
            };
            let j =
                j.with_field_prefix(None).with_syslog_identifier("cachevisor".into()).with_priority_mappings(levels);
            registry.with(j).try_init()
        }
        None => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    // Colour only on a terminal: a log written to a file or a pipe stays plain text.
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
            )
            .try_init(),
    };
    cachevisor_server::log_filter::install(
        Box::new(move |f| {
            let _ = handle.reload(f);
        }),
        &text,
    );
    Ok(())
}

/// Whether stderr is the journal stream systemd set up for this service.
fn under_journald() -> bool {
    let Ok(v) = std::env::var("JOURNAL_STREAM") else { return false };
    let Some((dev, ino)) = v.split_once(':') else { return false };
    let Ok(st) = nix::sys::stat::fstat(std::io::stderr()) else { return false };
    dev.parse::<u64>().is_ok_and(|d| d == st.st_dev) && ino.parse::<u64>().is_ok_and(|i| i == st.st_ino)
}
