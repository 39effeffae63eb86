//! Real NBD clients against the server: qemu-io writing and reading back patterns across
//! hits, misses, evictions and partition resizes, unaligned and partial-block I/O; fio's
//! nbd engine with crc32c verification on several exports at once. The tools come from
//! Debian's qemu-utils and fio (`.ci/run` installs them).

mod common;
use common::*;

/// Runs qemu-io commands against `uri`; fails on a non-zero exit or a failed verification.
fn qemu_io(uri: &str, cmds: &[String]) -> String {
    let mut c = tool("qemu-io");
    c.args(["-f", "raw"]);
    for x in cmds {
        c.args(["-c", x]);
    }
    let o = c.arg(uri).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success() && !text.contains("failed") && !text.contains("error"), "qemu-io {cmds:?}:\n{text}");
    text
}

#[test]
fn qemu_io_patterns_survive_misses_evictions_and_resizes() {
    let dir = tempfile::tempdir().unwrap();
    // 1 MiB of cache (256 blocks) for two 16 MiB disks: most of what is written is evicted.
    let r = serve(&config(dir.path(), "1MiB", &[("wb", "16MiB", "wb"), ("wt", "16MiB", "wt")]));
    let addr = r.tcp.unwrap();
    for (vm, name) in [(0u32, "wb"), (1, "wt")] {
        let uri = format!("nbd://{addr}/{name}");
        // 128 chunks of 64 KiB with distinct patterns: 8 MiB through a 512 KiB partition.
        let writes: Vec<String> = (0..128).map(|i| format!("write -P {} {} 64k", i + 1, i * 128 * 1024)).collect();
        qemu_io(&uri, &writes);
        let (used, dirty) = r.daemon.occupancy(vm);
        assert!(used > 0 && used <= 128, "{name}: {used} blocks held");
        if name == "wt" {
            assert_eq!(dirty, 0);
        }
        let reads: Vec<String> = (0..128).map(|i| format!("read -P {} {} 64k", i + 1, i * 128 * 1024)).collect();
        qemu_io(&uri, &reads);
        // Hits: re-read the last chunk twice.
        qemu_io(
            &uri,
            &[format!("read -P 128 {} 64k", 127 * 128 * 1024), format!("read -P 128 {} 64k", 127 * 128 * 1024)],
        );
        let s = r.daemon.stats(vm);
        assert!(s.hit_blocks > 0 && s.hit_blocks < s.blocks, "{name}: {s:?}");
        // Unaligned and partial-block I/O over chunk boundaries.
        qemu_io(&uri, &["write -P 0xee 131000 700".into(), "write -P 0xdd 1 5".into(), "write -P 0xcc 4095 2".into()]);
        qemu_io(
            &uri,
            &[
                "read -P 0xee 131000 700".into(),
                "read -P 1 0 1".into(),
                "read -P 0xdd 1 5".into(),
                "read -P 1 6 4089".into(),
                "read -P 0xcc 4095 2".into(),
                "read -P 1 4097 61439".into(),
                "read -P 0 65536 65464".into(),
                "read -P 2 131700 64908".into(),
            ],
        );
        // Shrink the partition to 8 blocks (dirty blocks written back), read everything, grow.
        r.daemon.resize(vm, 8).unwrap();
        // A shrink skips blocks with ops in flight (a background write-back, say) and gives
        // them up once those end (found flaky under a loaded machine): wait for it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while r.daemon.occupancy(vm).0 > 8 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(r.daemon.occupancy(vm).0 <= 8, "{name}: {:?} after the shrink", r.daemon.occupancy(vm));
        qemu_io(&uri, &reads[2..]);
        r.daemon.resize(vm, 128).unwrap();
        qemu_io(&uri, &reads[2..]);
    }
    // Destaging writes the write-back disk's dirty blocks to its backing file.
    qemu_io(&format!("nbd://{addr}/wb"), &["flush".into()]);
    r.daemon.destage(0).unwrap();
    assert_eq!(r.daemon.occupancy(0).1, 0);
    let backing = std::fs::read(dir.path().join("wb.img")).unwrap();
    assert!(backing[2 * 128 * 1024..2 * 128 * 1024 + 65536].iter().all(|&b| b == 3));
    assert!(backing[131000..131700].iter().all(|&b| b == 0xee));
}

