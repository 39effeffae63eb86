//! Which replay model a run uses ("speed of what users run"): the **full**
//! model — the engine's asynchronous face on device models in virtual time, with
//! latencies, queueing, write-back timing and closed-loop feedback — or the **cache**
//! model — each request on the engine's synchronous face in trace order, hits and misses
//! per VM and per window, the bytes each device would move, and no device, queue or
//! latency at all (what libCacheSim's `cachesim` computes). `replay.model` (`--model`)
//! names one; `auto`, the default, takes the cache model whenever nothing the scenario
//! asks for depends on time the devices would take, and says why it chose either.
//!
//! What the cache model cannot answer, and so makes `auto` take the full model: latency
//! figures (asked for by `model = "full"`), a failover with prewarming, phases, the
//! daemon's persistent mode, the lookahead oracle, repeated closed-loop passes, the DSF
//! object model, open loop (requests overlap as the trace's times and the devices' speed
//! make them: a re-reference while its fill is in flight waits for it), an allocator
//! that reallocates every window (its windows are spans of device time), more than one
//! VM in closed loop (their requests interleave by their latencies), and write-back
//! timing — dirty blocks the background flusher or write-back ahead of eviction clean in
//! device time — unless no request can leave a block dirty (no write-back policy
//! anywhere, or only oracleGeneral traces, which carry reads only).
//!
//! Where `auto` takes the cache model (closed loop, one VM) the two agree on hit ratios:
//! exactly at queue depth 1, but for a multi-block request whose own blocks are still in
//! flight when it evicts (S3-FIFO on the CloudPhysics trace: 2e-5); within
//! 1e-4 at queue depth 4, where a victim with ops in flight is skipped (the bundled
//! traces, every replacement policy: `tests/cache_model.rs`).

use crate::scenario::{ObjectModel, ReplayMode, Scenario};
use cachevisor_engine::WritePolicy;
use cachevisor_trace::Format;
use serde::{Deserialize, Serialize};

/// `replay.model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelChoice {
    /// The cache model when the scenario allows it (see the top comment), else the full.
    #[default]
    Auto,
    /// The cache model; a scenario that needs the full model is refused, naming why.
    Cache,
    /// The full model.
    Full,
}

impl std::str::FromStr for ModelChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(ModelChoice::Auto),
            "cache" => Ok(ModelChoice::Cache),
            "full" => Ok(ModelChoice::Full),
            _ => Err(format!("model `{s}`: expected auto, cache or full")),
        }
    }
}

/// The model a run used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Model {
    /// Devices, queues and latency in virtual time.
    #[default]
    Full,
    /// Hits and misses in trace order; no devices, no latency.
    Cache,
}

impl Model {
    /// Its name in results and tables.
    pub fn name(self) -> &'static str {
        match self {
            Model::Full => "full",
            Model::Cache => "cache",
        }
    }
}

