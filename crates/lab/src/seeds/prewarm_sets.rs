//! The Nutanix prewarming study's workload sets and sweeps, as `prewarm-failover` runs
//! them: the slides' vDisk tables (Syn6GB, RealCSE; Syn4GB derived), each vDisk's
//! generator config, the parameter sweeps of their result tables, and the figures those
//! tables report (../shared/seeds/nutanix-cache-prewarming-slides.txt, "Empirical
//! Analysis").

use super::{workload, Options};
use cachevisor_prewarm::Heuristic;
use std::path::PathBuf;

/// One vDisk of a workload set: the slides' figures and our generator's settings.
pub(super) struct VDisk {
    pub(super) name: &'static str,
    /// Size, GB (the slides' table).
    pub(super) size_gb: f64,
    /// Average IOPS (the slides' "till failure").
    pub(super) iops: f64,
    /// Standard deviation of the per-second request count (bursty sets: above the mean).
    pub(super) stddev: f64,
    /// The slides' wss80, MB of metadata objects.
    pub(super) wss80_mb: f64,
    /// The data that wss80 stands for, GB (the slides' "Data represented by wss80"): the
    /// size of the hot region.
    pub(super) data_gb: f64,
    /// Share of the I/O on the hot region; the rest is uniform over the disk.
    pub(super) hot_io: f64,
}

/// A workload set.
pub(super) struct WorkloadSet {
    pub(super) name: &'static str,
    /// Destination (and source) cache, GB.
    pub(super) cache_gb: f64,
    pub(super) vdisks: Vec<VDisk>,
    /// The sweeps run on it.
    pub(super) sweeps: &'static [Sweep],
    /// The slides' rate for the limit sweep, and limit for the rate sweep.
    pub(super) base_rate: u64,
    pub(super) base_limit: u32,
}

pub(super) const fn vd(
    name: &'static str,
    size_gb: f64,
    iops: f64,
    stddev: f64,
    wss80_mb: f64,
    data_gb: f64,
    hot_io: f64,
) -> VDisk {
    VDisk { name, size_gb, iops, stddev, wss80_mb, data_gb, hot_io }
}

pub(super) fn sets() -> Vec<WorkloadSet> {
    // Syn6GB: the slides' table (size, IOPS till failure, wss80, data it stands for); hot
    // regions the size of that data take 88% of the I/O, the other 12% uniform.
    let syn6 = vec![
        vd("syn520", 100.0, 49.46, 10.0, 2000.0, 70.31, 0.88),
        vd("syn521", 100.0, 24.61, 5.0, 425.0, 14.94, 0.88),
        vd("syn539", 100.0, 100.03, 20.0, 250.0, 8.79, 0.88),
        vd("syn540", 100.0, 149.27, 30.0, 2200.0, 77.34, 0.88),
        vd("syn554", 100.0, 199.4, 40.0, 175.0, 6.15, 0.88),
        vd("syn570", 100.0, 149.92, 30.0, 2300.0, 80.86, 0.88),
    ];
    // Syn4GB: the slides give no table ("the same set of experiments"); the same six
    // vDisks with hot regions at two thirds, in front of a 4 GB cache.
    let syn4 =
        syn6.iter().map(|v| VDisk { wss80_mb: v.wss80_mb * 2.0 / 3.0, data_gb: v.data_gb * 2.0 / 3.0, ..*v }).collect();
    // RealCSE: the slides' table (mail, database, LDAP and web servers): low, bursty IOPS,
    // tiny working sets (high locality).
    let real = vec![
        vd("mail1", 100.0, 5.18, 15.0, 5.0, 0.18, 0.95),
        vd("mail2", 500.0, 15.15, 40.0, 1.0, 0.04, 0.95),
        vd("mail3", 1000.0, 3.03, 10.0, 90.0, 3.16, 0.95),
        vd("db", 19.0, 2.22, 6.0, 1.0, 0.04, 0.95),
        vd("ldap", 19.0, 2.57, 7.0, 1.0, 0.04, 0.95),
        vd("web1", 19.0, 1.81, 5.0, 5.0, 0.18, 0.95),
        vd("web2", 19.0, 0.89, 3.0, 1.0, 0.04, 0.95),
        vd("web3", 16.0, 0.39, 1.5, 1.0, 0.04, 0.95),
    ];
    vec![
        WorkloadSet {
            name: "Syn6GB",
            cache_gb: 6.0,
            vdisks: syn6,
            sweeps: &Sweep::ALL,
            base_rate: 100,
            base_limit: 50,
        },
        WorkloadSet {
            name: "Syn4GB",
            cache_gb: 4.0,
            vdisks: syn4,
            sweeps: &[Sweep::Limit, Sweep::HeuristicLow],
            base_rate: 100,
            base_limit: 50,
        },
        WorkloadSet {
            name: "RealCSE",
            cache_gb: 6.0,
            vdisks: real,
            sweeps: &[Sweep::Limit, Sweep::Rate, Sweep::HeuristicLow],
            base_rate: 50,
            base_limit: 25,
        },
    ]
}

