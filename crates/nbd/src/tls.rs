//! TLS credentials for the NBD listeners: `[listen] tls = "off" | "on" | "require"`
//! (nbdkit's three modes), the server certificate, its key and the CA that verifies
//! client certificates, read from PEM files — QEMU's `tls-creds-x509` directory layout
//! (`ca-cert.pem`, `server-cert.pem`, `server-key.pem`) as is, or one path per file — into
//! a rustls server configuration. [`ServerTls::reload`] re-reads the files (SIGHUP, the
//! API): new connections use the new certificate, connections already up keep theirs.
//!
//! The library is rustls (with `ring`): maintained, memory-safe, no system OpenSSL or
//! GnuTLS to link. It has no external pre-shared keys (rustls issue #174, open since
//! 2018), so nbdkit's `--tls-psk` has no equivalent here: certificates (mutual TLS for
//! node-to-node traffic) are the credential.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// Whether the NBD listeners offer TLS (nbdkit's `--tls`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// Plaintext only; `NBD_OPT_STARTTLS` is refused with `NBD_REP_ERR_POLICY`.
    #[default]
    Off,
    /// Offered: a client may start TLS or stay in plaintext.
    On,
    /// Required: before TLS, every option but STARTTLS and ABORT gets
    /// `NBD_REP_ERR_TLS_REQD` and no export is served.
    Require,
}

/// Where the credentials are and whether clients must present a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The server's certificate chain (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA certificates that sign client certificates (PEM), if any.
    pub ca: Option<PathBuf>,
    /// Clients must present a certificate the CA signed (QEMU's `verify-peer`).
    pub verify_peer: bool,
}

impl Credentials {
    /// The credentials `[listen]` names: `tls_dir` in QEMU's layout, each file overridable
    /// by `tls_cert`, `tls_key`, `tls_ca`. Errors name the key.
    pub fn of(
        dir: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
        ca: Option<&Path>,
        verify_peer: bool,
    ) -> Result<Credentials, String> {
        let pick = |given: Option<&Path>, file: &str, k: &str| -> Result<Option<PathBuf>, String> {
            match (given, dir) {
                (Some(p), _) => Ok(Some(p.to_path_buf())),
                (None, Some(d)) => {
                    let p = d.join(file);
                    Ok(p.exists().then_some(p))
                }
                (None, None) => Err(format!("listen.{k}: give it, or listen.tls_dir holding {file}")),
            }
        };
        let need = |p: Option<PathBuf>, file: &str| {
            p.ok_or_else(|| {
                format!("listen.tls_dir: {} has no {file}", dir.map_or(String::new(), |d| d.display().to_string()))
            })
        };
        let cert = need(pick(cert, "server-cert.pem", "tls_cert")?, "server-cert.pem")?;
        let key = need(pick(key, "server-key.pem", "tls_key")?, "server-key.pem")?;
        let ca = match (ca, dir) {
            (Some(p), _) => Some(p.to_path_buf()),
            (None, Some(d)) => Some(d.join("ca-cert.pem")).filter(|p| p.exists()),
            (None, None) => None,
        };
        if verify_peer && ca.is_none() {
            return Err("listen.tls_verify_peer: verifying client certificates needs a CA (listen.tls_ca, or ca-cert.pem in listen.tls_dir); set tls_verify_peer = false to let clients in without one".into());
        }
        Ok(Credentials { cert, key, ca, verify_peer })
    }
}

fn read_certs(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = cachevisor_files::bounded_read::read(path, cachevisor_files::bounded_read::PEM_CAP)
        .map_err(|e| format!("listen.{key}: {}: {e}", path.display()))?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("listen.{key}: {}: not PEM certificates: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("listen.{key}: {} holds no certificate (PEM \"BEGIN CERTIFICATE\")", path.display()));
    }
    Ok(certs)
}

/// The private key in PEM file `path` (a regular file of at most `PEM_CAP` bytes).
fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let pem = cachevisor_files::bounded_read::read(path, cachevisor_files::bounded_read::PEM_CAP)
        .map_err(|e| e.to_string())?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| format!("no private key read: {e}"))
}

/// ring's cipher suites with AES-128-GCM first: the server picks (`ignore_client_order`),
/// and AES-128 costs both ends less CPU per byte than AES-256 (GnuTLS clients such as
/// QEMU's and libnbd's list AES-256 first), while being the TLS 1.3 suite every client
/// must support.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites.sort_by_key(|s| {
        !matches!(
            s.suite(),
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
                | rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        )
    });
    Arc::new(p)
}

/// A rustls server configuration built from the files `c` names (client certificates
/// checked when `clients` is set; the HTTP API has its token instead); the error names
/// the key and the file.
pub fn server_config(c: &Credentials, clients: bool) -> Result<Arc<ServerConfig>, String> {
    let provider = provider();
    let certs = read_certs(&c.cert, "tls_cert")?;
    cachevisor_files::private_files::check_file_mode(
        &c.key,
        "listen.tls_key",
        "the server's private key",
        0o007,
        "users outside its group",
        640,
    )?;
    let key = read_key(&c.key).map_err(|e| format!("listen.tls_key: {}: {e}", c.key.display()))?;
    if let Some(until) = expired(&certs[0]) {
        tracing::warn!(cert = %c.cert.display(), %until, "the server certificate is not valid now: clients will refuse it");
    }
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match c.ca.as_ref().filter(|_| clients) {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in read_certs(ca, "tls_ca")? {
                roots.add(cert).map_err(|e| format!("listen.tls_ca: {}: {e}", ca.display()))?;
            }
            let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let v = if c.verify_peer { v } else { v.allow_unauthenticated() };
            builder.with_client_cert_verifier(v.build().map_err(|e| format!("listen.tls_ca: {}: {e}", ca.display()))?)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("listen.tls_cert / tls_key: {} with {}: {e}", c.cert.display(), c.key.display()))?;
    config.ignore_client_order = true; // our order: AES-128-GCM first (see `provider`)
    Ok(Arc::new(config))
}

