//! A cache over several devices (`[cache] path` and `[[cache.device]]`): one allocation
//! over both, with real NBD clients (fio with crc32c verification, qemu-io patterns);
//! a SIGKILL and a warm start serving the dirty blocks on each device; and what a start
//! does when a device changed while the daemon was down — emptied or replaced (its label),
//! or the device list itself — refused with dirty blocks at stake, naming the device and
//! the vDisks, the blocks dropped when clean; a second process using a device refused.

use cachevisor_testkit as common;

use common::{bin, destage, qemu_io, qemu_io_ok, s, Daemon, ServeConfig};
use std::path::Path;
use std::process::Command;

/// `cache.img` (8 MiB) and `ssd2/dev1.img` (`dev_size`), write-back vDisk vm1 of 32 MiB,
/// no background write-back (dirty blocks stay in the cache), one copy of dirty data
/// (`mirror_dirty = false`: these tests are about blocks only one device holds;
/// `cache_mirror.rs` has the mirrored ones).
fn write_config(d: &Path, dev_size: Option<&str>) {
    write_split(d, "8MiB", dev_size)
}

/// [`write_config`] with `cache.img` of `size`.
fn write_split(d: &Path, size: &str, dev_size: Option<&str>) {
    let devices: Vec<(&str, &str)> = dev_size.map(|z| ("ssd2/dev1.img", z)).into_iter().collect();
    write_devices(d, size, &devices);
}

/// [`write_config`] with `cache.img` of `size` and `devices` (path, size) after it.
fn write_devices(d: &Path, size: &str, devices: &[(&str, &str)]) {
    let mut c = ServeConfig::new(size).no_writeback().api().section("prewarm", "snapshot_every", "0").vdisk(
        "vm1",
        "vm1.img",
        &[("size", s("32MiB")), ("write_policy", s("wb"))],
    );
    if !devices.is_empty() {
        c = c.cache("mirror_dirty", false);
    }
    for (path, size) in devices {
        std::fs::create_dir_all(d.join(path).parent().unwrap()).unwrap();
        c = c.array_item("cache.device", &[("path", s(path)), ("size", s(size))]);
    }
    c.write(d, "c.toml");
}

/// `cachevisor cache status --json` of `a`.
fn cache_status(d: &Path, a: &Daemon) -> serde_json::Value {
    common::cache_status_json(a.api.as_deref().unwrap(), &d.join("cache.img.meta"))
}

/// 12 MiB of patterns: more than either device holds (8 MiB each).
fn write_patterns(a: &Daemon) {
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x31 0 6M", "write -P 0x32 6M 6M"]);
}

/// A daemon on two 8 MiB devices in `d`, the patterns written (dirty, on both).
fn started_with_patterns(d: &Path) -> Daemon {
    write_config(d, Some("8MiB"));
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    write_patterns(&a);
    a
}

/// [`started_with_patterns`], SIGKILLed: the second device's path and bytes.
fn killed_with_patterns(d: &Path) -> (std::path::PathBuf, Vec<u8>) {
    started_with_patterns(d).kill9();
    let dev = d.join("ssd2/dev1.img");
    let kept = std::fs::read(&dev).unwrap();
    (dev, kept)
}

fn reads_back(a: &Daemon) {
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x31 0 6M", "read -P 0x32 6M 6M"]);
}

/// A start in `d` is refused for the second device (`why`), naming vm1's dirty blocks,
/// the way out, and that nothing was changed.
fn refused_naming_vm1(d: &Path, why: &str) {
    refused_naming(d, why);
    let e = Daemon::start(d, "c.toml", &[]).err().expect("refused");
    assert!(e.output.contains("cache.device[0].path"), "{}", e.output);
}

