//! Replicated write-back between real nodes ("durability beyond ELICA"): n0's
//! write-back vDisks log every client write on n1 (`cluster.replica = "n1"`, a log n1
//! keeps `O_DSYNC` and exports over TLS NBD) before answering it. n0 is SIGKILLed with
//! acknowledged writes in its cache only; the vDisk restarts on n2, which replays n0's
//! log from n1 into the backing store first — every acknowledged byte is there, a write
//! that went around the cache (a tombstone) is not rolled back — while a vDisk configured
//! `replicate = false` is refused as before. And when the replica peer dies, n0's writes
//! stall at most the replica timeout, go through to the backing store meanwhile, and the
//! log comes back once the peer does.

use cachevisor_testkit as common;

use common::cluster::{formed, Cluster};
use serde_json::Value;
use std::time::{Duration, Instant};

/// Three nodes: n0 logs on n1, which keeps logs (TLS on); n0 and n2 hold client
/// certificates (n2 reads n0's log once n0 is gone). The PKI's directory is kept beside.
fn replicated(replica_timeout: &str) -> (Cluster, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let pki = common::certs::Pki::new(&dir.path().join("pki"));
    let keeper = pki.server("srv1", "/CN=n1", "IP:10.77.0.2");
    let certs: Vec<_> = (0..3).map(|k| pki.client(&format!("n{k}"), &format!("/CN=n{k}"), None, 1)).collect();
    let extra = |k: usize| {
        let base = format!("interval = \"300ms\"\npeer_tls_dir = \"{}\"\n", certs[k].display());
        match k {
            0 => format!("{base}replica = \"n1\"\nreplica_timeout = \"{replica_timeout}\""),
            1 => format!("{base}replica_capacity = \"4MiB\""),
            _ => base,
        }
    };
    let c = Cluster::with_nodes(3, extra, |k| {
        if k == 1 {
            format!("tls = \"on\"\ntls_dir = \"{}\"\n", keeper.display())
        } else {
            String::new()
        }
    });
    formed(&c, 3);
    (c, dir)
}

/// n0's replica log once it is healthy (its first resync done).
fn healthy(c: &Cluster) -> Value {
    let s = c.wait_all("n0's replica log healthy", Duration::from_secs(20), |k, s| {
        k != 0 || s["replica"]["health"] == "healthy"
    });
    s[0]["replica"].clone()
}

/// n0 serves two write-back vDisks: `wb` (replicated) and `solo` (`replicate = false`).
fn wb_and_solo(c: &Cluster) {
    for img in ["wb.img", "solo.img"] {
        std::fs::File::create(c.dir.path().join(img)).unwrap().set_len(16 << 20).unwrap();
    }
    c.post(0, "/vdisks", &c.vdisk_body("wb", "wb.img", ", \"write_policy\": \"wb\""));
    c.post(0, "/vdisks", &c.vdisk_body("solo", "solo.img", ", \"write_policy\": \"wb\", \"replicate\": false"));
}

fn image(c: &Cluster, name: &str) -> Vec<u8> {
    std::fs::read(c.dir.path().join(name)).unwrap()
}

