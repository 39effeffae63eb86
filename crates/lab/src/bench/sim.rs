//! `bench sim` and `bench analyze`: the engine alone, `simulate` as users run it (both
//! models, whole process: `sim_process.rs`), the full simulator and the exact and
//! SHARDS miss-ratio curves on a generated Zipf trace (and the bundled real traces), side
//! by side with libCacheSim's C `cachesim` on the same file when its path is given.

use crate::bench::{median, peak_rss_bytes, zipf_file};
use anyhow::Context;
use cachevisor_analysis::{DistanceHistogram, Kind, Method, Profiler};
use cachevisor_cli::bundled::demo_traces;
use cachevisor_engine::{Engine, EngineConfig, Output, PartitionMode, ReplacementKind};
use cachevisor_sim::scenario::ReplayMode;
use cachevisor_sim::scenario::DEFAULT_WRITEBACK_AHEAD;
use cachevisor_sim::{simulate, Scenario};
use cachevisor_trace::units::format_size;
use cachevisor_trace::{open_trace, Format, ReadOptions, Request};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

fn lru_engine(kind: ReplacementKind, slots: u64) -> Engine {
    let cfg = EngineConfig { replacement: kind, ..EngineConfig::with_slots(slots) };
    let mut e = Engine::new(cfg).expect("valid bench engine");
    e.set_target(0, slots, &mut Output::default());
    e
}

/// cachevisor end to end: read the oracleGeneral file (in batches of 4,096 requests) and
/// run the engine; (M req/s, hit ratio).
fn ours_end_to_end(path: &Path, kind: ReplacementKind, slots: u64) -> anyhow::Result<(f64, f64)> {
    let t = Instant::now();
    let mut src = open_trace(path, &ReadOptions { format: Some(Format::OracleGeneral), ..Default::default() })?;
    let mut e = lru_engine(kind, slots);
    let mut out = Output::default();
    let (mut n, mut hits) = (0u64, 0u64);
    let mut batch = Vec::with_capacity(4096);
    loop {
        batch.clear();
        if src.next_batch(&mut batch, 4096)? == 0 {
            break;
        }
        for r in &batch {
            e.access(r.time_ns, r, &mut out);
            hits += out.blocks[0].hit as u64;
        }
        n += batch.len() as u64;
    }
    Ok((n as f64 / t.elapsed().as_secs_f64() / 1e6, hits as f64 / n as f64))
}

/// libCacheSim's `cachesim` (C, single-threaded) on the same oracleGeneral file, end to
/// end (process wall time: reading the file and the cache): (M req/s, hit ratio). It runs
/// in the trace's directory, where it leaves its `TRACE.cachesim` result file.
fn cachesim(bin: &Path, path: &Path, slots: u64, requests: u64, algo: &str) -> anyhow::Result<(f64, f64)> {
    let path = path.canonicalize().with_context(|| format!("{}", path.display()))?;
    let bin = &bin.canonicalize().with_context(|| format!("{}", bin.display()))?;
    let t = Instant::now();
    let out = Command::new(bin)
        .current_dir(path.parent().unwrap_or(Path::new("/")))
        .arg(&path)
        .args(["oracleGeneral", algo, &(slots * 4096).to_string(), "--num-thread=1"])
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    let secs = t.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(out.status.success(), "{} failed: {}", bin.display(), String::from_utf8_lossy(&out.stderr));
    Ok((requests as f64 / secs / 1e6, crate::bench::sim_process::cachesim_hit_ratio(&text, bin)?))
}

fn engine_alone(reqs: &[Request], kind: ReplacementKind, slots: u64) -> f64 {
    let mut e = lru_engine(kind, slots);
    let mut out = Output::default();
    let t = Instant::now();
    for r in reqs {
        e.access(r.time_ns, r, &mut out);
    }
    reqs.len() as f64 / t.elapsed().as_secs_f64() / 1e6
}

fn full_sim(
    files: Vec<PathBuf>,
    format: Option<Format>,
    kind: ReplacementKind,
    cache: &str,
    writeback_ahead: u32,
) -> anyhow::Result<(f64, f64)> {
    let mut sc = Scenario::default();
    sc.cache.writeback_ahead = writeback_ahead;
    sc.trace.files = files;
    sc.trace.format = format;
    sc.cache.size = cache.to_string();
    sc.cache.replacement = Some(kind);
    sc.cache.partition = PartitionMode::Static;
    sc.replay.mode = ReplayMode::Closed;
    // The full model whatever the scenario (`auto` would take the cache model for one VM
    // of reads, and this column would time the wrong model).
    sc.replay.model = cachevisor_sim::model_choice::ModelChoice::Full;
    let t = Instant::now();
    let r = simulate(&sc, &mut |_| {})?;
    Ok((r.total.requests as f64 / t.elapsed().as_secs_f64() / 1e6, r.total.hit_ratio))
}

