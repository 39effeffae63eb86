//! Data safety against an operator's ordinary mistakes and full disks, each reproduced with
//! the real daemon process and checked with a real NBD client (qemu-io patterns): a second
//! daemon on a running daemon's cache, a backing image swapped under dirty blocks, two
//! vDisks on one image, typos in paths and sizes, a backing store that fills up, and
//! SIGKILLs in the middle of a vSSD's resizes.

use cachevisor_testkit as common;
use common::*;
use std::path::Path;
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// A write-back config: a cache of `cache`, one vDisk `vm1` on `backing` with `size`.
fn wb_config(dir: &Path, name: &str, cache: &str, backing: &str, size: Option<&str>, extra: &str) {
    let mut keys = vec![("write_policy", s("wb"))];
    if let Some(size) = size {
        keys.insert(0, ("size", s(size)));
    }
    ServeConfig::new(cache)
        .no_writeback()
        .section_toml("cache", extra)
        .api()
        .vdisk("vm1", backing, &keys)
        .write(dir, name);
}

/// A write-back vm1 (32 MiB over a 16 MiB cache) with the `[vssd]` section `vssd` after it.
fn vssd_config(dir: &Path, name: &str, vssd: &str) {
    wb_config(dir, name, "16MiB", "vm1.img", Some("32MiB"), "");
    let cfg = std::fs::read_to_string(dir.join(name)).unwrap() + vssd;
    std::fs::write(dir.join(name), cfg).unwrap();
}

fn file_is(path: &Path, byte: u8, len: u64) -> bool {
    let b = std::fs::read(path).unwrap();
    b.len() as u64 >= len && b[..len as usize].iter().all(|&x| x == byte)
}

#[test]
fn a_second_daemon_on_a_running_cache_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    wb_config(d, "a.toml", "64MiB", "vm1.img", Some("64MiB"), "");
    let mut a = Daemon::start(d, "a.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x11 0 4M", "flush"]);
    let meta = d.join("cache.img.meta");
    let token = std::fs::read_to_string(meta.join("api-token")).unwrap();
    let snapshot =
        |p: &Path| (std::fs::read(p).unwrap(), std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap()));
    let (journal, checkpoint) = (snapshot(&meta.join("journal")), snapshot(&meta.join("checkpoint")));
    // The same config again: refused at once, naming the running owner.
    let e = Daemon::start(d, "a.toml", &[]).err().expect("a second daemon on the same cache must not start");
    assert!(e.status.is_some_and(|s| !s.success()), "{e:?}");
    assert!(e.output.contains("in use") && e.output.contains(&format!("pid {}", a.pid)), "{}", e.output);
    // Logs written to a file carry no colour codes.
    assert!(!a.log().contains('\x1b') && !e.output.contains('\x1b'), "{}", a.log());
    // Another config on the same cache file (its own metadata directory), and another cache
    // file with the same metadata directory: refused too, and nothing of theirs created.
    wb_config(d, "b.toml", "64MiB", "b.img", Some("64MiB"), "metadata = \"b.meta\"\n");
    let e = Daemon::start(d, "b.toml", &[]).err().expect("two daemons on one cache file");
    assert!(e.output.contains("cache.img is in use"), "{}", e.output);
    assert!(!d.join("b.meta").exists() && !d.join("b.img").exists());
    std::fs::write(
        d.join("c.toml"),
        std::fs::read_to_string(d.join("a.toml"))
            .unwrap()
            .replace("path = \"cache.img\"", "path = \"c.img\"\nmetadata = \"cache.img.meta\"")
            .replace("vm1.img", "c-vm1.img"),
    )
    .unwrap();
    let e = Daemon::start(d, "c.toml", &[]).err().expect("two daemons on one metadata directory");
    assert!(e.output.contains("cache.img.meta is in use"), "{}", e.output);
    // The running daemon's files are untouched: same journal (not replaced), checkpoint, token.
    assert_eq!(snapshot(&meta.join("journal")), journal);
    assert_eq!(snapshot(&meta.join("checkpoint")), checkpoint);
    assert_eq!(std::fs::read_to_string(meta.join("api-token")).unwrap(), token);
    // ... and it goes on: 20 MiB more, flushed, survive a SIGKILL and restart.
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x22 4M 20M", "flush"]);
    a.kill9();
    // The dead owner's note is left behind; it does not block the restart.
    assert!(std::fs::read_to_string(meta.join("owner")).unwrap().contains(&format!("pid {}", a.pid)));
    let a = Daemon::start(d, "a.toml", &[]).unwrap();
    assert!(a.banner.iter().any(|l| l.starts_with("# warm start: 6144 blocks cached (6144 dirty)")), "{:?}", a.banner);
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x11 0 4M", "read -P 0x22 4M 20M"]);
    let (ok, out) = destage(a.api.as_deref().unwrap(), &meta.join("api-token"));
    assert!(ok && out.contains("destaged 6144 blocks"), "{out}");
    assert!(file_is(&d.join("vm1.img"), 0x11, 4 * MIB));
}

#[test]
fn dirty_blocks_never_go_to_another_backing_image() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("other.img"), vec![0x44u8; 16 * MIB as usize]).unwrap();
    wb_config(d, "vm1.toml", "32MiB", "vm1.img", Some("16MiB"), "");
    wb_config(d, "other.toml", "32MiB", "other.img", None, "");
    let mut a = Daemon::start(d, "vm1.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x33 0 1M", "flush"]);
    assert!(a.term(Duration::from_secs(20)).is_some_and(|s| s.success()), "{}", a.log());
    // Only `backing` changed: refused, saying what to do; neither image is touched.
    let e =
        Daemon::start(d, "other.toml", &[]).err().expect("dirty blocks of vm1.img must not be served for other.img");
    assert!(e.status.is_some_and(|s| !s.success()), "{e:?}");
    assert!(
        e.output.contains("256 dirty cached blocks")
            && e.output.contains("--discard-dirty vm1")
            && e.output.contains("Point `backing` back"),
        "{}",
        e.output
    );
    assert!(file_is(&d.join("other.img"), 0x44, 16 * MIB) && file_is(&d.join("vm1.img"), 0, 16 * MIB));
    // The image deleted (the config would create it): refused, and not created.
    std::fs::rename(d.join("vm1.img"), d.join("vm1.img.away")).unwrap();
    let e = Daemon::start(d, "vm1.toml", &[]).err().expect("the bound image is gone");
    assert!(e.output.contains("does not exist") && e.output.contains("dirty"), "{}", e.output);
    assert!(!d.join("vm1.img").exists());
    std::fs::rename(d.join("vm1.img.away"), d.join("vm1.img")).unwrap();
    // Pointed back: warm, the data intact, destaged into its own image.
    let mut a = Daemon::start(d, "vm1.toml", &[]).unwrap();
    assert!(a.banner.iter().any(|l| l.contains("256 blocks cached (256 dirty)")), "{:?}", a.banner);
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x33 0 1M"]);
    let (ok, out) = destage(a.api.as_deref().unwrap(), &d.join("cache.img.meta/api-token"));
    assert!(ok, "{out}");
    assert!(file_is(&d.join("vm1.img"), 0x33, MIB));
    assert!(a.term(Duration::from_secs(20)).is_some_and(|s| s.success()));
    // Clean blocks only: the start goes on and drops them; reads see other.img, not vm1's data.
    let mut b = Daemon::start(d, "other.toml", &[]).unwrap();
    assert!(b.log().contains("dropped the vDisk's clean cached blocks"), "{}", b.log());
    qemu_io_ok(&b.uri("vm1"), &["read -P 0x44 0 1M"]);
    // Dirty data bound to other.img, then pointed at vm1.img with --discard-dirty: dropped
    // deliberately, logged, and vm1.img keeps its own data.
    qemu_io_ok(&b.uri("vm1"), &["write -P 0x55 0 1M", "flush"]);
    b.kill9();
    assert!(Daemon::start(d, "vm1.toml", &[]).is_err());
    let a = Daemon::start(d, "vm1.toml", &["--discard-dirty", "vm1", "--discard-dirty", "vm9"]).unwrap();
    assert!(a.log().contains("--discard-dirty") && a.log().contains("dirty ones included"), "{}", a.log());
    // A name the cache does not know (a typo) is said, not silently ignored.
    assert!(
        a.log().contains("--discard-dirty names a vDisk the cache does not know") && a.log().contains("vm9"),
        "{}",
        a.log()
    );
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x33 0 1M"]);
    assert!(file_is(&d.join("vm1.img"), 0x33, MIB) && file_is(&d.join("other.img"), 0x44, 16 * MIB));
}

