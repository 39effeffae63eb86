//! `cachevisor simulate`: run a scenario (TOML and/or flags), optionally comparing several
//! replacement policies, partition modes or write policies side by side.

use crate::input_args::InputArgs;
use crate::progress::Progress;
use anyhow::Context;
use cachevisor_engine::{PartitionMode, ReplacementKind, WritePolicy};
use cachevisor_policy::registry;
use cachevisor_sim::model_choice::{Model, ModelChoice};
use cachevisor_sim::scenario::{DeviceChoice, ReplayMode};
use cachevisor_sim::{simulate, Scenario, SimResult};
use clap::Args;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Options of `simulate` (flags override the scenario file).
#[derive(Debug, Clone, Args)]
pub struct SimulateArgs {
    /// Scenario file (TOML); flags below override it.
    #[arg(long)]
    pub scenario: Option<PathBuf>,
    /// Trace files (replace the scenario's).
    #[arg(long = "trace", num_args = 1..)]
    pub traces: Vec<PathBuf>,
    #[command(flatten)]
    pub input: InputArgs,
    /// Total cache sizes, comma-separated to compare: absolute (`4GiB`) or fractions of the
    /// working set (`0.01`, `5%`: the distinct blocks the trace touches, counted first).
    #[arg(long, value_delimiter = ',')]
    pub cache_size: Vec<String>,
    /// Block size, e.g. 4KiB.
    #[arg(long)]
    pub block_size: Option<String>,
    /// Replacement policies, comma-separated to compare (lru, fifo, clock, two-pool, s3fifo).
    #[arg(long, value_delimiter = ',', value_parser = |s: &str| s.parse::<ReplacementKind>())]
    pub replacement: Vec<ReplacementKind>,
    /// Write policies, comma-separated to compare (wb, wt, wa, ro).
    #[arg(long, value_delimiter = ',', value_parser = |s: &str| s.parse::<WritePolicy>())]
    pub write_policy: Vec<WritePolicy>,
    /// Admission of missed blocks, comma-separated to compare (all, second-hit,
    /// second-hit:N, probability:P, write-budget:RATE like 50MiB/s or 3dwpd): which read and write misses take a slot.
    #[arg(long, value_delimiter = ',', value_parser = |s: &str| s.parse::<cachevisor_engine::AdmissionPolicy>())]
    pub admission: Vec<cachevisor_engine::AdmissionPolicy>,
    /// Prefetch for sequential readers, comma-separated to compare (none, obl, amp, amp:N).
    #[arg(long, value_delimiter = ',', value_parser = |s: &str| s.parse::<cachevisor_engine::PrefetchPolicy>())]
    pub prefetch: Vec<cachevisor_engine::PrefetchPolicy>,
    /// Allocation policies for static partitions, comma-separated to compare.
    #[arg(long, value_delimiter = ',', value_parser = cachevisor_policy::registry::NAMES)]
    pub allocator: Vec<String>,
    /// Re-run the allocator every window on recent curves (not only when VMs arrive).
    #[arg(long)]
    pub reallocate: bool,
    /// Partition modes, comma-separated to compare (static, shared).
    #[arg(long, value_delimiter = ',', value_parser = ["static", "shared"])]
    pub partition: Vec<String>,
    /// SSD device preset.
    #[arg(long)]
    pub ssd: Option<String>,
    /// Cache devices of that preset the cache is split over, equally (one allocation).
    #[arg(long)]
    pub ssd_count: Option<u32>,
    /// Dirty data mirrored on two devices (default: on with two or more, as the daemon).
    #[arg(long)]
    pub mirror_dirty: Option<bool>,
    /// A RAM tier of this size in front of the cache devices (clean copies of hot
    /// blocks, as the daemon's `cache.ram`; 0: none).
    #[arg(long)]
    pub ram: Option<String>,
    /// Which SSD hits copy a block into the RAM tier: every-hit (CacheLib's rule) or
    /// second-hit.
    #[arg(long, value_parser = |s: &str| s.parse::<cachevisor_engine::RamFill>())]
    pub ram_fill: Option<cachevisor_engine::RamFill>,
    /// Backing device preset.
    #[arg(long)]
    pub backing: Option<String>,
    /// Replay mode.
    #[arg(long, value_parser = ["open", "closed"])]
    pub mode: Option<String>,
    /// Open loop speed-up.
    #[arg(long)]
    pub speedup: Option<f64>,
    /// Closed loop queue depth per VM.
    #[arg(long)]
    pub queue_depth: Option<u32>,
    /// Stop after this many requests.
    #[arg(long)]
    pub max_requests: Option<u64>,
    /// Replay model: `cache` (hits and misses in trace order, no devices or latency: fast),
    /// `full` (devices, queues, latency, write-back timing), or `auto` (the default: the
    /// cache model unless the scenario needs device time; the result says which ran).
    #[arg(long, value_parser = |s: &str| s.parse::<ModelChoice>())]
    pub model: Option<ModelChoice>,
    /// Runs simulated at once when comparing several (default: one per core; 1 to 1024).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub jobs: Option<u16>,
    /// Output directory.
    #[arg(long, default_value = "out/simulate")]
    pub out: PathBuf,
    /// Print the JSON result(s) instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// The scenario that flags and file describe, before expanding comparisons.
pub fn base_scenario(a: &SimulateArgs) -> anyhow::Result<Scenario> {
    let mut sc = match &a.scenario {
        Some(p) => Scenario::load(p).map_err(anyhow::Error::msg)?,
        None => Scenario::default(),
    };
    if !a.traces.is_empty() {
        sc.trace.files = a.traces.clone();
    }
    let ro = a.input.read_options()?;
    if ro.format.is_some() {
        sc.trace.format = ro.format;
    }
    if a.scenario.is_none() || a.input.vm_mode != "file" {
        sc.trace.vm_mode = Some(ro.vm_mode);
    }
    sc.trace.skip_bad |= a.input.skip_bad;
    if a.input.blkparse_action != "D" {
        sc.trace.blkparse_action = Some(a.input.blkparse_action.clone());
    }
    if a.input.csv_columns.is_some() {
        sc.trace.csv_columns = a.input.csv_columns.clone();
    }
    sc.trace.rename.extend(a.input.rename.iter().cloned());
    if a.reallocate {
        sc.cache.reallocate = Some(true);
    }
    if let Some(s) = &a.block_size {
        sc.cache.block_size = s.clone();
    }
    if let Some(s) = &a.ssd {
        sc.devices.ssd = DeviceChoice::Preset(s.clone());
    }
    if let Some(s) = &a.backing {
        sc.devices.backing = DeviceChoice::Preset(s.clone());
    }
    if let Some(n) = a.ssd_count {
        sc.devices.ssd_count = n;
    }
    if let Some(m) = a.mirror_dirty {
        sc.devices.mirror_dirty = Some(m);
    }
    if let Some(r) = &a.ram {
        sc.devices.ram = Some(r.clone());
    }
    if let Some(f) = a.ram_fill {
        sc.devices.ram_fill = f;
    }
    if let Some(m) = &a.mode {
        sc.replay.mode = if m == "open" { ReplayMode::Open } else { ReplayMode::Closed };
    }
    if let Some(v) = a.speedup {
        sc.replay.speedup = v;
    }
    if let Some(v) = a.queue_depth {
        sc.replay.queue_depth = v;
    }
    if let Some(v) = a.max_requests {
        sc.replay.max_requests = v;
    }
    if let Some(m) = a.model {
        sc.replay.model = m;
    }
    Ok(sc)
}

/// The cache sizes to run, each with the text the user gave (a run label's suffix when
/// there are several) and the size in the scenario's terms: `--cache-size` items, else the
/// scenario's `cache.size`. Fractions of the working set (`0.01`, `5%`) become bytes after
/// one pass over the inputs (`working_set.rs`), whole blocks of `cache.block_size`.
pub fn cache_sizes(sc: &Scenario, a: &SimulateArgs) -> anyhow::Result<Vec<(String, String)>> {
    use cachevisor_sim::working_set::{fraction, fraction_bytes, working_set_bytes};
    let items = if a.cache_size.is_empty() { vec![sc.cache.size.clone()] } else { a.cache_size.clone() };
    let mut ws = None;
    let mut v = Vec::new();
    let block = cachevisor_trace::units::parse_size(&sc.cache.block_size)
        .map_err(|e| anyhow::anyhow!("cache.block_size: {e}"))?;
    for item in items {
        let Some(f) = fraction(&item).map_err(|e| anyhow::anyhow!("--cache-size {e}"))? else {
            v.push((item.clone(), item));
            continue;
        };
        let ws_bytes = match ws {
            Some(b) => b,
            None => {
                let mut p = Progress::new("counting the working set");
                let b = working_set_bytes(sc, &mut |n| p.update(n, None)).context("counting the working set")?;
                p.finish();
                anyhow::ensure!(b > 0, "--cache-size {item}: the inputs touch no block (an empty working set)");
                eprintln!("working set: {} ({b} bytes)", cachevisor_trace::units::format_size(b));
                *ws.insert(b)
            }
        };
        v.push((item, format!("{}B", fraction_bytes(f, ws_bytes, block))));
    }
    Ok(v)
}

/// Expands the comma-separated choices (and the sizes of [`cache_sizes`]) into one
/// scenario per combination, with labels.
pub fn expand(sc: &Scenario, a: &SimulateArgs, sizes: &[(String, String)]) -> Vec<(String, Scenario)> {
    let parts: Vec<PartitionMode> = if a.partition.is_empty() {
        vec![sc.cache.partition]
    } else {
        a.partition.iter().map(|p| if p == "shared" { PartitionMode::Shared } else { PartitionMode::Static }).collect()
    };
    // Unset in the scenario and not listed: each allocator's own (`Allocator::replacement`).
    let repls: Vec<Option<ReplacementKind>> = if a.replacement.is_empty() {
        vec![sc.cache.replacement]
    } else {
        a.replacement.iter().copied().map(Some).collect()
    };
    let wps = if a.write_policy.is_empty() { vec![sc.cache.write_policy] } else { a.write_policy.clone() };
    let allocs = if a.allocator.is_empty() { vec![sc.cache.allocator.clone()] } else { a.allocator.clone() };
    let adms: Vec<Option<cachevisor_engine::AdmissionPolicy>> =
        if a.admission.is_empty() { vec![sc.cache.admission] } else { a.admission.iter().copied().map(Some).collect() };
    let pfs: Vec<Option<cachevisor_engine::PrefetchPolicy>> =
        if a.prefetch.is_empty() { vec![sc.cache.prefetch] } else { a.prefetch.iter().copied().map(Some).collect() };
    let mut combos = Vec::new();
    for &w in &wps {
        for &ad in &adms {
            for &pf in &pfs {
                combos.push((w, ad, pf));
            }
        }
    }
    let mut v = Vec::new();
    for &p in &parts {
        // The allocator only decides static partitions.
        let allocs = if p == PartitionMode::Shared { &allocs[..1] } else { &allocs[..] };
        for &r in &repls {
            for &(w, adm, pf) in &combos {
                for (alloc, (size_label, size)) in allocs.iter().flat_map(|al| sizes.iter().map(move |sz| (al, sz))) {
                    let mut s = sc.clone();
                    if !a.admission.is_empty() {
                        // Listed: both directions (a scenario's write_admission gives way).
                        (s.cache.admission, s.cache.write_admission) = (adm, None);
                    }
                    s.cache.prefetch = pf;
                    s.cache.size = size.clone();
                    s.cache.partition = p;
                    s.cache.replacement = r;
                    s.cache.write_policy = w;
                    s.cache.allocator = alloc.clone();
                    // S-CAVE manages its pools with CLOCK (its cleaner reads the counters):
                    // unless replacements were listed, it gets CLOCK.
                    if a.replacement.is_empty()
                        && p == PartitionMode::Static
                        && registry::build(alloc).is_ok_and(|x| x.cleaner().is_some())
                    {
                        s.cache.replacement = Some(ReplacementKind::Clock);
                    }
                    let suffix = if p == PartitionMode::Static && alloc != "static" {
                        format!("-{alloc}")
                    } else {
                        String::new()
                    };
                    let size_suffix = if sizes.len() > 1 { format!("-{size_label}") } else { String::new() };
                    let adm_suffix = match adm {
                        Some(ad) if a.admission.len() > 1 => format!("-{ad}"),
                        _ => String::new(),
                    };
                    let pf_suffix = match pf {
                        Some(x) if a.prefetch.len() > 1 => format!("-prefetch-{x}"),
                        _ => String::new(),
                    };
                    v.push((
                        format!(
                            "{}-{}-{w}{suffix}{adm_suffix}{pf_suffix}{size_suffix}",
                            p.name(),
                            s.cache.replacement()
                        ),
                        s,
                    ));
                }
            }
        }
    }
    v
}

/// Runs each labelled scenario — `jobs` at once (default: one per core; each run is
/// independent and deterministic, so the results do not depend on it) — writes its files
/// under `out/<label>` and returns the results in the order given.
pub fn run_all(
    runs: &[(String, Scenario)],
    out: &Path,
    jobs: Option<usize>,
) -> anyhow::Result<Vec<(String, SimResult)>> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let jobs = jobs.unwrap_or(cores).clamp(1, runs.len().max(1));
    if jobs == 1 {
        return runs.iter().map(|(label, sc)| run_one(label, sc, runs.len(), out, true)).collect();
    }
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (next, done) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let mut slots: Vec<Option<anyhow::Result<(String, SimResult)>>> = (0..runs.len()).map(|_| None).collect();
    let slots_lock = std::sync::Mutex::new(&mut slots);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..jobs)
            .map(|_| {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((label, sc)) = runs.get(i) else { break };
                    let r = run_one(label, sc, runs.len(), out, false);
                    slots_lock.lock().expect("no worker panics holding it")[i] = Some(r);
                    done.fetch_add(1, Ordering::Relaxed);
                })
            })
            .collect();
        let mut p = Progress::new(&format!("simulating {} runs, {jobs} at once", runs.len()));
        // Until every worker has ended (a panicking one too: the scope then re-raises it).
        while !workers.iter().all(|w| w.is_finished()) {
            p.update(done.load(Ordering::Relaxed) as u64, Some(runs.len() as u64));
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        p.finish();
    });
    slots.into_iter().map(|r| r.expect("every run ran")).collect()
}