#[test]
fn a_dead_owners_acknowledged_writes_are_replayed_from_its_replica_before_its_vdisk_restarts() {
    let (c, _pki) = replicated("2s");
    wb_and_solo(&c);
    let before = healthy(&c);
    // Acknowledged writes: whole blocks (cached dirty: data records), then an unaligned
    // one inside them (around the cache: the block written back first, a tombstone).
    c.io(0, "wb", &["write -P 0x77 0 1M", "write -P 0x78 1M 512k", "write -P 0x7a 100000 1000"]);
    c.io(0, "solo", &["write -P 0x55 0 1M"]);
    let st = c.get(0, "/cluster");
    let records = st["replica"]["records"].as_u64().unwrap() - before["records"].as_u64().unwrap();
    assert!(records >= 384, "a record per block written, and a tombstone: {records}\n{st:#}");
    c.wait_all("both marked write-back in the map, wb replicated", Duration::from_secs(5), |_, s| {
        let v = &s["map"]["vdisks"];
        v["wb"]["write_back"] == true && v["wb"]["replicated"] == true && v["solo"]["write_back"] == true
    });
    // The backing store lacks them: they are in n0's cache and n1's log only.
    let img = image(&c, "wb.img");
    assert!(img[(1 << 20)..(3 << 19)].iter().any(|&b| b != 0x78), "the 0x78 writes are not on the backing store yet");

    let mut c = c;
    c.nodes[0].as_mut().unwrap().kill9();
    c.nodes[0] = None;
    c.wait_all("n0 gone", Duration::from_secs(10), |_, s| !Cluster::members(s).contains(&"n0".to_string()));
    // n1 keeps n0's log: not deleted while wb's writes may be only there.
    let log = c.dir.path().join("n1/cache.img.meta/replicas/n0.log");
    assert!(log.exists());
    let (ok, text) = c.try_delete(1, "/cluster/replicas/n0");
    assert!(!ok && text.contains("`wb`") && text.contains("restart them"), "{text}");
    assert!(log.exists());
    // The vDisk restarts on n2: n0's log is replayed first, no force needed.
    let t = Instant::now();
    c.post(2, "/vdisks", &c.vdisk_body("wb", "wb.img", ""));
    let replay = t.elapsed();
    let img = image(&c, "wb.img");
    let mut want = vec![0x77u8; 1 << 20];
    want.extend_from_slice(&[0x78; 1 << 19]);
    want[100_000..101_000].fill(0x7a);
    let diff = img[..want.len()].iter().zip(&want).position(|(a, b)| a != b);
    assert_eq!(diff, None, "first difference on the backing store after the replay\n{}", c.logs());
    c.io(2, "wb", &["read -P 0x77 0 100000", "read -P 0x7a 100000 1000", "read -P 0x78 1M 512k"]);
    assert!(c.logs().contains("replica log replayed onto the backing store"), "{}", c.logs());
    // The vDisk that kept its writes on n0 alone is refused, as before.
    let (ok, text) = c.try_post(2, "/vdisks", &c.vdisk_body("solo", "solo.img", ""));
    assert!(!ok && text.contains("no valid replica log"), "{text}");
    // Once wb is homed on n2, n1 may delete n0's log (a gone owner's log is otherwise
    // kept until it returns); a second time there is none.
    c.wait_all("wb homed on n2", Duration::from_secs(5), |_, s| s["map"]["vdisks"]["wb"]["home"] == "n2");
    let (ok, text) = c.try_delete(1, "/cluster/replicas/n0");
    assert!(ok && text.contains("freed_bytes"), "{text}");
    assert!(!log.exists());
    let (ok, text) = c.try_delete(1, "/cluster/replicas/n0");
    assert!(!ok && text.contains("no replica log"), "{text}");
    let (ok, text) = c.try_delete(1, "/cluster/replicas/..%2Fn1");
    assert!(!ok && text.contains("no replica log"), "a name that is no node's names no file: {text}");
    let (ok, text) = c.try_delete(1, "/cluster/replicas/n2");
    assert!(!ok, "a live member's log (or none) is not deleted: {text}");
    eprintln!("replica: {records} records logged; wb restarted on n2 with the replay in {replay:?}");
}

