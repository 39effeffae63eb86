//! The interval controller: allocators every window, phases, S-CAVE's cleaner and
//! write-policy decisions, request-count windows, repeated passes, and the lookahead
//! oracle — end to end through `simulate`.

use cachevisor_engine::{ReplacementKind, WritePolicy};
use cachevisor_sim::scenario::{PhaseSection, ReplayMode, SyntheticSection, VmChange, VmSection, WorkloadChange};
use cachevisor_sim::{simulate, Scenario};
use std::path::{Path, PathBuf};

/// Writes a generator config: `hot` is the hotspot list.
fn workload(dir: &Path, name: &str, seed: u64, hot: &str, read_ratio: f64, secs: u64) -> PathBuf {
    let p = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &p,
        format!(
            "name: {name}\niops: {{randvar: normal, mean: 1000, stddev: 0}}\nsector: {{size: 512b}}\ncluster: {{size: {{min: 1, max: 1}}, stride: {{min: 1, max: 1}}}}\nhotspots: {hot}\niosizes:\n  - [100%, 4096b]\ndisk_size: 256MiB\nduration: {secs}s\nread_ratio: {read_ratio}\nseed: {seed}\n"
        ),
    )
    .unwrap();
    p
}

fn synthetic(p: PathBuf) -> SyntheticSection {
    SyntheticSection { config: p, then: Vec::new() }
}

#[test]
fn s_cave_needs_clock_and_runs_its_cleaner_and_write_policy() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Scenario::default();
    s.cache.size = "8MiB".into();
    s.cache.allocator = "s-cave".into();
    s.synthetic = vec![
        synthetic(workload(dir.path(), "a", 1, "[[4%, 95%]]", 0.9, 20)),
        synthetic(workload(dir.path(), "b", 2, "[[100%, 100%]]", 0.9, 20)),
    ];
    // Another replacement named is refused; none named is S-CAVE's own, CLOCK.
    s.cache.replacement = Some(ReplacementKind::Lru);
    let e = simulate(&s, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("replacement") && e.contains("clock"), "{e}");
    s.cache.replacement = None;
    assert_eq!(s.cache.replacement(), ReplacementKind::Clock);
    let r = simulate(&s, &mut |_| {}).unwrap();
    // Write-through with write-around misses for every VM (S-CAVE §V-C), so nothing dirty.
    assert!(r.windows.iter().skip(2).all(|w| w.write_policy == WritePolicy::Wa && w.dirty_blocks == 0));
    // Once the pool filled, control starts (Alg. 1 line 7); every capped window's
    // allocations total at most 95% (lines 34–39).
    let slots = r.resolved.slots;
    let windows: Vec<u64> = (0..=r.windows.iter().map(|w| w.window).max().unwrap()).collect();
    let targets = |i: u64| r.windows.iter().filter(|w| w.window == i).map(|w| w.target_blocks).collect::<Vec<_>>();
    let capped: Vec<u64> = windows.iter().copied().filter(|&i| targets(i).iter().all(|&t| t < slots)).collect();
    assert!(!capped.is_empty(), "control never started");
    for i in capped {
        let total = targets(i).iter().sum::<u64>();
        assert!(total <= slots * 95 / 100, "window {i}: {total} of {slots}");
    }
}

/// S-CAVE's intent: while both run, the VM with reuse holds more cache than the one
/// without. Still open: with `s-cave` the reusing VM's rECS dips around window
/// 20, Algorithm 1's trend rule shrinks it, its hit ratio and rECS fall further, and it
/// holds 647 blocks on average against 1,098 for the VM without reuse. `s-cave-literal`
/// (caps lifted whenever more than 5% is free) passes this run but loses the seed's own
/// co-run claims (`scave-corun`: strong VM 71.5% against shared CLOCK's 90.2%).
#[test]
#[ignore = "S-CAVE's trend rule spirals the reusing VM down on this run"]
fn s_cave_leaves_the_reusing_vm_more_cache() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Scenario::default();
    s.cache.size = "8MiB".into();
    s.cache.allocator = "s-cave".into();
    s.cache.replacement = Some(ReplacementKind::Clock);
    s.synthetic = vec![
        synthetic(workload(dir.path(), "a", 1, "[[4%, 95%]]", 0.9, 20)),
        synthetic(workload(dir.path(), "b", 2, "[[100%, 100%]]", 0.9, 20)),
    ];
    let r = simulate(&s, &mut |_| {}).unwrap();
    let both: Vec<u64> = (0..=r.windows.iter().map(|w| w.window).max().unwrap())
        .filter(|&i| r.windows.iter().filter(|w| w.window == i && w.accesses > 0).count() == 2)
        .collect();
    assert!(both.len() > 20, "both VMs run for {} windows", both.len());
    let held = |vm: &str| {
        r.windows.iter().filter(|w| w.vm == vm && both.contains(&w.window)).map(|w| w.used_blocks).sum::<u64>()
            / both.len() as u64
    };
    assert!(held("a") > held("b"), "mean blocks held: a {} b {}", held("a"), held("b"));
}

