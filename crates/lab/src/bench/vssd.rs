//! `cachevisor bench vssd`: a vSSD's data path against qemu-nbd on a raw file, both with
//! O_DIRECT (cachevisor `cache.direct = "on"`, qemu-nbd `--cache=none --aio=native`), fio's
//! nbd engine at each pattern and queue depth in interleaved rounds, medians and their
//! ratio; then how long resizes take by size — a deflate answered at once by a guest
//! manager on the control channel (the `guest` crate's `Control`), until the blocks are
//! free, and the inflate back, until every block is valid (zeroed and journaled).

use crate::bench::median;
use crate::bench::serve::{fio_with, free_port, spawn_serve, start_qemu_nbd};
use anyhow::{bail, Context};
use cachevisor_guest::Control;
use cachevisor_vssd::protocol::{Notice, Reply, Request};
use std::path::Path;
use std::time::{Duration, Instant};

/// What the bench runs.
#[derive(Debug, Clone)]
pub struct Job {
    /// The vSSD's size (and the peer's file), MiB.
    pub size_mib: u64,
    /// fio patterns.
    pub rw: Vec<String>,
    /// fio block size.
    pub bs: String,
    /// Queue depths.
    pub iodepth: Vec<u32>,
    /// Seconds per fio run.
    pub secs: u32,
    /// Interleaved rounds.
    pub rounds: usize,
    /// Resize sizes, blocks (1 MiB each).
    pub resize_blocks: Vec<u32>,
}

/// A guest manager that gives back what it is asked at once: its highest valid blocks.
fn answer_deflates(sock: &Path) -> anyhow::Result<()> {
    let mut c = Control::open(sock)?;
    std::thread::spawn(move || loop {
        match c.notice(Duration::from_secs(3600)) {
            Ok(Some(Notice::Deflate { blocks, .. })) if blocks > 0 => {
                let Ok(Reply::State { mut valid, asked, .. }) = c.request(&Request::Hello) else { return };
                let give = valid.split_off(valid.len().saturating_sub(asked as usize));
                if !matches!(c.request(&Request::Release { lbns: give }), Ok(Reply::Released { .. })) {
                    return;
                }
            }
            Ok(_) => {}
            Err(_) => return,
        }
    });
    Ok(())
}

/// The vSSD's state from `GET /vssds`.
fn vssd_state(api: &str) -> anyhow::Result<serde_json::Value> {
    let v: serde_json::Value = ureq::get(&format!("http://{api}/vssds")).call()?.into_json()?;
    Ok(v[0].clone())
}

/// Sets the target and waits until `blocks` are valid and none is coming or leaving.
fn resize(api: &str, token: &str, blocks: u64) -> anyhow::Result<Duration> {
    let t = Instant::now();
    ureq::post(&format!("http://{api}/vssds/v/target"))
        .set("Authorization", &format!("Bearer {token}"))
        .send_json(serde_json::json!({ "blocks": blocks }))?;
    loop {
        let s = vssd_state(api)?;
        if s["valid"] == blocks && s["coming"] == 0 && s["leaving"] == 0 {
            return Ok(t.elapsed());
        }
        if t.elapsed() > Duration::from_secs(120) {
            bail!("the vSSD did not reach {blocks} blocks in 120 s: {s}");
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// Runs the bench in `dir`.
pub fn run(job: &Job, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let dir = &std::fs::canonicalize(dir)?;
    let size = job.size_mib << 20;
    let peer = dir.join("peer.img");
    {
        use rand::RngCore;
        let mut data = vec![0u8; size as usize];
        rand::thread_rng().fill_bytes(&mut data);
        std::fs::write(&peer, &data)?;
    }
    let (port, api) = (free_port()?, format!("127.0.0.1:{}", free_port()?));
    let _ = std::fs::remove_file(dir.join("cache.img"));
    let _ = std::fs::remove_dir_all(dir.join("cache.img.meta"));
    let cfg = dir.join("vssd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[cache]\npath = \"cache.img\"\nsize = \"4MiB\"\ndirect = \"on\"\n[listen]\ntcp = \"127.0.0.1:{port}\"\n[api]\nlisten = \"{api}\"\n\
             [vssd]\nsize = \"{m}MiB\"\ndeflate_grace = \"60s\"\n[[vssd.device]]\nname = \"v\"\nmax_size = \"{m}MiB\"\ninitial_size = \"{m}MiB\"\n\
             [[vdisk]]\nname = \"d\"\nbacking = \"d.img\"\nsize = \"16MiB\"\n",
            m = job.size_mib
        ),
    )?;
    let _cv = spawn_serve(&cfg, None)?;
    let token = std::fs::read_to_string(dir.join("cache.img.meta/api-token")).context("the API token")?;
    let blocks = job.size_mib;
    resize(&api, &token, blocks).context("waiting for the vSSD's blocks")?;
    let cv_uri = format!("nbd://127.0.0.1:{port}/v");
    let range = format!("{}MiB", job.size_mib);
    // Written once so reads hit allocated extents, as the peer's random bytes are.
    fio_with(&cv_uri, "write", 8, 0, &range, &["--bs=1M"]).context("filling the vSSD")?;
    let (_qn, qn_uri) = start_qemu_nbd(&peer.display().to_string(), None)?;
    println!(
        "fio {} with {} blocks over a {range} vSSD (O_DIRECT) vs qemu-nbd --cache=none --aio=native on a raw file, {} s per run, {} interleaved rounds",
        job.rw.join(","),
        job.bs,
        job.secs,
        job.rounds
    );
    println!("{:<10} {:<8} {:>16} {:>16} {:>8}", "rw", "iodepth", "vSSD IOPS", "qemu-nbd IOPS", "ratio");
    let bs = format!("--bs={}", job.bs);
    for rw in &job.rw {
        for &depth in &job.iodepth {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for _ in 0..job.rounds.max(1) {
                a.push(fio_with(&cv_uri, rw, depth, job.secs, &range, &[&bs])?.iops);
                b.push(fio_with(&qn_uri, rw, depth, job.secs, &range, &[&bs])?.iops);
            }
            let (ma, mb) = (median(a.clone()), median(b.clone()));
            println!("{rw:<10} {depth:<8} {ma:>16.0} {mb:>16.0} {:>8.2}   (runs: {a:.0?} vs {b:.0?})", ma / mb);
        }
    }
    answer_deflates(&dir.join("cache.img.meta/v.vssd.sock"))?;
    println!(
        "resize latency (1 MiB blocks; a guest manager gives blocks back at once), median of {} rounds:",
        job.rounds
    );
    println!("{:>8} {:>14} {:>14}", "blocks", "deflate ms", "inflate ms");
    for &n in job.resize_blocks.iter().filter(|&&n| u64::from(n) <= blocks) {
        let (mut down, mut up) = (Vec::new(), Vec::new());
        for _ in 0..job.rounds.max(1) {
            down.push(resize(&api, &token, blocks - u64::from(n))?.as_secs_f64() * 1e3);
            up.push(resize(&api, &token, blocks)?.as_secs_f64() * 1e3);
        }
        println!("{n:>8} {:>14.1} {:>14.1}   (runs: {down:.1?} / {up:.1?})", median(down.clone()), median(up.clone()));
    }
    Ok(())
}
