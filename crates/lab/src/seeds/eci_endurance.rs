//! `eci-endurance`: ECI-Cache's claims (../shared/seeds/eci-cache-abstract.txt) — VMs with
//! different read/write mixes share one SSD; ECI-Cache (URD sizing, per-VM write-back or
//! read-only) against the Centaur-like dynamic partitioning it reports against
//! (reuse-distance sizing, write-back for all), static equal shares and one shared LRU:
//! latency, hit ratio, SSD writes (endurance), cache allocated, performance per cost.
//! The seed's figures (+17% performance, +30% performance per cost, −65% SSD writes
//! against the dynamic partitioning baseline) are shown next to ours.

use super::{pct, real_trace, sim, workload, Claim, Options, Report, Section, Table};
use cachevisor_engine::{PartitionMode, WritePolicy};
use cachevisor_sim::plot::{line_chart_svg, Series};
use cachevisor_sim::scenario::{DeviceChoice, ReplayMode, Scenario, SyntheticSection};
use cachevisor_trace::units::format_size;

/// Figures of one policy's run.
struct Row {
    label: &'static str,
    hit: f64,
    mean_us: f64,
    p999_us: f64,
    ssd_writes: u64,
    allocated_bytes: f64,
    policies: String,
}

/// The experiment's mix: the three bundled traces and a write-heavy and a read-heavy
/// generated VM, closed loop, on ECI-Cache's devices (policy-compare's shipped mixes run
/// it too).
pub(super) fn mix(opts: &Options) -> Result<Scenario, String> {
    let size = opts.size;
    let cache = size.pick("32MiB", "128MiB", "128MiB");
    let max = size.pick(60_000u64, 0, 0);
    let dur = size.pick("15s", "30s", "120s");
    let rw = workload(opts, "mixed-rw", "write-heavy", &[("read_ratio", "0.3"), ("seed", "21"), ("duration", dur)])?;
    let rd = workload(opts, "mixed-rw", "read-heavy", &[("read_ratio", "0.97"), ("seed", "22"), ("duration", dur)])?;
    let mut base = Scenario::default();
    base.cache.size = cache.into();
    base.devices.ssd = DeviceChoice::Preset("850-pro".into()); // ECI-Cache's SSD
    base.devices.backing = DeviceChoice::Preset("hdd-10k".into()); // its SAS 10K disks
    base.replay.mode = ReplayMode::Closed;
    base.replay.queue_depth = 4;
    base.replay.max_requests = max;
    base.replay.flush_at_end = false;
    base.trace.files = vec![
        real_trace(opts, "tpcc-small.mqsim.txt")?,
        real_trace(opts, "cloudPhysicsIO.vscsi")?,
        real_trace(opts, "websearch-small.mqsim.txt")?,
    ];
    base.synthetic =
        vec![SyntheticSection { config: rw, then: Vec::new() }, SyntheticSection { config: rd, then: Vec::new() }];
    Ok(base)
}

