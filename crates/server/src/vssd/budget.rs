//! One SSD budget for the host-managed cache and the vSSD region (`vssd.budget =
//! "shared"`; SymFlex §2.2: the hypervisor's SSD is carved between guest-managed vSSDs
//! and its own caching): the region lives in the cache's blocks, a vSSD block being a run
//! of cache slots, and this loop moves blocks between the two as the vSSDs' targets
//! change. When the region's vSSDs lack blocks its free list cannot give (and it is below
//! its cap), it asks the engine to empty the runs that cost the cache least
//! (`Engine::withhold_cost`: fewest dirty blocks, then fewest cached ones;
//! `Engine::withhold`: dirty blocks written back, the frees made durable) and grants each
//! run to the region once the engine says it is empty; free blocks the vSSDs no longer
//! need are yielded, and a run goes back to the cache once its `Yield` is durable. The
//! cache's allocator sees its capacity less the runs withheld.
//!
//! The split (SymFlex §2.2, §5.2, across both kinds of cache): with a vSSD allocator
//! running, the region's cap is its weighted share of the SSD (every look, so a weight
//! changed through the API moves space between the sides) or what proportional-throughput
//! feedback gives it (every allocation interval) — [`super::split`]; without one,
//! `vssd.size`.
//!
//! After a crash each side's journal says what it has: the engine's frees were durable
//! before a grant, the region's yield before a give-back, so at start the region's blocks
//! are free in the engine and are withheld again before any I/O ([`withhold_at_start`]).

use super::service::VssdService;
use super::split::{self, Side};
use cachevisor_datapath::DataPath;
use cachevisor_policy::symflex_proportional::SymflexProportional;
use cachevisor_vssd::Pbn;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// Withholds every block the region holds from the engine at start (before any I/O), in
/// one engine job. Each must hold nothing in the engine, else the two journals disagree
/// (a cache file or metadata put back from elsewhere) and the start is refused before
/// the engine is asked to change anything.
pub fn withhold_at_start(svc: &VssdService, dp: &DataPath, runs: Runs) -> Result<(), String> {
    let k = runs.slots_per_block;
    let inside = svc.inside_blocks();
    let costs: Vec<_> = dp.with_engine_mut(|e| inside.iter().map(|&p| e.withhold_cost(runs.first(p), k)).collect());
    if let Some((&pbn, c)) = inside.iter().zip(&costs).find(|(_, c)| c.cached > 0) {
        let first = runs.first(pbn);
        return Err(format!(
            "vSSD block {pbn} (cache slots {first}..{}) is in the vSSD region, but the cache's metadata says {} blocks are cached there ({} dirty): the two metadata journals disagree — was the cache file or its metadata put back from elsewhere? Nothing was changed",
            first + k,
            c.cached,
            c.dirty
        ));
    }
    let mut r = Ok(());
    dp.run_job(|e, out| {
        r = inside.iter().try_for_each(|&pbn| {
            e.withhold(runs.first(pbn), k, out).map_err(|f| format!("withholding vSSD block {pbn}: {f}"))
        })
    })
    .map_err(|f| format!("withholding the vSSD region's blocks: {f:?}"))?;
    r?;
    match inside.iter().find(|&&p| !dp.with_engine_mut(|e| e.withheld_ready(runs.first(p), k))) {
        Some(pbn) => Err(format!("vSSD block {pbn}: its cache slots are still in use after withholding them")),
        None => Ok(()),
    }
}

/// Decides the region's cap: `vssd.size`, or with a vSSD allocator running, its split of
/// the SSD with the host cache ([`super::split`]).
struct Cap {
    /// Whether an allocator splits the SSD (else the cap is `size_cap`).
    split: bool,
    total: u32,
    size_cap: u32,
    interval: Duration,
    /// `symflex-proportional`'s feedback, the cap it last set, and the window it
    /// measures: when it began, the vSSDs' served bytes and the cache's hit bytes then.
    feedback: SymflexProportional,
    decided: Option<u32>,
    window: (Instant, u64, u64),
}

impl Cap {
    /// Sets the cap now (`svc.set_capacity…`), with the running vSSDs it was decided
    /// for; the proportional split moves once per allocation interval. While the split's
    /// inputs are not all there yet (the daemon is starting), it stays undecided.
    fn set(&mut self, svc: &VssdService) {
        if !self.split {
            return svc.set_capacity(self.size_cap);
        }
        let (Some(a), Some(cache)) = (svc.allocation(), svc.cache_side()) else {
            return svc.set_capacity_undecided(self.size_cap);
        };
        let running = svc.running_vssds();
        let ids = running.iter().map(|&(id, _)| id).collect();
        let cap = self.decide(svc, a, cache, &running);
        svc.set_capacity_for(cap, ids);
    }

