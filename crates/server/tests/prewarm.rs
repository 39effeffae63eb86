//! Prewarming a daemon's cold cache from another daemon's snapshots, with real clients:
//! fio's zipf mix hits more in the first run after a prewarm than on a cold cache; the
//! prewarm rate holds as the backing store sees it (nbdkit's log); a corrupt snapshot is
//! refused by name and the daemon serves on cold; a write during a prewarm wins over the
//! blocks the prewarm loads, in every write policy.

mod common;
use cachevisor_server::config::Config;
use cachevisor_server::service::{start, Running};
use common::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A daemon config in `dir`: a `cache` of the given size, one vDisk `vm1` of 64 MiB on
/// `backing` with `wp`, `[prewarm]` settings from `prewarm` (TOML lines).
fn cfg(dir: &Path, cache: &str, backing: &str, wp: &str, prewarm: &str) -> Config {
    let c = ServeConfig::new(cache)
        .cache("flush_rate", "0")
        .section("prewarm", "snapshot_every", "0")
        .section_toml("prewarm", prewarm)
        .vdisk("vm1", backing, &[("size", s("16MiB")), ("write_policy", s(wp))]);
    parse(dir, &c)
}

/// fio's zipf read mix on `vm1` of `r` (the same sequence each time: fixed seed).
fn fio_zipf(r: &Running, ios: u32) {
    let out = tool("fio")
        .args([
            "--name=zipf",
            "--ioengine=nbd",
            &format!("--uri=nbd://{}/vm1", r.tcp.unwrap()),
            "--rw=randread",
            "--random_distribution=zipf:1.1",
            "--randseed=7",
            "--bs=4k",
            "--size=16m",
            &format!("--number_ios={ios}"),
            "--iodepth=4",
            "--output-format=terse",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "fio: {}", String::from_utf8_lossy(&out.stderr));
}

fn hit_ratio(r: &Running) -> f64 {
    let s = r.daemon.stats(0);
    s.hit_blocks as f64 / s.blocks.max(1) as f64
}

/// A source daemon on `backing` that ran the zipf mix and stopped, leaving its snapshot;
/// the snapshot directory.
fn source(dir: &Path, backing: &str) -> PathBuf {
    let r = start(&cfg(dir, "2MiB", backing, "wt", "")).unwrap();
    fio_zipf(&r, 6000);
    r.daemon.shutdown().unwrap();
    let snaps = r.daemon.snapshot_dir();
    drop(r);
    assert_eq!(std::fs::read_dir(&snaps).unwrap().count(), 1, "one snapshot, written at shutdown");
    snaps
}

#[test]
fn a_prewarmed_daemon_hits_more_in_its_first_run_than_a_cold_one() {
    let (a, b, c) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let backing = a.path().join("vm1.img").display().to_string();
    let snaps = source(a.path(), &backing);
    // B: a fresh cache on the same backing store, prewarmed from A's snapshot.
    let pre =
        start(&cfg(b.path(), "2MiB", &backing, "wt", &format!("from = \"{}\"\nrate = \"unlimited\"", snaps.display())))
            .unwrap();
    // (VM I/O during a prewarm: the write test below.) Here the first run starts once the
    // prewarm ended, so a slow machine measures the same thing.
    let p = prewarm_done(&pre);
    fio_zipf(&pre, 1000);
    assert!(p.error.is_none() && p.loaded_blocks > 100, "{p:?}");
    assert_eq!(p.loaded_blocks + p.skipped_blocks, p.planned_blocks, "{p:?}");
    let warm = hit_ratio(&pre);
    let m = pre.daemon.render_metrics();
    assert!(m.contains(&format!("cachevisor_prewarm_loaded_blocks {}", p.loaded_blocks)), "{m}");
    drop(pre); // one cache in front of an image at a time
               // C: the same fresh cache, cold.
    let cold = start(&cfg(c.path(), "2MiB", &backing, "wt", "")).unwrap();
    fio_zipf(&cold, 1000);
    let cold_ratio = hit_ratio(&cold);
    eprintln!("first run: prewarmed {warm:.3}, cold {cold_ratio:.3}");
    assert!(warm > cold_ratio + 0.1, "prewarmed {warm:.3} vs cold {cold_ratio:.3}");
}

/// Reads in nbdkit's log after `from`: (seconds since `from`, bytes).
fn logged_reads(log: &Path, from: &str) -> Vec<(f64, u64)> {
    let text = std::fs::read_to_string(log).unwrap();
    let secs = |stamp: &str| {
        let t = stamp.split(' ').nth(1).unwrap();
        let mut p = t.split(':');
        let (h, m, s): (f64, f64, f64) = (
            p.next().unwrap().parse().unwrap(),
            p.next().unwrap().parse().unwrap(),
            p.next().unwrap().parse().unwrap(),
        );
        h * 3600.0 + m * 60.0 + s
    };
    let t0 = secs(from);
    text.lines()
        .filter(|l| l.contains(" Read id=") && &l[..26] >= from)
        .map(|l| {
            let count = l.split("count=0x").nth(1).unwrap().split(' ').next().unwrap();
            (secs(&l[..26]) - t0, u64::from_str_radix(count, 16).unwrap())
        })
        .collect()
}

#[test]
fn the_prewarm_rate_holds_at_the_backing_store() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("nbdkit.log");
    let (_kit, port) = nbdkit(&["--filter=log"], &[&format!("logfile={}", log.display())]);
    let backing = format!("nbd://127.0.0.1:{port}/");
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // A reads 2 MiB into its cache and stops, leaving its snapshot.
    let r = start(&cfg(a.path(), "4MiB", &backing, "wt", "")).unwrap();
    let (mut c, _) = Client::connect(r.tcp.unwrap(), "vm1");
    for i in 0..32u64 {
        c.read(i * 65536, 65536).unwrap();
    }
    r.daemon.shutdown().unwrap();
    let snaps = r.daemon.snapshot_dir();
    drop(c);
    drop(r);
    std::thread::sleep(Duration::from_millis(50));
    let from = chrono_now();
    // B prewarms it at 1 MiB/s in reads of at most 64 KiB.
    let pre = start(&cfg(
        b.path(),
        "4MiB",
        &backing,
        "wt",
        &format!("from = \"{}\"\nrate = \"1MiB\"\nmax_read = \"64KiB\"", snaps.display()),
    ))
    .unwrap();
    let p = prewarm_done(&pre);
    assert_eq!((p.loaded_blocks, p.error.as_deref()), (512, None), "{p:?}");
    let reads = logged_reads(&log, &from);
    let total: u64 = reads.iter().map(|r| r.1).sum();
    assert_eq!(total, 2 << 20, "the backing saw exactly the prewarm's 2 MiB");
    // Never above 1 MiB/s: any span of reads carries at most one burst (64 KiB) plus
    // the rate times its length (and one read of slack for the log's timestamps).
    for i in 0..reads.len() {
        let mut sum = 0;
        for r in &reads[i..] {
            sum += r.1;
            let allowed = (64 << 10) as f64 + (1 << 20) as f64 * (r.0 - reads[i].0) + (64 << 10) as f64;
            assert!(sum as f64 <= allowed, "{sum} bytes in {:.3} s", r.0 - reads[i].0);
        }
    }
    let span = reads.last().unwrap().0 - reads[0].0;
    assert!(span >= 1.7, "2 MiB at 1 MiB/s took only {span:.2} s");
}