#[test]
fn eci_cache_picks_write_policies_per_vm() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Scenario::default();
    s.cache.size = "16MiB".into();
    s.cache.allocator = "eci-cache".into();
    s.synthetic = vec![
        synthetic(workload(dir.path(), "writer", 1, "[[4%, 95%]]", 0.3, 10)),
        synthetic(workload(dir.path(), "reader", 2, "[[4%, 95%]]", 0.99, 10)),
    ];
    let r = simulate(&s, &mut |_| {}).unwrap();
    let p = |vm: &str| r.windows.iter().rev().find(|w| w.vm == vm).unwrap().write_policy;
    assert_eq!((p("writer"), p("reader")), (WritePolicy::Wb, WritePolicy::Ro));
}

#[test]
fn phases_change_settings_at_their_time() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Scenario::default();
    s.cache.size = "16MiB".into();
    s.replay.mode = ReplayMode::Open;
    s.synthetic = vec![synthetic(workload(dir.path(), "a", 1, "[[4%, 95%]]", 0.5, 10))];
    s.vm = vec![VmSection { write_policy: Some(WritePolicy::Wb), ..VmSection::named("a") }];
    s.phase = vec![PhaseSection {
        at: "5s".into(),
        vm: vec![VmChange { name: "a".into(), weight: None, ratio: None, write_policy: Some(WritePolicy::Ro) }],
    }];
    let r = simulate(&s, &mut |_| {}).unwrap();
    for w in &r.windows {
        let want = if w.t_end_s <= 5.0 { WritePolicy::Wb } else { WritePolicy::Ro };
        assert_eq!(w.write_policy, want, "window ending {}", w.t_end_s);
    }
    assert_eq!(r.windows.iter().rev().find(|w| w.requests > 0).unwrap().dirty_blocks, 0, "leaving write-back flushed");
}

#[test]
fn request_count_windows_and_repeated_passes() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Scenario::default();
    s.cache.size = "16MiB".into();
    s.replay.window = "128req".into();
    s.replay.queue_depth = 1;
    s.replay.repeat_for = Some("30s".into());
    s.synthetic = vec![synthetic(workload(dir.path(), "a", 1, "[[4%, 95%]]", 1.0, 2))];
    let r = simulate(&s, &mut |_| {}).unwrap();
    let v = &r.vms[0];
    assert!(v.iterations >= 2, "{} passes", v.iterations);
    assert_eq!(v.requests, v.iterations * 2000);
    assert!(r.windows[..r.windows.len() - 1].iter().all(|w| w.requests == 128));
    assert!(v.first_iteration_s.unwrap() < r.virtual_time_s);
    s.replay.window = "0req".into();
    assert!(simulate(&s, &mut |_| {}).unwrap_err().to_string().contains("replay.window"));
    // windows of 1 ms over 10^8 s would be kept without end: refused at once.
    s.replay.window = "1ms".into();
    s.replay.repeat_for = Some("100000000s".into());
    let e = simulate(&s, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("replay.window") && e.contains("1000000"), "{e}");
}

