//! `[listen]` and `[api]`: where the daemon serves NBD, vhost-user and its HTTP API,
//! with the socket modes, TLS and connection limits.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `[listen]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenConfig {
    /// TCP address.
    pub tcp: Option<String>,
    /// Unix socket path.
    pub unix: Option<PathBuf>,
    /// A directory (it must exist) where every export, vDisk or vSSD, is also a
    /// vhost-user-blk socket `NAME.sock` for QEMU's `-device vhost-user-blk-pci`
    /// (`vhost_user/`); same mode and group as `unix`.
    pub vhost_user: Option<PathBuf>,
    /// The unix socket's file mode, octal (`"0600"`: only the daemon's user connects;
    /// `"0660"` lets its group, e.g. the hypervisor's, connect too). Connecting takes
    /// write permission on the socket.
    #[serde(default = "default_unix_mode")]
    pub unix_mode: String,
    /// The unix socket's group (a name or a number), e.g. the hypervisor's ("kvm",
    /// "libvirt-qemu"); needs `unix_mode = "0660"` and a daemon user in that group (or
    /// root).
    pub unix_group: Option<String>,
    /// How long a connection's reader polls for the next request before it sleeps
    /// (`cachevisor_nbd::polling`; "0" never polls). Polling spares a client that sends request
    /// after request the cost of waking a sleeping CPU; it stops for idle clients and at
    /// most all CPUs but one poll at once. At most 1ms.
    #[serde(default = "default_poll")]
    pub poll: String,
    /// NBD connections at once (each is a thread): 1 to 65536, default 1024; more are
    /// closed at once (logged, counted).
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// How long a client has to finish the NBD handshake: 100ms to 10min, default 10s.
    #[serde(default = "default_handshake_timeout")]
    pub handshake_timeout: String,
    /// NBD over TLS: off (default), on (offered), require (`tls.rs`).
    #[serde(default)]
    pub tls: cachevisor_nbd::tls::TlsMode,
    /// A directory in QEMU's `tls-creds-x509` layout: `server-cert.pem`,
    /// `server-key.pem`, and `ca-cert.pem` (the CA of client certificates).
    pub tls_dir: Option<PathBuf>,
    /// The server certificate chain (PEM), over `tls_dir`'s.
    pub tls_cert: Option<PathBuf>,
    /// The server's private key (PEM), over `tls_dir`'s.
    pub tls_key: Option<PathBuf>,
    /// The CA that signs client certificates (PEM), over `tls_dir`'s.
    pub tls_ca: Option<PathBuf>,
    /// Clients must present a certificate the CA signed (QEMU's `verify-peer`, default
    /// true).
    #[serde(default = "yes")]
    pub tls_verify_peer: bool,
}

fn yes() -> bool {
    true
}

impl ListenConfig {
    /// The TLS credentials `[listen]` names (None when `tls` is off); errors name the key.
    pub fn tls_credentials(&self) -> Result<Option<cachevisor_nbd::tls::Credentials>, String> {
        if self.tls == cachevisor_nbd::tls::TlsMode::Off {
            return Ok(None);
        }
        cachevisor_nbd::tls::Credentials::of(
            self.tls_dir.as_deref(),
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
            self.tls_ca.as_deref(),
            self.tls_verify_peer,
        )
        .map(Some)
    }
}

impl Default for ListenConfig {
    fn default() -> Self {
        ListenConfig {
            tcp: None,
            unix: None,
            vhost_user: None,
            unix_mode: default_unix_mode(),
            unix_group: None,
            poll: default_poll(),
            max_connections: default_max_connections(),
            handshake_timeout: default_handshake_timeout(),
            tls: cachevisor_nbd::tls::TlsMode::Off,
            tls_dir: None,
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            tls_verify_peer: true,
        }
    }
}

fn default_max_connections() -> usize {
    1024
}

fn default_handshake_timeout() -> String {
    "10s".into()
}

fn default_unix_mode() -> String {
    "0600".into()
}

/// `listen.unix_mode` checked: octal permission bits, none for others (a socket anyone
/// can write to is an open door to every vDisk) and none but read/write.
pub fn unix_mode(mode: &str) -> Result<u32, String> {
    let m = u32::from_str_radix(mode.trim().trim_start_matches("0o"), 8)
        .map_err(|_| format!("listen.unix_mode: `{mode}` is not an octal file mode like \"0600\""))?;
    if m & !0o660 != 0 {
        return Err(format!(
            "listen.unix_mode: `{mode}` gives more than read/write to owner and group (0660 at most: other users must not reach the vDisks)"
        ));
    }
    if m & 0o600 != 0o600 {
        return Err(format!("listen.unix_mode: `{mode}` leaves the daemon's own user without read/write"));
    }
    Ok(m)
}

/// `listen.unix_group` resolved to a group id (a name from the system's group database,
/// or a number), checked against `mode`: a group that cannot read and write the socket
/// would be given nothing.
pub fn unix_group(group: &str, mode: u32) -> Result<u32, String> {
    let gid = match group.parse::<u32>() {
        Ok(n) => n,
        Err(_) => nix::unistd::Group::from_name(group)
            .map_err(|e| format!("listen.unix_group: looking up `{group}`: {e}"))?
            .ok_or_else(|| format!("listen.unix_group: no group named `{group}` on this system"))?
            .gid
            .as_raw(),
    };
    check_group_mode(group, mode)?;
    Ok(gid)
}

/// A socket group needs read and write for the group in the socket's mode.
pub(super) fn check_group_mode(group: &str, mode: u32) -> Result<(), String> {
    if mode & 0o060 != 0o060 {
        return Err(format!(
            "listen.unix_group: `{group}` would get no access with unix_mode {mode:04o}: set unix_mode = \"0660\""
        ));
    }
    Ok(())
}

fn default_poll() -> String {
    "50us".into()
}

/// `[api]`: the HTTP control API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiConfig {
    /// Address (loopback).
    pub listen: String,
    /// Bearer token for mutating calls; a random one is generated when absent.
    pub token: Option<String>,
    /// A connection that sends and receives nothing for this long is closed.
    #[serde(default = "default_api_idle_timeout")]
    pub idle_timeout: String,
    /// HTTPS with `[listen]`'s TLS certificate and key (no client certificates: the
    /// token authenticates).
    #[serde(default)]
    pub tls: bool,
}

impl ApiConfig {
    /// The API on `listen` with the defaults (a random token).
    pub fn on(listen: &str) -> ApiConfig {
        ApiConfig { listen: listen.into(), token: None, tls: false, idle_timeout: default_api_idle_timeout() }
    }
}

fn default_api_idle_timeout() -> String {
    "30s".into()
}
