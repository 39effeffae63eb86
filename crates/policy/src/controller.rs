//! The interval controller, one piece of code for the simulator and the daemon: it keeps
//! the per-VM estimates an allocator declared it needs (decayed online hit and read
//! curves at the allocation unit, reuse kinds, sampled rECS, AllocUnit, hit throughput),
//! builds each VM's [`VmDemand`] at a window's end, asks the allocator, and turns the
//! decision into engine commands (write policies first, then targets, shrinks before
//! grows). Sans-IO: drivers feed requests and window counters, and execute the device
//! operations the commands return.

use crate::allocator::{Allocator, Decision, Needs, Pool, ReuseMix, VmDemand};
use cachevisor_analysis::recs::{self, RecsEstimator};
use cachevisor_analysis::{Decay, Interval, IntervalProfiler};
use cachevisor_engine::{Engine, Output};
use cachevisor_trace::{Request, VmId};
use std::collections::VecDeque;

/// Allocation units the hit curves are sampled at (the resolution of the optimal DP).
pub const CURVE_UNITS: u64 = 256;
/// Windows S-CAVE's AllocUnit averages over ("recent time windows", §V-A).
pub const ALLOC_UNIT_WINDOWS: usize = 3;

/// One VM's configured settings (phases may change them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VmSettings {
    /// Share relative to other VMs.
    pub weight: f64,
    /// Target share of hit throughput.
    pub ratio: f64,
    /// Smallest allocation in blocks.
    pub min_blocks: u64,
}

impl Default for VmSettings {
    fn default() -> Self {
        VmSettings { weight: 1.0, ratio: 1.0, min_blocks: 0 }
    }
}

/// Curves and reuse kinds of one VM from elsewhere (a whole-trace pre-pass, an oracle).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Estimates {
    /// Hits of all accesses at sizes 0, unit, 2·unit, …
    pub all: Vec<f64>,
    /// Read hits at the same sizes.
    pub read: Vec<f64>,
    /// Block accesses behind the curves.
    pub accesses: f64,
    /// Reuse kinds.
    pub mix: ReuseMix,
}

/// One VM's counters over a window, as the engine counts them for every driver.
pub use cachevisor_engine::WindowCounts;

/// rECS sampling periods per window (S-CAVE §IV-B: five): a driver's interval has this
/// many sampling points (`Schedule::samples`), the last its end.
pub const RECS_PERIODS: u32 = 5;

/// What an interval's end gave ([`Controller::end_interval`]).
#[derive(Debug, Clone)]
pub struct IntervalEnd {
    /// Smoothed rECS per VM (`None`: not sampled).
    pub recs: Vec<Option<f64>>,
    /// The allocator's decision, when it ran.
    pub decision: Option<Decision>,
}

/// Most slots one rECS sampling period scans (see [`Controller::new`]).
pub const RECS_SCAN_MAX: u64 = 4096;

/// The controller of one cache pool.
pub struct Controller {
    allocator: Box<dyn Allocator>,
    needs: Needs,
    slots: u64,
    unit: u64,
    recs: RecsEstimator,
    online: Option<IntervalProfiler>,
    miss_history: Vec<VecDeque<u64>>,
    settings: Vec<VmSettings>,
    /// VMs that are gone (a removed vDisk): no share, no cache.
    retired: Vec<bool>,
    /// Per VM: its backing store's busy time (`Engine::backing_busy_ns`) at the last
    /// decision, to tell each window's share.
    busy_seen: Vec<u64>,
}

