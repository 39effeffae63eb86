//! `cachevisor bench datapath`: the new data path (the engine's asynchronous face in
//! persistent mode, `cachevisor_datapath`) against the device it runs on, in one
//! process: client threads issue random reads or writes (`--bs`, 4 KiB by default) through the data path, and
//! the same number of threads issue them straight to a plain file of the same size
//! (`pread`/`pwrite`, buffered: the ceiling any cache on this file system has). Rounds
//! are interleaved; medians and their ratio are reported. No NBD in the loop: this
//! measures the engine, its locking and its commits, before the NBD front end moves onto
//! it.
//!
//! Reads are timed warm: every block is read through the data path once first, so each
//! timed read is a hit. Beside them, at `--bs` 4 KiB, a third side reads the cache file
//! itself at each block's slot (the same file, offsets and open flags the hit path reads):
//! the limit of a hit, so `datapath / cache file` is what the data path adds to it.

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
    println!(
        "{:<12} {:>8} {:>14} {:>14} {:>16} {:>7} {:>12}",
        "rw", "threads", "datapath IOPS", "file IOPS", "cache file IOPS", "ratio", "of the limit"
    );
    // Where each block's bytes are in the cache file, once every block is cached.
    let mut slots: Option<(std::fs::File, Vec<u64>)> = None;
    for rw in rws {
        let write = rw == "randwrite";
        if !write && slots.is_none() {
            slots = warm(&dp, &dp_dir, disk_size, bs, direct)?;
        }
        for &t in threads {
            let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
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
                if let (false, Some((file, at))) = (write, &slots) {
                    c.push(timed(
                        t,
                        secs,
                        blocks,
                        bs,
                        |blk, buf, _| {
                            let r = if direct {
                                BOUNCE.with(|b| aligned_buf::read_at(file, &mut b.borrow_mut(), buf, at[blk as usize]))
                            } else {
                                file.read_exact_at(buf, at[blk as usize])
                            };
                            r.expect("cache file read");
                        },
                        false,
                    ));
                }
            }
            let (ma, mb) = (crate::bench::median(a), crate::bench::median(b));
            let (limit, of) = if c.is_empty() {
                ("-".to_string(), "-".to_string())
            } else {
                let mc = crate::bench::median(c);
                (format!("{mc:.0}"), format!("{:.2}×", ma / mc))
            };
            println!("{rw:<12} {t:>8} {ma:>14.0} {mb:>14.0} {limit:>16} {:>6.2}× {of:>12}", ma / mb);
        }
    }
    dp.flush(0).map_err(|f| anyhow::anyhow!("flush: {f:?}"))?;
    Ok(())
}

/// Reads every block of the disk through the data path (256 KiB at a time) so timed
/// reads hit, and returns the cache file (opened as the data path opens it) with each
/// block's byte offset there — at `bs` = one block, with every block cached; `None`
/// otherwise (no limit side).
fn warm(
    dp: &DataPath,
    dir: &Path,
    disk_size: u64,
    bs: u64,
    direct: bool,
) -> anyhow::Result<Option<(std::fs::File, Vec<u64>)>> {
    let mut buf = vec![0u8; 256 << 10];
    for at in (0..disk_size).step_by(buf.len()) {
        let n = (disk_size - at).min(buf.len() as u64) as usize;
        dp.read(0, at, &mut buf[..n]).map_err(|f| anyhow::anyhow!("warming: {f:?}"))?;
    }
    let slots: Option<Vec<u32>> = dp.with_engine(|e| (0..disk_size / BS).map(|b| e.lookup(0, b)).collect());
    let Some(slots) = slots.filter(|_| bs == BS) else {
        println!("  (no cache-file side: --bs is not one block, or the cache holds less than the disk)");
        return Ok(None);
    };
    let path = dir.join("cache.img");
    let file = if direct { aligned_buf::open_direct(&path)? } else { std::fs::File::open(&path)? };
    let at = slots.iter().map(|&s| cachevisor_store::cache_label::DATA_OFFSET + u64::from(s) * BS).collect();
    Ok(Some((file, at)))
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
