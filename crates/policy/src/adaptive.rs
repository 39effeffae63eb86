//! `adaptive`: cachevisor's own allocator, beyond the seeds — the exact split of the pool
//! on each VM's recent hit curve, with a long memory, idle VMs let go, and
//! shrinks paced by what they write back.
//!
//! What each part is for (measured on `experiment policy-compare`, docs/policies.md):
//! - **Curves with a long memory.** Exact LRU hit curves at the allocation unit (the
//!   controller's online profiler), counts halved every `half_life` windows (default 20)
//!   rather than every window as `optimal-online` does. A VM whose reuse spans minutes
//!   (CloudPhysics: near-linear gain up to its 1 GiB working set) keeps the cache it will
//!   come back to; with a one-window memory a quiet phase hands its cache to a VM with a
//!   better recent window, and the next busy phase finds it cold.
//! - **The split**: [`crate::optimal::solve`], the exact DP over allocation units (the
//!   same as `optimal`), on those curves.
//! - **Hysteresis** (off by default): the split changes only when the new one gains more
//!   than `hysteresis` of the VMs' recent accesses over the current targets on the same
//!   curves. It was 0.2%; with paced shrinks moving blocks costs little, and on the
//!   demo's mix 0.2% held the arrival's equal split for 30 windows while CloudPhysics's
//!   curve built up (hit ratio 40.6% against the shared cache's 41.4%; off, 41.6%; every
//!   policy-compare claim holds either way — docs/policies.md).
//! - **Idle VMs let go**: a VM with no requests for `idle_windows` windows (default 3)
//!   counts as gaining nothing, so its cache goes to VMs that use it (a decayed curve
//!   would hold it for many half-lives).
//! - **Paced shrinks** ([`cachevisor_engine::Engine::set_target_paced`]): an eager shrink
//!   evicts to the new target at once and writes the evicted dirty blocks back in one
//!   burst that the VM's disk queues its next requests behind (p99.9 of 190–290 ms for
//!   tpcc and the weak VM at 64 MiB against static's 42–94 ms). Paced, a VM above its
//!   target gives one block up per miss of a growing VM that finds no free slot, so the
//!   write-backs spread over the misses that need the space, as in a shared cache.
//! - Space no curve gains from goes to the VMs active in the last window, in proportion to
//!   their recent accesses (by weight when none is).
//! - **A VM arriving gets an equal share at once** (of the VMs not idle), until a window of
//!   its requests has been counted: its curve is empty then, so the DP gave it nothing and
//!   its misses bypassed the cache for its first window while its cold disk queued
//!   (SymFlex's mix, 5 s windows: p99.9 129 ms against static's 92, all of it from the
//!   first 25 s; with the share, 92).
//! - **Write-back or write-through per VM**, from its writes (`write_choice`, on by
//!   default): write-back writes each dirty block back on its own, later — when evicted
//!   (in a miss's path), ahead of eviction, or when a shrink takes the VM's blocks —
//!   write-through each write request as it comes. The decayed ratio of the two
//!   ([`ReuseMix::writeback_write_ratio`]) says whether write-back saves the VM's disk
//!   any writes (under 1: rewrites absorbed). A write-back VM whose busy disk it does not
//!   save writes (ratio above `write_through_above`, default 1) moves to write-through,
//!   and back below `write_back_below` (default 0.8) or once its disk is mostly idle;
//!   between the two, and for VMs on other policies (read-only, write-around), the policy
//!   stays. The debt write-back leaves on a busy disk is paid in its misses' tails: on
//!   policy-compare's mixes a threshold of 2 (only where write-back doubled the writes:
//!   tpcc 3.0, CloudPhysics up to 9.9) left adaptive's p99.9 above static's on three of
//!   eight held-out mixes (a donor's dirty blocks written back while it shrank); at 1 it
//!   is under static's on all of them and on the bundled mix at every size, at the cost
//!   of slower writes for VMs like the strong one (ratio 1.7–1.9: 20 ms instead of 0.4
//!   when its disk is busy) — docs/policies.md.

use crate::allocator::{Allocator, Decision, Needs, Pool, ReuseMix, VmDemand};
use crate::optimal::{hits, solve};
use crate::params::{ParamReader, Params};
use crate::static_share::{share_leftover, weighted_split};
use cachevisor_engine::WritePolicy;

