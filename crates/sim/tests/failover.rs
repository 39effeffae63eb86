//! Failover with prewarming through `simulate`: the source's snapshots, the destination's
//! cold cache, prewarm reads paced and charged to the devices, and the slides' metrics,
//! bracketed by the cold and warm baselines.

use cachevisor_engine::{PartitionMode, ReplacementKind};
use cachevisor_prewarm::Heuristic;
use cachevisor_sim::failover::{FailoverMode, FailoverSection};
use cachevisor_sim::scenario::{ReplayMode, SyntheticSection};
use cachevisor_sim::{simulate, Scenario, SimResult};
use std::path::Path;

/// Two VMs with the slides' hotspot layout: 1 GiB disks, 300 IOPS in all, 120 s.
fn scenario(dir: &Path, mode: FailoverMode) -> Scenario {
    let mut s = Scenario::default();
    for (i, iops) in [(1, 100), (2, 200)] {
        let p = dir.join(format!("syn{i}.yaml"));
        std::fs::write(
            &p,
            format!(
                "name: syn{i}\niops: {{randvar: normal, mean: {iops}, stddev: 10}}\nsector: {{size: 512b}}\n\
                 cluster: {{size: {{min: 1, max: 10}}, stride: {{min: 1, max: 1000}}}}\n\
                 hotspots:\n  - [10%, 1%]\n  - [10%, 1%]\n  - [30%, 10%]\n  - [40%, 20%]\n  - [10%, 1%]\n\
                 iosizes:\n  - [80%, 4096b]\n  - [10%, 8192b]\n  - [5%, 16384b]\n  - [5%, 131072b]\n\
                 disk_size: 1GiB\nduration: 120s\nread_ratio: 0.9\nseed: {i}\n"
            ),
        )
        .unwrap();
        s.synthetic.push(SyntheticSection { config: p, then: Vec::new() });
    }
    s.cache.size = "64MiB".into();
    s.cache.replacement = Some(ReplacementKind::TwoPool);
    s.cache.partition = PartitionMode::Shared;
    s.devices.backing = cachevisor_sim::scenario::DeviceChoice::Preset("remote".into());
    s.replay.mode = ReplayMode::Open;
    s.replay.window = "1s".into();
    s.failover = Some(FailoverSection {
        at: "60s".into(),
        mode,
        snapshot_every: "5000req".into(),
        limit: "50%".into(),
        rate: "32MiB".into(),
        minute: "2s".into(),
        ..FailoverSection::default()
    });
    s
}

fn run(s: &Scenario) -> SimResult {
    simulate(s, &mut |_| {}).unwrap()
}

#[test]
fn prewarming_lands_between_a_cold_and_a_warm_cache_and_keeps_its_rate() {
    let dir = tempfile::tempdir().unwrap();
    let [warm, cold, pre] = [FailoverMode::Warm, FailoverMode::Cold, FailoverMode::Prewarm].map(|m| {
        let r = run(&scenario(dir.path(), m));
        r.failover.expect("a failover report")
    });
    // The source took a snapshot every 5,000 requests for 60 s of ~300 IOPS.
    assert!((3..=4).contains(&pre.snapshots_taken), "{}", pre.snapshots_taken);
    // 50% of 64 MiB of 4 KiB blocks, as long as the snapshots hold that many.
    assert!(pre.prewarm_set > 0 && pre.prewarm_set <= 8192, "{}", pre.prewarm_set);
    assert!(pre.prewarm_reads < pre.prewarm_set, "neighbours coalesced: {} reads", pre.prewarm_reads);
    assert_eq!(pre.loaded_blocks + pre.skipped_blocks, pre.prewarm_set, "every object loaded or found cached");
    assert_eq!(pre.prewarm_bytes, pre.loaded_blocks * 4096);
    // Never above 32 MiB/s: the load takes at least bytes / rate (less one read's burst).
    let secs = pre.prewarm_seconds.expect("prewarming ended");
    let least = (pre.prewarm_bytes as f64 - 128.0 * 1024.0) / (32.0 * 1024.0 * 1024.0);
    assert!(secs >= least, "{} bytes in {secs} s", pre.prewarm_bytes);
    assert_eq!((cold.loaded_blocks, warm.loaded_blocks), (0, 0));
    // The brackets: the first "5 minutes" (10 s here) of the destination.
    let five = |r: &cachevisor_sim::failover::FailoverReport| r.avg_hit_ratio[0];
    assert!(
        five(&cold) < five(&pre) && five(&pre) <= five(&warm) * 1.05,
        "{} {} {}",
        five(&cold),
        five(&pre),
        five(&warm)
    );
    assert!(cold.instant_hit_ratio < warm.instant_hit_ratio);
}

#[test]
fn heuristics_and_limits_change_the_set_and_bad_values_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = scenario(dir.path(), FailoverMode::Prewarm);
    let f = s.failover.as_mut().unwrap();
    f.limit = "5%".into();
    f.heuristic = Heuristic::Frequent;
    let small = run(&s).failover.unwrap();
    assert_eq!(small.prewarm_set, 16384 * 5 / 100);
    for (key, set, want) in [
        ("depth", "0", "failover.depth"),
        ("protect", "soon", "failover.protect"),
        ("snapshot_max_gap", "0s", "failover.snapshot_max_gap"),
        ("limit", "150%", "failover.limit"),
        ("rate", "fast", "failover.rate"),
        ("snapshot_every", "0req", "failover.snapshot_every"),
        ("at", "61.5s", "window boundary"),
        ("max_read", "1KiB", "failover.max_read"),
    ] {
        let mut bad = scenario(dir.path(), FailoverMode::Prewarm);
        let f = bad.failover.as_mut().unwrap();
        match key {
            "depth" => f.depth = set.parse().unwrap(),
            "protect" => f.protect = Some(set.into()),
            "snapshot_max_gap" => f.snapshot_max_gap = Some(set.into()),
            "limit" => f.limit = set.into(),
            "rate" => f.rate = set.into(),
            "snapshot_every" => f.snapshot_every = set.into(),
            "at" => f.at = set.into(),
            _ => f.max_read = set.into(),
        }
        let e = simulate(&bad, &mut |_| {}).unwrap_err().to_string();
        assert!(e.contains(want), "{key} = {set}: {e}");
    }
    // The DSF object model replays open loop only, on 4 KiB objects.
    let mut closed = scenario(dir.path(), FailoverMode::Cold);
    closed.cache.objects = cachevisor_sim::scenario::ObjectModel::NutanixDsf;
    closed.replay.mode = ReplayMode::Closed;
    let e = simulate(&closed, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("cache.objects") && e.contains("open"), "{e}");
    // An unknown key in the TOML is named.
    let e = toml::from_str::<Scenario>("[failover]\nat = \"60s\"\nspeed = 3\n").unwrap_err().to_string();
    assert!(e.contains("speed"), "{e}");
}
