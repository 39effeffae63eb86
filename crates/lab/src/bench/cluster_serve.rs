//! `cachevisor bench cluster-serve`: ELICA on real daemons. Three
//! nodes on loopback, each `cachevisor serve` in front of its own slow backing store
//! (nbdkit's memory plugin behind its delay filter, standing in for an HDD), etcd started
//! by the bench (its path an argument), certificates made with openssl:
//! - **skewed placement**: node a's VM reads over more data than a caches, b's and c's
//!   VMs fit easily; fio on the three VMs at once, the cluster on (a borrows b's and c's
//!   lent cache by the leader's Eq. 4) against each node alone (ECI-like), interleaved
//!   rounds, medians: aggregate IOPS, a's p99, hit ratios;
//! - **remote hit cost**: one VM's working set all hits, in a local cache against mostly
//!   in a peer's lent region (the local store two units), queue depth 1; the extra per
//!   remote hit against the loopback round trip measured beside it;
//! - **a node's loss**: the lender SIGKILLed under a's load: the longest request (the
//!   stall) and the time until a's IOPS settle at their level without the lender;
//! - **replicated write-back** (`cluster_replica.rs`): random writes on a
//!   write-back vDisk logged on a peer, against write-back on one node and the backing
//!   store itself.
//!
//! Loopback has no real link: its round trip is tens of µs, so the remote-hit figure is
//! TLS, NBD and the daemon's cost over a fast link, not a datacentre's.

use crate::bench::cluster_nodes::{
    hits, lent_reads, loopback_rtt_us, make_pki, ratio, remote_units, start_etcd, start_nodes, Node, Role, NAMES,
};
use crate::bench::median;
use crate::bench::serve::{fio_with, FioReads};
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// What the bench runs.
#[derive(Debug, Clone)]
pub struct Opts {
    /// The etcd binary.
    pub etcd: PathBuf,
    /// Delay of each backing request (ms).
    pub delay_ms: u32,
    /// Seconds per measured run.
    pub secs: u32,
    /// Interleaved rounds.
    pub rounds: usize,
    /// Cache per node (MiB).
    pub cache_mib: u64,
    /// Node a's working set (MiB).
    pub set_mib: u64,
    /// What b and c lend a (MiB each).
    pub lend_mib: u64,
    /// Which parts run: `skew`, `hit`, `loss`, `replica`.
    pub parts: Vec<String>,
    /// Working directory.
    pub dir: PathBuf,
}

/// b's and c's working sets (MiB).
const SMALL_SET_MIB: u64 = 8;
/// b's and c's request rates (per second).
const SMALL_RATE: u32 = 1000;

/// Warms a's VM: a sequential pass, then (in a cluster) random passes until the leader
/// lends it cache and its hit ratio stops rising.
fn warm(a: &Node, set: &str, cluster: bool) -> anyhow::Result<()> {
    fio_with(&a.uri, "read", 16, 0, set, &[])?;
    if !cluster {
        return fio_with(&a.uri, "read", 16, 0, set, &[]).map(drop);
    }
    let end = Instant::now() + Duration::from_secs(60);
    while remote_units(&a.api, "vm-a") == 0 {
        if Instant::now() > end {
            bail!("the leader lent node a nothing within 60 s");
        }
        fio_with(&a.uri, "randread", 16, 2, set, &["--norandommap"])?;
    }
    let mut last = 0.0;
    for _ in 0..10 {
        let h0 = hits(&a.api)?;
        fio_with(&a.uri, "read", 16, 0, set, &[])?;
        let r = ratio(h0, hits(&a.api)?);
        if r < last + 0.01 {
            break;
        }
        last = r;
    }
    Ok(())
}

/// One measured run of the skewed placement: fio on every node at once.
struct SkewRun {
    fio: Vec<FioReads>,
    a_hit: f64,
}