/// The slides' experiments, one table each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Sweep {
    Limit,
    Rate,
    Snapshot,
    HeuristicLow,
    HeuristicHigh,
}

impl Sweep {
    pub(super) const ALL: [Sweep; 5] =
        [Sweep::Limit, Sweep::Rate, Sweep::Snapshot, Sweep::HeuristicLow, Sweep::HeuristicHigh];

    pub(super) fn title(self) -> &'static str {
        match self {
            Sweep::Limit => "Impact of prewarm set size limit",
            Sweep::Rate => "Impact of prewarm rate",
            Sweep::Snapshot => "Impact of snapshot rate",
            Sweep::HeuristicLow => "Impact of the heuristic (low prewarm size limit)",
            Sweep::HeuristicHigh => "Impact of the heuristic (high prewarm size limit)",
        }
    }

    /// The runs of the sweep on `set`, in the slides' row order.
    pub(super) fn configs(self, set: &WorkloadSet) -> Vec<Config> {
        let base =
            Config { snapshot_k: 100, limit: set.base_limit, rate: Some(set.base_rate), heuristic: Heuristic::Recent };
        match self {
            Sweep::Limit => {
                [5, 10, 25, 50, 75, 100].map(|limit| Config { limit, rate: Some(set.base_rate), ..base }).to_vec()
            }
            Sweep::Rate => [Some(50), Some(100), Some(500), None].map(|rate| Config { rate, ..base }).to_vec(),
            Sweep::Snapshot => [10, 50, 100]
                .map(|snapshot_k| Config { snapshot_k, limit: 75, rate: Some(100), heuristic: Heuristic::Frequent })
                .to_vec(),
            Sweep::HeuristicLow | Sweep::HeuristicHigh => {
                let limit = if self == Sweep::HeuristicLow { 10 } else { 75 };
                Heuristic::ALL.map(|heuristic| Config { limit, rate: Some(50), heuristic, ..base }).to_vec()
            }
        }
    }
}

/// One prewarmed run's parameters, in the slides' units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Config {
    /// Snapshot every this many thousand requests (before scaling).
    pub(super) snapshot_k: u64,
    /// Prewarm set size limit, % of the destination cache.
    pub(super) limit: u32,
    /// MB/s (`None`: unlimited).
    pub(super) rate: Option<u64>,
    pub(super) heuristic: Heuristic,
}

/// A row of the slides' tables: snapshot rate (K requests), limit %, rate MB/s, heuristic,
/// and the instantaneous, 5-, 15- and 30-minute hit ratios.
pub(super) type SlidesRow = (u64, u32, Option<u64>, Heuristic, [f64; 4]);

