//! Policies live on real traffic: the interval controller resizes partitions and switches
//! write policies while I/O runs; the sequential cutoff keeps streams out; a recorded
//! trace replayed through the simulator gives the daemon's hit ratio (one engine).

mod common;
use cachevisor_engine::WritePolicy;
use common::*;
use std::time::Duration;

#[test]
fn eci_cache_resizes_and_picks_write_policies_online() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), "4MiB", &[("hot", "64MiB", "wb"), ("stream", "64MiB", "wb")]);
    c.cache.allocator = "eci-cache".into();
    c.cache.interval = "50ms".into();
    let r = serve(&c);
    let addr = r.tcp.unwrap();
    let (mut hot, _) = Client::connect(addr, "hot");
    let (mut stream, _) = Client::connect(addr, "stream");
    // hot: re-reads 64 blocks; stream: reads new blocks only, and never re-reads.
    for round in 0..40u64 {
        for i in 0..64u64 {
            hot.read(i * 4096, 4096).unwrap();
            stream.read((round * 64 + i) * 4096, 4096).unwrap();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(120));
    let st = r.daemon.status();
    let (h, s) = (&st[0], &st[1]);
    assert!(
        h.target_blocks >= 64 && h.target_blocks > s.target_blocks,
        "hot {} stream {}",
        h.target_blocks,
        s.target_blocks
    );
    // Neither has read-after-write reuse: read-only for both (ECI-Cache's endurance rule).
    assert_eq!((h.write_policy, s.write_policy), (WritePolicy::Ro, WritePolicy::Ro));
    // Switch the allocator online: static shares split the pool evenly again.
    r.daemon.set_allocator("static", &Default::default()).unwrap();
    assert_eq!(r.daemon.allocator_name(), "static");
    for i in 0..64u64 {
        assert_eq!(hot.read(i * 4096, 4096).unwrap(), vec![0; 4096]);
    }
}

#[test]
fn a_sequential_stream_past_the_cutoff_takes_no_cache() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), "4MiB", &[("a", "64MiB", "wt")]);
    c.vdisk[0].sequential_cutoff = Some("64KiB".into());
    let r = serve(&c);
    let (mut a, _) = Client::connect(r.tcp.unwrap(), "a");
    for i in 0..256u64 {
        a.write(i * 4096, &[i as u8; 4096], false).unwrap();
    }
    // Only the first 64 KiB of the stream was cached.
    assert!(r.daemon.occupancy(0).0 <= 17, "{:?}", r.daemon.occupancy(0));
    for i in 0..256u64 {
        assert_eq!(a.read(i * 4096 + 1024 * 1024 * 8, 512).unwrap(), vec![0; 512]); // random jumps reset the run
        assert_eq!(a.read(i * 4096, 4096).unwrap(), vec![i as u8; 4096]);
    }
}

#[test]
fn a_recorded_trace_replays_to_the_same_hit_ratio_in_the_simulator() {
    let dir = tempfile::tempdir().unwrap();
    // 1,024 slots (a durable reserve of 4), 512 per vDisk; a hot set of 400 blocks per
    // vDisk takes 4 in 5 requests, the rest spread over 2,048 blocks.
    let c = config(dir.path(), "4MiB", &[("a", "16MiB", "wt"), ("b", "16MiB", "wb")]);
    let r = serve(&c);
    let rec = dir.path().join("rec.csv");
    r.daemon.record_to(&rec, cachevisor_trace::Format::Csv).unwrap();
    let (mut a, _) = Client::connect(r.tcp.unwrap(), "a");
    let (mut b, _) = Client::connect(r.tcp.unwrap(), "b");
    let mut x = 12345u64;
    for _ in 0..4000 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let span = if (x >> 40).is_multiple_of(5) { 2048 } else { 400 };
        let (blk, len) = ((x >> 33) % span, 4096 * (1 + (x >> 20) % 4) as usize);
        let c = if (x >> 7).is_multiple_of(2) { &mut a } else { &mut b };
        if (x >> 9).is_multiple_of(3) {
            c.write(blk * 4096, &vec![1; len], false).unwrap();
        } else {
            c.read(blk * 4096, len as u32).unwrap();
        }
    }
    r.daemon.shutdown().unwrap();
    let status = r.daemon.status();
    let live: Vec<f64> = status.iter().map(|v| v.stats.hit_blocks as f64 / v.stats.blocks as f64).collect();
    // The same cache in the simulator, fed the recording in order.
    let mut sc = cachevisor_sim::Scenario::default();
    sc.cache.size = "4MiB".into();
    sc.cache.persistent = true; // the daemon's mode: durable reserve, commits
    sc.replay.queue_depth = 1;
    // The daemon's store and backings are page-cached files: the fastest device models,
    // not the default SATA SSD and 7,200 rpm disk, whose milliseconds per miss would let
    // misses pile up between commits and bypass (700 of 5,000 block accesses, 3 points
    // of hit ratio, measured).
    sc.devices.ssd = cachevisor_sim::scenario::DeviceChoice::Preset("nvme".into());
    sc.devices.backing = cachevisor_sim::scenario::DeviceChoice::Preset("nvme".into());
    sc.trace.files = vec![rec];
    sc.trace.vm_mode = Some(cachevisor_trace::VmMode::Device);
    sc.vm = ["a", "b"]
        .iter()
        .zip([WritePolicy::Wt, WritePolicy::Wb])
        .map(|(n, p)| cachevisor_sim::scenario::VmSection {
            write_policy: Some(p),
            ..cachevisor_sim::scenario::VmSection::named(n)
        })
        .collect();
    sc.replay.mode = cachevisor_sim::scenario::ReplayMode::Open;
    let res = cachevisor_sim::simulate(&sc, &mut |_| {}).unwrap();
    for ((vm, want), st) in ["a", "b"].iter().zip(&live).zip(&status) {
        let v = res.vms.iter().find(|v| v.vm == *vm).unwrap();
        let got = v.hit_ratio;
        eprintln!(
            "{vm}: simulated {got:.4}, daemon {want:.4}; bypassed {} live, {} simulated",
            st.stats.bypassed_blocks, v.bypassed_blocks
        );
        // Both run the engine's asynchronous face in persistent mode (a durable reserve of
        // free slots evicted ahead, a miss that finds none bypassing until a commit). What
        // is left is timing: the daemon's commits are real fdatasyncs, so it bypasses
        // more (120 to 180 block accesses against the simulator's 14 to 17). Measured
        // over 28 runs beside a CI build: the simulator 0.6905 and 0.6941 every time, the
        // daemon 0.6917 to 0.6965 and 0.6983 to 0.7052, at most 1.1 points apart. (In the
        // 128-slot cache this test had before, the reserve was one slot and 3 in 10
        // accesses bypassed on both sides: 3.2 points apart once.)
        assert!((got - want).abs() < 0.025, "{vm}: simulated {got:.4}, daemon {want:.4}");
    }
}