/// The generated Zipf trace of a bench.
pub(crate) struct Zipf {
    pub(crate) requests: u64,
    pub(crate) blocks: u64,
    pub(crate) alpha: f64,
}

pub(crate) fn bench_sim(
    Zipf { requests, blocks, alpha }: Zipf,
    slots: u64,
    reps: usize,
    dir: &Path,
    lcs: Option<&Path>,
    bundled: bool,
) -> anyhow::Result<()> {
    let path = zipf_file(dir, requests, blocks, alpha)?;
    println!("Zipf({alpha}) trace: {requests} single-block reads over {blocks} blocks, cache {slots} blocks; {reps} interleaved repetitions, medians");
    if lcs.is_none() {
        println!("(no --cachesim PATH: libCacheSim's cachesim, built in Release from its source, to compare)");
    }
    let (mut ours, mut theirs, mut ours_clock, mut theirs_clock) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut hr_ours, mut hr_theirs) = (0.0, 0.0);
    for _ in 0..reps {
        let (s, h) = ours_end_to_end(&path, ReplacementKind::Lru, slots)?;
        ours.push(s);
        hr_ours = h;
        if let Some(bin) = lcs {
            let (s, h) = cachesim(bin, &path, slots, requests, "LRU")?;
            theirs.push(s);
            hr_theirs = h;
            theirs_clock.push(cachesim(bin, &path, slots, requests, "Clock")?.0);
        }
        ours_clock.push(ours_end_to_end(&path, ReplacementKind::Clock, slots)?.0);
    }
    println!("\nend to end (read oracleGeneral file + cache), M requests/s:");
    println!("  cachevisor LRU    {:>7.2}   hit ratio {:.6}", median(ours.clone()), hr_ours);
    if !theirs.is_empty() {
        println!(
            "  libCacheSim LRU   {:>7.2}   hit ratio {:.4}       (cachesim, which prints 4 decimals; process wall time)",
            median(theirs.clone()),
            hr_theirs
        );
        println!("  ratio cachevisor / libCacheSim, LRU: {:.2}×", median(ours.clone()) / median(theirs.clone()));
    }
    println!("  cachevisor CLOCK  {:>7.2}", median(ours_clock.clone()));
    if !theirs_clock.is_empty() {
        println!("  libCacheSim Clock {:>7.2}", median(theirs_clock.clone()));
        println!("  ratio cachevisor / libCacheSim, CLOCK: {:.2}×", median(ours_clock) / median(theirs_clock));
    }
    crate::bench::sim_process::whole_process(&path, slots * 4096, reps, lcs, dir)?;
    crate::bench::sim_process::grid(&path, reps, lcs, dir)?;
    // Engine alone and full simulation, per policy.
    let mut src = open_trace(&path, &ReadOptions { format: Some(Format::OracleGeneral), ..Default::default() })?;
    let mut reqs = Vec::with_capacity(requests as usize);
    while let Some(r) = src.next_request()? {
        reqs.push(r);
    }
    println!("\nper replacement policy, M requests/s:            engine alone   full simulation (closed loop, devices, metrics)");
    let cache = format!("{}B", slots * 4096);
    for kind in ReplacementKind::ALL {
        let mut alone = Vec::new();
        let mut sim = Vec::new();
        for _ in 0..reps {
            alone.push(engine_alone(&reqs, kind, slots));
            sim.push(
                full_sim(vec![path.clone()], Some(Format::OracleGeneral), kind, &cache, DEFAULT_WRITEBACK_AHEAD)?.0,
            );
        }
        println!("  {:<10} {:>36.2} {:>17.2}", kind.name(), median(alone), median(sim));
    }
    drop(reqs);
    if let Some(files) = demo_traces().ok().filter(|_| bundled) {
        println!("\nbundled real traces (3 VMs, 145,654 requests, 256 MiB cache, write-back), full simulation, M requests/s,");
        println!("with write-back ahead of eviction ({DEFAULT_WRITEBACK_AHEAD} victims, the default) and without, interleaved:");
        for kind in ReplacementKind::ALL {
            let (mut on, mut off) = (Vec::new(), Vec::new());
            for _ in 0..reps {
                on.push(full_sim(files.clone(), None, kind, "256MiB", DEFAULT_WRITEBACK_AHEAD)?.0);
                off.push(full_sim(files.clone(), None, kind, "256MiB", 0)?.0);
            }
            let (on, off) = (median(on), median(off));
            println!("  {:<10} {:>7.2} {:>7.2}   ratio {:.3}×", kind.name(), on, off, on / off);
        }
    }
    println!("\npeak RSS {}", format_size(peak_rss_bytes()));
    Ok(())
}

