//! `cachevisor serve` under a service manager, as `dist/cachevisor.service` runs it
//! (`Type=notify`): `READY=1` only once the export serves a real client (qemu-io), the
//! watchdog fed, `STOPPING=1` at SIGTERM and a clean exit; socket activation as
//! `systemd-socket-activate` does it (the sockets exist before the daemon; the first
//! client starts it and is served); and the unit files checked by `systemd-analyze verify`.

use cachevisor_testkit as common;
use common::{s, ServeConfig};

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
    ServeConfig::new("1MiB")
        .vdisk("vm", "vm.img", &[("size", s("4MiB")), ("write_policy", s("wb"))])
        .write(dir.path(), "serve.toml");
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
    // verify checks that ExecStart's binary exists: point it at the one under test. The
    // socket units and the socket-activation drop-in are checked with it.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("cachevisor.service");
    std::fs::write(&copy, text.replace("/usr/bin/cachevisor", common::bin())).unwrap();
    let dist = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist");
    for u in ["cachevisor.socket", "cachevisor-api.socket"] {
        std::fs::copy(dist.join(u), dir.path().join(u)).unwrap();
    }
    std::fs::create_dir(dir.path().join("cachevisor.service.d")).unwrap();
    std::fs::copy(dist.join("socket-activation.conf"), dir.path().join("cachevisor.service.d/socket-activation.conf"))
        .unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&copy)
        .arg(dir.path().join("cachevisor.socket"))
        .arg(dir.path().join("cachevisor-api.socket"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // Only the environment's own complaints are tolerated (no systemd running here, no
    // `cachevisor` user on a build machine): nothing about the unit's keys.
    let unit_lines: Vec<&str> =
        err.lines().filter(|l| l.contains("cachevisor") && !l.contains("user") && !l.contains("User")).collect();
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

/// `systemd-socket-activate` listening on `listens` with `names`, to start `cachevisor
/// serve --config CONFIG` in `dir` at the first connection.
fn activate(dir: &std::path::Path, listens: &[String], names: &str) -> std::process::Child {
    let mut c = Command::new("systemd-socket-activate");
    for l in listens {
        c.arg("-l").arg(l);
    }
    c.arg(format!("--fdname={names}"))
        .args(["-E", "RUST_LOG=info"])
        .arg(common::bin())
        .args(["serve", "--config", "sa.toml"])
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("sa.log")).unwrap())
        .spawn()
        .expect("systemd-socket-activate is installed (systemd)")
}