/// The wall clock in nbdkit's log format (`YYYY-MM-DD HH:MM:SS.ffffff`, local time).
fn chrono_now() -> String {
    let o = std::process::Command::new("date").arg("+%Y-%m-%d %H:%M:%S.%6N").output().unwrap();
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}

#[test]
fn a_corrupt_snapshot_is_refused_by_name_and_the_daemon_serves_cold() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let backing = a.path().join("vm1.img").display().to_string();
    let snaps = source(a.path(), &backing);
    let file = std::fs::read_dir(&snaps).unwrap().next().unwrap().unwrap().path();
    let mut bytes = std::fs::read(&file).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0x5a;
    std::fs::write(&file, &bytes).unwrap();
    let r = start(&cfg(b.path(), "2MiB", &backing, "wb", &format!("from = \"{}\"", snaps.display()))).unwrap();
    let p = r.daemon.prewarm_job().progress();
    let e = p.error.clone().unwrap_or_default();
    assert!(!p.running && e.contains(&file.display().to_string()) && e.contains("checksum"), "{p:?}");
    assert_eq!(r.daemon.occupancy(0).0, 0, "nothing loaded");
    // It serves: a write reads back.
    let (mut c, _) = Client::connect(r.tcp.unwrap(), "vm1");
    c.write(8192, &[7u8; 4096], false).unwrap();
    assert_eq!(c.read(8192, 4096).unwrap(), vec![7u8; 4096]);
    // The API's prewarm refuses it the same way (400 naming the file) — checked through
    // the daemon call the API makes.
    let again = r.daemon.start_prewarm(&snaps).unwrap_err();
    assert!(again.error.unwrap_or_default().contains(&file.display().to_string()));
}

