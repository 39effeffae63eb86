//! Failover with prewarming (Nutanix prewarming slides, "Experiment Scenario"): the VMs
//! run on a source node whose cache state is snapshotted every n requests or t seconds;
//! at `at` the node fails and the VMs resume at once on an idle destination node with a
//! cold cache, prewarmed from the source's last snapshots before their I/O resumes.
//! Baselines: `cold` (no prewarming) and `warm` (the VMs keep their cache, as if nothing
//! failed). The snapshots, scores, plan and pacing are the `prewarm` crate's; this file is
//! the scenario section, the source's snapshot history and the figures the slides report.
//!
//! ```toml
//! [failover]
//! at = "30min"               # trace time of the failure
//! mode = "prewarm"           # prewarm | cold | warm
//! snapshot_every = "100000req" # or a duration ("60s")
//! snapshot_max_gap = "5min"  # with a request rate: also after this long without one
//! snapshots_kept = 5         # m, the history the scores read
//! heuristic = "k-recent"     # k-recent | k-frequent | k-frerecent-lnr | k-frerecent-qdr
//! limit = "50%"              # prewarm set size, of the destination cache
//! rate = "100MiB"            # per second; "unlimited"
//! busy_rate = "16MiB"        # per second while the VM's disk serves it (default rate / 4)
//! max_read = "128KiB"        # neighbouring blocks coalesced into reads up to this size
//! minute = "60s"             # the slides' minute (5/15/30-minute averages), scaled runs
//! online = false             # per vDisk: whether, how much, how fast (prewarm::online)
//! protect = "5min"           # prewarmed blocks kept until first touch or this long
//! yield_to_clients = true    # prewarm reads yield to the VMs' I/O (false: to compare)
//! depth = 1                  # prewarm reads in flight on an idle VM's disk (more: faster
//!                            # loads on parallel stores, longer waits on a disk)
//! ```

use crate::metrics::WindowRow;
use cachevisor_engine::Engine;
use cachevisor_prewarm::{capture, online, Activity, Heuristic, LoaderConfig, PaceConfig, Progress, Ranking, Snapshot};
use cachevisor_trace::units::parse_duration_ns;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// What happens to the VMs' caches at the failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailoverMode {
    /// A cold destination cache, prewarmed from the source's snapshots.
    #[default]
    Prewarm,
    /// A cold destination cache, not prewarmed (the lower bracket).
    Cold,
    /// No failure: the VMs keep their cache (the upper bracket).
    Warm,
}

/// `[failover]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FailoverSection {
    /// Trace time of the failure.
    pub at: String,
    /// Prewarm, cold or warm.
    pub mode: FailoverMode,
    /// Snapshot rate: `"100000req"` (requests) or a duration.
    pub snapshot_every: String,
    /// With a request-count rate, also take a snapshot when this much virtual time passed
    /// since the last (a set with few requests still gets a history); none by default.
    pub snapshot_max_gap: Option<String>,
    /// Snapshots kept (the history scored).
    pub snapshots_kept: usize,
    /// Scoring heuristic.
    pub heuristic: Heuristic,
    /// Prewarm set size limit, percent of the destination cache.
    pub limit: String,
    /// Prewarm rate per second (`"unlimited"`).
    pub rate: String,
    /// Rate per second while a VM's disk serves its requests (default: rate / 4, or
    /// 64 MiB with an unlimited rate).
    pub busy_rate: Option<String>,
    /// Largest coalesced read.
    pub max_read: String,
    /// How long the slides' "minute" lasts in this run (their 5-, 15- and 30-minute
    /// averages), for runs scaled down in time.
    pub minute: String,
    /// Prewarm reads yield to the VMs' own I/O: at most one in flight on a busy disk, at
    /// `busy_rate`. `false`: four in flight on any disk at the full rate (to measure what
    /// yielding buys).
    pub yield_to_clients: bool,
    /// Prewarm reads in flight on a disk whose VM is idle (on a busy one: 1 when
    /// yielding).
    pub depth: u32,
    /// Decide per vDisk whether, how much and how fast from what the source saw
    /// (`prewarm::online`), instead of `limit` and `rate`.
    pub online: bool,
    /// Protect each prewarmed block from eviction until its first touch or this long
    /// after it is loaded (`"5min"`); none when absent.
    pub protect: Option<String>,
}

