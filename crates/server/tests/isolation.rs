//! Data integrity and isolation, with real clients: no snapshot, image size or
//! backing can make one vDisk read another's data or lose bytes that exist.
//! - a snapshot naming block 2^48 + 5 of one vDisk (which a 48-bit block key would turn
//!   into block 5 of the next) leaves the other vDisk's block 5 its own, before and after
//!   a warm restart;
//! - an image whose size is not a multiple of the block size (nor of 512) reads back
//!   whole through `qemu-img convert` (as a whole last sector, QEMU's view of it) and
//!   takes writes to its last bytes, and the file keeps its size;
//! - a vDisk with more blocks than a key can name is refused at start, naming the fix;
//! - a prewarm from a larger disk's snapshot skips the blocks past the end and counts
//!   them: no device error, no pass-through.

mod common;
use cachevisor_prewarm::{RoaringTreemap, Snapshot};
use cachevisor_server::config::Config;
use cachevisor_server::service::start;
use common::*;
use std::path::Path;

/// Writes a snapshot holding `sets` (vDisk name → blocks) of 4 KiB blocks into `dir`.
fn snapshot(dir: &Path, sets: &[(&str, &[u64])]) {
    let mut s = Snapshot::new(1, 0, 4096);
    for (name, blocks) in sets {
        s.sets.insert(name.to_string(), blocks.iter().copied().collect::<RoaringTreemap>());
    }
    cachevisor_server::snapshot_files::write(dir, &s, 4).unwrap();
}

/// A config of two write-through vDisks (so the data is on the images even without the
/// cache) served once: vm2's block 5 written 0xa5 and, with `vm1_too`, vm1's block 7
/// written 0x17; then a clean stop.
fn two_vdisks_written(dir: &Path, vm1_too: bool) -> Config {
    let cfg = config(dir, "1MiB", &[("vm1", "1MiB", "wt"), ("vm2", "1MiB", "wt")]);
    let r = serve(&cfg);
    let (mut c, _) = Client::connect(r.tcp.unwrap(), "vm2");
    c.write(5 * 4096, &[0xa5; 4096], true).unwrap();
    if vm1_too {
        let (mut c1, _) = Client::connect(r.tcp.unwrap(), "vm1");
        c1.write(7 * 4096, &[0x17; 4096], true).unwrap();
    }
    r.daemon.shutdown().unwrap();
    cfg
}

#[test]
fn a_snapshot_block_past_the_key_range_never_becomes_another_vdisks_block() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = two_vdisks_written(dir.path(), true);
    // A fresh cache over the same images (vm2's block 5 is on its backing store only).
    std::fs::remove_file(dir.path().join("cache.img")).unwrap();
    std::fs::remove_dir_all(dir.path().join("cache.img.meta")).unwrap();
    let snaps = dir.path().join("hostile");
    std::fs::create_dir(&snaps).unwrap();
    snapshot(&snaps, &[("vm1", &[(1 << 48) + 5, 7])]);
    let r = serve(&cfg);
    std::sync::Arc::clone(&r.daemon).start_prewarm(&snaps).unwrap();
    let p = prewarm_done(&r);
    assert_eq!((p.loaded_blocks, p.out_of_range_blocks, p.error.as_deref()), (1, 1, None), "{p:?}");
    assert_eq!(p.matched_vdisks, ["vm1"]);
    let (mut c, _) = Client::connect(r.tcp.unwrap(), "vm2");
    assert!(c.read(5 * 4096, 4096).unwrap() == vec![0xa5; 4096], "vm2's block 5 is its own");
    let (mut c1, _) = Client::connect(r.tcp.unwrap(), "vm1");
    assert!(c1.read(7 * 4096, 4096).unwrap() == vec![0x17; 4096]);
    assert_eq!(r.daemon.stats(0).hit_blocks, 1, "vm1's block 7 was prewarmed");
    // After a warm restart too.
    r.daemon.shutdown().unwrap();
    drop((c, c1, r));
    let r = serve(&cfg);
    let (mut c, _) = Client::connect(r.tcp.unwrap(), "vm2");
    assert!(c.read(5 * 4096, 4096).unwrap() == vec![0xa5; 4096], "after a restart");
    assert_eq!(r.daemon.stats(1).errors, 0);
}

/// A config over existing images `disks` (name, write policy) with no `size` key.
fn config_existing(dir: &Path, disks: &[(&str, &str)]) -> Config {
    let mut c = ServeConfig::new("1MiB").no_writeback();
    for (name, wp) in disks {
        c = c.vdisk(name, &format!("{name}.img"), &[("write_policy", s(wp))]);
    }
    parse(dir, &c)
}

