//! Certificates the TLS tests make for themselves with `openssl` (a CA, a server
//! certificate for 127.0.0.1/localhost, client certificates with chosen names, a
//! self-signed one, an expired one), laid out as QEMU's `tls-creds-x509` directories:
//! `server/` (ca-cert.pem, server-cert.pem, server-key.pem) and one client directory per
//! client (ca-cert.pem, client-cert.pem, client-key.pem), which libnbd's
//! `tls-certificates=` reads too. `bench serve --tls` makes the same PKI.

use std::path::{Path, PathBuf};

/// A test CA in a directory.
pub struct Pki {
    /// Where everything is.
    pub root: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let o = std::process::Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("running openssl (apt-get install openssl; scripts/test does)");
    assert!(o.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
}

/// A new P-256 key, unencrypted, written to the path that follows.
const NEW_KEY: [&str; 6] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout"];

fn key_and_csr(dir: &Path, key: &str, subject: &str) {
    openssl(dir, &[&["req"][..], &NEW_KEY, &[key, "-out", "req.csr", "-subj", subject]].concat());
}

/// A self-signed certificate `cert` with key `key` for `subject` in `dir`, with `extra`
/// arguments (extensions).
fn self_signed_cert(dir: &Path, key: &str, cert: &str, subject: &str, days: &str, extra: &[&str]) {
    let mut args = [&["req", "-x509"][..], &NEW_KEY, &[key, "-out", cert, "-subj", subject, "-days", days]].concat();
    args.extend_from_slice(extra);
    openssl(dir, &args);
}

/// Signs `dir/req.csr` with the CA in `ca_dir` into `dir/out` with extensions `ext`.
fn sign(ca_dir: &Path, dir: &Path, out: &str, ext: &str, days: i32) {
    std::fs::write(dir.join("ext.cnf"), ext).unwrap();
    let (ca, ca_key) = (ca_dir.join("ca-cert.pem"), ca_dir.join("ca-key.pem"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "req.csr",
            "-CA",
            ca.to_str().unwrap(),
            "-CAkey",
            ca_key.to_str().unwrap(),
            "-CAcreateserial",
            "-out",
            out,
            "-days",
            &days.to_string(),
            "-extfile",
            "ext.cnf",
        ],
    );
}

/// Alt names that name this machine.
pub const LOCAL: &str = "DNS:localhost,IP:127.0.0.1";

impl Pki {
    /// A CA and a server certificate (CN=localhost, SAN DNS:localhost, IP:127.0.0.1)
    /// under `root`.
    pub fn new(root: &Path) -> Pki {
        std::fs::create_dir_all(root).unwrap();
        self_signed_cert(
            root,
            "ca-key.pem",
            "ca-cert.pem",
            "/CN=cachevisor test CA",
            "2",
            &["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        );
        let pki = Pki { root: root.to_path_buf() };
        pki.server("server", "/CN=localhost", LOCAL);
        pki
    }

    /// A server directory `name` whose certificate has `subject` and alt names `san`
    /// ("DNS:localhost,IP:127.0.0.1" for one that names this machine).
    pub fn server(&self, name: &str, subject: &str, san: &str) -> PathBuf {
        let d = self.root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        key_and_csr(&d, "server-key.pem", subject);
        sign(
            &self.root,
            &d,
            "server-cert.pem",
            &format!("subjectAltName={san}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"),
            1,
        );
        std::fs::copy(self.root.join("ca-cert.pem"), d.join("ca-cert.pem")).unwrap();
        d
    }

    /// The server directory.
    pub fn server_dir(&self) -> PathBuf {
        self.root.join("server")
    }

    /// A client directory `name` with a certificate for `subject` (e.g.
    /// "/O=tenant1/CN=host-a") and alt names `san` (e.g. "DNS:host-a.example"), valid for
    /// `days` (negative: already expired).
    pub fn client(&self, name: &str, subject: &str, san: Option<&str>, days: i32) -> PathBuf {
        let d = self.root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        key_and_csr(&d, "client-key.pem", subject);
        let mut ext = "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n".to_string();
        if let Some(s) = san {
            ext += &format!("subjectAltName={s}\n");
        }
        sign(&self.root, &d, "client-cert.pem", &ext, days);
        std::fs::copy(self.root.join("ca-cert.pem"), d.join("ca-cert.pem")).unwrap();
        d
    }

    /// A client directory with only the CA (no client certificate).
    pub fn anonymous(&self, name: &str) -> PathBuf {
        let d = self.root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(self.root.join("ca-cert.pem"), d.join("ca-cert.pem")).unwrap();
        d
    }

    /// A client directory whose certificate (`subject`) signs itself: no CA vouches for it.
    pub fn self_signed(&self, name: &str, subject: &str) -> PathBuf {
        let d = self.anonymous(name);
        self_signed_cert(&d, "client-key.pem", "client-cert.pem", subject, "1", &[]);
        d
    }
}
