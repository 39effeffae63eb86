//! Day-2: replacing the cache SSD under a running daemon. `cachevisor cache
//! detach` writes every dirty block back and lets go of the cache file — no descriptor
//! of anything on the "SSD" stays open, so it can be removed — while a real NBD client
//! (qemu-io) stays connected and its writes go straight to the backing store; `cache
//! attach` brings a new, empty SSD in, puts the metadata directory's files back, and
//! prewarms from the snapshot the detach took. Every byte any client wrote reads back,
//! after the swap and after a SIGKILL and restart on the new SSD.

use cachevisor_testkit as common;

use common::{bin, client_ok, qemu_io_ok, s, Daemon, ServeConfig, SmallFs};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn config(ssd: &str, extra_cache: &str) -> String {
    ServeConfig::new("32MiB")
        .cache("path", format!("{ssd}/cache.img"))
        .cache("flush_rate", "0")
        .section_toml("cache", extra_cache)
        .api()
        .section("prewarm", "snapshot_every", "0")
        .vdisk("vm1", "vm1.img", &[("size", s("16MiB")), ("write_policy", s("wb"))])
        .vdisk("vm2", "vm2.img", &[("size", s("16MiB"))])
        .toml()
}

/// `cachevisor ARGS… --api API --token-file TOKEN`: (exit code, stdout + stderr).
fn cli(a: &str, token: &Path, args: &[&str]) -> (i32, String) {
    let token = ["--token-file".to_string(), token.display().to_string()];
    run(a, &[args, &token.iter().map(String::as_str).collect::<Vec<_>>()].concat())
}

/// `cachevisor ARGS… --api API`.
fn cli_no_token(a: &str, args: &[&str]) -> (i32, String) {
    run(a, args)
}

fn run(api: &str, args: &[&str]) -> (i32, String) {
    let o = Command::new(bin()).args(args).args(["--api", api]).env_remove("CACHEVISOR_API_TOKEN").output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
    )
}

fn cache_state(a: &str, token: &Path) -> serde_json::Value {
    let (code, out) = cli(a, token, &["cache", "status", "--json"]);
    assert_eq!(code, 0, "{out}");
    serde_json::from_str(&out).unwrap()
}

/// The files under `dir` the daemon `pid` holds open.
fn open_under(pid: u32, dir: &Path) -> Vec<PathBuf> {
    let dir = dir.canonicalize().unwrap_or(dir.to_path_buf());
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|p| p.starts_with(&dir))
        .collect()
}

/// `len` bytes of `file` at `at` are all `byte`.
fn holds(file: &Path, at: u64, len: usize, byte: u8) -> bool {
    let mut b = vec![0u8; len];
    std::fs::File::open(file).unwrap().read_exact_at(&mut b, at).unwrap();
    b.iter().all(|&x| x == byte)
}

/// A qemu-io client on `uri` that writes, waits `ms` (the detach runs meanwhile), then
/// reads back and writes and reads again: started, not waited for.
fn client(uri: &str, ms: u64) -> std::process::Child {
    let cmds = [
        "write -P 0x21 8M 1M".to_string(),
        format!("sleep {ms}"),
        "read -P 0x21 8M 1M".into(),
        "write -P 0x22 9M 1M".into(),
        "read -P 0x22 9M 1M".into(),
    ];
    common::client(uri, &cmds)
}

/// Every pattern the test wrote, read back through the daemon at NBD address `nbd`.
fn all_reads_back(nbd: &str) {
    qemu_io_ok(
        &format!("nbd://{nbd}/vm1"),
        &[
            "read -P 0x11 0 4M",
            "read -P 0x21 8M 1M",
            "read -P 0x22 9M 1M",
            "read -P 0x33 12M 1M",
            "read -P 0x44 14M 1M",
        ],
    );
    qemu_io_ok(&format!("nbd://{nbd}/vm2"), &["read -P 0x55 0 2M"]);
}

