//! End-to-end simulator tests on the bundled traces: determinism, scenario validation,
//! replay modes and the accounting identities that must hold.

use cachevisor_engine::{PartitionMode, ReplacementKind, WritePolicy};
use cachevisor_sim::model_choice::ModelChoice;
use cachevisor_sim::scenario::{ReplayMode, VmSection};
use cachevisor_sim::{simulate, Scenario};
use std::path::PathBuf;

fn shared(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces").join(name)
}

fn scenario() -> Scenario {
    let mut s = Scenario::default();
    s.trace.files =
        vec![shared("websearch-small.mqsim.txt"), shared("tpcc-small.mqsim.txt"), shared("cloudPhysicsIO.vscsi")];
    s.cache.size = "64MiB".into();
    s.replay.max_requests = 40_000;
    s
}

#[test]
fn same_input_gives_identical_json() {
    for mode in [ReplayMode::Open, ReplayMode::Closed] {
        for kind in ReplacementKind::ALL {
            let mut s = scenario();
            s.replay.mode = mode;
            s.replay.speedup = 50.0;
            s.cache.replacement = Some(kind);
            let a = simulate(&s, &mut |_| {}).unwrap().to_json();
            let b = simulate(&s, &mut |_| {}).unwrap().to_json();
            assert_eq!(a, b, "{kind} {mode:?}");
            assert!(
                a.contains("\"scenario\"") && a.contains("websearch-small.mqsim.txt"),
                "result carries its scenario"
            );
        }
    }
}

#[test]
fn accounting_identities_hold() {
    let mut s = scenario();
    s.replay.flush_at_end = true;
    let r = simulate(&s, &mut |_| {}).unwrap();
    assert_eq!(r.total.requests, 40_000);
    assert_eq!(r.vms.iter().map(|v| v.requests).sum::<u64>(), 40_000);
    assert_eq!(r.total.final_dirty_blocks, 0, "flushed at end");
    // Static partitions: never more slots used than the cache has.
    assert!(r.total.final_used_blocks <= r.resolved.slots);
    // Every block access is a hit, an insertion, a bypass, or a partial hit.
    assert!(r.total.hit_ratio > 0.0 && r.total.hit_ratio < 1.0);
    // Latency percentiles are ordered.
    let l = &r.total.latency;
    assert!(l.p50_us <= l.p99_us && l.p99_us <= l.p999_us && l.p999_us <= l.p9999_us && l.p9999_us <= l.max_us);
    // Windows cover every request.
    assert_eq!(r.windows.iter().map(|w| w.requests).sum::<u64>(), 40_000);
}

#[test]
fn bigger_cache_hits_more_and_shared_mode_runs() {
    let mut small = scenario();
    small.cache.size = "16MiB".into();
    let mut big = scenario();
    big.cache.size = "1GiB".into();
    let (a, b) = (simulate(&small, &mut |_| {}).unwrap(), simulate(&big, &mut |_| {}).unwrap());
    assert!(b.total.hit_ratio > a.total.hit_ratio, "{} vs {}", b.total.hit_ratio, a.total.hit_ratio);
    big.cache.partition = PartitionMode::Shared;
    let c = simulate(&big, &mut |_| {}).unwrap();
    assert!(c.total.hit_ratio > 0.0);
}

#[test]
fn read_only_vm_writes_less_to_the_ssd() {
    let mut wb = scenario();
    wb.trace.files = vec![shared("cloudPhysicsIO.vscsi")];
    let mut ro = wb.clone();
    ro.vm.push(VmSection { write_policy: Some(WritePolicy::Ro), ..VmSection::named("cloudPhysicsIO") });
    let (a, b) = (simulate(&wb, &mut |_| {}).unwrap(), simulate(&ro, &mut |_| {}).unwrap());
    assert!(b.total.ssd_write_bytes < a.total.ssd_write_bytes);
    assert_eq!(b.total.write_hit_ratio, 0.0);
}

