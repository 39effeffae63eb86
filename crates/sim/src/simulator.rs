//! The simulation driver: replays a multi-VM request stream through the engine in virtual
//! time, executes the engine's device operations against device models, and records
//! metrics. Same scenario, same output, every run.

use crate::device::Device;
use crate::metrics::{Metrics, WindowRow};
use crate::report::{SimResult, TraceCounts};
use crate::scenario::{BackingLayout, ReplayMode, Resolved, Scenario};
use cachevisor_analysis::recs::{self, RecsEstimator};
use cachevisor_analysis::{Decay, Interval, IntervalProfiler, Kind, Method, Profiler};
use cachevisor_policy::{registry, Allocator, VmDemand};
use cachevisor_engine::{DeviceOp, Engine, EngineConfig, Output, PartitionMode};
use cachevisor_trace::formats::generic_csv::CsvColumns;
use cachevisor_trace::generator::{Generator, WorkloadConfig};
use cachevisor_trace::{open_trace, MergeOptions, MergedTrace, ReadOptions, Request, TraceSource, VmId, VmMode};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// Progress of a run, for a driver's progress bar.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Requests simulated so far.
    pub done: u64,
    /// Requests in total, when known up front (closed loop).
    pub total: Option<u64>,
}

/// A failed simulation: bad scenario or bad trace.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The scenario is invalid.
    #[error("scenario: {0}")]
    Scenario(String),
    /// A trace could not be read.
    #[error(transparent)]
    Trace(#[from] cachevisor_trace::TraceError),
}

/// Opens every input of a scenario as one merged stream.
pub fn open_inputs(sc: &Scenario) -> Result<MergedTrace, SimError> {
    let t = &sc.trace;
    let read = ReadOptions {
        format: t.format,
        vm_mode: t.vm_mode.unwrap_or(VmMode::File),
        skip_bad: t.skip_bad,
        blkparse_action: t.blkparse_action.clone().unwrap_or_else(|| "D".into()),
        csv_columns: t.csv_columns.as_ref().map(|c| c.parse::<CsvColumns>()).transpose().map_err(SimError::Scenario)?,
    };
    let mut sources: Vec<Box<dyn TraceSource>> = Vec::new();
    for f in &t.files {
        sources.push(open_trace(f, &read)?);
    }
    for s in &sc.synthetic {
        let text = std::fs::read_to_string(&s.config).map_err(|e| SimError::Scenario(format!("{}: {e}", s.config.display())))?;
        let cfg = WorkloadConfig::from_yaml(&text, &s.config.display().to_string())?;
        let w = cfg.validate().map_err(|e| SimError::Scenario(format!("{}: {e}", s.config.display())))?;
        sources.push(Box::new(Generator::new(w)));
    }
    let rename: HashMap<String, String> = t.rename.clone().into_iter().collect();
    Ok(MergedTrace::from_sources(sources, MergeOptions { rebase: true, rename }))
}

/// Mutable state of one run.
struct Run<'a> {
    sc: &'a Scenario,
    res: Resolved,
    engine: Engine,
    ssd: Device,
    backing: Vec<Device>,
    metrics: Metrics,
    names: Vec<String>,
    out: Output,
    cmd: Output,
    windows: Vec<WindowRow>,
    window_end: u64,
    window_index: u64,
    last_now: u64,
    recs: RecsEstimator,
    allocator: Box<dyn Allocator>,
    /// Hit curves by VM id in steps of `unit` blocks, when the allocator needs them.
    curves: Vec<Vec<f64>>,
    unit: u64,
    /// Recent per-VM distances for reallocation every window.
    online: Option<IntervalProfiler>,
}

impl<'a> Run<'a> {
    fn new(sc: &'a Scenario, res: Resolved) -> Result<Self, SimError> {
        let c = &sc.cache;
        let cfg = EngineConfig {
            block_size: res.block_size,
            slots: res.slots,
            partition: c.partition,
            replacement: c.replacement,
            write_policy: c.write_policy,
            fill: c.fill,
            track_last_access: false,
        };
        let engine = Engine::new(cfg).map_err(SimError::Scenario)?;
        let ssd = Device::new(sc.devices.ssd.resolve().map_err(SimError::Scenario)?);
        Ok(Run {
            sc,
            res,
            engine,
            ssd,
            backing: Vec::new(),
            metrics: Metrics::default(),
            names: Vec::new(),
            out: Output::default(),
            cmd: Output::default(),
            windows: Vec::new(),
            window_end: res.window_ns,
            window_index: 0,
            last_now: 0,
            // S-CAVE §IV-B: 5 sampling periods per window, α = 0.8; each period scans
            // 1/50 of the pool (at least 1,024 blocks).
            recs: RecsEstimator::new(recs::ALPHA, 5, (res.slots / 50).max(1024), 1),
            allocator: registry::build(&sc.cache.allocator).map_err(SimError::Scenario)?,
            curves: Vec::new(),
            unit: (res.slots / CURVE_UNITS).max(1),
            online: None,
        })
    }

