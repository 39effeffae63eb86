//! The control commands against a real daemon process: `cachevisor status` lists the
//! vDisks, `cachevisor destage` writes every dirty block back (following the job's progress
//! through the API) and refuses to run without the token.

use cachevisor_nbd::client::Client;
use cachevisor_testkit as common;
use common::*;
use std::process::Command;

#[test]
fn status_and_destage_talk_to_a_running_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ServeConfig::new("4MiB")
        .no_writeback()
        .api()
        .vdisk("wb", "wb.img", &[("size", s("8MiB")), ("write_policy", s("wb"))])
        .write(d, "serve.toml");
    let mut daemon = Daemon::start(d, "serve.toml", &[]).unwrap();
    let (nbd, api) = (daemon.nbd.clone(), daemon.api.clone().unwrap());
    let mut c = Client::connect(nbd.parse::<std::net::SocketAddr>().unwrap(), "wb").unwrap();
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
    Command::new("kill").args(["-HUP", &daemon.pid.to_string()]).status().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(daemon.child.as_mut().unwrap().try_wait().unwrap().is_none(), "SIGHUP stopped the daemon");
    let (ok, out) = cachevisor(&["status", "--api", &api]);
    assert!(ok && out.contains("wb "), "{out}");
    let b = std::fs::read(d.join("wb.img")).unwrap();
    for i in 0..600usize {
        assert!(b[i * 4096..(i + 1) * 4096].iter().all(|&x| x == (i % 251) as u8 + 1), "block {i} on the backing file");
    }
}

#[test]
fn a_busy_port_is_one_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    ServeConfig::new("1MiB")
        .listen("tcp", format!("127.0.0.1:{port}"))
        .listen("unix", "nbd.sock")
        .vdisk("d", "d.img", &[("size", s("1MiB"))])
        .write(dir.path(), "serve.toml");
    let e = Daemon::start(dir.path(), "serve.toml", &[]).err().expect("the port is taken");
    assert!(e.status.is_some_and(|s| !s.success()), "{e:?}");
    assert!(e.output.contains(&format!("listen.tcp 127.0.0.1:{port}")), "{}", e.output);
    assert_eq!(e.output.matches("os error 98").count(), 1, "the reason once: {}", e.output);
    drop(busy);
    // Listening on a unix socket: its URI is printed with an absolute path.
    let text = std::fs::read_to_string(dir.path().join("serve.toml"))
        .unwrap()
        .replace(&format!("tcp = \"127.0.0.1:{port}\"\n"), "");
    std::fs::write(dir.path().join("serve.toml"), text).unwrap();
    let daemon = Daemon::start(dir.path(), "serve.toml", &[]).unwrap();
    let line = daemon.banner.iter().find(|l| l.starts_with("nbd+unix://")).unwrap();
    assert!(line.contains(&format!("socket={}/nbd.sock", dir.path().display())), "{line}");
}

/// The prewarm's progress from the API, as JSON.
fn prewarm_progress(api: &str) -> serde_json::Value {
    ureq::get(&format!("http://{api}/prewarm")).call().unwrap().into_json().unwrap()
}

/// a daemon process SIGKILLed in the middle of a prewarm resumes it at its next
/// start from the set it saved, and what it had loaded (and journaled) is not read again;
/// `cachevisor prewarm status` follows the resumed prewarm to its end.
#[test]
fn a_prewarm_interrupted_by_sigkill_resumes_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ServeConfig::new("16MiB")
        .api()
        .section("prewarm", "rate", "2MiB")
        .section("prewarm", "busy_rate", "2MiB")
        .section("prewarm", "max_read", "64KiB")
        .vdisk("vm1", "vm1.img", &[("size", s("16MiB")), ("write_policy", s("wt"))])
        .write(d, "serve.toml");
    std::fs::create_dir(d.join("from")).unwrap();
    let mut s = cachevisor_prewarm::Snapshot::new(1, 0, 4096);
    s.sets.insert("vm1".into(), (0..2048u64).collect());
    cachevisor_server::snapshot_files::write(&d.join("from"), &s, 4).unwrap();
    let mut daemon = Daemon::start(d, "serve.toml", &["--prewarm-from", "from"]).unwrap();
    let t = std::time::Instant::now();
    // Past the first second: a commit (once a second) has journaled some loaded blocks.
    while prewarm_progress(daemon.api.as_ref().unwrap())["loaded_blocks"].as_u64().unwrap() < 768 {
        assert!(t.elapsed().as_secs() < 30, "the prewarm does not move: {}", daemon.log());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    daemon.kill9();
    let daemon = Daemon::start(d, "serve.toml", &[]).unwrap();
    let api = daemon.api.clone().unwrap();
    let p = prewarm_progress(&api);
    assert!(p["from"].as_str().unwrap().contains("prewarm-pending"), "resumed from its saved set: {p}");
    assert_eq!(p["planned_blocks"], 2048, "{p}");
    let (ok, out) = cachevisor(&["prewarm", "--api", &api, "status"]);
    assert!(ok && out.contains("done") && out.contains("of 2048 blocks loaded"), "{out}");
    let p = prewarm_progress(&api);
    let (loaded, skipped) = (p["loaded_blocks"].as_u64().unwrap(), p["skipped_blocks"].as_u64().unwrap());
    assert_eq!(loaded + skipped, 2048, "{p}");
    assert!(skipped > 0, "what the killed process loaded and journaled is not read again: {p}");
    // Done: a third start has nothing to resume.
    drop(daemon);
    let daemon = Daemon::start(d, "serve.toml", &[]).unwrap();
    assert_eq!(prewarm_progress(daemon.api.as_ref().unwrap())["from"], "", "nothing left to resume");
}