#[test]
fn open_loop_speedup_raises_latency_under_load() {
    let mut slow = scenario();
    slow.trace.files = vec![shared("websearch-small.mqsim.txt")];
    slow.replay.mode = ReplayMode::Open;
    let mut fast = slow.clone();
    fast.replay.speedup = 20.0;
    let (a, b) = (simulate(&slow, &mut |_| {}).unwrap(), simulate(&fast, &mut |_| {}).unwrap());
    assert!(b.total.latency.mean_us > a.total.latency.mean_us);
    assert!(b.virtual_time_s <= a.virtual_time_s);
}

#[test]
fn bad_scenarios_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[cache]\nsize = \"64 parsecs\"\n[trace]\nfiles=[\"x\"]\n", "cache.size"),
        ("[cache]\nblock_size = \"3KiB\"\n[trace]\nfiles=[\"x\"]\n", "block_size"),
        ("[cache]\nreplacement = \"mru\"\n", "mru"),
        ("[replay]\nqueue_depth = 0\n[trace]\nfiles=[\"x\"]\n", "replay.queue_depth"),
        ("[devices]\nssd = \"floppy\"\n[trace]\nfiles=[\"x\"]\n", "devices.ssd"),
        ("[cache]\nsise = \"1GiB\"\n", "sise"),
        ("[replay]\n", "trace.files"),
        ("[cache]\npersistent = \"yes\"\n", "persistent"),
        ("[cache]\nwriteback_ahead = 5000\n[trace]\nfiles=[\"x\"]\n", "cache.writeback_ahead"),
        // a window that would never finish, a link so slow its times saturate.
        ("[replay]\nwindow = \"1ns\"\n[trace]\nfiles=[\"x\"]\n", "replay.window"),
        (
            "[devices]\nbacking = { kind = \"link\", name = \"l\", channels = 1, latency_ns = 1, mbps = 1e-12 }\n[trace]\nfiles=[\"x\"]\n",
            "mbps: 0.000000000001 is outside",
        ),
        (
            "[devices]\nssd = { kind = \"ssd\", name = \"s\", channels = 1, read_ns = 18446744073709551615, write_ns = 1, read_mbps = 1, write_mbps = 1 }\n[trace]\nfiles=[\"x\"]\n",
            "read_ns",
        ),
    ];
    for (text, want) in cases {
        let p = dir.path().join("s.toml");
        std::fs::write(&p, text).unwrap();
        let err = match Scenario::load(&p) {
            Err(e) => e,
            Ok(s) => s.resolve().unwrap_err(),
        };
        assert!(err.contains(want), "`{err}` lacks `{want}`");
    }
}

/// A scenario that names no replacement gets the allocator's own: S3-FIFO for adaptive,
/// CLOCK for S-CAVE (no "set replacement" error), LRU for the rest; one named wins, and
/// S-CAVE over another is refused naming the key.
#[test]
fn an_unset_replacement_is_the_allocators_own() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s.toml");
    for (cache, want) in [
        ("", Some(ReplacementKind::Lru)),
        ("allocator = \"adaptive\"", Some(ReplacementKind::S3fifo)),
        ("allocator = \"s-cave\"", Some(ReplacementKind::Clock)),
        ("allocator = \"adaptive\"\nreplacement = \"two-pool\"", Some(ReplacementKind::TwoPool)),
        ("allocator = \"s-cave\"\nreplacement = \"lru\"", None),
    ] {
        std::fs::write(&p, format!("[cache]\n{cache}\n[trace]\nfiles=[\"x\"]\n")).unwrap();
        let s = Scenario::load(&p).unwrap();
        match want {
            Some(kind) => {
                s.resolve().unwrap();
                assert_eq!(s.cache.replacement(), kind, "{cache}");
            }
            None => assert!(s.resolve().unwrap_err().starts_with("cache.replacement"), "{cache}"),
        }
    }
}

