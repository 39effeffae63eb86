//! Reload: `cachevisor reload` and SIGHUP re-read the configuration file while
//! a real NBD client (qemu-io) is connected and writing; what can change live changes
//! (vDisks added and removed, write policies, the flusher, the allocator, snapshots), what
//! cannot is refused naming the key with nothing changed, and a restart agrees with the
//! file — a setting the file changed wins over what the API set before.

use cachevisor_testkit as common;

use common::{bin, client_ok, qemu_io_ok, Daemon, ServeConfig};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Writes `r.toml`: a 32 MiB cache with the `[cache]` lines `cache`, the API, no
/// snapshots, and a 16 MiB vDisk per (name, more `[[vdisk]]` lines) of `vdisks`.
fn write_config(d: &Path, cache: &str, vdisks: &[(&str, &str)]) {
    let mut c = ServeConfig::new("32MiB").api().section("prewarm", "snapshot_every", "0").section_toml("cache", cache);
    for (name, extra) in vdisks {
        c = c.vdisk_toml(name, &format!("{name}.img"), &format!("size = \"16MiB\"\n{extra}"));
    }
    c.write(d, "r.toml");
}

/// `cachevisor reload` against `a`: (exit code, stdout, stderr).
fn reload(d: &Path, a: &Daemon) -> (i32, String, String) {
    let o = Command::new(bin())
        .args(["reload", "--api", a.api.as_deref().unwrap(), "--token-file"])
        .arg(d.join("cache.img.meta/api-token"))
        .output()
        .unwrap();
    let s = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    (o.status.code().unwrap_or(-1), s(&o.stdout), s(&o.stderr))
}

