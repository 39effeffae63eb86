//! `cachevisor-guest`: SymFlex's guest-side cache manager (`cachevisor_guest`) run for real
//! — an origin device read and written through a cache on a vSSD the daemon serves (an
//! NBD URI, or the virtio disk inside a guest), cooperating with the host's inflates and
//! deflates on the vSSD's control channel — driven by a hot/cold workload (SymFlex
//! §5.2/§5.3's fio jobs), with the hit ratio every interval and, with `--verify`, every
//! read checked against what was written. `run_guest` is what `experiment symflex-vssd`
//! runs for each VM.

use crate::workload::{Access, Shape, Verifier, Workload};
use anyhow::{bail, Context};
use cachevisor_guest::{BlockDevice, Control, GuestCache, LostWrites, WriteMode};
use cachevisor_store::backing::Backing;
use cachevisor_trace::units::{parse_duration_ns, parse_size};
use clap::{Args, ValueEnum};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Write policy of the guest's cache.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Mode {
    /// Writes reach the origin at once: a block the host takes loses nothing.
    WriteThrough,
    /// Writes reach the origin at eviction, deflate or the end.
    WriteBack,
}

/// Arguments of `guest`.
#[derive(Debug, Args)]
pub struct GuestArgs {
    /// The vSSD: an NBD URI (`nbd+unix:///NAME?socket=PATH`, `nbd://HOST:PORT/NAME`) or a
    /// block device (the virtio disk inside a guest).
    #[arg(long)]
    pub vssd: String,
    /// The vSSD's control channel: the daemon's socket (`<metadata>/NAME.vssd.sock`) or a
    /// virtio-serial port inside a guest.
    #[arg(long)]
    pub control: PathBuf,
    /// The origin: a file, a block device or an NBD URI (not with `--kv`).
    #[arg(long, required_unless_present = "kv")]
    pub origin: Option<String>,
    /// Instead of a block cache, SymFlex's key-value use (§4.2): a slab key-value store
    /// on the vSSD (slabs are its blocks) under a cache-aside client over this many keys;
    /// values are `--io-size` bytes.
    #[arg(long, value_name = "KEYS", conflicts_with_all = ["origin", "serve", "state", "mode"])]
    pub kv: Option<u64>,
    /// Write policy.
    #[arg(long, value_enum, default_value = "write-through")]
    pub mode: Mode,
    /// Bytes per I/O.
    #[arg(long, default_value = "64KiB")]
    pub io_size: String,
    /// FRACTION:SIZE — this fraction of accesses falls in the first SIZE (a fraction) of
    /// each application's slice of the origin.
    #[arg(long, default_value = "0.8:0.4")]
    pub hot: String,
    /// Fraction of accesses that are writes.
    #[arg(long, default_value_t = 0.0)]
    pub write_ratio: f64,
    /// Applications sharing the cache, each with its own slice of the origin.
    #[arg(long, default_value_t = 1)]
    pub apps: u16,
    /// Their weights (§5.4), comma-separated (default: equal).
    #[arg(long)]
    pub shares: Option<String>,
    /// Stop after this many I/Os.
    #[arg(long)]
    pub ops: Option<u64>,
    /// Stop after this long (`30s` when neither this nor `--ops` is given).
    #[arg(long)]
    pub duration: Option<String>,
    /// How often to print a line.
    #[arg(long, default_value = "1s")]
    pub interval: String,
    /// Check every read against what was written (or the origin's bytes).
    #[arg(long)]
    pub verify: bool,
    /// Seed of the workload.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write the intervals and the totals as JSON here.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
    /// The cache's map: taken back (checked against the vSSD's bytes) at the start when
    /// present, saved at the end — a warm restart on a persistent vSSD (SymFlex §5.3).
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// Instead of the built-in workload, serve the cache as NBD exports on this unix
    /// socket, one per application (`app0`, `app1`, … over equal slices of the origin,
    /// tagged for `--shares`), until SIGINT/SIGTERM; fio, qemu-io or a file system drive it.
    #[arg(long, value_name = "SOCKET")]
    pub serve: Option<PathBuf>,
}

