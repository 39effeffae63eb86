//! `admission`'s two sections where the devices' timing decides (full model): prefetch
//! for a sequential reader of a slow store (`block_prefetch.rs`: none, OBL, AMP), and
//! congestion bypass on a saturated cache device (`congestion.rs`), where it must lower
//! the p99 and, on a device that is not saturated, change nothing.

use super::{pct, sim, Claim, Options, Section, Table};
use cachevisor_engine::PrefetchPolicy;
use cachevisor_sim::device::DeviceSpec;
use cachevisor_sim::model_choice::ModelChoice;
use cachevisor_sim::scenario::{DeviceChoice, ReplayMode, Scenario, SyntheticSection};

/// A store answering each request in 2 ms (a distributed store, a remote array).
fn slow_store() -> DeviceChoice {
    DeviceChoice::Spec(DeviceSpec::Link { name: "store-2ms".into(), channels: 16, latency_ns: 2_000_000, mbps: 200.0 })
}

/// The prefetch section and its claim.
pub(super) fn prefetch(
    opts: &Options,
    scenarios: &mut Vec<(String, String)>,
    log: &mut dyn FnMut(&str),
) -> Result<(Section, Claim), String> {
    let n = opts.size.pick(4_000u64, 20_000, 100_000);
    let path = opts.out.join("workloads").join(format!("sequential-{n}.msr"));
    if !path.is_file() {
        let text: String = (0..n)
            .map(|i| format!("{},seq,0,Read,{},4096,0\n", 116_444_736_000_000_000u64 + i * 1000, i * 4096))
            .collect();
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let mut base = Scenario::default();
    base.trace.files = vec![path];
    base.cache.size = "16MiB".into();
    base.replay.model = ModelChoice::Full;
    base.replay.mode = ReplayMode::Closed;
    base.replay.queue_depth = 1;
    base.devices.ssd = DeviceChoice::Preset("nvme".into());
    base.devices.backing = slow_store();
    let mut t = Table::new(
        "prefetch",
        &["prefetch", "hit %", "mean (µs)", "p99 (µs)", "blocks loaded", "read", "evicted unread", "reads that waited"],
    );
    let mut means = Vec::new();
    for p in
        [PrefetchPolicy::None, PrefetchPolicy::Obl, PrefetchPolicy::Amp { max: 16 }, PrefetchPolicy::Amp { max: 64 }]
    {
        let mut sc = base.clone();
        sc.cache.prefetch = Some(p);
        let r = sim(&format!("sequential reader, prefetch {p}"), &sc, scenarios, log)?;
        let c = r.vms[0].entry.prefetch.map(|s| s.counts).unwrap_or_default();
        means.push(r.total.latency.mean_us);
        t.rows.push(vec![
            p.to_string(),
            pct(r.total.hit_ratio),
            format!("{:.0}", r.total.latency.mean_us),
            format!("{:.0}", r.total.latency.p99_us),
            c.loaded.to_string(),
            c.used.to_string(),
            c.wasted.to_string(),
            c.late.to_string(),
        ]);
    }
    let claim = Claim {
        text: "Prefetch serves a sequential reader of a slow store from the cache: AMP cuts its mean latency more than 5×, OBL less.".into(),
        holds: means[2] * 5.0 < means[0] && means[1] < means[0] && means[2] < means[1],
        evidence: format!("mean {:.0} µs without, {:.0} with obl, {:.0} with amp:16, {:.0} with amp", means[0], means[1], means[2], means[3]),
        asserted: true,
    };
    let section = Section {
        heading: "Prefetch from a slow store".into(),
        text: format!("One VM reading {n} 4 KiB blocks in order, one request at a time (closed loop), from a store answering each request in 2 ms, an NVMe cache (full model). A read of a block still loading waits for it: with amp's longest runs (64 blocks) such a read waits for the whole run's transfer, which is its p99."),
        figure: None,
        table: Some(t),
    };
    Ok((section, claim))
}

/// The congestion section and its claim.
pub(super) fn congestion(
    opts: &Options,
    scenarios: &mut Vec<(String, String)>,
    log: &mut dyn FnMut(&str),
) -> Result<(Section, Claim), String> {
    let secs = opts.size.pick(6, 10, 30);
    let yaml = opts.out.join("workloads").join("congestion.yaml");
    std::fs::write(
        &yaml,
        format!(
            "name: reader\niops: {{randvar: normal, mean: 3000, stddev: 0}}\nsector: {{size: 512b}}\n\
             cluster: {{size: {{min: 1, max: 1}}, stride: {{min: 1, max: 1}}}}\nhotspots:\n  - [10%, 60%]\n\
             iosizes:\n  - [100%, 4096b]\ndisk_size: 2GiB\nduration: {secs}s\nread_ratio: 1.0\nseed: 5\n"
        ),
    )
    .map_err(|e| format!("{}: {e}", yaml.display()))?;
    let mut base =
        Scenario { synthetic: vec![SyntheticSection { config: yaml, then: Vec::new() }], ..Default::default() };
    base.cache.size = "256MiB".into();
    base.replay.model = ModelChoice::Full;
    base.replay.mode = ReplayMode::Open;
    base.devices.backing =
        DeviceChoice::Spec(DeviceSpec::Link { name: "array".into(), channels: 64, latency_ns: 300_000, mbps: 2000.0 });
    let slow = DeviceSpec::Ssd {
        name: "slow-ssd".into(),
        channels: 2,
        read_ns: 100_000,
        write_ns: 600_000,
        read_mbps: 300.0,
        write_mbps: 60.0,
    };
    let mut t =
        Table::new("congestion", &["cache device", "bypass", "hit %", "mean (µs)", "p99 (µs)", "misses sent around"]);
    let mut p99 = Vec::new();
    let mut same = true;
    for (label, ssd) in [
        ("saturated (2 channels, 60 MB/s writes)", DeviceChoice::Spec(slow)),
        ("NVMe", DeviceChoice::Preset("nvme".into())),
    ] {
        let mut got = Vec::new();
        for bypass in [false, true] {
            let mut sc = base.clone();
            sc.devices.ssd = ssd.clone();
            if bypass {
                sc.cache.congested_read_threshold = Some("2ms".into());
                sc.cache.congested_write_threshold = Some("2ms".into());
            }
            let r = sim(&format!("3,000 reads/s, {label}, bypass {bypass}"), &sc, scenarios, log)?;
            let around = r.vms[0].entry.congestion_bypassed;
            t.rows.push(vec![
                label.into(),
                if bypass { "2 ms thresholds" } else { "off" }.into(),
                pct(r.total.hit_ratio),
                format!("{:.0}", r.total.latency.mean_us),
                format!("{:.0}", r.total.latency.p99_us),
                (around[0] + around[1]).to_string(),
            ]);
            got.push((r.total.latency.p99_us, r.total.hit_ratio));
        }
        if label == "NVMe" {
            same = got[0] == got[1];
        } else {
            p99 = vec![got[0].0, got[1].0];
        }
    }
    let claim = Claim {
        text: "Congestion bypass lowers the p99 when the cache device is saturated and costs nothing when it is not."
            .into(),
        holds: p99[1] * 10.0 < p99[0] && same,
        evidence: format!(
            "saturated: p99 {:.0} µs → {:.0} µs; NVMe: {}",
            p99[0],
            p99[1],
            if same { "identical" } else { "changed" }
        ),
        asserted: true,
    };
    let section = Section {
        heading: "Congestion bypass".into(),
        text: "A reader at 3,000 requests a second (open loop) whose misses fill a slow cache device (2 channels, 0.6 ms and 60 MB/s writes), with a fast array behind it, then the same on an NVMe model; with 2 ms thresholds on the cache device's smoothed read and write latency, misses go around it while it is congested.".into(),
        figure: None,
        table: Some(t),
    };
    Ok((section, claim))
}