/// a trace offset whose block needs more than a key's 48 bits (another VM's
/// block in a key), or whose end passes 2^64, stops the run naming where it is — never a
/// hit on another VM's data.
#[test]
fn trace_offsets_past_the_key_range_stop_with_location() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("far.csv");
    // Two VMs of one CSV trace: vm 0 writes block 5; vm 1 would then read its block
    // 2^48 + 5 (block 5 of the next VM in a 48-bit key).
    let far = ((1u64 << 48) + 5) * 4096;
    std::fs::write(&p, format!("0,0,W,{},4096\n1,1,R,{far},4096\n", 5 * 4096)).unwrap();
    let mut s = scenario();
    s.trace.files = vec![p.clone()];
    s.trace.format = Some(cachevisor_trace::Format::Csv);
    let e = simulate(&s, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("request 2") && e.contains("reach past its end"), "{e}");
    let wrap = dir.path().join("wrap.csv");
    std::fs::write(&wrap, format!("0,0,R,{},4096\n", u64::MAX - 100)).unwrap();
    s.trace.files = vec![wrap];
    let e = simulate(&s, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("wrap.csv") && e.contains("line 1") && e.contains("2^64"), "{e}");
}

#[test]
fn malformed_trace_stops_with_location() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.mqsim.txt");
    std::fs::write(&p, "1 0 8 8 1\n2 0 8 8 1\n3 0 x 8 1\n").unwrap();
    let mut s = scenario();
    s.trace.files = vec![p.clone()];
    s.trace.format = Some(cachevisor_trace::Format::Mqsim);
    let e = simulate(&s, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("bad.mqsim.txt") && e.contains("line 3") && e.contains("start_sector"), "{e}");
    s.trace.skip_bad = true;
    let r = simulate(&s, &mut |_| {}).unwrap();
    assert_eq!((r.total.requests, r.traces[0].skipped_bad), (2, 1));
}

#[test]
fn optimal_static_split_beats_equal_shares() {
    let mut equal = scenario();
    equal.replay.max_requests = 0;
    equal.cache.size = "512MiB".into();
    let mut best = equal.clone();
    best.cache.allocator = "optimal".into();
    let (a, b) = (simulate(&equal, &mut |_| {}).unwrap(), simulate(&best, &mut |_| {}).unwrap());
    assert!(
        b.total.hit_ratio > a.total.hit_ratio + 0.1,
        "optimal {} vs equal {}",
        b.total.hit_ratio,
        a.total.hit_ratio
    );
    // The split follows the curves: the reuse-heavy VM gets most of the cache.
    let cp = b.vms.iter().find(|v| v.vm == "cloudPhysicsIO").unwrap();
    assert!(cp.final_used_blocks > b.resolved.slots / 2);
    // Weighted fair share gives what the streaming VMs cannot use to the others.
    let mut fair = equal.clone();
    fair.cache.allocator = "symflex-weighted".into();
    let f = simulate(&fair, &mut |_| {}).unwrap();
    assert!(f.total.hit_ratio > a.total.hit_ratio, "fair share {} vs equal {}", f.total.hit_ratio, a.total.hit_ratio);
    let mut bad = equal.clone();
    bad.cache.allocator = "psychic".into();
    assert!(simulate(&bad, &mut |_| {}).unwrap_err().to_string().contains("cache.allocator"));
}

#[test]
fn reallocating_every_window_follows_recent_curves() {
    let mut s = scenario();
    s.replay.max_requests = 60_000;
    s.cache.size = "512MiB".into();
    s.cache.allocator = "optimal".into();
    s.cache.reallocate = Some(true);
    let a = simulate(&s, &mut |_| {}).unwrap();
    assert_eq!(a.to_json(), simulate(&s, &mut |_| {}).unwrap().to_json(), "deterministic");
    // Targets move between windows and never exceed the cache.
    let targets: std::collections::BTreeSet<u64> =
        a.windows.iter().filter(|w| w.vm == "cloudPhysicsIO").map(|w| w.target_blocks).collect();
    assert!(targets.len() > 2, "{targets:?}");
    for w in a.windows.chunks(3) {
        assert!(w.iter().map(|r| r.target_blocks).sum::<u64>() <= a.resolved.slots);
    }
    let mut equal = s.clone();
    equal.cache.allocator = "static".into();
    let e = simulate(&equal, &mut |_| {}).unwrap();
    assert!(a.total.hit_ratio > e.total.hit_ratio, "{} vs {}", a.total.hit_ratio, e.total.hit_ratio);
}

