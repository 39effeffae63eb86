//! Adding and removing cache devices under running clients (`cachevisor cache add`,
//! `cache remove`, `POST /cache/devices/add` and `/remove`, a reload of the device list).
//! Removing: with fio's crc32c-verified writes running and dirty blocks mirrored over
//! both devices, the removal moves or writes back everything the device held, closes its
//! descriptor, and every acknowledged byte reads back — then and after a SIGKILL, when
//! the start leaves the device out although the configuration file still lists it.
//! Refusals name what is wrong: the first device, one not in the cache, one removed
//! already. A reload of a file that no longer lists a device removes it the same way.
//! Adding: a one-device cache with dirty blocks gets a second device under fio's
//! verified writes; new blocks land on it, dirty data is mirrored from then on, and a
//! SIGKILL restarts warm on both although the file lists one. A device on its own file
//! system (a tmpfs in a private mount namespace) removed under load can be unmounted at
//! once (no descriptor of it left open), and a new one mounted there is added back.

use cachevisor_testkit as common;

use common::{cachevisor, fio_verified, qemu_io_ok, s, Daemon, ServeConfig, SmallFs};
use std::path::Path;

/// `cache.img` and `ssd2/dev1.img` (8 MiB each), write-back vDisk vm1 of 32 MiB, no
/// background write-back, dirty data mirrored (the default with two devices).
fn write_config(d: &Path, second: bool) {
    std::fs::create_dir_all(d.join("ssd2")).unwrap();
    let mut c = ServeConfig::new("8MiB").no_writeback().api().section("prewarm", "snapshot_every", "0").vdisk(
        "vm1",
        "vm1.img",
        &[("size", s("32MiB")), ("write_policy", s("wb"))],
    );
    if second {
        c = c.array_item("cache.device", &[("path", s("ssd2/dev1.img")), ("size", s("8MiB"))]);
    }
    c.write(d, "c.toml");
}

fn cache_status(d: &Path, a: &Daemon) -> serde_json::Value {
    common::cache_status_json(a.api.as_deref().unwrap(), &d.join("cache.img.meta"))
}

/// `cachevisor cache remove DEVICE` against `a`: (success, output).
fn remove(d: &Path, a: &Daemon, device: &Path) -> (bool, String) {
    remove_at(d, a.api.as_deref().unwrap(), device)
}

/// `cachevisor cache remove DEVICE` against the API at `api`: (success, output).
fn remove_at(d: &Path, api: &str, device: &Path) -> (bool, String) {
    let token = d.join("cache.img.meta/api-token");
    cachevisor(&["cache", "remove", device.to_str().unwrap(), "--api", api, "--token-file", token.to_str().unwrap()])
}

/// Whether process `pid` holds a descriptor of `path`.
fn holds(pid: u32, path: &Path) -> bool {
    let want = std::fs::canonicalize(path).unwrap();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .any(|p| p == want)
}

/// A daemon on both devices in `d`, the patterns written (dirty, mirrored).
fn started_with_patterns(d: &Path) -> Daemon {
    write_config(d, true);
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm1"), &WRITE);
    a
}

const WRITE: [&str; 2] = ["write -P 0x61 0 3M", "write -P 0x62 3M 3M"];
const READ: [&str; 2] = ["read -P 0x61 0 3M", "read -P 0x62 3M 3M"];