#[test]
fn two_vdisks_on_one_backing_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("a.img"), vec![0u8; 4 * MIB as usize]).unwrap();
    std::fs::hard_link(d.join("a.img"), d.join("link.img")).unwrap();
    let two = |second: &str| ServeConfig::new("8MiB").api().vdisk("vm1", "a.img", &[]).vdisk("vm2", second, &[]).toml();
    for second in ["a.img", "./a.img", "link.img"] {
        std::fs::write(d.join("two.toml"), two(second)).unwrap();
        let e = Daemon::start(d, "two.toml", &[]).err().unwrap_or_else(|| panic!("vm2 on {second} must be refused"));
        assert!(
            e.output.contains("vdisk[1] (vm2).backing") && e.output.contains("also the backing of vdisk[0] (vm1)"),
            "{second}: {}",
            e.output
        );
    }
    // Added through the API onto a served vDisk's image: 409, nothing added.
    wb_config(d, "one.toml", "8MiB", "a.img", None, "");
    let a = Daemon::start(d, "one.toml", &[]).unwrap();
    let token = std::fs::read_to_string(d.join("cache.img.meta/api-token")).unwrap();
    let r = ureq::post(&format!("http://{}/vdisks", a.api.as_deref().unwrap()))
        .set("Authorization", &format!("Bearer {token}"))
        .send_json(serde_json::json!({"name": "vm2", "backing": d.join("link.img")}));
    match r {
        Err(ureq::Error::Status(409, resp)) => {
            assert!(resp.into_string().unwrap().contains("already the backing of vDisk `vm1`"))
        }
        other => panic!("{other:?}"),
    }
    // Another daemon (its own cache) on the same image: refused while the first runs.
    std::fs::write(
        d.join("second.toml"),
        std::fs::read_to_string(d.join("one.toml")).unwrap().replace("cache.img", "second.img"),
    )
    .unwrap();
    let e = Daemon::start(d, "second.toml", &[]).err().expect("two caches in front of one image");
    assert!(e.output.contains("a.img is in use by another cachevisor"), "{}", e.output);
}

#[test]
fn typos_in_paths_and_sizes_are_errors_not_actions() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Paths under a directory that does not exist: named, and not created.
    let cfg = |cache: &str, backing: &str, size: &str, extra: &str| {
        let c = ServeConfig::new("8MiB").cache("path", cache).vdisk("vm1", backing, &[("size", s(size))]);
        format!("{}{extra}", c.toml())
    };
    std::fs::write(d.join("t.toml"), cfg("typo/cache.img", "vm1.img", "16MiB", "")).unwrap();
    let e = Daemon::start(d, "t.toml", &[]).err().unwrap();
    assert!(e.output.contains("typo") && e.output.contains("does not exist"), "{}", e.output);
    std::fs::write(d.join("t.toml"), cfg("cache.img", "typo/vm1.img", "16MiB", "")).unwrap();
    let e = Daemon::start(d, "t.toml", &[]).err().unwrap();
    assert!(e.output.contains("typo/vm1.img") && e.output.contains("does not exist"), "{}", e.output);
    assert!(!d.join("typo").exists());
    // A size that differs from the existing backing file: an error, unless `grow = true`.
    std::fs::write(d.join("vm1.img"), vec![7u8; 16 * MIB as usize]).unwrap();
    std::fs::write(d.join("t.toml"), cfg("cache.img", "vm1.img", "32MiB", "")).unwrap();
    let e = Daemon::start(d, "t.toml", &[]).err().unwrap();
    assert!(e.output.contains("vdisk[0] (vm1).size") && e.output.contains("grow = true"), "{}", e.output);
    std::fs::write(d.join("t.toml"), cfg("cache.img", "vm1.img", "8MiB", "")).unwrap();
    let e = Daemon::start(d, "t.toml", &[]).err().unwrap();
    assert!(e.output.contains("never shrinks"), "{}", e.output);
    assert_eq!(std::fs::metadata(d.join("vm1.img")).unwrap().len(), 16 * MIB);
    std::fs::write(d.join("t.toml"), cfg("cache.img", "vm1.img", "32MiB", "grow = true\n")).unwrap();
    let a = Daemon::start(d, "t.toml", &[]).unwrap();
    assert!(a.log().contains("grew the backing file"), "{}", a.log());
    assert_eq!(std::fs::metadata(d.join("vm1.img")).unwrap().len(), 32 * MIB);
    qemu_io_ok(&a.uri("vm1"), &["read -P 7 0 16M", "read -P 0 16M 16M"]);
    drop(a);
    // The cache store is preallocated: a file system without room for it fails the start.
    let mut fs = SmallFs::new(&d.join("small"), "8m");
    std::fs::write(
        d.join("small/big.toml"),
        cfg("fs/cache.img", "fs/vm1.img", "64MiB", "").replace("size = \"8MiB\"", "size = \"16MiB\""),
    )
    .unwrap();
    let e = fs.serve("big.toml", &[]).err().expect("a 16 MiB cache on an 8 MiB file system");
    assert!(
        e.output.contains("fs/cache.img") && e.output.contains("cannot reserve") && e.output.contains("No space left"),
        "{}",
        e.output
    );
    // A sparse backing on a full file system: the client gets ENOSPC, not EIO.
    std::fs::write(
        d.join("small/wt.toml"),
        cfg("fs/cache.img", "fs/vm1.img", "64MiB", "write_policy = \"wt\"\n")
            .replace("size = \"8MiB\"", "size = \"1MiB\""),
    )
    .unwrap();
    let a = fs.serve("wt.toml", &[]).unwrap();
    let (ok, out) = qemu_io(&a.uri("vm1"), &["write -P 1 0 16M"]);
    assert!(!ok && out.contains("No space left on device"), "{out}");
}