/// A start in `d` is refused (`why`), naming vm1's dirty blocks, the way out, and that
/// nothing was changed.
fn refused_naming(d: &Path, why: &str) {
    let e = Daemon::start(d, "c.toml", &[]).err().expect("refused");
    for part in [why, "`vm1`", "--discard-dirty vm1", "Nothing was changed"] {
        assert!(e.output.contains(part), "{part}: {}", e.output);
    }
}

/// Whether the backing file holds only zeros in its first 12 MiB (nothing written back).
fn backing_untouched(d: &Path) -> bool {
    let b = std::fs::read(d.join("vm1.img")).unwrap();
    b[..12 << 20].iter().all(|&x| x == 0)
}

#[test]
fn two_devices_are_one_cache_under_verified_writes_and_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut a = started_with_patterns(d);
    assert!(!a.log().contains("devices changed") && !a.log().contains("cold start"), "a new cache: {}", a.log());
    let st = cache_status(d, &a);
    assert_eq!(st["size_bytes"].as_u64(), Some(16 << 20), "{st}");
    let devs = st["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 2, "{st}");
    let on: Vec<u64> = devs.iter().map(|v| v["cached_blocks"].as_u64().unwrap()).collect();
    assert!(on[0] > 0 && on[1] > 0, "both devices hold blocks: {on:?}");
    assert_eq!(on.iter().sum::<u64>(), st["cached_blocks"].as_u64().unwrap());
    assert!(st["dirty_blocks"].as_u64().unwrap() >= 3072, "write-back: 12 MiB dirty: {st}");
    // Each device file carries its blocks after its 4 KiB label.
    assert_eq!(std::fs::metadata(d.join("ssd2/dev1.img")).unwrap().len(), 4096 + (8 << 20));
    reads_back(&a);
    // A SIGKILL with dirty blocks on both devices: the start is warm and serves them.
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x33 0 2M"]); // the newest write wins
    a.kill9();
    assert!(backing_untouched(d), "the patterns are only in the cache");
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x33 0 2M", "read -P 0x31 2M 4M", "read -P 0x32 6M 6M"]);
    let st = cache_status(d, &a);
    let devs = st["devices"].as_array().unwrap();
    assert!(devs.iter().all(|v| v["cached_blocks"].as_u64().unwrap() > 0), "{st}");
    assert!(st["dirty_blocks"].as_u64().unwrap() >= 3072, "still dirty after the restart: {st}");
    // fio's verified random writes over the rest of the disk, through both devices and
    // past their room (evictions write back).
    let out = Command::new("fio")
        .args(["--name=v", "--ioengine=nbd", &format!("--uri={}", a.uri("vm1")), "--rw=randwrite", "--bs=4k"])
        .args(["--offset=16M", "--size=16M", "--iodepth=8", "--loops=2", "--verify=crc32c", "--verify_fatal=1"])
        .args(["--do_verify=1", "--output-format=terse"])
        .output()
        .expect("fio (apt-get install fio)");
    assert!(out.status.success(), "fio: {}", String::from_utf8_lossy(&out.stderr));
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x33 0 2M", "read -P 0x31 2M 4M", "read -P 0x32 6M 6M"]);
    drop(a);
}

#[test]
fn a_device_replaced_while_down_is_refused_with_dirty_blocks_and_dropped_when_clean() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (dev, kept) = killed_with_patterns(d);
    // The second device emptied while the daemon was down (its file truncated and
    // extended: zeros where its label and blocks were).
    let f = std::fs::OpenOptions::new().write(true).open(&dev).unwrap();
    f.set_len(0).unwrap();
    f.set_len(kept.len() as u64).unwrap();
    drop(f);
    refused_naming_vm1(d, "is not the cache store");
    // Put back: served warm, every byte.
    std::fs::write(&dev, &kept).unwrap();
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    reads_back(&a);
    // Written back (all clean), stopped, the device emptied again: its blocks are dropped,
    // the start says so, and every byte still reads back (from the backing store).
    let (ok, out) = destage(a.api.as_deref().unwrap(), &d.join("cache.img.meta/api-token"));
    assert!(ok, "{out}");
    assert_eq!(cache_status(d, &a)["dirty_blocks"].as_u64(), Some(0));
    drop(a);
    std::fs::write(&dev, vec![0u8; kept.len()]).unwrap();
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    let log = a.log();
    assert!(log.contains("cold start of cache.device[0].path"), "{log}");
    let st = cache_status(d, &a);
    let devs = st["devices"].as_array().unwrap();
    assert_eq!(devs[1]["cached_blocks"].as_u64(), Some(0), "{st}");
    assert!(devs[0]["cached_blocks"].as_u64().unwrap() > 0, "the first device's blocks stay: {st}");
    reads_back(&a);
}