/// When a certificate stopped (or starts) being valid, if not valid now.
fn expired(cert: &CertificateDer<'_>) -> Option<String> {
    use x509_parser::prelude::FromDer;
    let (_, x) = x509_parser::certificate::X509Certificate::from_der(cert).ok()?;
    (!x.validity().is_valid()).then(|| format!("{} to {}", x.validity().not_before, x.validity().not_after))
}

/// The NBD listeners' TLS: the mode and the current server configuration.
#[derive(Debug)]
pub struct ServerTls {
    /// Off, on or require.
    pub mode: TlsMode,
    creds: Credentials,
    /// (NBD, HTTPS API) configurations.
    current: RwLock<(Arc<ServerConfig>, Arc<ServerConfig>)>,
    reloads: std::sync::atomic::AtomicU64,
}

/// Both configurations from `c`.
fn both(c: &Credentials) -> Result<(Arc<ServerConfig>, Arc<ServerConfig>), String> {
    let mut api = server_config(c, false)?;
    Arc::get_mut(&mut api).expect("fresh").alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((server_config(c, true)?, api))
}

impl ServerTls {
    /// Loads the credentials (mode `On` or `Require`).
    pub fn load(mode: TlsMode, creds: Credentials) -> Result<ServerTls, String> {
        let configs = both(&creds)?;
        Ok(ServerTls { mode, creds, current: RwLock::new(configs), reloads: 0.into() })
    }

    /// The configuration a new NBD connection uses.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).0.clone()
    }

    /// The configuration a new HTTPS API connection uses (same certificate, no client
    /// certificates: the API's token authenticates).
    pub fn api_config(&self) -> Arc<ServerConfig> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).1.clone()
    }

    /// Re-reads the certificate, key and CA files: new connections use them; connections
    /// already up keep the keys they agreed. A file that cannot be read or does not fit
    /// leaves the current configuration in place (the error says why).
    pub fn reload(&self) -> Result<(), String> {
        let configs = both(&self.creds)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = configs;
        self.reloads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(cert = %self.creds.cert.display(), "TLS certificates reloaded");
        Ok(())
    }

    /// Successful reloads since start.
    pub fn reloads(&self) -> u64 {
        self.reloads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether clients must present a verified certificate.
    pub fn verifies_peers(&self) -> bool {
        self.creds.verify_peer
    }
}

/// A client's credentials: the CA that signs the server's certificate, and the client's
/// own certificate and key when the server verifies peers. QEMU's client layout
/// (`ca-cert.pem`, `client-cert.pem`, `client-key.pem` in one directory) gives all three.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCredentials {
    /// CA certificates the server's chain must lead to (PEM).
    pub ca: PathBuf,
    /// The client certificate chain and its key (PEM), if the client presents one.
    pub cert_key: Option<(PathBuf, PathBuf)>,
    /// Whether the server's certificate must name the server dialled. Off only for a
    /// unix socket given no `tls-hostname` (libnbd's rule; see `tls_chain_only`).
    pub check_name: bool,
}

impl ClientCredentials {
    /// The credentials in a directory in QEMU's client layout (the client certificate is
    /// optional).
    pub fn in_dir(dir: &Path) -> ClientCredentials {
        let (cert, key) = (dir.join("client-cert.pem"), dir.join("client-key.pem"));
        ClientCredentials {
            ca: dir.join("ca-cert.pem"),
            cert_key: (cert.exists() && key.exists()).then_some((cert, key)),
            check_name: true,
        }
    }
}

/// A rustls client configuration from `c`; `at` names where the paths came from in errors.
pub fn client_config(c: &ClientCredentials, at: &str) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = provider();
    let mut roots = rustls::RootCertStore::empty();
    for cert in read_certs(&c.ca, "tls_ca").map_err(|e| format!("{at}: {e}"))? {
        roots.add(cert).map_err(|e| format!("{at}: {}: {e}", c.ca.display()))?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = if c.check_name {
        builder.with_root_certificates(roots)
    } else {
        let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| format!("{at}: {}: {e}", c.ca.display()))?;
        builder.dangerous().with_custom_certificate_verifier(Arc::new(crate::tls_chain_only::ChainOnly(webpki)))
    };
    let config = match &c.cert_key {
        Some((cert, key)) => {
            let certs = read_certs(cert, "tls_cert").map_err(|e| format!("{at}: {e}"))?;
            let k = read_key(key).map_err(|e| format!("{at}: {}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(certs, k)
                .map_err(|e| format!("{at}: {} with {}: {e}", cert.display(), key.display()))?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}