/// vm1's row of `GET /vdisks`: (cached blocks, dirty blocks, in pass-through).
fn vdisk_state(api: &str) -> (u64, u64, bool) {
    let v: serde_json::Value = ureq::get(&format!("http://{api}/vdisks")).call().unwrap().into_json().unwrap();
    let r = &v[0];
    (
        r["used_blocks"].as_u64().unwrap(),
        r["dirty_blocks"].as_u64().unwrap(),
        r["stats"]["passthrough"].as_bool().unwrap(),
    )
}

/// How the cache and the backing store share file systems in [`full_backing_store`].
struct Layout {
    mounts: &'static [(&'static str, &'static str)],
    cache: &'static str,
    backing: &'static str,
    /// Shell commands: leave about 3 MiB for the backing store; make room for everything;
    /// fill it up again; make room again.
    fill: &'static str,
    free: &'static str,
    refill: &'static str,
    free_again: &'static str,
    /// Writes fail once it is full again, whatever they evict (the journal is on it too).
    full_fails_every_write: bool,
}

/// The cache and its metadata on one file system, the backing store on another that fills
/// up (an SSD in front of a full disk): write-backs and evictions fail, the journal works.
#[test]
fn a_full_backing_store_loses_no_acknowledged_write() {
    full_backing_store(Layout {
        mounts: &[("ssd", "40m"), ("hdd", "3m")],
        cache: "ssd/cache.img",
        backing: "hdd/vm1.img",
        fill: "true",
        free: "mount -o remount,size=128m hdd",
        refill: "dd if=/dev/zero of=hdd/filler bs=1M 2>/dev/null; true",
        free_again: "rm hdd/filler",
        full_fails_every_write: false,
    });
}

/// Cache, metadata and backing store on one small file system that fills up: the journal
/// cannot grow either, so writes and flushes fail with ENOSPC while reads go on.
#[test]
fn a_full_shared_file_system_loses_no_acknowledged_write() {
    full_backing_store(Layout {
        mounts: &[("fs", "96m")],
        cache: "fs/cache.img",
        backing: "fs/vm1.img",
        fill: "dd if=/dev/zero of=fs/filler bs=1M count=61 2>/dev/null",
        free: "rm fs/filler",
        refill: "dd if=/dev/zero of=fs/filler bs=1M 2>/dev/null; true",
        free_again: "rm fs/filler",
        full_fails_every_write: true,
    });
}

fn full_backing_store(l: Layout) {
    let dir = tempfile::tempdir().unwrap();
    let mut fs = SmallFs::with_mounts(dir.path(), l.mounts);
    ServeConfig::new("32MiB")
        .cache("path", l.cache)
        .cache("flush_rate", "0")
        .cache("error_threshold", 1)
        .cache("interval", "200ms")
        .api_key("token", "full-disk-test-token")
        .vdisk("vm1", l.backing, &[("size", s("64MiB")), ("write_policy", s("wb"))])
        .write(dir.path(), "full.toml");
    let token = "full-disk-test-token";
    let a = fs.serve("full.toml", &[]).unwrap();
    let api = a.api.clone().unwrap();
    // About 3 MiB left for the backing store.
    assert_eq!(fs.run(l.fill), 0);
    // Per 1 MiB chunk, the pattern acknowledged (and flushed) last.
    let mut truth: Vec<Option<u8>> = vec![None; 64];
    let write = |uri: &str, chunk: usize, p: u8| qemu_io(uri, &[&format!("write -P {p} {chunk}M 1M"), "flush"]);
    // Writes chunk `c` with its own pattern; acknowledged, it is the chunk's truth, else
    // the client was told the disk is full. Returns whether it was acknowledged.
    let attempt = |uri: &str, c: usize, truth: &mut [Option<u8>]| {
        let (ok, out) = write(uri, c, 0x40 + c as u8);
        if ok {
            truth[c] = Some(0x40 + c as u8);
        } else {
            assert!(out.contains("No space left on device"), "chunk {c}: {out}");
        }
        ok
    };
    for (c, t) in truth.iter_mut().enumerate().take(16) {
        qemu_io_ok(&a.uri("vm1"), &[&format!("write -P {} {c}M 1M", 0x10 + c), "flush"]);
        *t = Some(0x10 + c as u8);
    }
    let check = |uri: &str, truth: &[Option<u8>], when: &str| {
        for (c, p) in truth.iter().enumerate() {
            if let Some(p) = p {
                let (ok, out) = qemu_io(uri, &[&format!("read -P {p} {c}M 1M")]);
                assert!(
                    ok,
                    "{when}: chunk {c} should read {p:#x}:\n{out}\n{}",
                    std::fs::read_dir(dir.path())
                        .unwrap()
                        .filter_map(Result::ok)
                        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
                        .map(|e| std::fs::read_to_string(e.path()).unwrap())
                        .collect::<String>()
                );
            }
        }
    };
    // Destaging into the full backing fails part-way; nothing leaves the cache unwritten.
    let (ok, out) = cachevisor(&["destage", "--api", &api, "--token", token]);
    assert!(!ok && out.contains("No space left"), "{out}");
    let (used, dirty, _) = vdisk_state(&api);
    assert!(dirty >= 3000 && used == 4096, "cached {used}, dirty {dirty}");
    check(&a.uri("vm1"), &truth, "after a failed destage");
    // More than the cache holds: evictions must write back and cannot; those writes fail
    // with ENOSPC and past the threshold the vDisk passes through.
    let mut failed = 0;
    for c in 16..40 {
        if !attempt(&a.uri("vm1"), c, &mut truth) {
            failed += 1;
        }
    }
    let (used, dirty, passthrough) = vdisk_state(&api);
    eprintln!("{failed} of 24 writes failed with ENOSPC; in pass-through with {used} blocks cached, {dirty} dirty");
    assert!(failed >= 1 && passthrough, "{failed} failed writes, pass-through {passthrough}");
    assert!(dirty > 0 && used >= dirty, "pass-through keeps the dirty blocks: cached {used}, dirty {dirty}");
    check(&a.uri("vm1"), &truth, "in pass-through on a full disk");
    // Space freed: a chunk rewritten in pass-through and flushed wins over its older dirty
    // copy in the cache, across a SIGKILL and restart.
    assert_eq!(fs.run(l.free), 0);
    let (ok, out) = write(&a.uri("vm1"), 0, 0xee);
    assert!(ok, "{out}");
    truth[0] = Some(0xee);
    check(&a.uri("vm1"), &truth, "after the rewrite");
    assert!(a.signal("KILL", Duration::from_secs(10)));
    fs.run("wait");
    let a = fs.serve("full.toml", &[]).unwrap();
    assert!(a.banner.iter().any(|l| l.starts_with("# warm start")), "{:?}", a.banner);
    check(&a.uri("vm1"), &truth, "after SIGKILL and restart");
    // Full again: writes fail (on the shared file system all of them: the vDisk passes
    // through again and its own writes wait on the full store; with the backing store
    // alone full, those whose victims' blocks the store already holds succeed), and
    // SIGTERM still ends the process: it does not hang.
    assert_eq!(fs.run(l.refill), 0);
    let mut after = 0;
    for c in 40..64 {
        attempt(&a.uri("vm1"), c, &mut truth);
        if vdisk_state(a.api.as_deref().unwrap()).2 {
            after += 1;
            if after == 3 {
                break;
            }
        }
    }
    if l.full_fails_every_write {
        assert_eq!(
            after,
            3,
            "in pass-through again, with writes waiting on the full backing store: {:?}",
            &truth[40..64]
        );
    }
    check(&a.uri("vm1"), &truth, "full again");
    if l.full_fails_every_write {
        // Idle on a full metadata file system: failed commits are retried after pauses
        // (at most 1 s), not in a loop — a few in 3 s, and the log says it once per streak
        // (~16,000 lines per 3 s before).
        let api = a.api.as_deref().unwrap();
        let before = metric(api, "cachevisor_commit_failures_total");
        std::thread::sleep(Duration::from_secs(3));
        let during = metric(api, "cachevisor_commit_failures_total") - before;
        let lines = a.log().matches("commit failed").count();
        assert!(during <= 10 && lines <= 20, "{during} failed commits in 3 s idle, {lines} log lines");
    }
    // (Nothing waits long here: the stop takes well under a second; 20 s is far below the
    // 30 s a stuck backing write would be given.)
    assert!(a.signal("TERM", Duration::from_secs(20)), "SIGTERM did not stop the daemon:\n{}", a.log());
    let code = fs.run(&format!("wait {}", a.pid));
    if l.full_fails_every_write {
        // No room for the stop's checkpoint: it says so and exits non-zero; the journal
        // (cut back to whole records) still has everything flushed.
        assert!(code != 0 && a.log().contains("clean stop"), "exit {code}:\n{}", a.log());
    } else {
        assert_eq!(code, 0, "{}", a.log());
    }
    assert_eq!(fs.run(l.free_again), 0);
    let a = fs.serve("full.toml", &[]).unwrap();
    check(&a.uri("vm1"), &truth, "after SIGTERM on a full disk and restart");
    let (ok, out) = cachevisor(&["destage", "--api", a.api.as_deref().unwrap(), "--token", token]);
    assert!(ok, "{out}");
    assert_eq!(vdisk_state(a.api.as_deref().unwrap()).1, 0);
    check(&a.uri("vm1"), &truth, "after destaging");
    assert!(a.signal("TERM", Duration::from_secs(20)));
    assert_eq!(fs.run(&format!("wait {}", a.pid)), 0, "a clean stop exits 0");
}

