//! The `elica` experiment's setup (ELICA §4): the seed's two placements — Table 1
//! (Microsoft Azure applications) and Table 2 (MSR volumes), 20 VMs on three nodes with
//! the I/O-heavy ones on N2 — with the seed's reported figures for each, the cluster
//! scenarios built from them (generated workloads with each row's request count scaled
//! down and its write share), and the variants the migration and coherency runs use.

use super::{workload, Options};
use cachevisor_engine::{ReplacementKind, WritePolicy};
use cachevisor_sim::cluster_sim::{ClusterMode, ClusterSection, MigrationChoice, NodeSection};
use cachevisor_sim::scenario::{DeviceChoice, ReplayMode, Scenario, SyntheticSection, VmSection};

/// Table 1 of the seed (Microsoft Azure applications): (node, VM, total I/O requests,
/// write %).
pub(super) const TABLE1: [(usize, &str, f64, u32); 20] = [
    (0, "VM0", 100.0, 64),
    (0, "VM1", 500.0, 7),
    (0, "VM2", 800.0, 9),
    (0, "VM3", 1e3, 11),
    (1, "VM4", 3.5e3, 8),
    (1, "VM5", 10.6e3, 99),
    (1, "VM6", 20e3, 99),
    (1, "VM7", 43e3, 7),
    (1, "VM8", 55e3, 6),
    (1, "VM9", 88e3, 7),
    (2, "VM10", 230e3, 20),
    (2, "VM11", 472e3, 6),
    (2, "VM12", 513e3, 13),
    (2, "VM13", 1.2e6, 10),
    (2, "VM14", 1.3e6, 9),
    (2, "VM15", 1.6e6, 11),
    (2, "VM16", 1.8e6, 6),
    (2, "VM17", 1.9e6, 10),
    (2, "VM18", 2.2e6, 9),
    (2, "VM19", 2.7e6, 12),
];

/// The seed's reported figures for one workload set (§4.2; ELICA-Traffic unless named).
#[derive(Debug, Clone, Copy)]
pub(super) struct SeedFigures {
    /// Cache allocated, × ECI (Fig. 9).
    pub(super) alloc: f64,
    /// Hit ratio gain over ECI (Fig. 10).
    pub(super) hit: f64,
    /// Average latency, × lower than ECI: ELICA-Traffic, ELICA-Load (Fig. 12a).
    pub(super) avg_traffic: f64,
    pub(super) avg_load: f64,
    /// Worst-case latency cut, three and four 9s (Fig. 12b/c; averaged over both sets).
    pub(super) p999: f64,
    pub(super) p9999: f64,
    /// Remote share of the allocation: ELICA-Traffic, ELICA-Load (Fig. 11).
    pub(super) remote_traffic: f64,
    pub(super) remote_load: f64,
}

/// One of the seed's workload sets: its placement table, its figures, and from how many
/// requests a VM is heavy (sequential runs).
#[derive(Debug, Clone, Copy)]
pub(super) struct Placement {
    pub(super) name: &'static str,
    pub(super) table: &'static [(usize, &'static str, f64, u32)],
    pub(super) seed: SeedFigures,
    pub(super) heavy: f64,
    /// Scale of its request counts relative to MSR's (Table 1 totals 14.5 M requests,
    /// Table 2 186 M: ×12 gives the two sets similar loads).
    pub(super) scale: f64,
}

/// MSR (Table 2); the heavy VMs (≥ 10 M requests: src, proj, prn, usr volumes) issue
/// sequential runs.
pub(super) const MSR: Placement = Placement {
    name: "MSR",
    table: &TABLE2,
    seed: SeedFigures {
        alloc: 2.7,
        hit: 0.33,
        avg_traffic: 3.37,
        avg_load: 2.76,
        p999: 0.23,
        p9999: 0.13,
        remote_traffic: 0.31,
        remote_load: 0.37,
    },
    heavy: 10e6,
    scale: 1.0,
};

/// Azure (Table 1): "mostly read-intensive", "reading large chunks" (§2) — the VMs of a
/// million requests or more issue sequential runs.
pub(super) const AZURE: Placement = Placement {
    name: "Azure",
    table: &TABLE1,
    seed: SeedFigures {
        alloc: 2.4,
        hit: 0.35,
        avg_traffic: 3.44,
        avg_load: 2.83,
        p999: 0.23,
        p9999: 0.13,
        remote_traffic: 0.31,
        remote_load: 0.37,
    },
    heavy: 1e6,
    scale: 12.0,
};

/// Runs of consecutive 4 KiB requests (stride 8 sectors) for the heavy VMs, single
/// requests for the rest.
const SEQUENTIAL: &str = "{size: {min: 16, max: 64}, stride: {min: 8, max: 8}}";
const RANDOM: &str = "{size: {min: 1, max: 1}, stride: {min: 1, max: 1}}";