#[test]
fn a_write_during_a_prewarm_wins_in_every_write_policy() {
    for wp in ["wb", "wt", "wa", "ro"] {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let backing = a.path().join("vm1.img").display().to_string();
        // A: blocks 0..512 hold version 1 on the backing store and in A's cache.
        let r = start(&cfg(a.path(), "4MiB", &backing, "wt", "")).unwrap();
        let (mut c, _) = Client::connect(r.tcp.unwrap(), "vm1");
        for blk in 0..512u64 {
            c.write(blk * 4096, &[1u8; 4096], false).unwrap();
        }
        c.flush().unwrap();
        r.daemon.shutdown().unwrap();
        let snaps = r.daemon.snapshot_dir();
        drop(c);
        drop(r);
        // B prewarms those 512 blocks slowly (1 MiB/s: 2 s) while a client writes
        // version 2 over every other block, in a scattered order.
        let pre = start(&cfg(
            b.path(),
            "4MiB",
            &backing,
            wp,
            &format!("from = \"{}\"\nrate = \"1MiB\"\nbusy_rate = \"1MiB\"\nmax_read = \"16KiB\"", snaps.display()),
        ))
        .unwrap();
        let (mut c, _) = Client::connect(pre.tcp.unwrap(), "vm1");
        let written: Vec<u64> = (0..256u64).map(|i| (i * 97) % 512).filter(|b| b % 2 == 0).collect();
        for &blk in &written {
            c.write(blk * 4096, &[2u8; 4096], false).unwrap();
        }
        assert!(pre.daemon.prewarm_job().progress().running, "{wp}: the writes raced the prewarm");
        // A snapshot taken mid-prewarm holds the whole prewarm set, not only what is
        // loaded so far: a partial load never shrinks the next snapshot.
        let mid = pre.daemon.take_snapshot().unwrap();
        let s = cachevisor_prewarm::Snapshot::read_from(std::fs::File::open(&mid).unwrap()).unwrap();
        let loaded = pre.daemon.prewarm_job().progress().loaded_blocks;
        assert!(
            loaded < 512 && (0..512).all(|b| s.sets["vm1"].contains(b)),
            "{wp}: {loaded} loaded, snapshot {}",
            s.sets["vm1"].len()
        );
        let p = prewarm_done(&pre);
        assert!(p.error.is_none() && p.loaded_blocks > 0, "{wp}: {p:?}");
        for blk in 0..512u64 {
            let want = if written.contains(&blk) { 2u8 } else { 1u8 };
            assert_eq!(c.read(blk * 4096, 4096).unwrap(), vec![want; 4096], "{wp}: block {blk} after the prewarm");
        }
        // Dirty blocks (write-back) go to the backing store too: it holds version 2.
        pre.daemon.destage_all(None, &mut |_, _| {}).unwrap();
        pre.daemon.shutdown().unwrap();
        drop(c);
        drop(pre);
        let disk = std::fs::read(&backing).unwrap();
        for &blk in &written {
            assert!(
                disk[blk as usize * 4096..][..4096].iter().all(|&x| x == 2),
                "{wp}: block {blk} on the backing store"
            );
        }
    }
}

