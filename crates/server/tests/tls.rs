//! NBD over TLS with real clients and certificates the tests make (`openssl`):
//! - qemu-io and qemu-img (`tls-creds-x509`), libnbd's nbdinfo (`nbds://`) and our own
//!   client read and write a `require` export with client certificates;
//! - a plaintext client against `require` gets `NBD_REP_ERR_TLS_REQD` (EXPORT_NAME is
//!   closed), and qemu-io without TLS fails at once instead of hanging;
//! - a client with no certificate, a self-signed one, an expired one, or one whose names
//!   are not on the export's `allow` list opens nothing, and the backing file is
//!   unchanged; LIST shows a client only what it may open;
//! - garbage after STARTTLS, a handshake that stops half-way and plaintext after the
//!   ACK end that connection only;
//! - certificates reload: new connections get the new one while an open connection keeps
//!   serving, and a broken file keeps the old ones;
//! - `nbdkit --tls=require` as a TLS backing store behind the cache (`nbds://`), and on a
//!   unix socket (`nbd+unix://`, `nbds+unix://`; the name check as libnbd does it);
//! - the HTTPS API; TLS over the unix socket; a TLS 1.2 renegotiation refused while the
//!   server serves on.

mod common;
use cachevisor_nbd::client::{Client, TlsClient};
use cachevisor_nbd::proto::*;
use cachevisor_nbd::tls::{client_config, ClientCredentials};
use common::certs::Pki;
use common::*;
use std::path::Path;

/// A service with `(name, allow)` exports of 4 MiB (write-through) behind TLS `mode`.
fn tls_serve(dir: &Path, pki: &Pki, mode: &str, disks: &[(&str, &[&str])]) -> cachevisor_server::service::Running {
    let mut c = ServeConfig::new("1MiB")
        .cache("flush_rate", "0")
        .listen("handshake_timeout", "500ms")
        .listen("tls", mode)
        .listen("tls_dir", pki.server_dir().display().to_string());
    for (name, allow) in disks {
        c = c.vdisk(
            name,
            &format!("{name}.img"),
            &[("size", s("4MiB")), ("write_policy", s("wt")), ("allow", strings(allow))],
        );
    }
    serve(&parse(dir, &c))
}

/// qemu-io over TLS with the client directory `creds`; (success, output).
fn qemu_io_tls(port: u16, export: &str, creds: &Path, cmds: &[&str]) -> (bool, String) {
    let mut c = tool("qemu-io");
    c.args(["--object", &format!("tls-creds-x509,id=tls0,dir={},endpoint=client", creds.display())]);
    c.args([
        "--image-opts",
        &format!("driver=nbd,server.type=inet,server.host=127.0.0.1,server.port={port},export={export},tls-creds=tls0"),
    ]);
    for x in cmds {
        c.args(["-c", x]);
    }
    let o = c.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    (o.status.success() && !text.contains("failed") && !text.contains("error"), text)
}

/// Our client over TLS with the client directory `creds`.
fn our_client(port: u16, export: &str, creds: &Path) -> std::io::Result<Client> {
    let config = client_config(&ClientCredentials::in_dir(creds), "test").unwrap();
    let tls = TlsClient { config, server_name: "127.0.0.1".into() };
    Client::connect_tls(std::net::SocketAddr::from(([127, 0, 0, 1], port)), export, &tls)
}

