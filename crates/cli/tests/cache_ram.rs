//! The RAM tier (`[cache] ram`) with real NBD clients: reads hit in RAM once an SSD hit
//! copied their block there, a write makes the copy go (the next read sees the new
//! bytes), fio's crc32c-verified random reads and writes over more blocks than the tier
//! holds read back every byte, and a SIGKILL loses nothing (the tier held clean copies
//! only; it starts empty).

use cachevisor_testkit as common;

use common::{fio_verified, qemu_io_ok, s, Daemon, ServeConfig};
use std::path::Path;

/// `cache.img` (8 MiB) with a RAM tier of `ram`, write-back vDisk vm1 of 32 MiB.
fn config(d: &Path, ram: &str, fill: Option<&str>) {
    let c = ServeConfig::new("8MiB")
        .no_writeback()
        .cache("ram", s(ram))
        .api()
        .section("prewarm", "snapshot_every", "0")
        .vdisk("vm1", "vm1.img", &[("size", s("32MiB")), ("write_policy", s("wb"))]);
    let c = match fill {
        Some(f) => c.cache("ram_fill", s(f)),
        None => c,
    };
    c.write(d, "c.toml");
}

fn ram(d: &Path, a: &Daemon) -> serde_json::Value {
    common::cache_status_json(a.api.as_deref().unwrap(), &d.join("cache.img.meta"))["ram"].clone()
}

fn metrics(a: &Daemon) -> String {
    ureq::get(&format!("http://{}/metrics", a.api.as_deref().unwrap())).call().unwrap().into_string().unwrap()
}

#[test]
fn an_ssd_hit_fills_ram_a_write_drops_the_copy_and_a_kill_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    config(d, "1MiB", None);
    let mut a = Daemon::start(d, "c.toml", &[]).unwrap();
    let uri = a.uri("vm1");
    // Dirty in the SSD; the first read is an SSD hit that copies each block to RAM, the
    // second is served from RAM.
    qemu_io_ok(&uri, &["write -P 0x11 0 512k"]);
    qemu_io_ok(&uri, &["read -P 0x11 0 512k"]);
    let r = ram(d, &a);
    assert_eq!((r["slots"].as_u64(), r["used"].as_u64()), (Some(256), Some(128)), "{r}");
    assert_eq!(r["hits"].as_u64(), Some(0), "{r}");
    qemu_io_ok(&uri, &["read -P 0x11 0 512k"]);
    let r = ram(d, &a);
    assert_eq!(r["hits"].as_u64(), Some(128), "every block of the second read from RAM: {r}");
    let m = metrics(&a);
    assert_eq!(common::metric(&m, "cachevisor_ram_hit_blocks_total", "vdisk=\"vm1\""), 128.0, "{m}");
    let human = common::cache_status_text(a.api.as_deref().unwrap(), &d.join("cache.img.meta"));
    assert!(human.contains("RAM tier: 256 blocks, 128 held; 128 block reads served from it"), "{human}");
    assert_eq!(common::metric(&m, "cachevisor_ram_blocks", "vdisk=\"vm1\""), 128.0, "{m}");
    assert_eq!(common::metric(&m, "cachevisor_ram_size_blocks", ""), 256.0, "{m}");
    // An overwrite of half of it, and a write of a few bytes inside a block: their copies
    // go, and every read sees the new bytes.
    qemu_io_ok(&uri, &["write -P 0x22 0 256k", "write -P 0x33 300k 512"]);
    assert_eq!(ram(d, &a)["used"].as_u64(), Some(64 - 1), "{}", ram(d, &a));
    for _ in 0..3 {
        qemu_io_ok(&uri, &["read -P 0x22 0 256k", "read -P 0x11 256k 44k", "read -P 0x33 300k 512"]);
        qemu_io_ok(&uri, &["read -P 0x11 307712 204288"]);
    }
    assert!(ram(d, &a)["hits"].as_u64().unwrap() > 128 + 200, "{}", ram(d, &a));
    // SIGKILL: the tier held clean copies of what the cache holds; nothing is lost, and it
    // starts empty.
    a.kill9();
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    assert_eq!(ram(d, &a)["used"].as_u64(), Some(0));
    let uri = a.uri("vm1");
    qemu_io_ok(&uri, &["read -P 0x22 0 256k", "read -P 0x11 256k 44k", "read -P 0x33 300k 512"]);
    qemu_io_ok(&uri, &["read -P 0x11 307712 204288"]);
}

