//! `cachevisor serve` under a service manager, as `dist/cachevisor.service` runs it
//! (`Type=notify`): `READY=1` only once the export serves a real client (qemu-io), the
//! watchdog fed, `STOPPING=1` at SIGTERM and a clean exit; and the unit file checked by
//! `systemd-analyze verify`.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn recv_until(sock: &UnixDatagram, what: &str, within: Duration) -> Vec<String> {
    let end = Instant::now() + within;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < end {
        sock.set_read_timeout(Some(end - Instant::now())).unwrap();
        let Ok(n) = sock.recv(&mut buf) else { break };
        let m = String::from_utf8_lossy(&buf[..n]).into_owned();
        let done = m.contains(what);
        out.push(m);
        if done {
            break;
        }
    }
    out
}

#[test]
fn ready_once_the_export_serves_watchdog_fed_and_stopping_at_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("serve.toml"),
        "[cache]\npath = \"cache.img\"\nsize = \"1MiB\"\n[listen]\ntcp = \"127.0.0.1:0\"\n[[vdisk]]\nname = \"vm\"\nbacking = \"vm.img\"\nsize = \"4MiB\"\nwrite_policy = \"wb\"\n",
    )
    .unwrap();
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    let mut child = Command::new(common::bin())
        .current_dir(dir.path())
        .args(["serve", "--config", "serve.toml"])
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "200000")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let got = recv_until(&sock, "READY=1", Duration::from_secs(60));
    assert!(got.last().is_some_and(|m| m.contains("READY=1") && m.contains("STATUS=serving 1 exports")), "{got:?}");
    // Ready means serving: the banner is out and a client is served at once.
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        // Drained to the end: a closed pipe would fail the daemon's later prints.
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(r) = l.strip_prefix("nbd://") {
                let _ = tx.send(r.split('/').next().unwrap().to_string());
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(5)).expect("the NBD address, printed before READY=1");
    let uri = format!("nbd://{addr}/vm");
    common::qemu_io_ok(&uri, &["write -P 0x5a 0 64k", "read -P 0x5a 0 64k"]);
    let pings = recv_until(&sock, "never", Duration::from_millis(1000));
    let n = pings.iter().filter(|m| m.contains("WATCHDOG=1")).count();
    assert!(n >= 5, "{n} watchdog pings in 1 s at a 100 ms interval: {pings:?}");
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let got = recv_until(&sock, "STOPPING=1", Duration::from_secs(30));
    assert!(got.iter().any(|m| m.contains("STOPPING=1")), "{got:?}");
    assert!(child.wait().unwrap().success());
}

#[test]
fn the_unit_file_passes_systemd_analyze_verify() {
    let unit = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/cachevisor.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    for key in ["Type=notify", "WatchdogSec=", "ExecReload=", "StateDirectory=cachevisor", "NoNewPrivileges=yes"] {
        assert!(text.contains(key), "dist/cachevisor.service lacks {key}");
    }
    // verify checks that ExecStart's binary exists: point it at the one under test.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("cachevisor.service");
    std::fs::write(&copy, text.replace("/usr/bin/cachevisor", common::bin())).unwrap();
    let out = Command::new("systemd-analyze").args(["verify", "--man=no"]).arg(&copy).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // Only the environment's own complaints are tolerated (no systemd running here, no
    // `cachevisor` user on a build machine): nothing about the unit's keys.
    let unit_lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("cachevisor.service") && !l.contains("user") && !l.contains("User"))
        .collect();
    assert!(out.status.success() || unit_lines.is_empty(), "systemd-analyze verify:\n{err}");
    assert!(unit_lines.is_empty(), "systemd-analyze verify:\n{err}");
}

#[test]
fn the_packaged_configuration_passes_check_config_and_a_bad_one_is_named() {
    let conf = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/cachevisor.toml");
    let out = Command::new(common::bin()).args(["serve", "--check-config", "--config"]).arg(&conf).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("configuration OK (1 vDisks)"));
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    let good = std::fs::read_to_string(&conf).unwrap().replace("/var/lib/cachevisor/", "");
    std::fs::write(dir.path().join("good.toml"), &good).unwrap();
    let out = Command::new(common::bin())
        .args(["serve", "--check-config", "--config", "good.toml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(&bad, good.replace("size = \"1GiB\"\nblock_size", "size = \"lots\"\nblock_size")).unwrap();
    let out = Command::new(common::bin()).args(["serve", "--check-config", "--config"]).arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cache.size"), "{}", String::from_utf8_lossy(&out.stderr));
    let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(files.len(), 2, "check-config created files: {files:?}");
}