fn nbdinfo_list(port: u16, creds: &Path) -> (bool, String) {
    let o = tool("nbdinfo")
        .args(["--list", &format!("nbds://127.0.0.1:{port}/?tls-certificates={}", creds.display())])
        .output()
        .unwrap();
    (o.status.success(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

#[test]
fn qemu_libnbd_and_our_client_read_and_write_over_tls_with_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"));
    let a = pki.client("host-a", "/O=tenant1/CN=host-a", Some("DNS:host-a.example"), 1);
    let r = tls_serve(dir.path(), &pki, "require", &[("a", &[])]);
    let port = r.tcp.unwrap().port();
    let (ok, out) = qemu_io_tls(port, "a", &a, &["write -P 0xab 4096 65536", "read -P 0xab 4096 65536"]);
    assert!(ok, "{out}");
    // Write-through: the bytes are on the backing file.
    let img = std::fs::read(dir.path().join("a.img")).unwrap();
    assert!(img[4096..4096 + 65536].iter().all(|&b| b == 0xab) && img[..4096].iter().all(|&b| b == 0));
    let o = tool("qemu-img")
        .args(["info", "--object", &format!("tls-creds-x509,id=tls0,dir={},endpoint=client", a.display())])
        .args([
            "--image-opts",
            &format!("driver=nbd,server.type=inet,server.host=127.0.0.1,server.port={port},export=a,tls-creds=tls0"),
        ])
        .output()
        .unwrap();
    let info = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && info.contains("4 MiB (4194304 bytes)"),
        "{info}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let (ok, list) = nbdinfo_list(port, &a);
    assert!(ok && list.contains("export=\"a\"") && list.contains("export-size: 4194304"), "{list}");
    let mut c = our_client(port, "a", &a).unwrap();
    assert_eq!(c.read(4096, 4096).unwrap().unwrap(), vec![0xab; 4096]);
    c.write(0, &[7u8; 512], true).unwrap().unwrap();
    assert_eq!(&std::fs::read(dir.path().join("a.img")).unwrap()[..512], &[7u8; 512]);
}

#[test]
fn plaintext_clients_of_a_require_listener_get_tls_reqd_and_never_an_export() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"));
    let r = tls_serve(dir.path(), &pki, "require", &[("a", &[])]);
    let addr = r.tcp.unwrap();
    let mut s = greet(addr, FLAG_C_FIXED_NEWSTYLE);
    for (opt, data) in [(OPT_LIST, vec![]), (OPT_INFO, go_data("a")), (OPT_GO, go_data("a"))] {
        send_option(&mut s, opt, &data);
        let (o, kind, msg) = read_option_reply(&mut s).unwrap();
        assert_eq!((o, kind), (opt, REP_ERR_TLS_REQD), "{}", String::from_utf8_lossy(&msg));
    }
    send_option(&mut s, OPT_EXPORT_NAME, b"a");
    assert!(closed(&mut s), "EXPORT_NAME before TLS must close");
    // Our client without TLS: refused with the protocol's error, not a hang.
    let e = Client::connect(addr, "a").err().expect("plaintext GO refused");
    assert!(e.to_string().contains("TLS is required"), "{e}");
    // qemu-io without TLS fails at once.
    let t = std::time::Instant::now();
    let o = tool("qemu-io").args(["-f", "raw", "-c", "read 0 512", &format!("nbd://{addr}/a")]).output().unwrap();
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && text.contains("TLS"), "{text}");
    assert!(t.elapsed() < std::time::Duration::from_secs(10));
    // A listener with TLS off says so.
    let plain = serve(&config(&dir.path().join("p").tap_mkdir(), "1MiB", &[("a", "1MiB", "wt")]));
    let mut s = greet(plain.tcp.unwrap(), FLAG_C_FIXED_NEWSTYLE);
    send_option(&mut s, OPT_STARTTLS, &[]);
    let (_, kind, msg) = read_option_reply(&mut s).unwrap();
    assert_eq!(kind, REP_ERR_POLICY, "{}", String::from_utf8_lossy(&msg));
}

trait TapMkdir {
    fn tap_mkdir(self) -> Self;
}
impl TapMkdir for std::path::PathBuf {
    fn tap_mkdir(self) -> Self {
        std::fs::create_dir_all(&self).unwrap();
        self
    }
}