#[test]
fn an_image_of_any_size_reads_back_whole_and_takes_writes_to_its_last_bytes() {
    let dir = tempfile::tempdir().unwrap();
    // 1,000,000 bytes: 244 whole 4 KiB blocks and 576 bytes, the last sector 64 bytes. It
    // is served as 1,000,448 bytes (QEMU's own view of it: a whole last sector).
    let image: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let served = [&image[..], &[0; 448][..]].concat();
    for wp in ["wb", "wt", "ro"] {
        std::fs::write(dir.path().join(format!("{wp}.img")), &image).unwrap();
    }
    let cfg = config_existing(dir.path(), &[("wb", "wb"), ("wt", "wt"), ("ro", "ro")]);
    let r = serve(&cfg);
    let addr = r.tcp.unwrap();
    for (vm, wp) in ["wb", "wt", "ro"].iter().enumerate() {
        // The whole image through qemu-img (twice: a miss, then the cache's copy).
        for pass in 0..2 {
            let out = dir.path().join(format!("{wp}-{pass}.raw"));
            let o = tool("timeout")
                .args(["60", "qemu-img", "convert", "-f", "raw", "-O", "raw"])
                .args([&format!("nbd://{addr}/{wp}"), out.to_str().unwrap()])
                .output()
                .unwrap();
            assert!(o.status.success(), "qemu-img convert: {}", String::from_utf8_lossy(&o.stderr));
            assert!(std::fs::read(&out).unwrap() == served, "{wp}: pass {pass} differs");
        }
        let (mut c, size) = Client::connect(addr, wp);
        assert_eq!(size, 1_000_448);
        assert!(c.read(999_488, 960).unwrap() == served[999_488..]);
        // The last 10 bytes, then the last sector's 64, unaligned.
        c.write(999_990, &[0xee; 10], false).unwrap();
        c.write(999_936, &[0xdd; 54], true).unwrap();
        let mut want = served.clone();
        want[999_936..999_990].fill(0xdd);
        want[999_990..1_000_000].fill(0xee);
        assert!(c.read(999_424, 1024).unwrap() == want[999_424..], "{wp}: the last block");
        assert_eq!(c.read(1_000_448, 1), Err(cachevisor_nbd::proto::EINVAL), "past the end");
        let s = r.daemon.stats(vm as u32);
        assert!(s.errors == 0 && !s.passthrough, "{wp}: {s:?}");
    }
    // Bytes written past the file's end, inside its last sector, are kept: the file grows.
    let (mut c, _) = Client::connect(addr, "wt");
    c.write(1_000_100, &[0x77; 8], true).unwrap();
    r.daemon.destage_all(None, &mut |_, _| {}).unwrap();
    r.daemon.shutdown().unwrap();
    drop((c, r));
    for wp in ["wb", "wt", "ro"] {
        let got = std::fs::read(dir.path().join(format!("{wp}.img"))).unwrap();
        let want = [&image[999_930..999_936], &[0xdd; 54][..], &[0xee; 10][..]].concat();
        assert!(got[999_930..1_000_000] == want, "{wp}");
        if wp == "wt" {
            assert!(got.len() == 1_000_108 && got[1_000_100..] == [0x77; 8] && got[1_000_000..1_000_100] == [0; 100]);
        } else {
            assert_eq!(got.len(), 1_000_000, "{wp}: the image keeps its size");
        }
    }
}

#[test]
fn a_new_image_of_a_size_between_blocks_is_served_whole() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "1MiB", &[("odd", "16778240B", "wb")]);
    let r = serve(&cfg);
    let (mut c, size) = Client::connect(r.tcp.unwrap(), "odd");
    assert_eq!(size, 16_778_240);
    c.write(16_778_240 - 1024, &[9; 1024], true).unwrap();
    let got = c.read(16_778_240 - 4096, 4096).unwrap();
    assert!(got == [vec![0; 3072], vec![9; 1024]].concat());
    r.daemon.destage_all(None, &mut |_, _| {}).unwrap();
    r.daemon.shutdown().unwrap();
    drop(r);
    let got = std::fs::read(dir.path().join("odd.img")).unwrap();
    assert_eq!(got.len(), 16_778_240);
    assert!(got[got.len() - 1024..] == [9; 1024]);
}