/// The daemon's `/metrics` value of `series` (name and labels; a plain HTTP GET on the API
/// address).
fn metric(api: &str, series: &str) -> u64 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(api).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {api}\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no {series} in /metrics:\n{body}"))
}

/// A cache file whose writes fail in the kernel while the daemon runs, through io_uring:
/// the upper half of a preallocated O_DIRECT cache file on a tmpfs has its pages given
/// back (a hole punched) and the file system is filled, so every write there fails with
/// ENOSPC as a worn-out SSD's writes fail, while the lower half (dirty data) still works.
/// Cache fills of read misses run on the io_uring thread; they fail there, the reads are
/// answered from the backing store, past the threshold the vDisk passes through (its dirty
/// blocks drained to the backing store from the lower half), and every
/// acknowledged byte reads back, before and after a SIGKILL and restart (refused while the
/// file system is full, warm once there is room).
#[test]
fn cache_writes_failing_under_io_uring_lose_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut fs = SmallFs::new(d, "20m");
    // The backing store outside the small file system, its chunks 8..32 (1 MiB each)
    // holding data the cache has not seen.
    let mut image = vec![0u8; 32 * MIB as usize];
    for c in 8..32 {
        image[c * MIB as usize..(c + 1) * MIB as usize].fill(0x80 + c as u8);
    }
    std::fs::write(d.join("vm1.img"), &image).unwrap();
    let token = "ring-fault-test-token";
    ServeConfig::new("16MiB")
        .cache("path", "fs/cache.img")
        .cache("metadata", "cache.meta")
        .cache("direct", "on")
        .cache("io_uring", true)
        .cache("flush_rate", "0")
        .cache("writeback_ahead", 0)
        .cache("error_threshold", 4)
        .cache("interval", "200ms")
        .api_key("token", token)
        .vdisk("vm1", "vm1.img", &[("write_policy", s("wb"))])
        .write(d, "ring.toml");
    let a = fs.serve("ring.toml", &[]).unwrap();
    let api = a.api.clone().unwrap();
    assert_eq!(metric(&api, "cachevisor_cache_io_uring "), 1, "{}", a.log());
    // Chunks 0..4 written back into the lower half of the cache (dirty), the truth.
    let mut truth: Vec<u8> = (0..32).map(|c| if c >= 8 { 0x80 + c as u8 } else { 0 }).collect();
    for (c, t) in truth.iter_mut().enumerate().take(4) {
        *t = 0x10 + c as u8;
        qemu_io_ok(&a.uri("vm1"), &[&format!("write -P {t} {c}M 1M"), "flush"]);
    }
    let (used, dirty, _) = vdisk_state(&api);
    assert_eq!((used, dirty), (1024, 1024));
    // The upper half's pages given back and the file system filled: writes there fail.
    assert_eq!(fs.run("fallocate -p -o 8M -l 16M fs/cache.img"), 0);
    assert_eq!(fs.run("dd if=/dev/zero of=fs/filler bs=1M 2>/dev/null; true"), 0);
    let failed_before = metric(&api, "cachevisor_cache_io_uring_calls_total{outcome=\"failed\"}");
    // Read misses: their fills go to the cache file through io_uring, the first 4 MiB
    // into the lower half, the rest into holes on a full file system.
    let check = |uri: &str, truth: &[u8], when: &str| {
        for (c, p) in truth.iter().enumerate() {
            let (ok, out) = qemu_io(uri, &[&format!("read -P {p} {c}M 1M")]);
            assert!(ok, "{when}: chunk {c} should read {p:#x}:\n{out}");
        }
    };
    check(&a.uri("vm1"), &truth, "reads while the cache's writes fail");
    check(&a.uri("vm1"), &truth, "the same reads again (hits where a fill succeeded)");
    let failed = metric(&api, "cachevisor_cache_io_uring_calls_total{outcome=\"failed\"}") - failed_before;
    let ok = metric(&api, "cachevisor_cache_io_uring_calls_total{outcome=\"ok\"}");
    let (used, dirty, passthrough) = vdisk_state(&api);
    eprintln!(
        "io_uring calls: {ok} ok, {failed} failed; {used} blocks cached, {dirty} dirty, pass-through {passthrough}"
    );
    assert!(failed >= 1 && ok >= 1, "the fills ran through io_uring and some failed: {ok} ok, {failed} failed");
    assert!(passthrough, "past the error threshold the vDisk passes through");
    assert!(dirty <= 1024 && used >= dirty, "cached {used}, dirty {dirty}"); // pass-through drains them
                                                                             // Writes in pass-through: acknowledged ones go to the backing store.
    for (c, t) in truth.iter_mut().enumerate().take(8).skip(4) {
        *t = 0x40 + c as u8;
        qemu_io_ok(&a.uri("vm1"), &[&format!("write -P {t} {c}M 1M"), "flush"]);
    }
    check(&a.uri("vm1"), &truth, "in pass-through");
    // SIGKILL. A start on the still-full file system is refused (the cache file's holes
    // cannot be preallocated) and changes nothing; with room again, a start serves the
    // same bytes.
    assert!(a.signal("KILL", Duration::from_secs(10)));
    fs.run("wait");
    let e = fs.serve("ring.toml", &[]).err().expect("no start on a cache file that cannot be preallocated");
    assert!(e.output.contains("fs/cache.img") && e.output.contains("No space left"), "{}", e.output);
    assert_eq!(fs.run("rm fs/filler"), 0);
    let a = fs.serve("ring.toml", &[]).unwrap();
    check(&a.uri("vm1"), &truth, "after SIGKILL and restart");
    // The dirty chunks left (the pass-through drain may have written back all of them)
    // destage into the backing file, which then holds every chunk's
    // truth.
    let (ok, out) = cachevisor(&["destage", "--api", a.api.as_deref().unwrap(), "--token", token]);
    assert!(ok, "{out}");
    assert!(a.signal("TERM", Duration::from_secs(20)));
    fs.run("wait");
    let image = std::fs::read(d.join("vm1.img")).unwrap();
    for (c, p) in truth.iter().enumerate() {
        assert!(
            image[c * MIB as usize..(c + 1) * MIB as usize].iter().all(|b| b == p),
            "backing chunk {c} is not {p:#x}"
        );
    }
}

