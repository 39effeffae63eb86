//! Warm restarts from the metadata journal: after a stop without any shutdown step (the
//! process state is simply abandoned), a new daemon on the same files comes back with its
//! clean and dirty blocks cached and every flushed write intact; torn journal tails and
//! changed geometry are handled.

mod common;
use common::*;

#[test]
fn a_restart_without_shutdown_is_warm_and_keeps_flushed_writes() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "1MiB", &[("wb", "8MiB", "wb"), ("wt", "8MiB", "wt")]);
    {
        let r = serve(&cfg);
        let addr = r.tcp.unwrap();
        let (mut a, _) = Client::connect(addr, "wb");
        let (mut b, _) = Client::connect(addr, "wt");
        for i in 0..64u64 {
            a.write(i * 4096, &[i as u8 + 1; 4096], false).unwrap();
            b.write(i * 4096, &[i as u8 + 101; 4096], false).unwrap();
        }
        a.flush().unwrap();
        // Read some blocks of the write-through disk so they are cached clean.
        for i in 0..8u64 {
            b.read(i * 4096, 4096).unwrap();
        }
        b.flush().unwrap();
        assert!(r.daemon.occupancy(0).1 > 0, "write-back data is dirty in the cache");
        // Abandon the daemon: no shutdown, no destage.
    }
    let r = serve(&config(dir.path(), "1MiB", &[("wb", "8MiB", "wb"), ("wt", "8MiB", "wt")]));
    let rec = r.daemon.recovery();
    assert!(rec.blocks >= 64 && rec.dirty_blocks >= 1, "{rec:?}");
    let (mut a, _) = Client::connect(r.tcp.unwrap(), "wb");
    let (mut b, _) = Client::connect(r.tcp.unwrap(), "wt");
    for i in 0..64u64 {
        assert_eq!(a.read(i * 4096, 4096).unwrap(), vec![i as u8 + 1; 4096], "wb block {i}");
        assert_eq!(b.read(i * 4096, 4096).unwrap(), vec![i as u8 + 101; 4096], "wt block {i}");
    }
    let s = r.daemon.stats(0);
    assert!(s.hit_blocks > 0, "warm: reads hit right away ({s:?})");
    // The backing file never saw the write-back data: it came from the recovered cache.
    assert!(std::fs::read(dir.path().join("wb.img")).unwrap()[..4096].iter().all(|&x| x == 0));
    r.daemon.destage(0).unwrap();
    assert_eq!(std::fs::read(dir.path().join("wb.img")).unwrap()[..4096], vec![1u8; 4096][..]);
}

#[test]
fn a_torn_journal_tail_is_cut_and_geometry_changes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "1MiB", &[("wb", "8MiB", "wb")]);
    {
        let r = serve(&cfg);
        let (mut a, _) = Client::connect(r.tcp.unwrap(), "wb");
        for i in 0..16u64 {
            a.write(i * 4096, &[7; 4096], false).unwrap();
        }
        a.flush().unwrap();
    }
    // Half a record at the end of the journal, as if the daemon died mid-append.
    let j = dir.path().join("cache.img.meta/journal");
    let mut f = std::fs::OpenOptions::new().append(true).open(&j).unwrap();
    std::io::Write::write_all(&mut f, &[40, 0, 0, 0, 2, 1, 2]).unwrap();
    drop(f);
    let r = serve(&cfg);
    let rec = r.daemon.recovery();
    assert!(rec.torn_tail && rec.blocks == 16 && rec.dirty_blocks == 16, "{rec:?}");
    let (mut a, _) = Client::connect(r.tcp.unwrap(), "wb");
    assert_eq!(a.read(15 * 4096, 4096).unwrap(), vec![7; 4096]);
    drop((a, r));
    // A checkpoint altered on disk: refused, naming it (nothing is guessed).
    let ck = dir.path().join("cache.img.meta/checkpoint");
    let good = std::fs::read(&ck).unwrap();
    let mut bad = good.clone();
    let last = bad.len() - 10;
    bad[last] ^= 0xff;
    std::fs::write(&ck, &bad).unwrap();
    let e = cachevisor_server::service::start(&cfg).err().unwrap().to_string();
    assert!(e.contains("checkpoint") && e.contains("damaged"), "{e}");
    std::fs::write(&ck, &good).unwrap();
    // Another cache size: refused, naming the metadata and what to do.
    let e = cachevisor_server::service::start(&config(dir.path(), "2MiB", &[("wb", "8MiB", "wb")]))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("slots") && e.contains("delete"), "{e}");
    // A vDisk with dirty cached blocks missing from the config: refused.
    let e = cachevisor_server::service::start(&config(dir.path(), "1MiB", &[("other", "8MiB", "wb")]))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("`wb`") && e.contains("dirty") && e.contains("--discard-dirty wb"), "{e}");
}