#[test]
fn the_api_prewarms_one_vdisk_and_refuses_what_it_cannot() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let two = |dir: &Path, backing_dir: &Path| {
        let mut c = ServeConfig::new("4MiB").cache("flush_rate", "0").api_key("token", "0123456789abcdef0123").section(
            "prewarm",
            "snapshot_every",
            "0",
        );
        for vm in ["vm1", "vm2"] {
            c = c.vdisk(vm, &format!("{}/{vm}.img", backing_dir.display()), &[("size", s("16MiB"))]);
        }
        start(&parse(dir, &c)).unwrap()
    };
    // A reads 1 MiB of each vDisk and stops, leaving its snapshot.
    let r = two(a.path(), a.path());
    for name in ["vm1", "vm2"] {
        let (mut c, _) = Client::connect(r.tcp.unwrap(), name);
        c.read(0, 1 << 20).unwrap();
    }
    r.daemon.shutdown().unwrap();
    let snaps = r.daemon.snapshot_dir();
    drop(r);
    let pre = two(b.path(), a.path());
    let (addr, token) = pre.api.clone().unwrap();
    let url = format!("http://{addr}/prewarm");
    let auth = format!("Bearer {token}");
    let body = |vdisk: &str| serde_json::json!({ "from": snaps, "vdisk": vdisk });
    // No token: refused.
    assert!(matches!(ureq::post(&url).send_json(body("vm2")).unwrap_err(), ureq::Error::Status(401, _)));
    // Not JSON, or an unknown field: 400, nothing started.
    for body in ["{\"from\": ", "{\"from\": \"/x\", \"speed\": 3}"] {
        match ureq::post(&url).set("Authorization", &auth).set("Content-Type", "application/json").send_string(body) {
            Err(ureq::Error::Status(400, _)) => {}
            r => panic!("{body}: {r:?}"),
        }
    }
    assert_eq!(pre.daemon.prewarm_job().progress().from, "");
    // A vDisk not served: 400 naming it.
    match ureq::post(&url).set("Authorization", &auth).send_json(body("nope")).unwrap_err() {
        ureq::Error::Status(400, r) => assert!(r.into_string().unwrap().contains("nope")),
        e => panic!("{e}"),
    }
    // vm2 only.
    let r = ureq::post(&url).set("Authorization", &auth).send_json(body("vm2")).unwrap();
    assert_eq!(r.status(), 202);
    let p = prewarm_done(&pre);
    assert_eq!((p.loaded_blocks, p.error), (256, None));
    assert_eq!((pre.daemon.occupancy(0).0, pre.daemon.occupancy(1).0), (0, 256));
    let shown: serde_json::Value = ureq::get(&url).call().unwrap().into_json().unwrap();
    assert_eq!(shown["loaded_blocks"], 256);
}

