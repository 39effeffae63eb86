//! The daemon's policy: the interval controller (the same code the simulator runs) fed
//! by the data path's hooks — each request observed as it is submitted, each ended
//! interval (the engine's timer, `Event::Interval`) turned into a decision applied as an
//! engine job — and the drain of vDisks in pass-through.

use cachevisor_datapath::ExportStats;
use cachevisor_engine::{Engine, Output};
use cachevisor_policy::allocator::Decision;
use cachevisor_policy::controller::{self, Controller, VmSettings, WindowCounts};
use cachevisor_policy::passthrough_drain::PassThroughDrain;
use cachevisor_trace::units::parse_size;
use cachevisor_trace::VmId;
use std::time::Instant;

/// The controller and what it compares each interval with.
pub(crate) struct Policy {
    pub(crate) ctl: Controller,
    /// Counters at the last interval, and when it was.
    last: Vec<ExportStats>,
    last_tick: Instant,
    /// The interval's length, ns.
    interval_ns: u64,
    /// The drain of vDisks in pass-through after errors.
    drain: PassThroughDrain,
    /// Static partitions: the allocator runs (a shared pool has no targets; the simulator
    /// runs none there either); off on a cluster node that borrows (the leader divides).
    pub(crate) managed: bool,
    /// A cluster node's per-vDisk estimates (ELICA's), when `[cluster]` is set.
    pub(crate) cluster_est: Option<crate::cluster::estimates::NodeEstimator>,
}

impl Policy {
    pub(crate) fn new(ctl: Controller, interval_ns: u64, managed: bool) -> Policy {
        Policy {
            ctl,
            last: Vec::new(),
            last_tick: Instant::now(),
            interval_ns,
            drain: PassThroughDrain::default(),
            managed,
            cluster_est: None,
        }
    }

    /// Sets the interval's length (a reload), ns.
    pub(crate) fn set_interval(&mut self, interval_ns: u64) {
        self.interval_ns = interval_ns;
    }

    /// A tick of the timer thread: the rECS sampling periods due so far in this interval
    /// (spread over it as S-CAVE's are, §IV-B; the simulator does the same per request).
    pub(crate) fn tick(&mut self, engine: &Engine) {
        let elapsed = self.last_tick.elapsed().as_nanos() as u64;
        self.ctl.sample_recs_due(elapsed, self.interval_ns, engine);
    }

    /// One allocation interval: the window's counters and rECS go to the controller, the
    /// allocator decides (if it runs every interval) and the decision is applied online as
    /// an engine job; vDisks in pass-through drain.
    pub(crate) fn interval(&mut self, engine: &mut Engine, stats: &[ExportStats]) {
        let secs = self.last_tick.elapsed().as_secs_f64();
        self.last_tick = Instant::now();
        self.last.resize(stats.len(), ExportStats::default());
        let counts: Vec<WindowCounts> = stats
            .iter()
            .zip(self.last.iter())
            .map(|(s, l)| WindowCounts {
                requests: s.reads + s.writes - l.reads - l.writes,
                accesses: s.blocks - l.blocks,
                hits: s.hit_blocks - l.hit_blocks,
            })
            .collect();
        self.last = stats.to_vec();
        let allocate = self.managed && self.ctl.allocator().every_interval();
        if let Some(d) = self.ctl.end_interval(engine, &counts, secs, allocate, None).decision {
            apply(engine, d);
        }
        self.drain(engine);
    }

    /// vDisks in pass-through after device errors drain a step (the simulator's code:
    /// `PassThroughDrain`), as one engine job.
    fn drain(&mut self, engine: &mut Engine) {
        if !PassThroughDrain::due(engine) {
            return;
        }
        let mut released = Vec::new();
        engine.submit_job(|e, out| released = self.drain.step(e, out));
        for vm in released {
            tracing::info!(
                vdisk = vm,
                "pass-through: every dirty block is written back; the vDisk's cache is released"
            );
        }
    }

    /// Re-divides the cache now (a vDisk joined or left).
    pub(crate) fn redivide(&mut self, engine: &mut Engine) {
        let d = self.ctl.decide(engine, None, &[], None);
        apply(engine, d);
    }
}

/// Applies an allocation decision online as an engine job (vDisks in pass-through after
/// errors keep what they have until drained: `controller::apply`; the persistent engine
/// journals the write-backs before the metadata says clean).
fn apply(engine: &mut Engine, d: Decision) {
    engine.submit_job(|e, out| *out = controller::apply(e, &d));
}

/// Sets up VM id `id` for vDisk `v` in the engine (write policy, sequential cutoff) and
/// the controller (weight, ratio, minimum). The partition is empty: no device work.
pub(crate) fn enroll(
    engine: &mut Engine,
    ctl: &mut Controller,
    id: VmId,
    v: &crate::config::VdiskConfig,
    block_size: u64,
) -> Result<(), String> {
    let min = v.min.as_deref().map(parse_size).transpose()?.unwrap_or(0);
    let cutoff = v.sequential_cutoff.as_deref().map(parse_size).transpose()?;
    engine.ensure_vm(id);
    if let Some(p) = v.write_policy {
        let mut out = Output::default();
        engine.set_write_policy(id, p, &mut out);
        debug_assert!(out.ops.is_empty(), "an empty partition has nothing to write back");
    }
    if let Some(c) = cutoff {
        engine.set_sequential_cutoff(id, c);
    }
    ctl.add_vm(VmSettings { weight: v.weight, ratio: v.ratio, min_blocks: min.div_ceil(block_size) });
    Ok(())
}

/// A new controller running `alloc` with the settings (and retirements) of `old`.
pub(crate) fn rebuilt(
    old: &mut Controller,
    alloc: Box<dyn cachevisor_policy::allocator::Allocator>,
    slots: u64,
    bs: u64,
    vms: usize,
) -> Controller {
    let settings: Vec<(VmSettings, bool)> = (0..vms).map(|v| (*old.settings_mut(v), old.is_retired(v))).collect();
    let mut ctl = Controller::new(alloc, slots, bs, true);
    for (v, (s, retired)) in settings.into_iter().enumerate() {
        ctl.add_vm(s);
        if retired {
            ctl.retire_vm(v);
        }
    }
    ctl
}
