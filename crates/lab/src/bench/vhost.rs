//! `cachevisor bench vhost`: the two doors a QEMU guest has to a cachevisor vDisk — QEMU's
//! NBD client (`-blockdev driver=nbd` on the unix socket, a virtio-blk-pci device) and
//! vhost-user-blk (`listen.vhost_user`) — and the peer's vhost-user-blk,
//! `qemu-storage-daemon --export type=vhost-user-blk` on a raw file with
//! `cache.direct=on,aio=native` (the strongest form of the peer: no page cache, Linux AIO).
//! A vSSD of the same size over vhost-user-blk is a fourth disk: the same door without the
//! cache engine in the data path, which splits the door's cost from the engine's.
//! One real guest (Debian's kernel under QEMU, TCG here) sees them as four virtio
//! disks and runs `dd` with O_DIRECT on each, 4 KiB at queue depth 1, reads then writes,
//! in interleaved rounds (the order rotates each round); the medians and their ratios.
//! cachevisor's cache is O_DIRECT too (`cache.direct = "on"`), and big enough to hold the
//! range, so both sides read and write one SSD file with O_DIRECT. Under TCG the guest's
//! own emulation is in every figure: the ratios understate the doors' difference on KVM.
//!
//! Every read reaches data: the peer's file and the vDisk's backing file are written in
//! full first, and the guest writes each disk once before the first read (a sparse
//! file's holes, and a vSSD block never written, read with no I/O: the peer's reads of a
//! fresh file cost nothing while the vDisk's hits read the SSD — the peer had looked 2.2×
//! faster for it). Background write-back is off (`flush_rate = "0"`,
//! `writeback_ahead = 0`): the peer has none, and with it on the vDisk's timed reads ran
//! beside write-backs of the blocks the write rounds left dirty, reads and writes on the
//! same disk (the vDisk's reads 0.75× the peer then; without it, 2026-12-07: 1.20× at
//! the defaults, 20,000 I/Os × 5 rounds, and 1.22× and 0.93× in two runs of 3,000 I/Os —
//! the TCG guest's spread, runs 2,069–3,226 IOPS on one door).

use crate::bench::median;
use crate::bench::serve::{free_port, spawn_serve};
use anyhow::{bail, Context};
use cachevisor_testkit::guest_vm::{init, initramfs, Guest};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What the bench runs.
#[derive(Debug, Clone)]
pub struct Job {
    /// The guest kernel's directory (`scripts/guest-kernel`'s).
    pub kernel: PathBuf,
    /// `qemu-storage-daemon`.
    pub qsd: PathBuf,
    /// I/Os per run.
    pub ios: u64,
    /// Interleaved rounds.
    pub rounds: usize,
}

/// The disks as the guest sees them (command-line order) and what each is: the vDisk
/// through both doors, the peer, and a vSSD of the same size over vhost-user-blk (no
/// engine in its data path: it splits the door's cost from the cache's).
const DOORS: [(&str, &str); 4] = [
    ("vda", "cachevisor vDisk, NBD"),
    ("vdb", "cachevisor vDisk, vhost-user-blk"),
    ("vdc", "qemu-storage-daemon vhost-user-blk"),
    ("vdd", "cachevisor vSSD, vhost-user-blk"),
];

/// The guest's script: rounds of dd on each disk, the order rotated each round, each run
/// reported with /proc/uptime before and after.
fn script(ios: u64, rounds: usize) -> String {
    format!(
        r#"i=0
while [ ! -b /dev/vdd ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
echo "GUEST: disks $(cat /sys/block/vda/size) $(cat /sys/block/vdb/size) $(cat /sys/block/vdc/size) $(cat /sys/block/vdd/size)"
for d in vda vdc vdd; do dd if=/dev/zero of=/dev/$d bs=4k count={ios} oflag=direct conv=notrunc 2>/dev/null; done
for d in vda vdb vdc vdd; do dd if=/dev/$d of=/dev/null bs=4k count={ios} iflag=direct 2>/dev/null; done
r=0
while [ $r -lt {rounds} ]; do
  case $((r % 4)) in 0) order="vda vdb vdc vdd";; 1) order="vdb vdc vdd vda";; 2) order="vdc vdd vda vdb";; *) order="vdd vda vdb vdc";; esac
  for d in $order; do
    t0=$(cut -d' ' -f1 /proc/uptime)
    dd if=/dev/$d of=/dev/null bs=4k count={ios} iflag=direct 2>/dev/null || echo "GUEST: FAIL read $d"
    t1=$(cut -d' ' -f1 /proc/uptime)
    echo "BENCH $d read $t0 $t1"
    t0=$(cut -d' ' -f1 /proc/uptime)
    dd if=/dev/zero of=/dev/$d bs=4k count={ios} oflag=direct conv=notrunc 2>/dev/null || echo "GUEST: FAIL write $d"
    t1=$(cut -d' ' -f1 /proc/uptime)
    echo "BENCH $d write $t0 $t1"
  done
  r=$((r+1))