fn skew_run(o: &Opts, nodes: &[Node]) -> anyhow::Result<SkewRun> {
    let h0 = hits(&nodes[0].api)?;
    let secs = o.secs;
    let sets = [format!("{}MiB", o.set_mib), format!("{SMALL_SET_MIB}MiB"), format!("{SMALL_SET_MIB}MiB")];
    let runs: Vec<_> = nodes
        .iter()
        .zip(sets)
        .enumerate()
        .map(|(i, (n, set))| {
            let uri = n.uri.clone();
            // b's and c's VMs are light (the placement's premise: they have cache to
            // spare), at a fixed rate: on one machine their daemons share its cores with
            // a's, and an unthrottled run would measure that contention, not the cluster.
            let (depth, rate) = if i == 0 { (4, None) } else { (1, Some(format!("--rate_iops={SMALL_RATE}"))) };
            std::thread::spawn(move || {
                let mut extra = vec!["--norandommap"];
                extra.extend(rate.as_deref());
                fio_with(&uri, "randread", depth, secs, &set, &extra)
            })
        })
        .collect();
    let fio = runs.into_iter().map(|t| t.join().expect("fio thread")).collect::<anyhow::Result<Vec<_>>>()?;
    Ok(SkewRun { fio, a_hit: ratio(h0, hits(&nodes[0].api)?) })
}

/// The roles of the skewed placement: each node alone, or a borrowing from b and c.
fn skew_roles(o: &Opts, pki: &Path, cluster: bool) -> Vec<Role> {
    NAMES
        .iter()
        .map(|n| Role {
            cache_mib: o.cache_mib,
            vdisk_extra: String::new(),
            cluster: cluster.then(|| match *n {
                "a" => format!(
                    "peers = [\"b\", \"c\"]\nborrow = \"{}MiB\"\npeer_tls_dir = \"{}\"",
                    o.lend_mib,
                    pki.join("a-client").display()
                ),
                _ => format!("lend = \"{}MiB\"", o.lend_mib),
            }),
        })
        .collect()
}

/// Runs the bench.
pub fn run(o: &Opts) -> anyhow::Result<()> {
    std::fs::create_dir_all(&o.dir)?;
    let dir = std::fs::canonicalize(&o.dir)?;
    let pki = make_pki(&dir)?;
    let (_etcd, etcd) = start_etcd(&o.etcd, &dir)?;
    for p in &o.parts {
        if !["skew", "hit", "loss", "replica"].contains(&p.as_str()) {
            bail!("--parts: `{p}` is not skew, hit, loss or replica");
        }
    }
    let part = |p: &str| o.parts.iter().any(|x| x == p);
    if part("skew") {
        skewed(o, &dir, &pki, &etcd)?;
    }
    if part("hit") {
        remote_hit_cost(o, &dir, &pki, &etcd)?;
    }
    if part("loss") {
        node_loss(o, &dir, &pki, &etcd)?;
    }
    if part("replica") {
        crate::bench::cluster_replica::replicated_writes(o, &dir, &pki, &etcd)?;
    }
    Ok(())
}