/// Table 2 of the seed: (node, workload, total I/O requests, write %).
pub(super) const TABLE2: [(usize, &str, f64, u32); 20] = [
    (0, "mds_0", 1.2e6, 12),
    (0, "rsrch_1", 14e3, 7),
    (0, "hm_1", 604e3, 5),
    (0, "proj_0", 4.1e6, 13),
    (1, "mds_1", 1.6e6, 7),
    (1, "rsrch_2", 206e3, 34),
    (1, "src1_0", 37e6, 44),
    (1, "proj_1", 23e6, 11),
    (1, "stg_0", 2e6, 85),
    (1, "prn_0", 5.5e6, 89),
    (2, "rsrch_0", 1.4e6, 91),
    (2, "hm_0", 3.9e6, 65),
    (2, "src2_0", 1.5e6, 89),
    (2, "proj_2", 29e6, 12),
    (2, "stg_1", 2.1e6, 36),
    (2, "prn_1", 11.1e6, 25),
    (2, "usr_0", 2.2e6, 60),
    (2, "usr_1", 44e6, 9),
    (2, "usr_2", 10e6, 19),
    (2, "web_0", 2e6, 70),
];

/// The cluster scenario of `placement` in `mode`: its VMs' generated workloads over `secs`
/// seconds at `scale` × their request counts, `cache` per node.
pub(super) fn scenario(
    opts: &Options,
    placement: &Placement,
    mode: ClusterMode,
    scale: f64,
    secs: u64,
    cache: &str,
) -> Result<Scenario, String> {
    let mut sc = Scenario::default();
    sc.cache.replacement = Some(ReplacementKind::Lru);
    sc.cache.write_policy = WritePolicy::Wb; // ELICA §3.7
    sc.devices.backing = DeviceChoice::Preset("hdd-7200".into());
    sc.replay.mode = ReplayMode::Open;
    sc.replay.window = format!("{}s", (secs / 12).max(1));
    for (i, &(node, name, requests, write)) in placement.table.iter().enumerate() {
        let n = (requests * scale * placement.scale).max(secs as f64); // at least 1 IOPS: the generator issues none below
        let iops = n / secs as f64;
        // Heavier VMs touch more: a disk of ~2 blocks per request, 16 MiB to 512 MiB; 80%
        // of the accesses on 20% of it.
        let disk_mib = ((n * 2.0 * 4096.0 / (1 << 20) as f64) as u64).clamp(16, 512);
        let path = workload(
            opts,
            "hotcold",
            name,
            &[
                ("seed", &(100 + i).to_string()),
                ("iops", &format!("{{randvar: normal, mean: {iops:.3}, stddev: 0}}")),
                ("duration", &format!("{secs}s")),
                ("disk_size", &format!("{disk_mib}MiB")),
                ("read_ratio", &format!("{:.2}", 1.0 - write as f64 / 100.0)),
                ("hotspots", "[[20%, 80%]]"),
                // The heavy VMs read and write in sequential runs of 16–64 requests
                // (64–256 KiB), which ELICA-Traffic keeps local; the others are random.
                ("cluster", if requests >= placement.heavy { SEQUENTIAL } else { RANDOM }),
            ],
        )?;
        sc.synthetic.push(SyntheticSection { config: path, then: Vec::new() });
        sc.vm.push(VmSection { node: Some(format!("N{node}")), ..VmSection::named(name) });
    }
    sc.node =
        (0..3).map(|i| NodeSection { name: format!("N{i}"), cache: cache.into(), ssd: None, link: None }).collect();
    // 128 allocation units per node at the full size (1 MiB of 128 MiB): the fast solver's
    // work grows with the units per node, and every 500 ms of the coherency check solves.
    let unit = if cache == "128MiB" { "1MiB" } else { "256KiB" };
    sc.cluster = Some(ClusterSection { mode, unit: unit.into(), ..ClusterSection::default() });
    Ok(sc)
}

/// The scenario with `scheme` forced (and, for the coherency check, the data check on).
pub(super) fn with_migration(sc: &Scenario, scheme: MigrationChoice) -> Scenario {
    let mut sc = sc.clone();
    sc.cluster.as_mut().expect("a cluster scenario").migration.scheme = scheme;
    sc
}

/// The coherency check's scenario (ELICA Table 5): every VM writes at least 70% of its
/// requests, allocations every `window` move caches often, migrations start
/// at up to 100 per second, and every byte's version is checked.
pub(super) fn coherency_scenario(
    sc: &Scenario,
    opts: &Options,
    window: &str,
    scheme: MigrationChoice,
) -> Result<Scenario, String> {
    let mut sc = with_migration(sc, scheme);
    sc.replay.window = window.into();
    for (i, syn) in sc.synthetic.iter_mut().enumerate() {
        let text = std::fs::read_to_string(&syn.config).map_err(|e| format!("{}: {e}", syn.config.display()))?;
        let text: String = text
            .lines()
            .map(|l| match l.strip_prefix("read_ratio: ").and_then(|r| r.trim().parse::<f64>().ok()) {
                Some(r) => format!("read_ratio: {:.2}\n", r.min(0.3)),
                None => format!("{l}\n"),
            })
            .collect();
        let path = opts.out.join("workloads").join(format!("coherency_{i}.yaml"));
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        syn.config = path;
    }
    let cl = sc.cluster.as_mut().expect("a cluster scenario");
    cl.migration.rate = 100.0;
    cl.migration.burst = 32;
    cl.verify_data = true;
    Ok(sc)
}