#[test]
fn the_background_flusher_destages_within_its_rate() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), "1MiB", &[("wb", "8MiB", "wb")]);
    c.cache.flush_rate = "4MiB".into(); // 100 blocks per 100 ms step
    c.cache.writeback_percent = 0.0;
    let r = serve(&c);
    let (mut a, _) = Client::connect(r.tcp.unwrap(), "wb");
    for i in 0..200u64 {
        a.write(i * 4096, &[9; 4096], false).unwrap();
    }
    // Within about two steps everything is written back; blocks stay cached, clean.
    let start = std::time::Instant::now();
    while r.daemon.occupancy(0).1 > 0 && start.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(r.daemon.occupancy(0), (200, 0));
    // Blocks count clean once their write-back is under way: wait for it to land.
    assert!(r.daemon.datapath().wait_idle(std::time::Duration::from_secs(10)));
    let backing = std::fs::read(dir.path().join("wb.img")).unwrap();
    assert!(backing[..200 * 4096].iter().all(|&b| b == 9));
    assert_eq!(a.read(0, 4096).unwrap(), vec![9; 4096]);
    assert!(r.daemon.stats(0).hit_blocks > 0);
}

#[test]
fn the_flusher_leaves_the_dirty_share_writeback_percent_allows() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), "1MiB", &[("wb", "8MiB", "wb")]);
    c.cache.flush_rate = "4MiB".into();
    c.cache.writeback_percent = 25.0; // 64 of the 256 slots may stay dirty
    let r = serve(&c);
    let (mut a, _) = Client::connect(r.tcp.unwrap(), "wb");
    for i in 0..200u64 {
        a.write(i * 4096, &[3; 4096], false).unwrap();
    }
    let start = std::time::Instant::now();
    while r.daemon.occupancy(0).1 > 64 && start.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Several more steps: the flusher stays at its target, it does not go on to zero.
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(r.daemon.occupancy(0), (200, 64));
}

/// the flusher's rate follows bcache's PI controller — under client load a
/// cache a little over its dirty target is written back a little at a time (the error
/// over 40 s, not the configured rate), and once no client request came for 1 s at the
/// configured rate; `cachevisor_flush_rate_bytes_per_second` says which.
#[test]
fn the_flusher_trickles_under_load_and_runs_at_its_rate_when_idle() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), "1MiB", &[("wb", "8MiB", "wb")]);
    c.cache.flush_rate = "4MiB".into(); // 102 blocks per 100 ms step at most
    c.cache.writeback_percent = 25.0; // 64 of the 256 slots may stay dirty
    let r = serve(&c);
    let (mut a, _) = Client::connect(r.tcp.unwrap(), "wb");
    for i in 0..200u64 {
        a.write(i * 4096, &[5; 4096], false).unwrap();
    }
    let rate = |r: &cachevisor_server::service::Running| -> u64 {
        let m = r.daemon.render_metrics();
        let line = m.lines().find(|l| l.starts_with("cachevisor_flush_rate_bytes_per_second ")).expect(&m);
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    // 1.5 s of reads (hits), one every 20 ms: 136 blocks over target is 3.4 blocks/s.
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_millis(1500) {
        assert_eq!(a.read(4096 * (start.elapsed().as_millis() as u64 % 200), 4096).unwrap(), vec![5; 4096]);
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (under_load, dirty) = (rate(&r), r.daemon.occupancy(0).1);
    assert!((4096..=8 * 4096).contains(&under_load), "{under_load} bytes/s under load");
    assert!(dirty >= 190, "{dirty} dirty after 1.5 s of load: more than a trickle was written");
    // Idle: within about a second it runs at the configured rate, down to the target.
    let start = std::time::Instant::now();
    while r.daemon.occupancy(0).1 > 64 && start.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(r.daemon.occupancy(0), (200, 64));
    assert!(rate(&r) >= 4_000_000, "{} bytes/s once idle", rate(&r));
}