/// Why `sc` needs the full model, if it does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NeedsFull {
    /// Something the cache model cannot run at all (a failover, the persistent mode…).
    Always(&'static str),
    /// Something whose figures depend on device time (write-back timing, the interleaving
    /// of several VMs in closed loop): `auto` takes the full model; asked for, the cache
    /// model runs without it and says so.
    ForTiming(&'static str),
}

/// The first thing in `sc` only the full model answers, if any; `dynamic`: the allocator
/// reallocates every window.
pub fn needs_full(sc: &Scenario, dynamic: bool) -> Option<NeedsFull> {
    let c = &sc.cache;
    let closed = sc.replay.mode == ReplayMode::Closed;
    Some(if sc.failover.is_some() {
        NeedsFull::Always("a failover with prewarming ([failover])")
    } else if !sc.phase.is_empty() {
        NeedsFull::Always("phases ([[phase]]) change settings at virtual times")
    } else if c.persistent {
        NeedsFull::Always("the persistent mode (cache.persistent) times commits on the SSD")
    } else if c.lookahead {
        NeedsFull::Always("the lookahead oracle (cache.lookahead) reads windows of virtual time")
    } else if sc.replay.repeat_for.is_some() {
        NeedsFull::Always("repeated passes (replay.repeat_for) last a span of virtual time")
    } else if c.objects != ObjectModel::Blocks {
        NeedsFull::Always("the DSF object model (cache.objects)")
    } else if !closed {
        NeedsFull::ForTiming("open loop (requests overlap as the trace's times and the devices' speed make them)")
    } else if dynamic {
        NeedsFull::ForTiming("an allocator reallocating every window in closed loop (windows of device time)")
    } else if closed && vm_count(sc) != Some(1) {
        NeedsFull::ForTiming("several VMs in closed loop (their requests interleave by their latencies)")
    } else if writeback_timed(sc) && may_dirty(sc) {
        NeedsFull::ForTiming("write-back timing (the flusher and write-back ahead clean dirty blocks in device time)")
    } else {
        return None;
    })
}

/// The model `sc` runs under, with why; `Err` when `model = "cache"` was asked for a
/// scenario the cache model cannot run.
pub fn choose(sc: &Scenario, dynamic: bool) -> Result<(Model, String), String> {
    let full = needs_full(sc, dynamic);
    match (sc.replay.model, full) {
        (ModelChoice::Full, _) => Ok((Model::Full, "asked for (replay.model = \"full\")".into())),
        (ModelChoice::Cache, Some(NeedsFull::Always(why))) => {
            Err(format!("replay.model = \"cache\": this scenario needs the full model: {why}"))
        }
        (ModelChoice::Cache, Some(NeedsFull::ForTiming(why))) => Ok((
            Model::Cache,
            format!("asked for (replay.model = \"cache\"); not modelled: {why} — requests in trace order, dirty blocks written back at eviction"),
        )),
        (ModelChoice::Cache, None) => Ok((Model::Cache, "asked for (replay.model = \"cache\")".into())),
        (ModelChoice::Auto, Some(NeedsFull::Always(why) | NeedsFull::ForTiming(why))) => {
            Ok((Model::Full, format!("needed for {why}")))
        }
        (ModelChoice::Auto, None) => Ok((
            Model::Cache,
            "nothing asked depends on device time (replay.model = \"full\" for latency figures)".into(),
        )),
    }
}

/// VMs known before the replay: the generated ones, or one per trace file in `file` mode
/// (the simulator's default; or in `device` mode when every file is oracleGeneral, which
/// names no device); else unknown (`None`).
fn vm_count(sc: &Scenario) -> Option<usize> {
    let by_file = sc.trace.vm_mode.unwrap_or(cachevisor_trace::VmMode::File) == cachevisor_trace::VmMode::File
        || sc.trace.files.iter().all(|f| !carries_writes(sc, f));
    match (sc.trace.files.len(), sc.synthetic.len()) {
        (0, n) => Some(n),
        (f, 0) if by_file => Some(f),
        _ => None,
    }
}

/// Whether the background flusher or write-back ahead of eviction is on.
fn writeback_timed(sc: &Scenario) -> bool {
    let c = &sc.cache;
    c.writeback_ahead > 0 || cachevisor_trace::units::parse_size(&c.flush_rate).map_or(true, |r| r > 0)
}

/// Whether some request can leave a block dirty: a write-back policy somewhere, and an
/// input that carries writes.
fn may_dirty(sc: &Scenario) -> bool {
    let wb = sc.cache.write_policy == WritePolicy::Wb || sc.vm.iter().any(|v| v.write_policy == Some(WritePolicy::Wb));
    wb && (!sc.synthetic.is_empty() || sc.trace.files.iter().any(|f| carries_writes(sc, f)))
}

/// Whether trace `f` may hold writes (and device keys): any format but oracleGeneral
/// (given, or detected).
fn carries_writes(sc: &Scenario, f: &std::path::Path) -> bool {
    let format = sc.trace.format.map_or_else(|| Format::detect(f).ok(), Some);
    format != Some(Format::OracleGeneral)
}
