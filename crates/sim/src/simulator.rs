//! The replay loop: a multi-VM request stream (`inputs.rs`) replayed in virtual time, open
//! or closed loop, through a cache node (`node.rs`: engine, device models, metrics), with
//! the interval controller (windows, phases, reallocation, the global cleaner) and the
//! pre-passes some allocators need (`prepass.rs`). Same scenario, same output, every run.

use crate::failover::{online_choice, FailoverMode, FailoverPlan, FailoverReport, History};
use crate::inputs::{open_inputs, SimError};
use crate::lookahead::{window_curves, ClosedLookahead, FIRST_WINDOW_REQUESTS};
use crate::metrics::WindowRow;
use crate::model_choice::Model;
use crate::node::Node;
use crate::prepass::whole_trace;
use crate::prewarming::Prewarming;
use crate::report::{SimResult, TraceCounts};
use crate::scenario::{ReplayMode, Resolved, Scenario};
use cachevisor_engine::{AdmissionPolicy, EngineConfig, Event, PartitionMode};
use cachevisor_policy::controller::{self, Controller, Estimates, VmSettings, WindowCounts};
use cachevisor_policy::passthrough_drain::PassThroughDrain;
use cachevisor_policy::registry;
use cachevisor_prewarm::{plan, Loader, Ranking, Snapshot};
use cachevisor_trace::units::{parse_duration_ns, parse_size};
use cachevisor_trace::{Request, VmId};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Progress of a run, for a driver's progress bar.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Requests simulated so far.
    pub done: u64,
    /// Requests in total, when known up front (closed loop).
    pub total: Option<u64>,
}

/// Mutable state of one run.
struct Run<'a> {
    sc: &'a Scenario,
    res: Resolved,
    /// The cache node: engine, devices, metrics.
    node: Node,
    names: Vec<String>,
    windows: Vec<WindowRow>,
    /// The current window's start and (time windows) end, in virtual time: the engine's
    /// interval cuts windows (`Event::Interval`), these only name them.
    window_end: u64,
    window_start: u64,
    /// Counters of a failed node's part of the current window (a failover).
    carried: Vec<WindowCounts>,
    /// Requests issued.
    issued: u64,
    window_index: u64,
    last_now: u64,
    /// Estimates, allocator and decisions (shared with the daemon).
    ctl: Controller,
    /// The drain of VMs passing through after device errors (shared with the daemon).
    drain: PassThroughDrain,
    /// Re-run the allocator every window.
    dynamic: bool,
    /// Whole-trace estimates by VM id (pre-pass), when the allocator needs curves once.
    whole: Vec<Estimates>,
    /// Phase changes by time, and the next to apply.
    phases: Vec<(u64, usize)>,
    next_phase: usize,
    /// Lookahead oracle, open loop: exact estimates of every window by window index, then
    /// VM id.
    oracle: Vec<Vec<Estimates>>,
    /// Lookahead oracle, closed loop: distances of every VM's requests.
    closed_oracle: Option<ClosedLookahead>,
    /// Closed loop: each VM's next request.
    cursors: Vec<usize>,
    /// Closed loop: (passes completed, end of the first) per VM.
    passes: Vec<(u64, Option<u64>)>,
    /// The engine's configuration (a failover's destination node gets the same).
    cfg: EngineConfig,
    /// `[failover]`: the plan, the source's snapshots, and what the failover did.
    failover: Option<Failover>,
}

/// A failover's state in a run.
struct Failover {
    plan: FailoverPlan,
    history: History,
    /// The failure happened.
    done: bool,
    /// Objects in the prewarm set and reads planned.
    set: u64,
    reads: u64,
    /// Sets the online parameters left out (they re-warm by themselves).
    online_skipped: Vec<String>,
}

