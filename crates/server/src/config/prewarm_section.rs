//! `[prewarm]` and `[log]`: cache-state snapshots and prewarming (the Nutanix study),
//! and what the daemon logs.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// What is logged: `error`, `warn`, `info`, `debug`, `trace`, or directives per module
    /// as RUST_LOG takes them (`info,cachevisor_server::vssd=debug`); RUST_LOG, when set,
    /// wins. A reload changes it.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { level: "info".into() }
    }
}

/// `[prewarm]`: snapshots of the cache's state on a schedule and at shutdown, and
/// prewarming a cold cache from another cache's snapshots (the Nutanix study; see
/// `docs/prewarm.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrewarmConfig {
    /// Where this daemon writes its snapshots (default METADATA/snapshots).
    pub snapshot_dir: Option<PathBuf>,
    /// Time between snapshots (`60s`), or requests served between them (`100000req`);
    /// `0` = at shutdown only.
    pub snapshot_every: String,
    /// Snapshots kept (the history a prewarm scores).
    pub snapshots_kept: usize,
    /// Prewarm at start from another cache's snapshot directory (`serve --prewarm-from`).
    pub from: Option<PathBuf>,
    /// Scoring heuristic.
    pub heuristic: cachevisor_prewarm::Heuristic,
    /// Prewarm set size limit, percent of this cache.
    pub limit: String,
    /// Prewarm rate per second (`unlimited` allowed).
    pub rate: String,
    /// Rate while a vDisk serves its clients (default: rate / 4).
    pub busy_rate: Option<String>,
    /// Largest coalesced read (default 128KiB, or one block if blocks are larger).
    pub max_read: Option<String>,
    /// Decide per vDisk whether, how much and how fast from the activity the source's
    /// snapshots carry (`prewarm::online`), instead of `limit` and `rate`.
    pub online: bool,
    /// Keep each prewarmed block from eviction until its first touch or this long after
    /// it is loaded (`"5min"`); none when absent.
    pub protect: Option<String>,
    /// How long the slides' minute lasts for `online` (`60s`): a working set back by
    /// itself within one is not prewarmed, and the source's last five are looked at.
    /// Shorter for scaled-down demos and tests, as the simulator's `failover.minute`.
    pub minute: String,
}

impl Default for PrewarmConfig {
    fn default() -> Self {
        PrewarmConfig {
            snapshot_dir: None,
            snapshot_every: "60s".into(),
            snapshots_kept: 10,
            from: None,
            heuristic: cachevisor_prewarm::Heuristic::Recent,
            limit: "100%".into(),
            rate: "64MiB".into(),
            busy_rate: None,
            max_read: None,
            online: false,
            protect: None,
            minute: "60s".into(),
        }
    }
}

/// When the daemon snapshots its cache's state (besides at a clean shutdown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotSchedule {
    /// Only at shutdown.
    AtShutdown,
    /// Every this many ns.
    Every(u64),
    /// Every this many requests served (the slides' "every n requests").
    Requests(u64),
}

impl PrewarmConfig {
    /// The snapshot schedule and the pacing, checked.
    pub fn resolve(&self, block_size: u64) -> Result<(SnapshotSchedule, cachevisor_prewarm::Pacing), String> {
        let every = self.snapshot_every.trim();
        let schedule = match every.strip_suffix("req") {
            Some(n) => SnapshotSchedule::Requests(
                n.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or(format!("prewarm.snapshot_every: `{every}` is not a positive request count"))?,
            ),
            None => match cachevisor_trace::units::parse_duration_ns(every)
                .map_err(|e| format!("prewarm.snapshot_every: {e} (or `<n>req`)"))?
            {
                0 => SnapshotSchedule::AtShutdown,
                ns if ns < 1_000_000_000 => {
                    return Err(format!("prewarm.snapshot_every: `{every}` is under 1s (or 0: at shutdown only)"))
                }
                ns => SnapshotSchedule::Every(ns),
            },
        };
        if !(1..=10_000).contains(&self.snapshots_kept) {
            return Err(format!("prewarm.snapshots_kept: {} is outside 1 to 10000", self.snapshots_kept));
        }
        let p = cachevisor_prewarm::settings::resolve(
            "prewarm",
            &self.limit,
            &self.rate,
            self.busy_rate.as_deref(),
            self.max_read.as_deref().unwrap_or(if block_size > 128 << 10 { "1MiB" } else { "128KiB" }),
            block_size,
        )?;
        self.protect_ms()?;
        self.minute_s()?;
        Ok((schedule, p))
    }

    /// `minute` in seconds, checked.
    pub fn minute_s(&self) -> Result<f64, String> {
        cachevisor_prewarm::settings::minute_s("prewarm", &self.minute)
    }

    /// `protect` in ms, checked (`None`: no protection).
    pub fn protect_ms(&self) -> Result<Option<u32>, String> {
        cachevisor_prewarm::settings::protect_ms("prewarm", self.protect.as_deref())
    }
}