/// Default half-life of the curves' counts, in windows.
pub const HALF_LIFE: f64 = 20.0;
/// Default share of recent accesses a new split must gain to replace the current one
/// (off: see the file's comment).
pub const HYSTERESIS: f64 = 0.0;
/// Default windows without requests after which a VM is idle.
pub const IDLE_WINDOWS: f64 = 3.0;
/// Default backing-write ratio (write-back over write-through) above which a write-back
/// VM moves to write-through: write-back saves its disk no writes.
pub const WRITE_THROUGH_ABOVE: f64 = 1.0;
/// Default ratio below which a write-through VM moves (back) to write-back.
pub const WRITE_BACK_BELOW: f64 = 0.8;
/// Write requests (decayed) a VM must have made before its write policy is chosen.
pub const MIN_WRITE_REQUESTS: f64 = 64.0;
/// Share of a window a VM's backing store must be busy for write-through to be chosen.
pub const BUSY_FOR_WRITE_THROUGH: f64 = 0.5;
/// Busy share under which a write-through VM goes back to write-back.
pub const IDLE_FOR_WRITE_BACK: f64 = 0.25;

/// The adaptive allocator and what it remembers between windows.
#[derive(Debug, Clone)]
pub struct Adaptive {
    /// Half-life of the curves' counts in windows.
    pub half_life: u32,
    /// Share of recent accesses a new split must gain.
    pub hysteresis: f64,
    /// Windows without requests after which a VM is idle.
    pub idle_windows: u32,
    /// Whether it chooses write-back or write-through per VM.
    pub write_choice: bool,
    /// Backing-write ratio above which a write-back VM moves to write-through.
    pub write_through_above: f64,
    /// Ratio below which a write-through VM moves to write-back.
    pub write_back_below: f64,
    /// Consecutive windows without requests, per VM.
    quiet: Vec<u32>,
    /// Per VM: a window with its requests has been counted (its curve means something).
    measured: Vec<bool>,
}

impl Default for Adaptive {
    fn default() -> Self {
        Adaptive {
            half_life: HALF_LIFE as u32,
            hysteresis: HYSTERESIS,
            idle_windows: IDLE_WINDOWS as u32,
            write_choice: true,
            write_through_above: WRITE_THROUGH_ABOVE,
            write_back_below: WRITE_BACK_BELOW,
            quiet: Vec::new(),
            measured: Vec::new(),
        }
    }
}

impl Adaptive {
    /// With the parameters of `p` over the defaults.
    pub fn from_params(p: &Params) -> Result<Self, String> {
        let mut r = ParamReader::new("adaptive", p);
        let half_life = r.get("half_life", HALF_LIFE, 1.0, 10_000.0)? as u32;
        let hysteresis = r.get("hysteresis", HYSTERESIS, 0.0, 1.0)?;
        let idle_windows = r.get("idle_windows", IDLE_WINDOWS, 1.0, 1e6)? as u32;
        let write_choice = r.get("write_choice", 1.0, 0.0, 1.0)?;
        if write_choice != 0.0 && write_choice != 1.0 {
            return Err(format!("adaptive: write_choice = {write_choice}: must be 0 (keep) or 1 (choose)"));
        }
        let write_through_above = r.get("write_through_above", WRITE_THROUGH_ABOVE, 0.0, 1e6)?;
        let write_back_below = r.get("write_back_below", WRITE_BACK_BELOW, 0.0, 1e6)?;
        if write_back_below > write_through_above {
            return Err(format!(
                "adaptive: write_back_below = {write_back_below} is above write_through_above = {write_through_above}: a VM would flap between the two"
            ));
        }
        r.finish()?;
        Ok(Adaptive {
            half_life,
            hysteresis,
            idle_windows,
            write_choice: write_choice == 1.0,
            write_through_above,
            write_back_below,
            quiet: Vec::new(),
            measured: Vec::new(),
        })
    }

    /// The write policy for a VM on `now` with reuse kinds `mix`: `Some` only to move it
    /// between write-back and write-through (see the file's comment).
    /// `busy`: the share of the last window its backing store was busy, when known.
    pub fn write_policy(&self, now: Option<WritePolicy>, mix: &ReuseMix, busy: Option<f64>) -> Option<WritePolicy> {
        if !self.write_choice || mix.write_requests < MIN_WRITE_REQUESTS {
            return None;
        }
        let ratio = mix.writeback_write_ratio()?;
        let busy_disk = busy.is_none_or(|b| b >= BUSY_FOR_WRITE_THROUGH);
        let idle_disk = busy.is_some_and(|b| b < IDLE_FOR_WRITE_BACK);
        match now? {
            WritePolicy::Wb if ratio > self.write_through_above && busy_disk => Some(WritePolicy::Wt),
            WritePolicy::Wt if ratio < self.write_back_below || idle_disk => Some(WritePolicy::Wb),
            _ => None,
        }
    }