/// One run of [`run_all`] (of `n`), its files written; a bar of its own when `bar`.
fn run_one(label: &str, sc: &Scenario, n: usize, out: &Path, bar: bool) -> anyhow::Result<(String, SimResult)> {
    let mut p = bar.then(|| Progress::new(&format!("simulating {label}")));
    let t0 = std::time::Instant::now();
    let r = simulate(sc, &mut |pr| {
        if let Some(p) = p.as_mut() {
            p.update(pr.done, pr.total)
        }
    })
    .with_context(|| format!("run {label}"))?;
    if let Some(p) = p {
        p.finish();
    }
    let dir = if n == 1 { out.to_path_buf() } else { out.join(label) };
    r.write_files(&dir).with_context(|| format!("writing {}", dir.display()))?;
    eprintln!(
        "{label}: {} requests in {:.2} s wall ({:.2} M req/s, {} model), results in {}",
        r.total.requests,
        t0.elapsed().as_secs_f64(),
        r.total.requests as f64 / t0.elapsed().as_secs_f64() / 1e6,
        r.model.name(),
        dir.display()
    );
    Ok((label.to_string(), r))
}

/// A cluster scenario (`[[node]]`, ELICA): one run, its tables, `cluster.json` in `out`.
fn run_cluster(sc: &Scenario, a: &SimulateArgs) -> anyhow::Result<()> {
    let mut p = Progress::new("simulating the cluster");
    let r = cachevisor_sim::cluster_sim::simulate_cluster(sc, &mut |n| p.update(n, None))?;
    p.finish();
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let json = serde_json::to_string_pretty(&r)?;
    let path = a.out.join("cluster.json");
    std::fs::write(&path, &json).with_context(|| format!("writing {}", path.display()))?;
    if a.json {
        println!("{json}");
    } else {
        println!("{}", r.table());
    }
    Ok(())
}