#[test]
fn a_device_removed_under_verified_writes_loses_nothing_and_stays_out() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut a = started_with_patterns(d);
    let dev = d.join("ssd2/dev1.img");
    let st = cache_status(d, &a);
    assert!(st["devices"][1]["cached_blocks"].as_u64().unwrap() > 0, "{st}");
    assert!(holds(a.pid, &dev));
    // Where io_uring runs the cache file's I/O it runs the second device's too (the
    // descriptor it holds of it is closed by the removal below).
    let log = a.log();
    if log.contains("O_DIRECT through io_uring") {
        assert!(log.contains("through io_uring (O_DIRECT ones in use) devices=2 of=2"), "{log}");
    }
    // Refused: the first device, one not in the cache.
    let (ok, out) = remove(d, &a, &d.join("cache.img"));
    assert!(!ok && out.contains("carries the cache's identity"), "{out}");
    let (ok, out) = remove(d, &a, &d.join("nope.img"));
    assert!(!ok && out.contains("is not one of the cache's devices") && out.contains("dev1.img"), "{out}");
    // Removed while fio writes and verifies past the patterns.
    let fio = fio_verified(&a.uri("vm1"), &["--offset=8M", "--size=4M", "--loops=3", "--rate_iops=1500"]);
    std::thread::sleep(std::time::Duration::from_millis(400));
    let (ok, out) = remove(d, &a, &dev);
    assert!(ok && out.contains("removed"), "{out}");
    fio.wait_ok();
    qemu_io_ok(&a.uri("vm1"), &READ);
    let st = cache_status(d, &a);
    let gone = &st["devices"][1];
    assert_eq!((gone["removal"]["state"].as_str(), gone["cached_blocks"].as_u64()), (Some("removed"), Some(0)), "{st}");
    assert!(!holds(a.pid, &dev), "its descriptors are closed");
    assert!(st["devices"][0]["cached_blocks"].as_u64().unwrap() > 0, "{st}");
    assert_eq!(st["size_bytes"].as_u64(), Some(8 << 20), "the cache is the first device's now: {st}");
    let (ok, out) = remove(d, &a, &dev);
    assert!(!ok && out.contains("removed already"), "{out}");
    // /metrics says so per device.
    let metrics =
        ureq::get(&format!("http://{}/metrics", a.api.as_deref().unwrap())).call().unwrap().into_string().unwrap();
    let value = |name: &str| -> Option<f64> {
        let l = metrics.lines().find(|l| l.starts_with(name) && l.contains("dev1.img"))?;
        l.rsplit(' ').next()?.parse().ok()
    };
    assert_eq!(value("cachevisor_cache_device_removed{"), Some(1.0), "{metrics}");
    assert_eq!(value("cachevisor_cache_device_cached_blocks{"), Some(0.0), "{metrics}");
    // A SIGKILL: the start leaves it out (the file still lists it), every byte there.
    a.kill9();
    let mut a = Daemon::start(d, "c.toml", &[]).unwrap();
    assert!(a.log().contains("was removed with `cachevisor cache remove`"), "{}", a.log());
    assert!(!holds(a.pid, &dev));
    qemu_io_ok(&a.uri("vm1"), &READ);
    fio_verified(&a.uri("vm1"), &["--offset=8M", "--size=4M", "--verify_only"]).wait_ok();
    a.kill9();
    // The file catches up (no second device): the overlay forgets the removal, and a
    // later list with the device again takes it back, empty.
    write_config(d, false);
    drop(Daemon::start(d, "c.toml", &[]).unwrap());
    write_config(d, true);
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    assert!(holds(a.pid, &dev), "taken back");
    qemu_io_ok(&a.uri("vm1"), &READ);
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x63 16M 6M", "read -P 0x63 16M 6M"]);
    assert!(cache_status(d, &a)["devices"][1]["cached_blocks"].as_u64().unwrap() > 0);
}

/// `cachevisor reload` against `a`: (success, output).
fn reload(d: &Path, a: &Daemon) -> (bool, String) {
    let token = d.join("cache.img.meta/api-token");
    cachevisor(&["reload", "--api", a.api.as_deref().unwrap(), "--token-file", token.to_str().unwrap()])
}

#[test]
fn a_reload_of_a_file_without_a_device_removes_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut a = started_with_patterns(d);
    let dev = d.join("ssd2/dev1.img");
    // The second device out of the file: removed online, under a verifying client.
    write_config(d, false);
    let fio = fio_verified(&a.uri("vm1"), &["--offset=8M", "--size=4M", "--loops=2", "--rate_iops=1500"]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (ok, out) = reload(d, &a);
    assert!(ok && out.contains("cache.device") && out.contains("removed"), "{out}");
    fio.wait_ok();
    qemu_io_ok(&a.uri("vm1"), &READ);
    assert!(!holds(a.pid, &dev));
    assert_eq!(cache_status(d, &a)["devices"][1]["removal"]["state"].as_str(), Some("removed"));
    a.kill9();
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm1"), &READ);
    assert!(!holds(a.pid, &dev));
}

/// `cachevisor cache add DEVICE --size SIZE` against `a`: (success, output).
fn add(d: &Path, a: &Daemon, device: &Path, size: &str) -> (bool, String) {
    let token = d.join("cache.img.meta/api-token");
    let (api, token) = (a.api.as_deref().unwrap(), token.to_str().unwrap());
    cachevisor(&["cache", "add", device.to_str().unwrap(), "--size", size, "--api", api, "--token-file", token])
}

