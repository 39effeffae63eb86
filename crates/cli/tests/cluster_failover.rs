//! Failover with prewarming, for real (the Nutanix study's slides): a node's
//! cache snapshots live in the cluster's shared directory (`cluster.snapshots`), the node
//! is SIGKILLed, its VMs restart on surviving nodes (the same vDisks exported there), the
//! leader moves their homes once the dead node's lease expired, and the node a vDisk
//! moved to prewarms it from the dead node's last snapshot — measured against a vDisk
//! restarted on a node that has no snapshots to read (cold).

use cachevisor_testkit as common;

use common::cluster::{formed, Cluster, TTL_MS};
use std::time::{Duration, Instant};

/// The working set each VM reads over and over (MiB).
const SET_MIB: u64 = 2;

/// The hit ratio of one read pass over the working set of `vdisk` on node k.
fn pass(c: &Cluster, k: usize, vdisk: &str) -> f64 {
    let (b0, h0) = c.hits(k, vdisk);
    c.io(k, vdisk, &[&format!("read -P 0x5a 0 {SET_MIB}M")]);
    let (b1, h1) = c.hits(k, vdisk);
    (h1 - h0) as f64 / (b1 - b0).max(1) as f64
}

#[test]
fn a_dead_nodes_vms_restart_elsewhere_prewarmed_from_its_last_snapshot_and_hit_at_once() {
    // n0 and n1 share snapshots; n2 keeps its own (a restart there is cold).
    let dir_extra = |k: usize| {
        let shared = if k < 2 { "snapshots = \"shared\"\n" } else { "" };
        format!("interval = \"300ms\"\n{shared}[prewarm]\nsnapshot_every = \"1s\"")
    };
    // The shared directory exists before the nodes start (a mistyped one is refused).
    let c = Cluster::with_nodes_in(3, dir_extra, |_| String::new(), |d| std::fs::create_dir(d.join("shared")).unwrap());
    formed(&c, 3);
    // n0 serves vm0 and a second VM, `cold`; both read their working set until it hits.
    for img in ["cold.img", "wb.img"] {
        std::fs::File::create(c.dir.path().join(img)).unwrap().set_len(16 << 20).unwrap();
    }
    c.add_vdisk(0, "cold", "cold.img");
    // And a write-back VM whose acknowledged writes sit in n0's cache.
    c.post(0, "/vdisks", &c.vdisk_body("wb", "wb.img", ", \"write_policy\": \"wb\""));
    c.io(0, "wb", &["write -P 0x77 0 1M"]);
    c.wait_all("wb marked write-back in the map", Duration::from_secs(5), |_, s| {
        s["map"]["vdisks"]["wb"]["write_back"] == true
    });
    // One node at a time: n1 may not serve vm0 while n0 (live) does.
    let (ok, text) = c.try_post(1, "/vdisks", &c.vdisk_body("vm0", "vm0.img", ""));
    assert!(!ok && text.contains("claimed by node n0"), "{text}");
    for v in ["vm0", "cold"] {
        let img = c.dir.path().join(format!("{v}.img"));
        let mut bytes = std::fs::read(&img).unwrap();
        bytes[..(SET_MIB << 20) as usize].fill(0x5a);
        std::fs::write(&img, bytes).unwrap();
    }
    let mut warm = [0.0; 2];
    for (i, v) in ["vm0", "cold"].iter().enumerate() {
        pass(&c, 0, v);
        warm[i] = pass(&c, 0, v);
        assert!(warm[i] > 0.9, "{v} hits on n0 before the failure: {}", warm[i]);
    }
    // A snapshot taken after the reads (every second), in the shared directory.
    let snaps = c.dir.path().join("shared/n0");
    let end = Instant::now() + Duration::from_secs(10);
    let count = || std::fs::read_dir(&snaps).map_or(0, |d| d.count());
    let before = count();
    while count() < before + 2 {
        assert!(Instant::now() < end, "n0 wrote no snapshot into {}: {}", snaps.display(), c.logs());
        std::thread::sleep(Duration::from_millis(100));
    }

    // n0 dies; its VMs restart on n1 (shared snapshots) and n2 (none).
    let killed = Instant::now();
    let mut c = c;
    c.nodes[0].as_mut().unwrap().kill9();
    c.nodes[0] = None;
    // Not before n0's lease expired: until then it is live, and it serves them.
    c.wait_all("n0 gone", Duration::from_secs(10), |_, s| !Cluster::members(s).contains(&"n0".to_string()));
    c.add_vdisk(1, "vm0", "vm0.img");
    c.add_vdisk(2, "cold", "cold.img");
    let s = c.wait_all("the dead node's vDisks homed where they restarted", Duration::from_secs(15), |_, s| {
        s["map"]["vdisks"]["vm0"]["home"] == "n1" && s["map"]["vdisks"]["cold"]["home"] == "n2"
    });
    let moved = killed.elapsed();
    let m = &s[0]["map"]["vdisks"];
    assert_eq!(m["vm0"]["moved_from"], "n0", "{m:#}");
    // The write-back VM is not restarted elsewhere unasked: its last writes are in the
    // dead node's cache only (the backing store does not have them).
    let (ok, text) = c.try_post(2, "/vdisks", &c.vdisk_body("wb", "wb.img", ""));
    assert!(!ok && text.contains("was write-back on node n0, which is gone"), "{text}");
    assert!(std::fs::read(c.dir.path().join("wb.img")).unwrap()[..1 << 20].iter().any(|&b| b != 0x77));
    let (ok, text) = c.try_post(2, "/vdisks?force=maybe", &c.vdisk_body("wb", "wb.img", ""));
    assert!(!ok && text.contains("force"), "a malformed query is refused, naming it: {text}");
    c.post(2, "/vdisks?force=true", &c.vdisk_body("wb", "wb.img", ""));
    assert_eq!(m["cold"]["moved_from"], "n0", "{m:#}");
    // n1 prewarms vm0 from n0's snapshots.
    let end = Instant::now() + Duration::from_secs(15);
    let p = loop {
        let p = c.get(1, "/prewarm");
        if p["running"] == false && p["from"].as_str().is_some_and(|f| f.contains("shared/n0")) {
            break p;
        }
        assert!(Instant::now() < end, "no prewarm of vm0 on n1: {p:#}\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(50));
    };
    let prewarmed_in = killed.elapsed();
    assert!(p["error"].is_null(), "{p:#}");
    assert_eq!(p["matched_vdisks"], serde_json::json!(["vm0"]), "{p:#}");
    let loaded = p["loaded_blocks"].as_u64().unwrap();
    assert!(loaded * 4096 >= (SET_MIB << 20) * 9 / 10, "the working set loaded: {p:#}");
    // n2 has nothing to prewarm from.
    assert_eq!(c.get(2, "/prewarm")["planned_blocks"].as_u64().unwrap_or(0), 0);

    // The first pass after the restart: prewarmed hits at once, cold does not.
    let first = [pass(&c, 1, "vm0"), pass(&c, 2, "cold")];
    let second = [pass(&c, 1, "vm0"), pass(&c, 2, "cold")];
    eprintln!(
        "failover (lease TTL {TTL_MS} ms): homes moved {moved:?} after the kill, vm0 prewarmed on n1 {prewarmed_in:?} after \
         ({loaded} blocks); hit ratio before the failure vm0 {:.3} cold {:.3}; first pass after: prewarmed {:.3}, cold \
         {:.3}; second pass: {:.3}, {:.3}",
        warm[0], warm[1], first[0], first[1], second[0], second[1]
    );
    assert!(first[0] >= warm[0] - 0.05, "the prewarmed VM is back at its hit ratio on its first pass: {first:?}");
    assert!(first[1] < 0.1, "the cold VM misses its first pass: {first:?}");
    assert!(second[1] > 0.9, "and hits from its second: {second:?}");

    // n1 restarts: the move was prewarmed once, it is not loaded again from n0's old
    // snapshots (n1 has its own history of vm0 by now).
    assert_eq!(c.logs().matches("prewarming them from the snapshots").count(), 1, "{}", c.logs());
    c.nodes[1].as_mut().unwrap().kill9();
    c.nodes[1] = Some(c.start(1)); // vm0 is served again (the API's additions are kept)
    c.wait_all("n1 back", Duration::from_secs(10), |_, s| Cluster::members(s).len() == 2 && s["serving"] == true);
    std::thread::sleep(Duration::from_millis(1500));
    let log = c.nodes[1].as_ref().unwrap().log();
    assert!(!log.contains("prewarming them from the snapshots"), "{log}");
}