/// A device of the guest: a file or NBD export, or a block device with O_DIRECT (as
/// dm-cache works on bios, below the page cache: a buffered write to the vSSD could reach
/// it after its block was given back — EIO, "lost async page write" — and the origin's
/// page cache would hide the cache's hits and misses).
pub enum Dev {
    /// A file or an NBD export.
    Backing(Backing),
    /// A block device, O_DIRECT, through an aligned bounce buffer.
    Direct(std::fs::File, cachevisor_files::aligned_buf::AlignedBuf),
}

impl Dev {
    /// Reads `buf.len()` bytes at `offset` (a check's read, beside the manager's).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        match self {
            Dev::Backing(b) => b.read_at(buf, offset),
            Dev::Direct(f, _) => cachevisor_files::aligned_buf::read_at(f, &mut Default::default(), buf, offset),
        }
    }
    /// Its size in bytes.
    pub fn size(&self) -> std::io::Result<u64> {
        match self {
            Dev::Backing(b) => b.size(),
            Dev::Direct(f, _) => {
                use std::io::Seek;
                let mut f: &std::fs::File = f;
                f.seek(std::io::SeekFrom::End(0))
            }
        }
    }
}

impl BlockDevice for Dev {
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        match self {
            Dev::Backing(b) => b.read_at(buf, offset),
            Dev::Direct(f, bounce) => cachevisor_files::aligned_buf::read_at(f, bounce, buf, offset),
        }
    }
    fn write_at(&mut self, data: &[u8], offset: u64) -> std::io::Result<()> {
        match self {
            Dev::Backing(b) => b.write_at(data, offset),
            Dev::Direct(f, bounce) => cachevisor_files::aligned_buf::write_at(f, bounce, data, offset),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Dev::Backing(b) => b.sync(),
            Dev::Direct(f, _) => f.sync_data(),
        }
    }
}

/// Opens a device given as a path or an NBD URI (`what` names it in errors); a block
/// device with O_DIRECT.
pub fn open_dev(spec: &str, what: &str) -> anyhow::Result<Dev> {
    let path = Path::new(spec);
    let is_device =
        std::fs::metadata(path).is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()));
    if is_device {
        let f = cachevisor_files::aligned_buf::open_direct(path)
            .with_context(|| format!("{what}: opening {spec} with O_DIRECT"))?;
        return Ok(Dev::Direct(f, Default::default()));
    }
    if !cachevisor_store::backing::is_uri(path) && !path.exists() {
        anyhow::bail!(
            "{what}: {spec} does not exist (give an NBD URI such as nbd://127.0.0.1:10809/NAME, or an existing file or block device)"
        );
    }
    Backing::open(path, None, false, what).map(Dev::Backing).map_err(anyhow::Error::msg)
}

/// One interval's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Interval {
    /// Seconds since the start, at the interval's end.
    pub t_s: f64,
    /// Block hit ratio in the interval (hits / (hits + misses + bypassed)).
    pub hit_ratio: f64,
    /// Per application.
    pub app_hit_ratio: Vec<f64>,
    /// I/Os per second in the interval.
    pub iops: f64,
    /// Valid vSSD blocks at the interval's end.
    pub valid_blocks: u32,
}

/// What a run did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunReport {
    /// The intervals.
    pub intervals: Vec<Interval>,
    /// I/Os done.
    pub ios: u64,
    /// Reads checked against the model (with `verify`).
    pub verified_reads: u64,
    /// The manager's counters at the end.
    pub stats: cachevisor_guest::Stats,
}

