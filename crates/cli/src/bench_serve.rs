//! `cachevisor bench serve`: the daemon's hit path against a plain NBD server on the same
//! data. A disk image is served by `cachevisor serve` with a cache large enough to hold
//! it (warmed by one full read) and by nbdkit's file plugin; fio's nbd engine runs 4 KiB
//! random reads at iodepth 1 and 32 against each, interleaved over several rounds
//! (loopback figures swing between identical runs), and the medians and their ratio are
//! reported.

use anyhow::{bail, Context};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn start_cachevisor(dir: &Path, disk: &Path, size: &str) -> anyhow::Result<(Proc, String)> {
    let port = free_port()?;
    let cfg = dir.join("bench.toml");
    std::fs::write(
        &cfg,
        format!("[cache]\npath = \"cache.img\"\nsize = \"{size}\"\nwrite_policy = \"wt\"\n[listen]\ntcp = \"127.0.0.1:{port}\"\n[[vdisk]]\nname = \"d\"\nbacking = \"{}\"\n", disk.display()),
    )?;
    let _ = std::fs::remove_dir_all(dir.join("cache.img.meta"));
    let mut c = Command::new(std::env::current_exe()?).args(["serve", "--config"]).arg(&cfg).env("RUST_LOG", "warn").stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn()?;
    let out = c.stdout.take().context("stdout")?;
    let mut lines = BufReader::new(out).lines();
    loop {
        let l = lines.next().context("cachevisor serve exited")??;
        if l.starts_with("nbd://") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    Ok((Proc(c), format!("nbd://127.0.0.1:{port}/d")))
}

fn start_nbdkit(disk: &Path) -> anyhow::Result<(Proc, String)> {
    let port = free_port()?;
    let c = Command::new("nbdkit").args(["-f", "-i", "127.0.0.1", "-p", &port.to_string(), "file"]).arg(disk).spawn().context("starting nbdkit (apt-get install nbdkit)")?;
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
    let o = Command::new("fio")
        .args(["--name=b", "--ioengine=nbd", &format!("--uri={uri}"), &format!("--rw={rw}"), "--bs=4k", &format!("--iodepth={depth}"), &format!("--size={size}")])
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
    Ok(v["jobs"][0]["read"]["iops"].as_f64().unwrap_or(0.0))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs the bench.
pub fn run(disk_size: u64, rounds: usize, secs: u32, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let disk = dir.join("disk.img");
    {
        use rand::RngCore;
        let mut data = vec![0u8; disk_size as usize];
        rand::thread_rng().fill_bytes(&mut data);
        std::fs::write(&disk, &data)?;
    }
    let size = format!("{}MiB", disk_size.div_ceil(1 << 20) * 2);
    let range = format!("{}MiB", disk_size >> 20);
    let (cv, cv_uri) = start_cachevisor(dir, &disk, &size)?;
    fio(&cv_uri, "read", 8, 0, &range).context("warming the cache")?;
    let (nk, nk_uri) = start_nbdkit(&disk)?;
    println!("hit path: 4 KiB random reads over a {range} image held in cachevisor's cache vs nbdkit's file plugin, {secs} s per run, {rounds} interleaved rounds");
    println!("{:<10} {:>16} {:>16} {:>8}", "iodepth", "cachevisor IOPS", "nbdkit IOPS", "ratio");
    for depth in [1u32, 32] {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..rounds.max(1) {
            a.push(fio(&cv_uri, "randread", depth, secs, &range)?);
            b.push(fio(&nk_uri, "randread", depth, secs, &range)?);
        }
        let (ma, mb) = (median(a.clone()), median(b.clone()));
        println!("{depth:<10} {ma:>16.0} {mb:>16.0} {:>8.2}   (runs: {a:.0?} vs {b:.0?})", ma / mb);
    }
    drop((cv, nk));
    Ok(())
}