/// The skewed placement, each node alone vs the cluster, interleaved rounds.
fn skewed(o: &Opts, dir: &Path, pki: &Path, etcd: &str) -> anyhow::Result<()> {
    let set = format!("{}MiB", o.set_mib);
    println!(
        "cluster-serve: three nodes on loopback, {} MiB cache each, backing stores with {} ms per request; node a's VM \
         reads {} MiB at random (iodepth 4), b's and c's {SMALL_SET_MIB} MiB (iodepth 1, {SMALL_RATE} requests/s); cluster: b and c lend a {} MiB \
         each over TLS NBD; {} s per run, {} interleaved rounds",
        o.cache_mib, o.delay_ms, o.set_mib, o.lend_mib, o.secs, o.rounds
    );
    println!(
        "{:<8} {:<6} {:>10} {:>10} {:>10} {:>11} {:>9} {:>9} {:>9} {:>7}",
        "mode", "round", "a IOPS", "b IOPS", "c IOPS", "total IOPS", "a p99 µs", "b p99 µs", "c p99 µs", "a hit%"
    );
    let (mut alone, mut together) = (Vec::new(), Vec::new());
    for round in 0..o.rounds.max(1) {
        for cluster in [false, true] {
            let mode = if cluster { "cluster" } else { "alone" };
            let run_dir = dir.join(format!("{mode}-{round}"));
            let _ = std::fs::remove_dir_all(&run_dir);
            let nodes = start_nodes(
                o,
                &run_dir,
                pki,
                etcd,
                &format!("{mode}-{round}"),
                &skew_roles(o, pki, cluster),
                cluster && round == 0,
            )?;
            warm(&nodes[0], &set, cluster)?;
            for n in &nodes[1..] {
                fio_with(&n.uri, "read", 4, 0, &format!("{SMALL_SET_MIB}MiB"), &[])?;
            }
            let r = skew_run(o, &nodes)?;
            let total: f64 = r.fio.iter().map(|f| f.iops).sum();
            println!(
                "{mode:<8} {round:<6} {:>10.0} {:>10.0} {:>10.0} {total:>11.0} {:>9.0} {:>9.0} {:>9.0} {:>7.1}",
                r.fio[0].iops,
                r.fio[1].iops,
                r.fio[2].iops,
                r.fio[0].p99_us,
                r.fio[1].p99_us,
                r.fio[2].p99_us,
                r.a_hit * 100.0
            );
            if cluster && round == 0 {
                let v: serde_json::Value =
                    ureq::get(&format!("http://{}/cluster", nodes[0].api)).call()?.into_json()?;
                println!(
                    "         the leader's allocation for a's VM (units of 1 MiB): {}",
                    v["allocation"]["vms"]["vm-a"]
                );
                predicted(o, &run_dir, nodes, r.a_hit)?;
            }
            if cluster { &mut together } else { &mut alone }.push(r);
        }
    }
    let med = |v: &[SkewRun], f: &dyn Fn(&SkewRun) -> f64| median(v.iter().map(f).collect());
    let total = |r: &SkewRun| r.fio.iter().map(|f| f.iops).sum::<f64>();
    let p99 = |r: &SkewRun| r.fio[0].p99_us;
    let worst_p99 = |r: &SkewRun| r.fio.iter().map(|f| f.p99_us).fold(0.0, f64::max);
    let (ti, ci) = (med(&alone, &total), med(&together, &total));
    let (tp, cp) = (med(&alone, &p99), med(&together, &p99));
    println!(
        "median: total IOPS alone {ti:.0}, cluster {ci:.0} ({:.2}x); a's p99 alone {tp:.0} µs, cluster {cp:.0} µs ({:.2}x lower); \
         worst p99 of the three alone {:.0} µs, cluster {:.0} µs; a's hit ratio alone {:.1}%, cluster {:.1}%",
        ci / ti,
        tp / cp,
        med(&alone, &worst_p99),
        med(&together, &worst_p99),
        med(&alone, &|r| r.a_hit) * 100.0,
        med(&together, &|r| r.a_hit) * 100.0
    );
    println!(
        "target: the cluster beats each node alone in IOPS and p99 on the skewed placement: {}",
        if ci > ti && cp < tp { "met" } else { "NOT met" }
    );
    Ok(())
}

