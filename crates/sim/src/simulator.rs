//! The simulation driver: replays a multi-VM request stream through the engine in virtual
//! time, executes the engine's device operations against device models, and records
//! metrics. Same scenario, same output, every run.

use crate::device::Device;
use crate::metrics::{Metrics, WindowRow};
use crate::report::{SimResult, TraceCounts};
use crate::scenario::{BackingLayout, ReplayMode, Resolved, Scenario};
use cachevisor_analysis::{Kind, Method, Profiler, ReuseMix, ReuseMixTracker};
use cachevisor_engine::{DeviceOp, Engine, EngineConfig, Output, PartitionMode};
use cachevisor_policy::controller::{self, Controller, Estimates, VmSettings, WindowCounts};
use cachevisor_policy::{registry, Needs};
use cachevisor_trace::chain::Chained;
use cachevisor_trace::formats::generic_csv::CsvColumns;
use cachevisor_trace::generator::{Generator, WorkloadConfig};
use cachevisor_trace::units::{parse_duration_ns, parse_size};
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
    let generator = |path: &std::path::Path| -> Result<Generator, SimError> {
        let text = std::fs::read_to_string(path).map_err(|e| SimError::Scenario(format!("{}: {e}", path.display())))?;
        let cfg = WorkloadConfig::from_yaml(&text, &path.display().to_string())?;
        let w = cfg.validate().map_err(|e| SimError::Scenario(format!("{}: {e}", path.display())))?;
        Ok(Generator::new(w))
    };
    for s in &sc.synthetic {
        if s.then.is_empty() {
            sources.push(Box::new(generator(&s.config)?));
            continue;
        }
        let mut parts: Vec<(Box<dyn TraceSource>, u64)> = vec![(Box::new(generator(&s.config)?), 0)];
        for c in &s.then {
            let at = parse_duration_ns(&c.at).map_err(|e| SimError::Scenario(format!("synthetic.then.at: {e}")))?;
            parts.push((Box::new(generator(&c.config)?), at));
        }
        sources.push(Box::new(Chained::new(parts)));
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
    window_start: u64,
    /// Requests issued (request-count windows).
    issued: u64,
    window_index: u64,
    last_now: u64,
    /// Estimates, allocator and decisions (shared with the daemon).
    ctl: Controller,
    /// Re-run the allocator every window.
    dynamic: bool,
    /// Global cleaner watermarks in free slots (low, high).
    cleaner: Option<(u64, u64)>,
    /// Whole-trace estimates by VM id (pre-pass), when the allocator needs curves once.
    whole: Vec<Estimates>,
    /// Phase changes by time, and the next to apply.
    phases: Vec<(u64, usize)>,
    next_phase: usize,
    /// Lookahead oracle: exact estimates of every window by window index, then VM id.
    oracle: Vec<Vec<Estimates>>,
    /// Closed loop: (passes completed, end of the first) per VM.
    passes: Vec<(u64, Option<u64>)>,
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
        let allocator = registry::build_with(&sc.cache.allocator, &sc.cache.params).map_err(SimError::Scenario)?;
        let managed = c.partition == PartitionMode::Static;
        let dynamic = managed && (c.lookahead || c.reallocate.unwrap_or(allocator.every_interval()));
        let cleaner = allocator
            .cleaner()
            .filter(|_| managed)
            .map(|w| (((w.low * res.slots as f64) as u64).max(1), ((w.high * res.slots as f64) as u64).max(1)));
        let mut phases = Vec::new();
        for (i, p) in sc.phase.iter().enumerate() {
            phases.push((parse_duration_ns(&p.at).map_err(SimError::Scenario)?, i));
        }
        phases.sort();
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
            window_start: 0,
            issued: 0,
            window_index: 0,
            last_now: 0,
            ctl: Controller::new(allocator, res.slots, res.block_size, dynamic && !c.lookahead),
            dynamic,
            cleaner,
            whole: Vec::new(),
            phases,
            next_phase: 0,
            passes: Vec::new(),
            oracle: Vec::new(),
        })
    }

    /// Applies every phase due at `now`; a changed write policy takes effect at once.
    fn apply_phases(&mut self, now: u64) {
        while let Some(&(at, i)) = self.phases.get(self.next_phase) {
            if at > now {
                break;
            }
            self.next_phase += 1;
            for c in &self.sc.phase[i].vm {
                let Some(vm) = self.names.iter().position(|n| *n == c.name) else { continue };
                let s = self.ctl.settings_mut(vm);
                s.weight = c.weight.unwrap_or(s.weight);
                s.ratio = c.ratio.unwrap_or(s.ratio);
                if let Some(p) = c.write_policy {
                    self.command(now, |e, out| e.set_write_policy(vm as VmId, p, out));
                }
            }
        }
    }

    /// Registers VMs up to `names.len()`: backing devices, settings, write policies, then
    /// a reallocation including them.
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
            let conf = self.sc.vm.iter().find(|v| v.name == names[vm]);
            let min_bytes = conf
                .and_then(|v| v.min.as_deref())
                .map(parse_size)
                .transpose()
                .map_err(SimError::Scenario)?
                .unwrap_or(0);
            self.ctl.add_vm(VmSettings {
                weight: conf.map_or(1.0, |v| v.weight),
                ratio: conf.map_or(1.0, |v| v.ratio),
                min_blocks: min_bytes.div_ceil(self.res.block_size),
            });
            if let Some(c) = conf.and_then(|v| v.sequential_cutoff.as_deref()) {
                let bytes = parse_size(c).map_err(SimError::Scenario)?;
                self.engine.set_sequential_cutoff(vm as VmId, bytes);
            }
            if let Some(p) = conf.and_then(|v| v.write_policy) {
                self.command(now, |e, out| e.set_write_policy(vm as VmId, p, out));
            }
        }
        self.apply_phases(now);
        self.reallocate(now, None, &[]);
        Ok(())
    }

    /// Asks the allocator for targets and write policies (static partitions only) and
    /// applies them, shrinks before grows, as background work at `now`. `window` = the
    /// last window's counters (none when VMs arrive), `recs` = raw rECS samples.
    fn reallocate(&mut self, now: u64, window: Option<&[WindowCounts]>, recs: &[Option<f64>]) {
        if self.sc.cache.partition != PartitionMode::Static {
            return;
        }
        let estimates: Option<&[Estimates]> = if self.sc.cache.lookahead {
            // The window about to start: `window_index` counts windows already emitted.
            Some(self.oracle.get(self.window_index as usize + window.is_some() as usize).map_or(&[][..], |w| &w[..]))
        } else if self.ctl.observes() {
            None
        } else {
            Some(&self.whole)
        };
        let secs = self.window_secs();
        let d = self.ctl.decide(&self.engine, window.map(|w| (w, secs)), recs, estimates);
        let out = controller::apply(&mut self.engine, &d);
        self.background(now, &out);
    }

    fn device(&mut self, op: &DeviceOp) -> (&mut Device, u64) {
        if op.kind.is_ssd() {
            (&mut self.ssd, op.ssd_offset(self.engine.config().block_size))
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

    /// Runs an engine command and executes its ops as background work at `now`.
    fn command(&mut self, now: u64, f: impl FnOnce(&mut Engine, &mut Output)) {
        let mut cmd = std::mem::take(&mut self.cmd);
        f(&mut self.engine, &mut cmd);
        self.background(now, &cmd);
        self.cmd = cmd;
    }

    /// Executes a command's ops as background work and counts them.
    fn background(&mut self, now: u64, out: &Output) {
        self.execute(now, &out.ops);
        self.metrics.ops(out);
    }

    /// Length of the current window in seconds (at least 1 ns).
    fn window_secs(&self) -> f64 {
        self.window_end.saturating_sub(self.window_start).max(1) as f64 / 1e9
    }

    /// Emits every window that ends at or before `now`.
    fn roll_windows(&mut self, now: u64) {
        while now >= self.window_end {
            self.emit_window();
        }
    }

    /// Emits the current window's rows and starts the next window: samples rECS, takes
    /// the window's counters, and (dynamic policies) reallocates on them.
    fn emit_window(&mut self) {
        let (smoothed, sampled) = self.ctl.sample_recs(&self.engine);
        let stats: Vec<WindowCounts> = (0..self.names.len())
            .map(|vm| {
                let (requests, accesses, hits) = self.metrics.take_window(vm as VmId);
                WindowCounts { requests, accesses, hits }
            })
            .collect();
        self.ctl.end_window(&stats);
        if self.dynamic {
            self.reallocate(self.window_end, Some(&stats), &sampled);
            self.ctl.next_window(); // halves the counts: the next decision weighs recent windows more
        }
        for (vm, &WindowCounts { requests, accesses, hits }) in stats.iter().enumerate() {
            let p = self.engine.partition(vm as VmId);
            self.windows.push(WindowRow {
                window: self.window_index,
                t_end_s: self.window_end as f64 / 1e9,
                vm: self.names[vm].clone(),
                requests,
                accesses,
                hit_ratio: if accesses > 0 { hits as f64 / accesses as f64 } else { 0.0 },
                hit_throughput: hits as f64 / self.window_secs(),
                used_blocks: p.used,
                target_blocks: p.target,
                dirty_blocks: p.dirty_blocks,
                miss_blocks: accesses - hits,
                recs: smoothed.get(vm).copied().flatten(),
                write_policy: p.write_policy,
            });
        }
        self.window_index += 1;
        self.window_start = self.window_end;
        self.window_end = self.window_end.saturating_add(self.res.window_ns);
    }

    /// Issues one request at `now`; returns its completion time.
    fn issue(&mut self, now: u64, req: &Request) -> u64 {
        self.roll_windows(now);
        if self.phases.get(self.next_phase).is_some_and(|&(at, _)| at <= now) {
            self.apply_phases(now);
        }
        self.last_now = now;
        self.ctl.observe(req);
        let mut out = std::mem::take(&mut self.out);
        self.engine.access(now, req, &mut out);
        let done = self.execute(now, &out.ops);
        self.metrics.request(req.vm, req.op.is_write(), &out, done - now);
        self.out = out;
        self.issued += 1;
        if self.res.window_requests.is_some_and(|n| self.issued.is_multiple_of(n)) {
            self.window_end = now.max(self.window_start);
            self.emit_window();
        }
        if let Some((low, high)) = self.cleaner {
            if self.engine.free_slots() < low {
                self.command(now, |e, out| {
                    e.clean(high, out);
                });
            }
        }
        done
    }

    fn finish(mut self, end: u64, counts: Vec<TraceCounts>) -> SimResult {
        if self.sc.replay.flush_at_end {
            let mut cmd = Output::default();
            self.engine.flush(None, &mut cmd);
            self.background(end, &cmd);
        }
        self.roll_windows(self.last_now);
        if self.res.window_requests.is_some() {
            self.window_end = self.last_now.max(self.window_start);
        }
        self.emit_window(); // the last, partial window
        let mut r = SimResult::build(
            self.sc,
            self.res,
            &self.engine,
            &self.metrics,
            &self.names,
            self.windows,
            end,
            counts,
            &self.ssd,
            &self.backing,
        );
        for (v, &(passes, first)) in r.vms.iter_mut().zip(&self.passes) {
            v.iterations = passes;
            v.first_iteration_s = first.map(|t| t as f64 / 1e9);
        }
        r
    }
}

/// Pre-pass for allocators that need estimates once: exact whole-trace LRU hit curves per
/// VM (all accesses and reads, in steps of `unit` blocks up to the cache size), reuse
/// kinds, and every VM name in stream order.
fn whole_trace(
    sc: &Scenario,
    res: Resolved,
    unit: u64,
    limit: u64,
    needs: Needs,
) -> Result<(Vec<Estimates>, Vec<String>), SimError> {
    let mut trace = open_inputs(sc)?;
    let mut prof = Profiler::new(res.block_size, Method::Exact);
    if !needs.read_curves {
        prof = prof.all_only();
    }
    let mut mixes: Vec<ReuseMixTracker> = Vec::new();
    let shift = res.block_size.trailing_zeros();
    let mut n = 0;
    while n < limit {
        let Some(r) = trace.next_request()? else { break };
        prof.add(&r);
        if needs.reuse_mix && r.len > 0 {
            if mixes.len() <= r.vm as usize {
                mixes.resize_with(r.vm as usize + 1, Default::default);
            }
            for b in r.offset >> shift..=(r.end() - 1) >> shift {
                mixes[r.vm as usize].access(b, r.op.is_write());
            }
        }
        n += 1;
    }
    let units = (res.slots / unit) as usize;
    let whole = prof
        .vms()
        .iter()
        .enumerate()
        .map(|(i, v)| Estimates {
            all: v.histogram(Kind::All).hits_curve(unit, units),
            read: if needs.read_curves { v.histogram(Kind::Read).hits_curve(unit, units) } else { Vec::new() },
            accesses: v.accesses(Kind::All) as f64,
            mix: mixes.get(i).map(|m| m.mix).unwrap_or_default(),
        })
        .collect();
    Ok((whole, trace.vm_names().to_vec()))
}

/// Pre-pass for the lookahead oracle: each window's own exact curves per VM (distances
/// over the whole history, counts of that window only), windows by trace time ÷ speedup.
fn window_curves(sc: &Scenario, res: Resolved, unit: u64, limit: u64) -> Result<Vec<Vec<Estimates>>, SimError> {
    use cachevisor_analysis::{DistanceHistogram, StackDistance};
    let mut trace = open_inputs(sc)?;
    let units = (res.slots / unit) as usize;
    let shift = res.block_size.trailing_zeros();
    let mut stacks: Vec<StackDistance> = Vec::new();
    let mut mixes: Vec<ReuseMixTracker> = Vec::new();
    let mut cur: Vec<(DistanceHistogram, DistanceHistogram)> = Vec::new();
    let mut out: Vec<Vec<Estimates>> = Vec::new();
    let close = |cur: &mut Vec<(DistanceHistogram, DistanceHistogram)>,
                 mixes: &mut Vec<ReuseMixTracker>,
                 out: &mut Vec<Vec<Estimates>>| {
        out.push(
            cur.iter_mut()
                .zip(mixes.iter_mut())
                .map(|((a, r), m)| {
                    let w = Estimates {
                        all: a.hits_curve(unit, units),
                        read: r.hits_curve(unit, units),
                        accesses: a.total(),
                        mix: m.mix,
                    };
                    *a = a.cleared();
                    *r = r.cleared();
                    m.mix = ReuseMix::default();
                    w
                })
                .collect(),
        );
    };
    let mut n = 0;
    while n < limit {
        let Some(q) = trace.next_request()? else { break };
        n += 1;
        let w = ((q.time_ns as f64 / sc.replay.speedup) as u64 / res.window_ns) as usize;
        while out.len() < w {
            close(&mut cur, &mut mixes, &mut out);
        }
        let v = q.vm as usize;
        if stacks.len() <= v {
            stacks.resize_with(v + 1, StackDistance::new);
            mixes.resize_with(v + 1, Default::default);
            cur.resize_with(v + 1, || (DistanceHistogram::coarse(unit, units), DistanceHistogram::coarse(unit, units)));
        }
        if q.len == 0 {
            continue;
        }
        for b in q.offset >> shift..=(q.end() - 1) >> shift {
            let d = stacks[v].access(b);
            cur[v].0.add(d, 1.0);
            if !q.op.is_write() {
                cur[v].1.add(d, 1.0);
            }
            mixes[v].access(b, q.op.is_write());
        }
    }
    close(&mut cur, &mut mixes, &mut out);
    Ok(out)
}

/// Runs a scenario; `progress` is called every 65,536 requests.
pub fn simulate(sc: &Scenario, progress: &mut dyn FnMut(Progress)) -> Result<SimResult, SimError> {
    let res = sc.resolve().map_err(SimError::Scenario)?;
    let mut run = Run::new(sc, res)?;
    let limit = if sc.replay.max_requests == 0 { u64::MAX } else { sc.replay.max_requests };
    let n = run.ctl.allocator().needs();
    let estimates = n.hit_curves || n.read_curves || n.reuse_mix;
    if sc.cache.lookahead && run.dynamic {
        run.oracle = window_curves(sc, res, run.ctl.unit(), limit)?;
    } else if !run.dynamic && sc.cache.partition == PartitionMode::Static && estimates {
        let (whole, names) = whole_trace(sc, res, run.ctl.unit(), limit, n)?;
        run.whole = whole;
        run.admit(&names, 0)?; // every VM from the start, so the split is the whole-trace one
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
            let mut per_vm: Vec<Vec<Request>> = Vec::new();
            let mut total = 0u64;
            while total < limit {
                let Some(req) = trace.next_request()? else { break };
                if per_vm.len() <= req.vm as usize {
                    per_vm.resize_with(req.vm as usize + 1, Default::default);
                }
                per_vm[req.vm as usize].push(req);
                total += 1;
            }
            run.admit(trace.vm_names(), 0)?;
            let repeat_until =
                sc.replay.repeat_for.as_deref().map(parse_duration_ns).transpose().map_err(SimError::Scenario)?;
            let mut cursor = vec![0usize; per_vm.len()];
            run.passes = vec![(0, None); per_vm.len()];
            let mut ready: BinaryHeap<Reverse<(u64, VmId)>> = BinaryHeap::new();
            for vm in 0..per_vm.len() {
                for _ in 0..sc.replay.queue_depth {
                    ready.push(Reverse((0, vm as VmId)));
                }
            }
            let (mut n, mut end) = (0u64, 0u64);
            let mut in_flight = vec![sc.replay.queue_depth as u64; per_vm.len()];
            while let Some(Reverse((now, vm))) = ready.pop() {
                let v = vm as usize;
                if cursor[v] == per_vm[v].len() {
                    // A pass ends when its last request completes (the last slot frees).
                    in_flight[v] -= 1;
                    if in_flight[v] > 0 || per_vm[v].is_empty() {
                        continue;
                    }
                    let p = &mut run.passes[v];
                    p.0 += 1;
                    p.1.get_or_insert(now);
                    if repeat_until.is_none_or(|t| now >= t) {
                        continue;
                    }
                    cursor[v] = 0;
                    in_flight[v] = sc.replay.queue_depth as u64;
                    for _ in 1..sc.replay.queue_depth {
                        ready.push(Reverse((now, vm)));
                    }
                }
                let req = per_vm[v][cursor[v]];
                cursor[v] += 1;
                let done = run.issue(now, &req);
                end = end.max(done);
                ready.push(Reverse((done, vm)));
                n += 1;
                if n % 65_536 == 0 {
                    progress(Progress { done: n, total: repeat_until.is_none().then_some(total) });
                }
            }
            end
        }
    };
    let counts = trace.counts().into_iter().map(TraceCounts::from).collect();
    Ok(run.finish(end, counts))
}