/// A guest's run settings.
pub struct RunSpec {
    /// The workload.
    pub shape: Shape,
    /// Its seed.
    pub seed: u64,
    /// Check reads.
    pub verify: bool,
    /// Interval between figures.
    pub interval: Duration,
    /// Stop after this many I/Os.
    pub ops: Option<u64>,
    /// Stop after this long.
    pub duration: Option<Duration>,
}

fn hit_ratio(now: &cachevisor_guest::guest_cache::AppStats, before: &cachevisor_guest::guest_cache::AppStats) -> f64 {
    let hits = now.hits - before.hits;
    let all = hits + (now.misses - before.misses) + (now.bypassed - before.bypassed);
    if all == 0 {
        0.0
    } else {
        hits as f64 / all as f64
    }
}

/// What an interval's callback may do: change the workload's hot part to
/// `Some((fraction, size))`, or stop the run (`Err`).
pub type Tick<'a> = &'a mut dyn FnMut(&Interval) -> anyhow::Result<Option<(f64, f64)>>;

/// Runs the workload through `g`, `tick` called at each interval.
pub fn run_guest(g: &mut GuestCache<Dev, Dev>, spec: &RunSpec, tick: Tick<'_>) -> anyhow::Result<RunReport> {
    let mut w = Workload::new(spec.shape, spec.seed).map_err(anyhow::Error::msg)?;
    let mut v = Verifier::default();
    let io = spec.shape.io as usize;
    let (mut buf, start) = (vec![0u8; io], Instant::now());
    let (mut ios, mut verified, mut at_last) = (0u64, 0u64, 0u64);
    let mut last = (start, g.stats().clone());
    let mut intervals = Vec::new();
    loop {
        if spec.ops.is_some_and(|n| ios >= n) || spec.duration.is_some_and(|d| start.elapsed() >= d) {
            break;
        }
        let Access { app, offset, write } = w.next_access();
        let r = if write {
            let data = if spec.verify { v.next_write(offset, io) } else { Verifier::pattern(offset, 0, io) };
            g.write(app, offset, &data)
        } else {
            g.read(app, offset, &mut buf)
        };
        match r {
            Ok(()) => {}
            Err(e) if LostWrites::is(&e) => tracing::error!(%e, "continuing: the lost units are not checked"),
            Err(e) => return Err(e).with_context(|| format!("{} bytes at origin offset {offset}", io)),
        }
        // Units in blocks whose writes the host took hold the origin's older bytes: not
        // checked from then on.
        if spec.verify && !write && r_ok(&g.stats().lost_origin_blocks, offset, g.block_size()) {
            let want = match v.expected(offset, io) {
                Some(w) => w,
                None => {
                    let mut o = vec![0; io];
                    g.origin().read_at(&mut o, offset).context("reading the origin to check a read")?;
                    o
                }
            };
            if let Some(i) = (0..io).find(|&i| buf[i] != want[i]) {
                bail!(
                    "verify: {io} bytes read at origin offset {offset} differ at byte {i}: {:#04x}, expected {:#04x}",
                    buf[i],
                    want[i]
                );
            }
            verified += 1;
        }
        ios += 1;
        g.service()?;
        if last.0.elapsed() >= spec.interval {
            let now = g.stats().clone();
            let dt = last.0.elapsed().as_secs_f64();
            let total = |s: &cachevisor_guest::Stats| {
                s.apps.values().fold(Default::default(), |a: cachevisor_guest::guest_cache::AppStats, b| {
                    cachevisor_guest::guest_cache::AppStats {
                        hits: a.hits + b.hits,
                        misses: a.misses + b.misses,
                        bypassed: a.bypassed + b.bypassed,
                    }
                })
            };
            let app_hit_ratio = (0..spec.shape.apps)
                .map(|a| {
                    let d = Default::default();
                    hit_ratio(now.apps.get(&a).unwrap_or(&d), last.1.apps.get(&a).unwrap_or(&d))
                })
                .collect();
            let iv = Interval {
                t_s: start.elapsed().as_secs_f64(),
                hit_ratio: hit_ratio(&total(&now), &total(&last.1)),
                app_hit_ratio,
                iops: (ios - at_last) as f64 / dt,
                valid_blocks: g.cache().valid(),
            };
            if let Some((f, s)) = tick(&iv)? {
                w.set_hot(f, s);
            }
            intervals.push(iv);
            (last, at_last) = ((Instant::now(), now), ios);
        }
    }
    match g.flush() {
        Err(e) if LostWrites::is(&e) => tracing::error!(%e, "at the final flush"),
        r => r.context("flushing the cache to the origin")?,
    }
    Ok(RunReport { intervals, ios, verified_reads: verified, stats: g.stats().clone() })
}

