//! Another NBD server as the backing store: nbdkit's memory plugin behind the cache.
//! Writes through (and destaged write-back data) land on it; reads of data the cache does
//! not hold come from it — read ahead with the core lock released, on several connections,
//! and never kept when a write got there first.

mod common;
use common::*;

/// A daemon in `dir` with one vDisk `name` on nbdkit at `port`; `cache` is extra
/// `[cache]` TOML (size and more).
fn behind(
    dir: &tempfile::TempDir,
    port: u16,
    cache: &str,
    name: &str,
    write_policy: &str,
) -> cachevisor_server::service::Running {
    let c = ServeConfig::new("1MiB").cache("path", "c.img").section_toml("cache", cache).vdisk(
        name,
        &format!("nbd://127.0.0.1:{port}/"),
        &[("write_policy", s(write_policy))],
    );
    serve(&parse(dir.path(), &c))
}

#[test]
fn an_nbd_server_behind_the_cache() {
    let (_kit, port) = nbdkit(&[], &[]);
    let dir = tempfile::tempdir().unwrap();
    let r = behind(&dir, port, "size = \"256KiB\"", "wt", "wt");
    let (mut c, size) = Client::connect(r.tcp.unwrap(), "wt");
    assert_eq!(size, 16 << 20);
    for i in 0..256u64 {
        c.write(i * 4096, &[i as u8; 4096], false).unwrap();
    }
    c.flush().unwrap();
    // Straight from nbdkit: everything written through is there.
    let mut direct = cachevisor_nbd::client::Client::connect(
        format!("127.0.0.1:{port}").parse::<std::net::SocketAddr>().unwrap(),
        "",
    )
    .unwrap();
    for i in (0..256u64).step_by(17) {
        assert_eq!(direct.read(i * 4096, 4096).unwrap().unwrap(), vec![i as u8; 4096]);
    }
    // Data put on the backing behind the cache's back reads through on a miss.
    direct.write(8 << 20, &[0xab; 4096], false).unwrap().unwrap();
    assert_eq!(c.read(8 << 20, 4096).unwrap(), vec![0xab; 4096]);
    for i in 0..256u64 {
        assert_eq!(c.read(i * 4096, 4096).unwrap(), vec![i as u8; 4096]);
    }
}

/// Reads that miss wait on a slow backing (1 ms per request) outside the core lock while a
/// writer keeps writing around the cache (`wa`: each write goes to the backing and drops
/// the cached copy). Every read must return at least the version whose write was
/// acknowledged before the read was sent: a read-ahead that raced with a write must not
/// be used, or it would put stale data in the cache.
#[test]
fn reads_ahead_of_the_cache_never_return_or_cache_stale_data() {
    let (_kit, port) = nbdkit(&["--filter=delay"], &["rdelay=1ms"]);
    let dir = tempfile::tempdir().unwrap();
    let c = ServeConfig::new("1MiB").cache("path", "c.img").vdisk(
        "d",
        &format!("nbd://127.0.0.1:{port}/"),
        &[("write_policy", s("wa"))],
    );
    let (r, faults) = serve_faulty(&parse(dir.path(), &c));
    faults.delay_reads(2000); // writes land while read-aheads are in flight
    let writes = check_monotonic_reads(r.tcp.unwrap(), "d", 8, 200);
    let s = r.daemon.stats(0);
    assert!(writes > 100 && s.reads == 800 && s.blocks > s.hit_blocks, "{writes} writes, {s:?}");
}

/// A read that waits on a slow backing (300 ms) does not hold up the requests behind it on
/// the same connection: their replies come first (NBD matches replies by cookie). A read
/// still in flight when the client disconnects is answered before the connection closes.
#[test]
fn a_slow_miss_does_not_hold_up_the_requests_behind_it() {
    use cachevisor_nbd::proto::*;
    let (_kit, port) = nbdkit(&["--filter=delay"], &["rdelay=300ms"]);
    let dir = tempfile::tempdir().unwrap();
    // Buffered cache store: hits are answered in line, misses always by the read threads
    // (with O_DIRECT a read alone on its connection is served in line).
    let r = behind(&dir, port, "size = \"1MiB\"\ndirect = \"off\"", "d", "wb");
    let (mut c, _) = Client::connect(r.tcp.unwrap(), "d");
    c.write(0, &[5; 4096], false).unwrap(); // cached: reads of block 0 hit
    let miss = c.send(CMD_READ, 0, 1 << 20, 4096, &[]);
    let hit = c.send(CMD_READ, 0, 0, 4096, &[]);
    let write = c.send(CMD_WRITE, 0, 8192, 4096, &[6; 4096]);
    let mut data = vec![0u8; 4096];
    let mut first_two = Vec::new();
    for _ in 0..2 {
        let (e, cookie) = c.reply().unwrap();
        assert!(
            e == 0 && (cookie == hit || cookie == write),
            "the hit and the write are answered before the miss (got cookie {cookie})"
        );
        if cookie == hit {
            std::io::Read::read_exact(&mut c.s, &mut data).unwrap();
            assert_eq!(data, vec![5; 4096]);
        }
        first_two.push(cookie);
    }
    assert!(first_two.contains(&hit) && first_two.contains(&write));
    assert_eq!(c.reply().unwrap(), (0, miss), "then the miss");
    std::io::Read::read_exact(&mut c.s, &mut data).unwrap();
    assert_eq!(data, vec![0; 4096]);
    // A miss in flight at disconnect is still answered.
    let last = c.send(CMD_READ, 0, 2 << 20, 4096, &[]);
    c.send(CMD_DISC, 0, 0, 0, &[]);
    assert_eq!(c.reply().unwrap(), (0, last));
    std::io::Read::read_exact(&mut c.s, &mut data).unwrap();
    assert!(closed(&mut c.s));
}