#[test]
fn fio_verified_writes_beside_a_reader_hitting_in_ram_read_back_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // 64 blocks of RAM: a reader hits its 128 KiB in RAM over and over while fio's
    // verified random writes (read back as they go) fill copies, evict the reader's and
    // drop their own as they overwrite them.
    config(d, "256KiB", Some("every-hit"));
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    let uri = a.uri("vm1");
    qemu_io_ok(&uri, &["write -P 0x55 0 128k"]);
    let fio = fio_verified(&uri, &["--offset=8M", "--size=6M", "--loops=3", "--verify_backlog=32"]);
    let reads: Vec<&str> = std::iter::repeat_n("read -P 0x55 0 128k", 40).collect();
    qemu_io_ok(&uri, &reads);
    fio.wait_ok();
    fio_verified(&uri, &["--offset=8M", "--size=6M", "--verify_only"]).wait_ok();
    qemu_io_ok(&uri, &reads[..2]);
    let r = ram(d, &a);
    assert!(r["hits"].as_u64().unwrap() > 32 * 20, "the reader's blocks mostly from RAM: {r}");
    assert!(r["evictions"].as_u64().unwrap() > 0, "fio's copies pushed others out: {r}");
    // The reader's region rewritten while its copies are in RAM: they go, the new bytes
    // are read (from the SSD, then from RAM again).
    qemu_io_ok(&uri, &["write -P 0x66 0 64k", "read -P 0x66 0 64k", "read -P 0x55 64k 64k", "read -P 0x66 0 64k"]);
    let r = ram(d, &a);
    assert_eq!(r["dropped"].as_u64(), Some(16), "{r}");
    // Filled on a block's second SSD hit only.
    drop(a);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    config(d, "256KiB", Some("second-hit"));
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    let uri = a.uri("vm1");
    qemu_io_ok(&uri, &["write -P 0x44 0 128k"]);
    qemu_io_ok(&uri, &["read -P 0x44 0 128k"]);
    assert_eq!(ram(d, &a)["fills"].as_u64(), Some(0), "first SSD hit: remembered only");
    qemu_io_ok(&uri, &["read -P 0x44 0 128k", "read -P 0x44 0 128k"]);
    let r = ram(d, &a);
    assert_eq!((r["fills"].as_u64(), r["hits"].as_u64()), (Some(32), Some(32)), "{r}");
}

#[test]
fn a_bad_ram_setting_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (ram, want) in [
        ("100", "cache.ram: 100 holds no block"),
        ("lots", "cache.ram"),
        ("9MiB", "cache.ram: 9MiB is more than the cache (2048 blocks of 4096 bytes)"),
        ("16TiB", "cache.ram: 16TiB is more than 2^32 blocks"),
    ] {
        config(d, ram, None);
        let e = Daemon::start(d, "c.toml", &[]).err().expect("refused").output;
        assert!(e.contains(want), "{ram}: {e}");
    }
    config(d, "0", Some("second-hit"));
    let e = Daemon::start(d, "c.toml", &[]).err().expect("refused").output;
    assert!(e.contains("cache.ram_fill: there is no RAM tier"), "{e}");
    config(d, "1MiB", Some("third-hit"));
    let e = Daemon::start(d, "c.toml", &[]).err().expect("refused").output;
    assert!(e.contains("ram_fill"), "{e}");
}