/// Runs the experiment.
pub fn run(opts: &Options, log: &mut dyn FnMut(&str)) -> Result<Report, String> {
    let size = opts.size;
    let base = mix(opts)?;
    let (cache, max) = (base.cache.size.clone(), base.replay.max_requests);
    let runs: [(&str, &str, PartitionMode); 4] = [
        ("ECI-Cache", "eci-cache", PartitionMode::Static),
        ("Centaur-like", "centaur", PartitionMode::Static),
        ("static", "static", PartitionMode::Static),
        ("shared LRU", "static", PartitionMode::Shared),
    ];
    let mut scenarios = Vec::new();
    let mut rows = Vec::new();
    let mut alloc_series = Vec::new();
    for (label, alloc, part) in runs {
        let mut sc = base.clone();
        sc.cache.allocator = alloc.into();
        sc.cache.partition = part;
        sc.cache.write_policy = WritePolicy::Wb;
        let r = sim(label, &sc, &mut scenarios, log)?;
        let block = r.resolved.cache.block_size as f64;
        // Mean of the summed targets over windows (the whole cache when shared).
        let mut by_window: std::collections::BTreeMap<u64, f64> = Default::default();
        for w in &r.windows {
            *by_window.entry(w.window).or_default() += w.target_blocks.min(r.resolved.slots) as f64 * block;
        }
        let allocated = if part == PartitionMode::Shared || by_window.is_empty() {
            r.resolved.cache.cache_bytes as f64
        } else {
            by_window.values().sum::<f64>() / by_window.len() as f64
        };
        if part == PartitionMode::Static {
            alloc_series.push(Series {
                name: label.into(),
                points: by_window.iter().map(|(&i, &b)| (i as f64, b / (1 << 20) as f64)).collect(),
                ..Default::default()
            });
        }
        let last = r
            .windows
            .iter()
            .rev()
            .take(r.vms.len())
            .map(|w| format!("{} {}", w.vm, w.write_policy))
            .collect::<Vec<_>>();
        rows.push(Row {
            label,
            hit: r.total.hit_ratio,
            mean_us: r.total.latency.mean_us,
            p999_us: r.total.latency.p999_us,
            ssd_writes: r.total.ssd_write_bytes,
            allocated_bytes: allocated,
            policies: if alloc == "eci-cache" {
                last.into_iter().rev().collect::<Vec<_>>().join(", ")
            } else {
                "all wb".into()
            },
        });
    }
    let perf_per_cost = |r: &Row| (1e6 / r.mean_us) / (r.allocated_bytes / (1u64 << 30) as f64);
    let mut table = Table::new(
        "eci",
        &[
            "policy",
            "hit %",
            "mean latency (µs)",
            "p99.9 (µs)",
            "SSD writes",
            "cache allocated (mean)",
            "perf per cost (IOPS-equiv per GiB)",
            "write policies at the end",
        ],
    );
    for r in &rows {
        table.rows.push(vec![
            r.label.into(),
            pct(r.hit),
            format!("{:.0}", r.mean_us),
            format!("{:.0}", r.p999_us),
            format_size(r.ssd_writes),
            format_size(r.allocated_bytes as u64),
            format!("{:.0}", perf_per_cost(r)),
            r.policies.clone(),
        ]);
    }
    let (eci, cen) = (&rows[0], &rows[1]);
    let perf = cen.mean_us / eci.mean_us - 1.0;
    let ppc = perf_per_cost(eci) / perf_per_cost(cen) - 1.0;
    let writes = 1.0 - eci.ssd_writes as f64 / cen.ssd_writes.max(1) as f64;
    let mut vs = Table::new(
        "eci_vs_seed",
        &["against the dynamic partitioning baseline", "ECI-Cache paper", "cachevisor (this run)"],
    );
    vs.rows.push(vec!["performance (1 / mean latency)".into(), "+17%".into(), format!("{:+.1}%", perf * 100.0)]);
    vs.rows.push(vec![
        "performance per cost (per GiB allocated)".into(),
        "+30%".into(),
        format!("{:+.1}%", ppc * 100.0),
    ]);
    vs.rows.push(vec!["SSD writes".into(), "−65%".into(), format!("{:+.1}%", -writes * 100.0)]);
    let claims = vec![
        Claim {
            text: "ECI-Cache commits fewer writes to the SSD than the Centaur-like baseline (read-only VMs send their writes around the cache).".into(),
            holds: eci.ssd_writes < cen.ssd_writes,
            evidence: format!("{} vs {} ({:+.1}%)", format_size(eci.ssd_writes), format_size(cen.ssd_writes), -writes * 100.0),
            asserted: true,
        },
        Claim {
            text: "ECI-Cache's performance per cost (per GiB of cache allocated) is higher than the baseline's.".into(),
            holds: ppc > 0.0,
            evidence: format!("{:+.1}% (URD sizing allocates {} against {})", ppc * 100.0, format_size(eci.allocated_bytes as u64), format_size(cen.allocated_bytes as u64)),
            // Reported, not asserted: at the quick size both allocate within 2% of each
            // other and the figure sits at ±0.2% (+0.0% without write-back ahead of
            // eviction, −0.2% with it); +1.1% / +1.6% at the default size.
            asserted: false,
        },
        Claim {
            text: "ECI-Cache performs at least as well as the baseline (mean latency).".into(),
            holds: perf >= 0.0,
            evidence: format!("{:.0} µs vs {:.0} µs ({:+.1}%)", eci.mean_us, cen.mean_us, perf * 100.0),
            asserted: false,
        },
    ];
    let writes_figure = cachevisor_sim::plot::bar_chart_svg(
        "bytes written to the SSD (endurance)",
        "GiB",
        &[
            ("ECI-Cache".to_string(), eci.ssd_writes as f64 / (1u64 << 30) as f64),
            ("Centaur-like baseline".to_string(), cen.ssd_writes as f64 / (1u64 << 30) as f64),
        ],
    )?;
    let figure = line_chart_svg(
        "cache allocated over time",
        "window (1 s)",
        "MiB allocated (sum of targets)",
        &alloc_series,
        None,
    )?;
    Ok(Report {
        name: "eci-endurance".into(),
        title: "ECI-Cache: URD sizing and per-VM write policy for SSD endurance".into(),
        intro: format!(
            "Five VMs share a {cache} cache (850 PRO model, ECI-Cache's SSD) over 10K rpm disks, closed loop with 4 outstanding requests each: the bundled tpcc, CloudPhysics and websearch traces, and two generated VMs over the same skewed working set, one write-heavy (30% reads: most reads follow writes) and one read-heavy (97% reads). ECI-Cache and the Centaur-like baseline re-size every 1 s window from decayed online curves (ECI on read reuses only, Centaur on every access); ECI picks read-only for a VM when under 10% of its useful reuses are read-after-write, write-back otherwise. Performance per cost = (10⁶ / mean latency in µs) per GiB of cache allocated.{}",
            if max > 0 { format!(" First {max} requests at this size.") } else { String::new() }
        ),
        size: size.name().into(),
        claims,
        sections: vec![
            Section { heading: "Results".into(), text: String::new(), figure: Some(writes_figure), table: Some(table) },
            Section { heading: "Against the seed's figures".into(), text: "The seed measured 16 VMs of MSR traces on real hardware; ours is a smaller mix on device models, so only the direction is comparable.".into(), figure: None, table: Some(vs) },
            Section { heading: "Allocation over time".into(), text: "ECI-Cache allocates only what read reuses need and leaves the rest of the SSD unallocated.".into(), figure: Some(figure), table: None },
        ],
        scenarios,
    })
}