#[test]
fn clients_without_an_acceptable_certificate_open_nothing_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"));
    let a = pki.client("host-a", "/O=tenant1/CN=host-a", None, 1);
    let b = pki.client("host-b", "/O=tenant2/CN=host-b", Some("DNS:host-b.example"), 1);
    let anonymous = pki.anonymous("anon");
    let forged = pki.self_signed("forged", "/O=tenant1/CN=host-a");
    let expired = pki.client("old-a", "/O=tenant1/CN=host-a", None, -1);
    let r = tls_serve(dir.path(), &pki, "require", &[("a", &["CN=host-a,O=tenant1"]), ("b", &["DNS:host-b.example"])]);
    let port = r.tcp.unwrap().port();
    assert!(qemu_io_tls(port, "a", &a, &["write -P 0x11 0 1M"]).0);
    assert!(qemu_io_tls(port, "b", &b, &["write -P 0x22 0 1M"]).0);
    let before = (std::fs::read(dir.path().join("a.img")).unwrap(), std::fs::read(dir.path().join("b.img")).unwrap());
    let stats_a = r.daemon.stats(0);
    for (who, creds, export) in [
        ("no certificate", &anonymous, "a"),
        ("self-signed", &forged, "a"),
        ("expired", &expired, "a"),
        ("tenant2", &b, "a"),
        ("tenant1", &a, "b"),
    ] {
        let (ok, out) = qemu_io_tls(port, export, creds, &["read -P 0x11 0 4096", "write -P 0xee 0 4096"]);
        assert!(!ok, "{who} opened {export}: {out}");
        assert!(our_client(port, export, creds).is_err(), "{who} opened {export} with our client");
    }
    // The wrong tenant is told exactly what a client asking for a missing export is
    // (hidden exports cannot be found by name); the daemon's log says why.
    let e = our_client(port, "a", &b).err().unwrap().to_string();
    assert!(e.contains("no export named `a` for this client"), "{e}");
    let missing = our_client(port, "z", &b).err().unwrap().to_string();
    assert_eq!(e.replace("`a`", "`z`"), missing);
    // The same through libnbd (nbdinfo): what it prints for a hidden export and for a
    // missing one differs only in the name.
    let info = |export: &str| {
        let o = tool("nbdinfo")
            .arg(format!("nbds://127.0.0.1:{port}/{export}?tls-certificates={}", b.display()))
            .output()
            .unwrap();
        assert!(!o.status.success(), "{export} opened");
        String::from_utf8_lossy(&o.stderr).replace(&format!("export: {export}"), "export: NAME")
    };
    let (hidden, gone) = (info("a"), info("zz-missing"));
    assert_eq!(hidden, gone, "nbdinfo tells a hidden export from a missing one");
    assert!(hidden.contains("No such file or directory"), "{hidden}");
    let after = (std::fs::read(dir.path().join("a.img")).unwrap(), std::fs::read(dir.path().join("b.img")).unwrap());
    assert!(before == after, "a refused client changed a backing file");
    assert_eq!(r.daemon.stats(0).blocks, stats_a.blocks, "a refused client's request reached vDisk a");
    // LIST shows each client its own exports only.
    let (ok, list) = nbdinfo_list(port, &b);
    assert!(ok && list.contains("export=\"b\"") && !list.contains("export=\"a\""), "{list}");
    // Still serving the rightful clients.
    assert!(qemu_io_tls(port, "a", &a, &["read -P 0x11 0 1M"]).0);
}