#[test]
fn the_ssd_is_replaced_under_a_connected_client_and_no_write_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ssd = d.join("ssd");
    std::fs::create_dir(&ssd).unwrap();
    std::fs::write(d.join("c.toml"), config("ssd", "")).unwrap();
    let mut a = Daemon::start(d, "c.toml", &[]).unwrap();
    let api = &a.api.clone().unwrap();
    let token = d.join("token");
    std::fs::copy(ssd.join("cache.img.meta/api-token"), &token).unwrap();

    // vm1 write-back with the flusher off: 4 MiB dirty in the cache; vm2 cached clean.
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x11 0 4M"]);
    qemu_io_ok(&a.uri("vm2"), &["write -P 0x55 0 2M", "read -P 0x55 0 2M"]);
    let before = cache_state(api, &token);
    assert_eq!(before["state"], "attached");
    assert!(before["dirty_blocks"].as_u64().unwrap() >= 512, "{before}");
    assert!(!holds(&d.join("vm1.img"), 0, 4 << 20, 0x11), "dirty: not on the backing store yet");

    // Detach with a client connected and waiting.
    let c = client(&a.uri("vm1"), 3000);
    std::thread::sleep(Duration::from_millis(500));
    let (code, out) = cli(api, &token, &["cache", "detach"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("detached") && out.contains("written back"), "{out}");
    let st = cache_state(api, &token);
    assert_eq!((st["state"].as_str(), st["cached_blocks"].as_u64()), (Some("detached"), Some(0)), "{st}");
    assert!(st["detached"]["written_back"].as_u64().unwrap() >= 1024, "{st}");
    assert_eq!(st["metadata_with_cache"], true, "{st}");
    // Every dirty block is on the backing store, and nothing on the SSD is held open.
    assert!(holds(&d.join("vm1.img"), 0, 4 << 20, 0x11), "written back at the detach");
    assert_eq!(open_under(a.pid, &ssd), Vec::<PathBuf>::new(), "descriptors on the SSD after the detach");
    // The SSD is pulled (its files gone) and a new, empty one mounted in its place.
    std::fs::remove_dir_all(&ssd).unwrap();
    std::fs::create_dir(&ssd).unwrap();

    // Detached: the vDisks pass through; a write lands on the backing store when answered.
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x33 12M 1M", "read -P 0x33 12M 1M", "read -P 0x11 0 4M"]);
    assert!(holds(&d.join("vm1.img"), 12 << 20, 1 << 20, 0x33), "pass-through writes reach the backing store");
    client_ok(c);
    let (code, out) = cli_no_token(api, &["status"]);
    assert_eq!(code, 5, "status while detached: every vDisk passes through: {out}");
    assert!(out.contains("detached"), "{out}");
    let metrics = |api: &str| ureq::get(&format!("http://{api}/metrics")).call().unwrap().into_string().unwrap();
    let m = metrics(api);
    assert!(m.contains("cachevisor_cache_attached 0") && m.contains("cachevisor_cache_size_bytes 33554432"), "{m}");
    // What needs the cache waits for the attach, saying so.
    let (code, out) = cli(api, &token, &["cache", "detach"]);
    assert!(code == 1 && out.contains("detached already"), "{code} {out}");
    let add = ureq::post(&format!("http://{}/vdisks", a.api.as_deref().unwrap()))
        .set("Authorization", &format!("Bearer {}", std::fs::read_to_string(&token).unwrap().trim()))
        .send_json(serde_json::json!({"name": "vm3", "backing": "vm3.img", "size": "1MiB"}));
    let body = match add {
        Err(ureq::Error::Status(409, r)) => r.into_string().unwrap(),
        other => panic!("adding a vDisk while detached: {other:?}"),
    };
    assert!(body.contains("the cache is detached") && body.contains("cache attach"), "{body}");

    // A malformed attach is refused naming the body, and the cache stays out.
    let bad = ureq::post(&format!("http://{api}/cache/attach"))
        .set("Authorization", &format!("Bearer {}", std::fs::read_to_string(&token).unwrap().trim()))
        .send_string(r#"{"prewarm": "yes"}"#);
    match bad {
        Err(ureq::Error::Status(400, r)) => {
            let body = r.into_string().unwrap();
            assert!(body.contains("the body") && body.contains("prewarm"), "{body}");
        }
        other => panic!("a malformed attach: {other:?}"),
    }
    assert_eq!(cache_state(api, &token)["state"], "detached");
    // Attach the new SSD: the metadata directory comes back with the token and the
    // snapshot the detach took, and the cache prewarms from it.
    let (code, out) = cli(api, &token, &["cache", "attach"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("attached") && out.contains("prewarming from"), "{out}");
    assert!(metrics(api).contains("cachevisor_cache_attached 1"));
    let meta = ssd.join("cache.img.meta");
    for f in ["checkpoint", "journal", "api-token", "owner"] {
        assert!(meta.join(f).exists(), "{f} in the new metadata directory");
    }
    assert_eq!(std::fs::read(meta.join("api-token")).unwrap(), std::fs::read(&token).unwrap());
    assert!(std::fs::read_dir(meta.join("snapshots")).unwrap().count() >= 1, "the detach's snapshot came back");
    // The snapshot named vm1's 1,280 blocks and vm2's 512: loaded from the backing
    // stores into the new SSD.
    let t = Instant::now();
    let loaded = loop {
        let n = cache_state(api, &token)["cached_blocks"].as_u64().unwrap();
        if n >= 1792 || t.elapsed() > Duration::from_secs(30) {
            break n;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(loaded >= 1792, "the prewarm loaded the snapshot's blocks into the new SSD: {loaded}");
    assert_eq!(
        std::fs::metadata(ssd.join("cache.img")).unwrap().len(),
        4096 + (32 << 20),
        "its label, then its blocks"
    );
    // Cached again: write-back writes stay dirty in the new cache.
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x44 14M 1M"]);
    assert!(cache_state(api, &token)["dirty_blocks"].as_u64() > Some(0), "write-back again");
    assert!(!holds(&d.join("vm1.img"), 14 << 20, 1 << 20, 0x44), "write-back again");
    all_reads_back(&a.nbd);

    // A crash on the new SSD: the restart recovers the dirty blocks from its metadata.
    a.kill9();
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    assert!(a.log().contains("warm start"), "{}", a.log());
    all_reads_back(&a.nbd);
}

#[test]
fn the_ssd_is_unmounted_while_detached_and_a_crash_then_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The SSD is a tmpfs mounted at ssd/ in a private mount namespace; the metadata
    // directory is on another file system, so it stays open and locked through the swap.
    let mut fs = SmallFs::with_mounts(d, &[("ssd", "48m")]);
    std::fs::write(d.join("c.toml"), config("ssd", "metadata = \"meta\"\n")).unwrap();
    let a = fs.serve("c.toml", &[]).unwrap();
    let (api, token) = (&a.api.clone().unwrap(), d.join("meta/api-token"));
    let (code, out) = cli(api, &token, &["cache", "attach"]);
    assert!(code == 1 && out.contains("only a detached cache"), "{code} {out}");
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x11 0 4M", "write -P 0x21 8M 1M"]);
    qemu_io_ok(&a.uri("vm2"), &["write -P 0x55 0 2M"]);
    let (code, out) = cli(api, &token, &["cache", "detach", "--json"]);
    assert_eq!(code, 0, "{out}");
    let st: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((st["state"].as_str(), st["metadata_with_cache"].as_bool()), (Some("detached"), Some(false)), "{st}");
    // The SSD is pulled: the unmount succeeds only when no descriptor on it is open.
    assert_eq!(fs.run("umount ssd"), 0, "unmounting the detached SSD");
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x22 9M 1M", "read -P 0x11 0 4M"]);
    // The metadata stayed locked: a second daemon on this config is refused.
    let code = fs.run(&format!("'{}' serve --config c.toml > second.out 2>&1", bin()));
    let out = std::fs::read_to_string(d.join("second.out")).unwrap();
    assert!(code == 1 && out.contains("meta is in use"), "a second daemon: {code} {out}");
    let _ = std::fs::remove_file(d.join("ssd/cache.img")); // what it created in the bare directory

    // A new SSD, attached cold; the metadata continues in a new generation.
    assert_eq!(fs.run("mount -t tmpfs -o size=48m tmpfs ssd"), 0);
    let (code, out) = cli(api, &token, &["cache", "attach", "--no-prewarm"]);
    assert!(code == 0 && out.contains("no prewarm"), "{code} {out}");
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x33 12M 1M"]);
    let st = cache_state(api, &token);
    // (write-back ahead may already have cleaned some in the idle time)
    assert!(
        st["cached_blocks"].as_u64() >= Some(256) && st["dirty_blocks"].as_u64() > Some(0),
        "write-back again: {st}"
    );

    // A second swap, and a SIGKILL while detached with the SSD gone: the restart (on a
    // third, empty SSD) finds no block in the metadata, and every byte comes from the
    // backing stores.
    let (code, out) = cli(api, &token, &["cache", "detach"]);
    assert_eq!(code, 0, "{out}");
    assert!(holds(&d.join("vm1.img"), 12 << 20, 1 << 20, 0x33), "written back at the second detach");
    assert_eq!(fs.run("umount ssd"), 0, "unmounting the second SSD");
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x44 14M 1M"]);
    assert!(a.signal("KILL", Duration::from_secs(10)));
    assert_eq!(fs.run("mount -t tmpfs -o size=48m tmpfs ssd"), 0);
    let b = fs.serve("c.toml", &[]).unwrap();
    assert!(!b.log().contains("warm start"), "nothing to recover: {}", b.log());
    all_reads_back(&b.nbd);
    // The metadata directory kept one owner throughout, and the restart took it over.
    assert!(std::fs::read_to_string(d.join("meta/owner")).unwrap().contains(&format!("pid {}", b.pid)));
}
