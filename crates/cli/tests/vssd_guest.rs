//! SymFlex's guest-side cache manager run for real (`cachevisor-guest`) on a
//! vSSD a real daemon serves over NBD, cooperating over the control socket while the
//! operator resizes the vSSD through the API under load — every read checked against what
//! was written — and a guest frozen (SIGSTOP) through a deflate's deadline: the host takes
//! blocks, the guest hears of it when it wakes, and with write-through no byte is lost.

use cachevisor_testkit as common;

use common::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Writes config `file`: a small cache, one vDisk, and the `[vssd]` section `vssd`.
fn write_config(d: &Path, file: &str, vssd: &str) {
    let base = ServeConfig::new("4MiB").api().vdisk("vm1", "vm1.img", &[("size", s("16MiB"))]).toml();
    std::fs::write(d.join(file), format!("{base}{vssd}")).unwrap();
}

fn config(d: &Path, grace: &str) {
    let vssd = format!("[vssd]\nsize = \"32MiB\"\ndeflate_grace = \"{grace}\"\n[[vssd.device]]\nname = \"ssd\"\nmax_size = \"32MiB\"\ninitial_size = \"8MiB\"\n");
    write_config(d, "g.toml", &vssd);
    let f = std::fs::File::create(d.join("origin.img")).unwrap();
    f.set_len(96 << 20).unwrap();
}

fn set_target(d: &Path, api: &str, blocks: u32) {
    let token = std::fs::read_to_string(d.join("cache.img.meta/api-token")).unwrap();
    ureq::post(&format!("http://{api}/vssds/ssd/target"))
        .set("Authorization", &format!("Bearer {token}"))
        .send_json(serde_json::json!({ "blocks": blocks }))
        .unwrap();
}

