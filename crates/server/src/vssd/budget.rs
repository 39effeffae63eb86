//! One SSD budget for the host-managed cache and the vSSD region (`vssd.budget =
//! "shared"`; SymFlex §2.2: the hypervisor's SSD is carved between guest-managed vSSDs
//! and its own caching): the region lives in the cache's blocks, a vSSD block being a run
//! of cache slots, and this loop moves blocks between the two as the vSSDs' targets
//! change. When the region's vSSDs lack blocks its free list cannot give (and it is below
//! its cap, `vssd.size`), it asks the engine to empty runs (`Engine::withhold`: dirty
//! blocks written back, the frees made durable) and grants each run to the region once
//! the engine says it is empty; free blocks the vSSDs no longer need are yielded, and a
//! run goes back to the cache once its `Yield` is durable. The cache's allocator sees its
//! capacity less the runs withheld.
//!
//! The split (SymFlex §2.2's weighted share across both kinds of cache): with a vSSD
//! allocator running, the region may hold the SSD's blocks × the running vSSDs' weights ÷
//! (theirs + the vDisks'), at most `vssd.size` — [`region_cap`], every look, so a weight
//! changed through the API moves space between the sides; without one, `vssd.size`.
//!
//! After a crash each side's journal says what it has: the engine's frees were durable
//! before a grant, the region's yield before a give-back, so at start the region's blocks
//! are free in the engine and are withheld again before any I/O ([`withhold_at_start`]).

use super::service::VssdService;
use crate::datapath::DataPath;
use cachevisor_vssd::Pbn;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// How often the loop looks.
const PERIOD: Duration = Duration::from_millis(20);

/// Where a vSSD block is in the cache's slots.
#[derive(Debug, Clone, Copy)]
pub struct Runs {
    /// Cache slots per vSSD block.
    pub slots_per_block: u32,
}

impl Runs {
    fn first(self, pbn: Pbn) -> u32 {
        pbn * self.slots_per_block
    }
}

/// Withholds every block the region holds from the engine at start (before any I/O);
/// each must be empty in the engine at once, else the two journals disagree and the
/// start is refused.
pub fn withhold_at_start(svc: &VssdService, dp: &DataPath, runs: Runs) -> Result<(), String> {
    let k = runs.slots_per_block;
    for pbn in svc.inside_blocks() {
        let first = runs.first(pbn);
        let mut r = Ok(());
        dp.run_job(|e, out| r = e.withhold(first, k, out))
            .map_err(|f| format!("withholding vSSD block {pbn}: {f:?}"))?;
        r?;
        if !dp.with_engine_mut(|e| e.withheld_ready(first, k)) {
            return Err(format!(
                "vSSD block {pbn} (cache slots {first}..{}) is in the vSSD region, but the cache's metadata says it holds blocks there: the two metadata journals disagree",
                first + k
            ));
        }
    }
    Ok(())
}

/// The most blocks of `total` the region may hold: `size_cap`, or with weights, its
/// weighted share of them (vSSDs' `vssd_weight` against the vDisks' `cache_weight`).
pub fn region_cap(total: u32, size_cap: u32, weights: Option<(f64, f64)>) -> u32 {
    match weights {
        Some((v, c)) if v > 0.0 && v + c > 0.0 => ((f64::from(total) * v / (v + c)).floor() as u32).min(size_cap),
        Some(_) => 0,
        None => size_cap,
    }
}

/// The region's cap now (see [`region_cap`]).
fn cap_now(svc: &VssdService, total: u32, size_cap: u32) -> u32 {
    let weights = svc.allocation().zip(svc.cache_weight()).map(|(a, cache)| {
        let v: f64 = svc.running_vssds().iter().map(|&(id, _)| a.share(id).weight).sum();
        (v, cache)
    });
    region_cap(total, size_cap, weights)
}

