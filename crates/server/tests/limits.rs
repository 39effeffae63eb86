//! Access and resource limits, with real clients (curl, raw sockets, qemu-io):
//! - the API authenticates before it looks at a body, locks out after repeated wrong
//!   tokens (even the right token waits), and counts it;
//! - the API refuses what the config refuses (S-CAVE over LRU), a target above the
//!   cache, and changes nothing in memory or on disk when it refuses;
//! - NBD clients that never finish the handshake are closed at the deadline, and
//!   connections past `listen.max_connections` are closed at once while a served client
//!   goes on;
//! - API connections that move no byte for `api.idle_timeout` are closed (their slots come
//!   back), one that keeps talking stays open, and one past the limit is closed at once;
//! - the cache store, metadata and snapshots are private (0600/0700), and a cache store
//!   other users can read refuses the start, naming the `chmod`;
//! - the unix socket has `listen.unix_mode` (0600 by default), and a mode that lets other
//!   users in is refused.

mod common;
use common::*;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

fn api_cfg(dir: &std::path::Path) -> cachevisor_server::Config {
    let mut c = config(dir, "1MiB", &[("a", "4MiB", "wb")]);
    c.api = Some(cachevisor_server::config::ApiConfig::on("127.0.0.1:0"));
    c
}

/// curl's status code and body for `method` on `url` with `token` (if any) and `body`.
fn curl(method: &str, url: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let mut c = tool("curl");
    c.args(["-s", "-o", "-", "-w", "\n%{http_code}", "-X", method, url, "-H", "content-type: application/json"]);
    if let Some(t) = token {
        c.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    if !body.is_empty() {
        c.args(["-d", body]);
    }
    let o = c.output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.parse().unwrap(), body.to_string())
}