/// A remote hit against a local one, queue depth 1, interleaved rounds.
fn remote_hit_cost(o: &Opts, dir: &Path, pki: &Path, etcd: &str) -> anyhow::Result<()> {
    const SET_MIB: u64 = 16;
    const LOCAL_MIB: u64 = 2;
    let set = format!("{SET_MIB}MiB");
    let rtt = loopback_rtt_us()?;
    let (mut local, mut mixed, mut f_local) = (Vec::new(), Vec::new(), Vec::new());
    println!(
        "remote hit: a {SET_MIB} MiB working set all hits at iodepth 1, in a local cache ({} MiB) vs in b's lent region \
         (a's local store {LOCAL_MIB} MiB, b lends {} MiB)",
        SET_MIB * 4,
        SET_MIB * 2
    );
    println!(
        "{:<6} {:>16} {:>11} {:>16} {:>11} {:>16}",
        "round", "local mean µs", "local hit%", "mixed mean µs", "mixed hit%", "remote share"
    );
    for round in 0..o.rounds.max(1) {
        for remote in [false, true] {
            let mode = if remote { "remote" } else { "local" };
            let run_dir = dir.join(format!("hit-{mode}-{round}"));
            let _ = std::fs::remove_dir_all(&run_dir);
            let roles: Vec<Role> = NAMES
                .iter()
                .map(|n| Role {
                    vdisk_extra: String::new(),
                    cache_mib: if !remote {
                        SET_MIB * 4
                    } else if *n == "a" {
                        LOCAL_MIB
                    } else {
                        SET_MIB * 2
                    },
                    cluster: remote.then(|| match *n {
                        "a" => format!(
                            "peers = [\"b\"]\nborrow = \"{}MiB\"\npeer_tls_dir = \"{}\"",
                            SET_MIB * 2,
                            pki.join("a-client").display()
                        ),
                        "b" => format!("lend = \"{}MiB\"", SET_MIB * 2),
                        _ => String::new(),
                    }),
                })
                .collect();
            let nodes = start_nodes(o, &run_dir, pki, etcd, &format!("hit-{mode}-{round}"), &roles, false)?;
            let a = &nodes[0];
            warm(a, &set, remote)?;
            let h0 = hits(&a.api)?;
            let l0 = if remote { lent_reads(&nodes[1].api, "a")? } else { (0, 0.0) };
            let f = fio_with(&a.uri, "randread", 1, o.secs, &set, &["--norandommap"])?;
            let h1 = hits(&a.api)?;
            let hit = ratio(h0, h1);
            if remote {
                // The share of a's block reads b's lent region served (its metrics).
                let l1 = lent_reads(&nodes[1].api, "a")?;
                let share = (l1.0 - l0.0) as f64 / (h1.0 - h0.0).max(1) as f64;
                f_local.push(1.0 - share.min(1.0));
                mixed.push((f, hit));
            } else {
                local.push((f, hit));
            }
        }
        let (l, m) = (&local[round], &mixed[round]);
        println!(
            "{round:<6} {:>16.1} {:>11.1} {:>16.1} {:>11.1} {:>15.1}%",
            l.0.mean_us,
            l.1 * 100.0,
            m.0.mean_us,
            m.1 * 100.0,
            (1.0 - f_local[round]) * 100.0
        );
    }
    let lm = median(local.iter().map(|x| x.0.mean_us).collect());
    let mm = median(mixed.iter().map(|x| x.0.mean_us).collect());
    let fl = median(f_local.clone());
    let remote_us = (mm - fl * lm) / (1.0 - fl);
    let extra = remote_us - lm;
    println!(
        "median: local hit {lm:.1} µs, remote hit {remote_us:.1} µs (from the mixed mean, {:.0}% of hits remote): \
         {extra:.1} µs more; loopback round trip {rtt:.1} µs; target ≤ round trip + 50 µs = {:.1} µs: {}",
        (1.0 - fl) * 100.0,
        rtt + 50.0,
        if extra <= rtt + 50.0 { "met" } else { "NOT met" }
    );
    Ok(())
}

/// SIGKILL of a lender under a's load: the stall and the recovery.
fn node_loss(o: &Opts, dir: &Path, pki: &Path, etcd: &str) -> anyhow::Result<()> {
    let run_dir = dir.join("loss");
    let _ = std::fs::remove_dir_all(&run_dir);
    let nodes = start_nodes(o, &run_dir, pki, etcd, "loss", &skew_roles(o, pki, true), false)?;
    let set = format!("{}MiB", o.set_mib);
    warm(&nodes[0], &set, true)?;
    let secs = o.secs.max(8);
    let kill_at = Duration::from_secs(secs as u64 / 3);
    let log = run_dir.join("a");
    let b_pid = nodes[1].proc.0.id();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(kill_at);
        let _ = Command::new("kill").args(["-KILL", &b_pid.to_string()]).status();
        Instant::now()
    });
    let started = Instant::now();
    let f = fio_with(
        &nodes[0].uri,
        "randread",
        4,
        secs,
        &set,
        &["--norandommap", &format!("--write_iops_log={}", log.display()), "--log_avg_msec=250"],
    )?;
    let killed = killer.join().expect("killer").duration_since(started).as_secs_f64();
    let text = std::fs::read_to_string(format!("{}_iops.1.log", log.display())).context("fio's IOPS log")?;
    let points: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| {
            let mut it = l.split(',').map(str::trim);
            Some((it.next()?.parse::<f64>().ok()? / 1000.0, it.next()?.parse::<f64>().ok()?))
        })
        .collect();
    let before = median(points.iter().filter(|p| p.0 < killed).map(|p| p.1).collect());
    let after_level = median(points.iter().filter(|p| p.0 > secs as f64 - 2.0).map(|p| p.1).collect());
    let recovered = points.iter().find(|p| p.0 > killed + 0.25 && p.1 >= 0.9 * after_level).map(|p| p.0 - killed);
    println!(
        "lender b SIGKILLed {killed:.2} s into a {secs} s run on a (iodepth 4): longest request {:.0} ms (lease TTL 2 s); \
         a's IOPS {before:.0} before, {after_level:.0} after (its lent share on b gone); back at 90% of that level {}",
        f.max_us / 1000.0,
        recovered.map_or("not within the run".to_string(), |s| format!("{s:.2} s after the kill"))
    );
    drop(nodes);
    Ok(())
}