/// The background flusher writing back to a slow backing (10 ms per write) does not hold
/// up client requests: their ops go ahead of its write-backs, so a hit (and a write) is
/// served while most of the write-backs are still waiting.
#[test]
fn a_flusher_on_a_slow_backing_does_not_hold_up_hits() {
    let (_kit, port) = nbdkit(&["--filter=delay"], &["wdelay=10ms"]);
    let dir = tempfile::tempdir().unwrap();
    let r = behind(&dir, port, "size = \"4MiB\"\nflush_rate = \"64MiB\"", "d", "wb");
    let (mut c, _) = Client::connect(r.tcp.unwrap(), "d");
    for i in 0..200u64 {
        c.write(i * 4096, &[i as u8; 4096], false).unwrap();
    }
    // Wait for the flusher's first step to start (a step covers all 200 blocks).
    while r.daemon.occupancy(0).1 == 200 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    c.write(300 * 4096, &[7; 4096], false).unwrap();
    assert_eq!(c.read(300 * 4096, 4096).unwrap(), vec![7u8; 4096]);
    let written_back = r.daemon.destaged_blocks();
    assert!(written_back < 100, "the hit waited for {written_back} write-backs");
    r.daemon.destage(0).unwrap();
    assert_eq!(r.daemon.occupancy(0).1, 0);
    assert!(r.daemon.destaged_blocks() >= 200);
}

/// A backing server that takes only three clients (nbdkit's limit filter rejects the
/// rest): the daemon keeps the connections it got instead of failing to start.
#[test]
fn a_backing_with_a_connection_limit_is_used_with_what_it_allows() {
    let (_kit, port) = nbdkit(&["--filter=limit"], &["limit=3"]);
    let dir = tempfile::tempdir().unwrap();
    let r = behind(&dir, port, "size = \"1MiB\"", "d", "wt");
    let (mut c, _) = Client::connect(r.tcp.unwrap(), "d");
    for i in 0..64u64 {
        c.write(i * 4096, &[i as u8 + 1; 4096], false).unwrap();
    }
    r.daemon.resize(0, 0).unwrap(); // every read below comes from the backing server
    for i in 0..64u64 {
        assert_eq!(c.read(i * 4096, 4096).unwrap(), vec![i as u8 + 1; 4096]);
    }
}

/// Prefetch from a slow NBD backing (nbdkit's delay filter: 2 ms a read): a sequential
/// reader, one 4 KiB read at a time, reads 2 MiB the store holds. With `prefetch = "amp"`
/// its reads after the first few hit blocks the prefetch loaded (every byte as the store
/// has it); without, every read goes to the store. The wall times are printed, not
/// asserted (`docs/daemon.md` has the measurement).
#[test]
fn amp_prefetch_serves_a_sequential_reader_of_a_slow_store_from_the_cache() {
    let (_kit, port) = nbdkit(&["--filter=delay"], &["rdelay=2ms"]);
    let mut direct = cachevisor_nbd::client::Client::connect(
        format!("127.0.0.1:{port}").parse::<std::net::SocketAddr>().unwrap(),
        "",
    )
    .unwrap();
    for i in 0..512u64 {
        direct.write(i * 4096, &[(i % 251) as u8; 4096], false).unwrap().unwrap();
    }
    let mut secs = Vec::new();
    for prefetch in ["none", "amp"] {
        let dir = tempfile::tempdir().unwrap();
        let c = ServeConfig::new("16MiB").cache("path", "c.img").vdisk(
            "seq",
            &format!("nbd://127.0.0.1:{port}/"),
            &[("write_policy", s("wt")), ("prefetch", s(prefetch))],
        );
        let r = serve(&parse(dir.path(), &c));
        let (mut client, _) = Client::connect(r.tcp.unwrap(), "seq");
        let t = std::time::Instant::now();
        for i in 0..512u64 {
            assert_eq!(client.read(i * 4096, 4096).unwrap(), vec![(i % 251) as u8; 4096], "{prefetch}: block {i}");
        }
        secs.push(t.elapsed().as_secs_f64());
        let st = r.daemon.status().into_iter().next().unwrap();
        let (hits, p) = (st.stats.hit_blocks, st.entry.prefetch);
        eprintln!("{prefetch}: {:.2} s for 512 reads, {hits} hits, {p:?}", secs.last().unwrap());
        if prefetch == "none" {
            assert!(p.is_none() && hits == 0, "{hits} hits without prefetch");
        } else {
            let p = p.expect("a prefetching vDisk reports its prefetch");
            assert!(hits >= 480 && p.counts.used >= 480 && p.counts.loaded >= p.counts.used, "{hits} hits, {p:?}");
        }
    }
    eprintln!("sequential 4 KiB reads from a 2 ms store: {:.1}x faster with amp", secs[0] / secs[1]);
}