#[test]
fn a_device_added_under_verified_writes_takes_new_blocks_mirrors_and_stays_after_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_config(d, false);
    let mut a = Daemon::start(d, "c.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm1"), &WRITE);
    let dev = d.join("ssd2/dev1.img");
    // Refused: a size that is no multiple of the block, the cache's own file.
    let (ok, out) = add(d, &a, &dev, "1000");
    assert!(!ok && out.contains("multiple of the block size"), "{out}");
    let (ok, out) = add(d, &a, &d.join("cache.img"), "8MiB");
    assert!(!ok && out.contains("already"), "{out}");
    // 0, and past the slot ids a cache has (2^32 blocks of 4 KiB is 16 TiB).
    let (ok, out) = add(d, &a, &dev, "0");
    assert!(!ok && out.contains("positive multiple"), "{out}");
    let (ok, out) = add(d, &a, &dev, "16TiB");
    assert!(!ok && out.contains("slot ids"), "{out}");
    assert!(!dev.exists(), "nothing created by a refusal");
    // Added while fio writes and verifies past the patterns.
    let fio = fio_verified(&a.uri("vm1"), &["--offset=8M", "--size=4M", "--loops=3", "--rate_iops=1500"]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (ok, out) = add(d, &a, &dev, "8MiB");
    assert!(ok && out.contains("added") && out.contains("mirrored"), "{out}");
    fio.wait_ok();
    qemu_io_ok(&a.uri("vm1"), &READ);
    assert!(holds(a.pid, &dev));
    let st = cache_status(d, &a);
    assert_eq!(st["size_bytes"].as_u64(), Some(16 << 20), "{st}");
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x64 16M 4M", "read -P 0x64 16M 4M"]);
    let st = cache_status(d, &a);
    assert!(st["devices"][1]["cached_blocks"].as_u64().unwrap() > 0, "new blocks land on it: {st}");
    assert!(st["mirror"]["mirrored_blocks"].as_u64().unwrap() > 0, "mirrored from now on: {st}");
    let (ok, out) = add(d, &a, &dev, "8MiB");
    assert!(!ok && out.contains("already"), "{out}");
    // A SIGKILL: the start keeps it (the file lists one device), warm on both.
    let on_it = st["devices"][1]["cached_blocks"].as_u64().unwrap();
    a.kill9();
    let mut a = Daemon::start(d, "c.toml", &[]).unwrap();
    assert!(a.log().contains("was added with `cachevisor cache add`"), "{}", a.log());
    let st = cache_status(d, &a);
    assert_eq!(st["devices"][1]["cached_blocks"].as_u64(), Some(on_it), "warm on the added device: {st}");
    qemu_io_ok(&a.uri("vm1"), &READ);
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x64 16M 4M"]);
    fio_verified(&a.uri("vm1"), &["--offset=8M", "--size=4M", "--verify_only"]).wait_ok();
    // The file catches up: a reload has nothing to do, the overlay forgets it.
    write_config(d, true);
    let (ok, out) = reload(d, &a);
    assert!(ok, "{out}");
    a.kill9();
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    assert!(!a.log().contains("was added with"), "{}", a.log());
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x64 16M 4M"]);
}

#[test]
fn a_reload_of_a_file_with_one_more_device_adds_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_config(d, false);
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm1"), &WRITE);
    write_config(d, true);
    let (ok, out) = reload(d, &a);
    assert!(ok && out.contains("cache.device") && out.contains("added"), "{out}");
    assert!(holds(a.pid, &d.join("ssd2/dev1.img")));
    assert_eq!(cache_status(d, &a)["size_bytes"].as_u64(), Some(16 << 20));
    qemu_io_ok(&a.uri("vm1"), &READ);
}

#[test]
fn a_device_on_its_own_file_system_removed_under_load_can_be_unmounted_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_config(d, true);
    // The second device is a tmpfs at ssd2/ in a private mount namespace: the unmount
    // succeeds only when no descriptor of it is open.
    let mut fs = SmallFs::with_mounts(d, &[("ssd2", "16m")]);
    let a = fs.serve("c.toml", &[]).unwrap();
    let api = a.api.clone().unwrap();
    qemu_io_ok(&a.uri("vm1"), &WRITE);
    let st = common::cache_status_json(&api, &d.join("cache.img.meta"));
    assert!(st["devices"][1]["cached_blocks"].as_u64().unwrap() > 0, "{st}");
    assert_ne!(fs.run("umount ssd2"), 0, "in use: not unmounted");
    let fio = fio_verified(&a.uri("vm1"), &["--offset=8M", "--size=4M", "--loops=3", "--rate_iops=1500"]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (ok, out) = remove_at(d, &api, &d.join("ssd2/dev1.img"));
    assert!(ok, "{out}");
    // Pulled while fio still writes: every descriptor of it was closed.
    assert_eq!(fs.run("umount ssd2"), 0, "unmounting the removed device");
    fio.wait_ok();
    qemu_io_ok(&a.uri("vm1"), &READ);
    // A SIGKILL with the device gone: the start leaves it out, every byte there.
    assert!(a.signal("KILL", std::time::Duration::from_secs(10)));
    let b = fs.serve("c.toml", &[]).unwrap();
    qemu_io_ok(&b.uri("vm1"), &READ);
    fio_verified(&b.uri("vm1"), &["--offset=8M", "--size=4M", "--verify_only"]).wait_ok();
    // A new device mounted there and added back online: used again.
    assert_eq!(fs.run("mount -t tmpfs -o size=16m tmpfs ssd2"), 0);
    let token = d.join("cache.img.meta/api-token");
    let api = b.api.clone().unwrap();
    let dev = d.join("ssd2/dev1.img");
    let (ok, out) = cachevisor(&[
        "cache",
        "add",
        dev.to_str().unwrap(),
        "--size",
        "8MiB",
        "--api",
        &api,
        "--token-file",
        token.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    qemu_io_ok(&b.uri("vm1"), &["write -P 0x65 16M 6M", "read -P 0x65 16M 6M"]);
    let st = common::cache_status_json(&api, &d.join("cache.img.meta"));
    assert!(st["devices"][1]["cached_blocks"].as_u64().unwrap() > 0, "{st}");
    qemu_io_ok(&b.uri("vm1"), &READ);
}