impl Controller {
    /// A controller of `slots` blocks of `block_size` bytes. With `online`, the curves the
    /// allocator needs are estimated from the requests it observes (exact distances,
    /// counts halved each window, or at the half-life the allocator asks for); without, they must be passed to [`Self::decide`].
    pub fn new(allocator: Box<dyn Allocator>, slots: u64, block_size: u64, online: bool) -> Self {
        let needs = allocator.needs();
        let unit = (slots / CURVE_UNITS).max(1);
        let wants = needs.hit_curves || needs.read_curves || needs.reuse_mix;
        let online = (online && wants).then(|| {
            let decay = Decay::Factor(0.5f64.powf(1.0 / needs.curve_half_life.max(1) as f64));
            let p = IntervalProfiler::new(block_size, Interval::Requests(u64::MAX), decay, Vec::new(), 0.95)
                .with_resolution(unit, (slots / unit) as usize);
            if needs.reuse_mix {
                p.with_reuse_mix()
            } else {
                p
            }
        });
        Controller {
            allocator,
            needs,
            slots,
            unit,
            // S-CAVE §IV-B: 5 sampling periods per window, α = 0.8; each period scans 1/50
            // of the pool, at least 1,024 and at most 4,096 blocks. The seed's scan stops
            // when its 0.1 s period times out — a budget, not a share of the pool: a share
            // made the scans of a 2.4 GiB cache 43% of a simulation (every window scanned
            // 63 K slots), and a pool of up to 800 MiB of 4 KiB blocks scans as before.
            recs: RecsEstimator::new(recs::ALPHA, RECS_PERIODS, (slots / 50).clamp(1024, RECS_SCAN_MAX), 1),
            online,
            miss_history: Vec::new(),
            settings: Vec::new(),
            retired: Vec::new(),
            busy_seen: Vec::new(),
        }
    }

    /// The allocator.
    pub fn allocator(&self) -> &dyn Allocator {
        self.allocator.as_ref()
    }

    /// Curve step in blocks.
    pub fn unit(&self) -> u64 {
        self.unit
    }

    /// Curve points past 0.
    pub fn units(&self) -> usize {
        (self.slots / self.unit) as usize
    }

    /// Registers the next VM id.
    pub fn add_vm(&mut self, s: VmSettings) {
        self.settings.push(s);
        self.miss_history.push(VecDeque::new());
        self.retired.push(false);
    }

    /// Takes VM `vm` out of allocation for good (its id is not reused): weight 0, and every
    /// decision gives it no cache and leaves its write policy alone.
    pub fn retire_vm(&mut self, vm: usize) {
        self.settings[vm] = VmSettings { weight: 0.0, min_blocks: 0, ..self.settings[vm] };
        self.retired[vm] = true;
    }

    /// The weights and throughput ratios of the VMs not retired, each summed (their
    /// side's claim on a budget it shares with others: `vssd.budget = "shared"`).
    pub fn claim(&self) -> (f64, f64) {
        let live = || self.settings.iter().zip(&self.retired).filter(|(_, &r)| !r).map(|(s, _)| s);
        (live().map(|s| s.weight).sum(), live().map(|s| s.ratio).sum())
    }

    /// Whether VM `vm` is retired.
    pub fn is_retired(&self, vm: usize) -> bool {
        self.retired[vm]
    }

    /// A VM's settings, to change (phases).
    pub fn settings_mut(&mut self, vm: usize) -> &mut VmSettings {
        &mut self.settings[vm]
    }

    /// Whether requests should be observed (online estimates are kept).
    pub fn observes(&self) -> bool {
        self.online.is_some()
    }

    /// Feeds one request to the online estimates.
    #[inline]
    pub fn observe(&mut self, r: &Request) {
        if let Some(o) = self.online.as_mut() {
            o.add(r);
        }
    }

    /// Samples rECS over the pool: (smoothed, last window's raw samples) by VM id.
    fn sample_recs(&mut self, e: &Engine) -> (Vec<Option<f64>>, Vec<Option<f64>>) {
        let smoothed = self.recs.sample_window(e.slot_count(), |s| e.slot_referenced(s as u32)).to_vec();
        (smoothed, self.recs.sampled().to_vec())
    }

    /// A sampling point of the interval (the engine's `Event::Sample`: the `k`-th of
    /// `of`): the rECS periods due by k/of of the window run now, on the pool as it is,
    /// so the periods spread over the window as S-CAVE's do (§IV-B, footnote 3); the
    /// window's end runs the rest ([`Self::end_interval`]).
    pub fn sample(&mut self, k: u32, of: u32, e: &Engine) {
        let share = f64::from(k) / f64::from(of.max(1));
        self.recs.sample_due(share, e.slot_count(), |s| e.slot_referenced(s as u32));
    }