/// Starts the loop (see the top comment) for `svc`'s shared region of `total` blocks
/// over `dp`'s cache; `size_cap` is the most blocks the region may hold.
pub fn start(svc: Arc<VssdService>, dp: Arc<DataPath>, runs: Runs, total: u32, size_cap: u32) -> Result<(), String> {
    svc.set_capacity(size_cap);
    std::thread::Builder::new()
        .name("cv-vssd-budget".into())
        .spawn(move || {
            let mut emptying = BTreeSet::new();
            while !svc.halted() && !dp.halted() {
                let cap = cap_now(&svc, total, size_cap);
                svc.set_capacity(cap);
                if let Err(e) = step(&svc, &dp, runs, cap, &mut emptying) {
                    tracing::warn!(%e, "vSSD budget");
                }
                std::thread::sleep(PERIOD);
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// One look: runs the engine emptied granted, more asked for or given back, yielded
/// blocks returned to the cache.
fn step(svc: &VssdService, dp: &DataPath, runs: Runs, cap: u32, emptying: &mut BTreeSet<Pbn>) -> Result<(), String> {
    let k = runs.slots_per_block;
    let job = |f: &mut dyn FnMut(&mut cachevisor_engine::Engine, &mut cachevisor_engine::Output)| {
        dp.run_job(|e, out| f(e, out)).map(|_| ()).map_err(|f| format!("engine job: {f:?}"))
    };
    // Blocks yielded durably are the cache's again.
    let yielded = svc.take_yielded();
    for &pbn in &yielded {
        let first = runs.first(pbn);
        dp.with_engine_mut(|e| e.return_slots(first, k));
    }
    if !yielded.is_empty() {
        tracing::info!(blocks = yielded.len(), "vSSD budget: blocks the vSSDs no longer need returned to the cache");
    }
    // Runs the engine has emptied join the region.
    if !emptying.is_empty() {
        job(&mut |e, out| {
            e.withhold_step(out);
        })?;
        let ready: Vec<Pbn> =
            emptying.iter().copied().filter(|&p| dp.with_engine_mut(|e| e.withheld_ready(runs.first(p), k))).collect();
        for &pbn in &ready {
            svc.grant(pbn)?;
            emptying.remove(&pbn);
        }
        if !ready.is_empty() {
            tracing::info!(blocks = ready.len(), "vSSD budget: blocks taken from the cache for the vSSDs");
        }
    }
    let (inside, shortfall, free, outside) = svc.budget_view();
    let on_way = emptying.len() as u32;
    if shortfall > on_way {
        let room = cap.saturating_sub(inside + on_way);
        let take = (shortfall - on_way).min(room) as usize;
        let next: Vec<Pbn> = outside.into_iter().filter(|p| !emptying.contains(p)).take(take).collect();
        for pbn in next {
            let mut r = Ok(());
            job(&mut |e, out| r = e.withhold(runs.first(pbn), k, out))?;
            r?;
            emptying.insert(pbn);
        }
    } else if shortfall < on_way {
        // Needed no longer: back to the cache as they are.
        let extra: Vec<Pbn> = emptying.iter().rev().take((on_way - shortfall) as usize).copied().collect();
        for pbn in extra {
            emptying.remove(&pbn);
            dp.with_engine_mut(|e| e.return_slots(runs.first(pbn), k));
        }
    }
    // Free blocks no vSSD waits for go back (and any above a lowered cap).
    if shortfall == 0 && free > 0 {
        svc.yield_free(free);
    } else if inside > cap {
        svc.yield_free(inside - cap);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::region_cap;

    #[test]
    fn the_region_gets_its_weighted_share_at_most_its_size() {
        assert_eq!(region_cap(16, 16, None), 16);
        assert_eq!(region_cap(16, 10, None), 10);
        assert_eq!(region_cap(16, 16, Some((1.0, 3.0))), 4);
        assert_eq!(region_cap(16, 16, Some((3.0, 1.0))), 12);
        assert_eq!(region_cap(16, 8, Some((3.0, 1.0))), 8);
        assert_eq!(region_cap(15, 16, Some((1.0, 1.0))), 7, "rounded down: the cache keeps the odd block");
        assert_eq!(region_cap(16, 16, Some((0.0, 1.0))), 0, "no running vSSD: nothing");
        assert_eq!(region_cap(16, 16, Some((2.0, 0.0))), 16, "no vDisk weight: all of it, capped");
    }
}