#[test]
fn a_device_missing_at_start_with_the_only_copy_of_dirty_blocks_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (dev, kept) = killed_with_patterns(d);
    std::fs::remove_file(&dev).unwrap();
    refused_naming_vm1(d, "is missing");
    assert!(!dev.exists(), "nothing created there");
    // Put back (as the operator's copy would be: private): served warm, every byte.
    std::fs::write(&dev, &kept).unwrap();
    std::fs::set_permissions(&dev, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mut a = Daemon::start(d, "c.toml", &[]).unwrap();
    reads_back(&a);
    a.kill9();
    // Gone again, its dirty blocks discarded deliberately: the start runs without it;
    // what the first device holds still reads back.
    std::fs::remove_file(&dev).unwrap();
    let a = Daemon::start(d, "c.toml", &["--discard-dirty", "vm1"]).unwrap();
    assert!(a.log().contains("dropped by --discard-dirty"), "{}", a.log());
    let st = cache_status(d, &a);
    assert_eq!(st["devices"][1]["failed"].as_bool(), Some(true), "{st}");
    let (ok, out) = qemu_io(&a.uri("vm1"), &["read -P 0x31 0 6M", "read -P 0x32 6M 6M"]);
    assert!(!ok, "the discarded blocks are gone: {out}");
}

#[test]
fn a_changed_device_list_keeps_the_devices_still_there_warm_and_a_second_process_is_kept_off() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut a = started_with_patterns(d);
    // Another daemon with the second device as its cache store: refused, in use.
    let other = tempfile::tempdir().unwrap();
    ServeConfig::new("8MiB")
        .cache("path", d.join("ssd2/dev1.img").display().to_string())
        .cache("metadata", other.path().join("meta").display().to_string())
        .vdisk("x", "x.img", &[("size", s("8MiB"))])
        .write(other.path(), "o.toml");
    let e = Daemon::start(other.path(), "o.toml", &[]).err().expect("refused");
    assert!(e.output.contains("in use"), "{}", e.output);
    a.kill9();
    let cached = |a: &Daemon| -> Vec<u64> {
        let st = cache_status(d, a);
        st["devices"].as_array().unwrap().iter().map(|v| v["cached_blocks"].as_u64().unwrap()).collect()
    };
    // The second device resized while down, or dropped from the config, with dirty blocks
    // only it held: refused, naming them.
    write_config(d, Some("4MiB"));
    refused_naming(d, "resized");
    write_config(d, None);
    refused_naming(d, "not in the config now");
    // A third device added while down: the two keep every block (dirty ones too), the new
    // one joins.
    write_devices(d, "8MiB", &[("ssd2/dev1.img", "8MiB"), ("ssd3/dev2.img", "4MiB")]);
    let mut a = Daemon::start(d, "c.toml", &[]).unwrap();
    let before = cached(&a);
    assert!(before[0] > 0 && before[1] > 0 && before[2] == 0, "{before:?}");
    assert!(cache_status(d, &a)["dirty_blocks"].as_u64().unwrap() >= 3072);
    reads_back(&a);
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x34 16M 2M"]); // lands on the new one too
    assert!(cached(&a)[2] > 0, "the new device is used: {:?}", cached(&a));
    a.kill9();
    // The second and third swapped in the list: each found by its label, its blocks with it.
    write_devices(d, "8MiB", &[("ssd3/dev2.img", "4MiB"), ("ssd2/dev1.img", "8MiB")]);
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    let after = cached(&a);
    assert_eq!((after[0], after[2]), (before[0], before[1]), "moved with their devices: {before:?} → {after:?}");
    assert!(a.log().contains("moved in the list"), "{}", a.log());
    reads_back(&a);
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x34 16M 2M"]);
    // Written back, stopped, the 8 MiB device removed from the config: its clean blocks
    // are dropped and the start says so; the others stay warm.
    let (ok, out) = destage(a.api.as_deref().unwrap(), &d.join("cache.img.meta/api-token"));
    assert!(ok, "{out}");
    drop(a);
    write_devices(d, "8MiB", &[("ssd3/dev2.img", "4MiB")]);
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    let log = a.log();
    assert!(log.contains("the cache's devices changed") && log.contains("clean blocks were dropped"), "{log}");
    assert_eq!(cached(&a), vec![after[0], after[1]], "the devices still there keep their blocks");
    reads_back(&a);
    drop(a);
    // The first device resized: every recorded device counts as gone (clean: dropped).
    write_devices(d, "12MiB", &[("ssd3/dev2.img", "4MiB")]);
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    assert!(a.log().contains("the cache's devices changed"), "{}", a.log());
    assert_eq!(cache_status(d, &a)["cached_blocks"].as_u64(), Some(0));
    reads_back(&a);
    assert!(!qemu_io(&a.uri("vm1"), &["read -P 0x99 0 4k"]).0, "a wrong pattern fails (the check can fail)");
}