#[test]
fn blocks_written_back_ahead_then_rewritten_survive_a_sigkill() {
    // Write-back ahead of eviction on (every block of the cache in its window): while the
    // disk is idle the daemon writes dirty blocks back and leaves them cached clean, but
    // the journal still calls them dirty (the flusher's rule). Rewrites of those blocks,
    // evictions of them and a SIGKILL must lose nothing.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    wb_config(d, "a.toml", "4MiB", "vm1.img", Some("8MiB"), "");
    let text =
        std::fs::read_to_string(d.join("a.toml")).unwrap().replace("writeback_ahead = 0", "writeback_ahead = 4096");
    std::fs::write(d.join("a.toml"), text).unwrap();
    let mut a = Daemon::start(d, "a.toml", &[]).unwrap();
    let api = a.api.clone().unwrap();
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x11 0 4M", "flush"]);
    // The disk idle: the 1,024 dirty blocks are written back ahead, one at a time.
    let t = std::time::Instant::now();
    while metric(&api, "cachevisor_written_back_ahead_blocks_total{vdisk=\"vm1\"}") < 1000 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "write-back ahead stalled at {}",
            metric(&api, "cachevisor_written_back_ahead_blocks_total{vdisk=\"vm1\"}")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // On the backing file (the reserve's background evictions, written back too, may
    // still be finishing: a refill job can hold a few blocks when the count is reached).
    let t = std::time::Instant::now();
    while !file_is(&d.join("vm1.img"), 0x11, 3 * MIB) {
        assert!(t.elapsed() < Duration::from_secs(10), "written back ahead: not on the backing file");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Rewrite a quarter (cached clean, journaled dirty), then misses that evict others.
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x22 0 1M", "write -P 0x33 4M 2M", "flush"]);
    a.kill9();
    let a = Daemon::start(d, "a.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x22 0 1M", "read -P 0x11 1M 3M", "read -P 0x33 4M 2M"]);
    let (ok, out) = destage(a.api.as_deref().unwrap(), &d.join("cache.img.meta/api-token"));
    assert!(ok, "{out}");
    let b = std::fs::read(d.join("vm1.img")).unwrap();
    let want = |at: usize| match at >> 20 {
        0 => 0x22,
        1..=3 => 0x11,
        4 | 5 => 0x33,
        _ => 0,
    };
    for at in (0..6 << 20).step_by(4096) {
        assert!(b[at..at + 4096].iter().all(|&x| x == want(at)), "backing block at {at} after destage");
    }
}

/// The vSSD's valid logical blocks, as its guest's manager sees them at hello.
fn vssd_valid(sock: &Path) -> Vec<u64> {
    use std::io::{BufRead, Write};
    let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"{\"op\":\"hello\"}\n").unwrap();
    let mut r = std::io::BufReader::new(s);
    loop {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        let v: serde_json::Value = serde_json::from_str(&l).unwrap();
        if v["reply"] == "state" {
            return v["valid"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
        }
    }
}

