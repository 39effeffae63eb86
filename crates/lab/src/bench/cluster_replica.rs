//! `bench cluster-serve --parts replica`: replicated write-back's cost (target:
//! "replicated write-back at least 3x the backing store's write IOPS", and "the cost of
//! the two-node replica on write latency"). Node a's write-back vDisk takes random 4 KiB
//! writes (fio, iodepth 16) over a working set its cache holds: with its writes logged on
//! b (`cluster.replica = "b"`, b's log `O_DSYNC` on b's disk) against the same daemons
//! without a replica (write-back on one node), and fio straight at a's backing store
//! (nbdkit with the bench's delay) — interleaved rounds, medians. The log is trimmed
//! during the runs when half full (a destage, then a new tail): its cost is in the figure.

use crate::bench::cluster_nodes::{start_nodes, Node, Role, NAMES};
use crate::bench::cluster_serve::Opts;
use crate::bench::median;
use crate::bench::serve::{fio_with, FioReads};
use anyhow::bail;
use std::path::Path;
use std::time::{Duration, Instant};

/// a's working set (MiB) and cache (MiB), b's log for a (MiB).
const SET_MIB: u64 = 16;
const CACHE_MIB: u64 = 64;
const LOG_MIB: u64 = 256;

/// The roles: a write-back, logging on b when `replica`; b keeping logs.
fn roles(pki: &Path, replica: bool) -> Vec<Role> {
    NAMES
        .iter()
        .map(|n| Role {
            cache_mib: CACHE_MIB,
            vdisk_extra: if *n == "a" { "write_policy = \"wb\"".into() } else { String::new() },
            cluster: Some(match (*n, replica) {
                ("a", true) => format!("replica = \"b\"\npeer_tls_dir = \"{}\"", pki.join("a-client").display()),
                ("b", _) => format!("replica_capacity = \"{LOG_MIB}MiB\""),
                _ => String::new(),
            }),
        })
        .collect()
}

/// a's replica figures (`GET /cluster`'s `replica`).
fn replica(a: &Node) -> anyhow::Result<serde_json::Value> {
    let v: serde_json::Value = ureq::get(&format!("http://{}/cluster", a.api)).call()?.into_json()?;
    Ok(v["replica"].clone())
}

/// Waits until a's log is healthy (its first resync done).
fn healthy(a: &Node) -> anyhow::Result<()> {
    let end = Instant::now() + Duration::from_secs(30);
    while replica(a)?["health"] != "healthy" {
        if Instant::now() > end {
            bail!("node a's replica log not healthy within 30 s: {}", replica(a)?);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// The part.
pub(crate) fn replicated_writes(o: &Opts, dir: &Path, pki: &Path, etcd: &str) -> anyhow::Result<()> {
    let set = format!("{SET_MIB}MiB");
    println!(
        "replicated write-back: node a's write-back vDisk, random 4 KiB writes at iodepth 16 over {SET_MIB} MiB ({CACHE_MIB} MiB \
         cache), {} s per run: logged on b (a {LOG_MIB} MiB log, O_DSYNC) vs write-back on a alone vs the backing store \
         itself ({} ms per request); {} interleaved rounds",
        o.secs, o.delay_ms, o.rounds
    );
    println!(
        "{:<6} {:>13} {:>13} {:>13} {:>12} {:>12} {:>12} {:>12} {:>7}",
        "round",
        "backing IOPS",
        "local IOPS",
        "replica IOPS",
        "local µs",
        "replica µs",
        "local p99",
        "replica p99",
        "trims"
    );
    let (mut backing, mut local, mut replicated): (Vec<FioReads>, Vec<FioReads>, Vec<FioReads>) = Default::default();
    let mut notes: Vec<serde_json::Value> = Vec::new();
    for round in 0..o.rounds.max(1) {
        for with_replica in [false, true] {
            let mode = if with_replica { "replica" } else { "local" };
            let run_dir = dir.join(format!("wb-{mode}-{round}"));
            let _ = std::fs::remove_dir_all(&run_dir);
            let nodes =
                start_nodes(o, &run_dir, pki, etcd, &format!("wb-{mode}-{round}"), &roles(pki, with_replica), false)?;
            let a = &nodes[0];
            if with_replica {
                healthy(a)?;
            } else {
                // The backing store alone, in the same round.
                backing.push(fio_with(&a.backing_uri, "randwrite", 16, o.secs, &set, &["--norandommap"])?);
            }
            let f = fio_with(&a.uri, "randwrite", 16, o.secs, &set, &["--norandommap"])?;
            if with_replica {
                let r = replica(a)?;
                notes.push(r.clone());
                if r["health"] != "healthy" || r["bypassed"].as_u64().unwrap_or(0) > 0 {
                    bail!("the log was not healthy throughout the run: {r}");
                }
                replicated.push(f);
            } else {
                local.push(f);
            }
        }
        let (b, l, r) = (&backing[round], &local[round], &replicated[round]);
        println!(
            "{round:<6} {:>13.0} {:>13.0} {:>13.0} {:>12.1} {:>12.1} {:>12.0} {:>12.0} {:>7}",
            b.iops, l.iops, r.iops, l.mean_us, r.mean_us, l.p99_us, r.p99_us, notes[round]["trims"]
        );
    }
    let med = |v: &[FioReads], f: fn(&FioReads) -> f64| median(v.iter().map(f).collect());
    let (bi, li, ri) = (med(&backing, |f| f.iops), med(&local, |f| f.iops), med(&replicated, |f| f.iops));
    let (lm, rm) = (med(&local, |f| f.mean_us), med(&replicated, |f| f.mean_us));
    let (lp, rp) = (med(&local, |f| f.p99_us), med(&replicated, |f| f.p99_us));
    let per_write: Vec<f64> = notes
        .iter()
        .map(|r| r["records"].as_f64().unwrap_or(0.0) / r["writes"].as_f64().unwrap_or(1.0).max(1.0))
        .collect();
    let write_us: Vec<f64> = notes.iter().map(|r| r["write_mean_us"].as_f64().unwrap_or(0.0)).collect();
    println!("records per write to b (group commit), by round: {per_write:.1?}; mean write to b, µs: {write_us:.0?}");
    println!(
        "median: backing store {bi:.0} IOPS, write-back on a alone {li:.0}, replicated {ri:.0} ({:.2}x the backing store, \
         {:.2}x write-back alone); write latency {lm:.1} -> {rm:.1} µs mean (+{:.1} µs for the replica), p99 {lp:.0} -> \
         {rp:.0} µs; target replicated >= 3x the backing store's write IOPS: {}",
        ri / bi,
        ri / li,
        rm - lm,
        if ri >= 3.0 * bi { "met" } else { "NOT met" }
    );
    Ok(())
}