    /// The split for `running` (see [`Self::set`]).
    fn decide(
        &mut self,
        svc: &VssdService,
        a: &super::allocation::Allocation,
        cache: super::service::CacheSide,
        running: &[(cachevisor_vssd::VssdId, u32)],
    ) -> u32 {
        let shares: Vec<_> = running.iter().map(|&(id, _)| a.share(id)).collect();
        let inside = svc.inside_count();
        let mut vssds = Side {
            weight: shares.iter().map(|s| s.weight).sum(),
            ratio: shares.iter().map(|s| s.ratio).sum(),
            blocks: inside,
            min: running.len() as u32,
            ..Side::default()
        };
        let mut cache_side = Side { weight: cache.weight, ratio: cache.ratio, ..Side::default() };
        if a.name != "symflex-proportional" {
            return split::weighted_cap(self.total, self.size_cap, &vssds, &cache_side);
        }
        let (since, served, hits) = self.window;
        let secs = since.elapsed().as_secs_f64();
        if self.decided.is_some() && secs < self.interval.as_secs_f64() {
            return self.decided.unwrap_or(self.size_cap);
        }
        let (served_now, hits_now) = (svc.served_bytes(), cache.hit_bytes);
        if let Some(cap) = self.decided {
            vssds.blocks = cap;
            vssds.bytes_per_sec = served_now.saturating_sub(served) as f64 / secs;
            cache_side.bytes_per_sec = hits_now.saturating_sub(hits) as f64 / secs;
        }
        cache_side.blocks = self.total - vssds.blocks.min(self.total);
        let cap = split::proportional_cap(&mut self.feedback, self.total, self.size_cap, &vssds, &cache_side);
        if self.decided != Some(cap) {
            tracing::debug!(
                cap,
                vssd_bytes_per_sec = vssds.bytes_per_sec,
                cache_hit_bytes_per_sec = cache_side.bytes_per_sec,
                "vSSD budget: the proportional split moved"
            );
        }
        self.decided = Some(cap);
        self.window = (Instant::now(), served_now, hits_now);
        cap
    }
}

/// Starts the loop (see the top comment) for `svc`'s shared region of `total` blocks
/// over `dp`'s cache; `size_cap` is the most blocks the region may hold, `interval` how
/// often a proportional split measures and moves, `split` whether an allocator splits
/// the SSD between the region and the cache.
pub fn start(
    svc: Arc<VssdService>,
    dp: Arc<DataPath>,
    runs: Runs,
    (total, size_cap): (u32, u32),
    interval: Duration,
    split: bool,
) -> Result<(), String> {
    let mut cap = Cap {
        split,
        total,
        size_cap,
        interval,
        feedback: SymflexProportional::default(),
        decided: None,
        window: (Instant::now(), 0, 0),
    };
    cap.set(&svc);
    std::thread::Builder::new()
        .name("cv-vssd-budget".into())
        .spawn(move || {
            let mut emptying = BTreeSet::new();
            while !svc.halted() && !dp.halted() {
                cap.set(&svc);
                let cap = svc.region_blocks();
                if let Err(e) = step(&svc, &dp, runs, cap, &mut emptying) {
                    tracing::warn!(%e, "vSSD budget");
                }
                std::thread::sleep(PERIOD);
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// The `take` runs of `candidates` that cost the cache least to give up (fewest dirty
/// blocks to write back, then fewest cached blocks lost; the lowest-numbered among
/// equals), from one look at the engine.
fn cheapest(dp: &DataPath, runs: Runs, candidates: Vec<Pbn>, take: usize) -> Vec<Pbn> {
    let k = runs.slots_per_block;
    let mut costed: Vec<(cachevisor_engine::WithholdCost, Pbn)> =
        dp.with_engine_mut(|e| candidates.into_iter().map(|p| (e.withhold_cost(runs.first(p), k), p)).collect());
    if take < costed.len() {
        costed.select_nth_unstable(take);
        costed.truncate(take);
    }
    costed.sort_unstable();
    costed.into_iter().map(|(_, p)| p).collect()
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
        let candidates: Vec<Pbn> = outside.into_iter().filter(|p| !emptying.contains(p)).collect();
        let next = if take == 0 { Vec::new() } else { cheapest(dp, runs, candidates, take) };
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
    // Free blocks no vSSD waits for go back (and any above a lowered cap); above the cap,
    // stopped persistent vSSDs' blocks are swapped out to make more free (SymFlex §2.4.4).
    if shortfall == 0 && free > 0 {
        svc.yield_free(free);
    } else if inside > cap {
        svc.yield_free(inside - cap);
    }
    if inside > cap && svc.shed_inactive(cap) > 0 {
        tracing::info!(cap, "vSSD budget: a stopped vSSD's blocks are swapped out for the cache");
    }
    Ok(())
}