/// The slides' figures (Inst., 5-, 15-, 30-minute HR) for a set's config, where given.
pub(super) fn slides(set: &str, c: &Config) -> Option<[f64; 4]> {
    let h = c.heuristic;
    let rows: &[SlidesRow] = match set {
        "Syn6GB" => &[
            (100, 5, Some(100), Heuristic::Recent, [0.41, 0.64, 0.69, 0.74]),
            (100, 10, Some(100), Heuristic::Recent, [0.41, 0.65, 0.70, 0.75]),
            (100, 25, Some(100), Heuristic::Recent, [0.41, 0.68, 0.73, 0.77]),
            (100, 50, Some(100), Heuristic::Recent, [0.41, 0.72, 0.77, 0.80]),
            (100, 75, Some(100), Heuristic::Recent, [0.41, 0.74, 0.75, 0.77]),
            (100, 100, Some(100), Heuristic::Recent, [0.41, 0.72, 0.73, 0.76]),
            (100, 50, Some(50), Heuristic::Recent, [0.38, 0.70, 0.76, 0.79]),
            (100, 50, Some(500), Heuristic::Recent, [0.61, 0.74, 0.78, 0.80]),
            (100, 50, None, Heuristic::Recent, [0.73, 0.75, 0.78, 0.80]),
            (10, 75, Some(100), Heuristic::Frequent, [0.38, 0.72, 0.78, 0.80]),
            (50, 75, Some(100), Heuristic::Frequent, [0.38, 0.73, 0.78, 0.80]),
            (100, 75, Some(100), Heuristic::Frequent, [0.39, 0.73, 0.78, 0.80]),
            (100, 10, Some(50), Heuristic::Recent, [0.38, 0.64, 0.70, 0.75]),
            (100, 10, Some(50), Heuristic::Frequent, [0.38, 0.51, 0.59, 0.65]),
            (100, 10, Some(50), Heuristic::FrerecentLinear, [0.38, 0.51, 0.58, 0.65]),
            (100, 10, Some(50), Heuristic::FrerecentQuadratic, [0.38, 0.51, 0.58, 0.65]),
            (100, 75, Some(50), Heuristic::Recent, [0.38, 0.70, 0.73, 0.75]),
            (100, 75, Some(50), Heuristic::Frequent, [0.38, 0.67, 0.75, 0.78]),
            (100, 75, Some(50), Heuristic::FrerecentLinear, [0.38, 0.67, 0.75, 0.78]),
            (100, 75, Some(50), Heuristic::FrerecentQuadratic, [0.38, 0.66, 0.75, 0.78]),
        ],
        "RealCSE" => &[
            (100, 5, Some(50), Heuristic::Recent, [0.50, 0.92, 0.93, 0.94]),
            (100, 10, Some(50), Heuristic::Recent, [0.67, 0.93, 0.94, 0.94]),
            (100, 25, Some(50), Heuristic::Recent, [0.83, 0.94, 0.95, 0.95]),
            (100, 50, Some(50), Heuristic::Recent, [1.00, 0.95, 0.95, 0.95]),
            (100, 75, Some(50), Heuristic::Recent, [1.00, 0.95, 0.95, 0.95]),
            (100, 100, Some(50), Heuristic::Recent, [1.00, 0.95, 0.94, 0.95]),
            (100, 25, Some(100), Heuristic::Recent, [0.83, 0.94, 0.95, 0.95]),
            (100, 25, Some(500), Heuristic::Recent, [0.83, 0.94, 0.95, 0.95]),
            (100, 25, None, Heuristic::Recent, [0.83, 0.94, 0.95, 0.95]),
        ],
        _ => &[],
    };
    rows.iter().find(|r| r.0 == c.snapshot_k && r.1 == c.limit && r.2 == c.rate && r.3 == h).map(|r| r.4)
}

/// The generator's `iops`: Normal(mean, stddev) per second, clamped at 0. A bursty vDisk
/// (stddev = mean) would average 1.0833 × its mean after clamping (E[max(0, X)] with
/// μ = σ: μ·Φ(1) + σ·φ(1)), so its mean is divided by that to keep the slides' IOPS.
pub(super) fn iops_yaml(v: &VDisk) -> String {
    if v.stddev >= v.iops {
        let mean = v.iops / 1.0833;
        format!("{{randvar: normal, mean: {mean:.4}, stddev: {mean:.4}}}")
    } else {
        format!("{{randvar: normal, mean: {}, stddev: {}}}", v.iops, v.stddev)
    }
}

/// Writes each vDisk's generator config: the template with the vDisk's IOPS, its hot
/// region (the size of its wss80) and its disk, scaled down by `scale`.
pub(super) fn write_workloads(opts: &Options, set: &WorkloadSet, scale: f64) -> Result<Vec<PathBuf>, String> {
    let secs = (3600.0 / scale).round() as u64;
    let mut files = Vec::new();
    for (i, v) in set.vdisks.iter().enumerate() {
        let disk_mib = (v.size_gb * 1024.0 / scale).round().max(1.0) as u64;
        let hot_space = (v.data_gb / v.size_gb * 100.0).min(100.0);
        let file = workload(
            opts,
            "nutanix-syn",
            &format!("{}-{}", set.name.to_lowercase(), v.name),
            &[
                ("seed", &(i + 1).to_string()),
                ("iops", &iops_yaml(v)),
                ("hotspots", &format!("[[{hot_space:.6}%, {:.1}%]]", v.hot_io * 100.0)),
                ("disk_size", &format!("{disk_mib}MiB")),
                ("duration", &format!("{secs}s")),
            ],
        )?;
        files.push(file);
    }
    Ok(files)
}