#[test]
fn lookahead_oracle_beats_the_online_controller_on_shifting_hot_sets() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) =
        (workload(dir.path(), "a", 1, "[[4%, 95%]]", 1.0, 20), workload(dir.path(), "b", 2, "[[4%, 95%]]", 1.0, 20));
    let quiet = workload(dir.path(), "q", 3, "[[100%, 100%]]", 1.0, 20);
    let mut s = Scenario::default();
    s.cache.size = "12MiB".into();
    s.cache.allocator = "optimal".into();
    s.replay.mode = ReplayMode::Open;
    s.replay.window = "2s".into();
    // VM a is hot then quiet; VM b quiet then hot: a past-looking controller lags.
    s.synthetic = vec![
        SyntheticSection { config: a, then: vec![WorkloadChange { config: quiet.clone(), at: "10s".into() }] },
        SyntheticSection { config: quiet, then: vec![WorkloadChange { config: b, at: "10s".into() }] },
    ];
    s.cache.reallocate = Some(true);
    let online = simulate(&s, &mut |_| {}).unwrap().total.hit_ratio;
    s.cache.lookahead = true;
    let oracle = simulate(&s, &mut |_| {}).unwrap().total.hit_ratio;
    eprintln!("hit ratio: oracle {oracle:.4}, online {online:.4}");
    assert!(oracle > online, "oracle {oracle} online {online}");
    // Closed loop: the oracle reads each VM's next requests at its pace.
    s.replay.mode = ReplayMode::Closed;
    let oracle = simulate(&s, &mut |_| {}).unwrap().total.hit_ratio;
    s.cache.lookahead = false;
    let online = simulate(&s, &mut |_| {}).unwrap().total.hit_ratio;
    eprintln!("closed loop hit ratio: oracle {oracle:.4}, online {online:.4}");
    assert!(oracle > online, "closed loop: oracle {oracle} online {online}");
    s.cache.lookahead = true;
    s.replay.repeat_for = Some("30s".into());
    assert!(simulate(&s, &mut |_| {}).unwrap_err().to_string().contains("repeat_for"));
}

#[test]
fn sequential_cutoff_keeps_long_streams_out_of_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("scan.yaml");
    std::fs::write(&p, "name: scan\niops: {randvar: normal, mean: 1000, stddev: 0}\nsector: {size: 512b}\ncluster: {size: {min: 64, max: 64}, stride: {min: 8, max: 8}}\nhotspots: [[100%, 100%]]\niosizes:\n  - [100%, 4096b]\ndisk_size: 256MiB\nduration: 5s\nread_ratio: 1.0\nseed: 1\n").unwrap();
    let mut s = Scenario::default();
    s.cache.size = "16MiB".into();
    s.synthetic = vec![synthetic(p)];
    let plain = simulate(&s, &mut |_| {}).unwrap().total.inserted_blocks;
    s.vm = vec![VmSection { sequential_cutoff: Some("16KiB".into()), ..VmSection::named("scan") }];
    let cut = simulate(&s, &mut |_| {}).unwrap().total.inserted_blocks;
    assert!(plain > 1000 && cut * 4 < plain, "inserted {cut} with the cutoff, {plain} without");
}

#[test]
fn bad_controller_settings_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let base = || Scenario {
        synthetic: vec![synthetic(workload(dir.path(), "a", 1, "[[4%, 95%]]", 1.0, 1))],
        ..Scenario::default()
    };
    let vm = |ratio: f64, min: Option<&str>, cut: Option<&str>| VmSection {
        ratio,
        min: min.map(Into::into),
        sequential_cutoff: cut.map(Into::into),
        ..VmSection::named("a")
    };
    let err = |s: Scenario| simulate(&s, &mut |_| {}).unwrap_err().to_string();
    let mut s = base();
    s.vm = vec![vm(0.0, None, None)];
    assert!(err(s).contains("ratio"));
    let mut s = base();
    s.vm = vec![vm(1.0, Some("lots"), None)];
    assert!(err(s).contains("vm[0] (a).min"));
    let mut s = base();
    s.vm = vec![vm(1.0, None, Some("-4MiB"))];
    assert!(err(s).contains("sequential_cutoff"));
    let mut s = base();
    s.phase = vec![PhaseSection { at: "soon".into(), vm: vec![] }];
    assert!(err(s).contains("phase[0].at"));
    let mut s = base();
    s.replay.mode = ReplayMode::Open;
    s.replay.repeat_for = Some("10s".into());
    assert!(err(s).contains("replay.repeat_for"));
    let mut s = base();
    s.cache.allocator = "s-cave".into();
    s.cache.replacement = Some(ReplacementKind::Clock);
    s.cache.params = [("m".to_string(), -1.0)].into_iter().collect();
    assert!(err(s).contains("cache.params"));
}