/// One row per run: total and per-VM hit ratios, latency, SSD writes.
pub fn comparison_table(results: &[(String, SimResult)]) -> String {
    let mut s = String::new();
    let Some((_, first)) = results.first() else { return s };
    let _ = write!(s, "{:<32} {:>7} {:>9} {:>9} {:>10}", "run", "hit%", "mean µs", "p99 µs", "SSD wr");
    for v in &first.vms {
        let name: String = v.vm.chars().take(16).collect();
        let _ = write!(s, " {:>16}", format!("{name} hit%"));
    }
    s.push('\n');
    for (label, r) in results {
        let t = &r.total;
        let us = |x: f64| if r.model == Model::Cache { "-".to_string() } else { format!("{x:.1}") };
        let _ = write!(
            s,
            "{:<32} {:>7.2} {:>9} {:>9} {:>10}",
            label,
            t.hit_ratio * 100.0,
            us(t.latency.mean_us),
            us(t.latency.p99_us),
            cachevisor_trace::units::format_size(t.ssd_write_bytes)
        );
        for v in &r.vms {
            let _ = write!(s, " {:>16.2}", v.hit_ratio * 100.0);
        }
        s.push('\n');
    }
    s
}

/// Writes `comparison.csv` of several runs.
pub fn write_comparison(results: &[(String, SimResult)], out: &Path) -> anyhow::Result<()> {
    let mut s = String::from(
        "run,vm,requests,hit_ratio,read_hit_ratio,mean_us,p99_us,p999_us,ssd_write_bytes,backing_read_bytes\n",
    );
    for (label, r) in results {
        for v in r.vms.iter().chain(std::iter::once(&r.total)) {
            let _ = writeln!(
                s,
                "{label},{},{},{:.6},{:.6},{},{},{},{},{}",
                v.vm,
                v.requests,
                v.hit_ratio,
                v.read_hit_ratio,
                v.latency.mean_us,
                v.latency.p99_us,
                v.latency.p999_us,
                v.ssd_write_bytes,
                v.backing_read_bytes
            );
        }
    }
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("comparison.csv"), s)?;
    Ok(())
}

/// `cachevisor simulate`.
pub fn run(a: SimulateArgs) -> anyhow::Result<()> {
    let mut sc = base_scenario(&a)?;
    if !sc.node.is_empty() {
        match &a.cache_size[..] {
            [] => {}
            [one] if cachevisor_sim::working_set::fraction(one).ok() == Some(None) => sc.cache.size = one.clone(),
            _ => anyhow::bail!("--cache-size: a cluster scenario runs one absolute size (each node's cache)"),
        }
        return run_cluster(&sc, &a);
    }
    let sizes = cache_sizes(&sc, &a)?;
    let runs = expand(&sc, &a, &sizes);
    for (_, s) in &runs {
        s.resolve().map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let results = run_all(&runs, &a.out, a.jobs.map(usize::from))?;
    if a.json {
        let all: Vec<_> = results.iter().map(|(_, r)| r).collect();
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    for (label, r) in &results {
        println!("== {label}\n{}", r.table());
    }
    if results.len() > 1 {
        write_comparison(&results, &a.out)?;
        println!("== comparison\n{}", comparison_table(&results));
    } else {
        // A single run must not sit beside an earlier run's comparison.
        let _ = std::fs::remove_file(a.out.join("comparison.csv"));
    }
    Ok(())
}