/// Starts `cachevisor-guest` on the daemon's vSSD with `args`.
fn guest(d: &Path, a: &Daemon, args: &[&str]) -> std::process::Child {
    Command::new(common::bins::guest())
        .current_dir(d)
        .args(["--vssd", &a.uri("ssd"), "--control", "cache.img.meta/ssd.vssd.sock", "--origin", "origin.img"])
        .args(["--verify", "--json-out", "run.json", "--interval", "250ms", "--hot", "0.9:0.25", "--seed", "7"])
        .args(args)
        .stdout(std::fs::File::create(d.join("guest.out")).unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finish(d: &Path, g: std::process::Child) -> serde_json::Value {
    let out = g.wait_with_output().unwrap();
    let stdout = std::fs::read_to_string(d.join("guest.out")).unwrap();
    assert!(out.status.success(), "guest failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    eprintln!("{stdout}");
    serde_json::from_slice(&std::fs::read(d.join("run.json")).unwrap()).unwrap()
}

/// Mean hit ratio of the intervals that ended with `blocks` valid blocks (after the first
/// one of each such run, which is still warming).
fn mean_hit_at(r: &serde_json::Value, blocks: u64) -> f64 {
    let iv = r["intervals"].as_array().unwrap();
    let h: Vec<f64> = iv
        .windows(2)
        .filter(|w| w[0]["valid_blocks"] == blocks && w[1]["valid_blocks"] == blocks)
        .map(|w| w[1]["hit_ratio"].as_f64().unwrap())
        .collect();
    assert!(!h.is_empty(), "no interval at {blocks} blocks: {iv:?}");
    h.iter().sum::<f64>() / h.len() as f64
}

#[test]
fn the_guest_manager_follows_live_resizes_under_load_and_every_read_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    config(d, "10s");
    let a = Daemon::start(d, "g.toml", &[]).unwrap();
    let api = a.api.clone().unwrap();
    let g = guest(d, &a, &["--mode", "write-back", "--write-ratio", "0.3", "--duration", "9s"]);
    // 8 blocks → 28 → 4 → 16, each held ~2 s, while the guest reads and writes.
    for blocks in [28, 4, 16] {
        std::thread::sleep(Duration::from_millis(2200));
        set_target(d, &api, blocks);
    }
    let r = finish(d, g);
    let s = &r["stats"];
    assert!(s["inflated"].as_u64().unwrap() >= 20 + 12, "{s}");
    assert!(s["released"].as_u64().unwrap() >= 24, "{s}");
    assert_eq!((s["forced"].as_u64(), s["lost_dirty"].as_u64()), (Some(0), Some(0)), "{s}");
    assert!(s["writebacks"].as_u64().unwrap() > 0, "dirty blocks went back before their blocks did: {s}");
    assert!(r["verified_reads"].as_u64().unwrap() > 100, "{r}");
    // The cache follows its size: 28 blocks hold most of the hot set, 4 hold little.
    let (big, small) = (mean_hit_at(&r, 28), mean_hit_at(&r, 4));
    assert!(big > small + 0.2, "hit ratio at 28 blocks {big:.3}, at 4 {small:.3}");
    // The host agrees: 16 valid blocks, nothing asked.
    let list: serde_json::Value = ureq::get(&format!("http://{api}/vssds")).call().unwrap().into_json().unwrap();
    assert_eq!((list[0]["valid"].as_u64(), list[0]["asked"].as_u64()), (Some(16), Some(0)), "{list}");
}

#[test]
fn a_frozen_guest_loses_blocks_at_the_deadline_but_no_write_through_data() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    config(d, "300ms");
    let a = Daemon::start(d, "g.toml", &[]).unwrap();
    let api = a.api.clone().unwrap();
    let g = guest(d, &a, &["--mode", "write-through", "--write-ratio", "0.3", "--duration", "6s"]);
    std::thread::sleep(Duration::from_millis(1500));
    let pid = g.id().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    set_target(d, &api, 2);
    // The deadline passes while the guest cannot answer: the host takes 6 blocks.
    let t = Instant::now();
    loop {
        let list: serde_json::Value = ureq::get(&format!("http://{api}/vssds")).call().unwrap().into_json().unwrap();
        if list[0]["valid"] == 2 {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "the host never took the blocks: {list}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    let r = finish(d, g);
    let s = &r["stats"];
    assert_eq!(s["forced"].as_u64(), Some(6), "{s}");
    assert_eq!(s["lost_dirty"].as_u64(), Some(0), "write-through loses nothing: {s}");
    assert!(r["verified_reads"].as_u64().unwrap() > 50, "{r}");
    let last = r["intervals"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["valid_blocks"], 2, "{last}");
    assert!(a.log().contains("forced") || a.log().contains("deadline"), "the host says it took blocks");
}

/// A stand-in guest manager on the control socket: answers every deflate by giving back
/// its highest valid blocks at or above `keep` (the ones fio does not use); counts them.
fn keep_low_blocks(
    sock: &Path,
    keep: u32,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    use cachevisor_guest::Control;
    use cachevisor_vssd::protocol::{Notice, Reply, Request};
    let mut c = Control::open(sock).unwrap();
    std::thread::spawn(move || {
        let mut released = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let Some(Notice::Deflate { blocks, .. }) = c.notice(Duration::from_millis(100)).unwrap() else { continue };
            if blocks == 0 {
                continue;
            }
            let Reply::State { valid, asked, .. } = c.request(&Request::Hello).unwrap() else { panic!("no state") };
            let mut high: Vec<u32> = valid.into_iter().filter(|&x| x >= keep).collect();
            high.truncate(asked as usize);
            let n = high.len() as u64;
            let rep = c.request(&Request::Release { lbns: high }).unwrap();
            assert!(matches!(rep, Reply::Released { .. }), "{rep:?}");
            released += n;
        }
        released
    })
}

/// fio writes and verifies (crc32c) the vSSD's first 8 blocks over NBD while the host
/// deflates it to those 8 and inflates it back to 16, again and again, and qemu-io fills
/// the other 8 between resizes: no byte fio wrote changes, and the blocks that come back
/// read as zeros, never the bytes they held before.
#[test]
fn fio_verify_holds_across_inflates_and_deflates_of_the_blocks_it_does_not_use() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_config(
        d,
        "f.toml",
        "[vssd]\nsize = \"16MiB\"\ndeflate_grace = \"10s\"\n[[vssd.device]]\nname = \"ssd\"\nmax_size = \"16MiB\"\ninitial_size = \"16MiB\"\n",
    );
    let a = Daemon::start(d, "f.toml", &[]).unwrap();
    let api = a.api.clone().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let manager = keep_low_blocks(&d.join("cache.img.meta/ssd.vssd.sock"), 8, stop.clone());
    let mut fio = Command::new("fio")
        .args(["--name=v", "--ioengine=nbd", &format!("--uri={}", a.uri("ssd")), "--rw=randwrite", "--bs=4k"])
        .args(["--iodepth=8", "--size=8M", "--loops=6", "--verify=crc32c", "--verify_backlog=256", "--verify_fatal=1"])
        .args(["--do_verify=1", "--output-format=terse"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fio (apt-get install fio)");
    let list =
        || -> serde_json::Value { ureq::get(&format!("http://{api}/vssds")).call().unwrap().into_json().unwrap() };
    let wait_valid = |n: u64| {
        let t = Instant::now();
        while list()[0]["valid"].as_u64() != Some(n) || list()[0]["coming"].as_u64() != Some(0) {
            assert!(t.elapsed() < Duration::from_secs(20), "never {n} valid: {}", list());
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let mut rounds = 0;
    let fio = loop {
        let ssd = a.uri("ssd");
        qemu_io_ok(&ssd, &["write -P 0x5a 8M 8M"]);
        set_target(d, &api, 8);
        wait_valid(8);
        set_target(d, &api, 16);
        wait_valid(16);
        // The blocks given back and taken again are new: zeros, not 0x5a.
        qemu_io_ok(&ssd, &["read -P 0 8M 8M"]);
        rounds += 1;
        if rounds >= 3 && fio.try_wait().unwrap().is_some() {
            break fio.wait_with_output().unwrap();
        }
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let released = manager.join().unwrap();
    assert!(
        fio.status.success(),
        "fio: {}\n{}",
        String::from_utf8_lossy(&fio.stderr),
        String::from_utf8_lossy(&fio.stdout)
    );
    assert!(rounds >= 3 && released >= 8 * rounds, "{rounds} rounds, {released} blocks given back");
    eprintln!("{rounds} deflate/inflate rounds under fio's verified writes; {released} blocks given back");
}

/// `symflex-weighted` in the daemon: two vSSDs weighted 1:3 split a 16-block region 4:12
/// (the one above its share is asked, and after the deadline the host takes the blocks),
/// and a weight changed through the API moves them to 8:8.
#[test]
fn the_weighted_allocator_sizes_vssds_by_weight_and_follows_a_changed_weight() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_config(
        d,
        "w.toml",
        "[vssd]\nsize = \"16MiB\"\ndeflate_grace = \"200ms\"\nallocator = \"symflex-weighted\"\ninterval = \"100ms\"\n\
         [[vssd.device]]\nname = \"a\"\nmax_size = \"16MiB\"\ninitial_size = \"8MiB\"\nweight = 1.0\n\
         [[vssd.device]]\nname = \"b\"\nmax_size = \"16MiB\"\ninitial_size = \"8MiB\"\nweight = 3.0\n",
    );
    let a = Daemon::start(d, "w.toml", &[]).unwrap();
    let api = a.api.clone().unwrap();
    let valid = || -> Vec<u64> {
        let l: serde_json::Value = ureq::get(&format!("http://{api}/vssds")).call().unwrap().into_json().unwrap();
        l.as_array().unwrap().iter().map(|v| v["valid"].as_u64().unwrap()).collect()
    };
    let wait = |want: [u64; 2]| {
        let t = Instant::now();
        while valid() != want {
            assert!(t.elapsed() < Duration::from_secs(20), "never {want:?}: {:?}", valid());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait([4, 12]);
    let token = std::fs::read_to_string(d.join("cache.img.meta/api-token")).unwrap();
    let post = |body: serde_json::Value| {
        ureq::post(&format!("http://{api}/vssds/b/share"))
            .set("Authorization", &format!("Bearer {token}"))
            .send_json(body)
    };
    assert!(matches!(post(serde_json::json!({ "weight": 0 })), Err(ureq::Error::Status(400, _))));
    post(serde_json::json!({ "weight": 1.0 })).unwrap();
    wait([8, 8]);
    let l: serde_json::Value = ureq::get(&format!("http://{api}/vssds")).call().unwrap().into_json().unwrap();
    assert_eq!((l[1]["allocator"].as_str(), l[1]["weight"].as_f64()), (Some("symflex-weighted"), Some(1.0)), "{l}");
    // Only a persistent vSSD's VM is stopped through the API; nothing changes otherwise.
    let stop = ureq::post(&format!("http://{api}/vssds/a/stop"))
        .set("Authorization", &format!("Bearer {token}"))
        .send_json(serde_json::json!({}));
    match stop {
        Err(ureq::Error::Status(409, r)) => assert!(r.into_string().unwrap().contains("has no P")),
        other => panic!("{other:?}"),
    }
    assert_eq!(valid(), [8, 8]);
}

/// The guest cache served as NBD exports (`cachevisor-guest --serve`): fio writes and
/// verifies (crc32c) through application 0's export while qemu-io writes application 1's
/// and the operator inflates and deflates the vSSD; everything reads back through the
/// cache, and at SIGTERM every dirty block reaches the origin.
#[test]
fn the_guest_cache_served_over_nbd_keeps_fio_and_qemu_io_data_across_resizes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    config(d, "1s");
    std::fs::File::create(d.join("origin.img")).unwrap().set_len(64 << 20).unwrap();
    let a = Daemon::start(d, "g.toml", &[]).unwrap();
    let api = a.api.clone().unwrap();
    let mut g = Command::new(common::bins::guest())
        .current_dir(d)
        .args(["--vssd", &a.uri("ssd"), "--control", "cache.img.meta/ssd.vssd.sock", "--origin", "origin.img"])
        .args(["--mode", "write-back", "--apps", "2", "--shares", "1,3", "--serve", "g.sock"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(g.stdout.take().unwrap());
    let mut banner = String::new();
    while !banner.contains("app1") {
        assert!(std::io::BufRead::read_line(&mut out, &mut banner).unwrap() > 0, "guest ended: {banner}");
    }
    let uri = |app: u32| format!("nbd+unix:///app{app}?socket={}", d.join("g.sock").display());
    assert!(banner.contains(&uri(0)), "{banner}");
    let fio = Command::new("fio")
        .args(["--name=v", "--ioengine=nbd", &format!("--uri={}", uri(0)), "--rw=randwrite", "--bs=4k"])
        .args(["--iodepth=8", "--size=12M", "--loops=2", "--verify=crc32c", "--verify_backlog=256", "--verify_fatal=1"])
        .args(["--do_verify=1", "--output-format=terse"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fio (apt-get install fio)");
    qemu_io_ok(&uri(1), &["write -P 0x7e 0 8M"]);
    for blocks in [32, 4, 16] {
        set_target(d, &api, blocks);
        std::thread::sleep(Duration::from_millis(1500));
        qemu_io_ok(&uri(1), &["read -P 0x7e 0 8M"]);
    }
    let fio = fio.wait_with_output().unwrap();
    assert!(
        fio.status.success(),
        "fio: {}\n{}",
        String::from_utf8_lossy(&fio.stderr),
        String::from_utf8_lossy(&fio.stdout)
    );
    // A request past an export's end is refused by the NBD layer, and nothing changes.
    let (ok, _) = qemu_io(&uri(1), &["write -P 0x11 32M 4k"]);
    assert!(!ok, "a write past app1's 32 MiB was accepted");
    nix_kill(g.id(), "TERM");
    let status = g.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(status.success(), "guest: {status}\n{rest}");
    assert!(rest.contains("stopped: inflated"), "{rest}");
    // Application 1's slice starts at 32 MiB of the origin: its writes are there.
    let origin = std::fs::read(d.join("origin.img")).unwrap();
    assert!(
        origin[32 << 20..(32 << 20) + (8 << 20)].iter().all(|&b| b == 0x7e),
        "app1's data did not reach the origin"
    );
    eprintln!("{rest}");
}

/// Sends signal `sig` (a name kill(1) takes) to `pid`.
fn nix_kill(pid: u32, sig: &str) {
    assert!(Command::new("kill").args([&format!("-{sig}"), &pid.to_string()]).status().unwrap().success());
}

/// SymFlex §4.2 for real: the slab key-value store (`cachevisor-guest --kv`) on a vSSD
/// the operator grows and shrinks under a cache-aside client whose every get is checked;
/// slabs follow the vSSD's size and the hit ratio with it.
#[test]
fn the_slab_key_value_store_follows_resizes_and_never_returns_a_wrong_value() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    config(d, "1s");
    let a = Daemon::start(d, "g.toml", &[]).unwrap();
    let api = a.api.clone().unwrap();
    let g = Command::new(common::bins::guest())
        .current_dir(d)
        .args(["--vssd", &a.uri("ssd"), "--control", "cache.img.meta/ssd.vssd.sock", "--kv", "256"])
        .args(["--io-size", "60KiB", "--write-ratio", "0.1", "--verify", "--duration", "9s", "--interval", "500ms"])
        .args(["--hot", "0.9:0.3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for blocks in [32, 2, 16] {
        std::thread::sleep(Duration::from_millis(2500));
        set_target(d, &api, blocks);
    }
    let out = g.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "guest --kv failed: {}\n{text}", String::from_utf8_lossy(&out.stderr));
    eprintln!("{text}");
    assert!(text.contains("values verified") && !text.contains(" 0 values verified"), "{text}");
    // Rows: time, hit, ops/s, slabs, items. The store held 32 slabs, then 2, then 16.
    let rows: Vec<(f64, u64)> = text
        .lines()
        .filter(|l| l.trim_start().chars().next().is_some_and(|c| c.is_ascii_digit()) && l.contains('s'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((f.get(1)?.parse().ok()?, f.get(3)?.parse().ok()?))
        })
        .collect();
    // The median of the intervals that ended at a size (the first of each still has the
    // size before in it).
    let hit_at = |slabs: u64| -> f64 {
        let mut h: Vec<f64> = rows.iter().filter(|r| r.1 == slabs).map(|r| r.0).collect();
        assert!(!h.is_empty(), "never {slabs} slabs: {rows:?}");
        h.sort_by(f64::total_cmp);
        h[h.len() / 2]
    };
    assert!(hit_at(32) > hit_at(2) + 0.2, "32 slabs should hit far more than 2: {rows:?}");
    let summary = text.lines().last().unwrap();
    assert!(summary.contains("gave back 30") || summary.contains("taken by the host"), "{summary}");
}
