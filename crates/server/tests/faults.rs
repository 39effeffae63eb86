//! A failing cache store: the N-th write to the cache file fails, for every N in a sweep.
//! The request that hit it gets EIO; every other write reads back exactly, before and
//! after a warm restart; nothing stored earlier is lost. After the configured number of
//! errors a vDisk falls back to pass-through and keeps serving correct data.

mod common;
use cachevisor_nbd::proto::EIO;
use common::*;

fn cfg(dir: &std::path::Path, threshold: u64) -> cachevisor_server::Config {
    let mut c = config(dir, "64KiB", &[("wb", "1MiB", "wb"), ("wt", "1MiB", "wt")]);
    c.cache.error_threshold = threshold;
    c
}

fn block(tag: u8, i: u64) -> Vec<u8> {
    vec![tag.wrapping_add(i as u8); 4096]
}

#[test]
fn failing_the_nth_cache_write_fails_only_that_request() {
    for n in 1..=24u64 {
        for disk in ["wb", "wt"] {
            let dir = tempfile::tempdir().unwrap();
            let c = cfg(dir.path(), 1000);
            let (r, faults) = serve_faulty(&c);
            let (mut cl, _) = Client::connect(r.tcp.unwrap(), disk);
            for i in 0..8 {
                cl.write(i * 4096, &block(10, i), false).unwrap();
            }
            cl.flush().unwrap();
            faults.fail_cache_write_in(n);
            let mut failed = None;
            for i in 0..32 {
                match cl.write(i * 4096, &block(100, i), false) {
                    Ok(()) => {}
                    Err(e) => {
                        assert_eq!(e, EIO, "n={n}");
                        assert!(failed.replace(i).is_none(), "n={n}: two failed writes");
                    }
                }
                // Reads fill the cache too: a failing fill may also be the N-th write.
                if let Err(e) = cl.read(((i * 7) % 64) * 4096, 4096) {
                    assert_eq!(e, EIO, "n={n}");
                }
            }
            cl.flush().unwrap();
            let check = |cl: &mut Client, when: &str| {
                for i in 0..64u64 {
                    let got = cl.read(i * 4096, 4096).unwrap();
                    let new = if i < 32 { block(100, i) } else { vec![0; 4096] };
                    if Some(i) == failed {
                        let old = if i < 8 { block(10, i) } else { vec![0; 4096] };
                        assert!(
                            got == new || got == old || got == vec![0; 4096],
                            "n={n} {disk} {when}: failed block {i} holds other data"
                        );
                    } else {
                        assert_eq!(got, new, "n={n} {disk} {when}: block {i}");
                    }
                }
            };
            check(&mut cl, "live");
            drop((cl, r)); // as if the process died: the owner lock is released
            let r2 = serve(&cfg(dir.path(), 1000));
            let (mut cl, _) = Client::connect(r2.tcp.unwrap(), disk);
            check(&mut cl, "after restart");
        }
    }
}

#[test]
fn too_many_errors_switch_the_vdisk_to_pass_through() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path(), 3);
    c.cache.interval = "1h".into(); // intervals (which drain pass-through) only when called below
    let (r, faults) = serve_faulty(&c);
    let (mut cl, _) = Client::connect(r.tcp.unwrap(), "wb");
    for i in 0..8 {
        cl.write(i * 4096, &block(1, i), false).unwrap();
    }
    cl.flush().unwrap();
    let mut errors = 0;
    for i in 8..16 {
        faults.fail_cache_write_in(1);
        if cl.write(i * 4096, &block(1, i), false).is_err() {
            errors += 1;
            cl.write(i * 4096, &block(1, i), false).ok(); // retried once the cache is bypassed
        }
    }
    faults.fail_cache_write_in(0);
    let s = r.daemon.stats(0);
    assert!(s.passthrough && s.errors == 3 && errors == 3, "{s:?}, {errors} failed writes");
    // Entering pass-through drops nothing: the dirty blocks stay cached (and are read from
    // there) until they are written back.
    let (used, dirty) = r.daemon.occupancy(0);
    assert!(dirty >= 4 && used >= dirty, "{dirty} dirty blocks kept of {used}");
    for i in 0..16 {
        let got = cl.read(i * 4096, 4096).unwrap();
        if i < 8 || i >= 8 + errors {
            assert_eq!(got, block(1, i), "block {i}");
        }
    }
    // Intervals drain it: dirty blocks written back, then the clean ones leave the cache.
    for _ in 0..3 {
        r.daemon.tick();
    }
    assert_eq!(r.daemon.occupancy(0), (0, 0), "no cache held, no dirty data left behind");
    let backing = std::fs::read(dir.path().join("wb.img")).unwrap();
    for i in (0..8).chain(8 + errors..16) {
        assert_eq!(
            backing[i as usize * 4096..(i as usize + 1) * 4096],
            block(1, i)[..],
            "block {i} on the backing file"
        );
    }
    for i in 0..16 {
        let got = cl.read(i * 4096, 4096).unwrap();
        if i < 8 || i >= 8 + errors {
            assert_eq!(got, block(1, i), "block {i} after draining");
        }
    }
}

/// A cache device slower than its backing store (every cache write waits 20 ms) under
/// `congested_write_threshold = "5ms"`: after a few slow writes the engine finds the
/// device congested and sends the next write misses around it; every write reads back,
/// in write-back and write-through; `/cache` and the metrics say so. Cleared by a faster
/// device again (its smoothed latency decays while nothing is written to it).
#[test]
fn write_misses_go_around_a_congested_cache_device_and_every_write_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), "4MiB", &[("wb", "4MiB", "wb"), ("wt", "4MiB", "wt")]);
    c.cache.congested_write_threshold = Some("5ms".into());
    let (r, faults) = serve_faulty(&c);
    faults.delay_cache_writes(20_000);
    for disk in ["wb", "wt"] {
        let (mut cl, _) = Client::connect(r.tcp.unwrap(), disk);
        for i in 0..64u64 {
            cl.write(i * 4096, &block(30, i), false).unwrap();
        }
        cl.flush().unwrap();
        for i in 0..64u64 {
            assert_eq!(cl.read(i * 4096, 4096).unwrap(), block(30, i), "{disk}: block {i}");
        }
    }
    let report = r.daemon.cache_report();
    let cg = report.congestion.expect("a threshold is set: /cache reports congestion");
    assert!(cg.write_episodes >= 1 && cg.write_threshold_ns == Some(5_000_000), "{cg:?}");
    let status = r.daemon.status();
    for s in &status {
        assert!(
            s.entry.congestion_bypassed[1] >= 32,
            "{}: {:?} write misses around the cache",
            s.name,
            s.entry.congestion_bypassed
        );
    }
    let m = r.daemon.render_metrics();
    assert!(m.contains("cachevisor_congestion_bypassed_misses_total{vdisk=\"wb\",op=\"write\"}"), "{m}");
    assert!(m.contains("cachevisor_cache_congested{op=\"write\"}"), "{m}");
    // A fast device again: after a while unused it is tried again.
    faults.delay_cache_writes(0);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (mut cl, _) = Client::connect(r.tcp.unwrap(), "wb");
    cl.write(100 * 4096, &block(40, 0), false).unwrap();
    let before = r.daemon.status()[0].entry.congestion_bypassed[1];
    for i in 101..110u64 {
        cl.write(i * 4096, &block(40, i), false).unwrap();
    }
    assert_eq!(r.daemon.status()[0].entry.congestion_bypassed[1], before, "not congested any more");
    assert!(!r.daemon.cache_report().congestion.unwrap().write_congested);
}