impl Default for FailoverSection {
    fn default() -> Self {
        FailoverSection {
            at: "30min".into(),
            mode: FailoverMode::Prewarm,
            snapshot_every: "100000req".into(),
            snapshot_max_gap: None,
            snapshots_kept: 5,
            heuristic: Heuristic::Recent,
            limit: "100%".into(),
            rate: "unlimited".into(),
            busy_rate: None,
            max_read: "128KiB".into(),
            minute: "60s".into(),
            yield_to_clients: true,
            depth: 1,
            online: false,
            protect: None,
        }
    }
}

/// When snapshots are taken.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum SnapshotEvery {
    /// Every this many requests.
    Requests(u64),
    /// Every this many ns of virtual time.
    Nanos(u64),
}

/// `[failover]` with its strings resolved.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FailoverPlan {
    /// Failure time, ns.
    pub at_ns: u64,
    /// Mode.
    pub mode: FailoverMode,
    /// Snapshot rate.
    pub every: SnapshotEvery,
    /// Longest time between snapshots, ns (with a request-count rate).
    pub max_gap_ns: Option<u64>,
    /// History length.
    pub kept: usize,
    /// Heuristic.
    pub heuristic: Heuristic,
    /// Size limit as a fraction of the destination cache.
    pub limit: f64,
    /// Pacing.
    pub pace: PaceConfig,
    /// Largest read, blocks.
    pub max_run: u32,
    /// The slides' minute, s.
    pub minute_s: f64,
    /// Prewarm reads yield to client I/O.
    pub yields: bool,
    /// Reads in flight on an idle VM's disk.
    pub depth: u32,
    /// Online parameters.
    pub online: bool,
    /// Protection of prewarmed blocks, ms.
    pub protect_ms: Option<u32>,
}

impl FailoverSection {
    /// Checks every value; the message names the key.
    pub fn resolve(&self, block_size: u64) -> Result<FailoverPlan, String> {
        let at_ns = parse_duration_ns(&self.at).map_err(|e| format!("failover.at: {e}"))?;
        let every = match self.snapshot_every.trim().strip_suffix("req") {
            Some(n) => SnapshotEvery::Requests(n.trim().parse::<u64>().ok().filter(|&n| n > 0).ok_or(format!(
                "failover.snapshot_every: `{}` is not a positive request count",
                self.snapshot_every
            ))?),
            None => SnapshotEvery::Nanos(parse_duration_ns(&self.snapshot_every).ok().filter(|&n| n > 0).ok_or(
                format!("failover.snapshot_every: `{}` is neither `<n>req` nor a duration > 0", self.snapshot_every),
            )?),
        };
        let max_gap_ns = match &self.snapshot_max_gap {
            Some(g) => Some(
                parse_duration_ns(g)
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or(format!("failover.snapshot_max_gap: `{g}` is not a duration > 0"))?,
            ),
            None => None,
        };
        let protect_ms = cachevisor_prewarm::settings::protect_ms("failover", self.protect.as_deref())?;
        if !(1..=64).contains(&self.depth) {
            return Err(format!("failover.depth: {} is outside 1..=64", self.depth));
        }
        if self.snapshots_kept == 0 {
            return Err("failover.snapshots_kept: must be ≥ 1".into());
        }
        let p = cachevisor_prewarm::settings::resolve(
            "failover",
            &self.limit,
            &self.rate,
            self.busy_rate.as_deref(),
            &self.max_read,
            block_size,
        )?;
        let (limit, pace, max_run) = (p.limit, p.pace, p.max_run);
        let minute_s = cachevisor_prewarm::settings::minute_s("failover", &self.minute)?;
        Ok(FailoverPlan {
            at_ns,
            mode: self.mode,
            every,
            max_gap_ns,
            kept: self.snapshots_kept,
            heuristic: self.heuristic,
            limit,
            pace,
            max_run,
            minute_s,
            yields: self.yield_to_clients,
            depth: self.depth,
            online: self.online,
            protect_ms,
        })
    }
}

impl FailoverPlan {
    /// The loader's settings for `block_size`-byte blocks.
    pub(crate) fn loader(&self, block_size: u64) -> LoaderConfig {
        if self.yields {
            LoaderConfig { pace: self.pace, block_size, busy_depth: 1, idle_depth: self.depth }
        } else {
            let pace = PaceConfig { busy_rate: self.pace.rate.unwrap_or(u64::MAX), ..self.pace };
            LoaderConfig { pace, block_size, busy_depth: self.depth, idle_depth: self.depth }
        }
    }
}