done
echo "GUEST: done"
poweroff -f
"#
    )
}

/// A child process killed when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for `path` to exist.
fn wait_for_socket(path: &Path, what: &str) -> anyhow::Result<()> {
    let end = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        if Instant::now() > end {
            bail!("{what} made no socket at {}", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Runs the bench in `dir`.
pub fn run(job: &Job, dir: &Path) -> anyhow::Result<()> {
    if !job.kernel.join("vmlinuz").exists() || !job.kernel.join("load-order").exists() {
        bail!("--kernel {}: no guest kernel there (scripts/guest-kernel unpacks one)", job.kernel.display());
    }
    std::fs::create_dir_all(dir)?;
    let dir = &std::fs::canonicalize(dir)?;
    let range_mib = (job.ios * 4096).div_ceil(1 << 20).max(1);
    let size_mib = range_mib.max(16);
    for f in ["cache.img", "d.img", "peer.img", "nbd.sock", "qsd.sock"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    let _ = std::fs::remove_dir_all(dir.join("cache.img.meta"));
    let _ = std::fs::remove_dir_all(dir.join("vhost"));
    std::fs::create_dir(dir.join("vhost"))?;
    // Data everywhere in both files a read may reach: a sparse file's holes read without
    // any I/O (the peer's reads of a fresh file cost nothing while the vDisk's hits read
    // the SSD). The guest then writes every disk once before the first read, so the
    // vSSD's blocks and the cache's hold data too.
    for f in ["peer.img", "d.img"] {
        let file = std::fs::File::create(dir.join(f))?;
        let chunk = vec![0xa5u8; 1 << 20];
        for at in 0..size_mib {
            std::os::unix::fs::FileExt::write_all_at(&file, &chunk, at << 20)?;
        }
        file.sync_all()?;
    }
    let cfg = dir.join("vhost.toml");
    let api = format!("127.0.0.1:{}", free_port()?);
    std::fs::write(
        &cfg,
        format!(
            "[cache]\npath = \"cache.img\"\nsize = \"{c}MiB\"\nblock_size = \"4KiB\"\ndirect = \"on\"\nwrite_policy = \"wb\"\nflush_rate = \"0\"\nwriteback_ahead = 0\n\
             [listen]\ntcp = \"127.0.0.1:{port}\"\nunix = \"nbd.sock\"\nvhost_user = \"vhost\"\n[api]\nlisten = \"{api}\"\n\
             [vssd]\nsize = \"{size_mib}MiB\"\n[[vssd.device]]\nname = \"s\"\nmax_size = \"{size_mib}MiB\"\ninitial_size = \"{size_mib}MiB\"\n\
             [[vdisk]]\nname = \"d\"\nbacking = \"d.img\"\nsize = \"{size_mib}MiB\"\n",
            c = size_mib * 2,
            port = free_port()?
        ),
    )?;
    let _cv = spawn_serve(&cfg, None)?;
    wait_for_socket(&dir.join("vhost/d.sock"), "cachevisor")?;
    wait_for_socket(&dir.join("vhost/s.sock"), "cachevisor")?;
    let qsd = Command::new(&job.qsd)
        .arg("--blockdev")
        .arg(format!("driver=file,node-name=f,filename={},cache.direct=on,aio=native", dir.join("peer.img").display()))
        .args(["--blockdev", "driver=raw,node-name=r,file=f", "--export"])
        .arg(format!(
            "type=vhost-user-blk,id=e,node-name=r,addr.type=unix,addr.path={},writable=on",
            dir.join("qsd.sock").display()
        ))
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", job.qsd.display()))?;
    let _qsd = Child(qsd);
    wait_for_socket(&dir.join("qsd.sock"), "qemu-storage-daemon")?;
    let initrd = initramfs(dir, &job.kernel, &init(&script(job.ios, job.rounds)), &[]);
    let mut args: Vec<String> = Vec::new();
    let mut arg = |a: &str, b: String| args.extend([a.to_string(), b]);
    arg("-object", "memory-backend-memfd,id=mem,size=512M,share=on".into());
    arg("-machine", "pc,memory-backend=mem".into());
    arg(
        "-blockdev",
        format!("driver=nbd,node-name=nbd,server.type=unix,server.path={},export=d", dir.join("nbd.sock").display()),
    );
    arg("-device", "virtio-blk-pci,drive=nbd".into());
    for (i, s) in [dir.join("vhost/d.sock"), dir.join("qsd.sock"), dir.join("vhost/s.sock")].iter().enumerate() {
        arg("-chardev", format!("socket,id=vu{i},path={}", s.display()));
        arg("-device", format!("vhost-user-blk-pci,chardev=vu{i},num-queues=1"));
    }
    println!(
        "a guest (TCG) on four disks, dd 4 KiB O_DIRECT at queue depth 1, {} I/Os per run, {} interleaved rounds",
        job.ios, job.rounds
    );
    let mut guest = Guest::boot(&job.kernel, &initrd, "512M", &args);
    let disks = guest.wait_for("GUEST: disks", Duration::from_secs(180));
    let want = (size_mib << 20) / 512;
    let sizes = disks.split("GUEST: disks").nth(1).unwrap_or_default();
    if sizes.split_whitespace().count() != DOORS.len()
        || sizes.split_whitespace().any(|s| s.parse::<u64>().ok() != Some(want))
    {
        bail!("the guest does not see four {size_mib} MiB disks: {disks}");
    }
    guest.wait_for("GUEST: done", Duration::from_secs(600 + job.ios / 100 * job.rounds as u64));
    let ran = guest.started.elapsed();
    let (_, console, qemu_log) = guest.finish();
    println!("(the guest ran {:.0} s)", ran.as_secs_f64());
    if console.contains("GUEST: FAIL") {
        bail!("a run failed in the guest:\n{console}\n{qemu_log}");
    }
    let mut iops: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    for l in console.lines().filter_map(|l| l.trim().strip_prefix("BENCH ")) {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (Some(t0), Some(t1)) =
            (f.get(2).and_then(|t| t.parse::<f64>().ok()), f.get(3).and_then(|t| t.parse::<f64>().ok()))
        else {
            continue;
        };
        iops.entry((f[0].to_string(), f[1].to_string())).or_default().push(job.ios as f64 / (t1 - t0).max(0.01));
    }
    // The vDisk's reads were cache hits (the range fits): what is measured is the door and
    // the hit path, not the backing file.
    let v: serde_json::Value = ureq::get(&format!("http://{api}/vdisks")).call()?.into_json()?;
    let (reads, hits) =
        (v[0]["stats"]["read_blocks"].as_u64().unwrap_or(0), v[0]["stats"]["read_hit_blocks"].as_u64().unwrap_or(0));
    println!(
        "vDisk reads that hit the cache: {hits} of {reads} blocks ({:.1}%)",
        100.0 * hits as f64 / reads.max(1) as f64
    );
    println!("{:<6} {:<36} {:>12} {:>12}", "op", "door", "median IOPS", "vs NBD");
    for op in ["read", "write"] {
        let m = |d: &str| iops.get(&(d.to_string(), op.to_string())).map(|v| median(v.clone())).unwrap_or(0.0);
        let nbd = m("vda");
        for (d, what) in DOORS {
            let v = iops.get(&(d.to_string(), op.to_string())).cloned().unwrap_or_default();
            println!("{op:<6} {what:<36} {:>12.0} {:>12.2}   (runs: {v:.0?})", m(d), m(d) / nbd.max(1e-9));
        }
        println!(
            "{op:<6} against qemu-storage-daemon's vhost-user-blk: cachevisor vDisk {:.2}, vSSD {:.2}",
            m("vdb") / m("vdc").max(1e-9),
            m("vdd") / m("vdc").max(1e-9)
        );
    }
    Ok(())
}