impl<'a> Run<'a> {
    fn new(sc: &'a Scenario, res: Resolved) -> Result<Self, SimError> {
        let c = &sc.cache;
        let cfg = EngineConfig { fill: c.fill, ..res.cache.engine_config(res.slots).map_err(SimError::Scenario)? };
        let persistent = c.persistent.then(|| cachevisor_engine::durable_reserve(res.slots));
        let mut node = Node::new(cfg.clone(), &sc.devices, persistent, &res.cache.writeback)?;
        node.set_interval(0, res.window_ns, res.window_requests, recs_points(&res));
        let allocator = registry::build_with(&res.cache.allocator, &res.cache.params).map_err(SimError::Scenario)?;
        let managed = c.partition == PartitionMode::Static;
        let dynamic = managed && (c.lookahead || c.reallocate.unwrap_or(allocator.every_interval()));
        // S-CAVE's global cleaner runs in the engine, as requests are admitted (§V-B).
        node.engine.set_cleaner(controller::cleaner_watermarks(allocator.as_ref(), res.slots, managed));
        apply_cache_settings(&mut node.engine, c)?;
        let phases = sc.phase_times().map_err(SimError::Scenario)?;
        Ok(Run {
            sc,
            res: res.clone(),
            node,
            names: Vec::new(),
            windows: Vec::new(),
            window_end: res.window_ns,
            window_start: 0,
            carried: Vec::new(),
            issued: 0,
            window_index: 0,
            last_now: 0,
            ctl: Controller::new(allocator, res.slots, res.cache.block_size, dynamic && !c.lookahead),
            drain: PassThroughDrain::default(),
            dynamic,
            whole: Vec::new(),
            phases,
            next_phase: 0,
            passes: Vec::new(),
            oracle: Vec::new(),
            closed_oracle: None,
            cursors: Vec::new(),
            cfg,
            failover: match &sc.failover {
                Some(f) => Some(Failover {
                    plan: f.resolve(res.cache.block_size).map_err(SimError::Scenario)?,
                    history: History::default(),
                    done: false,
                    set: 0,
                    reads: 0,
                    online_skipped: Vec::new(),
                }),
                None => None,
            },
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
                    self.node.command(now, |e, out| e.set_write_policy(vm as VmId, p, out));
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
        while self.names.len() < names.len() {
            let vm = self.names.len();
            self.names.push(names[vm].clone());
            self.node.add_vm(vm as VmId)?;
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
                min_blocks: min_bytes.div_ceil(self.res.cache.block_size),
            });
            apply_vm_settings(&mut self.node, now, &self.sc.cache, conf, vm as VmId)?;
        }
        self.apply_phases(now);
        self.allocate_first(now);
        Ok(())
    }

    /// The allocator's estimates for the window about to start (`window`: the one that
    /// just ended, `None` before the first): the closed-loop oracle's (each VM's next
    /// requests, as many as it issued in the window), the lookahead pre-pass's, the
    /// whole trace's, or `None` (the controller's online ones).
    fn estimates(&self, window: Option<&[WindowCounts]>) -> Option<Vec<Estimates>> {
        if let Some(o) = self.closed_oracle.as_ref() {
            let counts: Vec<u64> = match window {
                Some(w) => w.iter().map(|c| c.requests).collect(),
                None => vec![FIRST_WINDOW_REQUESTS; self.names.len()],
            };
            Some(o.curves(&self.cursors, &counts))
        } else if self.sc.cache.lookahead {
            // The window about to start: `window_index` counts windows already emitted.
            Some(self.oracle.get(self.window_index as usize + window.is_some() as usize).cloned().unwrap_or_default())
        } else if self.ctl.observes() {
            None
        } else {
            Some(self.whole.clone())
        }
    }

    /// The first allocation, before any window: the allocator on its estimates.
    fn allocate_first(&mut self, now: u64) {
        if self.sc.cache.partition != PartitionMode::Static {
            return;
        }
        let estimates = self.estimates(None);
        let d = self.ctl.decide(&self.node.engine, None, &[], estimates.as_deref());
        self.node.command(now, |e, out| *out = controller::apply(e, &d));
    }

    /// Length of the current window in seconds (at least 1 ns).
    fn window_secs(&self) -> f64 {
        self.window_end.saturating_sub(self.window_start).max(1) as f64 / 1e9
    }

