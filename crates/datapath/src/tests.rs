//! The data path on real files: concurrent clients read their own writes through the
//! cache, and after a crash-like stop a new data path, replaying the journal, returns every
//! flushed write.

use super::*;
use cachevisor_engine::{EngineConfig, Flusher, PartitionMode};
use rand::{Rng, SeedableRng};
use std::path::Path;

const BS: u64 = 4096;

/// A cache of `slots` blocks in front of `vms` disks of `disk` bytes, in `dir`; metadata
/// replayed into the engine when it exists.
fn open(dir: &Path, slots: u64, vms: u32, disk: u64, schedule: Schedule) -> DataPath {
    open_limited(dir, slots, vms, disk, schedule, None, true)
}

/// [`open`] with a journal size past which checkpoints replace the journal, and the
/// cache store's O_DIRECT I/O through io_uring (the default) or device threads.
fn open_limited(
    dir: &Path,
    slots: u64,
    vms: u32,
    disk: u64,
    schedule: Schedule,
    limit: Option<u64>,
    io_uring: bool,
) -> DataPath {
    let cfg = EngineConfig { partition: PartitionMode::Shared, ..EngineConfig::with_slots(slots) };
    open_with(dir, cfg, vms, disk, schedule, limit, io_uring, None)
}

/// [`open_limited`] with an engine configuration of its own and `faults` on every device.
#[allow(clippy::too_many_arguments)]
fn open_with(
    dir: &Path,
    cfg: EngineConfig,
    vms: u32,
    disk: u64,
    schedule: Schedule,
    limit: Option<u64>,
    io_uring: bool,
    faults: Option<Arc<cachevisor_store::faults::Faults>>,
) -> DataPath {
    DataPath::open_in(
        dir,
        cfg,
        vms,
        disk,
        4,
        schedule,
        8,
        limit,
        cachevisor_store::backing::DirectIo::Auto,
        io_uring,
        faults,
    )
    .unwrap()
}

/// A write-back data path of `slots` slots (one shared pool) in front of `vms` disks of
/// 1 MiB in `dir` (the cache swap and resize tests).
pub(super) fn open_wb(dir: &Path, slots: u64, vms: u32, io_uring: bool) -> DataPath {
    let cfg = EngineConfig {
        partition: PartitionMode::Shared,
        write_policy: cachevisor_engine::WritePolicy::Wb,
        ..EngineConfig::with_slots(slots)
    };
    DataPath::open_in(
        dir,
        cfg,
        vms,
        1 << 20,
        4,
        Schedule::default(),
        4,
        None,
        cachevisor_store::backing::DirectIo::Auto,
        io_uring,
        None,
    )
    .unwrap()
}

/// Block `block` of `vm` at `version` ([`pattern`] of one 4 KiB block).
pub(super) fn block_at(vm: u32, block: u64, version: u64) -> Vec<u8> {
    pattern(vm, block * BS, version, BS as usize)
}

/// A block's pattern: its VM, offset and version in every 8 bytes.
fn pattern(vm: u32, offset: u64, version: u64, len: usize) -> Vec<u8> {
    (0..len / 8).flat_map(|i| ((vm as u64) << 56 ^ (offset + i as u64 * 8) << 16 ^ version).to_le_bytes()).collect()
}

#[test]
fn concurrent_clients_read_their_own_writes_through_a_small_cache() {
    concurrent_clients(true);
}

/// The same with the cache store's O_DIRECT I/O on device threads (where io_uring is
/// missing, or `io_uring = false`).
#[test]
fn concurrent_clients_read_their_own_writes_without_io_uring() {
    concurrent_clients(false);
}