/// Whether a read at `offset` is checkable: not in an origin block whose writes were lost
/// (its bytes are the origin's older ones until written again).
fn r_ok(lost: &[u64], offset: u64, block: u64) -> bool {
    !lost.contains(&(offset / block))
}

/// Parses `--hot FRACTION:SIZE` (both fractions of 1).
pub fn parse_hot(s: &str) -> anyhow::Result<(f64, f64)> {
    let (f, z) = s.split_once(':').with_context(|| format!("--hot `{s}`: give FRACTION:SIZE, e.g. 0.8:0.4"))?;
    let part = |v: &str| -> anyhow::Result<f64> {
        match v.trim().parse::<f64>() {
            Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
            _ => bail!("--hot `{s}`: both parts are fractions from 0 to 1"),
        }
    };
    Ok((part(f)?, part(z)?))
}

/// Starts a manager on `vssd`, `control` and `origin`.
pub fn start_guest(vssd: &str, control: &Path, origin: &str, mode: Mode) -> anyhow::Result<GuestCache<Dev, Dev>> {
    let v = open_dev(vssd, "--vssd")?;
    let o = open_dev(origin, "--origin")?;
    let size = o.size()?;
    let c = Control::open(control)?;
    let mode = match mode {
        Mode::WriteThrough => WriteMode::WriteThrough,
        Mode::WriteBack => WriteMode::WriteBack,
    };
    GuestCache::start(v, o, size, c, mode).context("starting the guest cache manager")
}

/// How long a run lasts (`--duration`; 30 s when neither it nor `--ops` is given; none
/// with `--ops` alone) and how often it reports (`--interval`); errors name the option.
pub fn run_length(a: &GuestArgs) -> anyhow::Result<(Option<Duration>, Duration)> {
    let dur = |s: &str, key: &str| -> anyhow::Result<Duration> {
        Ok(Duration::from_nanos(parse_duration_ns(s).map_err(|e| anyhow::anyhow!("{key}: {e}"))?))
    };
    let duration = match (&a.duration, a.ops) {
        (Some(d), _) => Some(dur(d, "--duration")?),
        (None, None) => Some(Duration::from_secs(30)),
        (None, Some(_)) => None,
    };
    Ok((duration, dur(&a.interval, "--interval")?))
}

