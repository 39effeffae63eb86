//! Many clients at once on one vDisk, with reads served without the core lock where the
//! daemon does that (O_DIRECT hits, read-ahead of misses): a writer keeps rewriting blocks
//! through a cache too small to hold them (slots are reused all the time) while readers
//! check that every read returns its own block, whole, in at least the version acknowledged
//! before it was sent.
//! Reads done without the lock are delayed on purpose so that writes overtake them.

mod common;
use common::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

fn monotonic_reads(write_policy: &str) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let r = serve(&config(dir.path(), "16KiB", &[("d", "1MiB", write_policy)]));
    r.daemon.delay_unlocked_reads(1000); // writes land while reads are between lock and device
    let addr = r.tcp.unwrap();
    const BLOCKS: u64 = 32; // eight times the cache
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..BLOCKS).map(|_| 0.into()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (acked, stop) = (acked.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut c, _) = Client::connect(addr, "d");
            let mut v = 0u64;
            while !stop.load(SeqCst) {
                v += 1;
                let b = (v * 5) % BLOCKS;
                let mut data = vec![(v % 251) as u8; 4096];
                data[..8].copy_from_slice(&v.to_le_bytes());
                data[8..16].copy_from_slice(&b.to_le_bytes());
                c.write(b * 4096, &data, false).unwrap();
                acked[b as usize].store(v, SeqCst);
            }
            v
        })
    };
    let readers: Vec<_> = (0..4u64)
        .map(|t| {
            let acked = acked.clone();
            std::thread::spawn(move || {
                let (mut c, _) = Client::connect(addr, "d");
                for i in 0..300u64 {
                    let b = (i * 3 + t * 7) % BLOCKS;
                    let floor = acked[b as usize].load(SeqCst);
                    let data = c.read(b * 4096, 4096).unwrap();
                    let got = u64::from_le_bytes(data[..8].try_into().unwrap());
                    assert!(got >= floor, "block {b}: version {got} read after version {floor} was acknowledged");
                    if got > 0 {
                        assert_eq!(u64::from_le_bytes(data[8..16].try_into().unwrap()), b, "block {b}: read another block's data (version {got})");
                        assert!(data[16..].iter().all(|&x| x == (got % 251) as u8), "block {b}: torn read of version {got}");
                    }
                }
            })
        })
        .collect();
    for h in readers {
        h.join().unwrap();
    }
    stop.store(true, SeqCst);
    let writes = writer.join().unwrap();
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