#[test]
fn writing_back_ahead_of_eviction_in_idle_time_cuts_the_tail_and_changes_no_hit() {
    // Two write-heavy VMs at a pace their HDDs serve with idle time between requests
    // (open loop): a miss's dirty victim can be written back before
    // the miss comes. The background flusher is off here, to measure write-back ahead
    // alone (the flusher's jobs share its per-vDisk slot and idle time).
    let dir = tempfile::tempdir().unwrap();
    let mut s = Scenario::default();
    s.cache.flush_rate = "0".into();
    s.cache.size = "8MiB".into();
    s.cache.write_policy = WritePolicy::Wb;
    s.replay.mode = ReplayMode::Open;
    s.synthetic = (0..2)
        .map(|i| {
            let p = dir.path().join(format!("w{i}.yaml"));
            std::fs::write(
                &p,
                format!(
                    "name: w{i}\niops: {{randvar: normal, mean: 40, stddev: 10}}\nsector: {{size: 512b}}\ncluster: {{size: {{min: 1, max: 1}}, stride: {{min: 1, max: 1}}}}\nhotspots: [[10%, 60%]]\niosizes:\n  - [100%, 4096b]\ndisk_size: 256MiB\nduration: 300s\nread_ratio: 0.4\nseed: {}\n",
                    i + 1
                ),
            )
            .unwrap();
            cachevisor_sim::scenario::SyntheticSection { config: p, then: Vec::new() }
        })
        .collect();
    s.cache.writeback_ahead = 0;
    let off = simulate(&s, &mut |_| {}).unwrap();
    s.cache.writeback_ahead = 32;
    let on = simulate(&s, &mut |_| {}).unwrap();
    let (a, b) = (&off.total, &on.total);
    eprintln!(
        "ahead off/on: hit {:.4}/{:.4}, mean {:.0}/{:.0} µs, p99 {:.0}/{:.0} µs, p99.9 {:.0}/{:.0} µs, written ahead {}/{}, backing writes {}/{}",
        a.hit_ratio,
        b.hit_ratio,
        a.latency.mean_us,
        b.latency.mean_us,
        a.latency.p99_us,
        b.latency.p99_us,
        a.latency.p999_us,
        b.latency.p999_us,
        off.engine.written_back_ahead,
        on.engine.written_back_ahead,
        a.backing_write_bytes,
        b.backing_write_bytes
    );
    // Residency is the replacement policy's alone: the same blocks hit.
    assert_eq!(a.hit_ratio, b.hit_ratio);
    assert_eq!(off.engine.written_back_ahead, 0);
    assert!(on.engine.written_back_ahead > 1000, "{}", on.engine.written_back_ahead);
    assert!(b.latency.p99_us < a.latency.p99_us * 0.9, "p99 {} vs {}", b.latency.p99_us, a.latency.p99_us);
    assert!(b.latency.mean_us < a.latency.mean_us, "mean {} vs {}", b.latency.mean_us, a.latency.mean_us);
}

/// One far timestamp in an open-loop replay stops the run with the windows it would need
/// named, in both models (the check runs before the replay advances to it).
#[test]
fn a_timestamp_past_the_windows_a_run_keeps_stops_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("far-time.csv");
    // Times in nanoseconds: the third request is 10^7 s in, 10^7 one-second windows.
    std::fs::write(&p, "0,0,R,0,4096\n1000,0,R,4096,4096\n10000000000000000,0,R,8192,4096\n").unwrap();
    for model in [ModelChoice::Cache, ModelChoice::Full] {
        let mut s = scenario();
        s.trace.files = vec![p.clone()];
        s.trace.format = Some(cachevisor_trace::Format::Csv);
        s.replay.mode = ReplayMode::Open;
        s.replay.window = "1s".into();
        s.replay.model = model;
        let e = match simulate(&s, &mut |_| {}) {
            Ok(r) => panic!("{model:?}: ran, {} windows", r.windows.len()),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("replay.window") && e.contains("10000000 windows"), "{model:?}: {e}");
    }
}

