//! The control commands against a real daemon process: `cachevisor status` lists the
//! vDisks, `cachevisor destage` writes every dirty block back (following the job's progress
//! through the API) and refuses to run without the token.

use cachevisor_server::nbd::client::Client;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn cachevisor(args: &[&str]) -> (bool, String) {
    let o =
        Command::new(env!("CARGO_BIN_EXE_cachevisor")).args(args).env_remove("CACHEVISOR_API_TOKEN").output().unwrap();
    (o.status.success(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

#[test]
fn status_and_destage_talk_to_a_running_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("serve.toml"),
        "[cache]\npath = \"cache.img\"\nsize = \"4MiB\"\nflush_rate = \"0\"\n[listen]\ntcp = \"127.0.0.1:0\"\n[api]\nlisten = \"127.0.0.1:0\"\n[[vdisk]]\nname = \"wb\"\nbacking = \"wb.img\"\nsize = \"8MiB\"\nwrite_policy = \"wb\"\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_cachevisor"))
        .args(["serve", "--config"])
        .arg(d.join("serve.toml"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let guard = scopeguard(pid);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut nbd, mut api) = (None, None);
    while api.is_none() {
        let l = lines.next().expect("server exited early").unwrap();
        if let Some(rest) = l.strip_prefix("nbd://") {
            nbd = Some(rest.split('/').next().unwrap().to_string());
        } else if let Some(rest) = l.strip_prefix("# API: http://") {
            api = Some(rest.split('/').next().unwrap().to_string());
        }
    }
    let (nbd, api) = (nbd.unwrap(), api.unwrap());
    let mut c = Client::connect(nbd.parse().unwrap(), "wb").unwrap();
    for i in 0..600u64 {
        c.write(i * 4096, &[(i % 251) as u8 + 1; 4096], false).unwrap().unwrap();
    }
    let (ok, out) = cachevisor(&["status", "--api", &api]);
    assert!(ok, "{out}");
    let row = out.lines().find(|l| l.starts_with("wb ")).unwrap_or_else(|| panic!("no row for wb:\n{out}"));
    assert_eq!(row.split_whitespace().nth(5), Some("2.34MiB"), "dirty column (600 blocks of 4 KiB): {row}");
    // Without the token: a clear refusal, nothing written back.
    let (ok, out) = cachevisor(&["destage", "--api", &api]);
    assert!(!ok && out.contains("API token"), "{out}");
    let (ok, out) = cachevisor(&["destage", "--api", &api, "--token", "not-the-token"]);
    assert!(!ok && out.contains("401"), "{out}");
    let token_file = d.join("cache.img.meta/api-token");
    let (ok, out) = cachevisor(&["destage", "--api", &api, "--token-file", token_file.to_str().unwrap()]);
    assert!(ok && out.contains("destaged 600 blocks"), "{out}");
    let (_, out) = cachevisor(&["status", "--api", &api]);
    let row = out.lines().find(|l| l.starts_with("wb ")).unwrap();
    assert_eq!(row.split_whitespace().nth(5), Some("0B"), "dirty column after destage: {row}");
    // SIGHUP (a closed terminal) does not stop the daemon.
    Command::new("kill").args(["-HUP", &pid.to_string()]).status().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(child.try_wait().unwrap().is_none(), "SIGHUP stopped the daemon");
    let (ok, out) = cachevisor(&["status", "--api", &api]);
    assert!(ok && out.contains("wb "), "{out}");
    let b = std::fs::read(d.join("wb.img")).unwrap();
    for i in 0..600usize {
        assert!(b[i * 4096..(i + 1) * 4096].iter().all(|&x| x == (i % 251) as u8 + 1), "block {i} on the backing file");
    }
    drop(guard);
    let _ = child.wait();
}

/// Kills the daemon (by PID) when the test ends, also on a failed assertion.
fn scopeguard(pid: u32) -> impl Drop {
    struct Kill(u32);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = Command::new("kill").args(["-KILL", &self.0.to_string()]).status();
        }
    }
    Kill(pid)
}

#[test]
fn a_busy_port_is_one_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    std::fs::write(
        dir.path().join("serve.toml"),
        format!("[cache]\npath = \"cache.img\"\nsize = \"1MiB\"\n[listen]\ntcp = \"127.0.0.1:{port}\"\nunix = \"nbd.sock\"\n[[vdisk]]\nname = \"d\"\nbacking = \"d.img\"\nsize = \"1MiB\"\n"),
    )
    .unwrap();
    let (ok, out) = cachevisor(&["serve", "--config", dir.path().join("serve.toml").to_str().unwrap()]);
    assert!(!ok && out.contains(&format!("listen.tcp 127.0.0.1:{port}")), "{out}");
    assert_eq!(out.matches("os error 98").count(), 1, "the reason once: {out}");
    drop(busy);
    // With the port free: the unix-socket URI is printed with an absolute path.
    let mut child = Command::new(env!("CARGO_BIN_EXE_cachevisor"))
        .current_dir(dir.path())
        .args(["serve", "--config", "serve.toml"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _guard = scopeguard(child.id());
    let line = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .find(|l| l.starts_with("nbd+unix://"))
        .unwrap();
    assert!(line.contains(&format!("socket={}/nbd.sock", dir.path().display())), "{line}");
    drop(_guard);
    let _ = child.wait();
}
