//! `cachevisor bench serve`: the daemon's hit path against a plain NBD server on the same
//! data. A disk image is served by `cachevisor serve` with a cache large enough to hold
//! it (warmed by one full read) and by a plain server: through the page cache, cachevisor
//! with `direct = "off"` against nbdkit's file plugin; with O_DIRECT, cachevisor with
//! `direct = "on"` against qemu-nbd with `--cache=none`. fio's nbd engine runs 4 KiB random
//! reads at iodepth 1 and 32 against each, interleaved over several rounds (loopback
//! figures swing between identical runs), and the medians and their ratio are reported.
//! Cache and images share one disk, so after each of cachevisor's runs the bench waits
//! until its flusher went quiet before the peer's run, and reports the wait.

use crate::bench::median;
use anyhow::{bail, Context};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub(crate) struct Proc(pub(crate) Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn start_cachevisor(
    dir: &Path,
    backing: &str,
    size: &str,
    direct: &str,
    policy: &str,
    tls: Option<&Path>,
) -> anyhow::Result<(Proc, String, String)> {
    let extra = format!("write_policy = \"{policy}\"");
    // "on": the same daemon serves TLS and plaintext clients, for the TLS cost.
    let listen =
        tls.map_or(String::new(), |pki| format!("tls = \"on\"\ntls_dir = \"{}\"", pki.join("server").display()));
    start_cachevisor_api(dir, backing, size, None, direct, &extra, &listen)
}

/// Waits until the daemon at `api` has written back what its flusher will (its
/// `cachevisor_destaged_blocks` counter unchanged for 1.5 s, longer than the flusher's
/// idle test and its slowest rate's step), so a peer's run that follows shares the disk
/// with nobody; returns the wait (write-back cachevisor owed when its run ended). Gives
/// up after 300 s.
fn wait_for_writeback(api: &str) -> anyhow::Result<Duration> {
    let start = std::time::Instant::now();
    let read = || -> anyhow::Result<u64> {
        let text = ureq::get(&format!("http://{api}/metrics")).call()?.into_string()?;
        let line = text.lines().find(|l| l.starts_with("cachevisor_destaged_blocks_total "));
        Ok(line.and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0))
    };
    let (mut last, mut still_since) = (read()?, std::time::Instant::now());
    while still_since.elapsed() < Duration::from_millis(1500) {
        if start.elapsed() > Duration::from_secs(300) {
            bail!("cachevisor was still writing back after 300 s");
        }
        std::thread::sleep(Duration::from_millis(250));
        let now = read()?;
        if now != last {
            (last, still_since) = (now, std::time::Instant::now());
        }
    }
    Ok(start.elapsed().saturating_sub(Duration::from_millis(1500)))
}

/// Starts `cachevisor serve` on `backing`; returns the process, the NBD URI and the API address.
fn start_cachevisor_api(
    dir: &Path,
    backing: &str,
    size: &str,
    record: Option<&Path>,
    direct: &str,
    cache_extra: &str,
    listen_extra: &str,
) -> anyhow::Result<(Proc, String, String)> {
    let port = free_port()?;
    let api = format!("127.0.0.1:{}", free_port()?);
    let cfg = dir.join("bench.toml");
    std::fs::write(
        &cfg,
        format!("[cache]\npath = \"cache.img\"\nsize = \"{size}\"\ndirect = \"{direct}\"\n{cache_extra}\n[listen]\ntcp = \"127.0.0.1:{port}\"\n{listen_extra}\n[api]\nlisten = \"{api}\"\n[[vdisk]]\nname = \"d\"\nbacking = \"{backing}\"\n"),
    )?;
    let _ = std::fs::remove_file(dir.join("cache.img"));
    let _ = std::fs::remove_dir_all(dir.join("cache.img.meta"));
    let c = spawn_serve(&cfg, record)?;
    Ok((c, format!("nbd://127.0.0.1:{port}/d"), api))
}