/// Each vDisk's (name, write policy) from `cachevisor status --json`.
fn policies(a: &Daemon) -> Vec<(String, String)> {
    let o = Command::new(bin()).args(["status", "--json", "--api", a.api.as_deref().unwrap()]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|v| (v["name"].as_str().unwrap().to_string(), v["write_policy"].as_str().unwrap().to_string()))
        .collect()
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

/// A qemu-io client on `uri` that writes, waits `ms` (the reload happens meanwhile),
/// then checks what it wrote and writes and checks again: started, not waited for.
fn client(uri: &str, ms: u64) -> std::process::Child {
    let cmds = [
        "write -P 0x31 0 2M".to_string(),
        format!("sleep {ms}"),
        "read -P 0x31 0 2M".into(),
        "write -P 0x32 1M 2M".into(),
        "read -P 0x31 0 1M".into(),
        "read -P 0x32 1M 2M".into(),
    ];
    common::client(uri, &cmds)
}

fn eventually(what: &str, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < Duration::from_secs(30), "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn reload_applies_live_changes_with_a_client_connected_and_refuses_fixed_keys_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_config(d, "", &[("vm1", ""), ("vm2", "write_policy = \"wb\"\n")]);
    let a = Daemon::start(d, "r.toml", &[]).unwrap();
    assert_eq!(policies(&a), pairs(&[("vm1", "wt"), ("vm2", "wb")]));
    let (code, out, err) = reload(d, &a);
    assert_eq!((code, out.trim()), (0, "r.toml: nothing changed"), "{err}");

    // Live changes while a client writes to vm1 and waits.
    let c = client(&a.uri("vm1"), 2500);
    std::thread::sleep(Duration::from_millis(500));
    write_config(
        d,
        "write_policy = \"wb\"\nflush_rate = \"0\"\nallocator = \"symflex-weighted\"\n",
        &[("vm1", ""), ("vm3", "write_policy = \"ro\"\n")],
    );
    let (code, out, err) = reload(d, &a);
    assert_eq!(code, 0, "{out}{err}");
    for want in [
        "vDisk `vm3` added",
        "vdisk (vm1).write_policy: Wt → Wb",
        "cache.allocator: symflex-weighted",
        "flush_rate 0",
        "vDisk `vm2` removed",
    ] {
        assert!(out.contains(want), "`{want}` in: {out}");
    }
    assert_eq!(policies(&a), pairs(&[("vm1", "wb"), ("vm3", "ro")]));
    client_ok(c);
    qemu_io_ok(&a.uri("vm3"), &["write -P 0x44 0 1M", "read -P 0x44 0 1M"]);
    // vm1's client data is in the cache, dirty (write-back now), and reads back.
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x31 0 1M", "read -P 0x32 1M 2M"]);

    // Fixed keys: refused, each named, nothing changed; the bad value alone too.
    let before = std::fs::read_to_string(d.join("r.toml")).unwrap();
    let fixed = before
        .replace("size = \"32MiB\"", "size = \"32MiB\"\nblock_size = \"8KiB\"")
        .replace("name = \"vm3\"\nbacking = \"vm3.img\"", "name = \"vm3\"\nbacking = \"elsewhere.img\"");
    std::fs::write(d.join("r.toml"), fixed.replace("write_policy = \"ro\"", "write_policy = \"wt\"")).unwrap();
    let (code, _, err) = reload(d, &a);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("cache.block_size") && err.contains("vdisk (vm3).backing"), "{err}");
    assert!(err.contains("Nothing was changed"), "{err}");
    assert_eq!(
        policies(&a),
        pairs(&[("vm1", "wb"), ("vm3", "ro")]),
        "vm3's policy stays: the reload was refused whole"
    );
    std::fs::write(d.join("r.toml"), before.replace("flush_rate = \"0\"", "flush_rate = \"fast\"")).unwrap();
    let (code, _, err) = reload(d, &a);
    assert!(code == 1 && err.contains("r.toml") && err.contains("cache.flush_rate"), "{code} {err}");
    std::fs::write(d.join("r.toml"), "[cache\n").unwrap();
    let (code, _, err) = reload(d, &a);
    assert!(code == 1 && err.contains("r.toml"), "{code} {err}");
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x31 0 1M"]);

    // The API sets vm3 to write-through; the file then changes vm3 to write-back by SIGHUP:
    // the file wins, now and after a restart.
    let token = std::fs::read_to_string(d.join("cache.img.meta/api-token")).unwrap();
    let api = a.api.clone().unwrap();
    ureq::post(&format!("http://{api}/vdisks/vm3/write-policy"))
        .set("Authorization", &format!("Bearer {token}"))
        .send_json(serde_json::json!({ "policy": "wt" }))
        .unwrap();
    assert_eq!(policies(&a), pairs(&[("vm1", "wb"), ("vm3", "wt")]));
    std::fs::write(d.join("r.toml"), before.replace("write_policy = \"ro\"", "write_policy = \"wb\"")).unwrap();
    let _ = Command::new("kill").args(["-HUP", &a.pid.to_string()]).status();
    eventually("SIGHUP applies vm3's write policy", || policies(&a) == pairs(&[("vm1", "wb"), ("vm3", "wb")]));
    // The log line follows the reload's return, which the API may show changed before it.
    eventually("the SIGHUP reload is logged", || a.log().contains("SIGHUP"));
    // log.level: applied, but RUST_LOG (set by the test harness) wins, and says so.
    let now = std::fs::read_to_string(d.join("r.toml")).unwrap();
    std::fs::write(d.join("r.toml"), format!("{now}[log]\nlevel = \"debug\"\n")).unwrap();
    let (code, out, err) = reload(d, &a);
    assert!(
        code == 0 && out.contains("log.level: debug (RUST_LOG is set and wins)"),
        "{code}: {out}{err}\n{}",
        a.log()
    );
    std::fs::write(d.join("r.toml"), format!("{now}[log]\nlevel = \"cachevisor=loud\"\n")).unwrap();
    let (code, _, err) = reload(d, &a);
    assert!(code == 1 && err.contains("log.level"), "{err}");
    std::fs::write(d.join("r.toml"), &now).unwrap();
    let mut a = a;
    assert!(a.term(Duration::from_secs(30)).is_some_and(|s| s.success()));
    let a = Daemon::start(d, "r.toml", &[]).unwrap();
    assert_eq!(policies(&a), pairs(&[("vm1", "wb"), ("vm3", "wb")]), "after a restart, the file's settings");
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x31 0 1M", "read -P 0x32 1M 2M"]);
    qemu_io_ok(&a.uri("vm3"), &["read -P 0x44 0 1M"]);
}