#[test]
fn a_lost_replica_peer_stalls_writes_at_most_the_timeout_then_they_go_through_and_the_log_comes_back() {
    let (c, _pki) = replicated("500ms");
    std::fs::File::create(c.dir.path().join("wb.img")).unwrap().set_len(16 << 20).unwrap();
    c.post(0, "/vdisks", &c.vdisk_body("wb", "wb.img", ", \"write_policy\": \"wb\""));
    let first = healthy(&c);
    c.io(0, "wb", &["write -P 0x31 0 256k"]);
    // n1's link is cut: n0's next write waits for its record at most the replica
    // timeout, then n0 tells etcd the log is void, and the write goes through.
    c.net.link(1, false);
    let stalled = c.io(0, "wb", &["write -P 0x32 256k 64k"]);
    let s = c.get(0, "/cluster");
    assert_ne!(s["replica"]["health"], "healthy", "{s:#}");
    assert!(stalled < Duration::from_millis(500 + 1500), "the write stalled {stalled:?}");
    let img = image(&c, "wb.img");
    assert!(img[256 << 10..320 << 10].iter().all(|&b| b == 0x32), "the write went through to the backing store");
    // Meanwhile the dirty blocks are drained (the log is void).
    let end = Instant::now() + Duration::from_secs(10);
    while image(&c, "wb.img")[..256 << 10].iter().any(|&b| b != 0x31) {
        assert!(Instant::now() < end, "the earlier dirty blocks not drained\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    // The peer is back: a new log, and writes are logged again.
    c.net.link(1, true);
    let back = healthy(&c);
    assert_ne!(back["log_id"], first["log_id"], "a new log after the resync: {back:#}");
    assert!(back["bypassed"].as_u64().unwrap() >= 1, "{back:#}");
    c.io(0, "wb", &["write -P 0x33 1M 64k"]);
    let after = c.get(0, "/cluster")["replica"].clone();
    assert!(after["records"].as_u64() > back["records"].as_u64(), "{after:#}");
    eprintln!(
        "replica peer cut off: a write stalled {stalled:?} (replica timeout 500 ms); longest wait {} us; \
         bypassed {}; log back as {}",
        s["replica"]["stall_max_us"], back["bypassed"], back["log_id"]
    );
}

/// A vDisk moved away while its write-back home was down — replayed on another node,
/// written there, then shut down there (the file is free again) — and the old home
/// restarts with its metadata: its dirty blocks of it are older than the backing store's
/// and are dropped, not written back (by the flusher or its log's resync) nor served; it
/// is served here again only when added back through the API. Its own vDisk's dirty
/// blocks are kept.
#[test]
fn a_returning_owner_drops_what_it_cached_of_a_vdisk_that_moved_and_never_writes_it_back() {
    let (c, _pki) = replicated("2s");
    wb_and_solo(&c);
    healthy(&c);
    c.io(0, "wb", &["write -P 0x77 0 1M"]);
    c.io(0, "solo", &["write -P 0x55 0 256k"]);
    assert!(image(&c, "wb.img")[..1 << 20].iter().any(|&b| b != 0x77), "0x77 in n0's cache (and n1's log) only");
    let mut c = c;
    c.nodes[0].as_mut().unwrap().kill9();
    c.nodes[0] = None;
    c.wait_all("n0 gone", Duration::from_secs(10), |_, s| !Cluster::members(s).contains(&"n0".to_string()));
    // wb restarts on n2 (replayed), whose VM writes newer data, then stops there.
    c.post(2, "/vdisks", &c.vdisk_body("wb", "wb.img", ""));
    c.wait_all("wb homed on n2", Duration::from_secs(10), |_, s| s["map"]["vdisks"]["wb"]["home"] == "n2");
    c.io(2, "wb", &["write -P 0x99 0 1M"]);
    c.delete(2, "/vdisks/wb");
    assert!(image(&c, "wb.img")[..1 << 20].iter().all(|&b| b == 0x99), "n2's writes on the backing store");
    // n0 comes back with its metadata: wb's dirty 0x77 blocks are in its cache still.
    c.nodes[0] = Some(c.start(0));
    let s = c.wait_all("n0 back, its log resynced (every dirty block destaged)", Duration::from_secs(30), |k, s| {
        k != 0 || (s["replica"]["health"] == "healthy" && s["serving"] == true)
    });
    let moved = &s[0]["moved_away"];
    assert_eq!(moved.as_array().map(Vec::len), Some(1), "{moved:#}");
    assert_eq!((moved[0]["vdisk"].as_str(), moved[0]["node"].as_str()), (Some("wb"), Some("n2")), "{moved:#}");
    assert!(moved[0]["dropped_dirty"].as_u64().unwrap() >= 256, "{moved:#}");
    // Every dirty block n0 holds destaged: its own vDisk's reach the backing store.
    c.post(0, "/destage", "{}");
    let end = Instant::now() + Duration::from_secs(10);
    while image(&c, "solo.img")[..256 << 10].iter().any(|&b| b != 0x55) {
        assert!(Instant::now() < end, "n0's own dirty blocks not written back\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    let img = image(&c, "wb.img");
    let stale = img[..1 << 20].iter().position(|&b| b != 0x99);
    assert_eq!(stale, None, "n0 wrote its stale blocks of wb over n2's\n{}", c.logs());
    assert!(c.logs().contains("moved to another node while this node was down"), "{}", c.logs());
    // n0 does not serve wb.
    let o = common::netns::Net::command(&c.net.nodes[0], "qemu-io")
        .args(["-f", "raw", &format!("nbd://{}:10809/wb", c.net.addr(0)), "-c", "read 0 4k"])
        .output()
        .unwrap();
    assert!(!o.status.success(), "n0 serves wb: {}", String::from_utf8_lossy(&o.stdout));
    // Added back through the API (n2 serves it no more): n2's data, nothing of n0's old.
    c.post(0, "/vdisks", &c.vdisk_body("wb", "wb.img", ""));
    c.io(0, "wb", &["read -P 0x99 0 1M"]);
    c.wait_all("wb homed on n0 again", Duration::from_secs(10), |_, s| s["map"]["vdisks"]["wb"]["home"] == "n0");
}