#[test]
fn garbage_and_stalls_around_the_tls_handshake_end_only_that_connection() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"));
    let a = pki.client("host-a", "/CN=host-a", None, 1);
    let r = tls_serve(dir.path(), &pki, "on", &[("a", &[])]);
    let addr = r.tcp.unwrap();
    let starttls = || {
        let mut s = greet(addr, FLAG_C_FIXED_NEWSTYLE);
        send_option(&mut s, OPT_STARTTLS, &[]);
        assert_eq!(read_option_reply(&mut s).unwrap().1, REP_ACK);
        s
    };
    // Garbage where the ClientHello belongs.
    let mut s = starttls();
    s.write_all(&[0x5a; 300]).unwrap();
    assert!(ends(&mut s));
    // Plaintext NBD options after the ACK.
    let mut s = starttls();
    send_option(&mut s, OPT_LIST, &[]);
    assert!(ends(&mut s));
    // A handshake record that never finishes: closed at the handshake deadline.
    let timeouts = r.daemon.guards.handshake_timeouts.load(std::sync::atomic::Ordering::Relaxed);
    let mut s = starttls();
    s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).unwrap();
    assert!(ends(&mut s));
    assert_eq!(r.daemon.guards.handshake_timeouts.load(std::sync::atomic::Ordering::Relaxed), timeouts + 1);
    // STARTTLS with data, and twice.
    let mut s = greet(addr, FLAG_C_FIXED_NEWSTYLE);
    send_option(&mut s, OPT_STARTTLS, b"x");
    assert_eq!(read_option_reply(&mut s).unwrap().1, REP_ERR_INVALID);
    // "on" lets a plaintext client in too.
    let mut c = Client::connect(addr, "a").unwrap();
    c.write(0, &[3u8; 4096], false).unwrap().unwrap();
    // And the TLS clients are served as before.
    assert!(qemu_io_tls(addr.port(), "a", &a, &["read -P 3 0 4096"]).0);
}

/// The subject of the certificate the server at `addr` presents now.
fn server_subject(addr: std::net::SocketAddr, creds: &Path) -> String {
    let mut s = greet(addr, FLAG_C_FIXED_NEWSTYLE);
    send_option(&mut s, OPT_STARTTLS, &[]);
    assert_eq!(read_option_reply(&mut s).unwrap().1, REP_ACK);
    let config = client_config(&ClientCredentials::in_dir(creds), "test").unwrap();
    let conn = cachevisor_nbd::tls_stream::connect(config, "127.0.0.1", &mut s).unwrap();
    let leaf = conn.peer_certificates().unwrap()[0].clone();
    cachevisor_nbd::tls_authz::Identity::from_der(&leaf).unwrap().describe()
}

#[test]
fn reloaded_certificates_serve_new_connections_while_open_ones_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"));
    let a = pki.client("host-a", "/CN=host-a", None, 1);
    let r = tls_serve(dir.path(), &pki, "require", &[("a", &[])]);
    let addr = r.tcp.unwrap();
    let mut open = our_client(addr.port(), "a", &a).unwrap();
    open.write(0, &[1u8; 4096], false).unwrap().unwrap();
    assert_eq!(server_subject(addr, &a), "CN=localhost");
    // The operator puts a renewed certificate in place and reloads.
    let renewed = pki.server("renewed", "/O=renewed/CN=localhost", common::certs::LOCAL);
    for f in ["server-cert.pem", "server-key.pem"] {
        std::fs::copy(renewed.join(f), pki.server_dir().join(f)).unwrap();
    }
    r.daemon.reload_tls().unwrap();
    assert_eq!(server_subject(addr, &a), "CN=localhost,O=renewed");
    // The connection made before still reads and writes.
    open.write(4096, &[2u8; 4096], true).unwrap().unwrap();
    assert_eq!(open.read(0, 8192).unwrap().unwrap(), [vec![1u8; 4096], vec![2u8; 4096]].concat());
    // A broken key file: the reload is refused, and the renewed certificate stays in use.
    std::fs::write(pki.server_dir().join("server-key.pem"), "not a key").unwrap();
    let e = r.daemon.reload_tls().unwrap_err();
    assert!(e.contains("tls_key") && e.contains("server-key.pem"), "{e}");
    assert_eq!(server_subject(addr, &a), "CN=localhost,O=renewed");
    assert!(qemu_io_tls(addr.port(), "a", &a, &["read -P 2 4096 4096"]).0);
}

