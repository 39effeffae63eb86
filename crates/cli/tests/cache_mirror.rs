//! Mirrored dirty data over two cache devices (`[cache] mirror_dirty`, on by default with
//! two or more), with real NBD clients: a write-back write is answered once it is on both
//! devices, so losing one loses no acknowledged write — the device emptied while the
//! daemon was down (the start serves its dirty blocks from their mirrors), and a device
//! failing under a reading client (dropped at the error threshold, its dirty blocks
//! served from the other device and written back first): every byte reads back, and
//! fio's crc32c-verified writes go on on the device left.

use cachevisor_testkit as common;

use common::{fio_verified, qemu_io_ok, s, Daemon, ServeConfig};
use std::path::Path;

/// `cache.img` (8 MiB), write-back vDisk vm1 of 32 MiB, no background write-back.
fn base() -> ServeConfig {
    ServeConfig::new("8MiB")
        .no_writeback()
        // Below the data path's 4 tries of a request that met EIO: a request on the cut
        // device drops it within its tries, and its last try reads the copy.
        .cache("error_threshold", 2)
        .api()
        .section("prewarm", "snapshot_every", "0")
        .vdisk("vm1", "vm1.img", &[("size", s("32MiB")), ("write_policy", s("wb"))])
}

/// [`base`] and `ssd2/dev1.img` (8 MiB), dirty data mirrored (the default with two
/// devices).
fn write_config(d: &Path) {
    std::fs::create_dir_all(d.join("ssd2")).unwrap();
    base().array_item("cache.device", &[("path", s("ssd2/dev1.img")), ("size", s("8MiB"))]).write(d, "c.toml");
}

/// [`base`] alone: the second device out of the list (nothing mirrored from now on).
fn write_one_device(d: &Path) {
    base().write(d, "c.toml");
}

/// `cachevisor cache status --json` of `a`.
fn cache_status(d: &Path, a: &Daemon) -> serde_json::Value {
    common::cache_status_json(a.api.as_deref().unwrap(), &d.join("cache.img.meta"))
}

/// 6 MiB of patterns: dirty, twice over, fits the two devices' 16 MiB.
const WRITE: [&str; 2] = ["write -P 0x51 0 3M", "write -P 0x52 3M 3M"];
const READ: [&str; 2] = ["read -P 0x51 0 3M", "read -P 0x52 3M 3M"];

/// A daemon on [`write_config`] in `d`, the patterns written (dirty, mirrored), SIGKILLed.
fn killed_with_mirrored_patterns(d: &Path) {
    write_config(d);
    let mut a = Daemon::start(d, "c.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm1"), &WRITE);
    a.kill9();
}

/// Empties `path` as a replaced SSD would be: zeros where its label and blocks were.
fn empty(path: &Path) {
    let len = std::fs::metadata(path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(0).unwrap();
    f.set_len(len).unwrap();
}

/// Whether the backing file holds only zeros in its first 6 MiB (nothing written back).
fn backing_untouched(d: &Path) -> bool {
    std::fs::read(d.join("vm1.img")).unwrap()[..6 << 20].iter().all(|&x| x == 0)
}

#[test]
fn a_device_emptied_while_down_loses_no_mirrored_write() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_config(d);
    let mut a = Daemon::start(d, "c.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm1"), &WRITE);
    let st = cache_status(d, &a);
    assert!(st["dirty_blocks"].as_u64().unwrap() >= 1536, "6 MiB dirty: {st}");
    assert_eq!(st["mirror"]["mirrored_blocks"], st["dirty_blocks"], "every dirty block mirrored: {st}");
    assert_eq!(st["mirror"]["fallbacks"].as_u64(), Some(0), "{st}");
    let human = common::cache_status_text(a.api.as_deref().unwrap(), &d.join("cache.img.meta"));
    let want = format!(
        "dirty data mirrored: {} blocks with a copy on another device, 0 writes went through",
        st["dirty_blocks"]
    );
    assert!(human.contains(&want), "{human}");
    let devs = st["devices"].as_array().unwrap();
    assert!(devs.iter().all(|v| v["cached_blocks"].as_u64().unwrap() > 0), "{st}");
    a.kill9();
    assert!(backing_untouched(d), "the patterns are only in the cache");
    // The second device emptied while the daemon was down: its dirty blocks' copies are
    // on the first, so the start goes on (with one copy each, written back first).
    empty(&d.join("ssd2/dev1.img"));
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    let log = a.log();
    assert!(log.contains("cold start of cache.device[0].path"), "{log}");
    assert!(log.contains("served from their mirrors"), "{log}");
    qemu_io_ok(&a.uri("vm1"), &READ);
    let st = cache_status(d, &a);
    assert!(st["mirror"]["promoted"].as_u64().unwrap() > 0, "{st}");
    // Single copies now: written back without waiting for the flusher (it is off).
    let mut tries = 0;
    while !std::fs::read(d.join("vm1.img")).unwrap()[..6 << 20].iter().any(|&x| x == 0x51 || x == 0x52) {
        tries += 1;
        assert!(tries < 100, "the single copies were not written back: {}", cache_status(d, &a));
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    qemu_io_ok(&a.uri("vm1"), &READ);
}