    /// The window's counters of VMs `0..vms`, taken from the engine (which counts them
    /// as requests run, for every driver alike) and reset there.
    pub fn take_counts(&self, e: &mut Engine, vms: usize) -> Vec<WindowCounts> {
        let mut c = e.take_window_counts(vms);
        c.truncate(vms);
        c
    }

    /// The interval sequence both drivers run when an interval (a window) ends, in its
    /// one order: rECS sampled over the pool (S-CAVE §IV-B), the window's counters taken
    /// (AllocUnit's miss history, §IV-C), and with `allocate` the allocator's decision on
    /// the window (`secs` long; `estimates` as in [`Self::decide`]) after which the next
    /// window of online estimates starts (past counts decay). The driver applies the
    /// decision ([`apply`]) its own way. Returns the smoothed rECS per VM and the decision.
    pub fn end_interval(
        &mut self,
        e: &Engine,
        counts: &[WindowCounts],
        secs: f64,
        allocate: bool,
        estimates: Option<&[Estimates]>,
    ) -> IntervalEnd {
        let (recs, sampled) = self.sample_recs(e);
        self.end_window(counts);
        let decision = allocate.then(|| {
            let d = self.decide(e, Some((counts, secs)), &sampled, estimates);
            self.next_window();
            d
        });
        IntervalEnd { recs, decision }
    }

    /// Takes a window's counters (AllocUnit history).
    fn end_window(&mut self, counts: &[WindowCounts]) {
        for (h, c) in self.miss_history.iter_mut().zip(counts) {
            h.push_back(c.accesses - c.hits);
            if h.len() > ALLOC_UNIT_WINDOWS {
                h.pop_front();
            }
        }
    }

    /// Each VM's demand: settings, partition, and what the allocator needs — from
    /// `estimates` when given, else the online estimates. `window` = the last window's
    /// counters and its length in seconds; `recs` = raw rECS samples.
    pub fn demands(
        &self,
        e: &Engine,
        window: Option<(&[WindowCounts], f64)>,
        recs: &[Option<f64>],
        estimates: Option<&[Estimates]>,
    ) -> Vec<VmDemand> {
        let units = self.units();
        (0..self.settings.len())
            .map(|vm| {
                let v = vm as VmId;
                let p = e.partition(v);
                let set = self.settings[vm];
                let h = &self.miss_history[vm];
                let mut d = VmDemand {
                    weight: set.weight,
                    throughput_ratio: set.ratio,
                    min_blocks: set.min_blocks,
                    target_blocks: p.target,
                    used_blocks: p.used,
                    dirty_blocks: p.dirty_blocks,
                    write_policy: Some(p.write_policy),
                    recs: recs.get(vm).copied().flatten(),
                    alloc_unit: if h.is_empty() { 0 } else { h.iter().sum::<u64>() / h.len() as u64 },
                    ..Default::default()
                };
                if let Some((c, secs)) = window.and_then(|(w, s)| w.get(vm).map(|c| (c, s))) {
                    let busy = e.backing_busy_ns(v).saturating_sub(self.busy_seen.get(vm).copied().unwrap_or(0));
                    d.backing_busy = (secs > 0.0).then(|| (busy as f64 / (secs * 1e9)).min(1.0));
                    d.hit_throughput = c.hits as f64 / secs.max(1e-9);
                    d.window_requests = c.requests;
                    d.hit_ratio = (c.accesses > 0).then(|| c.hits as f64 / c.accesses as f64);
                }
                if let Some(est) = estimates {
                    if let Some(w) = est.get(vm) {
                        d.hit_curve = w.all.clone();
                        d.read_curve = w.read.clone();
                        d.accesses = w.accesses;
                        d.reuse_mix = w.mix;
                    }
                } else if let Some(o) = &self.online {
                    if self.needs.hit_curves {
                        d.hit_curve = o.histogram(v).map(|h| h.hits_curve(self.unit, units)).unwrap_or_default();
                    }
                    if self.needs.read_curves {
                        d.read_curve = o.read_histogram(v).map(|h| h.hits_curve(self.unit, units)).unwrap_or_default();
                    }
                    d.accesses = o.histogram(v).map_or(0.0, |h| h.total());
                    d.reuse_mix = o.reuse_mix(v).unwrap_or_default();
                }
                d
            })
            .collect()
    }

