//! The `elica` experiment's tables and headline claims: the seed's figures beside ours for
//! one workload set (cache allocated, hit ratio, average and worst-case latency, remote
//! share, wear and load balance — ELICA Fig. 9–12, 16/17), and a migration run's row
//! (Fig. 20a: migrations, time, bytes, reserved capacity).

use super::elica_setup::Placement;
use super::{pct, Claim, Table};
use cachevisor_sim::cluster_sim::{ClusterMigrationResult, ClusterResult};

/// Max ÷ mean of the nodes' SSD writes (1 = perfectly even wear).
pub(super) fn wear_skew(r: &ClusterResult) -> f64 {
    skew(r.nodes.iter().map(|n| n.ssd_written_bytes as f64).collect())
}

/// Max ÷ mean of the nodes' SSD busy time (ELICA-Load's aim, §3.5).
pub(super) fn busy_skew(r: &ClusterResult) -> f64 {
    skew(r.nodes.iter().map(|n| n.ssd_busy_s).collect())
}

fn skew(v: Vec<f64>) -> f64 {
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    v.iter().cloned().fold(0.0, f64::max) / mean.max(1e-12)
}

/// Share of a run's allocation on lent caches, averaged over its allocations (Fig. 11).
pub(super) fn remote_share(r: &ClusterResult) -> f64 {
    r.mean_remote_blocks / r.mean_allocated_blocks.max(1.0)
}

/// The seed's figures beside ours for `p`'s three configurations.
pub(super) fn summary_table(
    name: &str,
    p: &Placement,
    local: &ClusterResult,
    elica: &ClusterResult,
    load: &ClusterResult,
) -> Table {
    let s = &p.seed;
    let alloc_ratio = elica.mean_allocated_blocks / local.mean_allocated_blocks.max(1.0);
    let ms = |us: f64, digits: usize| format!("{:.*} ms", digits, us / 1e3);
    let cut = |ours: f64, base: f64| format!("{:+.0}%", (ours / base.max(1e-9) - 1.0) * 100.0);
    // A tail-latency row: the seed's reduction, each run's percentile, ours against local.
    let tail_row = |label: &str, seed: f64, at: fn(&ClusterResult) -> f64| {
        vec![
            label.to_string(),
            format!("−{:.0}%", seed * 100.0),
            ms(at(local), 1),
            ms(at(elica), 1),
            ms(at(load), 1),
            cut(at(elica), at(local)),
        ]
    };
    let seed_col = format!("seed ({})", p.name);
    let mut t = Table::new(name, &["figure", &seed_col, "ECI-like", "ELICA-Traffic", "ELICA-Load", "ours (Traffic)"]);
    t.rows = vec![
        vec![
            "cache allocated (Fig. 9)".into(),
            format!("{}× ECI", s.alloc),
            format!("{:.0} blocks", local.mean_allocated_blocks),
            format!("{:.0} blocks", elica.mean_allocated_blocks),
            format!("{:.0} blocks", load.mean_allocated_blocks),
            format!("{alloc_ratio:.2}×"),
        ],
        vec![
            "hit ratio (Fig. 10)".into(),
            format!("+{:.0}%", s.hit * 100.0),
            pct(local.hit_ratio),
            pct(elica.hit_ratio),
            pct(load.hit_ratio),
            cut(elica.hit_ratio, local.hit_ratio),
        ],
        vec![
            "average latency (Fig. 12a)".into(),
            format!("{}× (Traffic), {}× (Load) lower", s.avg_traffic, s.avg_load),
            ms(local.mean_us, 2),
            ms(elica.mean_us, 2),
            ms(load.mean_us, 2),
            format!("{:.2}× lower", local.mean_us / elica.mean_us.max(1e-9)),
        ],
        tail_row("p99.9 latency (Fig. 12b)", s.p999, |r| r.p999_us),
        tail_row("p99.99 latency (Fig. 12c)", s.p9999, |r| r.p9999_us),
        vec![
            "remote share of the allocation (Fig. 11)".into(),
            format!("{:.0}% (Traffic), {:.0}% (Load)", s.remote_traffic * 100.0, s.remote_load * 100.0),
            "0%".into(),
            pct(remote_share(elica)),
            pct(remote_share(load)),
            pct(remote_share(elica)),
        ],
        vec![
            "SSD writes, busiest node ÷ mean (Fig. 16/17)".into(),
            "more even".into(),
            format!("{:.2}", wear_skew(local)),
            format!("{:.2}", wear_skew(elica)),
            format!("{:.2}", wear_skew(load)),
            String::new(),
        ],
        vec![
            "SSD busy time, busiest node ÷ mean (§3.5)".into(),
            "Load balances it".into(),
            format!("{:.2}", busy_skew(local)),
            format!("{:.2}", busy_skew(elica)),
            format!("{:.2}", busy_skew(load)),
            String::new(),
        ],
    ];
    t
}

