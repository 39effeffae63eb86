//! Several cache devices on one host (`devices.ssd_count`): the cache split over them in
//! equal parts, one allocation, each device its own queue — so a host's layout can be
//! sized before it is bought.

use cachevisor_sim::scenario::ReplayMode;
use cachevisor_sim::{simulate, Scenario, SimResult};
use std::path::PathBuf;

fn shared(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces").join(name)
}

/// tpcc replayed closed-loop at QD 32 for 30 s of virtual time from a warm start (its
/// working set fits): nearly every request a cache hit, the cache device the bottleneck.
fn hits_bound(devices: u32) -> SimResult {
    let mut s = Scenario::default();
    s.trace.files = vec![shared("tpcc-small.mqsim.txt")];
    s.cache.size = "256MiB".into();
    s.devices.ssd = cachevisor_sim::scenario::DeviceChoice::Preset("860-evo".into());
    s.devices.backing = cachevisor_sim::scenario::DeviceChoice::Preset("850-pro".into());
    s.devices.ssd_count = devices;
    // One copy of dirty data: this is about the devices' parallelism (mirroring, the
    // default with two or more, writes each dirty block twice: below).
    s.devices.mirror_dirty = Some(false);
    s.replay.mode = ReplayMode::Closed;
    s.replay.queue_depth = 32;
    s.replay.repeat_for = Some("30s".into());
    simulate(&s, &mut |_| {}).unwrap()
}

#[test]
fn more_devices_serve_more_hits_and_share_the_writes() {
    let one = hits_bound(1);
    let two = hits_bound(2);
    let four = hits_bound(4);
    assert_eq!(one.resolved.slots, four.resolved.slots, "one allocation: the same cache in all three");
    for r in [&one, &two, &four] {
        assert!(r.total.hit_ratio > 0.98, "hits-bound: {}", r.total.hit_ratio);
    }
    // The same virtual time: twice the devices serve nearly twice the requests.
    let (r1, r2, r4) = (one.total.requests as f64, two.total.requests as f64, four.total.requests as f64);
    assert!(r2 > 1.7 * r1 && r4 > 1.7 * r2, "requests served: {r1} / {r2} / {r4}");
    assert!(two.total.latency.mean_us < 0.6 * one.total.latency.mean_us);
    // Each device's report: its writes, about a quarter each, adding up to the VMs'.
    let ssds: Vec<_> = four.devices.iter().filter(|d| d.device.starts_with("ssd ")).collect();
    assert_eq!(ssds.len(), 4);
    assert!(ssds.iter().enumerate().all(|(i, d)| d.device.ends_with(&format!("#{i}"))), "{ssds:?}");
    let written: u64 = ssds.iter().map(|d| d.bytes_written).sum();
    assert_eq!(written, four.total.ssd_write_bytes);
    for d in &ssds {
        let share = d.bytes_written as f64 / written as f64;
        assert!((0.2..0.3).contains(&share), "{} wrote {share:.3} of the bytes", d.device);
    }
    let json = four.to_json();
    assert!(json.contains("\"ssd_count\": 4") && json.contains("\"bytes_written\""), "the result records it");
    // One device: the result names it as before (no `#0`), and says nothing of a count.
    assert!(one.devices[0].device == "ssd 860-evo" && !one.to_json().contains("ssd_count"));
}

#[test]
fn a_bad_device_count_is_named() {
    for (n, want) in [(0, "outside 1..=64"), (65, "outside 1..=64")] {
        let mut s = Scenario::default();
        s.trace.files = vec![shared("tpcc-small.mqsim.txt")];
        s.devices.ssd_count = n;
        let e = simulate(&s, &mut |_| {}).unwrap_err().to_string();
        assert!(e.contains("devices.ssd_count") && e.contains(want), "{n}: {e}");
    }
    let mut s = Scenario::default();
    s.trace.files = vec![shared("tpcc-small.mqsim.txt")];
    s.cache.size = "8KiB".into();
    s.devices.ssd_count = 3;
    let e = simulate(&s, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("devices.ssd_count: 3 devices for a cache of 2 blocks"), "{e}");
    let e = toml::from_str::<Scenario>("[devices]\nssd_count = \"two\"\n").unwrap_err().to_string();
    assert!(e.contains("ssd_count"), "{e}");
}

/// tpcc with half its requests written (write-back), replayed closed-loop over two
/// devices: mirrored or not.
fn writes_over_two(mirror: Option<bool>) -> SimResult {
    let mut s = Scenario::default();
    s.trace.files = vec![shared("tpcc-small.mqsim.txt")];
    s.cache.size = "64MiB".into();
    s.cache.write_policy = cachevisor_engine::WritePolicy::Wb;
    s.devices.ssd_count = 2;
    s.devices.mirror_dirty = mirror;
    s.replay.mode = ReplayMode::Closed;
    s.replay.queue_depth = 8;
    s.replay.max_requests = 20_000;
    simulate(&s, &mut |_| {}).unwrap()
}