    /// Asks the allocator (see [`Self::demands`]).
    pub fn decide(
        &mut self,
        e: &Engine,
        window: Option<(&[WindowCounts], f64)>,
        recs: &[Option<f64>],
        estimates: Option<&[Estimates]>,
    ) -> Decision {
        let demands = self.demands(e, window, recs, estimates);
        if window.is_some() {
            self.busy_seen = (0..self.settings.len()).map(|vm| e.backing_busy_ns(vm as VmId)).collect();
        }
        // Slots lent out of the cache (a vSSD region sharing the SSD) are not the pool's.
        let capacity = self.slots.saturating_sub(e.withheld_slots());
        let pool = Pool { capacity, unit: self.unit, free_blocks: e.free_slots() };
        let mut d = self.allocator.allocate(&pool, &demands);
        for (vm, _) in self.retired.iter().enumerate().filter(|(_, &r)| r) {
            d.targets[vm] = 0;
            d.write_policies[vm] = None;
        }
        d
    }

    /// Starts the next window of online estimates (past counts decay).
    fn next_window(&mut self) {
        if let Some(o) = self.online.as_mut() {
            o.close();
        }
    }
}

/// Applies `d` through engine commands — changed write policies first (leaving write-back
/// writes back at once; with the decision's paced shrinks, between write-back and
/// write-through lazily; none for a vDisk that passes through), then targets,
/// shrinks before grows (paced ones when the decision asks) — and returns every
/// command's device operations, in a safe sequential order, for the driver to execute.
pub fn apply(e: &mut Engine, d: &Decision) -> Output {
    let mut all = Output::default();
    let mut one = Output::default();
    for (v, p) in d.write_policies.iter().enumerate() {
        // A vDisk passing through (device errors, a detached cache) stays read-only
        // until its driver ends the pass-through (`Engine::set_bypass`).
        if e.bypassed(v as VmId) {
            continue;
        }
        if let Some(p) = *p {
            let lazy = |e: &mut Engine| d.paced_shrinks && e.set_write_policy_lazy(v as VmId, p);
            if e.partition(v as VmId).write_policy != p && !lazy(e) {
                e.set_write_policy(v as VmId, p, &mut one);
                all.ops.extend_from_slice(&one.ops);
            }
        }
    }
    // A vDisk passing through after device errors keeps its target until drained
    // (`passthrough_drain.rs`): its dirty blocks stay cached, reads of them hit.
    let drained =
        |e: &Engine, v: usize| e.bypass_cause(v as VmId) == Some(cachevisor_engine::BypassCause::DeviceErrors);
    let mut order: Vec<usize> = (0..d.targets.len()).filter(|&v| !drained(e, v)).collect();
    order.sort_by_key(|&v| d.targets[v] > e.partition(v as VmId).target); // shrinks first
    for v in order {
        if d.paced_shrinks {
            e.set_target_paced(v as VmId, d.targets[v]);
        } else {
            e.set_target(v as VmId, d.targets[v], &mut one);
            all.ops.extend_from_slice(&one.ops);
        }
    }
    all
}

/// Largest weight or ratio: the allocators sum them (two at `f64::MAX` would overflow).
pub const MAX_SHARE: f64 = 1e6;

/// Checks a VM's weight or ratio (`key` names it): above 0, at most [`MAX_SHARE`] — one
/// rule for the daemon's config and API and the simulator's scenario and phases.
pub fn check_share(key: &str, v: f64) -> Result<(), String> {
    if v > 0.0 && v <= MAX_SHARE {
        Ok(())
    } else {
        // Shortest form that reads back (`1e308`, not its 309 digits).
        Err(format!("{key}: {v:e} is outside (0, {MAX_SHARE}]").replace("e0 ", " "))
    }
}