/// `[cache] admission` in both models: second-hit and a probability reject misses (the
/// VM's report counts them), write less to the SSD than admitting all, and a VM's own
/// setting overrides the cache's; a run admitting all reports no admission at all (its
/// JSON as before the setting existed).
#[test]
fn admission_rejects_misses_writes_less_and_is_reported() {
    use cachevisor_engine::AdmissionPolicy;
    for model in [ModelChoice::Cache, ModelChoice::Full] {
        let mut s = scenario();
        s.trace.files = vec![shared("cloudPhysicsIO.vscsi")];
        s.cache.size = "16MiB".into();
        s.replay.model = model;
        let all = simulate(&s, &mut |_| {}).unwrap();
        assert!(all.vms[0].entry.admission.is_none());
        assert!(!serde_json::to_string(&all).unwrap().contains("admission"), "{model:?}");
        for policy in [AdmissionPolicy::NthMiss { n: 2 }, AdmissionPolicy::Probability { p: 0.3 }] {
            s.cache.admission = Some(policy);
            let r = simulate(&s, &mut |_| {}).unwrap();
            let a =
                r.vms[0].entry.admission.as_ref().unwrap_or_else(|| panic!("{model:?} {policy}: no admission report"));
            assert_eq!((a.read, a.write), (policy, policy));
            assert!(a.counts.read_rejected > 0 && a.counts.read_admitted > 0, "{model:?} {policy}: {a:?}");
            assert!(r.total.ssd_write_bytes < all.total.ssd_write_bytes, "{model:?} {policy}");
            assert_eq!(r.total.requests, all.total.requests);
        }
        // The VM's own setting wins over the cache's.
        let name = all.vms[0].vm.clone();
        s.vm = vec![VmSection { admission: Some(AdmissionPolicy::All), ..VmSection::named(&name) }];
        let r = simulate(&s, &mut |_| {}).unwrap();
        assert!(r.vms[0].entry.admission.is_none(), "{model:?}: the VM admits all");
        assert_eq!(r.total.ssd_write_bytes, all.total.ssd_write_bytes, "{model:?}");
    }
}

/// A write budget holds the VM's SSD writes at its target over the run, in both models:
/// at half of what admitting every miss writes, within 5%; two different budgets for one
/// VM are refused by name.
#[test]
fn a_write_budget_holds_the_ssd_write_rate_at_its_target() {
    use cachevisor_engine::{AdmissionPolicy, BudgetRate};
    for model in [ModelChoice::Cache, ModelChoice::Full] {
        let mut s = scenario();
        s.trace.files = vec![shared("cloudPhysicsIO.vscsi")];
        s.cache.size = "16MiB".into();
        s.replay.model = model;
        let budget = |b: u64| AdmissionPolicy::WriteBudget { rate: BudgetRate::BytesPerSec(b) };
        s.cache.admission = Some(budget(1 << 40));
        let free = simulate(&s, &mut |_| {}).unwrap();
        let b = free.vms[0].entry.admission.as_ref().unwrap().budget.unwrap();
        assert_eq!((b.probability, b.unreachable), (1.0, false), "{model:?}: a budget far above never binds");
        let rate = b.written_bytes as f64 / b.elapsed_s;
        let target = (rate / 2.0) as u64;
        s.cache.admission = Some(budget(target));
        let r = simulate(&s, &mut |_| {}).unwrap();
        let a = r.vms[0].entry.admission.as_ref().unwrap();
        let b = a.budget.unwrap();
        let held = b.written_bytes as f64 / b.elapsed_s;
        assert!(
            (held / target as f64 - 1.0).abs() <= 0.05,
            "{model:?}: {held:.0} B/s against {target} ({rate:.0} free)"
        );
        assert!(a.counts.read_rejected > 0 && a.counts.write_rejected > 0, "{model:?}: {a:?}");
        assert_eq!(b.written_bytes, r.total.ssd_write_bytes, "{model:?}: the budget counts every SSD byte");
    }
    let mut s = scenario();
    s.cache.admission = Some("write-budget:1MiB/s".parse().unwrap());
    s.cache.write_admission = Some("write-budget:2MiB/s".parse().unwrap());
    let e = simulate(&s, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("cache:") && e.contains("write-budget:1MiB/s") && e.contains("differ"), "{e}");
}

