//! `cachevisor bench devices`: the cache over 1, 2 and 4 devices (`[[cache.device]]`), the
//! cost of mirrored dirty data (`cache.mirror_dirty`), and the RAM tier's hits against the
//! SSD's (`cache.ram`). One disk image is served by `cachevisor serve` with a cache that
//! holds it whole, laid out as one device, two, two mirrored, four (the same total), or
//! one with a RAM tier as large; each daemon is warmed by one full read (two with the
//! tier: the second copies every block to RAM), then fio's
//! nbd engine runs 4 KiB random reads (cache hits) at queue depth 1 and 32 and 4 KiB
//! random writes (write-back hits, the flusher off) at queue depth 32. Layouts are
//! interleaved over the rounds and the medians reported, with each layout's ratio to one
//! device. The device files share whatever disk the working directory is on: what
//! scaling a run shows is that disk's (and the CPU's), not separate drives'.

use crate::bench::median;
use crate::bench::serve::{fio_with, free_port, spawn_serve, Proc};
use std::path::Path;

/// What the bench runs.
#[derive(Debug, Clone)]
pub struct Job {
    /// Disk image (and cache) size, MiB.
    pub disk_mib: u64,
    /// Interleaved rounds.
    pub rounds: usize,
    /// Seconds per fio run.
    pub secs: u32,
}

/// A cache layout: its name, device count, whether dirty data is mirrored, and whether a
/// RAM tier holds the image too.
const LAYOUTS: [(&str, u32, bool, bool); 5] = [
    ("1 device", 1, false, false),
    ("2 devices", 2, false, false),
    ("2 devices, mirrored", 2, true, false),
    ("4 devices", 4, false, false),
    ("1 device + RAM tier", 1, false, true),
];

/// What one layout measured in one round: read IOPS at QD1 and QD32, write IOPS at QD32.
type Round = [f64; 3];

/// Starts `cachevisor serve` in `dir` on `disk` with the cache over `n` devices (the
/// image's size plus a margin, split equally; `mirror` for two copies of dirty data, the
/// cache twice as large so the working set still fits); returns the daemon and its URI.
fn start(dir: &Path, disk: &Path, mib: u64, (n, mirror, ram): (u32, bool, bool)) -> anyhow::Result<(Proc, String)> {
    let _ = std::fs::remove_dir_all(dir.join("cache"));
    std::fs::create_dir_all(dir.join("cache"))?;
    let total = (mib + mib / 4 + 4) * if mirror { 2 } else { 1 };
    let each = total.div_ceil(u64::from(n));
    let port = free_port()?;
    let mut cfg = format!(
        "[cache]\npath = \"cache/dev0.img\"\nsize = \"{each}MiB\"\nflush_rate = \"0\"\nwriteback_ahead = 0\nwrite_policy = \"wb\"\n"
    );
    if n > 1 {
        cfg.push_str(&format!("mirror_dirty = {mirror}\n"));
    }
    if ram {
        cfg.push_str(&format!("ram = \"{total}MiB\"\n"));
    }
    for i in 1..n {
        cfg.push_str(&format!("[[cache.device]]\npath = \"cache/dev{i}.img\"\nsize = \"{each}MiB\"\n"));
    }
    cfg.push_str(&format!(
        "[listen]\ntcp = \"127.0.0.1:{port}\"\n[prewarm]\nsnapshot_every = \"0\"\n[[vdisk]]\nname = \"d\"\nbacking = \"{}\"\n",
        disk.display()
    ));
    let path = dir.join("bench-devices.toml");
    std::fs::write(&path, cfg)?;
    let p = spawn_serve(&path, None)?;
    Ok((p, format!("nbd://127.0.0.1:{port}/d")))
}

/// One round of `layout` (see the module doc).
fn round(dir: &Path, disk: &Path, job: &Job, layout: (u32, bool, bool)) -> anyhow::Result<Round> {
    let (_daemon, uri) = start(dir, disk, job.disk_mib, layout)?;
    let size = format!("{}M", job.disk_mib);
    fio_with(&uri, "read", 32, 0, &size, &["--bs=1M"])?; // every block cached
    if layout.2 {
        fio_with(&uri, "read", 32, 0, &size, &["--bs=1M"])?; // every block copied to RAM
    }
    let qd1 = fio_with(&uri, "randread", 1, job.secs, &size, &[])?.iops;
    let qd32 = fio_with(&uri, "randread", 32, job.secs, &size, &[])?.iops;
    let writes = fio_with(&uri, "randwrite", 32, job.secs, &size, &[])?.iops;
    Ok([qd1, qd32, writes])
}

/// Runs the bench and prints the table.
pub fn run(job: &Job, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let dir = &std::fs::canonicalize(dir)?;
    let disk = dir.join("disk.img");
    {
        use rand::RngCore;
        let mut data = vec![0u8; (job.disk_mib << 20) as usize];
        rand::thread_rng().fill_bytes(&mut data);
        std::fs::write(&disk, &data)?;
    }
    let mut got: Vec<Vec<Round>> = vec![Vec::new(); LAYOUTS.len()];
    for r in 0..job.rounds {
        for (i, &(name, n, mirror, ram)) in LAYOUTS.iter().enumerate() {
            let m = round(dir, &disk, job, (n, mirror, ram))?;
            eprintln!("round {}/{}: {name}: {:.0} / {:.0} / {:.0} IOPS", r + 1, job.rounds, m[0], m[1], m[2]);
            got[i].push(m);
        }
    }
    let med: Vec<Round> = got.iter().map(|rs| [0, 1, 2].map(|k| median(rs.iter().map(|m| m[k]).collect()))).collect();
    println!(
        "cache over devices, {} MiB image held whole, 4 KiB, {} rounds interleaved, medians (ratio to 1 device)",
        job.disk_mib, job.rounds
    );
    println!("{:<22} {:>18} {:>18} {:>22}", "layout", "read hits QD1", "read hits QD32", "write-back QD32");
    for (i, &(name, ..)) in LAYOUTS.iter().enumerate() {
        let cell = |k: usize| format!("{:.0} ({:.2}×)", med[i][k], med[i][k] / med[0][k]);
        println!("{:<22} {:>18} {:>18} {:>22}", name, cell(0), cell(1), cell(2));
    }
    let cost = med[2][2] / med[1][2];
    println!("mirrored dirty data: write-back at {cost:.2}× of one copy on the same two devices");
    println!(
        "RAM tier: read hits at {:.2}× the SSD's at QD1 (target ≥ 2×), {:.2}× at QD32",
        med[4][0] / med[0][0],
        med[4][1] / med[0][1]
    );
    println!("the device files share {}'s disk: the scaling shown is that disk's and this CPU's", dir.display());
    Ok(())
}
