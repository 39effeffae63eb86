//! What a cluster run measured (ELICA): per VM, per node and in all, and the
//! tables `cachevisor simulate` prints for a cluster scenario.

use crate::cluster_scenario::{ClusterMode, Plan};
use crate::cluster_sim::Vm;
use crate::device::SharedDevice;
use crate::metrics::VmStats;
use crate::node::Node;
use crate::scenario::Scenario;
use serde::Serialize;

/// A VM's figures at the end of a cluster run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterVm {
    /// Its name.
    pub name: String,
    /// Its node.
    pub node: String,
    /// Requests completed.
    pub requests: u64,
    /// Block hit ratio.
    pub hit_ratio: f64,
    /// Share of its cache accesses served by lent caches.
    pub remote_share: f64,
    /// Mean and 99.9th-percentile request latency, µs.
    pub mean_us: f64,
    /// See `mean_us`.
    pub p999_us: f64,
    /// 99.99th-percentile request latency, µs (ELICA Fig. 12c).
    pub p9999_us: f64,
    /// What its entry policies did (admission, prefetch, congestion bypass, I/O classes,
    /// its part of its node's write budget), as a one-host run reports it.
    #[serde(flatten)]
    pub entry: cachevisor_engine::EntryState,
    /// Its last allocation: local and remote blocks.
    pub local_blocks: u64,
    /// See `local_blocks`.
    pub remote_blocks: u64,
}

/// One VM's window in a cluster run (a row of `ClusterResult::windows`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterWindow {
    /// End of the window, seconds of virtual time.
    pub t_end_s: f64,
    /// The VM's name.
    pub vm: String,
    /// Its node.
    pub node: String,
    /// Block accesses in the window, and the hit ratio over them (0 when idle).
    pub accesses: u64,
    /// See `accesses`.
    pub hit_ratio: f64,
    /// The allocation made at the window's end: local and remote blocks.
    pub local_blocks: u64,
    /// See `local_blocks`.
    pub remote_blocks: u64,
}

/// A node's figures at the end of a cluster run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterNodeStats {
    /// Its name.
    pub name: String,
    /// Its cache, blocks.
    pub cache_blocks: u64,
    /// Bytes written to its SSD (its VMs' and its borrowers': wear, ELICA Fig. 16/17).
    pub ssd_written_bytes: u64,
    /// Bytes its link carried for remote ops.
    pub link_bytes: u64,
    /// Its SSD's busy time per channel, seconds (its load, ELICA-Load's signal).
    pub ssd_busy_s: f64,
    /// Blocks held on its SSD beyond its size — its VMs' local blocks plus its borrowers'
    /// — at worst (sampled every 100 ms), and integrated over time (block-seconds): the
    /// simulator lets both sides fill their shares while a paced shrink is still giving
    /// space back; a real lender cannot.
    pub overcommit_peak_blocks: u64,
    /// See `overcommit_peak_blocks`.
    pub overcommit_block_s: f64,
    /// Block reads its RAM tier served (`devices.ram`; 0 without one).
    #[serde(skip_serializing_if = "is_zero")]
    pub ram_hits: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What a cluster run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterResult {
    /// ELICA or local-only.
    pub mode: ClusterMode,
    /// Per VM.
    pub vms: Vec<ClusterVm>,
    /// Per node.
    pub nodes: Vec<ClusterNodeStats>,
    /// All VMs: block hit ratio, share served remotely, mean and p99.9 latency (µs).
    pub hit_ratio: f64,
    /// See `hit_ratio`.
    pub remote_share: f64,
    /// See `hit_ratio`.
    pub mean_us: f64,
    /// See `hit_ratio`.
    pub p999_us: f64,
    /// See `hit_ratio` (99.99th percentile).
    pub p9999_us: f64,
    /// Cache allocated to the VMs, averaged over the allocations (blocks; ELICA Fig. 9),
    /// and of it the blocks on lent caches (Fig. 11's remote share).
    pub mean_allocated_blocks: f64,
    /// See `mean_allocated_blocks`.
    pub mean_remote_blocks: f64,
    /// Per VM per window: accesses, hit ratio, the allocation made at its end.
    pub windows: Vec<ClusterWindow>,
    /// Allocations run, and the solver's total time (s).
    pub allocations: u64,
    /// See `allocations`.
    pub solve_s: f64,
    /// What migrations cost (§3.6), when migration is on.
    pub migration: Option<ClusterMigrationResult>,
    /// The data check's outcome, when `cluster.verify_data` is on.
    pub data_check: Option<DataCheckResult>,
    /// Dirty blocks held in lent caches at the end of the run, every node's (before any
    /// final flush): acknowledged writes a lender's loss would lose; 0 with
    /// `cluster.remote_writes = "through"`.
    pub lent_dirty_blocks: u64,
}