fn concurrent_clients(io_uring: bool) {
    let dir = tempfile::tempdir().unwrap();
    // A dirty target of 0: the flusher writes at its full rate among the clients.
    let flusher = Flusher { period_ns: 5_000_000, blocks_per_period: 16, dirty_target: 0.0 };
    let schedule = Schedule { interval_ns: 0, flusher: Some(flusher), ..Default::default() };
    let cfg = EngineConfig { partition: PartitionMode::Shared, ..EngineConfig::with_slots(64) };
    let dp = DataPath::open_in(
        dir.path(),
        cfg,
        2,
        1 << 20,
        4,
        schedule,
        8,
        None,
        cachevisor_store::backing::DirectIo::Auto,
        io_uring,
        None,
    );
    let dp = Arc::new(dp.unwrap());
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let dp = dp.clone();
            std::thread::spawn(move || {
                // Each thread owns 16 blocks of one disk: its reads must see its last writes.
                let vm = (t % 2) as u32;
                let base = (t / 2) * 16 * BS;
                let mut last: HashMap<u64, u64> = HashMap::new();
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                for i in 0..400u64 {
                    let b = rng.gen_range(0..16u64);
                    let n = rng.gen_range(1..=3u64).min(16 - b);
                    let offset = base + b * BS;
                    if rng.gen_bool(0.5) {
                        let mut data = Vec::new();
                        for k in 0..n {
                            data.extend(pattern(vm, offset + k * BS, i + 1, BS as usize));
                            last.insert(b + k, i + 1);
                        }
                        dp.write(vm, offset, &data, rng.gen_bool(0.05)).unwrap();
                    } else {
                        let mut buf = vec![0u8; (n * BS) as usize];
                        dp.read(vm, offset, &mut buf).unwrap();
                        for k in 0..n {
                            let want = match last.get(&(b + k)) {
                                Some(&v) => pattern(vm, offset + k * BS, v, BS as usize),
                                None => vec![0u8; BS as usize],
                            };
                            let got = &buf[(k * BS) as usize..((k + 1) * BS) as usize];
                            assert!(got == want.as_slice(), "thread {t} step {i}: block {} is stale", b + k);
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    dp.flush(0).unwrap();
    dp.with_engine(|e| e.check_invariants()).unwrap();
}

#[test]
fn after_a_crash_like_stop_every_flushed_write_is_read_back() {
    crash_like_stop(None, true);
}

/// The same with the cache store's I/O on device threads. (With io_uring, the ring once
/// ended at the stop with cache-store ops still queued; their slots stayed pinned and the
/// committer ran empty commits forever, so the stop never returned.)
#[test]
fn after_a_crash_like_stop_without_io_uring_every_flushed_write_is_read_back() {
    crash_like_stop(None, false);
}

#[test]
fn checkpoints_replace_the_journal_and_lose_no_flushed_write() {
    let (dir, checkpoints) = crash_like_stop(Some(2048), true);
    assert!(checkpoints >= 3, "a 2 KiB journal limit makes checkpoints ({checkpoints})");
    // Its records, not the zeros written ahead of them.
    let mut f = std::fs::File::open(dir.path().join("meta/journal")).unwrap();
    std::io::Read::read_exact(&mut f, &mut [0u8; cachevisor_store::journal::HEADER_LEN]).unwrap();
    let (_, clean, records) = cachevisor_store::journal::read_records_to(&mut f).unwrap();
    assert!(clean && records < 16 << 10, "checkpoints keep the journal short ({records} bytes)");
}

/// Random writes and flushes, a stop without a flush, a restart that replays the metadata:
/// every flushed write (or a later one) is read back.
fn crash_like_stop(limit: Option<u64>, io_uring: bool) -> (tempfile::TempDir, u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut flushed: HashMap<(u32, u64), u64> = HashMap::new();
    let mut later: HashMap<(u32, u64), Vec<u64>> = HashMap::new();
    let checkpoints;
    {
        let dp = open_limited(dir.path(), 32, 2, 1 << 20, Schedule::default(), limit, io_uring);
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut pending: HashMap<(u32, u64), u64> = HashMap::new();
        for i in 1..=600u64 {
            let (vm, b) = (rng.gen_range(0..2u32), rng.gen_range(0..96u64));
            dp.write(vm, b * BS, &pattern(vm, b * BS, i, BS as usize), false).unwrap();
            pending.insert((vm, b), i);
            later.entry((vm, b)).or_default().push(i);
            if rng.gen_bool(0.1) {
                dp.flush(0).unwrap();
                flushed.extend(pending.drain());
                later.clear();
            }
        }
        checkpoints = dp.checkpoints();
        // Dropped without a flush: what was not flushed may or may not be there.
    }
    let dp = open(dir.path(), 32, 2, 1 << 20, Schedule::default());
    dp.with_engine(|e| e.check_invariants()).unwrap();
    for vm in 0..2u32 {
        for b in 0..96u64 {
            let mut buf = vec![0u8; BS as usize];
            dp.read(vm, b * BS, &mut buf).unwrap();
            let mut ok: Vec<u64> = flushed.get(&(vm, b)).copied().into_iter().collect();
            ok.extend(later.get(&(vm, b)).into_iter().flatten());
            if ok.is_empty() {
                ok.push(0);
            }
            let matches = |v: u64| {
                if v == 0 {
                    buf.iter().all(|&x| x == 0)
                } else {
                    buf == pattern(vm, b * BS, v, BS as usize)
                }
            };
            assert!(ok.iter().any(|&v| matches(v)), "vm {vm} block {b}: none of the versions {ok:?}");
        }
    }
    (dir, checkpoints)
}

#[test]
fn asynchronous_submissions_reply_through_callbacks_in_the_engine_order() {
    let dir = tempfile::tempdir().unwrap();
    let dp = Arc::new(open(dir.path(), 32, 1, 1 << 20, Schedule::default()));
    let (tx, rx) = std::sync::mpsc::channel::<(u64, Result<Vec<Bytes>, cachevisor_nbd::backend::ClientError>)>();
    // 64 requests in flight from one thread: for each of 16 blocks a write, a read, a
    // second write and a read; same-block requests run in arrival order, so each read
    // returns the write submitted just before it.
    let mut n = 0u64;
    for round in 0..2u64 {
        for b in 0..16u64 {
            let (t1, t2) = (tx.clone(), tx.clone());
            let version = round * 100 + b + 1;
            dp.submit(
                0,
                b * BS,
                Cmd::Write(pattern(0, b * BS, version, BS as usize)),
                false,
                Box::new(move |r| {
                    t1.send((u64::MAX, r)).unwrap();
                }),
            );
            dp.submit(0, b * BS, Cmd::Read(BS as u32), true, Box::new(move |r| t2.send((version, r)).unwrap()));
            n += 2;
        }
    }
    let t = tx.clone();
    dp.submit(0, 0, Cmd::Flush, false, Box::new(move |r| t.send((u64::MAX - 1, r)).unwrap()));
    n += 1;
    for _ in 0..n {
        let (version, r) = rx.recv_timeout(Duration::from_secs(30)).expect("every request replies");
        let bytes = r.expect("no failure");
        if version >= u64::MAX - 1 {
            continue; // a write or the flush
        }
        let b = (version - 1) % 100;
        let mut got = vec![0u8; BS as usize];
        copy_range(&bytes, b * BS, &mut got);
        assert!(got == pattern(0, b * BS, version, BS as usize), "block {b}: the read saw another version");
    }
}

#[test]
fn large_reads_and_writes_run_as_few_device_calls_and_return_the_right_bytes() {
    let dir = tempfile::tempdir().unwrap();
    // 2 MiB of cache in front of an 8 MiB disk: 1 MiB requests hit, miss and evict.
    let dp = open(dir.path(), 512, 1, 8 << 20, Schedule::default());
    // A fresh cache hands out consecutive slots: 1 MiB written, then read back, is one
    // device call each way (256 blocks).
    let data = pattern(0, 0, 99, 1 << 20);
    dp.write(0, 0, &data, false).unwrap();
    let before = dp.device_calls();
    let mut buf = vec![0u8; 1 << 20];
    dp.read(0, 0, &mut buf).unwrap();
    assert!(buf == data);
    assert_eq!(dp.device_calls() - before, 1, "a 1 MiB hit on consecutive slots is one read");
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut model = vec![0u8; 8 << 20];
    model[..1 << 20].copy_from_slice(&data);
    for i in 1..=60u64 {
        let len = [4096u64, 65536, 1 << 20][rng.gen_range(0..3)];
        let offset = rng.gen_range(0..(8 << 20) / 4096 - len / 4096) * 4096;
        if rng.gen_bool(0.5) {
            let data = pattern(0, offset, i, len as usize);
            dp.write(0, offset, &data, false).unwrap();
            model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
        } else {
            let mut buf = vec![0u8; len as usize];
            dp.read(0, offset, &mut buf).unwrap();
            assert!(buf == model[offset as usize..(offset + len) as usize], "step {i}: {len} bytes at {offset}");
        }
    }
    dp.flush(0).unwrap();
    dp.with_engine(|e| e.check_invariants()).unwrap();
}

#[test]
fn an_nbd_client_reads_its_writes_through_the_asynchronous_transmission() {
    use cachevisor_nbd::handshake::{negotiate, Negotiated};
    let dir = tempfile::tempdir().unwrap();
    let size = 4u64 << 20;
    let dp = Arc::new(open(dir.path(), 256, 1, size, Schedule::default()));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = {
        let dp = dp.clone();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.set_nodelay(true).unwrap();
            let negotiated =
                negotiate(&mut s, &cachevisor_nbd::transmission::SingleExport { size, block_size: BS }).unwrap();
            let Negotiated::Export(0, replies) = negotiated else { panic!("{negotiated:?}") };
            let out = s.try_clone().unwrap();
            let backend = Arc::new(crate::vdisk_export::VdiskExport { dp, vm: 0, retry_io: false });
            cachevisor_nbd::transmission::serve(s, out, backend, (size, replies), None).unwrap();
        })
    };
    let mut c = cachevisor_nbd::client::Client::connect(addr, "vm0").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut model = vec![0u8; size as usize];
    for i in 1..=200u64 {
        let len = [4096u64, 8192, 65536][rng.gen_range(0..3)];
        let offset = rng.gen_range(0..(size - len) / 512) * 512;
        if rng.gen_bool(0.5) {
            let data = pattern(0, offset, i, len as usize);
            c.write(offset, &data, rng.gen_bool(0.1)).unwrap().unwrap();
            model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
        } else {
            let got = c.read(offset, len as u32).unwrap().unwrap();
            assert!(got == model[offset as usize..(offset + len) as usize], "step {i}: {len} bytes at {offset}");
        }
    }
    c.flush().unwrap().unwrap();
    // Out of range: an error reply, and the connection goes on.
    assert_eq!(c.read(size - 512, 4096).unwrap(), Err(cachevisor_nbd::proto::EINVAL));
    assert!(c.read(0, 4096).unwrap().is_ok());
    // TRIM: the range reads back as zeroes (the cache dropped it, the disk file punched
    // a hole); an unknown command is refused and the connection goes on.
    c.write(0, &pattern(0, 0, 999, 8192), false).unwrap().unwrap();
    c.trim(0, 8192).unwrap().unwrap();
    assert_eq!(c.read(0, 8192).unwrap().unwrap(), vec![0u8; 8192]);
    assert_eq!(dp.stats(0).trims, 1);
    drop(c);
    server.join().unwrap();
}

#[test]
fn a_halt_with_write_backs_under_way_counts_no_device_error() {
    // A clean stop halts the data path while the flusher may still be writing back: the
    // ops that then fail with `Shutdown` never reached a device and must not trip the
    // error threshold (they did, logging "error threshold reached" at stops under load).
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(cachevisor_store::faults::Faults::default());
    let cfg = EngineConfig { partition: PartitionMode::Shared, ..EngineConfig::with_slots(64) };
    let dp = Arc::new(open_with(dir.path(), cfg, 1, 1 << 20, Schedule::default(), None, true, Some(faults.clone())));
    for b in 0..48u64 {
        dp.write(0, b * BS, &pattern(0, b * BS, 1, BS as usize), false).unwrap();
    }
    faults.delay_reads(200_000); // the write-back reads (one coalesced run) wait 200 ms
    let d = dp.clone();
    let job = std::thread::spawn(move || d.run_job(|e, out| e.flush(None, out)));
    std::thread::sleep(std::time::Duration::from_millis(60));
    dp.halt();
    let _ = job.join();
    let s = dp.stats(0);
    assert_eq!((s.errors, s.passthrough), (0, false), "a halt is not a device error");
}

#[test]
fn the_engine_s_sampling_points_and_interval_ends_reach_the_policy_hooks_in_order() {
    // The engine's interval (100 ms, 5 points) runs on the timer thread: each sampling
    // point and each end reaches the policy's hooks, with the engine of this data path.
    let dir = tempfile::tempdir().unwrap();
    let schedule = Schedule { interval_ns: 100_000_000, samples: 5, ..Default::default() };
    let dp = open(dir.path(), 64, 1, 1 << 20, schedule);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (s, i) = (seen.clone(), seen.clone());
    dp.set_hooks(
        None,
        Some(Box::new(move |e: &mut Engine| i.lock().unwrap().push((5, e.slot_count())))),
        Some(Box::new(move |e: &Engine, k, of| {
            assert_eq!(of, 5);
            s.lock().unwrap().push((k, e.slot_count()))
        })),
    );
    let start = std::time::Instant::now();
    while seen.lock().unwrap().len() < 10 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() >= 10 && seen.iter().all(|&(_, n)| n == 64), "{seen:?}");
    // Points 1..4, then the end, interval after interval.
    let ks: Vec<u32> = seen.iter().map(|&(k, _)| k).collect();
    assert_eq!(ks[..10], [1, 2, 3, 4, 5, 1, 2, 3, 4, 5], "{ks:?}");
}

/// a cache store the daemon has no device for (a region another node lends,
/// before the cluster's NBD client exists) fails the ops placed on it — the client's
/// write gets an I/O error — and none of them lands in the cache file: with the
/// io_uring thread, which once took every cache-store op and would have written a lent
/// slot's data over the local slot at the same offset, and without it.
#[test]
fn ops_on_a_store_with_no_device_fail_and_never_touch_the_cache_file() {
    for io_uring in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let cfg =
            EngineConfig { stores: vec![cachevisor_engine::StoreSpec::lent(1, 16)], ..EngineConfig::with_slots(16) };
        let schedule = Schedule { interval_ns: 0, flusher: None, ..Default::default() };
        let dp = DataPath::open_in(
            dir.path(),
            cfg,
            1,
            1 << 20,
            2,
            schedule,
            2,
            None,
            cachevisor_store::backing::DirectIo::Auto,
            io_uring,
            None,
        )
        .unwrap();
        dp.with_engine_mut(|e| {
            e.set_target(0, 32, &mut cachevisor_engine::Output::default());
            e.set_remote_shares(0, &[(1, 16)]).unwrap();
        });
        let (mut acked, mut refused) = (Vec::new(), 0);
        for b in 0..32u64 {
            match dp.write(0, b * BS, &pattern(0, b * BS, 1, BS as usize), false) {
                Ok(()) => acked.push(b),
                Err(f) => {
                    assert_eq!(f, Failure::Io, "block {b}");
                    refused += 1;
                }
            }
        }
        assert!(refused > 0 && !acked.is_empty(), "io_uring {io_uring}: {refused} refused, {} acked", acked.len());
        for &b in &acked {
            let mut buf = vec![0u8; BS as usize];
            dp.read(0, b * BS, &mut buf).unwrap();
            assert!(buf == pattern(0, b * BS, 1, BS as usize), "io_uring {io_uring}: block {b} is not what was acked");
        }
        dp.flush(0).unwrap();
        dp.with_engine(|e| e.check_invariants()).unwrap();
    }
}