#[test]
fn an_nbdkit_tls_backing_store_sits_behind_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"));
    let node = pki.client("node", "/CN=node-1", None, 1);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let _kit = Nbdkit(
        tool("nbdkit")
            .args(["-f", "-i", "127.0.0.1", "-p", &port.to_string(), "--tls=require", "--tls-verify-peer"])
            .arg(format!("--tls-certificates={}", pki.server_dir().display()))
            .args(["memory", "8M"])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let backing = format!("nbds://localhost:{port}/?tls-certificates={}", node.display());
    let c = ServeConfig::new("1MiB").vdisk("remote", &backing, &[("write_policy", s("wt"))]);
    let r = serve(&parse(dir.path(), &c));
    let uri = format!("nbd://{}/remote", r.tcp.unwrap());
    let o = tool("qemu-io").args(["-f", "raw", "-c", "write -P 0x5c 1M 64k", &uri]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // On nbdkit itself, read over TLS by a separate client.
    let o = tool("qemu-io")
        .args(["--object", &format!("tls-creds-x509,id=tls0,dir={},endpoint=client", node.display())])
        .args([
            "--image-opts",
            &format!("driver=nbd,server.type=inet,server.host=localhost,server.port={port},tls-creds=tls0"),
        ])
        .args(["-c", "read -P 0x5c 1M 64k"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && !text.contains("fail"), "{text}{}", String::from_utf8_lossy(&o.stderr));
}

/// nbdkit's memory plugin on the unix socket `sock` with `tls` arguments; waits until it
/// takes connections.
fn nbdkit_unix(sock: &Path, tls: &[String]) -> Nbdkit {
    let kit = Nbdkit(
        tool("nbdkit")
            .args(["-f", "-U", sock.to_str().unwrap()])
            .args(tls)
            .args(["memory", "8M"])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    for _ in 0..250 {
        if std::os::unix::net::UnixStream::connect(sock).is_ok() {
            return kit;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("nbdkit did not start on {}", sock.display());
}

/// libnbd's unix-socket URIs as backings: `nbd+unix://` in plaintext and `nbds+unix://`
/// with client certificates (`nbdkit -U --tls=require --tls-verify-peer`). Without
/// `tls-hostname` the certificate's chain is checked and its name is not (libnbd's rule;
/// nbdkit's certificate names another host): a certificate from another CA is refused;
/// with `tls-hostname` the name must match.
#[test]
fn unix_socket_nbd_backings_in_plaintext_and_over_tls() {
    use cachevisor_store::backing::Backing;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"));
    let node = pki.client("node", "/CN=node-1", None, 1);
    let (plain, tls) = (dir.path().join("plain.sock"), dir.path().join("tls.sock"));
    let _plain_kit = nbdkit_unix(&plain, &[]);
    // nbdkit's certificate names another host: over a unix socket no name is compared
    // unless the URI gives one.
    let elsewhere = pki.server("elsewhere", "/CN=storage-7.example", "DNS:storage-7.example");
    let tls_args = [
        "--tls=require".to_string(),
        "--tls-verify-peer".into(),
        format!("--tls-certificates={}", elsewhere.display()),
    ];
    let _tls_kit = nbdkit_unix(&tls, &tls_args);
    let c = ServeConfig::new("1MiB")
        .vdisk("plain", &format!("nbd+unix:///?socket={}", plain.display()), &[("write_policy", s("wt"))])
        .vdisk(
            "tls",
            &format!("nbds+unix:///?socket={}&tls-certificates={}", tls.display(), node.display()),
            &[("write_policy", s("wt"))],
        );
    let r = serve(&parse(dir.path(), &c));
    for (export, pattern) in [("plain", "0x3a"), ("tls", "0x5c")] {
        let uri = format!("nbd://{}/{export}", r.tcp.unwrap());
        let o =
            tool("qemu-io").args(["-f", "raw", "-c", &format!("write -P {pattern} 1M 64k"), &uri]).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    // Written through to each nbdkit, read back by a separate client on its socket.
    let mut c = Client::connect(cachevisor_nbd::endpoint::Endpoint::Unix(plain.clone()), "").unwrap();
    assert_eq!(c.read(1 << 20, 65536).unwrap().unwrap(), vec![0x3a; 65536]);
    let direct = cachevisor_nbd::uri::parse(&format!(
        "nbds+unix:///?socket={}&tls-certificates={}&tls-hostname=storage-7.example",
        tls.display(),
        node.display()
    ))
    .unwrap();
    let mut c = Client::connect_tls(direct.endpoint, "", direct.tls.as_ref().unwrap()).unwrap();
    assert_eq!(c.read(1 << 20, 65536).unwrap().unwrap(), vec![0x5c; 65536]);
    // The certificate does not name this; and another CA's client trusts nothing here.
    let spec = |certs: &Path, extra: &str| {
        format!("nbds+unix:///?socket={}&tls-certificates={}{extra}", tls.display(), certs.display())
    };
    let e = Backing::connect(spec(&node, "&tls-hostname=other.example").as_ref()).err().unwrap().to_string();
    assert!(e.contains("not valid for name"), "{e}");
    let stranger = Pki::new(&dir.path().join("other-pki")).client("x", "/CN=node-1", None, 1);
    let e = Backing::connect(spec(&stranger, "").as_ref()).err().unwrap().to_string();
    // (Both CAs have one subject: the chain fails on the signature.)
    assert!(e.contains("invalid peer certificate: BadSignature"), "{e}");
}

/// curl's (status, body) for `method` on `url`, trusting `ca`.
fn curl_tls(method: &str, url: &str, ca: &Path, token: Option<&str>) -> (u16, String) {
    let mut c = tool("curl");
    c.args(["-s", "-o", "-", "-w", "\n%{http_code}", "-X", method, "--cacert", ca.to_str().unwrap(), url]);
    if let Some(t) = token {
        c.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    let o = c.output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.parse().unwrap_or(0), body.to_string())
}

#[test]
fn the_api_speaks_https_with_the_same_certificate_and_reloads_it() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"));
    let c = ServeConfig::new("1MiB")
        .listen("tls", "require")
        .listen("tls_dir", pki.server_dir().display().to_string())
        .api_key("tls", true)
        .vdisk("a", "a.img", &[("size", s("1MiB"))]);
    let r = serve(&parse(dir.path(), &c));
    let (api, token) = r.api.clone().unwrap();
    let ca = pki.root.join("ca-cert.pem");
    // A client that connects and never says anything holds only its own slot.
    let _quiet = std::net::TcpStream::connect(api).unwrap();
    let (code, body) = curl_tls("GET", &format!("https://localhost:{}/vdisks", api.port()), &ca, None);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"a\""), "{body}");
    // Plain HTTP to the HTTPS port gets no answer.
    let (code, _) = curl_tls("GET", &format!("http://{api}/vdisks"), &ca, None);
    assert_ne!(code, 200);
    // Reload through the API: the token is needed, and the count goes up.
    let url = format!("https://localhost:{}/tls/reload", api.port());
    assert_eq!(curl_tls("POST", &url, &ca, None).0, 401);
    let (code, body) = curl_tls("POST", &url, &ca, Some(&token));
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"reloads\":1"), "{body}");
    std::fs::write(pki.server_dir().join("server-cert.pem"), "garbage").unwrap();
    let (code, body) = curl_tls("POST", &url, &ca, Some(&token));
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("server-cert.pem"), "{body}");
    // api.tls without [listen] TLS is a config error naming the key.
    let e = parse(dir.path(), &ServeConfig::new("1MiB").api_key("tls", true).vdisk("a", "a.img", &[]))
        .resolve()
        .unwrap_err();
    assert!(e.starts_with("api.tls"), "{e}");
}

