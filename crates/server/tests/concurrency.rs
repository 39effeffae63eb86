//! Many clients at once on one vDisk, with reads served without the core lock where the
//! daemon does that (O_DIRECT hits, read-ahead of misses): a writer keeps rewriting blocks
//! through a cache too small to hold them (slots are reused all the time) while readers
//! check that every read returns its own block, whole, in at least the version acknowledged
//! before it was sent.
//! Reads done without the lock are delayed on purpose so that writes overtake them.

mod common;
use common::*;

fn monotonic_reads(write_policy: &str) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (r, faults) = serve_faulty(&config(dir.path(), "16KiB", &[("d", "1MiB", write_policy)]));
    faults.delay_reads(1000); // writes land while reads are between lock and device
                              // 32 blocks, eight times the cache: slots are reused all the time.
    let writes = check_monotonic_reads(r.tcp.unwrap(), "d", 32, 300);
    let s = r.daemon.stats(0);
    assert!(writes > 200 && s.hit_blocks > 0 && s.hit_blocks < s.blocks, "{writes} writes, {s:?}");
}

#[test]
fn concurrent_reads_never_go_back_in_time_write_back() {
    monotonic_reads("wb");
}

#[test]
fn concurrent_reads_never_go_back_in_time_write_through() {
    monotonic_reads("wt");
}

/// Runs `read` on a thread, waits until it is inside its lock-free window (reads without
/// the lock are held there for 200 ms), runs `meanwhile`, and returns what the read got.
fn race(
    r: &cachevisor_server::service::Running,
    faults: &Faults,
    export: &str,
    block: u64,
    meanwhile: impl FnOnce(&mut Client),
) -> Vec<u8> {
    faults.delay_reads(200_000);
    let addr = r.tcp.unwrap();
    let export2 = export.to_string();
    let reader = std::thread::spawn(move || Client::connect(addr, &export2).0.read(block * 4096, 4096).unwrap());
    std::thread::sleep(std::time::Duration::from_millis(50));
    let (mut c, _) = Client::connect(addr, export);
    meanwhile(&mut c);
    let got = reader.join().unwrap();
    faults.delay_reads(0);
    got
}

/// A read-ahead of a miss that a write overtakes is not used: the cache must not end up
/// holding the older data.
#[test]
fn a_read_ahead_overtaken_by_a_write_is_dropped() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (r, faults) = serve_faulty(&config(dir.path(), "64KiB", &[("d", "1MiB", "wa")]));
    let (mut c, _) = Client::connect(r.tcp.unwrap(), "d");
    c.write(0, &[1; 4096], false).unwrap(); // write-around: on the backing file, not cached
    let got = race(&r, &faults, "d", 0, |c| c.write(0, &[2; 4096], false).unwrap());
    assert!(got == vec![1; 4096] || got == vec![2; 4096], "a read concurrent with a write returns one of them");
    assert_eq!(c.read(0, 4096).unwrap(), vec![2; 4096], "the overtaken read-ahead must not have been cached");
}

/// An O_DIRECT hit whose slot is given to another block before its device read is redone
/// under the lock: it never returns another block's data.
#[test]
fn an_unlocked_hit_whose_slot_is_reused_is_redone() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (r, faults) = serve_faulty(&config(dir.path(), "16KiB", &[("d", "1MiB", "wb")]));
    if !r.daemon.direct_io() {
        eprintln!("no O_DIRECT under {}: hits are served under the lock, nothing to race", dir.path().display());
        return;
    }
    let (mut c, _) = Client::connect(r.tcp.unwrap(), "d");
    c.write(0, &[7; 4096], false).unwrap(); // block 0 cached (dirty) in one of 4 slots
    let got = race(&r, &faults, "d", 0, |c| {
        for b in 1..=8u64 {
            c.write(b * 4096, &[b as u8 + 10; 4096], false).unwrap(); // evicts block 0, reuses its slot
        }
    });
    assert_eq!(got, vec![7; 4096], "the hit read its own block");
    assert_eq!(c.read(0, 4096).unwrap(), vec![7; 4096]);
}

/// A write-through answers after its backing write, which runs with the lock released:
/// its block is fenced meanwhile, so a read that misses (the cached copy was evicted)
/// waits instead of caching what the backing store held before.
#[test]
fn a_write_through_on_its_way_fences_its_block() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (r, faults) = serve_faulty(&config(dir.path(), "16KiB", &[("d", "1MiB", "wt")]));
    let (mut c, _) = Client::connect(r.tcp.unwrap(), "d");
    c.write(0, &[1; 4096], false).unwrap();
    faults.delay_reads(200_000); // the backing write of the next write waits 200 ms
    let addr = r.tcp.unwrap();
    let writer = std::thread::spawn(move || Client::connect(addr, "d").0.write(0, &[2; 4096], false).unwrap());
    std::thread::sleep(std::time::Duration::from_millis(50));
    faults.delay_reads(0);
    r.daemon.resize(0, 0).unwrap(); // drops the (clean) cached copy
    r.daemon.resize(0, 4).unwrap();
    let during = c.read(0, 4096).unwrap();
    assert!(during == vec![1; 4096] || during == vec![2; 4096]);
    writer.join().unwrap();
    assert!(c.read(0, 4096).unwrap() == vec![2; 4096], "a read after the write was answered returns it");
    assert!(std::fs::read(dir.path().join("d.img")).unwrap()[..4096].iter().all(|&x| x == 2));
}
