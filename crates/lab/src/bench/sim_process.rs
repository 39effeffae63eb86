//! `bench sim`'s "what users run" table: `cachevisor simulate` — the cache
//! model and the full model — against libCacheSim's `cachesim` (built Release from its
//! source, its path given), each a whole process on the same oracleGeneral file, per
//! replacement policy: wall time and peak RSS of each process, interleaved rounds,
//! medians, hit ratios side by side.
//!
//! Peak RSS is the child's `VmHWM` (a high-water mark, so only growth in its last few
//! milliseconds could be missed) read from `/proc` while it runs: no `wait4` binding
//! needed for one figure.

use crate::bench::median;
use anyhow::Context;
use cachevisor_engine::ReplacementKind;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One process's run: wall seconds, peak RSS bytes, hit ratio.
#[derive(Debug, Clone, Copy)]
struct Run {
    secs: f64,
    rss: u64,
    hit: f64,
}

/// Runs `cmd` to its end: wall time, peak RSS, and its standard output.
fn timed(cmd: &mut Command) -> anyhow::Result<(f64, u64, String)> {
    let t = Instant::now();
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().context("starting")?;
    let status = format!("/proc/{}/status", child.id());
    // Read its output on threads (a full pipe would stall it) while watching its memory.
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).map(|_| s)
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut err, &mut s).map(|_| s)
    });
    let mut rss = 0;
    let exit = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        rss = rss.max(hwm(&status));
        std::thread::sleep(Duration::from_millis(5));
    };
    let secs = t.elapsed().as_secs_f64();
    let stdout = reader.join().expect("reader")?;
    let stderr = err_reader.join().expect("reader")?;
    anyhow::ensure!(exit.success(), "{exit}: {}", stderr.trim());
    Ok((secs, rss, stdout))
}