/// Builds the curve of `reqs` with `m`; (M req/s, estimator bytes, histogram).
fn profile_speed(reqs: &[Request], m: Method) -> (f64, u64, DistanceHistogram) {
    let t = Instant::now();
    let mut p = Profiler::new(4096, m).all_only();
    for r in reqs {
        p.add(r);
    }
    let rate = reqs.len() as f64 / t.elapsed().as_secs_f64() / 1e6;
    let vm = &p.vms()[0];
    (rate, vm.memory_bytes() as u64, vm.histogram(Kind::All))
}

pub(crate) fn bench_analyze(
    requests: u64,
    blocks: u64,
    alpha: f64,
    reps: usize,
    dir: &Path,
    bin: Option<&Path>,
) -> anyhow::Result<()> {
    let path = zipf_file(dir, requests, blocks, alpha)?;
    let mut src = open_trace(&path, &ReadOptions { format: Some(Format::OracleGeneral), ..Default::default() })?;
    let mut reqs = Vec::with_capacity(requests as usize);
    while src.next_batch(&mut reqs, 1 << 16)? > 0 {}
    println!("Zipf({alpha}) trace: {requests} single-block reads over {blocks} blocks; {reps} interleaved repetitions, medians");
    let sizes = [blocks / 100, blocks / 20, blocks / 10, blocks / 4, blocks / 2];
    let (mut exact, mut shards, mut lcs) = (Vec::new(), Vec::new(), Vec::new());
    let (mut mem_exact, mut mem_shards) = (0, 0);
    let (mut h_exact, mut h_shards) = (DistanceHistogram::exact(), DistanceHistogram::exact());
    let mut lcs_hits = Vec::new();
    for _ in 0..reps {
        let (r, m, h) = profile_speed(&reqs, Method::Exact);
        exact.push(r);
        (mem_exact, h_exact) = (m, h);
        let (r, m, h) = profile_speed(&reqs, Method::ShardsRate { rate: 0.01 });
        shards.push(r);
        (mem_shards, h_shards) = (m, h);
        if let Some(bin) = bin {
            let mut total_s = 0.0;
            lcs_hits.clear();
            for &c in &sizes {
                let (rate, hr) = cachesim(bin, &path, c, requests, "LRU")?;
                total_s += requests as f64 / (rate * 1e6);
                lcs_hits.push(hr);
            }
            lcs.push(requests as f64 / total_s / 1e6);
        }
    }
    let (e, s) = (median(exact), median(shards));
    let wss = h_exact.cold() as u64;
    let mae = (1..=100u64)
        .map(|i| (h_exact.miss_ratio_at(wss * i / 100) - h_shards.miss_ratio_at(wss * i / 100)).abs())
        .sum::<f64>()
        / 100.0;
    println!("\nwhole LRU miss-ratio curve in one pass, M requests/s (estimator memory):");
    println!("  exact (Fenwick stack distance)  {e:>7.2}   ({})", format_size(mem_exact));
    println!(
        "  SHARDS fixed-rate R = 0.01      {s:>7.2}   ({}), {:.1}× faster, memory {:.2}% of exact, MAE {mae:.4}",
        format_size(mem_shards),
        s / e,
        mem_shards as f64 * 100.0 / mem_exact as f64
    );
    if !lcs.is_empty() {
        let l = median(lcs);
        println!("  libCacheSim cachesim LRU, {} sizes, one replay each: {l:.2} M requests/s per size for the {} sizes together", sizes.len(), sizes.len());
        println!("  ratio exact curve / libCacheSim for those sizes: {:.2}×", e / l);
        for (c, hr) in sizes.iter().zip(&lcs_hits) {
            println!(
                "    {c:>8} blocks: libCacheSim hit ratio {hr:.4} (4 decimals printed), exact curve {:.6}",
                1.0 - h_exact.miss_ratio_at(*c)
            );
        }
    } else {
        println!("  (no --cachesim PATH: libCacheSim's cachesim, built in Release from its source, to compare)");
    }
    println!("\npeak RSS {}", format_size(peak_rss_bytes()));
    Ok(())
}