/// The cache's shared write budget (`[cache] write_budget`), in both models, on two VMs
/// at once: at half of what admitting every miss writes, the run's SSD writes hold it
/// within 5%; each VM's share is in its report and the cache's in `engine.write_budget`;
/// a malformed rate is refused naming its key.
#[test]
fn a_shared_write_budget_holds_the_cache_write_rate_across_vms() {
    for model in [ModelChoice::Cache, ModelChoice::Full] {
        let mut s = scenario();
        s.trace.files = vec![shared("cloudPhysicsIO.vscsi"), shared("websearch-small.mqsim.txt")];
        s.cache.size = "16MiB".into();
        s.replay.model = model;
        s.cache.write_budget = Some("1TiB/s".into());
        let free = simulate(&s, &mut |_| {}).unwrap();
        let b = free.engine.write_budget.clone().expect("reported");
        assert_eq!(b.written_bytes, free.total.ssd_write_bytes, "{model:?}: the budget counts every SSD byte");
        assert!(b.vdisks.iter().all(|v| v.rejected == 0), "{model:?}: a budget far above never binds");
        let target = (b.written_bytes as f64 / b.elapsed_s / 2.0) as u64;
        s.cache.write_budget = Some(format!("{target}B/s"));
        let r = simulate(&s, &mut |_| {}).unwrap();
        let b = r.engine.write_budget.clone().unwrap();
        let held = b.written_bytes as f64 / b.elapsed_s;
        assert!((held / target as f64 - 1.0).abs() <= 0.05, "{model:?}: {held:.0} B/s against {target}");
        assert_eq!(b.vdisks.len(), 2, "{model:?}");
        for (vm, share) in r.vms.iter().zip(&b.vdisks) {
            assert_eq!(vm.entry.budget_share.as_ref(), Some(share), "{model:?}");
            assert!(share.admitted > 0 && share.rejected > 0 && share.value.is_some(), "{model:?}: {share:?}");
        }
    }
    let mut s = scenario();
    s.cache.write_budget = Some("5MiB".into());
    let e = simulate(&s, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("cache.write_budget") && e.contains("5MiB"), "{e}");
}

/// Prefetch for a sequential reader of a slow store (2 ms a request, closed loop, one
/// request at a time): AMP turns its misses into hits and cuts its mean latency by more
/// than 5×, OBL by less; a VM's own `prefetch = "none"` wins over the cache's.
#[test]
fn prefetch_serves_a_sequential_reader_of_a_slow_store_from_the_cache() {
    use cachevisor_engine::PrefetchPolicy;
    use cachevisor_sim::device::DeviceSpec;
    use cachevisor_sim::scenario::DeviceChoice;
    let dir = tempfile::tempdir().unwrap();
    let seq = dir.path().join("seq.msr");
    let text: String = (0..4000u64)
        .map(|i| format!("{},seq,0,Read,{},4096,0\n", 116444736000000000u64 + i * 1000, i * 4096))
        .collect();
    std::fs::write(&seq, text).unwrap();
    let mut s = scenario();
    s.trace.files = vec![seq];
    s.cache.size = "16MiB".into();
    s.replay.model = ModelChoice::Full;
    s.replay.mode = ReplayMode::Closed;
    s.replay.queue_depth = 1;
    s.devices.backing = DeviceChoice::Spec(DeviceSpec::Link {
        name: "store-2ms".into(),
        channels: 16,
        latency_ns: 2_000_000,
        mbps: 200.0,
    });
    let run = |p: Option<PrefetchPolicy>, s: &mut Scenario| {
        s.cache.prefetch = p;
        simulate(s, &mut |_| {}).unwrap()
    };
    let none = run(None, &mut s);
    assert!(none.vms[0].entry.prefetch.is_none() && none.total.hit_ratio == 0.0);
    let obl = run(Some(PrefetchPolicy::Obl), &mut s);
    let amp = run(Some(PrefetchPolicy::Amp { max: 16 }), &mut s);
    let (n, o, a) = (none.total.latency.mean_us, obl.total.latency.mean_us, amp.total.latency.mean_us);
    assert!(amp.total.hit_ratio > 0.99 && a * 5.0 < n, "amp {a:.0} µs vs none {n:.0} µs");
    assert!(o < n && a < o, "obl {o:.0} µs between amp {a:.0} and none {n:.0}");
    let st = amp.vms[0].entry.prefetch.unwrap();
    assert_eq!(st.policy, PrefetchPolicy::Amp { max: 16 });
    assert!(st.counts.used >= 3990 && st.counts.wasted == 0 && st.degree == 16, "{st:?}");
    // Past the reader's last block: at most the degree plus the trigger distance.
    let extra = amp.total.ssd_write_bytes - none.total.ssd_write_bytes;
    assert!(extra <= 32 * 4096, "{extra} bytes loaded past the end");
    // The VM's own setting wins.
    s.vm = vec![VmSection { prefetch: Some(PrefetchPolicy::None), ..VmSection::named("seq") }];
    let own = run(Some(PrefetchPolicy::Obl), &mut s);
    assert!(own.vms[0].entry.prefetch.is_none() && own.total.hit_ratio == 0.0);
}