    /// Runs the node up to `now`, handing the engine's interval events to the controller
    /// as they come, in time order.
    fn advance_to(&mut self, now: u64) {
        loop {
            self.node.advance_to(now);
            if !self.node.has_ticks() {
                return;
            }
            self.take_ticks();
        }
    }

    /// The engine's interval events so far: a sampling point samples rECS, an interval's
    /// end ends the window (the daemon's policy runs the same events).
    fn take_ticks(&mut self) {
        while self.node.has_ticks() {
            let ticks: Vec<_> = self.node.take_ticks().collect();
            for t in ticks {
                match t {
                    Event::Sample { k, of, .. } => self.ctl.sample(k, of, &self.node.engine),
                    Event::Interval { at_ns, .. } => {
                        self.window_end = at_ns.max(self.window_start);
                        self.emit_window();
                    }
                    _ => {}
                }
            }
        }
    }

    /// Emits the current window's rows and starts the next window: samples rECS, takes
    /// the window's counters (the engine's), and (dynamic policies) reallocates on them.
    fn emit_window(&mut self) {
        let mut stats = self.ctl.take_counts(&mut self.node.engine, self.names.len());
        for (s, c) in stats.iter_mut().zip(std::mem::take(&mut self.carried)) {
            (s.requests, s.accesses, s.hits) = (s.requests + c.requests, s.accesses + c.accesses, s.hits + c.hits);
        }
        // Dynamic policies decide on the window (static partitions apply it; the next
        // window of online estimates starts either way: past counts decay).
        let estimates = if self.dynamic { self.estimates(Some(&stats)) } else { None };
        let end =
            self.ctl.end_interval(&self.node.engine, &stats, self.window_secs(), self.dynamic, estimates.as_deref());
        let smoothed = end.recs;
        if let (Some(d), PartitionMode::Static) = (end.decision, self.sc.cache.partition) {
            self.node.command(self.window_end, |e, out| *out = controller::apply(e, &d));
        }
        // VMs passing through after device errors drain, as the daemon's do.
        if PassThroughDrain::due(&self.node.engine) {
            let drain = &mut self.drain;
            self.node.command(self.window_end, |e, out| {
                drain.step(e, out);
            });
        }
        for (vm, &WindowCounts { requests, accesses, hits }) in stats.iter().enumerate() {
            let p = self.node.engine.partition(vm as VmId);
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

    /// The source node fails at `now`: the VMs move to a fresh node with the same cache
    /// and devices (targets set again by the allocator), which prewarms from the source's
    /// snapshots in `prewarm` mode. Requests in flight on the source finish there (their
    /// completions still reach the replay loop).
    fn fail_over(&mut self, now: u64) -> Result<(), SimError> {
        let f = self.failover.as_mut().expect("a failover is planned");
        f.done = true;
        let minute = (f.plan.minute_s * 1e9) as u64;
        let span = Some((now, now + minute, crate::metrics::histogram()));
        if f.plan.mode == FailoverMode::Warm {
            self.node.span_latency = span;
            return Ok(());
        }
        let persistent = self.sc.cache.persistent.then(|| cachevisor_engine::durable_reserve(self.res.slots));
        let mut dest = Node::new(self.cfg.clone(), &self.sc.devices, persistent, &self.res.cache.writeback)?;
        // The window goes on on the new node: its interval from the window's start, the
        // counters of the failed node's part of it carried.
        let (ns, reqs) = (self.res.window_ns, self.res.window_requests);
        dest.set_interval(self.window_start, ns, reqs, recs_points(&self.res));
        self.carried = self.ctl.take_counts(&mut self.node.engine, self.names.len());
        for vm in 0..self.names.len() {
            dest.add_vm(vm as VmId)?;
        }
        dest.engine.set_cleaner(self.node.engine.cleaner());
        let mut source = std::mem::replace(&mut self.node, dest);
        source.drain();
        self.node.take_done_from(&mut source, now);
        self.node.span_latency = span;
        self.allocate_first(now);
        let f = self.failover.as_mut().expect("a failover is planned");
        if f.plan.mode != FailoverMode::Prewarm {
            return Ok(());
        }
        let history: Vec<&Snapshot> = f.history.snapshots.iter().collect();
        let ranking = Ranking::new(&history, f.plan.heuristic);
        let limit = (f.plan.limit * self.res.slots as f64).floor() as u64;
        let set_vm: Vec<Option<VmId>> =
            ranking.sets.iter().map(|n| self.names.iter().position(|m| m == n).map(|v| v as VmId)).collect();
        let mut lc = f.plan.loader(self.res.cache.block_size);
        let chosen: Vec<_> = if f.plan.online {
            // Per vDisk, from what the source saw over its last five minutes.
            let from = f.plan.at_ns as f64 / 1e9 - 5.0 * f.plan.minute_s;
            let last = history.last().copied();
            let o =
                online_choice(&ranking, last, &self.windows, from, f.plan.minute_s, self.res.cache.block_size, limit);
            lc.pace = cachevisor_prewarm::settings::online_pace(lc.pace, o.rate, self.res.cache.block_size);
            f.online_skipped = o.skipped;
            o.chosen
        } else {
            ranking.prewarm_set(limit).to_vec()
        };
        let runs: Vec<_> =
            plan(&chosen, f.plan.max_run).into_iter().filter(|r| set_vm[r.set as usize].is_some()).collect();
        f.set = chosen.len() as u64;
        f.reads = runs.len() as u64;
        let loader = Loader::new(lc, runs);
        self.node.engine.set_prewarm_protection(f.plan.protect_ms);
        self.node.prewarm = Some(Prewarming::new(loader, set_vm));
        self.node.advance_to(now); // the first reads go out before the VMs' I/O resumes
        Ok(())
    }

    /// Issues one request at `now` (its completion comes back from the node with `tag`).
    fn issue(&mut self, now: u64, req: &Request, tag: u64) -> Result<(), SimError> {
        self.check_windows(now)?;
        self.advance_to(now);
        self.issue_advanced(now, req, tag)
    }

    /// Refuses a time `now` past the windows a run keeps, before the windows up to it are
    /// made (one far timestamp would make them all at once).
    #[inline]
    fn check_windows(&self, now: u64) -> Result<(), SimError> {
        if self.res.window_requests.is_some() {
            return Ok(());
        }
        // windows = index + (now − end) / window + 1 > MAX, without a division per request.
        let left = crate::scenario::MAX_WINDOWS.saturating_sub(self.window_index);
        if now.saturating_sub(self.window_end) < left.saturating_mul(self.res.window_ns) {
            return Ok(());
        }
        let windows = self.window_index + now.saturating_sub(self.window_end) / self.res.window_ns + 1;
        Err(SimError::Scenario(format!(
            "replay.window: the replay reaches {:.0} s of virtual time, {windows} windows: more than the {} a run keeps; use a larger window",
            now as f64 / 1e9,
            crate::scenario::MAX_WINDOWS
        )))
    }

    /// [`Self::issue`] once the replay has advanced to `now` and checked its windows.
    #[inline]
    fn issue_advanced(&mut self, now: u64, req: &Request, tag: u64) -> Result<(), SimError> {
        if self.failover.as_ref().is_some_and(|f| !f.done && now >= f.plan.at_ns) {
            self.fail_over(now)?;
        }
        if self.phases.get(self.next_phase).is_some_and(|&(at, _)| at <= now) {
            self.apply_phases(now);
        }
        self.last_now = now;
        if let Err(why) = self.node.engine.check_range(req.vm, req.offset, req.len as u64) {
            let vm = self.names.get(req.vm as usize).cloned().unwrap_or_else(|| req.vm.to_string());
            return Err(SimError::OutOfRange { index: self.issued + 1, vm, why });
        }
        self.ctl.observe(req);
        self.node.submit(now, req, tag);
        if let Some(f) = self.failover.as_mut().filter(|f| !f.done) {
            f.history.observe(&f.plan, now, &self.node.engine, &self.names);
        }
        self.issued += 1;
        self.take_ticks(); // a request-length interval ends as its last request runs
        Ok(())
    }

    fn finish(mut self, counts: Vec<TraceCounts>) -> SimResult {
        self.node.drain();
        let end = self.node.last_done();
        if self.sc.replay.flush_at_end {
            // Background work after the last request: counted, not part of the run's time.
            self.node.command(end, |e, out| e.flush(None, out));
            self.node.drain();
        }
        self.take_ticks();
        if self.res.window_requests.is_some() {
            self.window_end = self.last_now.max(self.window_start);
        }
        self.emit_window(); // the last, partial window
        let node = &self.node;
        let mut r = SimResult::build(
            self.sc,
            self.res,
            &node.engine,
            &node.metrics,
            &self.names,
            self.windows,
            end,
            counts,
            &std::iter::once(&node.ssd).chain(&node.more_ssds).map(|d| d.borrow()).collect::<Vec<_>>(),
            &node.backing,
            node.ram.as_ref(),
        );
        for (v, &(passes, first)) in r.vms.iter_mut().zip(&self.passes) {
            v.iterations = passes;
            v.first_iteration_s = first.map(|t| t as f64 / 1e9);
        }
        if let Some(f) = &self.failover {
            let progress = node.prewarm.as_ref().map(|p| p.progress());
            let first_minute = node.span_latency.as_ref().map(|s| &s.2);
            let mut rep =
                FailoverReport::build(&f.plan, &r.windows, f.history.taken(), f.set, f.reads, progress, first_minute);
            rep.online_skipped = f.online_skipped.clone();
            r.failover = Some(rep);
        }
        r
    }
}

/// What a `[[vm]]` section (over the `[cache]` one) sets on VM `vm` of `node`'s engine
/// besides its share: sequential cutoff, write policy, admission, I/O classes, prefetch.
/// The one-host run and each node of a cluster run alike.
pub(crate) fn apply_vm_settings(
    node: &mut Node,
    now: u64,
    cache: &crate::scenario::CacheSection,
    conf: Option<&crate::scenario::VmSection>,
    vm: VmId,
) -> Result<(), SimError> {
    if let Some(p) = conf.and_then(|v| v.write_policy) {
        node.command(now, |e, out| e.set_write_policy(vm, p, out));
    }
    let cutoff = conf.and_then(|v| v.sequential_cutoff.as_deref()).map(parse_size).transpose();
    let entry = cachevisor_engine::VmEntry {
        sequential_cutoff: cutoff.map_err(SimError::Scenario)?,
        admission: admissions(cache, conf),
        prefetch: conf.and_then(|v| v.prefetch).or(cache.prefetch).unwrap_or_default(),
        classes: conf.map_or(&[], |v| &v.class),
    };
    node.engine.set_entry(vm, &entry).map_err(SimError::Scenario)
}

/// What `[cache]` sets on an engine as a whole: congestion bypass and the shared write
/// budget (checked by `Scenario::resolve`).
pub(crate) fn apply_cache_settings(
    engine: &mut cachevisor_engine::Engine,
    c: &crate::scenario::CacheSection,
) -> Result<(), SimError> {
    let threshold = |s: &Option<String>| s.as_deref().map(parse_duration_ns).transpose().map_err(SimError::Scenario);
    engine.set_congestion(threshold(&c.congested_read_threshold)?, threshold(&c.congested_write_threshold)?);
    let budget = c.write_budget.as_deref().map(cachevisor_engine::BudgetRate::parse).transpose();
    engine.set_write_budget(budget.map_err(SimError::Scenario)?);
    Ok(())
}

/// A VM's read and write admission: its own, else the cache's (a write one unset: as
/// the read one of the same section), else every miss.
pub(crate) fn admissions(
    cache: &crate::scenario::CacheSection,
    vm: Option<&crate::scenario::VmSection>,
) -> (AdmissionPolicy, AdmissionPolicy) {
    let read = vm.and_then(|v| v.admission).or(cache.admission).unwrap_or_default();
    let write = vm
        .and_then(|v| v.write_admission.or(v.admission))
        .or(cache.write_admission)
        .or(cache.admission)
        .unwrap_or_default();
    (read, write)
}

/// The rECS sampling points of a window: spread over a time window (S-CAVE §IV-B: five
/// 0.1 s periods in its 1 s window); all at the end of a request-count window, as §VI-C's
/// 128-request windows are read.
fn recs_points(res: &Resolved) -> u32 {
    if res.window_requests.is_some() {
        0
    } else {
        controller::RECS_PERIODS
    }
}

/// Runs a scenario; `progress` is called every 65,536 requests.
pub fn simulate(sc: &Scenario, progress: &mut dyn FnMut(Progress)) -> Result<SimResult, SimError> {
    if !sc.node.is_empty() || sc.cluster.is_some() {
        return Err(SimError::Scenario(
            "node: a cluster scenario ([[node]], [cluster]) runs in cluster mode (`cluster_sim::simulate_cluster`)"
                .into(),
        ));
    }
    let res = sc.resolve().map_err(SimError::Scenario)?;
    let mut run = Run::new(sc, res.clone())?;
    // Chosen before any pre-pass: a refused `model = "cache"` costs nothing.
    let (model, why) = crate::model_choice::choose(sc, run.dynamic).map_err(SimError::Scenario)?;
    let limit = if sc.replay.max_requests == 0 { u64::MAX } else { sc.replay.max_requests };
    let n = run.ctl.allocator().needs();
    let estimates = n.hit_curves || n.read_curves || n.reuse_mix;
    if sc.cache.lookahead && run.dynamic && sc.replay.mode == ReplayMode::Open {
        run.oracle = window_curves(sc, res.clone(), run.ctl.unit(), limit)?;
    } else if !run.dynamic && sc.cache.partition == PartitionMode::Static && estimates {
        let (whole, names) = whole_trace(sc, res.clone(), run.ctl.unit(), limit, n)?;
        run.whole = whole;
        run.admit(&names, 0)?; // every VM from the start, so the split is the whole-trace one
    }
    let mut trace = crate::read_ahead::ReadAhead::spawn(open_inputs(sc)?, limit);
    match sc.replay.mode {
        // The cache model: trace order, windows by trace time (open loop: ÷ the speed-up).
        _ if model == Model::Cache => {
            run.node.set_cache_only();
            let speedup = if sc.replay.mode == ReplayMode::Open { sc.replay.speedup } else { 1.0 };
            replay_in_order(&mut run, &mut trace, speedup, progress)?
        }
        ReplayMode::Open => replay_in_order(&mut run, &mut trace, sc.replay.speedup, progress)?,
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
            if sc.cache.lookahead && run.dynamic {
                let (unit, units) = (run.ctl.unit(), run.ctl.units());
                run.closed_oracle = Some(ClosedLookahead::new(&per_vm, res.cache.block_size, unit, units));
            }
            run.cursors = vec![0; per_vm.len()];
            run.admit(trace.vm_names(), 0)?;
            let repeat_until = res.repeat_for_ns;
            run.passes = vec![(0, None); per_vm.len()];
            // Each VM's free queue slots, by the time they freed (its requests are tagged
            // with the VM id).
            let mut ready: BinaryHeap<Reverse<(u64, VmId)>> = BinaryHeap::new();
            for vm in 0..per_vm.len() {
                for _ in 0..sc.replay.queue_depth {
                    ready.push(Reverse((0, vm as VmId)));
                }
            }
            let (mut n, mut done) = (0u64, Vec::new());
            let mut in_flight = vec![sc.replay.queue_depth as u64; per_vm.len()];
            loop {
                // Completions up to the next free slot's time run first: they free slots.
                let next_ready = ready.peek().map(|r| r.0 .0);
                if let Some(t) = run.node.next_time().filter(|&t| next_ready.is_none_or(|r| t <= r)) {
                    if next_ready.is_none() && run.node.requests_in_flight() == 0 {
                        break; // only background work is left (`finish` drains it)
                    }
                    run.advance_to(t);
                    run.node.take_done(&mut done);
                    ready.extend(done.drain(..).map(|(vm, at)| Reverse((at, vm as VmId))));
                    continue;
                }
                let Some(Reverse((now, vm))) = ready.pop() else { break };
                let v = vm as usize;
                if run.cursors[v] == per_vm[v].len() {
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
                    run.cursors[v] = 0;
                    in_flight[v] = sc.replay.queue_depth as u64;
                    for _ in 1..sc.replay.queue_depth {
                        ready.push(Reverse((now, vm)));
                    }
                }
                let req = per_vm[v][run.cursors[v]];
                // The lookup of this VM's request `PREFETCH_AHEAD` on, started now.
                if let Some(r) = per_vm[v].get(run.cursors[v] + PREFETCH_AHEAD) {
                    run.node.engine.prefetch(r.vm, r.offset);
                }
                run.cursors[v] += 1;
                run.issue(now, &req, vm as u64)?;
                n += 1;
                if n % 65_536 == 0 {
                    progress(Progress { done: n, total: repeat_until.is_none().then_some(total) });
                }
            }
        }
    }
    let counts = trace.counts().into_iter().map(TraceCounts::from).collect();
    Ok(run.finish(counts).with_model(model, why))
}

/// Open loop (and the cache model): requests at their trace times divided by `speedup`,
/// in trace order; completions only free the devices. (The trace's reader stops at
/// `limit` itself: `ReadAhead::spawn`.)
fn replay_in_order(
    run: &mut Run<'_>,
    trace: &mut crate::read_ahead::ReadAhead,
    speedup: f64,
    progress: &mut dyn FnMut(Progress),
) -> Result<(), SimError> {
    // Two copies of the loop: none divides at the usual speed-up of 1 (a division the
    // compiler made branch-free was 2% of a cache-model run).
    if speedup == 1.0 {
        replay_batches(run, trace, |t| t, progress)
    } else {
        replay_batches(run, trace, move |t| (t as f64 / speedup) as u64, progress)
    }
}

/// How many requests ahead the replay starts a lookup (`Engine::prefetch`): measured
/// on the 10 M-request Zipf trace of `bench sim`, 4–32 ahead all help (6–8% of the engine's
/// time at 8); a second stage that also prefetched the slot record the entry names cost
/// more than it saved (its own reads of the entry).
const PREFETCH_AHEAD: usize = 8;

/// [`replay_in_order`]'s loop, a batch of the reader's at a time (its VM names hold for
/// the whole batch; a request per call moved through `Result<Option<_>>` cost
/// store-forwarding stalls), `at` mapping a trace time to the replay's.
fn replay_batches(
    run: &mut Run<'_>,
    trace: &mut crate::read_ahead::ReadAhead,
    at: impl Fn(u64) -> u64,
    progress: &mut dyn FnMut(Progress),
) -> Result<(), SimError> {
    let (mut n, mut done) = (0u64, Vec::new());
    while let Some(batch) = trace.take_batch()? {
        for (i, req) in batch.iter().enumerate() {
            // The lookup of a request `PREFETCH_AHEAD` on, started now.
            if let Some(r) = batch.get(i + PREFETCH_AHEAD) {
                run.node.engine.prefetch(r.vm, r.offset);
            }
            let now = at(req.time_ns);
            run.check_windows(now)?;
            run.advance_to(now);
            run.node.take_done(&mut done);
            done.clear();
            if req.vm as usize >= run.names.len() {
                run.admit(trace.vm_names(), now)?;
                run.advance_to(now);
            }
            run.issue_advanced(now, req, 0)?;
            n += 1;
            if n.is_multiple_of(65_536) {
                progress(Progress { done: n, total: None });
            }
        }
        trace.recycle(batch);
    }
    Ok(())
}
