//! What enters the cache, with real clients (issue 57): fio reads a database vDisk
//! (4 KiB, Zipf 1.2) while another fio job scans a backup vDisk once (64 KiB reads, each
//! block once, random order), both in one shared pool. With the backup's misses admitted
//! the scan pushes the database's blocks out; with `admission = "second-hit"` on the backup
//! (or `auto`) none of the scan enters and the database keeps its hits; `status` and
//! `/metrics` say what was sent around and why; every byte the database holds reads back.

use cachevisor_testkit as common;
use common::{metric, qemu_io_ok, Daemon, ServeConfig};

/// Runs both fio jobs at once against a fresh daemon whose backup vDisk has `admission`;
/// the database's read hit ratio, and the metrics text.
fn run(admission: &str) -> (f64, String) {
    let r = run_with(admission, None, &[], &[]);
    (r.hit_ratio, r.metrics)
}

/// What [`run_with`] saw.
struct Seen {
    hit_ratio: f64,
    metrics: String,
    table: String,
    cache: serde_json::Value,
}

/// [`run`] with the cache's shared write budget `budget`, set by a reload after the
/// database is written (so the budget governs the jobs, not the fill), and `db_args` and
/// `backup_args` added to the two jobs.
fn run_with(admission: &str, budget: Option<&str>, db_args: &[&str], backup_args: &[&str]) -> Seen {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cfg = ServeConfig::new("16MiB")
        .cache("partition", "shared")
        .api()
        .vdisk("db", "db.img", &[("size", "32MiB".into())])
        .vdisk("backup", "backup.img", &[("size", "256MiB".into()), ("admission", admission.into())]);
    cfg.clone().write(d, "serve.toml");
    let daemon = Daemon::start(d, "serve.toml", &[]).unwrap();
    let api = daemon.api.clone().unwrap();
    qemu_io_ok(&daemon.uri("db"), &["write -P 0x5a 0 32M"]);
    if let Some(b) = budget {
        cfg.cache("write_budget", b).write(d, "serve.toml");
        let o = std::process::Command::new(common::bin())
            .args(["reload", "--api", &api, "--token-file"])
            .arg(d.join("cache.img.meta/api-token"))
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && out.contains("cache.write_budget"),
            "{out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let o = std::process::Command::new("fio")
        .args(["--ioengine=nbd", "--output-format=terse", "--thread"])
        .args(["--name=db", &format!("--uri={}", daemon.uri("db")), "--rw=randread", "--bs=4k"])
        .args(["--random_distribution=zipf:1.2", "--size=32M", "--io_size=48M", "--iodepth=2"])
        .args(db_args)
        .args(["--name=backup", &format!("--uri={}", daemon.uri("backup")), "--rw=randread", "--bs=64k"])
        .args(["--size=256M", "--iodepth=2"])
        .args(backup_args)
        .output()
        .expect("fio (apt-get install fio)");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    qemu_io_ok(&daemon.uri("db"), &["read -P 0x5a 0 32M"]);
    let m = ureq::get(&format!("http://{api}/metrics")).call().unwrap().into_string().unwrap();
    let hits = metric(&m, "cachevisor_block_hits_total", "vdisk=\"db\",op=\"read\"");
    let misses = metric(&m, "cachevisor_block_misses_total", "vdisk=\"db\",op=\"read\"");
    // The status table names what the backup's admission did.
    let st = std::process::Command::new(common::bin()).args(["status", "--api", &api]).output().unwrap();
    let table = String::from_utf8_lossy(&st.stdout).to_string();
    if admission != "all" {
        assert!(table.contains(&format!("admission backup: read {admission}")), "{table}");
    }
    let cache: serde_json::Value = ureq::get(&format!("http://{api}/cache")).call().unwrap().into_json().unwrap();
    Seen { hit_ratio: hits / (hits + misses), metrics: m, table, cache }
}

/// The cache's shared write budget with every miss let in by the vDisks' own admission,
/// the database read for 8 s beside the backup's one pass at 32 MiB/s (8 s too): the
/// scan's admitted blocks are never read again, the database's are, so the database gets
/// the budget it asks for (the scan its floor and what is left), keeps more of its hits
/// than with everything admitted, and the SSD's writes over the run hold the target.
#[test]
fn a_shared_write_budget_goes_to_the_vdisk_whose_admitted_blocks_are_reread() {
    let (db, backup) = (["--time_based", "--runtime=8"], ["--rate=32m"]);
    let all = run_with("all", None, &db, &backup).hit_ratio;
    let Seen { hit_ratio: hit, metrics: m, table, cache } = run_with("all", Some("2MiB/s"), &db, &backup);
    let b = &cache["write_budget"];
    let (written, elapsed) = (b["written_bytes"].as_f64().unwrap(), b["elapsed_s"].as_f64().unwrap());
    let rate = written / elapsed;
    let p = |vd: &str| metric(&m, "cachevisor_write_budget_share_probability", &format!("vdisk=\"{vd}\""));
    let v = |vd: &str| metric(&m, "cachevisor_write_budget_share_hits_per_admitted_block", &format!("vdisk=\"{vd}\""));
    let w = |vd: &str| metric(&m, "cachevisor_write_budget_share_written_bytes", &format!("vdisk=\"{vd}\""));
    eprintln!(
        "database hit ratio {all:.3} with every miss admitted, {hit:.3} under a 2 MiB/s shared budget; SSD writes \
         {:.2} MiB/s over {elapsed:.1} s (db {:.1} MiB, backup {:.1} MiB); probability db {:.3} backup {:.3}; hits per \
         admitted block db {:.3} backup {:.3}",
        rate / 1048576.0,
        w("db") / 1048576.0,
        w("backup") / 1048576.0,
        p("db"),
        p("backup"),
        v("db"),
        v("backup")
    );
    assert!((rate - 2.0 * 1048576.0).abs() < 0.10 * 2.0 * 1048576.0, "SSD writes {rate} B/s against 2 MiB/s");
    assert!(v("db") > 10.0 * v("backup").max(0.001), "the database's admitted blocks are reread, the scan's not");
    assert!(p("db") > 0.9, "the database gets what it asks for");
    assert!(hit > all + 0.05, "the database keeps its hits: {all:.3} -> {hit:.3}");
    let target = metric(&m, "cachevisor_cache_write_budget_target_bytes_per_second", "");
    assert_eq!(target, 2.0 * 1048576.0);
    assert!(table.contains("cache write budget 2.00MiB/s, shared:"), "{table}");
    assert!(table.contains("write budget share backup:") && table.contains("write budget share db:"), "{table}");
}

#[test]
fn second_hit_on_a_backup_scan_keeps_the_database_vdisks_hits() {
    let (all, _) = run("all");
    let (second, m) = run("second-hit");
    let rejected = metric(&m, "cachevisor_admission_misses_total", "vdisk=\"backup\",op=\"read\",outcome=\"rejected\"");
    let admitted = metric(&m, "cachevisor_admission_misses_total", "vdisk=\"backup\",op=\"read\",outcome=\"admitted\"");
    eprintln!("database read hit ratio: {all:.3} beside a scan admitted, {second:.3} beside second-hit ({rejected} rejected, {admitted} admitted)");
    assert!(rejected >= 60_000.0 && admitted < 1_000.0, "the scan's 65,536 blocks go around: {rejected} / {admitted}");
    assert!(second > all + 0.10, "the database keeps its hits: {all:.3} -> {second:.3}");
    let (auto, m) = run("auto");
    let chose = metric(&m, "cachevisor_admission_misses_total", "vdisk=\"backup\",op=\"read\",outcome=\"rejected\"");
    eprintln!("beside auto: {auto:.3} ({chose} rejected)");
    // It decides after its first 4,096 sampled-or-not block accesses (1/16 of a window):
    // what the scan brought in before that costs the database some hits, not all of them.
    assert!(chose >= 55_000.0, "auto sends the scan around once it has decided: {chose} of 65,536");
    assert!(auto > all + 0.02, "auto finds second-hit pays for the backup: {all:.3} -> {auto:.3}");
}