/// Congestion bypass on a saturated cache device (a slow SSD taking every miss's fill,
/// open loop at 3,000 reads/s, a fast array behind it): with 2 ms thresholds, misses go
/// around while it is congested, and the p99 falls by more than 10×; on a fast SSD the same
/// thresholds never trigger and change nothing.
#[test]
fn congestion_bypass_lowers_the_p99_of_a_saturated_cache_and_costs_nothing_otherwise() {
    use cachevisor_sim::device::DeviceSpec;
    use cachevisor_sim::scenario::{DeviceChoice, SyntheticSection};
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("hot.yaml");
    std::fs::write(
        &yaml,
        "name: hot\niops: {randvar: normal, mean: 3000, stddev: 0}\nsector: {size: 512b}\n\
         cluster: {size: {min: 1, max: 1}, stride: {min: 1, max: 1}}\nhotspots:\n  - [10%, 60%]\n\
         iosizes:\n  - [100%, 4096b]\ndisk_size: 2GiB\nduration: 6s\nread_ratio: 1.0\nseed: 5\n",
    )
    .unwrap();
    let mut s = Scenario { synthetic: vec![SyntheticSection { config: yaml, then: Vec::new() }], ..Default::default() };
    s.cache.size = "256MiB".into();
    s.replay.model = ModelChoice::Full;
    s.replay.mode = ReplayMode::Open;
    s.devices.backing =
        DeviceChoice::Spec(DeviceSpec::Link { name: "array".into(), channels: 64, latency_ns: 300_000, mbps: 2000.0 });
    let slow = DeviceSpec::Ssd {
        name: "slow".into(),
        channels: 2,
        read_ns: 100_000,
        write_ns: 600_000,
        read_mbps: 300.0,
        write_mbps: 60.0,
    };
    for (ssd, saturated) in [(DeviceChoice::Spec(slow), true), (DeviceChoice::Preset("nvme".into()), false)] {
        s.devices.ssd = ssd;
        s.cache.congested_read_threshold = None;
        s.cache.congested_write_threshold = None;
        let plain = simulate(&s, &mut |_| {}).unwrap();
        assert!(plain.engine.congestion.is_none());
        s.cache.congested_read_threshold = Some("2ms".into());
        s.cache.congested_write_threshold = Some("2ms".into());
        let bypass = simulate(&s, &mut |_| {}).unwrap();
        let c = bypass.engine.congestion.clone().expect("thresholds set: its state is reported");
        let (p, b) = (plain.total.latency.p99_us, bypass.total.latency.p99_us);
        let around = bypass.vms[0].entry.congestion_bypassed;
        if saturated {
            assert!(b * 10.0 < p, "p99 {b:.0} µs with bypass vs {p:.0} µs without");
            assert!(around[0] > 0 && c.read_episodes + c.write_episodes > 0, "{around:?} {c:?}");
        } else {
            assert_eq!(around, [0, 0], "{c:?}");
            assert_eq!((b, bypass.total.hit_ratio), (p, plain.total.hit_ratio), "a fast SSD: nothing changes");
        }
    }
    let mut bad = scenario();
    bad.cache.congested_read_threshold = Some("2 parsecs".into());
    let e = simulate(&bad, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("cache.congested_read_threshold"), "{e}");
}