/// The source node's snapshot history.
#[derive(Debug, Default)]
pub(crate) struct History {
    pub(crate) snapshots: VecDeque<Snapshot>,
    taken: u64,
    requests: u64,
    next_at_ns: u64,
    last_at_ns: u64,
}

impl History {
    /// Counts a request issued at `now`, and takes a snapshot of `engine` when one is due.
    pub(crate) fn observe(&mut self, plan: &FailoverPlan, now: u64, engine: &Engine, names: &[String]) {
        self.requests += 1;
        let due = match plan.every {
            SnapshotEvery::Requests(n) => {
                self.requests.is_multiple_of(n) || plan.max_gap_ns.is_some_and(|g| now >= self.last_at_ns + g)
            }
            SnapshotEvery::Nanos(t) => {
                if self.next_at_ns == 0 {
                    self.next_at_ns = t;
                }
                now >= self.next_at_ns && {
                    self.next_at_ns = now - now % t + t;
                    true
                }
            }
        };
        if due {
            self.last_at_ns = now;
            self.taken += 1;
            self.snapshots.push_back(capture(engine, self.taken, self.requests, names));
            while self.snapshots.len() > plan.kept {
                self.snapshots.pop_front();
            }
        }
    }

    /// Snapshots taken in all.
    pub(crate) fn taken(&self) -> u64 {
        self.taken
    }
}

/// What the failover did and the hit ratios after it (the slides' metrics).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailoverReport {
    /// Mode.
    pub mode: FailoverMode,
    /// Failure time, s.
    pub at_s: f64,
    /// Snapshots the source took before failing.
    pub snapshots_taken: u64,
    /// Objects in the prewarm set.
    pub prewarm_set: u64,
    /// Reads planned (after coalescing).
    pub prewarm_reads: u64,
    /// The loader's progress (blocks loaded, skipped, bytes, start and end).
    pub loaded_blocks: u64,
    /// Blocks found cached already.
    pub skipped_blocks: u64,
    /// Bytes read from backing for prewarming (the extra backing reads).
    pub prewarm_bytes: u64,
    /// Seconds from the failure to the end of prewarming, if it ended.
    pub prewarm_seconds: Option<f64>,
    /// Block hit ratio of the source over the span before the failure as long as the
    /// longest average below (or all of it).
    pub source_hit_ratio: f64,
    /// Hit ratio in the first second after the failure.
    pub instant_hit_ratio: f64,
    /// Averages over the first 5, 15 and 30 minutes (scaled by `minute_s`).
    pub avg_hit_ratio: [f64; 3],
    /// Seconds a "minute" lasts in this run (60 unless durations are scaled down).
    pub minute_s: f64,
    /// Seconds from the failure until a 10-second hit ratio first reaches 90% of the
    /// source's, if it does.
    pub to_90pct_s: Option<f64>,
    /// Client requests completed in the first minute after the failure, and their mean,
    /// 99th and 99.9th percentile latency (ms): what prewarming costs the VMs.
    pub first_minute_requests: u64,
    /// Mean latency in the first minute, ms.
    pub first_minute_mean_ms: f64,
    /// 99th percentile latency in the first minute, ms.
    pub first_minute_p99_ms: f64,
    /// 99.9th percentile latency in the first minute, ms.
    pub first_minute_p999_ms: f64,
    /// Sets the online parameters did not prewarm (their working set comes back by
    /// itself within a minute).
    pub online_skipped: Vec<String>,
}