/// The global cleaner's watermarks in free slots (low, high) for an engine of `slots`
/// running `allocator`, for [`Engine::set_cleaner`]; only static partitions (a shared
/// cache has no targets to clean towards).
pub fn cleaner_watermarks(allocator: &dyn Allocator, slots: u64, static_partitions: bool) -> Option<(u64, u64)> {
    let w = allocator.cleaner().filter(|_| static_partitions)?;
    let blocks = |f: f64| ((f * slots as f64) as u64).max(1);
    Some((blocks(w.low), blocks(w.high)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_share_out_of_range_is_named_in_a_short_form() {
        // `weight = 1e308` printed its 309 digits.
        let e = check_share("vm[0].weight", 1e308).unwrap_err();
        assert!(e.starts_with("vm[0].weight: 1e308 is outside") && e.len() < 80, "{e}");
        assert!(check_share("w", 0.0).unwrap_err().starts_with("w: 0 is outside"));
        assert!(check_share("w", 1.5).is_ok());
    }

    use super::*;
    use cachevisor_engine::EngineConfig;

    #[test]
    fn each_sampling_point_runs_the_periods_due_by_then_and_the_end_the_rest() {
        let e = Engine::new(EngineConfig::with_slots(256)).unwrap();
        let mut c = Controller::new(crate::registry::build("static").unwrap(), 256, 4096, false);
        assert_eq!(c.recs.next_due(), Some(0.2));
        for k in 1..RECS_PERIODS {
            c.sample(k, RECS_PERIODS, &e);
            let next = (k + 1 < RECS_PERIODS).then(|| f64::from(k + 1) / f64::from(RECS_PERIODS));
            assert_eq!(c.recs.next_due(), next, "after point {k}");
        }
        c.sample(2, RECS_PERIODS, &e); // an earlier point again (a failover's new node) runs none
        assert_eq!(c.recs.next_due(), None);
        c.end_interval(&e, &[], 1.0, false, None);
        assert_eq!(c.recs.next_due(), Some(0.2), "the next window starts over");
    }

    #[test]
    fn a_retired_vm_gets_no_cache_and_the_others_share_it() {
        for name in crate::registry::NAMES {
            let e = Engine::new(EngineConfig {
                replacement: cachevisor_engine::ReplacementKind::Clock,
                ..EngineConfig::with_slots(1024)
            })
            .unwrap();
            let mut c = Controller::new(crate::registry::build(name).unwrap(), 1024, 4096, true);
            for _ in 0..3 {
                c.add_vm(VmSettings::default());
            }
            c.retire_vm(1);
            assert!(c.is_retired(1) && !c.is_retired(0));
            let d = c.decide(&e, None, &[], None);
            assert_eq!(d.targets[1], 0, "{name}: {:?}", d.targets);
            assert!(d.write_policies[1].is_none(), "{name}");
            if name == "static" {
                assert_eq!(d.targets[0] + d.targets[2], 1024, "{:?}", d.targets);
            }
        }
    }

    #[test]
    fn a_decision_leaves_a_passed_through_vdisk_read_only() {
        use cachevisor_engine::WritePolicy;
        let mut e = Engine::new(EngineConfig::with_slots(64)).unwrap();
        e.ensure_vm(0);
        e.ensure_vm(1);
        e.set_bypass(0, true);
        let d = Decision {
            write_policies: vec![Some(WritePolicy::Wb), Some(WritePolicy::Wt)],
            ..Decision::targets(vec![32, 32])
        };
        apply(&mut e, &d);
        assert_eq!(e.partition(0).write_policy, WritePolicy::Ro, "passes through: stays read-only");
        assert_eq!(e.partition(1).write_policy, WritePolicy::Wt);
        assert_eq!(e.partition(0).target, 32, "targets still apply");
    }
}