#[test]
fn a_device_failing_under_a_client_loses_no_mirrored_write_and_writes_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_config(d);
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm1"), &WRITE);
    // The second device cut to nothing under the daemon: every read there fails from now
    // on (past its end). A client reading everything sees every byte: a read that fails is
    // tried again, the device is dropped at the threshold, and its dirty blocks are read
    // from their copies on the first device.
    std::fs::OpenOptions::new().write(true).open(d.join("ssd2/dev1.img")).unwrap().set_len(0).unwrap();
    qemu_io_ok(&a.uri("vm1"), &READ);
    let st = cache_status(d, &a);
    assert_eq!(st["devices"][1]["failed"].as_bool(), Some(true), "{st}");
    assert_eq!(st["devices"][0]["failed"].as_bool(), Some(false), "{st}");
    assert!(st["mirror"]["promoted"].as_u64().unwrap() > 0, "{st}");
    let log = a.log();
    assert!(log.contains("dirty_served_from_mirrors"), "{log}");
    assert!(log.contains("dirty_unreadable=0"), "nothing unreadable: {log}");
    // Writes go on, on the device left (one copy: through to the backing store): fio's
    // verified random writes past the patterns.
    fio_verified(&a.uri("vm1"), &["--offset=8M", "--size=4M", "--loops=2"]).wait_ok();
    qemu_io_ok(&a.uri("vm1"), &READ);
    assert!(cache_status(d, &a)["mirror"]["fallbacks"].as_u64().unwrap() > 0);
    // A wrong pattern fails (the check can fail).
    assert!(!common::qemu_io(&a.uri("vm1"), &["read -P 0x99 0 4k"]).0);
}

#[test]
fn a_device_cut_under_verified_writes_loses_none_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_config(d);
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm1"), &WRITE);
    // fio writes and verifies 4 MiB past the patterns, slowed so that the cut lands in
    // its run: 1,024 writes a loop at 1,500 a second, verified after each write phase.
    let fio = fio_verified(&a.uri("vm1"), &["--offset=8M", "--size=4M", "--loops=3", "--rate_iops=1500"]);
    let mut tries = 0;
    while cache_status(d, &a)["dirty_blocks"].as_u64().unwrap() < 1536 + 256 {
        tries += 1;
        assert!(tries < 200, "fio wrote nothing: {}", cache_status(d, &a));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The second device cut under fio: its writes there extend the file again with zeros
    // between them, so reads there fail (past the end) or fail their checksums (zeros); a
    // dirty block's copy on the first device serves it either way.
    std::fs::OpenOptions::new().write(true).open(d.join("ssd2/dev1.img")).unwrap().set_len(0).unwrap();
    fio.wait_ok();
    qemu_io_ok(&a.uri("vm1"), &READ);
    let st = cache_status(d, &a);
    assert!(st["mirror"]["promoted"].as_u64().unwrap() > 0, "{st}");
    assert_eq!(st["devices"][1]["failed"].as_bool(), Some(true), "{st}");
    // fio's last pass verified once more, from a fresh client.
    fio_verified(&a.uri("vm1"), &["--offset=8M", "--size=4M", "--verify_only"]).wait_ok();
}

#[test]
fn a_start_with_a_device_missing_serves_from_the_rest_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    killed_with_mirrored_patterns(d);
    // The second device gone while the daemon was down (a drive that did not come up):
    // its dirty blocks' copies are on the first, so the start runs without it.
    let dev = d.join("ssd2/dev1.img");
    std::fs::remove_file(&dev).unwrap();
    let mut a = Daemon::start(d, "c.toml", &[]).unwrap();
    let log = a.log();
    assert!(log.contains("cache.device[0].path") && log.contains("is missing: the cache runs without it"), "{log}");
    assert!(!dev.exists(), "not created where the device should be");
    let st = cache_status(d, &a);
    assert_eq!(st["devices"][1]["failed"].as_bool(), Some(true), "{st}");
    assert_eq!(st["devices"][1]["cached_blocks"].as_u64(), Some(0), "{st}");
    assert!(st["mirror"]["promoted"].as_u64().unwrap() > 0, "{st}");
    qemu_io_ok(&a.uri("vm1"), &READ);
    // Writes go on, on the device left (one copy: through).
    fio_verified(&a.uri("vm1"), &["--offset=8M", "--size=4M"]).wait_ok();
    qemu_io_ok(&a.uri("vm1"), &READ);
    // Killed again while it is still missing: the same again, every byte there.
    a.kill9();
    let mut a = Daemon::start(d, "c.toml", &[]).unwrap();
    assert!(a.log().contains("is missing"), "{}", a.log());
    qemu_io_ok(&a.uri("vm1"), &READ);
    a.kill9();
    // An empty device put back: taken (a cold device), used again.
    std::fs::write(&dev, b"").unwrap();
    std::fs::set_permissions(&dev, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    let st = cache_status(d, &a);
    assert_eq!(st["devices"][1]["failed"].as_bool(), Some(false), "{st}");
    qemu_io_ok(&a.uri("vm1"), &READ);
    // The cache is full of clean blocks: the first write's mirrors free clean slots on
    // the other device (usable after the next commit: that write goes through), the next
    // write's mirrors take them.
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x53 16M 4M", "read -P 0x53 16M 4M"]);
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x54 20M 4M", "read -P 0x54 20M 4M"]);
    let st = cache_status(d, &a);
    assert!(st["devices"][1]["cached_blocks"].as_u64().unwrap() > 0, "{st}");
    assert!(st["mirror"]["mirrored_blocks"].as_u64().unwrap() > 0, "mirrored again: {st}");
}

#[test]
fn a_device_taken_out_of_the_config_while_down_loses_no_mirrored_write() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    killed_with_mirrored_patterns(d);
    // The second device out of the list: its dirty blocks' copies are on the first (the
    // blocks whose own copy was on the first keep it), so the start goes on, warm.
    write_one_device(d);
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    let log = a.log();
    assert!(log.contains("the cache's devices changed") && log.contains("served from their copies"), "{log}");
    assert!(backing_untouched(d));
    let st = cache_status(d, &a);
    assert!(st["dirty_blocks"].as_u64().unwrap() >= 1536, "every dirty block kept: {st}");
    qemu_io_ok(&a.uri("vm1"), &READ);
}