impl FailoverReport {
    /// The figures from the run's windows (all VMs summed per window).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn build(
        plan: &FailoverPlan,
        windows: &[WindowRow],
        snapshots_taken: u64,
        prewarm_set: u64,
        prewarm_reads: u64,
        progress: Option<Progress>,
        first_minute: Option<&hdrhistogram::Histogram<u64>>,
    ) -> FailoverReport {
        let minute_s = plan.minute_s;
        let at = plan.at_ns as f64 / 1e9;
        let per = summed_windows(windows);
        let ratio_in = |from: f64, to: f64| {
            let (a, h) = per
                .iter()
                .filter(|w| w.0 > from + 1e-9 && w.0 <= to + 1e-9)
                .fold((0, 0), |(a, h), w| (a + w.1, h + w.2));
            if a == 0 {
                0.0
            } else {
                h as f64 / a as f64
            }
        };
        let longest = 30.0 * minute_s;
        let source = ratio_in((at - longest).max(0.0), at);
        let after: Vec<&(f64, u64, u64)> = per.iter().filter(|w| w.0 > at + 1e-9).collect();
        let mut to_90 = None;
        for (i, w) in after.iter().enumerate() {
            let span: Vec<_> = after[..=i].iter().filter(|x| x.0 > w.0 - 10.0 + 1e-9).collect();
            let (a, h) = span.iter().fold((0, 0), |(a, h), x| (a + x.1, h + x.2));
            if a > 0 && h as f64 / a as f64 >= 0.9 * source {
                to_90 = Some(w.0 - at);
                break;
            }
        }
        let p = progress.unwrap_or_default();
        FailoverReport {
            mode: plan.mode,
            at_s: at,
            snapshots_taken,
            prewarm_set,
            prewarm_reads,
            loaded_blocks: p.loaded,
            skipped_blocks: p.skipped,
            prewarm_bytes: p.bytes_read,
            prewarm_seconds: p.finished_ns.map(|t| t.saturating_sub(plan.at_ns) as f64 / 1e9),
            source_hit_ratio: source,
            instant_hit_ratio: ratio_in(at, at + 1.0),
            avg_hit_ratio: [5.0, 15.0, 30.0].map(|m| ratio_in(at, at + m * minute_s)),
            minute_s,
            to_90pct_s: to_90,
            first_minute_requests: first_minute.map_or(0, |h| h.len()),
            first_minute_mean_ms: first_minute.map_or(0.0, |h| h.mean() / 1e6),
            first_minute_p99_ms: first_minute.map_or(0.0, |h| h.value_at_quantile(0.99) as f64 / 1e6),
            first_minute_p999_ms: first_minute.map_or(0.0, |h| h.value_at_quantile(0.999) as f64 / 1e6),
            online_skipped: Vec::new(),
        }
    }
}

/// (end time s, block accesses, hits) of each window, all VMs summed, in time order.
pub fn summed_windows(windows: &[WindowRow]) -> Vec<(f64, u64, u64)> {
    let mut per: Vec<(f64, u64, u64)> = Vec::new();
    for w in windows {
        let hits = (w.hit_ratio * w.accesses as f64).round() as u64;
        match per.last_mut() {
            Some(last) if last.0 == w.t_end_s => {
                last.1 += w.accesses;
                last.2 += hits;
            }
            _ => per.push((w.t_end_s, w.accesses, hits)),
        }
    }
    per
}

/// The prewarm set and rate from the online parameters (`prewarm::online`): each set's
/// hit ratio, IOPS and blocks per request over the source's windows ending after
/// `from_s`, its working set from the last snapshot, a minute lasting `minute_s`; at most
/// `limit` objects in all.
pub(crate) fn online_choice(
    ranking: &Ranking,
    last: Option<&Snapshot>,
    windows: &[WindowRow],
    from_s: f64,
    minute_s: f64,
    block_size: u64,
    limit: u64,
) -> online::OnlineChoice {
    let span = windows.iter().filter(|w| w.t_end_s > from_s).map(|w| w.t_end_s).fold(0.0f64, f64::max) - from_s;
    let decisions: Vec<_> = ranking
        .sets
        .iter()
        .map(|name| {
            let (mut req, mut acc, mut hits) = (0u64, 0u64, 0.0f64);
            for w in windows.iter().filter(|w| w.t_end_s > from_s && &w.vm == name) {
                req += w.requests;
                acc += w.accesses;
                hits += w.hit_ratio * w.accesses as f64;
            }
            let seen = Activity {
                requests: req,
                accesses: acc,
                hits: (hits.round() as u64).min(acc),
                span_ns: (span.max(0.0) * 1e9) as u64,
            };
            let wss = last.and_then(|s| s.sets.get(name)).map_or(0, |b| b.len());
            online::decide(&online::Observation::of(&seen, wss), block_size, minute_s)
        })
        .collect();
    online::choose(ranking, &decisions, limit)
}
