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
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ServeConfig::new("16MiB")
        .cache("partition", "shared")
        .api()
        .vdisk("db", "db.img", &[("size", "32MiB".into())])
        .vdisk("backup", "backup.img", &[("size", "256MiB".into()), ("admission", admission.into())])
        .write(d, "serve.toml");
    let daemon = Daemon::start(d, "serve.toml", &[]).unwrap();
    qemu_io_ok(&daemon.uri("db"), &["write -P 0x5a 0 32M"]);
    let o = std::process::Command::new("fio")
        .args(["--ioengine=nbd", "--output-format=terse", "--thread"])
        .args(["--name=db", &format!("--uri={}", daemon.uri("db")), "--rw=randread", "--bs=4k"])
        .args(["--random_distribution=zipf:1.2", "--size=32M", "--io_size=48M", "--iodepth=2"])
        .args(["--name=backup", &format!("--uri={}", daemon.uri("backup")), "--rw=randread", "--bs=64k"])
        .args(["--size=256M", "--iodepth=2"])
        .output()
        .expect("fio (apt-get install fio)");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    qemu_io_ok(&daemon.uri("db"), &["read -P 0x5a 0 32M"]);
    let m =
        ureq::get(&format!("http://{}/metrics", daemon.api.as_ref().unwrap())).call().unwrap().into_string().unwrap();
    let hits = metric(&m, "cachevisor_block_hits_total", "vdisk=\"db\",op=\"read\"");
    let misses = metric(&m, "cachevisor_block_misses_total", "vdisk=\"db\",op=\"read\"");
    // The status table names what the backup's admission did.
    let st = std::process::Command::new(common::bin())
        .args(["status", "--api", daemon.api.as_deref().unwrap()])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&st.stdout).to_string();
    if admission != "all" {
        assert!(table.contains(&format!("admission backup: read {admission}")), "{table}");
    }
    (hits / (hits + misses), m)
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