#[test]
fn the_api_authenticates_first_locks_out_and_applies_only_what_is_valid_and_saved() {
    let dir = tempfile::tempdir().unwrap();
    let r = serve(&api_cfg(dir.path()));
    let (api, token) = r.api.clone().unwrap();
    let url = |p: &str| format!("http://{api}{p}");
    // Anonymous callers learn nothing of the body's rules (no allocator list, no 400).
    let (code, body) = curl("POST", &url("/allocator"), None, r#"{"name":"nonsense"}"#);
    assert_eq!(code, 401, "{body}");
    assert!(!body.contains("s-cave"), "{body}");
    assert_eq!(curl("POST", &url("/vdisks/a/resize"), None, "not json").0, 401);
    // S-CAVE over this cache's LRU: refused as the config refuses it; nothing saved.
    let (code, body) = curl("POST", &url("/allocator"), Some(&token), r#"{"name":"s-cave"}"#);
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("replacement") && body.contains("clock"), "{body}");
    assert_eq!(r.daemon.allocator_name(), "static");
    let overlay = dir.path().join("cache.img.meta/vdisks.toml");
    let saved = std::fs::read_to_string(&overlay).unwrap_or_default();
    assert!(!saved.contains("s-cave"), "{saved}");
    // A target above the cache (or u64::MAX): 400, not applied, not saved.
    let before = r.daemon.status()[0].target_blocks;
    for blocks in ["257", &u64::MAX.to_string()] {
        let (code, body) = curl("POST", &url("/vdisks/a/resize"), Some(&token), &format!(r#"{{"blocks":{blocks}}}"#));
        assert_eq!(code, 400, "{body}");
        assert!(body.contains("more than the cache holds"), "{body}");
    }
    assert_eq!(r.daemon.status()[0].target_blocks, before);
    assert!(!std::fs::read_to_string(&overlay).unwrap_or_default().contains("target"));
    // The whole cache (256 blocks) is a valid target: applied and saved.
    assert_eq!(curl("POST", &url("/vdisks/a/resize"), Some(&token), r#"{"blocks":256}"#).0, 200);
    assert_eq!(r.daemon.status()[0].target_blocks, 256);
    // Wrong tokens: after five the API locks guessers out (429, after a pause); the
    // right token is never refused (wrong tokens used to lock the operator out).
    for _ in 0..5 {
        assert_eq!(curl("POST", &url("/vdisks/a/destage"), Some("0000000000000000"), "").0, 401);
    }
    let (code, body) = curl("POST", &url("/vdisks/a/destage"), Some("0000000000000000"), "");
    assert_eq!(code, 429, "{body}");
    assert_eq!(curl("GET", &url("/vdisks"), None, "").0, 200, "reads go on");
    let (code, body) = curl("POST", &url("/vdisks/a/destage"), Some(&token), "");
    assert_eq!(code, 202, "the right token during a lockout: {body}");
    let m = curl("GET", &url("/metrics"), None, "").1;
    for needle in ["cachevisor_api_auth_failures_total 8", "cachevisor_api_lockouts_total 1"] {
        assert!(m.contains(needle), "metrics lack `{needle}`");
    }
}

/// An HTTP/1.1 GET of `path` on the open connection `s`; true when a 200 came back.
fn get_on(s: &mut std::net::TcpStream, path: &str) -> bool {
    use std::io::Write;
    if s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).is_err() {
        return false;
    }
    let mut buf = [0u8; 4096];
    matches!(s.read(&mut buf), Ok(n) if buf[..n].starts_with(b"HTTP/1.1 200"))
}

/// Reads until the peer closes; how long that took.
fn closed_within(s: &mut std::net::TcpStream) -> Duration {
    let t = Instant::now();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 4096];
    while s.read(&mut buf).is_ok_and(|n| n > 0) {}
    t.elapsed()
}

#[test]
fn idle_api_connections_are_closed_and_their_slots_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = api_cfg(dir.path());
    cfg.api.as_mut().unwrap().idle_timeout = "1s".into();
    let r = serve(&cfg);
    let api = r.api.clone().unwrap().0;
    // A client that keeps talking (every 400 ms, 2.4 s in all) is never idle.
    let mut talker = std::net::TcpStream::connect(api).unwrap();
    talker.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(get_on(&mut talker, "/vdisks"));
    // 63 more that never send a byte fill the 64 slots; the next one gets in, closing
    // the connection silent longest (idle connections used to lock it out).
    let mut idle: Vec<_> = (0..63).map(|_| std::net::TcpStream::connect(api).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut surplus = std::net::TcpStream::connect(api).unwrap();
    surplus.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(get_on(&mut surplus, "/vdisks"), "a new connection makes room");
    assert!(closed_within(&mut idle[0]) < Duration::from_millis(900), "the oldest silent one made room");
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(400));
        assert!(get_on(&mut talker, "/vdisks"), "a connection in use is not idle");
    }
    // The idle ones were closed after a second (the test took longer: each is gone now).
    for s in &mut idle[1..] {
        assert!(closed_within(s) < Duration::from_secs(2));
    }
    // A connection that trickles a byte every 300 ms is closed at its request deadline
    // (1 s): bytes do not extend it, only a response does.
    let mut trickle = std::net::TcpStream::connect(api).unwrap();
    let t = Instant::now();
    while std::io::Write::write_all(&mut trickle, b"G").is_ok() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(t.elapsed() < Duration::from_secs(3), "the trickle lasted {:?}", t.elapsed());

    assert!(get_on(&mut std::net::TcpStream::connect(api).unwrap(), "/vdisks"), "the slots came back");
    let m = r.daemon.render_metrics();
    assert!(m.contains("cachevisor_handshakes_evicted_total 1"), "{m}");
    assert!(m.contains("cachevisor_connections_refused_total 0"), "{m}");
}

#[test]
fn idle_and_surplus_nbd_connections_are_closed_while_clients_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), "1MiB", &[("a", "4MiB", "wb")]);
    cfg.listen.max_connections = 8;
    cfg.listen.handshake_timeout = "500ms".into();
    let r = serve(&cfg);
    let addr = r.tcp.unwrap();
    let (mut served, _) = Client::connect(addr, "a");
    // Seven more connections that never send a byte hold no established slot: they wait
    // apart, at most 4 from one address (`preauth.rs`); the ninth is greeted, the oldest
    // waiting ones closed to make room (they used to take every slot).
    let mut idle: Vec<_> = (0..7).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(100));
    let mut ninth = std::net::TcpStream::connect(addr).unwrap();
    ninth.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut greeting = [0u8; 18];
    ninth.read_exact(&mut greeting).unwrap();
    assert_eq!(&greeting[..8], b"NBDMAGIC");
    for s in idle.drain(..4) {
        let mut s = s;
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 64];
        let mut n = 0;
        while let Ok(k) = s.read(&mut buf) {
            if k == 0 {
                break;
            }
            n += k;
        }
        assert!(n <= 18, "an evicted connection got past its greeting");
    }
    served.write(0, &[1; 4096], true).unwrap();
    // The idle ones are closed at the handshake deadline: the slots come back.
    let t = Instant::now();
    for mut s in idle.into_iter().chain([ninth]) {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 64];
        while s.read(&mut buf).is_ok_and(|n| n > 0) {}
    }
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let o = tool("qemu-io").args(["-f", "raw", "-c", "read -P 1 0 4096", &format!("nbd://{addr}/a")]).output().unwrap();
    assert!(o.status.success() && !String::from_utf8_lossy(&o.stdout).contains("fail"), "{o:?}");
    assert!(served.read(0, 4096).unwrap() == vec![1; 4096]);
    let m = r.daemon.render_metrics();
    assert!(m.contains("cachevisor_handshakes_evicted_total 4"), "{m}");
    assert!(m.contains("cachevisor_handshake_timeouts_total 4"), "{m}");
}