/// Sets vSSD `ssd`'s target through the API of the daemon whose cache is in `dir`.
/// Polls `probe` every 20 ms until `ok` holds for what it returns, at most 30 s; returns
/// that. Fails naming `what` and the last value seen otherwise.
fn eventually<T: std::fmt::Debug>(what: &str, mut probe: impl FnMut() -> T, ok: impl Fn(&T) -> bool) -> T {
    let t = std::time::Instant::now();
    loop {
        let v = probe();
        if ok(&v) {
            return v;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "never {what}: last {v:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The vSSD's valid blocks once there are `n` of them.
fn vssd_valid_n(sock: &Path, n: usize) -> Vec<u64> {
    eventually(&format!("{n} valid vSSD blocks"), || vssd_valid(sock), |v| v.len() == n)
}

fn vssd_target(dir: &Path, api: &str, blocks: u32) {
    let token = std::fs::read_to_string(dir.join("cache.img.meta/api-token")).unwrap();
    ureq::post(&format!("http://{api}/vssds/ssd/target"))
        .set("Authorization", &format!("Bearer {token}"))
        .send_json(serde_json::json!({ "blocks": blocks }))
        .unwrap();
}

/// Every valid block of the vSSD reads as its own pattern (0x40 + lbn) or as zeros (a
/// block handed out fresh), never another block's; every other block is an I/O error.
fn vssd_check(uri: &str, valid: &[u64], max: u64, when: &str) {
    for lbn in 0..max {
        let at = format!("{}M", lbn);
        if valid.contains(&lbn) {
            let own = qemu_io(uri, &[&format!("read -P {:#x} {at} 1M", 0x40 + lbn)]).0;
            let zero = own || qemu_io(uri, &[&format!("read -P 0 {at} 1M")]).0;
            assert!(zero, "{when}: block {lbn} holds neither its own bytes nor zeros");
        } else {
            let (ok, out) = qemu_io(uri, &[&format!("read {at} 4k")]);
            assert!(!ok && out.contains("Input/output error"), "{when}: block {lbn} is not the vSSD's, yet: {out}");
        }
    }
}

/// SIGKILL of the daemon at several points of a vSSD's deflates (its guest never
/// answers, so the host takes blocks at the deadline) and an inflate: after each restart
/// the vSSD holds the blocks it held before the resize or after it — nothing else — and
/// each holds its own bytes (or zeros when it is new).
#[test]
fn a_vssd_keeps_its_blocks_and_bytes_across_sigkills_during_resizes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    wb_config(d, "v.toml", "4MiB", "vm1.img", Some("16MiB"), "");
    let mut cfg = std::fs::read_to_string(d.join("v.toml")).unwrap();
    cfg += "[vssd]\nsize = \"16MiB\"\ndeflate_grace = \"100ms\"\n[[vssd.device]]\nname = \"ssd\"\nmax_size = \"8MiB\"\ninitial_size = \"8MiB\"\npersist = true\n";
    std::fs::write(d.join("v.toml"), cfg).unwrap();
    let sock = d.join("cache.img.meta/ssd.vssd.sock");
    let target = |api: &str, blocks: u32| vssd_target(d, api, blocks);
    let mut a = Daemon::start(d, "v.toml", &[]).unwrap();
    eventually("the initial blocks", || vssd_valid(&sock).len(), |&n| n >= 8);
    let uri = a.uri("ssd");
    for lbn in 0..8u64 {
        qemu_io_ok(&uri, &[&format!("write -P {:#x} {lbn}M 1M", 0x40 + lbn)]);
    }
    qemu_io_ok(&uri, &["flush"]);
    let mut held = 8;
    // (new target, how long after it the daemon dies)
    for (step, (blocks, after_ms)) in [(6u32, 0u64), (4, 150), (2, 60), (8, 30), (5, 400)].into_iter().enumerate() {
        target(a.api.as_deref().unwrap(), blocks);
        std::thread::sleep(Duration::from_millis(after_ms));
        a.kill9();
        a = Daemon::start(d, "v.toml", &[]).unwrap();
        let valid = vssd_valid(&sock);
        let n = valid.len() as u32;
        // Before the resize, after it, or partway (a deflate frees block by block; an
        // inflate's blocks arrive one commit at a time).
        let (lo, hi) = (held.min(blocks), held.max(blocks));
        assert!((lo..=hi).contains(&n), "step {step}: {n} blocks after a resize from {held} to {blocks}");
        vssd_check(&a.uri("ssd"), &valid, 8, &format!("step {step}"));
        held = n;
    }
}

/// One SSD budget (`vssd.budget = "shared"`): a vSSD inflates into blocks the
/// cache held dirty (written back first), deflates, and its blocks go back to the cache;
/// across SIGKILLs at each stage no byte of the vDisk or of the vSSD is lost, and neither
/// reads the other's.
#[test]
fn a_shared_budget_moves_blocks_between_the_cache_and_a_vssd_and_loses_no_byte() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    vssd_config(d, "s.toml", "[vssd]\nsize = \"8MiB\"\nbudget = \"shared\"\ndeflate_grace = \"100ms\"\n[[vssd.device]]\nname = \"ssd\"\nmax_size = \"8MiB\"\npersist = true\n");
    let sock = d.join("cache.img.meta/ssd.vssd.sock");
    let target = |api: &str, blocks: u32| vssd_target(d, api, blocks);
    let wait_valid = |n: usize| vssd_valid_n(&sock, n);
    let mut a = Daemon::start(d, "s.toml", &[]).unwrap();
    // The whole cache dirty with vm1's bytes: the vSSD starts with nothing.
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x11 0 16M", "flush"]);
    assert!(wait_valid(0).is_empty());
    // Six blocks of the cache go to the vSSD: their dirty blocks are written back first.
    target(a.api.as_deref().unwrap(), 6);
    wait_valid(6);
    let uri = a.uri("ssd");
    for lbn in 0..6u64 {
        qemu_io_ok(&uri, &[&format!("read -P 0 {lbn}M 1M"), &format!("write -P {:#x} {lbn}M 1M", 0x40 + lbn)]);
    }
    qemu_io_ok(&uri, &["flush"]);
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x11 0 16M"]);
    assert!(a.log().contains("blocks taken from the cache for the vSSDs"), "{}", a.log());
    // SIGKILL: both come back as they were.
    a.kill9();
    let mut a = Daemon::start(d, "s.toml", &[]).unwrap();
    let valid = wait_valid(6);
    vssd_check(&a.uri("ssd"), &valid, 8, "after the first SIGKILL");
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x11 0 16M"]);
    // The vSSD shrinks to 2 (its guest never answers: the host takes four blocks at the
    // deadline); the four go back to the cache, which fills them with vm1's new bytes.
    target(a.api.as_deref().unwrap(), 2);
    let valid = wait_valid(2);
    eventually("a block back in the cache", || a.log().contains("returned to the cache"), |&b| b);
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x22 0 16M", "flush"]);
    vssd_check(&a.uri("ssd"), &valid, 8, "after the deflate");
    a.kill9();
    let a = Daemon::start(d, "s.toml", &[]).unwrap();
    let after = wait_valid(2);
    assert_eq!(after, valid);
    vssd_check(&a.uri("ssd"), &after, 8, "after the second SIGKILL");
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x22 0 16M", "read -P 0 16M 16M"]);
}

/// One SSD budget split by weight (SymFlex §2.2): with `symflex-weighted` on the
/// vSSDs, the region holds the cache's blocks × the vSSDs' weights ÷ (theirs + the
/// vDisks'); a vSSD's weight raised through the API moves blocks from the cache to it,
/// and the vDisk's bytes stay whole throughout.
#[test]
fn a_shared_budget_follows_the_weights_of_vdisks_and_vssds() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    wb_config(d, "w.toml", "16MiB", "vm1.img", Some("32MiB"), "");
    let mut cfg = std::fs::read_to_string(d.join("w.toml"))
        .unwrap()
        .replace("write_policy = \"wb\"\n", "write_policy = \"wb\"\nweight = 3.0\n");
    cfg += "[vssd]\nsize = \"16MiB\"\nbudget = \"shared\"\ndeflate_grace = \"100ms\"\nallocator = \"symflex-weighted\"\ninterval = \"100ms\"\n[[vssd.device]]\nname = \"ssd\"\nmax_size = \"16MiB\"\nweight = 1.0\n";
    std::fs::write(d.join("w.toml"), cfg).unwrap();
    let sock = d.join("cache.img.meta/ssd.vssd.sock");
    let settle = |n: usize| vssd_valid_n(&sock, n);
    let a = Daemon::start(d, "w.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x33 0 16M", "flush"]);
    // 16 blocks, weights 1 (vSSD) : 3 (vDisk): 4 for the vSSD.
    settle(4);
    let token = std::fs::read_to_string(d.join("cache.img.meta/api-token")).unwrap();
    ureq::post(&format!("http://{}/vssds/ssd/share", a.api.as_deref().unwrap()))
        .set("Authorization", &format!("Bearer {token}"))
        .send_json(serde_json::json!({ "weight": 3.0 }))
        .unwrap();
    // 3 : 3: half of them.
    settle(8);
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x33 0 16M"]);
    // What an operator scrapes: the region's blocks and cap, the cache blocks lent to it.
    let api = a.api.as_deref().unwrap();
    assert_eq!(metric(api, "cachevisor_vssd_region_cap_blocks "), 8);
    assert_eq!(metric(api, "cachevisor_vssd_region_blocks "), 8);
    let withheld = metric(api, "cachevisor_vssd_withheld_cache_blocks ");
    assert!(withheld > 0 && withheld.is_multiple_of(8), "{withheld} cache blocks withheld for 8 vSSD blocks");
    assert!(a.log().contains("blocks taken from the cache for the vSSDs"), "{}", a.log());
}