    fn weight(&self, vm: usize) -> f64 {
        self.sc.vm.iter().find(|v| v.name == self.names[vm]).map_or(1.0, |v| v.weight)
    }

    /// Registers VMs up to `names.len()`: backing devices, write policies, and (static
    /// partitioning) targets ∝ weight among known VMs, shrinks before grows.
    fn admit(&mut self, names: &[String], now: u64) -> Result<(), SimError> {
        if names.len() <= self.names.len() {
            return Ok(());
        }
        let spec = self.sc.devices.backing.resolve().map_err(SimError::Scenario)?;
        while self.names.len() < names.len() {
            let vm = self.names.len();
            self.names.push(names[vm].clone());
            if self.sc.devices.backing_layout == BackingLayout::PerVm || self.backing.is_empty() {
                self.backing.push(Device::new(spec.clone()));
            }
            self.engine.ensure_vm(vm as VmId);
            if let Some(p) = self.sc.vm.iter().find(|v| v.name == names[vm]).and_then(|v| v.write_policy) {
                self.engine.set_write_policy(vm as VmId, p, &mut self.cmd);
            }
        }
        self.reallocate(now);
        Ok(())
    }

    /// Asks the allocator for targets (static partitions only) and applies them, shrinks
    /// before grows, as background work at `now`.
    fn reallocate(&mut self, now: u64) {
        if self.sc.cache.partition != PartitionMode::Static {
            return;
        }
        let units = (self.res.slots / self.unit) as usize;
        let demands: Vec<VmDemand> = (0..self.names.len())
            .map(|v| {
                let p = self.engine.partition(v as VmId);
                let hit_curve = match &self.online {
                    Some(o) => o.histogram(v as VmId).map(|h| h.hits_curve(self.unit, units)).unwrap_or_default(),
                    None => self.curves.get(v).cloned().unwrap_or_default(),
                };
                VmDemand { weight: self.weight(v), min_blocks: 0, target_blocks: p.target, used_blocks: p.used, hit_curve }
            })
            .collect();
        let targets = self.allocator.allocate(self.res.slots, self.unit, &demands).targets;
        let mut order: Vec<usize> = (0..targets.len()).collect();
        order.sort_by_key(|&v| targets[v] > self.engine.partition(v as VmId).target); // shrinks first
        for v in order {
            self.engine.set_target(v as VmId, targets[v], &mut self.cmd);
            let cmd = std::mem::take(&mut self.cmd);
            self.background(now, &cmd);
            self.cmd = cmd;
        }
    }

    fn device(&mut self, op: &DeviceOp) -> (&mut Device, u64) {
        if op.kind.is_ssd() {
            (&mut self.ssd, op.ssd_addr)
        } else if self.sc.devices.backing_layout == BackingLayout::PerVm {
            (&mut self.backing[op.vm as usize], op.disk_addr)
        } else {
            (&mut self.backing[0], op.disk_addr.wrapping_add((op.vm as u64) << 40))
        }
    }

    /// Runs ops phase by phase from `now`; returns when the last sync op completes.
    fn execute(&mut self, now: u64, ops: &[DeviceOp]) -> u64 {
        let max_phase = ops.iter().map(|o| o.phase).max().unwrap_or(0);
        let (mut start, mut done) = (now, now);
        for p in 0..=max_phase {
            let mut end = start;
            for op in ops.iter().filter(|o| o.phase == p) {
                let (dev, addr) = self.device(op);
                let c = dev.submit(start, op.kind.is_write(), addr, op.len);
                end = end.max(c);
                if op.sync {
                    done = done.max(c);
                }
            }
            start = end;
        }
        done
    }

    /// Executes a command's ops as background work and counts them.
    fn background(&mut self, now: u64, out: &Output) {
        self.execute(now, &out.ops);
        self.metrics.ops(out);
    }

    /// Emits every window that ends at or before `now`.
    fn roll_windows(&mut self, now: u64) {
        while now >= self.window_end {
            self.emit_window();
        }
    }

    /// Emits the current window's rows and starts the next window.
    fn emit_window(&mut self) {
        if self.online.is_some() {
            self.reallocate(self.window_end);
            if let Some(o) = self.online.as_mut() {
                o.close(); // halves the counts: the next decision weighs recent windows more
            }
        }
        let engine = &self.engine;
        let recs = self.recs.sample_window(engine.slot_count(), |s| engine.slot_referenced(s as u32)).to_vec();
        {
            for vm in 0..self.names.len() {
                let (requests, accesses, hits) = self.metrics.take_window(vm as VmId);
                let p = self.engine.partition(vm as VmId);
                self.windows.push(WindowRow {
                    window: self.window_index,
                    t_end_s: self.window_end as f64 / 1e9,
                    vm: self.names[vm].clone(),
                    requests,
                    accesses,
                    hit_ratio: if accesses > 0 { hits as f64 / accesses as f64 } else { 0.0 },
                    used_blocks: p.used,
                    target_blocks: p.target,
                    dirty_blocks: p.dirty_blocks,
                    miss_blocks: accesses - hits,
                    recs: recs.get(vm).copied().flatten(),
                });
            }
            self.window_index += 1;
            self.window_end += self.res.window_ns;
        }
    }