#[test]
fn s_cave_runs_its_global_cleaner_in_the_daemon_and_stops_it_when_switched_away() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), "1MiB", &[("a", "16MiB", "wt")]);
    c.cache.allocator = "s-cave".into();
    c.cache.replacement = Some(cachevisor_engine::ReplacementKind::Clock);
    let r = serve(&c);
    let dp = r.daemon.datapath();
    let (low, high) = dp.with_engine(|e| e.cleaner()).expect("S-CAVE's cleaner is set");
    assert!(0 < low && low <= high, "{low} {high}");
    let (mut a, _) = Client::connect(r.tcp.unwrap(), "a");
    // Far more distinct blocks than the 256-block cache: without the cleaner the free
    // list would run dry; with it, the engine keeps reclaiming towards `high`.
    for i in 0..2048u64 {
        a.read(i * 4096, 4096).unwrap();
    }
    r.daemon.shutdown().unwrap();
    let free = dp.with_engine(|e| e.free_slots());
    assert!(free >= low, "the cleaner keeps at least {low} slots free ({free})");
    r.daemon.set_allocator("static", &Default::default()).unwrap();
    assert_eq!(dp.with_engine(|e| e.cleaner()), None, "static has no cleaner");
}

#[test]
fn adaptive_moves_an_idle_vms_cache_with_paced_shrinks_and_loses_none_of_its_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), "2MiB", &[("a", "64MiB", "wb"), ("b", "64MiB", "wb")]);
    c.cache.allocator = "adaptive".into();
    c.cache.interval = "50ms".into();
    let r = serve(&c);
    let addr = r.tcp.unwrap();
    let (mut a, _) = Client::connect(addr, "a");
    let (mut b, _) = Client::connect(addr, "b");
    let data = |i: u64| vec![(i as u8) ^ 0x5a; 4096];
    // a writes 200 blocks (write-back: dirty in the cache) and re-reads them, then goes
    // quiet; b re-reads a 400-block hot set, more than an equal share of the 512 slots.
    for _ in 0..3 {
        for i in 0..200u64 {
            a.write(i * 4096, &data(i), false).unwrap();
            a.read(i * 4096, 4096).unwrap();
        }
        std::thread::sleep(Duration::from_millis(60));
    }
    let before = r.daemon.status();
    assert!(before[0].dirty_blocks > 0, "a has dirty blocks to lose: {:?}", before[0].dirty_blocks);
    for _ in 0..30 {
        for i in 0..400u64 {
            b.read(i * 4096, 4096).unwrap();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let st = r.daemon.status();
    let (sa, sb) = (&st[0], &st[1]);
    eprintln!(
        "a: target {} used {} dirty {}; b: target {} used {}",
        sa.target_blocks, sa.used_blocks, sa.dirty_blocks, sb.target_blocks, sb.used_blocks
    );
    assert!(sb.target_blocks >= 400 && sb.used_blocks >= 350, "b did not get the idle VM's cache: {sb:?}");
    assert!(sa.used_blocks < 150, "a kept its blocks: {sa:?}");
    // Every write a was told is written reads back, from the cache or its disk.
    for i in 0..200u64 {
        assert_eq!(a.read(i * 4096, 4096).unwrap(), data(i), "block {i}");
    }
    r.daemon.shutdown().unwrap();
}