#[test]
fn socket_activation_serves_the_client_that_started_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The config's own listeners are not used: systemd's sockets replace them.
    ServeConfig::new("4MiB")
        .api()
        .vdisk("vm", "vm.img", &[("size", s("8MiB")), ("write_policy", s("wb"))])
        .write(d, "sa.toml");
    let (nbd, api) = (common::free_port(), common::free_port());
    let sock = d.join("nbd.sock");
    let listens = [format!("127.0.0.1:{nbd}"), sock.display().to_string(), format!("127.0.0.1:{api}")];
    let mut child = activate(d, &listens, "nbd:nbd:api");
    // Wait for the sockets, then connect: no daemon runs yet — this client starts it
    // and waits in the backlog while it recovers.
    let t = Instant::now();
    while !sock.exists() {
        assert!(t.elapsed() < Duration::from_secs(20), "systemd-socket-activate never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    common::qemu_io_ok(&format!("nbd://127.0.0.1:{nbd}/vm"), &["write -P 0x61 0 1M", "flush", "read -P 0x61 0 1M"]);
    let unix_uri = format!("nbd+unix:///vm?socket={}", sock.display());
    common::qemu_io_ok(&unix_uri, &["read -P 0x61 0 1M"]);
    let body = ureq::get(&format!("http://127.0.0.1:{api}/vdisks")).call().unwrap().into_string().unwrap();
    assert!(body.contains("\"vm\""), "{body}");
    let banner = banner(&mut child);
    assert!(banner.iter().any(|l| l == &format!("nbd://127.0.0.1:{nbd}/vm")), "{banner:?}");
    let log = std::fs::read_to_string(d.join("sa.log")).unwrap();
    assert!(log.contains("socket activation"), "{log}");
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let st = child.wait().unwrap();
    assert!(st.success(), "{st}: {}", std::fs::read_to_string(d.join("sa.log")).unwrap());

    // A socket of a name it does not know: the start is refused naming it.
    let port = common::free_port();
    let mut child =
        activate(d, &[format!("127.0.0.1:{port}"), format!("127.0.0.1:{}", common::free_port())], "nbd:bogus");
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t.elapsed() < Duration::from_secs(20), "never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = child.wait().unwrap();
    let log = std::fs::read_to_string(d.join("sa.log")).unwrap();
    assert!(!st.success() && log.contains("descriptor 4 (`bogus`)"), "{st}: {log}");
}

/// Under systemd, stderr is the journal stream (`JOURNAL_STREAM` names its device and
/// inode) and the log goes to journald's socket with each event's fields as journal
/// fields. Here a private mount namespace holds a stand-in journald: a datagram socket at
/// `/run/systemd/journal/socket` whose messages a small Python reader writes to a file.
#[test]
fn under_systemd_the_log_goes_to_journald_with_structured_fields() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ServeConfig::new("4MiB").api().vdisk("vm1", "vm1.img", &[("size", s("8MiB"))]).write(d, "j.toml");
    let script = r#"
mount -t tmpfs tmpfs /run || exit 1
mkdir -p /run/systemd/journal
python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind("/run/systemd/journal/socket")
open(sys.argv[1] + ".ready", "w").close()
with open(sys.argv[1], "ab") as f:
    while True:
        f.write(s.recv(1 << 20) + b"\n\x1e\n")
        f.flush()
' "$1/journal.txt" &
echo $! > "$1/reader.pid"
while [ ! -e "$1/journal.txt.ready" ]; do sleep 0.05; done
exec 2>"$1/stderr.txt"
JOURNAL_STREAM="$(stat -L -c %d:%i /proc/self/fd/2)" RUST_LOG=info exec "$2" serve --config "$1/j.toml"
"#;
    let mut child = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "sh", "-c", script, "sh"])
        .arg(d)
        .arg(common::bin())
        .current_dir(d)
        .stdout(Stdio::piped())
        .spawn()
        .expect("unshare (util-linux) runs");
    let lines = banner(&mut child);
    let stderr = std::fs::read_to_string(d.join("stderr.txt")).unwrap_or_default();
    let Some(uri) = lines.iter().find(|l| l.starts_with("nbd://")) else {
        panic!("the daemon did not start (needs user namespaces or root): {lines:?} {stderr}")
    };
    common::qemu_io_ok(uri, &["write -P 0x7 0 1M", "read -P 0x7 0 1M"]);
    // An event with a vDisk field: adding one through the API.
    let api = std::fs::read_to_string(d.join("cache.img.meta/api-token")).unwrap();
    let port = free_port_of_banner(&lines);
    ureq::post(&format!("http://{port}/vdisks"))
        .set("Authorization", &format!("Bearer {api}"))
        .send_json(serde_json::json!({ "name": "vm2", "backing": d.join("vm2.img"), "size": "8MiB" }))
        .unwrap();
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    assert!(child.wait().unwrap().success());
    let reader = std::fs::read_to_string(d.join("reader.pid")).unwrap();
    let _ = Command::new("kill").arg(reader.trim()).status();
    let raw = std::fs::read(d.join("journal.txt")).unwrap();
    let messages = journal_messages(&raw);
    let find = |m: &str| messages.iter().find(|f| f.iter().any(|(k, v)| k == "MESSAGE" && v.starts_with(m)));
    let added = find("vDisk added").unwrap_or_else(|| panic!("{messages:?}"));
    for (k, v) in [("VDISK", "vm2"), ("PRIORITY", "6"), ("SYSLOG_IDENTIFIER", "cachevisor")] {
        assert!(added.iter().any(|(a, b)| a == k && b == v), "{k}={v} in {added:?}");
    }
    assert!(find("stopping: fsync and checkpoint").is_some(), "{messages:?}");
    let stderr = std::fs::read_to_string(d.join("stderr.txt")).unwrap();
    assert!(!stderr.contains("vDisk added"), "the log went to stderr too: {stderr}");
}

/// The messages of journald's native protocol in `raw` (datagrams separated by the
/// reader's "\n\x1e\n"): each field `KEY=value\n`, or `KEY\n`, a little-endian u64
/// length, the value and `\n` (values that may hold newlines).
fn journal_messages(raw: &[u8]) -> Vec<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut rest = raw;
    while !rest.is_empty() {
        let mut fields = Vec::new();
        while !rest.is_empty() && !rest.starts_with(b"\n\x1e\n") {
            let nl = rest.iter().position(|&b| b == b'\n').unwrap();
            let line = &rest[..nl];
            match line.iter().position(|&b| b == b'=') {
                Some(eq) => {
                    fields.push((
                        String::from_utf8_lossy(&line[..eq]).into(),
                        String::from_utf8_lossy(&line[eq + 1..]).into(),
                    ));
                    rest = &rest[nl + 1..];
                }
                None => {
                    let len = u64::from_le_bytes(rest[nl + 1..nl + 9].try_into().unwrap()) as usize;
                    let value = &rest[nl + 9..nl + 9 + len];
                    fields.push((String::from_utf8_lossy(line).into(), String::from_utf8_lossy(value).into()));
                    rest = &rest[nl + 9 + len + 1..];
                }
            }
        }
        rest = rest.get(3..).unwrap_or_default();
        out.push(fields);
    }
    out
}

/// The API's address from `serve`'s banner lines.
fn free_port_of_banner(lines: &[String]) -> String {
    lines
        .iter()
        .find_map(|l| l.strip_prefix("# API: http://").map(|r| r.split('/').next().unwrap().to_string()))
        .unwrap()
}

/// `serve`'s stdout up to and with its API line; the rest drained on a thread (the
/// daemon never writes into a closed pipe).
fn banner(child: &mut std::process::Child) -> Vec<String> {
    let mut it = BufReader::new(child.stdout.take().unwrap()).lines().map_while(Result::ok);
    let mut lines = Vec::new();
    for l in it.by_ref() {
        let last = l.starts_with("# API");
        lines.push(l);
        if last {
            break;
        }
    }
    std::thread::spawn(move || it.for_each(drop));
    lines
}