    /// Issues one request at `now`; returns its completion time.
    fn issue(&mut self, now: u64, req: &Request) -> u64 {
        self.roll_windows(now);
        self.last_now = now;
        if let Some(o) = self.online.as_mut() {
            o.add(req);
        }
        let mut out = std::mem::take(&mut self.out);
        self.engine.access(now, req, &mut out);
        let done = self.execute(now, &out.ops);
        self.metrics.request(req.vm, req.op.is_write(), &out, done - now);
        self.out = out;
        done
    }

    fn finish(mut self, end: u64, counts: Vec<TraceCounts>) -> SimResult {
        if self.sc.replay.flush_at_end {
            let mut cmd = Output::default();
            self.engine.flush(None, &mut cmd);
            self.background(end, &cmd);
        }
        self.roll_windows(self.last_now);
        self.emit_window(); // the last, partial window
        SimResult::build(self.sc, self.res, &self.engine, &self.metrics, &self.names, self.windows, end, counts, &self.ssd, &self.backing)
    }
}

/// Allocation units the hit curves are sampled at (the optimal DP's resolution).
const CURVE_UNITS: u64 = 256;

/// Pre-pass for allocators that need curves: exact whole-trace LRU hit curves per VM (in
/// steps of `unit` blocks up to the cache size) and every VM name, in stream order.
fn whole_trace_curves(sc: &Scenario, res: Resolved, unit: u64, limit: u64) -> Result<(Vec<Vec<f64>>, Vec<String>), SimError> {
    let mut trace = open_inputs(sc)?;
    let mut prof = Profiler::new(res.block_size, Method::Exact).all_only();
    let mut n = 0;
    while n < limit {
        let Some(r) = trace.next_request()? else { break };
        prof.add(&r);
        n += 1;
    }
    let units = res.slots / unit;
    let curves = prof
        .vms()
        .iter()
        .map(|v| {
            v.histogram(Kind::All).hits_curve(unit, units as usize)
        })
        .collect();
    Ok((curves, trace.vm_names().to_vec()))
}

/// Runs a scenario; `progress` is called every 65,536 requests.
pub fn simulate(sc: &Scenario, progress: &mut dyn FnMut(Progress)) -> Result<SimResult, SimError> {
    let res = sc.resolve().map_err(SimError::Scenario)?;
    let mut run = Run::new(sc, res)?;
    let limit = if sc.replay.max_requests == 0 { u64::MAX } else { sc.replay.max_requests };
    if sc.cache.reallocate && sc.cache.partition == PartitionMode::Static && run.allocator.needs().hit_curves {
        run.online = Some(IntervalProfiler::new(res.block_size, Interval::Requests(u64::MAX), Decay::Factor(0.5), Vec::new(), 0.95));
    } else if sc.cache.partition == PartitionMode::Static && run.allocator.needs().hit_curves {
        let (curves, names) = whole_trace_curves(sc, res, run.unit, limit)?;
        run.curves = curves;
        run.admit(&names, 0)?; // every VM from the start, so the split is the whole-trace optimum
    }
    let mut trace = open_inputs(sc)?;
    let end = match sc.replay.mode {
        ReplayMode::Open => {
            let mut n = 0u64;
            let mut end = 0;
            while n < limit {
                let Some(req) = trace.next_request()? else { break };
                let now = (req.time_ns as f64 / sc.replay.speedup) as u64;
                if req.vm as usize >= run.names.len() {
                    run.admit(trace.vm_names(), now)?;
                }
                end = end.max(run.issue(now, &req));
                n += 1;
                if n.is_multiple_of(65_536) {
                    progress(Progress { done: n, total: None });
                }
            }
            end
        }
        ReplayMode::Closed => {
            let mut per_vm: Vec<std::collections::VecDeque<Request>> = Vec::new();
            let mut total = 0u64;
            while total < limit {
                let Some(req) = trace.next_request()? else { break };
                if per_vm.len() <= req.vm as usize {
                    per_vm.resize_with(req.vm as usize + 1, Default::default);
                }
                per_vm[req.vm as usize].push_back(req);
                total += 1;
            }
            run.admit(trace.vm_names(), 0)?;
            let mut ready: BinaryHeap<Reverse<(u64, VmId)>> = BinaryHeap::new();
            for vm in 0..per_vm.len() {
                for _ in 0..sc.replay.queue_depth {
                    ready.push(Reverse((0, vm as VmId)));
                }
            }
            let (mut n, mut end) = (0u64, 0u64);
            while let Some(Reverse((now, vm))) = ready.pop() {
                let Some(req) = per_vm[vm as usize].pop_front() else { continue };
                let done = run.issue(now, &req);
                end = end.max(done);
                ready.push(Reverse((done, vm)));
                n += 1;
                if n % 65_536 == 0 {
                    progress(Progress { done: n, total: Some(total) });
                }
            }
            end
        }
    };
    let counts = trace.counts().into_iter().map(TraceCounts::from).collect();
    Ok(run.finish(end, counts))
}