#[test]
fn snapshots_every_n_requests_and_bad_schedules_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("vm1.img").display().to_string();
    let mut config = cfg(dir.path(), "2MiB", &backing, "wt", "");
    config.prewarm.snapshot_every = "50req".into();
    let r = start(&config).unwrap();
    let (mut c, _) = Client::connect(r.tcp.unwrap(), "vm1");
    let snaps = r.daemon.snapshot_dir();
    let count = || std::fs::read_dir(&snaps).map_or(0, |d| d.count());
    for i in 0..60u64 {
        c.read(i * 4096, 4096).unwrap();
    }
    let t = Instant::now();
    while count() < 1 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(count(), 1, "one snapshot after 60 requests (every 50)");
    for i in 60..110u64 {
        c.read(i * 4096, 4096).unwrap();
    }
    let t = Instant::now();
    while count() < 2 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(count(), 2, "a second after 50 more");
    for bad in ["0req", "xreq", "500ms"] {
        let e = cfg(dir.path(), "2MiB", &backing, "wt", "").prewarm.clone();
        let c = cachevisor_server::config::PrewarmConfig { snapshot_every: bad.into(), ..e };
        let err = c.resolve(4096).unwrap_err();
        assert!(err.starts_with("prewarm.snapshot_every"), "{bad}: {err}");
    }
}