    /// Counts quiet windows; a call with no VM's window counted (VMs arriving) changes
    /// nothing.
    fn note_windows(&mut self, vms: &[VmDemand]) {
        self.quiet.resize(vms.len(), 0);
        self.measured.resize(vms.len(), false);
        if vms.iter().all(|v| v.window_requests == 0) {
            return;
        }
        for ((q, m), v) in self.quiet.iter_mut().zip(self.measured.iter_mut()).zip(vms) {
            *q = if v.window_requests == 0 { q.saturating_add(1) } else { 0 };
            *m |= v.window_requests > 0;
        }
    }
}

impl Allocator for Adaptive {
    fn name(&self) -> &'static str {
        "adaptive"
    }

    fn every_interval(&self) -> bool {
        true
    }

    /// S3-FIFO: over LRU partitions the unmanaged shared CLOCK cache beats adaptive on
    /// the shipped ECI-endurance and SymFlex mixes by its replacement alone (shared LRU is
    /// at adaptive-over-LRU's level); over S3-FIFO adaptive is above it on every mix
    /// measured (docs/policies.md).
    fn replacement(&self) -> cachevisor_engine::ReplacementKind {
        cachevisor_engine::ReplacementKind::S3fifo
    }

    fn needs(&self) -> Needs {
        Needs { hit_curves: true, reuse_mix: self.write_choice, curve_half_life: self.half_life, ..Needs::default() }
    }

    fn allocate(&mut self, pool: &Pool, vms: &[VmDemand]) -> Decision {
        let (capacity, unit) = (pool.capacity, pool.unit.max(1));
        let units = (capacity / unit) as usize;
        let min_units: Vec<usize> = vms.iter().map(|v| v.min_blocks.div_ceil(unit) as usize).collect();
        if min_units.iter().sum::<usize>() > units || vms.iter().all(|v| v.hit_curve.is_empty()) {
            // Minimums that do not fit, or nothing measured yet: weighted shares.
            return Decision::targets(weighted_split(capacity, vms));
        }
        self.note_windows(vms);
        let idle: Vec<bool> = self.quiet.iter().map(|&q| q >= self.idle_windows).collect();
        let curves: Vec<&[f64]> =
            vms.iter().zip(&idle).map(|(v, &i)| if i { &[][..] } else { v.hit_curve.as_slice() }).collect();
        // A VM with nothing measured yet (it just arrived) gets an equal share of the
        // active VMs' space until its first window gives it a curve: left to the DP it
        // would get none, and its misses would bypass the cache for that window while the
        // cold disks queue.
        let active_vms = idle.iter().filter(|&&i| !i).count().max(1);
        let floors: Vec<usize> = min_units
            .iter()
            .zip(self.measured.iter().zip(&idle))
            .map(|(&m, (&seen, &idle))| if seen || idle { m } else { m.max(units / active_vms) })
            .collect();
        let floors = if floors.iter().sum::<usize>() <= units { floors } else { min_units };
        let ideal: Vec<u64> = solve(units, &curves, &floors).into_iter().map(|k| k as u64 * unit).collect();

        let current: Vec<u64> = vms.iter().map(|v| v.target_blocks).collect();
        let valid = current.iter().sum::<u64>() <= capacity
            && current.iter().any(|&t| t > 0)
            && floors.iter().zip(&current).all(|(&f, &t)| t >= f as u64 * unit);
        let total = |t: &[u64]| -> f64 { curves.iter().zip(t).map(|(c, &b)| hits(c, (b / unit) as usize)).sum() };
        let accesses: f64 = vms.iter().zip(&idle).filter(|(_, &i)| !i).map(|(v, _)| v.accesses).sum();
        let keep = valid && total(&ideal) - total(&current) <= self.hysteresis * accesses;
        let mut targets = if keep { current } else { ideal };
        // Space no curve gains from: to the VMs active in the last window, by their
        // accesses (weights only: no VM's curves are copied).
        let active: Vec<f64> = vms.iter().zip(&idle).map(|(v, &i)| if i { 0.0 } else { v.accesses.max(0.0) }).collect();
        if active.iter().any(|&w| w > 0.0) {
            share_leftover(&mut targets, capacity, &active);
        } else {
            share_leftover(&mut targets, capacity, &vms.iter().map(|v| v.weight).collect::<Vec<_>>());
        }
        let write_policies =
            vms.iter().map(|v| self.write_policy(v.write_policy, &v.reuse_mix, v.backing_busy)).collect();
        Decision { paced_shrinks: true, write_policies, ..Decision::targets(targets) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A VM with a linear curve (hits `slope` per unit up to `sat` units), holding `target`.
    fn vm(slope: f64, sat: usize, target: u64, window_requests: u64) -> VmDemand {
        VmDemand {
            weight: 1.0,
            hit_curve: (0..=8).map(|k| slope * k.min(sat) as f64).collect(),
            accesses: slope * 10.0,
            target_blocks: target,
            used_blocks: target,
            window_requests,
            ..Default::default()
        }
    }

    fn pool() -> Pool {
        Pool::new(800, 100)
    }

    #[test]
    fn splits_as_the_exact_dp_and_paces_its_shrinks() {
        let mut a = Adaptive::default();
        let d = a.allocate(&pool(), &[vm(10.0, 6, 0, 1), vm(5.0, 8, 0, 1)]);
        assert_eq!(d.targets, [600, 200]);
        assert!(d.paced_shrinks);
    }

    #[test]
    fn a_small_gain_keeps_the_current_split_and_a_large_one_moves_it() {
        let mut a = Adaptive { hysteresis: 0.05, ..Adaptive::default() };
        // Optimal is 600/200; 500/300 loses 10 − 5 = 5 hits of 150 accesses (3.3% < 5%).
        let d = a.allocate(&pool(), &[vm(10.0, 6, 500, 1), vm(5.0, 8, 300, 1)]);
        assert_eq!(d.targets, [500, 300]);
        // 200/600 loses 4 × 5 = 20 hits (13% > 5%): it moves to the optimum.
        let d = a.allocate(&pool(), &[vm(10.0, 6, 200, 1), vm(5.0, 8, 600, 1)]);
        assert_eq!(d.targets, [600, 200]);
        // Without hysteresis the smallest gain moves it.
        let mut a = Adaptive { hysteresis: 0.0, ..Adaptive::default() };
        assert_eq!(a.allocate(&pool(), &[vm(10.0, 6, 500, 1), vm(5.0, 8, 300, 1)]).targets, [600, 200]);
    }

    #[test]
    fn an_idle_vm_lets_its_cache_go_after_its_quiet_windows() {
        let mut a = Adaptive { idle_windows: 2, ..Adaptive::default() };
        let busy = |t| vm(5.0, 8, t, 10);
        // VM 0 has the better curve but stops issuing requests.
        let mut t = [600u64, 200];
        let mut history = Vec::new();
        for _ in 0..3 {
            let d = a.allocate(&pool(), &[vm(10.0, 6, t[0], 0), busy(t[1])]);
            t = [d.targets[0], d.targets[1]];
            history.push(t);
        }
        assert_eq!(history[0], [600, 200], "one quiet window changes nothing");
        assert_eq!(history[1], [0, 800], "idle after two: all of it to the busy VM");
        // A call between windows (VMs arriving: nobody's requests counted) does not age it.
        let mut b = Adaptive { idle_windows: 1, ..Adaptive::default() };
        b.allocate(&pool(), &[vm(10.0, 6, 600, 1), vm(5.0, 8, 200, 1)]);
        let d = b.allocate(&pool(), &[vm(10.0, 6, 600, 0), vm(5.0, 8, 200, 0)]);
        assert_eq!(d.targets, [600, 200]);
    }

    #[test]
    fn a_vm_arriving_gets_an_equal_share_until_its_first_window() {
        let mut a = Adaptive::default();
        // VM 0 measured, holding everything; VM 1 arrives (no window of its counted yet,
        // a curve from its first few requests): it gets half at once, not what its empty
        // curve is worth to the DP (nothing, its misses bypassing the cache meanwhile).
        let d = a.allocate(&pool(), &[vm(10.0, 8, 800, 5)]);
        assert_eq!(d.targets, [800]);
        let arriving = VmDemand { hit_curve: vec![0.0; 9], accesses: 1.0, ..vm(0.0, 0, 0, 0) };
        let d = a.allocate(&pool(), &[vm(10.0, 8, 800, 0), arriving.clone()]);
        assert_eq!(d.targets, [400, 400]);
        // Once a window of its is counted, its curve decides (here: worth nothing).
        let d = a.allocate(&pool(), &[vm(10.0, 8, 400, 5), VmDemand { window_requests: 5, ..arriving }]);
        assert_eq!(d.targets, [800, 0]);
    }

    #[test]
    fn space_no_curve_gains_from_goes_to_the_active_vms() {
        let mut a = Adaptive::default();
        // Both saturate at 2 units; VM 1 is idle for good.
        let mut quiet = vm(10.0, 2, 0, 0);
        a.quiet = vec![0, 10];
        quiet.hit_curve = vec![0.0; 9];
        let d = a.allocate(&pool(), &[vm(10.0, 2, 0, 5), quiet]);
        assert_eq!(d.targets, [800, 0]);
    }

    #[test]
    fn parameters_are_checked() {
        let p: Params = [("half_life".to_string(), 0.0)].into();
        assert!(Adaptive::from_params(&p).unwrap_err().contains("half_life"));
        let p: Params = [("shrink".to_string(), 1.0)].into();
        assert!(Adaptive::from_params(&p).unwrap_err().contains("unknown"));
        let p: Params = [("half_life".to_string(), 5.0)].into();
        assert_eq!(Adaptive::from_params(&p).unwrap().needs().curve_half_life, 5);
        let p: Params = [("write_choice".to_string(), 0.5)].into();
        assert!(Adaptive::from_params(&p).unwrap_err().contains("write_choice"));
        let p: Params = [("write_back_below".to_string(), 3.0)].into();
        assert!(Adaptive::from_params(&p).unwrap_err().contains("flap"));
        let p: Params = [("write_choice".to_string(), 0.0)].into();
        assert!(!Adaptive::from_params(&p).unwrap().needs().reuse_mix);
    }

    /// Reuse kinds of `requests` write requests of `blocks` blocks each, `rewrites` of
    /// them rewrites.
    fn writes(requests: f64, blocks: f64, rewrites: f64) -> ReuseMix {
        ReuseMix {
            writes: requests * blocks,
            write_requests: requests,
            write_after_write: rewrites,
            ..Default::default()
        }
    }

    #[test]
    fn multi_block_writes_seldom_rewritten_move_a_vm_to_write_through_and_back() {
        let a = Adaptive::default();
        let (wb, wt) = (Some(WritePolicy::Wb), Some(WritePolicy::Wt));
        // 8-block writes, never rewritten: write-back writes 8× the disk writes.
        assert_eq!(a.write_policy(wb, &writes(100.0, 8.0, 0.0), None), wt);
        // One-block writes: write-back costs no extra disk write; it stays.
        assert_eq!(a.write_policy(wb, &writes(100.0, 1.0, 0.0), None), None);
        // Two-block writes, a tenth rewritten (ratio 1.8, policy-compare's strong VM):
        // write-back costs its disk more writes than write-through saves; it moves.
        assert_eq!(a.write_policy(wb, &writes(100.0, 2.0, 20.0), None), wt);
        // Between the thresholds (ratio 0.9): no change either way.
        assert_eq!(a.write_policy(wb, &writes(100.0, 1.0, 10.0), None), None);
        assert_eq!(a.write_policy(wt, &writes(100.0, 1.0, 10.0), None), None);
        // Rewrites absorbed (ratio 0.6): a write-through VM goes back to write-back.
        assert_eq!(a.write_policy(wt, &writes(100.0, 4.0, 340.0), None), wb);
        // Too few writes to tell, other policies, unknown policy, or the choice off: kept.
        assert_eq!(a.write_policy(wb, &writes(10.0, 8.0, 0.0), None), None);
        assert_eq!(a.write_policy(Some(WritePolicy::Ro), &writes(100.0, 8.0, 0.0), None), None);
        assert_eq!(a.write_policy(None, &writes(100.0, 8.0, 0.0), None), None);
        // Measured busy shares: write-through only for a disk busy at least half the time;
        // back to write-back when the disk is mostly idle, whatever the ratio.
        assert_eq!(a.write_policy(wb, &writes(100.0, 8.0, 0.0), Some(0.9)), wt);
        assert_eq!(a.write_policy(wb, &writes(100.0, 8.0, 0.0), Some(0.3)), None);
        assert_eq!(a.write_policy(wt, &writes(100.0, 8.0, 0.0), Some(0.3)), None);
        assert_eq!(a.write_policy(wt, &writes(100.0, 8.0, 0.0), Some(0.1)), wb);
        let off = Adaptive { write_choice: false, ..Adaptive::default() };
        assert_eq!(off.write_policy(wb, &writes(100.0, 8.0, 0.0), None), None);
    }

    #[test]
    fn the_decision_carries_each_vms_write_policy() {
        let mut a = Adaptive::default();
        let mut vms = vec![vm(1.0, 4, 0, 10), vm(1.0, 4, 0, 10)];
        vms[0].write_policy = Some(WritePolicy::Wb);
        vms[0].reuse_mix = writes(100.0, 8.0, 0.0);
        vms[1].write_policy = Some(WritePolicy::Wb);
        vms[1].reuse_mix = writes(100.0, 1.0, 0.0);
        let d = a.allocate(&pool(), &vms);
        assert_eq!(d.write_policies, [Some(WritePolicy::Wt), None]);
        assert!(a.needs().reuse_mix);
    }
}
