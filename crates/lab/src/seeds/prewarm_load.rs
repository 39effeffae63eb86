//! `prewarm-failover`'s "under load" part: what prewarming costs the VMs while it runs,
//! and how long it takes to finish while they run, on disks slow enough for the two to
//! contend (per-VM 7,200 rpm disks, a cache of data blocks). Prewarm reads yield to the
//! VMs' I/O — at most one in flight on a busy disk, at the busy rate, never stopping
//! (MariaDB removed InnoDB's sleep-when-busy throttle after a buffer-pool load under the
//! lightest load took over an hour, MDEV-25417/MDEV-29343) — against the same prewarm
//! not yielding, and the cold and warm brackets.

use super::{sim, workload, Claim, Options, Section, Table};
use cachevisor_engine::{PartitionMode, ReplacementKind};
use cachevisor_sim::failover::{FailoverMode, FailoverReport, FailoverSection};
use cachevisor_sim::scenario::{DeviceChoice, ReplayMode, Scenario, SyntheticSection};
use std::path::PathBuf;

/// VMs of the load set, their IOPS and hot region (MiB at the slides' scale).
const VMS: [(&str, f64, u64); 4] =
    [("load-a", 30.0, 200), ("load-b", 25.0, 300), ("load-c", 35.0, 150), ("load-d", 20.0, 250)];
/// Disk of each VM and cache, MiB at the slides' scale.
const DISK_MIB: u64 = 8192;
const CACHE_MIB: u64 = 1024;

/// The runs: label, mode, yields, reads in flight on an idle disk, rate.
const RUNS: [(&str, FailoverMode, bool, u32, &str); 6] = [
    ("cold", FailoverMode::Cold, true, 4, "unlimited"),
    ("warm (kept its state)", FailoverMode::Warm, true, 4, "unlimited"),
    ("prewarm, not yielding, 4 in flight (∞)", FailoverMode::Prewarm, false, 4, "unlimited"),
    ("prewarm, yielding, 4 in flight when idle (∞)", FailoverMode::Prewarm, true, 4, "unlimited"),
    ("prewarm, yielding, 1 in flight (∞)", FailoverMode::Prewarm, true, 1, "unlimited"),
    ("prewarm, yielding, 1 in flight (8 MiB/s)", FailoverMode::Prewarm, true, 1, "8MiB"),
];

fn write_workloads(opts: &Options, scale: f64) -> Result<Vec<PathBuf>, String> {
    let secs = (3600.0 / scale).round() as u64;
    let disk = (DISK_MIB as f64 / scale).round() as u64;
    VMS.iter()
        .enumerate()
        .map(|(i, &(name, iops, hot))| {
            let hot_pct = hot as f64 / DISK_MIB as f64 * 100.0;
            workload(
                opts,
                "nutanix-syn",
                name,
                &[
                    ("seed", &(i + 11).to_string()),
                    ("iops", &format!("{{randvar: normal, mean: {iops}, stddev: {}}}", iops / 5.0)),
                    ("hotspots", &format!("[[{hot_pct:.4}%, 90%]]")),
                    ("disk_size", &format!("{disk}MiB")),
                    ("duration", &format!("{secs}s")),
                ],
            )
        })
        .collect()
}

fn scenario(files: &[PathBuf], scale: f64, mode: FailoverMode, yields: bool, depth: u32, rate: &str) -> Scenario {
    scenario_with(files, scale, mode, yields, depth, rate, ReplacementKind::TwoPool, None)
}

#[allow(clippy::too_many_arguments)]
fn scenario_with(
    files: &[PathBuf],
    scale: f64,
    mode: FailoverMode,
    yields: bool,
    depth: u32,
    rate: &str,
    replacement: ReplacementKind,
    protect: Option<String>,
) -> Scenario {
    let mut sc = Scenario::default();
    sc.cache.size = format!("{}MiB", (CACHE_MIB as f64 / scale).round() as u64);
    sc.cache.replacement = Some(replacement);
    sc.cache.partition = PartitionMode::Shared;
    sc.devices.backing = DeviceChoice::Preset("hdd-7200".into());
    sc.replay.mode = ReplayMode::Open;
    sc.replay.window = "1s".into();
    sc.synthetic = files.iter().map(|f| SyntheticSection { config: f.clone(), then: Vec::new() }).collect();
    sc.failover = Some(FailoverSection {
        at: format!("{}s", (1800.0 / scale).round() as u64),
        mode,
        snapshot_every: format!("{}s", (60.0 / scale).max(1.0).round() as u64),
        snapshots_kept: 10,
        limit: "100%".into(),
        rate: rate.into(),
        minute: format!("{}s", 60.0 / scale),
        yield_to_clients: yields,
        depth,
        protect,
        ..FailoverSection::default()
    });
    sc
}