#[test]
fn a_vdisk_the_api_removed_stays_removed_until_the_file_changes_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_config(d, "", &[("vm1", ""), ("vm2", "")]);
    let mut a = Daemon::start(d, "r.toml", &[]).unwrap();
    let token = std::fs::read_to_string(d.join("cache.img.meta/api-token")).unwrap();
    let api = a.api.clone().unwrap();
    ureq::delete(&format!("http://{api}/vdisks/vm2")).set("Authorization", &format!("Bearer {token}")).call().unwrap();
    // The file did not change vm2: a reload keeps the API's removal, and so does a restart.
    let (code, out, _) = reload(d, &a);
    assert!(code == 0 && out.contains("nothing changed"), "{out}");
    assert_eq!(policies(&a), pairs(&[("vm1", "wt")]));
    // The file drops vm2, then lists it again: it is served again.
    write_config(d, "", &[("vm1", "")]);
    assert_eq!(reload(d, &a).0, 0);
    write_config(d, "", &[("vm1", ""), ("vm2", "")]);
    let (code, out, err) = reload(d, &a);
    assert!(code == 0 && out.contains("vDisk `vm2` added"), "{out}{err}");
    assert_eq!(policies(&a), pairs(&[("vm1", "wt"), ("vm2", "wt")]));
    assert!(a.term(Duration::from_secs(30)).is_some_and(|s| s.success()));
    let a = Daemon::start(d, "r.toml", &[]).unwrap();
    assert_eq!(policies(&a), pairs(&[("vm1", "wt"), ("vm2", "wt")]), "the API's old removal is forgotten");
    qemu_io_ok(&a.uri("vm2"), &["write -P 0x5 0 1M", "read -P 0x5 0 1M"]);
    // A new default write policy reaches the vDisks without their own, a vDisk added in
    // the same reload included.
    write_config(d, "write_policy = \"wb\"\n", &[("vm1", ""), ("vm2", ""), ("vm3", "")]);
    let (code, out, err) = reload(d, &a);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(policies(&a), pairs(&[("vm1", "wb"), ("vm2", "wb"), ("vm3", "wb")]));
}

