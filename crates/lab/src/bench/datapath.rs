//! `cachevisor bench datapath`: the new data path (the engine's asynchronous face in
//! persistent mode, `cachevisor_datapath`) against the device it runs on, in one
//! process: client threads issue random reads or writes (`--bs`, 4 KiB by default) through the data path, and
//! the same number of threads issue them straight to a plain file of the same size
//! (`pread`/`pwrite`, buffered: the ceiling any cache on this file system has). Rounds
//! are interleaved; medians and their ratio are reported. No NBD in the loop: this
//! measures the engine, its locking and its commits, before the NBD front end moves onto
//! it.

use cachevisor_datapath::DataPath;
use cachevisor_engine::{EngineConfig, Flusher, PartitionMode, Schedule, WritePolicy};
use rand::{Rng, SeedableRng};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BS: u64 = 4096;

use cachevisor_files::aligned_buf;

thread_local! {
    /// Each client thread's aligned buffer for the O_DIRECT plain file.
    static BOUNCE: std::cell::RefCell<aligned_buf::AlignedBuf> = Default::default();
}

/// One timed run: `threads` clients for `secs`, reads or writes of `bs` bytes at random
/// `bs`-aligned offsets below `blocks × bs`; returns IOPS.
fn timed(
    threads: usize,
    secs: f64,
    blocks: u64,
    bs: u64,
    op: impl Fn(u64, &mut [u8], bool) + Sync,
    write: bool,
) -> f64 {
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (stop, done, op) = (&stop, &done, &op);
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64 + 1);
                let mut buf = vec![0x5au8; bs as usize];
                while !stop.load(Ordering::Relaxed) {
                    op(rng.gen_range(0..blocks), &mut buf, write);
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
    });
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// Runs the bench.
#[allow(clippy::too_many_arguments)]
pub fn run(
    disk_size: u64,
    cache_size: u64,
    bs: u64,
    threads: &[usize],
    rws: &[String],
    secs: f64,
    rounds: usize,
    direct: bool,
    device_threads: usize,
    nbd: bool,
    dir: &Path,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        bs >= 512 && bs.is_multiple_of(512) && bs <= disk_size,
        "--bs must be a multiple of 512 up to the disk size"
    );
    std::fs::create_dir_all(dir)?;
    let device_threads = match device_threads {
        0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
        n => n,
    };
    let blocks = disk_size / bs;
    // The plain file: written once so reads find data, as the data path's disk does.
    let raw_path = dir.join("raw.img");
    let raw = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&raw_path)?;
    raw.set_len(disk_size)?;
    // With --direct both sides are O_DIRECT (the cache store, and the plain file as
    // `qemu-nbd --cache=none` opens it).
    let raw = if direct { aligned_buf::open_direct(&raw_path)? } else { raw };
    let dp_dir = dir.join("datapath");
    let _ = std::fs::remove_dir_all(&dp_dir);
    std::fs::create_dir_all(&dp_dir)?;
    // Both disks hold data everywhere (a sparse file's holes read without I/O).
    for path in [raw_path.clone(), dp_dir.join("disk0.img")] {
        let f = std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(&path)?;
        let chunk = vec![0xa5u8; 1 << 20];
        for at in (0..disk_size).step_by(1 << 20) {
            f.write_all_at(&chunk[..(disk_size - at).min(1 << 20) as usize], at)?;
        }
        f.sync_all()?;
    }
    let cfg = EngineConfig {
        partition: PartitionMode::Shared,
        write_policy: WritePolicy::Wb,
        ..EngineConfig::with_slots(cache_size / BS)
    };
    // The daemon's defaults: the flusher at 16 MiB/s, keeping up to 10% of the cache dirty.
    let flusher = Flusher { period_ns: 100_000_000, blocks_per_period: (16 << 20) / 10 / BS, dirty_target: 0.1 };
    let dp = Arc::new(
        DataPath::open_in(
            &dp_dir,
            cfg,
            1,
            disk_size,
            device_threads,
            Schedule { interval_ns: 0, flusher: Some(flusher), ..Default::default() },
            1024,
            None,
            if direct { cachevisor_server::config::DirectIo::On } else { cachevisor_server::config::DirectIo::Off },
            true,
            None,
        )
        .map_err(anyhow::Error::msg)?,
    );
    if nbd {
        return through_nbd(&dp, disk_size, bs, threads, rws, secs, rounds, &raw_path);
    }
    println!(
        "data path (engine, persistent mode, {} device threads) vs a plain file, {} KiB random I/O, disk {} MiB, cache {} MiB, {rounds} interleaved rounds of {secs} s, medians",
        device_threads,
        bs / 1024,
        disk_size >> 20,
        cache_size >> 20
    );
    println!("{:<12} {:>8} {:>14} {:>14} {:>7}", "rw", "threads", "datapath IOPS", "file IOPS", "ratio");
    for rw in rws {
        let write = rw == "randwrite";
        for &t in threads {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for _ in 0..rounds {
                a.push(timed(
                    t,
                    secs,
                    blocks,
                    bs,
                    |blk, buf, w| {
                        let r = if w { dp.write(0, blk * bs, buf, false) } else { dp.read(0, blk * bs, buf) };
                        r.expect("data path I/O");
                    },
                    write,
                ));
                b.push(timed(
                    t,
                    secs,
                    blocks,
                    bs,
                    |blk, buf, w| {
                        let r = match (direct, w) {
                            (true, true) => {
                                BOUNCE.with(|b| aligned_buf::write_at(&raw, &mut b.borrow_mut(), buf, blk * bs))
                            }
                            (true, false) => {
                                BOUNCE.with(|b| aligned_buf::read_at(&raw, &mut b.borrow_mut(), buf, blk * bs))
                            }
                            (false, true) => raw.write_all_at(buf, blk * bs),
                            (false, false) => raw.read_exact_at(buf, blk * bs),
                        };
                        r.expect("file I/O");
                    },
                    write,
                ));
            }
            let (ma, mb) = (crate::bench::median(a), crate::bench::median(b));
            println!("{rw:<12} {t:>8} {ma:>14.0} {mb:>14.0} {:>6.2}×", ma / mb);
        }
    }
    dp.flush(0).map_err(|f| anyhow::anyhow!("flush: {f:?}"))?;
    Ok(())
}