#[test]
fn fio_verifies_random_io_on_two_exports_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let r = serve(&config(dir.path(), "2MiB", &[("a", "32MiB", "wb"), ("b", "32MiB", "wt")]));
    let addr = r.tcp.unwrap();
    let jobs: Vec<_> = ["a", "b"]
        .iter()
        .map(|name| {
            tool("fio")
                .args([
                    "--name=verify",
                    "--ioengine=nbd",
                    &format!("--uri=nbd://{addr}/{name}"),
                    "--rw=randrw",
                    "--bs=4k",
                    "--size=16m",
                    "--iodepth=4",
                    "--verify=crc32c",
                    "--do_verify=1",
                    "--verify_fatal=1",
                    "--output-format=terse",
                ])
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut j in jobs {
        assert!(j.wait().unwrap().success(), "fio reported an error or a verify failure");
    }
    for vm in 0..2 {
        let s = r.daemon.stats(vm);
        assert!(s.reads > 0 && s.writes > 0 && s.errors == 0, "{s:?}");
    }
}

#[test]
fn qemu_io_discard_drops_cached_sectors_and_punches_the_backing_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("wb.img"), vec![0xaau8; 1 << 20]).unwrap();
    let cfg = config(dir.path(), "4MiB", &[("wb", "1MiB", "wb")]);
    let check = |uri: &str| {
        qemu_io(
            uri,
            &[
                "read -P 0x55 0 4608".into(),
                "read -P 0 4608 28160".into(),
                "read -P 0x55 32768 32768".into(),
                "read -P 0xaa 65536 65536".into(),
            ],
        );
    };
    {
        let r = serve(&cfg);
        let uri = format!("nbd://{}/wb", r.tcp.unwrap());
        qemu_io(&uri, &["write -P 0x55 0 64k".into()]);
        assert_eq!(r.daemon.occupancy(0), (16, 16));
        // Sectors 9..64: block 1 loses its last 7 sectors, blocks 2..8 leave the cache
        // (dirty, never written back). The trimmed range then reads the punched backing.
        qemu_io(&uri, &["discard 4608 28160".into(), "flush".into()]);
        assert_eq!(r.daemon.occupancy(0), (10, 10));
        // Unaligned ends are left alone: nothing of sector 0 is dropped.
        qemu_io(&uri, &["discard 100 300".into()]);
        assert_eq!(r.daemon.occupancy(0), (10, 10));
        assert_eq!(r.daemon.stats(0).trims, 2);
        // Abandoned without a shutdown: the journal carries the discard.
    }
    let r = serve(&cfg);
    assert_eq!(r.daemon.occupancy(0), (10, 10));
    let uri = format!("nbd://{}/wb", r.tcp.unwrap());
    check(&uri);
    r.daemon.destage(0).unwrap();
    let b = std::fs::read(dir.path().join("wb.img")).unwrap();
    assert!(
        b[..4608].iter().all(|&x| x == 0x55)
            && b[4608..32768].iter().all(|&x| x == 0)
            && b[32768..65536].iter().all(|&x| x == 0x55)
    );
    assert!(b[65536..].iter().all(|&x| x == 0xaa));
}

#[test]
fn the_cache_store_is_o_direct_where_the_filesystem_allows_it() {
    use cachevisor_server::config::DirectIo;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut cfg = config(dir.path(), "1MiB", &[("d", "8MiB", "wb")]);
    cfg.cache.direct = DirectIo::On;
    let r = match cachevisor_server::service::start(&cfg) {
        Ok(r) => r,
        Err(e) => {
            // tmpfs and some filesystems refuse O_DIRECT: `on` must say so, `auto` falls back.
            assert!(e.to_string().contains("O_DIRECT"), "{e}");
            cfg.cache.direct = DirectIo::Auto;
            assert!(!serve(&cfg).daemon.direct_io());
            eprintln!(
                "O_DIRECT is not available under {}: checked the refusal and the fallback only",
                dir.path().display()
            );
            return;
        }
    };
    assert!(r.daemon.direct_io());
    let uri = format!("nbd://{}/d", r.tcp.unwrap());
    // Sector-sized and sub-sector I/O through unaligned client buffers, hits and misses.
    qemu_io(
        &uri,
        &[
            "write -P 0x11 0 64k".into(),
            "write -P 0x22 1 5".into(),
            "write -P 0x33 4095 1026".into(),
            "write -P 0x44 1m 4k".into(),
        ],
    );
    let reads = [
        "read -P 0x11 0 1".to_string(),
        "read -P 0x22 1 5".into(),
        "read -P 0x11 6 4089".into(),
        "read -P 0x33 4095 1026".into(),
        "read -P 0x11 5121 60415".into(),
        "read -P 0x44 1m 4k".into(),
    ];
    qemu_io(&uri, &reads);
    r.daemon.resize(0, 4).unwrap(); // evictions write back through the aligned buffers
    qemu_io(&uri, &reads);
    drop(r);
    cfg.cache.direct = DirectIo::Off;
    let r = serve(&cfg);
    assert!(!r.daemon.direct_io());
    qemu_io(&format!("nbd://{}/d", r.tcp.unwrap()), &reads);
}