/// Each vDisk's `admission` object from `cachevisor status --json` (null when it admits
/// every miss).
fn admissions(a: &Daemon) -> Vec<serde_json::Value> {
    let o = Command::new(bin()).args(["status", "--json", "--api", a.api.as_deref().unwrap()]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v.as_array().unwrap().iter().map(|v| v["admission"].clone()).collect()
}

/// `admission = "second-hit"` on a write-back vDisk, with qemu-io: its first writes are
/// rejected (written around the cache: nothing dirty, every byte read back), the reads
/// after them are those blocks' second misses (admitted), `status` counts both; a reload
/// switches it to `all` while the data stays intact.
#[test]
fn second_hit_admission_writes_first_misses_around_the_cache_and_a_reload_switches_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_config(d, "write_policy = \"wb\"\nflush_rate = \"0\"\n", &[("vm1", "admission = \"second-hit\"\n")]);
    let a = Daemon::start(d, "r.toml", &[]).unwrap();
    let uri = a.uri("vm1");
    qemu_io_ok(&uri, &["write -P 0x41 0 1M"]);
    let adm = &admissions(&a)[0];
    assert_eq!((adm["read"].as_str(), adm["write"].as_str()), (Some("second-hit"), Some("second-hit")), "{adm}");
    assert_eq!(adm["write_rejected"], 256, "{adm}");
    assert_eq!(adm["write_admitted"], 0, "{adm}");
    qemu_io_ok(&uri, &["read -P 0x41 0 1M"]);
    let adm = &admissions(&a)[0];
    assert_eq!((adm["read_admitted"].as_u64(), adm["read_rejected"].as_u64()), (Some(256), Some(0)), "{adm}");
    let metrics =
        ureq::get(&format!("http://{}/metrics", a.api.as_ref().unwrap())).call().unwrap().into_string().unwrap();
    for want in [
        "cachevisor_admission_misses_total{vdisk=\"vm1\",op=\"write\",outcome=\"rejected\"} 256",
        "cachevisor_admission_misses_total{vdisk=\"vm1\",op=\"read\",outcome=\"admitted\"} 256",
    ] {
        assert!(metrics.contains(want), "{want} in:\n{metrics}");
    }
    let o = Command::new(bin()).args(["status", "--api", a.api.as_deref().unwrap()]).output().unwrap();
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains(
            "admission vm1: read second-hit (256 admitted, 0 around the cache); write second-hit (0 admitted, 256 around the cache)"
        ),
        "{table}"
    );
    // Now cached: a rewrite is a hit (no admission asked), and reads back.
    qemu_io_ok(&uri, &["write -P 0x42 0 512k", "read -P 0x42 0 512k", "read -P 0x41 512k 512k"]);
    assert_eq!(admissions(&a)[0]["write_rejected"], 256);

    write_config(d, "write_policy = \"wb\"\nflush_rate = \"0\"\n", &[("vm1", "")]);
    let (code, out, err) = reload(d, &a);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("vdisk (vm1): admission all, write_admission all"), "{out}");
    assert!(admissions(&a)[0].is_null());
    qemu_io_ok(&uri, &["write -P 0x43 2M 1M", "read -P 0x43 2M 1M", "read -P 0x42 0 512k", "read -P 0x41 512k 512k"]);

    // A write budget of 64 KiB/s: in the controller's first period (100 ms) write misses
    // enter only up to a period's worth of the target (64 KiB: 16 blocks, a few more if
    // the engine asked before their writes were counted), so nearly all of the first megabyte
    // goes around the cache, and the next megabyte after the first second too; every
    // byte reads back. The reads of those megabytes are read misses, which `all` admits:
    // the budget counts their fills too (every SSD byte of the vDisk).
    write_config(
        d,
        "write_policy = \"wb\"\nflush_rate = \"0\"\n",
        &[("vm1", "write_admission = \"write-budget:64KiB/s\"\n")],
    );
    let (code, out, err) = reload(d, &a);
    assert_eq!(code, 0, "{out}{err}");
    qemu_io_ok(
        &uri,
        &["write -P 0x44 4M 1M", "sleep 300", "write -P 0x45 5M 1M", "read -P 0x44 4M 1M", "read -P 0x45 5M 1M"],
    );
    let adm = &admissions(&a)[0];
    assert_eq!((adm["read"].as_str(), adm["write"].as_str()), (Some("all"), Some("write-budget:64KiB/s")), "{adm}");
    let n = |k: &str| adm[k].as_u64().unwrap();
    assert_eq!(n("write_admitted") + n("write_rejected"), 512, "{adm}");
    assert!(n("write_admitted") <= 32, "the first period spends only its share: {adm}");
    // Every block not admitted by the writes is a read miss, admitted, filled.
    assert_eq!((n("read_admitted"), n("read_rejected")), (512 - n("write_admitted"), 0), "{adm}");
    assert_eq!(adm["budget"]["written_bytes"], 2 << 20, "{adm}");
    assert!(adm["budget"]["probability"].as_f64().unwrap() < 0.05, "{adm}");
    let metrics =
        ureq::get(&format!("http://{}/metrics", a.api.as_ref().unwrap())).call().unwrap().into_string().unwrap();
    for want in [
        "cachevisor_write_budget_target_bytes_per_second{vdisk=\"vm1\"} 65536",
        "cachevisor_write_budget_probability{vdisk=\"vm1\"} 0",
    ] {
        assert!(metrics.contains(want), "{want} in:\n{metrics}");
    }
    qemu_io_ok(&uri, &["read -P 0x43 2M 1M", "read -P 0x44 4M 1M", "read -P 0x45 5M 1M"]);

    // A reload turns prefetch on: a read that continues the last loads the block after.
    write_config(d, "write_policy = \"wb\"\nflush_rate = \"0\"\n", &[("vm1", "prefetch = \"obl\"\n")]);
    let (code, out, err) = reload(d, &a);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("vdisk (vm1): prefetch obl"), "{out}");
    qemu_io_ok(&uri, &["read -P 0 8M 4k", "read -P 0 8196k 4k", "read -P 0 8200k 4k"]);
    let o = Command::new(bin()).args(["status", "--api", a.api.as_deref().unwrap()]).output().unwrap();
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("prefetch vm1: obl (degree 1, trigger 0): 2 blocks loaded, 1 read, 0 evicted unread"),
        "{table}"
    );

    // A reload gives it an I/O class; the reads after count in it.
    write_config(
        d,
        "write_policy = \"wb\"\nflush_rate = \"0\"\n",
        &[("vm1", "[[class]]\nname = \"low\"\nrange = \"0-1MiB\"\npinned = true\n")],
    );
    let (code, out, err) = reload(d, &a);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("vdisk (vm1): I/O classes [low]") && out.contains("prefetch none"), "{out}");
    qemu_io_ok(&uri, &["read -P 0x42 0 512k", "read -P 0x41 512k 512k"]);
    let o = Command::new(bin()).args(["status", "--api", a.api.as_deref().unwrap()]).output().unwrap();
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("class vm1/low: 0 blocks cached, 100.0% of 256 block accesses hit"), "{table}");
}