/// a crash in the middle of a prewarm neither loses the prewarm nor shrinks the
/// snapshot history to what was loaded — the next start resumes it from the set it saved,
/// and snapshots taken meanwhile hold the whole set.
#[test]
fn a_prewarm_a_crash_interrupted_resumes_and_its_set_stays_in_the_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("vm1.img").display().to_string();
    let snaps = dir.path().join("from");
    std::fs::create_dir(&snaps).unwrap();
    let mut s = cachevisor_prewarm::Snapshot::new(1, 0, 4096);
    s.sets.insert("vm1".into(), (0..2048u64).collect());
    cachevisor_server::snapshot_files::write(&snaps, &s, 4).unwrap();
    let slow = "rate = \"2MiB\"\nbusy_rate = \"2MiB\"\nmax_read = \"64KiB\"\nsnapshots_kept = 4";
    let c = cfg(dir.path(), "16MiB", &backing, "wt", slow);
    let r = start(&c).unwrap();
    std::sync::Arc::clone(&r.daemon).start_prewarm(&snaps).unwrap();
    let t = Instant::now();
    // Past the first second: a commit (once a second) has journaled some loaded blocks.
    while r.daemon.prewarm_job().progress().loaded_blocks < 768 {
        assert!(t.elapsed() < Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(r); // as a SIGKILL would: no clean stop
    let r = start(&c).unwrap();
    let p = r.daemon.prewarm_job().progress();
    assert!(p.from.contains("prewarm-pending") && p.planned_blocks == 2048, "resumed: {p:?}");
    let path = r.daemon.take_snapshot().unwrap();
    let taken = cachevisor_server::snapshot_files::read_history(path.parent().unwrap(), 1).unwrap();
    assert_eq!(taken[0].sets["vm1"].len(), 2048, "the snapshot holds the whole set, not what was loaded");
    let p = prewarm_done(&r);
    assert!(p.error.is_none() && p.loaded_blocks + p.skipped_blocks == 2048, "{p:?}");
    assert!(p.skipped_blocks > 0, "what the first run loaded (and journaled) is cached: {p:?}");
    assert!(r.daemon.interrupted_prewarm().is_none(), "done: nothing left to resume");
}

/// Three vDisks on one daemon (4 MiB cache, `prewarm` lines added), backing files in
/// `backing_dir`.
fn three(dir: &Path, backing_dir: &Path, prewarm: &str) -> Running {
    let mut c = ServeConfig::new("4MiB")
        .cache("flush_rate", "0")
        .section("prewarm", "snapshot_every", "0")
        .section_toml("prewarm", prewarm);
    for vm in ["hot", "scan", "big"] {
        c = c.vdisk(vm, &format!("{}/{vm}.img", backing_dir.display()), &[("size", s("16MiB"))]);
    }
    start(&parse(dir, &c)).unwrap()
}

/// The source of the online tests: `hot` rereads 64 blocks 40 times (its own traffic
/// re-warms it at once), `scan` reads 512 blocks once (no reuse), `big` reads 256 blocks
/// twice over ≥ 3 s (50% hits; at its block rate it needs about half the span to come
/// back by itself, over a 1 s "minute"). Its snapshot directory.
fn online_source(dir: &Path) -> PathBuf {
    let r = three(dir, dir, "");
    let t = Instant::now();
    let addr = r.tcp.unwrap();
    let (mut hot, _) = Client::connect(addr, "hot");
    for _ in 0..40 {
        hot.read(0, 64 * 4096).unwrap();
    }
    let (mut scan, _) = Client::connect(addr, "scan");
    for b in 0..512u64 {
        scan.read(b * 4096, 4096).unwrap();
    }
    let (mut big, _) = Client::connect(addr, "big");
    for pass in 0..2 {
        for b in 0..256u64 {
            big.read(b * 4096, 4096).unwrap();
        }
        if pass == 0 {
            std::thread::sleep(Duration::from_secs(3).saturating_sub(t.elapsed()));
        }
    }
    r.daemon.shutdown().unwrap();
    let snaps = r.daemon.snapshot_dir();
    drop(r);
    snaps
}

#[test]
fn online_parameters_skip_what_re_warms_itself_or_never_reused_and_pace_the_rest_by_its_traffic() {
    let (a, b, c) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let snaps = online_source(a.path());
    let from = format!("from = \"{}\"\nminute = \"1s\"", snaps.display());
    // Online: only `big` is prewarmed, at 4x its block traffic (over 1 MiB/s).
    let r = three(b.path(), a.path(), &format!("{from}\nonline = true"));
    let p = prewarm_done(&r);
    assert_eq!(p.online, Some(true), "{p:?}");
    assert_eq!(p.online_skipped, ["hot", "scan"], "{p:?}");
    assert_eq!((p.planned_blocks, p.loaded_blocks, p.error.as_deref()), (256, 256, None), "{p:?}");
    let rate = p.rate_bytes.unwrap();
    // `big`'s 768 requests of one block over the source's ≥ 3 s: ≤ 256 blocks/s, × 4.
    assert!(rate > 1 << 20 && rate <= 4 * 256 * 4096, "rate {rate}");
    assert_eq!([0, 1, 2].map(|vm| r.daemon.occupancy(vm).0), [0, 0, 256]);
    drop(r);
    // Off: every vDisk's snapshot blocks, at the configured rate.
    let r = three(c.path(), a.path(), &format!("{from}\nrate = \"unlimited\""));
    let p = prewarm_done(&r);
    assert_eq!((p.online, p.online_skipped.len(), p.rate_bytes), (None, 0, None), "{p:?}");
    assert!(r.daemon.occupancy(0).0 == 64 && r.daemon.occupancy(2).0 == 256, "{p:?}");
}

#[test]
fn protected_prewarmed_blocks_outlive_a_client_s_new_blocks_until_touched() {
    let a = tempfile::tempdir().unwrap();
    let snaps = online_source(a.path());
    let mut hits = Vec::new();
    for protect in ["", "protect = \"1h\""] {
        let d = tempfile::tempdir().unwrap();
        let r = three(d.path(), a.path(), &format!("from = \"{}\"\nrate = \"unlimited\"\n{protect}", snaps.display()));
        let p = prewarm_done(&r);
        assert_eq!(p.protect_ms, (!protect.is_empty()).then_some(3_600_000), "{p:?}");
        let (mut big, _) = Client::connect(r.tcp.unwrap(), "big");
        // 200 new blocks through big's partition (a third of 1,024 slots): 115 evictions.
        for b in 1000..1200u64 {
            big.read(b * 4096, 4096).unwrap();
        }
        let before = r.daemon.stats(2).hit_blocks;
        big.read(0, 256 * 4096).unwrap();
        hits.push(r.daemon.stats(2).hit_blocks - before);
    }
    eprintln!("prewarmed blocks still cached after 200 new ones: unprotected {}, protected {}", hits[0], hits[1]);
    // Protected blocks are passed over for up to 64 victims (`Engine::
    // set_prewarm_protection`); an eviction that finds only protected ones takes one, so
    // a few of the 256 can go: 4 alone here, 23 once in a loaded CI run (not reproduced
    // since; the bound allows half a victim scan). Without protection 115 go.
    assert!(hits[1] >= 224, "protected: the prewarmed blocks stayed ({})", hits[1]);
    assert!(hits[0] + 80 < hits[1], "unprotected: the prewarmed blocks went first ({})", hits[0]);
}

/// A treemap of `bitmaps` 32-bit bitmaps, each 65,536 full run containers (2^32 ids in
/// ~850 KB each), as CRoaring writes run containers.
fn hostile_bitmap(bitmaps: u32) -> Vec<u8> {
    let mut v = u64::from(bitmaps).to_le_bytes().to_vec();
    for high in 0..bitmaps {
        v.extend(high.to_le_bytes());
        v.extend((12347u32 | (65535 << 16)).to_le_bytes());
        v.extend(vec![0xffu8; 65536 / 8]);
        for k in 0..65536u32 {
            v.extend((k as u16).to_le_bytes());
            v.extend(0xffffu16.to_le_bytes());
        }
        v.extend(vec![0u8; 65536 * 4]);
        for _ in 0..65536 {
            v.extend([1u8, 0, 0, 0, 0xff, 0xff]);
        }
    }
    v
}

/// Peak resident memory of this process, bytes.
fn peak_rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let l = s.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[test]
fn a_snapshot_claiming_2_to_the_36_blocks_is_cut_to_the_vdisk_while_it_is_read() {
    // a valid CRC around run containers claiming 13 × 2^32 blocks for a
    // 16 MiB vDisk (the held-out file drove the daemon to 6.6 GB), and a set naming no
    // vDisk here. Read cut at the vDisk's end, the rest never expanded.
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let bitmap = hostile_bitmap(13);
    let claimed = 13u64 << 32;
    let mut s = b"CVPWSNAP".to_vec();
    s.extend(2u32.to_le_bytes());
    s.extend(1u64.to_le_bytes());
    s.extend(100u64.to_le_bytes());
    s.extend(4096u32.to_le_bytes());
    s.extend(2u32.to_le_bytes());
    for name in ["ghost", "vm1"] {
        s.extend((name.len() as u16).to_le_bytes());
        s.extend(name.as_bytes());
        s.extend(claimed.to_le_bytes());
        s.extend((bitmap.len() as u64).to_le_bytes());
        s.extend(&bitmap);
        s.extend([0u8; 32]);
    }
    let crc = crc32fast::hash(&s);
    s.extend(crc.to_le_bytes());
    let snaps = a.path().join("snaps");
    std::fs::create_dir(&snaps).unwrap();
    std::fs::write(snaps.join("snapshot-000000000001.cvsnap"), &s).unwrap();
    let backing = b.path().join("vm1.img").display().to_string();
    let r = start(&cfg(b.path(), "2MiB", &backing, "wt", "")).unwrap();
    let before = peak_rss();
    let p = r.daemon.start_prewarm(&snaps).unwrap();
    let grew = peak_rss().saturating_sub(before);
    assert!(grew < 1 << 30, "reading the snapshot grew the process by {grew} bytes");
    assert_eq!(p.out_of_range_blocks, claimed - 4096, "{p:?}");
    assert!(p.planned_blocks <= 512 && p.planned_blocks > 0, "{p:?}");
    assert_eq!(p.unmatched_sets, vec!["ghost".to_string()], "{p:?}");
    // It serves throughout.
    let (mut c, _) = Client::connect(r.tcp.unwrap(), "vm1");
    c.write(8192, &[7u8; 4096], false).unwrap();
    assert_eq!(c.read(8192, 4096).unwrap(), vec![7u8; 4096]);
}