#[test]
fn mirrored_dirty_data_writes_each_dirty_block_twice_and_is_the_default_with_two_devices() {
    let mirrored = writes_over_two(None);
    let single = writes_over_two(Some(false));
    let m = mirrored.engine.mirror.expect("on by default with two devices");
    assert!(single.engine.mirror.is_none());
    assert!(m.mirrored_blocks > 0, "{m:?}");
    assert_eq!(mirrored.total.requests, single.total.requests);
    // Every write-back write lands on two devices (or goes through when no mirror slot
    // is free): more SSD bytes written than with one copy.
    assert!(
        mirrored.total.ssd_write_bytes > single.total.ssd_write_bytes,
        "{} vs {}",
        mirrored.total.ssd_write_bytes,
        single.total.ssd_write_bytes
    );
    assert!(mirrored.table().contains("dirty data mirrored on two devices"), "{}", mirrored.table());
    // One device: refused by name.
    let mut s = Scenario::default();
    s.trace.files = vec![shared("tpcc-small.mqsim.txt")];
    s.devices.mirror_dirty = Some(true);
    let e = simulate(&s, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("devices.mirror_dirty") && e.contains("two or more"), "{e}");
}

/// A Zipf(0.9) trace of 200,000 4 KiB reads over 50,000 blocks (200 MiB) in `dir`.
fn zipf_trace(dir: &std::path::Path) -> PathBuf {
    let path = dir.join("zipf.oracleGeneral");
    let mut src = cachevisor_trace::zipf::ZipfSource::new(200_000, 50_000, 0.9, 4096, 7).unwrap();
    cachevisor_trace::write_file::write_source(&mut src, cachevisor_trace::Format::OracleGeneral, &path, 4096).unwrap();
    path
}

/// The Zipf trace closed-loop at QD 8 through a 256 MiB cache on one 860-evo (it holds
/// the whole working set) over a flash backing store (misses cost what hits do), with a
/// RAM tier of `ram` filled by `fill`.
fn with_ram(trace: &std::path::Path, ram: Option<&str>, fill: cachevisor_engine::RamFill) -> SimResult {
    let mut s = Scenario::default();
    s.trace.files = vec![trace.to_path_buf()];
    s.devices.backing = cachevisor_sim::scenario::DeviceChoice::Preset("850-pro".into());
    s.cache.size = "256MiB".into();
    s.devices.ram = ram.map(String::from);
    s.devices.ram_fill = fill;
    s.replay.mode = ReplayMode::Closed;
    s.replay.queue_depth = 8;
    s.replay.model = cachevisor_sim::model_choice::ModelChoice::Full;
    simulate(&s, &mut |_| {}).unwrap()
}

#[test]
fn a_ram_tier_serves_hot_reads_from_memory_and_spares_the_ssd() {
    use cachevisor_engine::RamFill;
    let dir = tempfile::tempdir().unwrap();
    let zipf = zipf_trace(dir.path());
    let none = with_ram(&zipf, None, RamFill::EveryHit);
    let ram = with_ram(&zipf, Some("32MiB"), RamFill::EveryHit);
    assert!(none.engine.ram.is_none() && none.total.ram_read_hit_ratio.is_none());
    let stats = ram.engine.ram.expect("a RAM tier");
    assert_eq!(stats.slots, 8192);
    assert_eq!(ram.total.read_hit_ratio, none.total.read_hit_ratio, "the tier changes no SSD hit or miss");
    let share = ram.total.ram_read_hit_ratio.unwrap();
    assert!(share > 0.3, "hot reads from memory: {share:.3} ({stats:?})");
    // Reads served from memory are reads the SSD does not do: a lower mean latency, and
    // fewer SSD bytes read.
    let (m0, m1) = (none.total.latency.mean_us, ram.total.latency.mean_us);
    assert!(m1 < 0.85 * m0, "mean {m1:.1} µs with the tier, {m0:.1} without");
    assert!((ram.total.ssd_read_bytes as f64) < 0.8 * none.total.ssd_read_bytes as f64);
    let dev = ram.devices.iter().find(|d| d.device == "ram dram").expect("the RAM model's report");
    assert!(dev.bytes_read > 0 && dev.bytes_written > 0, "{dev:?}");
    // The same inputs, the same outputs; and a second-hit fill writes fewer copies.
    assert_eq!(ram.to_json(), with_ram(&zipf, Some("32MiB"), RamFill::EveryHit).to_json());
    let second = with_ram(&zipf, Some("32MiB"), RamFill::SecondHit).engine.ram.unwrap();
    assert!(second.fills < stats.fills, "{second:?} vs {stats:?}");
    // A size that holds no block is named.
    let mut s = Scenario::default();
    s.trace.files = vec![zipf];
    s.devices.ram = Some("1KiB".into());
    let e = simulate(&s, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("devices.ram: 1KiB holds no block"), "{e}");
    // More than the cache (an inclusive tier holds no more), up to u64's end: named.
    for big in ["257MiB", "16TiB", "16383PiB"] {
        s.cache.size = "256MiB".into();
        s.devices.ram = Some(big.into());
        let e = simulate(&s, &mut |_| {}).unwrap_err().to_string();
        assert!(
            e.contains("devices.ram") && (e.contains("is more than the cache") || e.contains("size")),
            "{big}: {e}"
        );
    }
}