/// the simulator runs what the daemon runs. A write-back daemon with its
/// default settings serves a write-heavy fio job (Zipf, 60% reads) while recording it;
/// the recording replayed by `simulate` (open loop, the same cache, persistent mode,
/// devices as fast as this machine's files) gives the same read hit ratio and writes the
/// same dirty blocks back — the daemon's background flusher and write-back ahead run in
/// the simulator too (before, it wrote back 49 blocks where the daemon wrote 8,890).
///
/// Timing no longer changes the policy: in persistent mode a miss that finds the durable
/// free reserve empty waits for the commit that returns slots from limbo
/// (`engine/src/slot_wait.rs`) on both sides, where it used to bypass the cache — and the
/// daemon's real commits ran the reserve dry where the simulator's modelled ones did not
/// (a loaded CI run: +3.3% written back in the simulator, 133 misses bypassed live and 7
/// simulated). Measured since (debug build, 2026-12-06): 5,669 / 5,688 and 5,686 / 5,689
/// blocks written back (live / simulated), and with two CPU hogs beside the test 6,385 /
/// 6,400 and 5,869 / 5,874; none bypassed on either side; read hit ratios equal to
/// 0.01 pp. The bounds checked are the targets: 1% written back, 0.5 pp read hits.
#[test]
fn the_simulator_replaying_a_recording_writes_back_what_the_daemon_did() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ServeConfig::new("32MiB")
        .cache("write_policy", "wb")
        .api()
        .vdisk("vm1", "vm1.img", &[("size", s("128MiB"))])
        .write(d, "serve.toml");
    let mut daemon = Daemon::start(d, "serve.toml", &["--record", "rec.csv"]).unwrap();
    let o = std::process::Command::new("fio")
        .args(["--name=w", "--ioengine=nbd", &format!("--uri={}", daemon.uri("vm1")), "--rw=randrw"])
        .args(["--rwmixread=60", "--random_distribution=zipf:1.1", "--bs=4k", "--iodepth=4", "--size=128M"])
        // A fixed amount of I/O, not a time: on a loaded machine a timed job wrote back
        // too little to compare (273 blocks in one CI run).
        .args(["--io_size=600M", "--output-format=terse"])
        .output()
        .expect("fio (apt-get install fio)");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m =
        ureq::get(&format!("http://{}/metrics", daemon.api.as_ref().unwrap())).call().unwrap().into_string().unwrap();
    assert!(daemon.term(std::time::Duration::from_secs(30)).is_some_and(|s| s.success()), "{}", daemon.log());
    let (hits, misses) = (
        metric(&m, "cachevisor_block_hits_total", "op=\"read\""),
        metric(&m, "cachevisor_block_misses_total", "op=\"read\""),
    );
    let (live_hit, live_back) = (hits / (hits + misses), metric(&m, "cachevisor_destaged_blocks_total", ""));
    let live_bypassed = metric(&m, "cachevisor_bypassed_blocks_total", "");
    let live_waits = metric(&m, "cachevisor_slot_waits_total", "");
    std::fs::write(
        d.join("sim.toml"),
        "[cache]\nsize = \"32MiB\"\nwrite_policy = \"wb\"\npersistent = true\n[devices]\nssd = \"nvme\"\nbacking = \"nvme\"\n[replay]\nmode = \"open\"\nwindow = \"1s\"\n[trace]\nfiles = [\"rec.csv\"]\nformat = \"csv\"\n",
    )
    .unwrap();
    let sim = d.join("sim.toml");
    let out = d.join("simout");
    let (ok, text) = cachevisor(&["simulate", "--scenario", sim.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(ok, "{text}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("result.json")).unwrap()).unwrap();
    let (sim_hit, sim_back, sim_bypassed) = (
        r["total"]["read_hit_ratio"].as_f64().unwrap(),
        r["total"]["writebacks"].as_f64().unwrap(),
        r["total"]["bypassed_blocks"].as_f64().unwrap(),
    );
    eprintln!("daemon: read hit {live_hit:.4}, written back {live_back}, bypassed {live_bypassed}, waited for a slot {live_waits}; simulator: {sim_hit:.4}, {sim_back}, {sim_bypassed}");
    assert!(live_back > 1000.0, "a write-heavy job writes back: {live_back}");
    assert!((live_hit - sim_hit).abs() < 0.005, "read hit ratio {live_hit} live, {sim_hit} simulated");
    assert!(
        (sim_back / live_back - 1.0).abs() < 0.01,
        "written back {live_back} live, {sim_back} simulated (bypassed {live_bypassed} live, {sim_bypassed} simulated)"
    );
}

/// The subject line `openssl s_client` reports for the certificate served at `addr`.
fn served_subject(addr: &str) -> String {
    let o = Command::new("openssl")
        .args(["s_client", "-connect", addr, "-servername", "localhost"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    text.lines().find(|l| l.starts_with("subject=")).unwrap_or_default().to_string()
}

#[test]
fn a_tls_daemon_is_reached_over_https_and_sighup_reloads_its_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pki = certs::Pki::new(&d.join("pki"));
    let host = pki.client("host-a", "/CN=host-a", None, 1);
    ServeConfig::new("4MiB")
        .listen("tls", "require")
        .listen("tls_dir", "pki/server")
        .api()
        .api_key("tls", true)
        .vdisk("a", "a.img", &[("size", s("8MiB"))])
        .write(d, "serve.toml");
    let daemon = Daemon::start(d, "serve.toml", &[]).unwrap();
    assert!(daemon.banner.iter().any(|l| l.starts_with("nbds://")), "{:?}", daemon.banner);
    assert!(daemon.banner.iter().any(|l| l.starts_with("# API: https://")), "{:?}", daemon.banner);
    let api = daemon.api.clone().unwrap();
    let https = format!("https://localhost:{}", api.rsplit_once(':').unwrap().1);
    let ca = d.join("pki/ca-cert.pem");
    let (ok, out) = cachevisor(&["status", "--api", &https, "--api-ca", ca.to_str().unwrap()]);
    assert!(ok && out.lines().any(|l| l.starts_with("a ")), "{out}");
    // Without the CA the certificate is not trusted: a clear failure, not a hang.
    let (ok, out) = cachevisor(&["status", "--api", &https]);
    assert!(!ok && out.contains("asking https://"), "{out}");
    assert_eq!(served_subject(&api), "subject=CN = localhost");
    // Renewed certificate in place, SIGHUP: new connections get it; the daemon goes on.
    let renewed = pki.server("renewed", "/O=renewed/CN=localhost", certs::LOCAL);
    for f in ["server-cert.pem", "server-key.pem"] {
        std::fs::copy(renewed.join(f), pki.server_dir().join(f)).unwrap();
    }
    Command::new("kill").args(["-HUP", &daemon.pid.to_string()]).status().unwrap();
    let t = std::time::Instant::now();
    while !daemon.log().contains("TLS certificates reloaded") {
        assert!(t.elapsed() < std::time::Duration::from_secs(20), "no reload logged:\n{}", daemon.log());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(served_subject(&api), "subject=O = renewed, CN = localhost");
    let o = Command::new("qemu-io")
        .args(["--object", &format!("tls-creds-x509,id=tls0,dir={},endpoint=client", host.display())])
        .args([
            "--image-opts",
            &format!(
                "driver=nbd,server.type=inet,server.host=localhost,server.port={},export=a,tls-creds=tls0",
                daemon.nbd.rsplit_once(':').unwrap().1
            ),
        ])
        .args(["-c", "write -P 9 0 64k", "-c", "read -P 9 0 64k"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && !text.contains("fail"), "{text}{}", String::from_utf8_lossy(&o.stderr));
}
