//! `cachevisor bench cluster`: ELICA's allocation (Eq. 4) on synthetic clusters of 10 to
//! 500 VMs on 3 to 16 nodes — the objective and solve time of each solver side by side,
//! interleaved repetitions, medians (ELICA §4.2.7 reports its ILP at 18% of run time at
//! 500 VMs). The target: 500 VMs × 16 nodes in under 1 s, within 0.1% of the
//! ILP's objective. Solvers: the exact reference (per-node and pool tables), the ILP as
//! written (`good_lp` / `microlp`) and the fast one (a price on the cluster's capacity,
//! exact DPs per node).

use cachevisor_cluster::allocation::{Problem, Solver, VmCurve};
use cachevisor_cluster::model::Latencies;
use cachevisor_cluster::NodeId;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Instant;

/// A cluster of `vms` VMs round-robin on `nodes` nodes, each with a concave hit-ratio
/// curve of `levels` units (ideal size = `levels`, varied reach and ceiling, seeded), and
/// caches holding half the VMs' ideal sizes (so Eq. 2 fails and remote cache matters).
fn problem(vms: usize, nodes: usize, levels: usize, seed: u64) -> Problem {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let curves: Vec<VmCurve> = (0..vms)
        .map(|v| {
            let reach: f64 = rng.gen_range(0.5..(levels as f64));
            let ceiling: f64 = rng.gen_range(0.3..0.95);
            let hr = (0..=levels).map(|k| ceiling * (1.0 - (-(k as f64) / reach).exp())).collect();
            // Uneven placement: every third VM on node 0, the busy node.
            let home = if v % 3 == 0 { 0 } else { v % nodes };
            VmCurve { home: home as NodeId, hit_ratio: hr }
        })
        .collect();
    let per_node = (vms * levels / nodes / 2).max(1) as u64;
    let lat = Latencies { ssd_local_us: 90.0, ssd_remote_us: 90.0, network_us: 60.0, hdd_us: 6000.0 };
    Problem { lat, capacity: vec![per_node; nodes], vms: curves }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs the bench: every (VMs, nodes) pair, `reps` interleaved repetitions of each
/// solver; the exact one only up to `exact_vms` VMs and the ILP up to `ilp_vms` (their
/// times grow fast).
pub fn run(levels: usize, reps: usize, exact_vms: usize, ilp_vms: usize) -> anyhow::Result<()> {
    println!(
        "ELICA Eq. 4 allocation, {levels}-unit curves, caches at half the ideal sizes, median of {reps} (interleaved)"
    );
    println!(
        "{:>5} {:>6} {:>10} {:>10} {:>10} {:>14} {:>12} {:>12}",
        "VMs", "nodes", "exact (s)", "ILP (s)", "fast (s)", "fast objective", "vs ILP", "vs exact"
    );
    for (vms, nodes) in [(10, 3), (50, 3), (100, 8), (250, 8), (250, 16), (500, 16)] {
        let p = problem(vms, nodes, levels, (vms * 31 + nodes) as u64);
        let mut solvers = vec![(Solver::Fast, Vec::new(), None)];
        if vms <= ilp_vms {
            solvers.push((Solver::Ilp, Vec::new(), None));
        }
        if vms <= exact_vms {
            solvers.push((Solver::Exact, Vec::new(), None));
        }
        for _ in 0..reps.max(1) {
            for (solver, times, objective) in &mut solvers {
                let t = Instant::now();
                *objective = Some(solver.solve(&p).map_err(anyhow::Error::msg)?.total_avl);
                times.push(t.elapsed().as_secs_f64());
            }
        }
        let of = |s: Solver| solvers.iter().find(|x| x.0 == s).map(|x| (median(x.1.clone()), x.2.expect("ran")));
        let (fast_s, fast) = of(Solver::Fast).expect("always run");
        let time = |s: Solver| of(s).map_or("skipped".to_string(), |(t, _)| format!("{t:.3}"));
        let gap = |s: Solver| of(s).map_or("—".to_string(), |(_, o)| format!("{:+.4}%", (fast - o) / o * 100.0));
        println!(
            "{vms:>5} {nodes:>6} {:>10} {:>10} {fast_s:>10.3} {fast:>14.1} {:>12} {:>12}",
            time(Solver::Exact),
            time(Solver::Ilp),
            gap(Solver::Ilp),
            gap(Solver::Exact)
        );
    }
    println!("(vs: the fast objective's distance above the other solver's; the target is 500 × 16 in < 1 s within 0.1% of the ILP)");
    Ok(())
}

/// The cluster simulator at scale: `vms` generated VMs (strong, hot/cold and weak
/// locality in turn, 10% writes, seeded) on `nodes` nodes — every third VM on node 0,
/// the others round-robin —, `iops` each for `secs` of simulated time, open loop, 60 s
/// windows, 1 MiB allocation units; prints requests, wall time, simulated ÷ wall,
/// allocations and solver time, and the process's peak RSS.
pub fn run_sim(
    vms: usize,
    nodes: usize,
    secs: u64,
    iops: f64,
    cache: &str,
    mode: &str,
    migration: &str,
) -> anyhow::Result<()> {
    let scheme = match migration {
        "auto" => MigrationChoice::Auto,
        "gradual" => MigrationChoice::Gradual,
        "instant" => MigrationChoice::Instant,
        "off" => MigrationChoice::Off,
        m => anyhow::bail!("--migration: `{m}` is not auto, gradual, instant or off"),
    };
    use cachevisor_sim::cluster_sim::{simulate_cluster, ClusterMode, ClusterSection, MigrationChoice, NodeSection};
    use cachevisor_sim::scenario::{DeviceChoice, ReplayMode, SyntheticSection, VmSection};
    let mode = match mode {
        "elica" => ClusterMode::Elica,
        "local" => ClusterMode::Local,
        m => anyhow::bail!("--mode: `{m}` is not elica or local"),
    };
    anyhow::ensure!(vms > 0 && nodes > 0, "--vms and --nodes must be at least 1");
    let dir = std::env::temp_dir().join(format!("cachevisor-cluster-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    struct Cleanup<'a>(&'a std::path::Path);
    impl Drop for Cleanup<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(self.0);
        }
    }
    let _cleanup = Cleanup(&dir);
    let mut sc = cachevisor_sim::Scenario::default();
    sc.replay.mode = ReplayMode::Open;
    sc.replay.window = "60s".into();
    sc.devices.backing = DeviceChoice::Preset("hdd-7200".into());
    for v in 0..vms {
        let name = format!("vm{v:03}");
        let hot = ["[[4%, 95%]]", "[[20%, 80%]]", "[[100%, 100%]]"][v % 3];
        let path = dir.join(format!("{name}.yaml"));
        std::fs::write(
            &path,
            format!(
                "name: {name}\niops: {{randvar: normal, mean: {iops}, stddev: 0}}\nsector: {{size: 512b}}\ncluster: {{size: {{min: 1, max: 1}}, stride: {{min: 1, max: 1}}}}\nhotspots: {hot}\niosizes:\n  - [100%, 4096b]\ndisk_size: 256MiB\nduration: {secs}s\nread_ratio: 0.9\nseed: {}\n",
                v + 1
            ),
        )?;
        sc.synthetic.push(SyntheticSection { config: path, then: Vec::new() });
        let home = if v % 3 == 0 { 0 } else { v % nodes };
        sc.vm.push(VmSection { node: Some(format!("n{home}")), ..VmSection::named(&name) });
    }
    sc.node =
        (0..nodes).map(|i| NodeSection { name: format!("n{i}"), cache: cache.into(), ssd: None, link: None }).collect();
    let mut cl = ClusterSection { mode, ..ClusterSection::default() };
    cl.migration.scheme = scheme;
    sc.cluster = Some(cl);
    let mut bar = cachevisor_cli::progress::Progress::new("simulating the cluster");
    let t = Instant::now();
    let r = simulate_cluster(&sc, &mut |n| bar.update(n, None))?;
    bar.finish();
    let wall = t.elapsed().as_secs_f64();
    let requests: u64 = r.vms.iter().map(|v| v.requests).sum();
    println!(
        "{vms} VMs on {nodes} nodes ({cache} each, {mode:?}), {secs} s simulated at {iops} IOPS per VM: {requests} requests"
    );
    println!(
        "wall {wall:.1} s ({:.0}× real time, {:.2} M req/s); {} allocations, solver {:.2} s in all; peak RSS {}",
        secs as f64 / wall,
        requests as f64 / wall / 1e6,
        r.allocations,
        r.solve_s,
        cachevisor_trace::units::format_size(crate::bench::peak_rss_bytes())
    );
    println!(
        "hit ratio {:.1}%, {:.1}% of cache accesses remote, mean {:.2} ms, p99.9 {:.1} ms",
        r.hit_ratio * 100.0,
        r.remote_share * 100.0,
        r.mean_us / 1e3,
        r.p999_us / 1e3
    );
    // One SSD per node: what its own VMs and its borrowers held beyond it at once.
    let peak = r.nodes.iter().map(|n| n.overcommit_peak_blocks).max().unwrap_or(0);
    let block_s: f64 = r.nodes.iter().map(|n| n.overcommit_block_s).sum();
    println!(
        "over-commit (a node's SSD holding more than it has): peak {peak} blocks, {block_s:.0} block-seconds in all"
    );
    if let Some(m) = &r.migration {
        let c = &m.cost;
        let (g, i) = m.mean_times_s();
        let secs = |t: Option<f64>| t.map_or("-".to_string(), |t| format!("{t:.1} s"));
        println!(
            "migrations: {} gradual and {} instant started, {} finished (mean {} / {}), {} blocks copied",
            c.started_gradual,
            c.started_instant,
            c.finished,
            secs(g),
            secs(i),
            m.moved_blocks
        );
    }
    Ok(())
}