/// `--nbd`: the data path served over NBD on loopback (in this process:
/// `cachevisor_nbd::transmission`) against `qemu-nbd --cache=none --aio=native` on the plain
/// file, both driven by fio's nbd engine (iodepth = the `--threads` values).
#[allow(clippy::too_many_arguments)]
fn through_nbd(
    dp: &Arc<DataPath>,
    disk_size: u64,
    bs: u64,
    depths: &[usize],
    rws: &[String],
    secs: f64,
    rounds: usize,
    raw_path: &Path,
) -> anyhow::Result<()> {
    use cachevisor_nbd::handshake::{negotiate, Negotiated};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let server = dp.clone();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { continue };
            let dp = server.clone();
            std::thread::spawn(move || {
                let _ = s.set_nodelay(true);
                if let Ok(Negotiated::Export(vm, replies)) =
                    negotiate(&mut s, &cachevisor_nbd::transmission::SingleExport { size: disk_size, block_size: BS })
                {
                    if let Ok(out) = s.try_clone() {
                        let backend = std::sync::Arc::new(cachevisor_datapath::vdisk_export::VdiskExport {
                            dp,
                            vm,
                            retry_io: false,
                        });
                        let _ = cachevisor_nbd::transmission::serve(s, out, backend, (disk_size, replies), None);
                    }
                }
            });
        }
    });
    let ours = format!("nbd://127.0.0.1:{port}/vm0");
    let (_qemu, theirs) = crate::bench::serve::start_qemu_nbd(&raw_path.display().to_string(), None)?;
    let size = format!("{}M", disk_size >> 20);
    let bs_arg = format!("--bs={bs}");
    let secs = secs.ceil().max(1.0) as u32;
    println!(
        "data path over NBD (in process) vs qemu-nbd --cache=none --aio=native, fio nbd engine, {} KiB, disk {} MiB, {rounds} interleaved rounds of {secs} s, medians",
        bs / 1024,
        disk_size >> 20
    );
    println!("{:<12} {:>8} {:>14} {:>14} {:>7}", "rw", "iodepth", "datapath IOPS", "qemu-nbd IOPS", "ratio");
    for rw in rws {
        for &d in depths {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for _ in 0..rounds {
                a.push(crate::bench::serve::fio_with(&ours, rw, d as u32, secs, &size, &[&bs_arg])?.iops);
                b.push(crate::bench::serve::fio_with(&theirs, rw, d as u32, secs, &size, &[&bs_arg])?.iops);
            }
            let (ma, mb) = (crate::bench::median(a), crate::bench::median(b));
            println!("{rw:<12} {d:>8} {ma:>14.0} {mb:>14.0} {:>6.2}×", ma / mb);
        }
    }
    Ok(())
}