/// The simulator's cluster mode on what the nodes served (their recordings, whole runs:
/// warm-up and measured run), with the same caches, unit, Eq. 1 cut and interval: a's
/// hit ratio predicted against what a's daemon counted, over the whole run and over the
/// measured run (`measured`: the daemon's; the simulator's last `secs` of trace time).
fn predicted(o: &Opts, dir: &Path, nodes: Vec<Node>, measured: f64) -> anyhow::Result<()> {
    let whole: Vec<(u64, u64)> = nodes.iter().map(|n| hits(&n.api)).collect::<anyhow::Result<_>>()?;
    for mut n in nodes {
        // A clean stop (SIGTERM) finishes the recording.
        Command::new("kill").args(["-TERM", &n.proc.0.id().to_string()]).status()?;
        n.proc.0.wait()?;
    }
    let mut sc = cachevisor_sim::Scenario::default();
    sc.replay.mode = cachevisor_sim::scenario::ReplayMode::Open;
    sc.replay.window = "1s".into();
    sc.trace.files = NAMES.iter().map(|n| dir.join(format!("{n}.rec.csv"))).collect();
    sc.trace.vm_mode = Some(cachevisor_trace::VmMode::Device);
    sc.trace.skip_bad = true;
    // A lender's SSD in the simulator is one cache shared by its VMs and its borrowers:
    // its own cache and what it lends.
    let caches = [o.cache_mib, o.cache_mib + o.lend_mib, o.cache_mib + o.lend_mib];
    sc.node = NAMES
        .iter()
        .zip(caches)
        .map(|(n, c)| cachevisor_sim::cluster_sim::NodeSection {
            name: n.to_string(),
            cache: format!("{c}MiB"),
            ssd: None,
            link: None,
        })
        .collect();
    sc.vm = NAMES
        .iter()
        .map(|n| cachevisor_sim::scenario::VmSection {
            node: Some(n.to_string()),
            ..cachevisor_sim::scenario::VmSection::named(&format!("vm-{n}"))
        })
        .collect();
    sc.cluster = Some(cachevisor_sim::cluster_sim::ClusterSection::default());
    let r = cachevisor_sim::cluster_sim::simulate_cluster(&sc, &mut |_| {})
        .map_err(|e| anyhow::anyhow!("simulating the recorded cluster: {e}"))?;
    let a: Vec<_> = r.windows.iter().filter(|w| w.vm == "vm-a").collect();
    let end = a.iter().map(|w| w.t_end_s).fold(0.0, f64::max);
    let last: Vec<_> = a.iter().filter(|w| w.t_end_s > end - o.secs as f64 + 0.5).collect();
    let acc: u64 = last.iter().map(|w| w.accesses).sum();
    let sim_last = last.iter().map(|w| w.hit_ratio * w.accesses as f64).sum::<f64>() / acc.max(1) as f64;
    println!(
        "         simulator on node a's measured run (its last {} s of trace time, {acc} blocks): predicted {:.2}% vs daemon \
         {:.2}% ({:+.2} points; target within 2)",
        o.secs,
        sim_last * 100.0,
        measured * 100.0,
        (sim_last - measured) * 100.0
    );
    for (n, (blocks, hit)) in NAMES.iter().zip(&whole) {
        let live = *hit as f64 / (*blocks).max(1) as f64;
        let sim = r.vms.iter().find(|v| v.name == format!("vm-{n}")).map_or(f64::NAN, |v| v.hit_ratio);
        println!(
            "         simulator on node {n}'s recording (whole run, {blocks} blocks): predicted {:.2}% vs daemon {:.2}% \
             ({:+.2} points; target within 2)",
            sim * 100.0,
            live * 100.0,
            (sim - live) * 100.0
        );
    }
    Ok(())
}