/// The headline claims for `p` (Fig. 9, 10, 12a, 12b); `assert`: the first two are
/// asserted at the quick size.
pub(super) fn headline_claims(p: &Placement, local: &ClusterResult, elica: &ClusterResult, assert: bool) -> Vec<Claim> {
    let s = &p.seed;
    let alloc_ratio = elica.mean_allocated_blocks / local.mean_allocated_blocks.max(1.0);
    let hit_gain = elica.hit_ratio / local.hit_ratio.max(1e-9) - 1.0;
    let avg_gain = local.mean_us / elica.mean_us.max(1e-9);
    let p999_cut = 1.0 - elica.p999_us / local.p999_us.max(1e-9);
    let name = p.name;
    vec![
        Claim {
            text: format!("{name}: ELICA allocates more cache than local-only management (seed: {}×).", s.alloc),
            holds: alloc_ratio > 1.0,
            evidence: format!(
                "{alloc_ratio:.2}× ({:.0} vs {:.0} blocks on average)",
                elica.mean_allocated_blocks, local.mean_allocated_blocks
            ),
            asserted: assert,
        },
        Claim {
            text: format!("{name}: ELICA raises the hit ratio (seed: +{:.0}%).", s.hit * 100.0),
            holds: hit_gain > 0.0,
            evidence: format!("{} → {} ({:+.0}%)", pct(local.hit_ratio), pct(elica.hit_ratio), hit_gain * 100.0),
            asserted: assert,
        },
        Claim {
            text: format!("{name}: ELICA lowers the average latency (seed: {}× with ELICA-Traffic).", s.avg_traffic),
            holds: avg_gain > 1.0,
            evidence: format!("{:.2} → {:.2} ms ({avg_gain:.2}×)", local.mean_us / 1e3, elica.mean_us / 1e3),
            asserted: false,
        },
        Claim {
            text: format!("{name}: ELICA lowers the p99.9 latency (seed: −{:.0}%).", s.p999 * 100.0),
            holds: p999_cut > 0.0,
            evidence: format!(
                "{:.1} → {:.1} ms ({:+.0}%)",
                local.p999_us / 1e3,
                elica.p999_us / 1e3,
                -p999_cut * 100.0
            ),
            asserted: false,
        },
    ]
}

/// An empty migration account (a run with migration off).
pub(super) fn empty_migration() -> ClusterMigrationResult {
    ClusterMigrationResult { cost: Default::default(), moved_blocks: 0 }
}

/// A row of the GM-vs-IM table.
pub(super) fn migration_row(label: &str, r: &ClusterResult) -> Vec<String> {
    let secs = |t: Option<f64>| t.map_or("–".to_string(), |t| format!("{t:.2}"));
    let (started, finished, time, moved, mib, reserved, peak) = match &r.migration {
        Some(m) => {
            let (g, i) = m.mean_times_s();
            (
                (m.cost.started_gradual + m.cost.started_instant).to_string(),
                m.cost.finished.to_string(),
                secs(g.or(i)),
                m.moved_blocks.to_string(),
                format!("{:.1}", m.cost.bytes_moved as f64 / (1 << 20) as f64),
                format!("{:.0}", m.cost.reserved_block_s),
                m.cost.reserved_peak.to_string(),
            )
        }
        None => ("–".into(), "–".into(), "–".into(), "0".into(), "0".into(), "–".into(), "–".into()),
    };
    vec![
        label.into(),
        started,
        finished,
        time,
        moved,
        mib,
        reserved,
        peak,
        pct(r.hit_ratio),
        format!("{:.2}", r.mean_us / 1e3),
        format!("{:.1}", r.p999_us / 1e3),
    ]
}