/// Runs the command.
pub fn run(a: GuestArgs) -> anyhow::Result<()> {
    if let Some(keys) = a.kv {
        return crate::kv::run(&a, keys);
    }
    let origin = a.origin.as_deref().context("--origin is needed without --kv")?;
    let mut g = start_guest(&a.vssd, &a.control, origin, a.mode)?;
    if let Some(p) = &a.state {
        let n = g.restore_map(p).with_context(|| format!("--state {}", p.display()))?;
        println!("took back {n} cached blocks from {}", p.display());
    }
    let (hot_fraction, hot_size) = parse_hot(&a.hot)?;
    let io = parse_size(&a.io_size).map_err(|e| anyhow::anyhow!("--io-size: {e}"))?;
    if io == 0 || io > g.block_size() || !g.block_size().is_multiple_of(io) {
        bail!("--io-size: {io} bytes must divide the vSSD's {}-byte blocks", g.block_size());
    }
    if let Some(s) = &a.shares {
        let w: Vec<f64> = s.split(',').map(|x| x.trim().parse()).collect::<Result<_, _>>().context("--shares")?;
        if w.len() != usize::from(a.apps) || w.iter().any(|&x| x < 0.0) {
            bail!("--shares: give {} weights of 0 or more, one per application", a.apps);
        }
        g.set_shares(&w.iter().enumerate().map(|(i, &x)| (i as u16, x)).collect::<Vec<_>>());
    }
    if let Some(socket) = &a.serve {
        let shared = std::sync::Arc::new(std::sync::Mutex::new(g));
        crate::nbd_apps::serve(shared.clone(), a.apps, socket)?;
        // Connections still open get nothing more: the lock is held to the exit.
        let mut g = shared.lock().unwrap_or_else(|e| e.into_inner());
        g.flush().context("writing the dirty blocks back at the stop")?;
        let s = g.stats();
        println!(
            "stopped: inflated {} blocks, gave back {}, {} taken by the host ({} holding writes the origin never got), {} written back",
            s.inflated, s.released, s.forced, s.lost_dirty, s.writebacks
        );
        if let Some(p) = &a.state {
            let n = g.save_map(p).with_context(|| format!("saving the cache's map to {}", p.display()))?;
            println!("saved the map of {n} cached blocks to {}", p.display());
        }
        std::process::exit(0);
    }
    let (duration, interval) = run_length(&a)?;
    let origin = g.origin().size()?;
    let spec = RunSpec {
        shape: Shape { origin, io, hot_fraction, hot_size, write_ratio: a.write_ratio, apps: a.apps },
        seed: a.seed,
        verify: a.verify,
        interval,
        ops: a.ops,
        duration,
    };
    println!("{:>7} {:>7} {:>9} {:>7}  per application", "time", "hit", "IOPS", "blocks");
    let report = run_guest(&mut g, &spec, &mut |iv| {
        let apps: Vec<String> = iv.app_hit_ratio.iter().map(|h| format!("{h:.3}")).collect();
        println!("{:>6.1}s {:>7.3} {:>9.0} {:>7}  {}", iv.t_s, iv.hit_ratio, iv.iops, iv.valid_blocks, apps.join(" "));
        Ok(None)
    })?;
    let s = &report.stats;
    println!(
        "{} I/Os{}; inflated {} blocks, gave back {}, {} taken by the host ({} holding writes the origin never got), {} written back",
        report.ios,
        if a.verify { format!(", {} reads verified", report.verified_reads) } else { String::new() },
        s.inflated,
        s.released,
        s.forced,
        s.lost_dirty,
        s.writebacks
    );
    if let Some(p) = &a.json_out {
        std::fs::write(p, serde_json::to_vec_pretty(&report)?).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.state {
        let n = g.save_map(p).with_context(|| format!("saving the cache's map to {}", p.display()))?;
        println!("saved the map of {n} cached blocks to {}", p.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{open_dev, parse_hot};

    #[test]
    fn a_missing_device_is_named_with_what_may_be_given() {
        let e = open_dev("/nonexistent/vssd.img", "--vssd").err().unwrap().to_string();
        assert!(e.starts_with("--vssd: /nonexistent/vssd.img does not exist (give an NBD URI"), "{e}");
        assert!(!e.contains("size"), "{e}");
    }

    #[test]
    fn hot_parts_are_fractions_and_errors_name_the_option() {
        assert_eq!(parse_hot("0.8:0.4").unwrap(), (0.8, 0.4));
        assert_eq!(parse_hot("0:1").unwrap(), (0.0, 1.0));
        for bad in ["0.8", "a:0.4", "0.8:", "1.01:0.4", "0.8:-0.1", "NaN:0.5"] {
            let e = parse_hot(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--hot `{bad}`")), "{bad}: {e}");
        }
    }
}