#[test]
fn files_holding_vm_data_are_private_and_a_readable_cache_refuses_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "1MiB", &[("a", "4MiB", "wb")]);
    let r = serve(&cfg);
    r.daemon.take_snapshot().unwrap();
    r.daemon.shutdown().unwrap();
    drop(r);
    let mode = |p: &str| std::fs::metadata(dir.path().join(p)).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode("cache.img"), 0o600);
    assert_eq!(mode("a.img"), 0o600);
    assert_eq!(mode("cache.img.meta"), 0o700);
    assert_eq!(mode("cache.img.meta/snapshots"), 0o700);
    for f in std::fs::read_dir(dir.path().join("cache.img.meta")).unwrap() {
        let f = f.unwrap();
        let m = f.metadata().unwrap().permissions().mode() & 0o777;
        assert!(m == 0o600 || m == 0o700, "{}: {m:o}", f.path().display());
    }
    for f in std::fs::read_dir(dir.path().join("cache.img.meta/snapshots")).unwrap() {
        assert_eq!(f.unwrap().metadata().unwrap().permissions().mode() & 0o777, 0o600);
    }
    std::fs::set_permissions(dir.path().join("cache.img"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = cachevisor_server::service::start(&cfg).err().unwrap().to_string();
    assert!(e.contains("0644") && e.contains("chmod 600"), "{e}");
}

#[test]
fn the_unix_socket_has_its_mode_and_real_clients_connect() {
    let dir = tempfile::tempdir().unwrap();
    for (mode, want) in [(None, 0o600), (Some("0660"), 0o660)] {
        let mut c = config(dir.path(), "1MiB", &[("a", "4MiB", "wt")]);
        c.listen.unix = Some(dir.path().join("nbd.sock"));
        if let Some(m) = mode {
            c.listen.unix_mode = m.into();
        }
        let r = serve(&c);
        let sock = dir.path().join("nbd.sock");
        assert_eq!(std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777, want, "{mode:?}");
        let uri = format!("nbd+unix:///a?socket={}", sock.display());
        let o = tool("qemu-io")
            .args(["-f", "raw", "-c", "write -P 7 0 4k", "-c", "read -P 7 0 4k", &uri])
            .output()
            .unwrap();
        assert!(o.status.success(), "qemu-io over {uri}: {}", String::from_utf8_lossy(&o.stderr));
        r.daemon.shutdown().unwrap();
        drop(r);
        // Nothing left beside it (the socket is bound in a private directory, then moved).
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(!names.iter().any(|n| n.to_string_lossy().starts_with(".cv-")), "{names:?}");
    }
    for bad in ["0666", "0640x", "0060", "1600"] {
        let mut c = config(dir.path(), "1MiB", &[("a", "4MiB", "wt")]);
        c.listen.unix = Some(dir.path().join("nbd.sock"));
        c.listen.unix_mode = bad.into();
        let e = c.resolve().unwrap_err();
        assert!(e.starts_with("listen.unix_mode: "), "{bad}: {e}");
    }
}

#[test]
fn the_unix_socket_gets_the_hypervisors_group() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    // A group the socket may be given, by name and by number: as root, one that is not
    // root's own (so the chown shows); otherwise this process's primary group.
    let own = nix::unistd::getgid().as_raw();
    let groups: Vec<(String, u32)> = std::fs::read_to_string("/etc/group")
        .unwrap()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            Some((f.first()?.to_string(), f.get(2)?.parse().ok()?))
        })
        .collect();
    let root = nix::unistd::geteuid().is_root();
    let (name, gid) = groups
        .into_iter()
        .find(|(_, g)| if root { *g != own } else { *g == own })
        .expect("a usable group in /etc/group");
    for group in [name.clone(), gid.to_string()] {
        let mut c = config(dir.path(), "1MiB", &[("a", "4MiB", "wt")]);
        c.listen.unix = Some(dir.path().join("nbd.sock"));
        c.listen.unix_mode = "0660".into();
        c.listen.unix_group = Some(group.clone());
        let r = serve(&c);
        let m = std::fs::metadata(dir.path().join("nbd.sock")).unwrap();
        assert_eq!((m.gid(), m.mode() & 0o777), (gid, 0o660), "{group}");
        r.daemon.shutdown().unwrap();
    }
    let mut c = config(dir.path(), "1MiB", &[("a", "4MiB", "wt")]);
    c.listen.unix = Some(dir.path().join("nbd.sock"));
    c.listen.unix_group = Some(name.clone());
    let e = c.resolve().unwrap_err();
    assert!(e.starts_with("listen.unix_group: ") && e.contains("0660"), "{e}");
    c.listen.unix_mode = "0660".into();
    c.listen.unix_group = Some("no-such-group-here".into());
    c.resolve().unwrap(); // looked up at start, on the host that binds the socket
    let e = cachevisor_server::service::start(&c).err().unwrap().to_string();
    assert!(e.contains("no group named `no-such-group-here`"), "{e}");
}