#[test]
fn a_device_failing_under_a_client_is_dropped_and_its_clean_blocks_are_read_from_the_backing_store() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("ssd2")).unwrap();
    ServeConfig::new("8MiB")
        .cache("error_threshold", 4)
        .api()
        .section("prewarm", "snapshot_every", "0")
        .vdisk("vm1", "vm1.img", &[("size", s("32MiB")), ("write_policy", s("wt"))])
        .array_item("cache.device", &[("path", s("ssd2/dev1.img")), ("size", s("8MiB"))])
        .write(d, "c.toml");
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    write_patterns(&a); // write-through: every block clean, on both devices
    reads_back(&a);
    let st = cache_status(d, &a);
    assert!(st["devices"][1]["cached_blocks"].as_u64().unwrap() > 0, "{st}");
    // The second device loses its bytes under the daemon (its file cut to nothing): every
    // read of a block there fails from now on.
    std::fs::OpenOptions::new().write(true).open(d.join("ssd2/dev1.img")).unwrap().set_len(0).unwrap();
    // A client reading everything sees every byte: a failed read drops its clean block
    // and is tried again from the backing store; past 4 errors the device is dropped.
    reads_back(&a);
    reads_back(&a);
    let st = cache_status(d, &a);
    assert_eq!(st["devices"][1]["failed"].as_bool(), Some(true), "{st}");
    assert_eq!(st["devices"][1]["cached_blocks"].as_u64(), Some(0), "{st}");
    assert_eq!(st["devices"][0]["failed"].as_bool(), Some(false), "{st}");
    let log = a.log();
    assert!(log.contains("a cache device failed past the error threshold and was dropped"), "{log}");
    // The vDisk keeps its cache on the first device: not in pass-through, and new blocks
    // go there.
    let o = Command::new(bin())
        .args(["status", "--api", a.api.as_deref().unwrap()])
        .env_remove("CACHEVISOR_API_TOKEN")
        .output()
        .unwrap();
    // `status` exits 5 when a vDisk runs in pass-through.
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x41 12M 4M", "read -P 0x41 12M 4M"]);
    reads_back(&a);
    assert_eq!(cache_status(d, &a)["devices"][1]["cached_blocks"].as_u64(), Some(0));
}
