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