#[test]
fn tls_runs_over_the_unix_socket_too() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"));
    let a = pki.client("host-a", "/CN=host-a", None, 1);
    let c = ServeConfig::new("1MiB")
        .no_tcp()
        .listen("unix", "nbd.sock")
        .listen("tls", "require")
        .listen("tls_dir", pki.server_dir().display().to_string())
        .vdisk("a", "a.img", &[("size", s("4MiB")), ("write_policy", s("wt"))]);
    let r = serve(&parse(dir.path(), &c));
    assert!(r.uris()[0].starts_with("nbds+unix:///a?socket="), "{:?}", r.uris());
    let sock = dir.path().join("nbd.sock");
    let o = tool("qemu-io")
        .args(["--object", &format!("tls-creds-x509,id=tls0,dir={},endpoint=client", a.display())])
        .args([
            "--image-opts",
            &format!(
                "driver=nbd,server.type=unix,server.path={},export=a,tls-creds=tls0,tls-hostname=localhost",
                sock.display()
            ),
        ])
        .args(["-c", "write -P 0x42 0 64k", "-c", "read -P 0x42 0 64k"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && !text.contains("fail"), "{text}{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read(dir.path().join("a.img")).unwrap()[..65536].iter().all(|&b| b == 0x42));
    // Plaintext over the socket is refused as over TCP.
    let uri = format!("nbd+unix:///a?socket={}", sock.display());
    let o = tool("qemu-io").args(["-f", "raw", "-c", "read 0 512", &uri]).output().unwrap();
    assert!(!o.status.success());
}

#[test]
fn a_tls_1_2_renegotiation_attempt_ends_that_connection_only() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"));
    let a = pki.client("host-a", "/CN=host-a", None, 1);
    let r = tls_serve(dir.path(), &pki, "require", &[("a", &[])]);
    let addr = r.tcp.unwrap();
    // A relay that does the NBD part (greeting, STARTTLS) and then passes bytes through,
    // so openssl s_client can run the TLS session and ask to renegotiate ("R").
    let relay = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let relay_addr = relay.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut client, _) = relay.accept().unwrap();
        let mut server = greet(addr, FLAG_C_FIXED_NEWSTYLE);
        send_option(&mut server, OPT_STARTTLS, &[]);
        assert_eq!(read_option_reply(&mut server).unwrap().1, REP_ACK);
        server.set_read_timeout(None).unwrap();
        let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        std::thread::spawn(move || {
            let mut b = [0u8; 16384];
            while let Ok(n) = c2.read(&mut b) {
                if n == 0 || s2.write_all(&b[..n]).is_err() {
                    break;
                }
            }
            let _ = s2.shutdown(std::net::Shutdown::Write);
        });
        let mut b = [0u8; 16384];
        while let Ok(n) = server.read(&mut b) {
            if n == 0 || client.write_all(&b[..n]).is_err() {
                break;
            }
        }
        let _ = client.shutdown(std::net::Shutdown::Write);
    });
    let mut s_client = std::process::Command::new("openssl")
        .args(["s_client", "-connect", &relay_addr.to_string(), "-tls1_2", "-servername", "localhost"])
        .args([
            "-cert",
            a.join("client-cert.pem").to_str().unwrap(),
            "-key",
            a.join("client-key.pem").to_str().unwrap(),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    s_client.stdin.as_mut().unwrap().write_all(b"R\n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    drop(s_client.stdin.take());
    let o = s_client.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(text.contains("TLSv1.2"), "the session was not TLS 1.2:\n{text}");
    // The server's order, AES-128-GCM first, over s_client's (AES-256 first).
    assert!(text.contains("Cipher is ECDHE-ECDSA-AES128-GCM-SHA256"), "{text}");
    assert!(text.contains("RENEGOTIATING"), "no renegotiation was attempted:\n{text}");
    // rustls answers with the no_renegotiation alert; the session ends there.
    assert!(text.contains("no renegotiation"), "the renegotiation was not refused:\n{text}");
    // Whatever became of that session, the server serves on.
    assert!(qemu_io_tls(addr.port(), "a", &a, &["write -P 1 0 4k", "read -P 1 0 4k"]).0);
}