/// Runs `cachevisor serve --config CFG` (recording to `record`) until it serves.
pub(crate) fn spawn_serve(cfg: &Path, record: Option<&Path>) -> anyhow::Result<Proc> {
    let mut cmd = Command::new(crate::operator::cachevisor()?);
    cmd.args(["serve", "--config"])
        .arg(cfg)
        .env("RUST_LOG", std::env::var("CACHEVISOR_BENCH_LOG").unwrap_or("warn".into()));
    if let Some(r) = record {
        cmd.arg("--record").arg(r);
    }
    let mut c = cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn()?;
    let out = c.stdout.take().context("stdout")?;
    let c = Proc(c);
    let mut lines = BufReader::new(out).lines();
    loop {
        let l = lines.next().context("cachevisor serve exited")??;
        if l.starts_with("nbd://") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    Ok(c)
}

pub(crate) fn start_nbdkit(args: &[&str]) -> anyhow::Result<(Proc, String)> {
    let port = free_port()?;
    let c = Command::new("nbdkit")
        .args(["-f", "-i", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .spawn()
        .context("starting nbdkit (apt-get install nbdkit)")?;
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok((Proc(c), format!("nbd://127.0.0.1:{port}/")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("nbdkit did not start listening")
}

/// Runs fio; returns read IOPS.
fn fio(uri: &str, rw: &str, depth: u32, secs: u32, size: &str) -> anyhow::Result<f64> {
    Ok(fio_with(uri, rw, depth, secs, size, &[])?.iops)
}

/// One fio run: requests per second (reads and writes), and the reads' latency.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FioReads {
    pub(crate) iops: f64,
    /// Mean completion latency, µs.
    pub(crate) mean_us: f64,
    /// 99th percentile completion latency, µs.
    pub(crate) p99_us: f64,
    /// Longest completion latency, µs.
    pub(crate) max_us: f64,
}

pub(crate) fn fio_with(
    uri: &str,
    rw: &str,
    depth: u32,
    secs: u32,
    size: &str,
    extra: &[&str],
) -> anyhow::Result<FioReads> {
    fio_as(uri, rw, depth, secs, size, extra, None)
}

/// fio as [`fio_with`], with libnbd's TLS certificates taken from `home`'s
/// `.pki/libnbd` when given: fio's nbd engine refuses `?tls-certificates=` (libnbd's
/// local-file guard), and libnbd reads that directory for any user but root (root's is
/// /etc/pki/libnbd, which a bench must not touch: as root, fio runs as `nobody`).
fn fio_as(
    uri: &str,
    rw: &str,
    depth: u32,
    secs: u32,
    size: &str,
    extra: &[&str],
    home: Option<&Path>,
) -> anyhow::Result<FioReads> {
    let mut cmd = match home {
        Some(h) if nix::unistd::geteuid().is_root() => {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "fio"]).env("HOME", h);
            c
        }
        Some(h) => {
            let mut c = Command::new("fio");
            c.env("HOME", h);
            c
        }
        None => Command::new("fio"),
    };
    let o = cmd
        .args([
            "--name=b",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            &format!("--rw={rw}"),
            "--bs=4k", // a --bs in `extra` comes later and wins
            &format!("--iodepth={depth}"),
            &format!("--size={size}"),
        ])
        .args(extra)
        .args(if secs > 0 { vec![format!("--runtime={secs}"), "--time_based=1".into()] } else { vec![] })
        .arg("--output-format=json")
        .output()
        .context("running fio (apt-get install fio)")?;
    if !o.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let json = text.find('{').map(|i| &text[i..]).context("no JSON in fio's output")?;
    let v: serde_json::Value = serde_json::from_str(json).context("fio JSON")?;
    let reads = &v["jobs"][0]["read"];
    // Latencies are the reads', or the writes' when there are none.
    let r = if reads["iops"].as_f64().unwrap_or(0.0) > 0.0 { reads } else { &v["jobs"][0]["write"] };
    let ns = |x: &serde_json::Value| x.as_f64().unwrap_or(0.0) / 1000.0;
    let iops = reads["iops"].as_f64().unwrap_or(0.0) + v["jobs"][0]["write"]["iops"].as_f64().unwrap_or(0.0);
    Ok(FioReads {
        iops,
        mean_us: ns(&r["clat_ns"]["mean"]),
        p99_us: ns(&r["clat_ns"]["percentile"]["99.000000"]),
        max_us: ns(&r["clat_ns"]["max"]),
    })
}

/// What `bench serve` runs: fio patterns, block size, queue depths, and the export's
/// write policy.
#[derive(Debug, Clone)]
pub struct Job {
    /// fio `rw` values (`randrw` runs 70% reads).
    pub rw: Vec<String>,
    /// fio block size.
    pub bs: String,
    /// Queue depths.
    pub iodepth: Vec<u32>,
    /// cachevisor's write policy.
    pub write_policy: String,
    /// fio's `--fsync` (0: none).
    pub fsync: u32,
    /// `both`, `buffered` or `direct`.
    pub against: String,
    /// Over TLS: cachevisor (`tls = "on"`, also measured in plaintext for the TLS cost)
    /// against qemu-nbd `--tls-creds` and nbdkit `--tls=require`, all verifying the
    /// client's certificate, with certificates the bench makes (openssl).
    pub tls: bool,
}

/// Runs the bench: for each pattern and queue depth, cachevisor (the image held in its
/// cache) and a plain NBD server on a copy of the same image (two servers writing one file,
/// one buffered and one O_DIRECT, would corrupt it and make its fsyncs fail), in
/// interleaved rounds; medians.
pub fn run(disk_size: u64, rounds: usize, secs: u32, job: &Job, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    // Absolute: the daemon resolves the config's paths against the config's directory.
    let dir = &std::fs::canonicalize(dir)?;
    let disk = dir.join("disk.img");
    {
        use rand::RngCore;
        let mut data = vec![0u8; disk_size as usize];
        rand::thread_rng().fill_bytes(&mut data);
        std::fs::write(&disk, &data)?;
        std::fs::write(dir.join("peer.img"), &data)?;
    }
    let peer_arg = dir.join("peer.img").display().to_string();
    let size = format!("{}MiB", disk_size.div_ceil(1 << 20) * 2);
    let range = format!("{}MiB", disk_size >> 20);
    let disk_arg = disk.display().to_string();
    println!(
        "fio {} with {} blocks at {}{} over a {range} image held in cachevisor's {} cache vs a plain NBD server on a copy of it, {secs} s per run, {rounds} interleaved rounds",
        job.rw.join(","),
        job.bs,
        job.iodepth.iter().map(|d| format!("iodepth {d}")).collect::<Vec<_>>().join(", "),
        if job.fsync > 0 { format!(", a flush every {} writes", job.fsync) } else { String::new() },
        job.write_policy
    );
    let pki = if job.tls { Some(make_pki(dir)?) } else { None };
    let home = pki.as_ref().map(|p| p.join("fio-home"));
    let tls_uri = |plain: &str| -> String {
        if pki.is_some() {
            plain.replacen("nbd://", "nbds://", 1)
        } else {
            plain.to_string()
        }
    };
    if job.tls {
        println!("over TLS 1.3 with client certificates; \"plain\" is cachevisor's own plaintext path in the same rounds, \"TLS cost\" its TLS/plaintext ratio");
        println!(
            "{:<22} {:<10} {:<8} {:>16} {:>16} {:>8} {:>14} {:>9}",
            "comparison", "rw", "iodepth", "cachevisor IOPS", "other IOPS", "ratio", "plain IOPS", "TLS cost"
        );
    } else {
        println!(
            "{:<22} {:<10} {:<8} {:>16} {:>16} {:>8}",
            "comparison", "rw", "iodepth", "cachevisor IOPS", "other IOPS", "ratio"
        );
    }
    let bs = format!("--bs={}", job.bs);
    let fsync = format!("--fsync={}", job.fsync);
    let sides = [("page cache vs nbdkit", "off"), ("O_DIRECT vs qemu-nbd", "on")];
    let wanted = |direct: &str| job.against == "both" || (job.against == "direct") == (direct == "on");
    for (label, direct) in sides.into_iter().filter(|(_, d)| wanted(d)) {
        let sub = dir.join(direct);
        std::fs::create_dir_all(&sub)?;
        let (cv, cv_plain, api) = start_cachevisor(&sub, &disk_arg, &size, direct, &job.write_policy, pki.as_deref())?;
        fio(&cv_plain, "read", 8, 0, &range).context("warming the cache")?;
        let cv_uri = tls_uri(&cv_plain);
        let (other, other_uri) = match (direct, &pki) {
            ("off", None) => start_nbdkit(&["file", &peer_arg])?,
            ("off", Some(p)) => {
                let certs = format!("--tls-certificates={}", p.join("server").display());
                start_nbdkit(&["--tls=require", &certs, "--tls-verify-peer", "file", &peer_arg])?
            }
            (_, p) => start_qemu_nbd(&peer_arg, p.as_deref())?,
        };
        let other_uri = tls_uri(&other_uri);
        for rw in &job.rw {
            let mut args = vec![bs.as_str()];
            if job.fsync > 0 {
                args.push(&fsync);
            }
            if rw == "randrw" {
                args.push("--rwmixread=70");
            }
            for &depth in &job.iodepth {
                let (mut a, mut b, mut plain, mut owed) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                for _ in 0..rounds.max(1) {
                    a.push(fio_as(&cv_uri, rw, depth, secs, &range, &args, home.as_deref())?.iops);
                    if job.tls {
                        // Its own plaintext run starts as clean as the TLS run did.
                        owed.push(wait_for_writeback(&api)?.as_secs_f64());
                        plain.push(fio_with(&cv_plain, rw, depth, secs, &range, &args)?.iops);
                    }
                    // The peer runs on the same disk: not while cachevisor writes back.
                    owed.push(wait_for_writeback(&api)?.as_secs_f64());
                    b.push(fio_as(&other_uri, rw, depth, secs, &range, &args, home.as_deref())?.iops);
                }
                let (ma, mb) = (median(a.clone()), median(b.clone()));
                let tls_cols = if job.tls {
                    let mp = median(plain.clone());
                    format!(" {mp:>14.0} {:>9.2}", ma / mp)
                } else {
                    String::new()
                };
                println!(
                    "{label:<22} {rw:<10} {depth:<8} {ma:>16.0} {mb:>16.0} {:>8.2}{tls_cols}   (runs: {a:.0?} vs {b:.0?}{}; write-back after each run: {owed:.1?} s)",
                    ma / mb,
                    if job.tls { format!(", plain {plain:.0?}") } else { String::new() }
                );
            }
        }
        drop((cv, other));
    }
    Ok(())
}

/// The bench's certificates (`certs.rs`, the tests' own maker: a CA, a server certificate
/// for 127.0.0.1, one client certificate) under `dir/pki`: `server/` and `client/` in
/// QEMU's layout.
fn make_pki(dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    let root = dir.join("pki");
    let _ = std::fs::remove_dir_all(&root);
    let pki = cachevisor_testkit::certs::Pki::new(&root);
    let client = pki.client("client", "/CN=bench-client", None, 1);
    // libnbd's per-user directory for fio (see `fio_as`), readable by the user fio runs as.
    use std::os::unix::fs::PermissionsExt;
    let libnbd = root.join("fio-home/.pki/libnbd");
    std::fs::create_dir_all(&libnbd)?;
    for f in ["ca-cert.pem", "client-cert.pem", "client-key.pem"] {
        std::fs::copy(client.join(f), libnbd.join(f))?;
        std::fs::set_permissions(libnbd.join(f), std::fs::Permissions::from_mode(0o644))?;
    }
    for d in [root.as_path(), &root.join("fio-home"), &root.join("fio-home/.pki"), &libnbd] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(root)
}

/// qemu-nbd serving `file` with O_DIRECT (`--cache=none`, native AIO), over TLS with the
/// server credentials in `pki/server` (client certificates verified) when given.
pub(crate) fn start_qemu_nbd(file: &str, pki: Option<&Path>) -> anyhow::Result<(Proc, String)> {
    let port = free_port()?;
    let mut c = Command::new("qemu-nbd");
    if let Some(p) = pki {
        c.args([
            "--object",
            &format!("tls-creds-x509,id=tls0,dir={},endpoint=server,verify-peer=on", p.join("server").display()),
            "--tls-creds",
            "tls0",
        ]);
    }
    let c = c
        .args([
            "-f",
            "raw",
            "--cache=none",
            "--aio=native",
            "-b",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-x",
            "d",
            "--persistent",
            "--shared=0",
            file,
        ])
        .stderr(Stdio::null()) // it complains about the readiness probe's connection
        .spawn()
        .context("starting qemu-nbd (apt-get install qemu-utils)")?;
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok((Proc(c), format!("nbd://127.0.0.1:{port}/d")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("qemu-nbd did not start listening")
}

/// `bench slow-backing`: a skewed random-read workload against nbdkit with its delay filter
/// (a slow backing standing in for an HDD) directly, and through cachevisor in front of it;
/// the daemon records its requests, which are replayed in the simulator with the same cache
/// to compare hit ratios.
/// The cache in front of the slow backing.
#[derive(Debug, Clone)]
pub struct SlowCache {
    /// Size in MiB.
    pub mib: u64,
    /// Write policy.
    pub write_policy: String,
    /// Background flusher rate (`0`: off).
    pub flush_rate: String,
    /// Destage after each cached run and report its rate.
    pub destage: bool,
}

#[allow(clippy::too_many_arguments)]
pub fn slow_backing(
    delay_ms: u32,
    disk_mib: u64,
    cache: &SlowCache,
    secs: u32,
    rounds: usize,
    depths: &[u32],
    read_percent: u32,
    dir: &Path,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let dir = &std::fs::canonicalize(dir)?; // absolute, as the config's paths must be
    let delay = format!("{delay_ms}ms");
    let kit_args = [
        "--filter=delay",
        "-t",
        "16",
        "memory",
        &format!("{disk_mib}M"),
        &format!("rdelay={delay}"),
        &format!("wdelay={delay}"),
    ];
    let range = format!("{disk_mib}MiB");
    let mix = format!("--rwmixread={read_percent}");
    let zipf = ["--random_distribution=zipf:1.2", "--norandommap", mix.as_str()];
    let rw = match read_percent {
        100.. => "randread",
        0 => "randwrite",
        _ => "randrw",
    };
    let cache_mib = cache.mib;
    let (wp, flush) = (&cache.write_policy, &cache.flush_rate);
    println!("slow backing: nbdkit memory {disk_mib} MiB with {delay} per request (16 threads); fio 4 KiB random I/O, {read_percent}% reads, zipf 1.2, cachevisor {cache_mib} MiB {wp} with the flusher at {flush}/s, {secs} s per run, {rounds} rounds per iodepth; IOPS count reads and writes, latencies are the reads' (the writes' when there are none)");
    println!(
        "{:<8} {:<6} {:>13} {:>16} {:>9} {:>24} {:>24}",
        "iodepth",
        "round",
        "backing IOPS",
        "cachevisor IOPS",
        "speed-up",
        "mean µs backing/cached",
        "p99 µs backing/cached"
    );
    let rec = dir.join("slow-run.csv");
    let (mut live_hit, mut live) = (0.0, 0.0);
    let mut summary = Vec::new();
    for (di, &depth) in depths.iter().enumerate() {
        let (mut direct, mut cached) = (Vec::new(), Vec::new());
        for round in 0..rounds.max(1) {
            let first = di == 0 && round == 0;
            let (kit, kit_uri) = start_nbdkit(&kit_args)?;
            direct.push(fio_with(&kit_uri, rw, depth, secs, &range, &zipf)?);
            let backing = kit_uri.trim_end_matches('/').to_string() + "/";
            let (cv_proc, cv_uri, api) = start_cachevisor_api(
                dir,
                &backing,
                &format!("{cache_mib}MiB"),
                first.then_some(rec.as_path()),
                "auto",
                &format!("write_policy = \"{wp}\"\nflush_rate = \"{flush}\""),
                "",
            )?;
            let cv = (cv_proc, api);
            cached.push(fio_with(&cv_uri, rw, depth, secs, &range, &zipf)?);
            if cache.destage {
                let (blocks, secs) = destage_through_api(dir, &cv.1)?;
                let limit = 16.0 / (delay_ms as f64 / 1000.0);
                println!("         destage: {blocks} dirty blocks written back in {secs:.2} s: {:.0} blocks/s, {:.2}x the backing's limit of {limit:.0} writes/s (16 connections, {delay} each)", blocks as f64 / secs, blocks as f64 / secs / limit);
            }
            if first {
                let v: serde_json::Value = ureq::get(&format!("http://{}/vdisks", cv.1)).call()?.into_json()?;
                let s = &v[0]["stats"];
                live = s["hit_blocks"].as_f64().unwrap_or(0.0) / s["blocks"].as_f64().unwrap_or(1.0).max(1.0);
                // A clean stop (SIGTERM) finishes the recording.
                Command::new("kill").args(["-TERM", &cv.0 .0.id().to_string()]).status()?;
                let mut cv = cv;
                cv.0 .0.wait()?;
            } else {
                drop(cv);
            }
            drop(kit);
            let (b, c): (FioReads, FioReads) = (direct[round], cached[round]);
            println!(
                "{depth:<8} {round:<6} {:>13.0} {:>16.0} {:>9.2} {:>24} {:>24}",
                b.iops,
                c.iops,
                c.iops / b.iops,
                format!("{:.0} / {:.0}", b.mean_us, c.mean_us),
                format!("{:.0} / {:.0}", b.p99_us, c.p99_us)
            );
            if first {
                live_hit = replay_hit_ratio(&rec, cache_mib, wp.parse().map_err(anyhow::Error::msg)?)?;
            }
        }
        let med = |v: &[FioReads], f: fn(&FioReads) -> f64| median(v.iter().map(f).collect());
        summary.push((
            depth,
            med(&direct, |r| r.iops),
            med(&cached, |r| r.iops),
            med(&direct, |r| r.mean_us),
            med(&cached, |r| r.mean_us),
        ));
    }
    for (depth, d, c, dl, cl) in summary {
        println!("median at iodepth {depth}: backing {d:.0} IOPS, cachevisor {c:.0} IOPS, speed-up {:.2}x; mean latency {dl:.0} µs vs {cl:.0} µs ({:.2}x lower)", c / d, dl / cl);
    }
    println!(
        "hit ratio of the first run: daemon {:.2}%, simulator replaying its recording with the same cache {:.2}% (difference {:.2} points); 1/(1-h) = {:.1}x would be the speed-up with free hits",
        live * 100.0,
        live_hit * 100.0,
        (live_hit - live).abs() * 100.0,
        1.0 / (1.0 - live_hit).max(1e-9)
    );
    Ok(())
}

/// Starts a destage job of every vDisk through the daemon's API (token from the metadata
/// directory) and waits for it; returns the blocks written back and the seconds taken.
fn destage_through_api(dir: &Path, api: &str) -> anyhow::Result<(u64, f64)> {
    let token = std::fs::read_to_string(dir.join("cache.img.meta").join("api-token")).context("API token")?;
    let auth = format!("Bearer {}", token.trim());
    ureq::post(&format!("http://{api}/destage")).set("authorization", &auth).call()?;
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let p: serde_json::Value = ureq::get(&format!("http://{api}/destage")).call()?.into_json()?;
        if p["running"].as_bool() == Some(false) {
            if let Some(e) = p["error"].as_str() {
                bail!("destage failed: {e}");
            }
            return Ok((p["done_blocks"].as_u64().unwrap_or(0), p["elapsed_s"].as_f64().unwrap_or(0.0).max(1e-9)));
        }
    }
}

/// Hit ratio of the recorded run replayed through the simulator with the same cache.
fn replay_hit_ratio(rec: &Path, cache_mib: u64, policy: cachevisor_engine::WritePolicy) -> anyhow::Result<f64> {
    let mut sc = cachevisor_sim::Scenario::default();
    sc.cache.size = format!("{cache_mib}MiB");
    sc.cache.write_policy = policy;
    sc.replay.mode = cachevisor_sim::scenario::ReplayMode::Open;
    sc.trace.files = vec![rec.to_path_buf()];
    sc.trace.vm_mode = Some(cachevisor_trace::VmMode::Device);
    sc.trace.skip_bad = true; // the last line may be cut by the kill
    let r =
        cachevisor_sim::simulate(&sc, &mut |_| {}).map_err(|e| anyhow::anyhow!("replaying {}: {e}", rec.display()))?;
    Ok(r.total.hit_ratio)
}
