//! The daemon's policy: the interval controller (the same code the simulator runs) fed
//! by the data path's hooks — each request observed as it is submitted, each sampling
//! point of the engine's interval (`Event::Sample`) sampling rECS, each ended interval
//! (`Event::Interval`) turned into a decision applied as an engine job — and the drain of
//! vDisks in pass-through.

use cachevisor_engine::{Engine, Output};
use cachevisor_policy::allocator::Decision;
use cachevisor_policy::controller::{self, Controller, VmSettings};
use cachevisor_policy::passthrough_drain::PassThroughDrain;
use cachevisor_trace::units::parse_size;
use cachevisor_trace::VmId;
use std::time::Instant;

/// The controller and what it compares each interval with.
pub(crate) struct Policy {
    pub(crate) ctl: Controller,
    /// When the last interval ended.
    last_tick: Instant,
    /// The drain of vDisks in pass-through after errors.
    drain: PassThroughDrain,
    /// Static partitions: the allocator runs (a shared pool has no targets; the simulator
    /// runs none there either); off on a cluster node that borrows (the leader divides).
    pub(crate) managed: bool,
    /// A cluster node's per-vDisk estimates (ELICA's), when `[cluster]` is set.
    pub(crate) cluster_est: Option<crate::cluster::estimates::NodeEstimator>,
}

impl Policy {
    pub(crate) fn new(ctl: Controller, managed: bool) -> Policy {
        Policy { ctl, last_tick: Instant::now(), drain: PassThroughDrain::default(), managed, cluster_est: None }
    }

    /// A sampling point of the interval (the engine's `Event::Sample`, the k-th of
    /// `of`): the rECS periods due by then (spread over the interval as S-CAVE's are,
    /// §IV-B; the simulator runs the same events).
    pub(crate) fn sample(&mut self, engine: &Engine, k: u32, of: u32) {
        self.ctl.sample(k, of, engine);
    }

    /// One allocation interval (the engine's `Event::Interval`): the window's counters
    /// (the engine's) and rECS go to the controller, the allocator decides (if it runs
    /// every interval) and the decision is applied online as an engine job; vDisks in
    /// pass-through drain.
    pub(crate) fn interval(&mut self, engine: &mut Engine) {
        let secs = self.last_tick.elapsed().as_secs_f64();
        self.last_tick = Instant::now();
        let counts = self.ctl.take_counts(engine, engine.vm_count());
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

    /// Re-divides the cache now (a vDisk joined or left, the cache was resized).
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

/// Sets up VM id `id` for vDisk `v` in the engine (write policy, sequential cutoff,
/// admission) and
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
    let entry = cachevisor_engine::VmEntry {
        sequential_cutoff: cutoff,
        admission: v.admissions(),
        prefetch: v.prefetch.unwrap_or_default(),
        classes: &v.class,
    };
    engine.set_entry(id, &entry)?;
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