#[test]
fn a_vdisk_with_more_blocks_than_a_key_names_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    // 512-byte blocks: a key names 2^48 of them, 128 PiB.
    let mut cfg = config(dir.path(), "1MiB", &[("big", "262144TiB", "wb")]);
    cfg.cache.block_size = "512B".into();
    let e = start(&cfg).err().unwrap().to_string();
    assert!(e.contains("vdisk[0] (big).size") && e.contains("larger block size"), "{e}");
    assert!(!dir.path().join("big.img").exists(), "nothing created");
    // The same over an NBD backing of that size (nbdkit's sparse memory plugin).
    let nbd_cfg = |port: u16| {
        let c =
            ServeConfig::new("1MiB").cache("block_size", "512B").vdisk("big", &format!("nbd://127.0.0.1:{port}/"), &[]);
        parse(dir.path(), &c)
    };
    let (kit, port) = nbdkit_memory("256P", &[], &[]);
    let e = start(&nbd_cfg(port)).err().unwrap().to_string();
    assert!(e.contains("big") && e.contains("larger block size"), "{e}");
    drop(kit);
    // 128 PiB fits: served, and its last block works.
    let (_kit, port) = nbdkit_memory("128P", &[], &[]);
    let r = start(&nbd_cfg(port)).unwrap();
    let (mut c, size) = Client::connect(r.tcp.unwrap(), "big");
    assert_eq!(size, 1 << 57);
    c.write((1 << 57) - 512, &[3; 512], true).unwrap();
    assert!(c.read((1 << 57) - 512, 512).unwrap() == [3; 512]);
    assert_eq!(r.daemon.stats(0).errors, 0);
    assert!(r.daemon.status().iter().all(|v| v.used_blocks <= 2048), "no underflow in the vDisk list");
}

#[test]
fn a_prewarm_from_a_larger_disk_skips_what_is_past_the_end_and_keeps_the_cache_on() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "1MiB", &[("vm1", "1MiB", "wb")]);
    let snaps = dir.path().join("larger");
    std::fs::create_dir(&snaps).unwrap();
    // 1 MiB is 256 blocks: 4 of these exist, 20 are past the end; one set names no vDisk.
    let blocks: Vec<u64> = (252..256).chain(1000..1020).collect();
    snapshot(&snaps, &[("vm1", &blocks), ("elsewhere", &[1, 2])]);
    let r = serve(&cfg);
    std::sync::Arc::clone(&r.daemon).start_prewarm(&snaps).unwrap();
    let p = prewarm_done(&r);
    assert_eq!((p.planned_blocks, p.loaded_blocks, p.out_of_range_blocks), (4, 4, 20), "{p:?}");
    assert_eq!(
        (p.matched_vdisks.as_slice(), p.unmatched_sets.as_slice()),
        (&["vm1".to_string()][..], &["elsewhere".to_string()][..])
    );
    let s = r.daemon.stats(0);
    assert!(s.errors == 0 && !s.passthrough, "{s:?}");
    let (mut c, _) = Client::connect(r.tcp.unwrap(), "vm1");
    c.read(252 * 4096, 4 * 4096).unwrap();
    assert_eq!(r.daemon.stats(0).hit_blocks, 4, "the prewarmed blocks hit: the cache is on");
}

/// A journal record naming a block past its vDisk (written by hand, or by a bug): one past
/// the key's range refuses the start naming the slot; one past the disk's end is dropped
/// when clean and refuses the start when dirty — never another vDisk's block.
#[test]
fn a_journal_record_past_a_vdisks_end_is_refused_or_dropped_never_aliased() {
    use cachevisor_store::journal::Record;
    let dir = tempfile::tempdir().unwrap();
    let cfg = two_vdisks_written(dir.path(), false);
    let j = dir.path().join("cache.img.meta/journal");
    let clean = std::fs::read(&j).unwrap();
    let with = |block: u64, dirty: u64| {
        let mut b = clean.clone();
        Record::Slot { slot: 200, vm: 0, block, valid: vec![0xff], dirty: vec![dirty], sums: None }.encode(&mut b);
        std::fs::write(&j, b).unwrap();
    };
    with((1 << 48) + 5, 0);
    let e = start(&cfg).err().unwrap().to_string();
    assert!(e.contains("slot 200") && e.contains("past its last block"), "{e}");
    with(300, 0xff);
    let e = start(&cfg).err().unwrap().to_string();
    assert!(e.contains("vm1") && e.contains("past the end") && e.contains("--discard-dirty vm1"), "{e}");
    with(300, 0);
    let r = start(&cfg).unwrap();
    let (mut c, _) = Client::connect(r.tcp.unwrap(), "vm2");
    assert!(c.read(5 * 4096, 4096).unwrap() == vec![0xa5; 4096]);
    assert_eq!(r.daemon.occupancy(0).0, 0, "vm1's record past its end was dropped");
}