/// `VmHWM` of a `/proc/PID/status` file, bytes (0 once it is gone).
fn hwm(status: &str) -> u64 {
    std::fs::read_to_string(status)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// `cachevisor simulate` with `model` on `trace`, cache `bytes`, policy `kind`, one shared
/// pool (the question `cachesim` answers).
fn ours(trace: &Path, bytes: u64, kind: ReplacementKind, model: &str, out: &Path) -> anyhow::Result<Run> {
    let exe = crate::operator::cachevisor()?;
    let (secs, rss, _) =
        timed(Command::new(&exe).args(["simulate", "--format", "oracle-general", "--partition", "shared"]).args([
            "--trace".as_ref(),
            trace.as_os_str(),
            "--cache-size".as_ref(),
            format!("{bytes}B").as_ref(),
            "--replacement".as_ref(),
            kind.name().as_ref(),
            "--model".as_ref(),
            model.as_ref(),
            "--out".as_ref(),
            out.as_os_str(),
        ]))
        .with_context(|| format!("cachevisor simulate --model {model} --replacement {kind}"))?;
    let text = std::fs::read_to_string(out.join("result.json"))?;
    let v: serde_json::Value = serde_json::from_str(&text)?;
    anyhow::ensure!(v["model"] == model, "asked for the {model} model, ran {}", v["model"]);
    let hit = v["total"]["hit_ratio"].as_f64().context("no total.hit_ratio in result.json")?;
    Ok(Run { secs, rss, hit })
}

/// `cachesim TRACE oracleGeneral ALGO BYTES --num-thread=1`, run in the trace's directory
/// (where it leaves its `TRACE.cachesim` file).
fn theirs(bin: &Path, trace: &Path, bytes: u64, algo: &str) -> anyhow::Result<Run> {
    let trace = trace.canonicalize()?;
    let (secs, rss, text) =
        timed(Command::new(bin).current_dir(trace.parent().unwrap_or(Path::new("/"))).arg(&trace).args([
            "oracleGeneral",
            algo,
            &bytes.to_string(),
            "--num-thread=1",
        ]))
        .with_context(|| format!("{} {algo}", bin.display()))?;
    Ok(Run { secs, rss, hit: cachesim_hit_ratio(&text, bin)? })
}

/// The hit ratio in the output of `cachesim` at `bin` (`cachevisor_lab::cachesim`); an
/// error naming `bin` when there is none.
pub(crate) fn cachesim_hit_ratio(text: &str, bin: &Path) -> anyhow::Result<f64> {
    cachevisor_lab::cachesim::hit_ratio(text)
        .with_context(|| format!("no miss ratio in {}'s output: {text}", bin.display()))
}

/// The policies compared, with `cachesim`'s nearest algorithm (two-pool LRU, 20/80
/// single- and multi-touch pools, against its 2Q: not the same policy).
const POLICIES: [(ReplacementKind, &str); 5] = [
    (ReplacementKind::Lru, "lru"),
    (ReplacementKind::Fifo, "fifo"),
    (ReplacementKind::Clock, "clock"),
    (ReplacementKind::S3fifo, "s3fifo"),
    (ReplacementKind::TwoPool, "twoq"),
];

/// The table: per policy, `reps` interleaved rounds of the three processes.
pub(crate) fn whole_process(
    trace: &Path,
    bytes: u64,
    reps: usize,
    bin: Option<&Path>,
    dir: &Path,
) -> anyhow::Result<()> {
    println!(
        "\nwhat users run, whole process on the file ({} cache, one shared pool), {reps} interleaved rounds, medians:",
        cachevisor_trace::units::format_size(bytes)
    );
    println!(
        "  {:<14} {:>9} {:>9} {:>9} {:>7} {:>7} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10}",
        "policy",
        "cachesim",
        "cache",
        "full",
        "cache×",
        "full×",
        "hit cs",
        "hit cache",
        "hit full",
        "RSS cs",
        "RSS cache",
        "RSS full"
    );
    let out = dir.join("bench-sim-process");
    let mut worst = (f64::INFINITY, f64::INFINITY);
    for (kind, algo) in POLICIES {
        let (mut cs, mut cache, mut full) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..reps.max(1) {
            if let Some(b) = bin {
                cs.push(theirs(b, trace, bytes, algo)?);
            }
            cache.push(ours(trace, bytes, kind, "cache", &out)?);
            full.push(ours(trace, bytes, kind, "full", &out)?);
        }
        let secs = |v: &[Run]| if v.is_empty() { f64::NAN } else { median(v.iter().map(|r| r.secs).collect()) };
        let rss = |v: &[Run]| v.iter().map(|r| r.rss).max().map_or("-".into(), cachevisor_trace::units::format_size);
        let hit = |v: &[Run]| v.last().map_or("-".into(), |r| format!("{:.4}", r.hit));
        let (c, m, f) = (secs(&cs), secs(&cache), secs(&full));
        worst = (worst.0.min(c / m), worst.1.min(c / f));
        println!(
            "  {:<14} {:>8.2}s {:>8.2}s {:>8.2}s {:>6.2}× {:>6.2}× {:>9} {:>9} {:>9} {:>10} {:>10} {:>10}",
            format!("{kind}/{algo}"),
            c,
            m,
            f,
            c / m,
            c / f,
            hit(&cs),
            hit(&cache),
            hit(&full),
            rss(&cs),
            rss(&cache),
            rss(&full)
        );
    }
    if bin.is_some() {
        let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
        println!(
            "  speed = cachesim's wall time / ours. Targets: cache model >= 2.0x cachesim on every policy: {} (worst {:.2}x); \
             full model >= 1.0x: {} (worst {:.2}x)",
            verdict(worst.0 >= 2.0),
            worst.0,
            verdict(worst.1 >= 1.0),
            worst.1
        );
    }
    Ok(())
}

/// The grid `cachesim` runs in one command: these algorithms × these fractions of the
/// working set (its default thread pool, one per core), against `simulate` with the same
/// comma lists (the cache model, one run per core). Our two-pool LRU has no `cachesim`
/// twin, so it is not in the grid.
const GRID_POLICIES: &str = "lru,fifo,clock,s3fifo";
const GRID_SIZES: &str = "0.01,0.05,0.1";

/// A grid run: wall seconds, peak RSS, and each cell's hit ratio by its label.
type GridRun = (f64, u64, Vec<(String, f64)>);

/// `cachevisor simulate` over the grid, whole process, cells labelled `policy-size`.
fn ours_grid(trace: &Path, out: &Path) -> anyhow::Result<GridRun> {
    let exe = crate::operator::cachevisor()?;
    let (secs, rss, _) = timed(
        Command::new(&exe)
            .args(["simulate", "--format", "oracle-general", "--partition", "shared", "--model", "cache"])
            .args(["--replacement", GRID_POLICIES, "--cache-size", GRID_SIZES])
            .arg("--trace")
            .arg(trace)
            .arg("--out")
            .arg(out),
    )
    .context("cachevisor simulate over the grid")?;
    let mut hits = Vec::new();
    for p in GRID_POLICIES.split(',') {
        for s in GRID_SIZES.split(',') {
            let label = format!("{p}-{s}");
            let path = out.join(format!("shared-{p}-wb-{s}")).join("result.json");
            let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
            hits.push((label, v["total"]["hit_ratio"].as_f64().context("no total.hit_ratio")?));
        }
    }
    Ok((secs, rss, hits))
}

/// `cachesim TRACE oracleGeneral lru,fifo,clock,s3fifo 0.01,0.05,0.1`, whole process: wall
/// seconds, peak RSS, and its cells' hit ratios in its output order (algorithm, then size).
fn theirs_grid(bin: &Path, trace: &Path) -> anyhow::Result<(f64, u64, Vec<f64>)> {
    let trace = trace.canonicalize()?;
    let (secs, rss, text) =
        timed(Command::new(bin).current_dir(trace.parent().unwrap_or(Path::new("/"))).arg(&trace).args([
            "oracleGeneral",
            GRID_POLICIES,
            GRID_SIZES,
        ]))
        .with_context(|| format!("{} over the grid", bin.display()))?;
    let hits = text
        .lines()
        .filter(|l| l.contains("miss ratio"))
        .map(|l| cachesim_hit_ratio(l, bin))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok((secs, rss, hits))
}

/// The grid table: `reps` interleaved rounds, medians, and the cells' hit ratios side by
/// side (CLOCK differs by design: ours keeps a 4-bit counter, `cachesim`'s a 1-bit one).
pub(crate) fn grid(trace: &Path, reps: usize, bin: Option<&Path>, dir: &Path) -> anyhow::Result<()> {
    println!(
        "\nthe grid, whole command against whole command ({GRID_POLICIES} × {GRID_SIZES} of the working set), \
         {reps} interleaved rounds, medians:"
    );
    let out = dir.join("bench-sim-grid");
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let (mut our_hits, mut their_hits) = (Vec::new(), Vec::new());
    for _ in 0..reps.max(1) {
        if let Some(b) = bin {
            let (s, r, h) = theirs_grid(b, trace)?;
            theirs.push((s, r));
            their_hits = h;
        }
        let (s, r, h) = ours_grid(trace, &out)?;
        ours.push((s, r));
        our_hits = h;
    }
    let secs = |v: &[(f64, u64)]| median(v.iter().map(|x| x.0).collect());
    let rss = |v: &[(f64, u64)]| cachevisor_trace::units::format_size(v.iter().map(|x| x.1).max().unwrap_or(0));
    println!("  simulate (cache model): {:>7.2} s, peak RSS {}", secs(&ours), rss(&ours));
    if theirs.is_empty() {
        println!("  (no --cachesim PATH: libCacheSim's cachesim, built in Release from its source, to compare)");
        return Ok(());
    }
    let ratio = secs(&theirs) / secs(&ours);
    println!("  cachesim:               {:>7.2} s, peak RSS {}", secs(&theirs), rss(&theirs));
    println!(
        "  speed = cachesim's wall time / ours: {ratio:.2}x; target >= 1.5x: {}",
        if ratio >= 1.5 { "met" } else { "NOT met" }
    );
    print!("  hit ratios (ours / cachesim):");
    for ((label, h), c) in our_hits.iter().zip(&their_hits) {
        print!(" {label} {h:.4}/{c:.4}");
    }
    println!();
    Ok(())
}