/// One SSD budget under load: fio writes and verifies (crc32c) a write-back
/// vDisk larger than the cache while a vSSD in the same budget grows to half the cache
/// and shrinks to nothing, again and again — its runs emptied under fio's writes (dirty
/// blocks written back first) and given back: no byte fio wrote changes.
#[test]
fn fio_verify_holds_on_a_vdisk_while_a_shared_budget_moves_its_cache_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    vssd_config(d, "l.toml", "[vssd]\nsize = \"8MiB\"\nbudget = \"shared\"\ndeflate_grace = \"100ms\"\n[[vssd.device]]\nname = \"ssd\"\nmax_size = \"8MiB\"\n");
    let a = Daemon::start(d, "l.toml", &[]).unwrap();
    let api = a.api.clone().unwrap();
    let sock = d.join("cache.img.meta/ssd.vssd.sock");
    let mut fio = std::process::Command::new("fio")
        .args(["--name=v", "--ioengine=nbd", &format!("--uri={}", a.uri("vm1")), "--rw=randwrite", "--bs=4k"])
        .args(["--iodepth=8", "--size=24M", "--loops=4", "--verify=crc32c", "--verify_backlog=512", "--verify_fatal=1"])
        .args(["--do_verify=1", "--output-format=terse"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("fio (apt-get install fio)");
    let wait_valid = |n: usize| vssd_valid_n(&sock, n);
    let mut rounds = 0;
    let out = loop {
        vssd_target(d, &api, 8);
        wait_valid(8);
        vssd_target(d, &api, 0);
        wait_valid(0);
        rounds += 1;
        if rounds >= 3 && fio.try_wait().unwrap().is_some() {
            break fio.wait_with_output().unwrap();
        }
    };
    assert!(
        out.status.success(),
        "fio: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let log = a.log();
    assert!(log.contains("blocks taken from the cache") && log.contains("returned to the cache"), "{log}");
    eprintln!("{rounds} rounds of 8 blocks to the vSSD and back under fio's verified writes");
}

/// SymFlex §5.2 across both kinds of cache: with `symflex-proportional`, a
/// shared budget's split follows the throughput each side serves from the SSD, not the
/// weights. Ratios 1 : 1; a busy vSSD beside an idle vDisk gives its blocks to the cache
/// (the cache side serves nothing, so it grows), and a busy vDisk beside an idle vSSD
/// gives the region room again. Split by weight, the cap would sit at 8 throughout.
#[test]
fn a_proportional_shared_budget_follows_the_throughput_of_both_sides() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    vssd_config(d, "p.toml", "[vssd]\nsize = \"16MiB\"\nbudget = \"shared\"\ndeflate_grace = \"100ms\"\nallocator = \"symflex-proportional\"\ninterval = \"200ms\"\n[[vssd.device]]\nname = \"ssd\"\nmax_size = \"16MiB\"\n");
    let a = Daemon::start(d, "p.toml", &[]).unwrap();
    let api = a.api.clone().unwrap();
    let sock = d.join("cache.img.meta/ssd.vssd.sock");
    let lbn = eventually("a vSSD block", || vssd_valid(&sock), |v| !v.is_empty())[0];
    let load = |uri: String, offset: u64, size: &str| {
        std::process::Command::new("fio")
            .args(["--name=p", "--ioengine=nbd", &format!("--uri={uri}"), "--rw=randread", "--bs=4k", "--iodepth=4"])
            .args([
                &format!("--offset={offset}"),
                &format!("--size={size}"),
                "--time_based",
                "--runtime=60",
                "--thread",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("fio (apt-get install fio)")
    };
    let until = |what: &str, ok: &dyn Fn(u64) -> bool| {
        let t = std::time::Instant::now();
        let mut seen = Vec::new();
        loop {
            let cap = metric(&api, "cachevisor_vssd_region_cap_blocks ");
            seen.push(cap);
            if ok(cap) {
                return seen;
            }
            assert!(t.elapsed() < Duration::from_secs(30), "{what}: the cap went {seen:?}\n{}", a.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // The vSSD busy on the block it has, the vDisk idle: the region shrinks to a block.
    let mut busy_vssd = load(a.uri("ssd"), lbn << 20, "1M");
    let seen = until("busy vSSD, idle vDisk", &|cap| cap <= 1);
    busy_vssd.kill().unwrap();
    let out = busy_vssd.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).is_empty(),
        "fio on the vSSD: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("busy vSSD: cap {seen:?}");
    // The vDisk busy on a hot 4 MiB, the vSSD idle: the region grows past the weights' 8.
    let mut busy_vdisk = load(a.uri("vm1"), 0, "4M");
    let seen = until("busy vDisk, idle vSSD", &|cap| cap >= 12);
    busy_vdisk.kill().unwrap();
    busy_vdisk.wait().unwrap();
    eprintln!("busy vDisk: cap {seen:?}");
}

/// a shared budget takes the runs that cost the cache least. Half the cache
/// holds vm1's dirty bytes, the other half nothing; a vSSD asking for four blocks gets
/// four empty runs, so nothing is written back (vm1's backing file stays as it was) and
/// vm1's bytes stay cached. Lowest-numbered runs first would write back 4 MiB.
#[test]
fn a_shared_budget_takes_the_runs_that_cost_the_cache_least() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    vssd_config(
        d,
        "c.toml",
        "[vssd]\nsize = \"8MiB\"\nbudget = \"shared\"\n[[vssd.device]]\nname = \"ssd\"\nmax_size = \"8MiB\"\n",
    );
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x11 0 8M", "flush"]);
    let api = a.api.clone().unwrap();
    let dirty = metric(&api, "cachevisor_dirty_blocks{vdisk=\"vm1\"} ");
    assert_eq!(dirty, 2048, "8 MiB of 4 KiB blocks dirty");
    vssd_target(d, &api, 4);
    let sock = d.join("cache.img.meta/ssd.vssd.sock");
    vssd_valid_n(&sock, 4);
    assert_eq!(metric(&api, "cachevisor_dirty_blocks{vdisk=\"vm1\"} "), 2048, "no dirty block written back");
    assert!(
        !file_is(&d.join("vm1.img"), 0x11, 4096),
        "vm1's backing file was written: runs with dirty blocks were taken"
    );
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x11 0 8M"]);
}

/// SymFlex §2.4.4 under one budget: a persistent vSSD whose VM stops leaves the
/// weighted split (it no longer runs), so its blocks are swapped out and go back to the
/// cache, which vm1 then fills; when its VM starts again it gets blocks back from the
/// cache (vm1's dirty bytes written back first) and its data swapped in — and across a
/// SIGKILL after that, both keep every byte.
#[test]
fn a_stopped_persistent_vssd_gives_its_blocks_to_the_cache_and_gets_its_data_back() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    vssd_config(d, "i.toml", "[vssd]\nsize = \"16MiB\"\nbudget = \"shared\"\ndeflate_grace = \"100ms\"\nallocator = \"symflex-weighted\"\ninterval = \"100ms\"\n[[vssd.device]]\nname = \"ssd\"\nmax_size = \"8MiB\"\npersist = true\n");
    let sock = d.join("cache.img.meta/ssd.vssd.sock");
    let a = Daemon::start(d, "i.toml", &[]).unwrap();
    let api = a.api.clone().unwrap();
    let region =
        |want: u64| eventually("the region's size", || metric(&api, "cachevisor_vssd_region_blocks "), |&n| n == want);
    // Weights 1 : 1 of 16 blocks: the vSSD takes 8, all of its 8 MiB.
    region(8);
    let valid = vssd_valid_n(&sock, 8);
    let uri = a.uri("ssd");
    for lbn in 0..8u64 {
        qemu_io_ok(&uri, &[&format!("write -P {:#x} {lbn}M 1M", 0x40 + lbn)]);
    }
    qemu_io_ok(&uri, &["flush"]);
    let token = std::fs::read_to_string(d.join("cache.img.meta/api-token")).unwrap();
    let post = |what: &str| {
        ureq::post(&format!("http://{api}/vssds/ssd/{what}"))
            .set("Authorization", &format!("Bearer {token}"))
            .send_json(serde_json::json!({}))
            .unwrap();
    };
    post("stop");
    region(0);
    eventually("no cache block withheld", || metric(&api, "cachevisor_vssd_withheld_cache_blocks "), |&n| n == 0);
    assert!(a.log().contains("swapped out for the cache"), "{}", a.log());
    // The cache has all 16 MiB again: vm1 fills it dirty.
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x22 0 16M", "flush"]);
    assert!(metric(&api, "cachevisor_dirty_blocks{vdisk=\"vm1\"} ") > 2048, "vm1 holds more than half the cache");
    post("start");
    region(8);
    vssd_valid_n(&sock, 8);
    let own: Vec<String> = (0..8u64).map(|l| format!("read -P {:#x} {l}M 1M", 0x40 + l)).collect();
    let own: Vec<&str> = own.iter().map(String::as_str).collect();
    qemu_io_ok(&a.uri("ssd"), &own);
    assert_eq!(vssd_valid(&sock), valid);
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x22 0 16M"]);
    let mut a = a;
    a.kill9();
    let a = Daemon::start(d, "i.toml", &[]).unwrap();
    assert_eq!(vssd_valid(&sock), valid);
    qemu_io_ok(&a.uri("ssd"), &own);
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x22 0 16M"]);
}

/// An operator's mistake under one budget: the cache's file and metadata put
/// back from before a vSSD took blocks (a restored backup) while the vSSD region's journal
/// says it holds them — started as they are, the vSSD would serve vm1's old bytes. The
/// start is refused naming the disagreement, before the backup's stale dirty blocks are
/// written back over vm1's newer bytes; with the right cache files put back, both vm1 and
/// the vSSD have every byte.
#[test]
fn a_start_where_the_cache_and_the_vssd_region_claim_the_same_blocks_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    wb_config(d, "n.toml", "16MiB", "vm1.img", Some("32MiB"), "");
    let plain = std::fs::read_to_string(d.join("n.toml")).unwrap();
    let with_vssd = format!("{plain}[vssd]\nsize = \"8MiB\"\nbudget = \"shared\"\n[[vssd.device]]\nname = \"ssd\"\nmax_size = \"8MiB\"\ninitial_size = \"8MiB\"\npersist = true\n");
    std::fs::write(d.join("v.toml"), with_vssd).unwrap();
    let meta = d.join("cache.img.meta");
    let cache_files = [d.join("cache.img"), meta.join("checkpoint"), meta.join("journal")];
    let save = |to: &str| {
        std::fs::create_dir(d.join(to)).unwrap();
        for f in &cache_files {
            std::fs::copy(f, d.join(to).join(f.file_name().unwrap())).unwrap();
        }
    };
    let put_back = |from: &str| {
        for f in &cache_files {
            std::fs::copy(d.join(from).join(f.file_name().unwrap()), f).unwrap();
        }
    };
    // Without a vSSD, vm1 fills the cache dirty; the cache is backed up.
    let mut a = Daemon::start(d, "n.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x11 0 16M", "flush"]);
    assert!(a.term(Duration::from_secs(20)).is_some_and(|s| s.success()));
    save("backup");
    // The vSSD takes half the cache (vm1's blocks there written back) and is written.
    let mut a = Daemon::start(d, "v.toml", &[]).unwrap();
    vssd_valid_n(&meta.join("ssd.vssd.sock"), 8);
    for lbn in 0..8u64 {
        qemu_io_ok(&a.uri("ssd"), &[&format!("write -P {:#x} {lbn}M 1M", 0x40 + lbn), "flush"]);
    }
    // vm1 rewritten: half in the cache, the rest written back to its backing file.
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x22 0 16M", "flush"]);
    assert!(a.term(Duration::from_secs(20)).is_some_and(|s| s.success()));
    save("good");
    // The backup put back: both sides claim the same blocks.
    put_back("backup");
    // (Both metadata stores start a new generation at every start: what they say is
    // checked by the start below, after the mistake is undone.)
    let kept = [d.join("vm1.img")];
    let before: Vec<Vec<u8>> = kept.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let err = match Daemon::start(d, "v.toml", &[]) {
        Ok(_) => panic!("the start was not refused"),
        Err(f) => f.output,
    };
    assert!(err.contains("the two metadata journals disagree"), "{err}");
    for (p, b) in kept.iter().zip(&before) {
        assert!(&std::fs::read(p).unwrap() == b, "{} changed by a refused start", p.display());
    }
    // The mistake undone: every byte of both.
    put_back("good");
    let a = Daemon::start(d, "v.toml", &[]).unwrap();
    let own: Vec<String> = (0..8u64).map(|l| format!("read -P {:#x} {l}M 1M", 0x40 + l)).collect();
    qemu_io_ok(&a.uri("ssd"), &own.iter().map(String::as_str).collect::<Vec<_>>());
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x22 0 16M"]);
}