/// What the data check found (`cluster.verify_data`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DataCheckResult {
    /// Sectors of read replies checked against the last acknowledged write.
    pub sectors_checked: u64,
    /// Disk sectors whose final backing version was checked after the flush.
    pub sectors_flushed: u64,
    /// Stale or corrupt data found (the first error per node), empty when none.
    pub errors: Vec<String>,
}

/// Migration's figures in a cluster run (ELICA §3.6: time, reserved capacity, bandwidth).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterMigrationResult {
    /// The planner's account: migrations started and finished per scheme, their summed
    /// durations, reserved capacity (block-seconds, peak blocks), bytes moved.
    pub cost: cachevisor_cluster::migration_plan::MigrationCost,
    /// Blocks copied between stores.
    pub moved_blocks: u64,
}

impl ClusterMigrationResult {
    /// Mean migration time of finished Gradual and Instant migrations, seconds.
    pub fn mean_times_s(&self) -> (Option<f64>, Option<f64>) {
        let c = &self.cost;
        let mean = |t: u64, n: u64| (n > 0).then(|| t as f64 / n as f64 / 1e6);
        (mean(c.time_gradual_us, c.finished_gradual), mean(c.time_instant_us, c.finished_instant))
    }
}

impl ClusterResult {
    /// The per-VM and per-node tables, as `cachevisor simulate` prints them.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<16} {:<8} {:>9} {:>7} {:>8} {:>10} {:>11} {:>11} {:>11}",
            "vm", "node", "requests", "hit%", "remote%", "mean µs", "p99.9 µs", "local blks", "remote blks"
        );
        for v in &self.vms {
            let _ = writeln!(
                s,
                "{:<16} {:<8} {:>9} {:>7.2} {:>8.1} {:>10.1} {:>11.1} {:>11} {:>11}",
                v.name,
                v.node,
                v.requests,
                v.hit_ratio * 100.0,
                v.remote_share * 100.0,
                v.mean_us,
                v.p999_us,
                v.local_blocks,
                v.remote_blocks
            );
        }
        let _ = writeln!(
            s,
            "{:<16} {:<8} {:>9} {:>7.2} {:>8.1} {:>10.1} {:>11.1}",
            "all",
            "",
            self.vms.iter().map(|v| v.requests).sum::<u64>(),
            self.hit_ratio * 100.0,
            self.remote_share * 100.0,
            self.mean_us,
            self.p999_us
        );
        let _ = writeln!(
            s,
            "\n{:<16} {:>12} {:>14} {:>14} {:>15}",
            "node", "cache blks", "SSD written", "link bytes", "overcommit peak"
        );
        for n in &self.nodes {
            let _ = writeln!(
                s,
                "{:<16} {:>12} {:>14} {:>14} {:>15}",
                n.name,
                n.cache_blocks,
                cachevisor_trace::units::format_size(n.ssd_written_bytes),
                cachevisor_trace::units::format_size(n.link_bytes),
                n.overcommit_peak_blocks
            );
        }
        if let Some(m) = &self.migration {
            let c = &m.cost;
            let (g, i) = m.mean_times_s();
            let secs = |t: Option<f64>| t.map_or("-".to_string(), |t| format!("{t:.2} s"));
            let _ = writeln!(
                s,
                "\nmigrations: {} gradual, {} instant started, {} finished (mean time gradual {}, instant {}); \
                 {} blocks moved ({}), reserved capacity {:.0} block-s (peak {} blocks)",
                c.started_gradual,
                c.started_instant,
                c.finished,
                secs(g),
                secs(i),
                m.moved_blocks,
                cachevisor_trace::units::format_size(c.bytes_moved),
                c.reserved_block_s,
                c.reserved_peak
            );
        }
        if let Some(d) = &self.data_check {
            let _ = writeln!(
                s,
                "\ndata check: {} sectors read and {} flushed checked, {}",
                d.sectors_checked,
                d.sectors_flushed,
                if d.errors.is_empty() { "no stale or corrupt data".to_string() } else { d.errors.join("; ") }
            );
        }
        let _ = write!(s, "\n{} allocations ({:?}), solver time {:.3} s", self.allocations, self.mode, self.solve_s);
        s
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn result(
    sc: &Scenario,
    p: &Plan,
    nodes: &[Node],
    vms: &[Vm],
    names: &[String],
    ssds: &[SharedDevice],
    links: &[SharedDevice],
    allocations: u64,
    solve_s: f64,
) -> ClusterResult {
    let mut all = VmStats::default();
    let empty = VmStats::default();
    let figures = |s: &VmStats| {
        let blocks = s.read_blocks + s.write_blocks;
        let hits = s.read_hits + s.write_hits;
        let hr = if blocks > 0 { hits as f64 / blocks as f64 } else { 0.0 };
        let rs =
            if s.cache_client_ops > 0 { s.cache_client_ops_remote as f64 / s.cache_client_ops as f64 } else { 0.0 };
        let q = |x: f64| s.lat.value_at_quantile(x) as f64 / 1e3;
        (hr, rs, s.lat.mean() / 1e3, q(0.999), q(0.9999))
    };
    let out_vms = vms
        .iter()
        .zip(names)
        .map(|(v, name)| {
            let s = nodes[v.node].metrics.vms.get(v.local_id as usize).unwrap_or(&empty);
            all.merge(s);
            let (hit_ratio, remote_share, mean_us, p999_us, p9999_us) = figures(s);
            ClusterVm {
                name: name.clone(),
                node: sc.node[v.node].name.clone(),
                requests: s.requests,
                hit_ratio,
                remote_share,
                mean_us,
                p999_us,
                p9999_us,
                local_blocks: v.alloc.0,
                remote_blocks: v.alloc.1,
                entry: nodes[v.node].engine.entry_state(v.local_id),
            }
        })
        .collect();
    let out_nodes = sc
        .node
        .iter()
        .enumerate()
        .map(|(i, n)| ClusterNodeStats {
            name: n.name.clone(),
            cache_blocks: p.slots[i],
            ssd_written_bytes: ssds[i].borrow().bytes_written(),
            link_bytes: links[i].borrow().bytes_written() + links[i].borrow().bytes_read(),
            ssd_busy_s: ssds[i].borrow().busy_ns() as f64 / 1e9 / ssds[i].borrow().servers() as f64,
            overcommit_peak_blocks: 0,
            overcommit_block_s: 0.0,
            ram_hits: 0,
        })
        .collect();
    let (hit_ratio, remote_share, mean_us, p999_us, p9999_us) = figures(&all);
    ClusterResult {
        mode: p.cl.mode,
        vms: out_vms,
        nodes: out_nodes,
        hit_ratio,
        remote_share,
        mean_us,
        p999_us,
        p9999_us,
        mean_allocated_blocks: 0.0,
        mean_remote_blocks: 0.0,
        windows: Vec::new(),
        allocations,
        solve_s,
        migration: None,
        data_check: None,
        lent_dirty_blocks: 0,
    }
}
