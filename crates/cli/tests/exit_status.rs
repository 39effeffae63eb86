//! the exit statuses scripts rely on (`crates/cli/src/exit_status.rs`, the
//! docs/daemon.md's table) from `status`, `destage`, `prewarm` and `reload` — against a real
//! daemon, against no daemon, with a wrong token, and (`status` exit 5) against an API
//! that reports a vDisk in pass-through.

use cachevisor_testkit as common;

use common::{bin, s, Daemon, ServeConfig};
use std::io::{BufRead, BufReader, Write};
use std::process::Command;

fn run(args: &[&str]) -> (i32, String) {
    let o = Command::new(bin()).args(args).env_remove("CACHEVISOR_API_TOKEN").output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr),
    )
}

#[test]
fn each_command_exits_with_the_documented_status() {
    let nobody = format!("127.0.0.1:{}", common::free_port());
    for args in [
        vec!["status", "--api", &nobody],
        vec!["destage", "--api", &nobody, "--token", "t"],
        vec!["prewarm", "status", "--api", &nobody],
        vec!["reload", "--api", &nobody, "--token", "t"],
    ] {
        let (code, out) = run(&args);
        assert_eq!(code, 3, "{args:?}: {out}");
        assert!(out.contains("is `cachevisor serve` running"), "{args:?}: {out}");
    }
    let (code, out) = run(&["status", "--bogus"]);
    assert_eq!(code, 2, "{out}");
    let (code, out) = run(&["reload", "--help"]);
    assert!(code == 0 && out.contains("Exit status: 0 done; 1 refused or failed"), "{out}");

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ServeConfig::new("16MiB").api().vdisk("vm1", "vm1.img", &[("size", s("8MiB"))]).write(d, "e.toml");
    let a = Daemon::start(d, "e.toml", &[]).unwrap();
    let api = a.api.clone().unwrap();
    let token_file = d.join("cache.img.meta/api-token");
    let token_file = token_file.to_str().unwrap();
    assert_eq!(run(&["status", "--api", &api]).0, 0);
    assert_eq!(run(&["status", "--json", "--api", &api]).0, 0);
    assert_eq!(run(&["destage", "--api", &api, "--token-file", token_file]).0, 0);
    assert_eq!(run(&["reload", "--api", &api, "--token-file", token_file]).0, 0);
    let (code, out) = run(&["reload", "--api", &api, "--token", "wrong"]);
    assert_eq!(code, 4, "{out}");
    let (code, out) = run(&["destage", "--api", &api, "--vdisk", "nope", "--token-file", token_file]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("nope"), "{out}");
    let (code, out) = run(&["prewarm", "start", "--from", "/nonexistent", "--api", &api, "--token-file", token_file]);
    assert_eq!(code, 1, "{out}");
    // No config file to re-read is not the daemon's case here; a bad one is refused: 1.
    std::fs::write(d.join("e.toml"), "[cache]\npath = 3\n").unwrap();
    let (code, out) = run(&["reload", "--api", &api, "--token-file", token_file]);
    assert!(code == 1 && out.contains("e.toml"), "{code}: {out}");
    // Missing token: refused by the command itself, 1.
    assert_eq!(run(&["reload", "--api", &api]).0, 1);
}

/// Serves `body` as the answer to every GET on a loopback port (a stand-in for a daemon
/// whose cache device failed); returns its address.
fn fake_api(body: &'static str) -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut line = String::new();
            while r.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    a
}

#[test]
fn status_exits_5_when_a_vdisk_runs_in_pass_through() {
    let degraded = fake_api(
        r#"[{"name":"vm1","size":1048576,"block_size":4096,"write_policy":"wb","used_blocks":0,"target_blocks":0,"dirty_blocks":3,"stats":{"passthrough":true}},{"name":"vm2","size":1048576,"block_size":4096,"write_policy":"wt","stats":{"passthrough":false}}]"#,
    );
    let (code, out) = run(&["status", "--api", &degraded]);
    assert_eq!(code, 5, "{out}");
    assert!(
        out.contains("pass-through")
            && out.contains("vm1")
            && !out.contains("through the cache after device errors): vm1, vm2"),
        "{out}"
    );
    let (code, out) = run(&["status", "--json", "--api", &degraded]);
    assert_eq!(code, 5, "{out}");
    let healthy = fake_api(
        r#"[{"name":"vm2","size":1048576,"block_size":4096,"write_policy":"wt","stats":{"passthrough":false}}]"#,
    );
    assert_eq!(run(&["status", "--api", &healthy]).0, 0);
}