/// Runs the part: its sections and claims.
pub(super) fn run(
    opts: &Options,
    scale: f64,
    scenarios: &mut Vec<(String, String)>,
    log: &mut dyn FnMut(&str),
) -> Result<(Vec<Section>, Vec<Claim>), String> {
    let files = write_workloads(opts, scale)?;
    let mut table = Table::new(
        "under-load",
        &[
            "run",
            "requests in the first minute",
            "mean latency (ms)",
            "p99 (ms)",
            "p99.9 (ms)",
            "5-min HR",
            "prewarmed MiB",
            "prewarm s (under load)",
        ],
    );
    let mut got: Vec<FailoverReport> = Vec::new();
    for (label, mode, yields, depth, rate) in RUNS {
        let sc = scenario(&files, scale, mode, yields, depth, rate);
        let r = sim(&format!("under load, {label}"), &sc, scenarios, log)?;
        let f = r.failover.ok_or("a failover run reports its failover")?;
        table.rows.push(vec![
            label.into(),
            f.first_minute_requests.to_string(),
            format!("{:.1}", f.first_minute_mean_ms),
            format!("{:.1}", f.first_minute_p99_ms),
            format!("{:.1}", f.first_minute_p999_ms),
            format!("{:.3}", f.avg_hit_ratio[0]),
            format!("{:.1}", f.prewarm_bytes as f64 / (1 << 20) as f64),
            f.prewarm_seconds.map_or("—".into(), |s| format!("{s:.1}")),
        ]);
        got.push(f);
    }
    let (cold, pushing, yielding, one, slow) = (&got[0], &got[2], &got[3], &got[4], &got[5]);
    let claims = vec![
        Claim {
            text: "Prewarm reads that yield cost the VMs less than prewarm reads that do not: a lower p99 latency in the first minute (7,200 rpm disks).".into(),
            holds: yielding.first_minute_p99_ms < pushing.first_minute_p99_ms
                && one.first_minute_p99_ms < pushing.first_minute_p99_ms,
            evidence: format!(
                "first-minute p99 {:.1} ms not yielding, {:.1} ms yielding with 4 reads in flight on idle disks, {:.1} ms with one (cold {:.1} ms)",
                pushing.first_minute_p99_ms, yielding.first_minute_p99_ms, one.first_minute_p99_ms, cold.first_minute_p99_ms
            ),
            asserted: false,
        },
        Claim {
            text: "Yielding never stalls the prewarm: under the same load it finishes (a busy disk still gets its busy rate).".into(),
            holds: yielding.prewarm_seconds.is_some() && one.prewarm_seconds.is_some() && slow.prewarm_seconds.is_some(),
            evidence: format!(
                "finished in {} (yielding, 4 in flight), {} (1 in flight), {} (1 in flight, 8 MiB/s) vs {} not yielding",
                secs(yielding),
                secs(one),
                secs(slow),
                secs(pushing)
            ),
            asserted: true,
        },
    ];
    let mut protection =
        Table::new("protection", &["run (LRU)", "inst. HR", "5-min HR", "15-min HR", "30-min HR", "blocks prewarmed"]);
    let mut prot: Vec<FailoverReport> = Vec::new();
    let minutes5 = format!("{}s", 300.0 / scale);
    for (label, mode, protect) in [
        ("cold", FailoverMode::Cold, None),
        ("prewarm, no protection", FailoverMode::Prewarm, None),
        ("prewarm, protected until first touch or 5 min", FailoverMode::Prewarm, Some(minutes5.clone())),
        ("warm (kept its state)", FailoverMode::Warm, None),
    ] {
        let sc = scenario_with(&files, scale, mode, true, 1, "unlimited", ReplacementKind::Lru, protect);
        let r = sim(&format!("under load, LRU, {label}"), &sc, scenarios, log)?;
        let f = r.failover.ok_or("a failover run reports its failover")?;
        protection.rows.push(vec![
            label.into(),
            format!("{:.3}", f.instant_hit_ratio),
            format!("{:.3}", f.avg_hit_ratio[0]),
            format!("{:.3}", f.avg_hit_ratio[1]),
            format!("{:.3}", f.avg_hit_ratio[2]),
            f.loaded_blocks.to_string(),
        ]);
        prot.push(f);
    }
    let (bare, kept) = (&prot[1], &prot[2]);
    let mut claims = claims;
    claims.push(Claim {
        text: "Protecting prewarmed blocks until their first touch (or 5 minutes) keeps more of the prewarm's benefit than none, under LRU (the slides' future work).".into(),
        holds: kept.avg_hit_ratio[0] > bare.avg_hit_ratio[0],
        evidence: format!(
            "5-min HR {:.3} protected vs {:.3} unprotected (cold {:.3}); 30-min {:.3} vs {:.3}",
            kept.avg_hit_ratio[0], bare.avg_hit_ratio[0], prot[0].avg_hit_ratio[0], kept.avg_hit_ratio[2], bare.avg_hit_ratio[2]
        ),
        asserted: false,
    });
    let protection_section = Section {
        heading: "Protecting prewarmed blocks from eviction".into(),
        text: "The same load set under plain LRU, where a prewarmed block enters at the cold end (the most important loaded first stays longest) and is the first to go when the VMs' misses need room — unless it is protected until its first touch or a deadline (5 minutes here): a protected victim is passed over for the next unprotected one (at most 64 looked at; all protected, it goes anyway).".into(),
        figure: None,
        table: Some(protection),
    };
    let section = Section {
        heading: "Prewarming under load: what the VMs pay and how long it takes".into(),
        text: format!(
            "Four VMs (20–35 IOPS, 90% of their I/O on hot regions of 150–300 MiB of an 8 GiB disk, at the slides' scale) each on its own 7,200 rpm disk, behind one two-pool cache of {CACHE_MIB} MiB of 4 KiB data blocks; the failure at 30 minutes; the whole source state prewarmed (limit 100%). Latencies are of the VMs' requests completed in the first minute after the failure. Yielding: at most one prewarm read in flight on a disk whose VM has requests in flight, at the busy rate (64 MiB/s with an unlimited rate), and 4 (or 1) on an idle one; not yielding: four in flight on every disk at the full rate. On a disk that serves requests in arrival order a VM's request that arrives while its disk is idle still waits for the prewarm reads already there: with four in flight, up to four 128 KiB reads."
        ),
        figure: None,
        table: Some(table),
    };
    Ok((vec![section, protection_section], claims))
}

fn secs(f: &FailoverReport) -> String {
    f.prewarm_seconds.map_or("never".into(), |s| format!("{s:.1} s"))
}
