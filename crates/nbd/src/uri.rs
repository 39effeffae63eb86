//! NBD URIs as libnbd, nbdinfo and QEMU's `nbd:` block driver write them (the NBD URI
//! spec in the protocol's `uri.md`): what a vDisk's `backing` names when its data lives on
//! another NBD server.
//!
//! - `nbd://HOST[:PORT]/EXPORT` — TCP, port 10809 by default;
//! - `nbds://HOST[:PORT]/EXPORT?tls-certificates=DIR` — TCP with TLS required;
//! - `nbd+unix:///EXPORT?socket=PATH` — a unix socket;
//! - `nbds+unix:///EXPORT?socket=PATH&tls-certificates=DIR` — TLS over a unix socket.
//!
//! DIR is in QEMU's client layout: `ca-cert.pem`, and `client-cert.pem` with
//! `client-key.pem` when the server verifies clients. Over TCP the server's certificate
//! must name HOST; `tls-hostname=NAME` names another (a proxy in between). On a unix socket
//! there is no host: with `tls-hostname` the certificate must name it, without it the chain
//! to the CA is checked and the name is not (libnbd's rule; `tls_chain_only`). Escapes
//! (`%2F`) are decoded in the export name and the query's values.

use super::client::TlsClient;
use super::endpoint::Endpoint;
use std::io;
use std::path::PathBuf;

/// NBD's IANA port.
pub const DEFAULT_PORT: u16 = 10809;

/// A parsed NBD URI.
#[derive(Clone)]
pub struct NbdUri {
    /// Where the server is.
    pub endpoint: Endpoint,
    /// The export's name.
    pub export: String,
    /// TLS settings for `nbds` schemes.
    pub tls: Option<TlsClient>,
}

/// Whether a backing spec is an NBD URI (any of the four schemes).
pub fn is_uri(spec: &std::path::Path) -> bool {
    spec.to_str().is_some_and(|s| ["nbd://", "nbds://", "nbd+unix://", "nbds+unix://"].iter().any(|p| s.starts_with(p)))
}

fn bad(m: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, m)
}

/// Parses `s` (see the top comment); errors name the part that is wrong.
pub fn parse(s: &str) -> io::Result<NbdUri> {
    let u = url::Url::parse(s).map_err(|e| bad(format!("`{s}` is not a URI: {e}")))?;
    let (tls, unix) = match u.scheme() {
        "nbd" => (false, false),
        "nbds" => (true, false),
        "nbd+unix" => (false, true),
        "nbds+unix" => (true, true),
        other => {
            return Err(bad(format!("`{s}`: scheme `{other}` is not nbd, nbds, nbd+unix or nbds+unix")));
        }
    };
    let decode = |v: &str| percent_decode(v).map_err(|e| bad(format!("`{s}`: {e}")));
    let export = decode(u.path().strip_prefix('/').unwrap_or(u.path()))?;
    let (mut socket, mut certs, mut hostname) = (None, None, None);
    // Not `query_pairs`: it reads `+` as a space (HTML forms' rule), which a socket path
    // must not get.
    for kv in u.query().unwrap_or_default().split('&').filter(|kv| !kv.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        let v = decode(v)?;
        match k {
            "socket" if unix => socket = Some(PathBuf::from(v)),
            "tls-certificates" if tls => certs = Some(PathBuf::from(v)),
            "tls-hostname" if tls => hostname = Some(v),
            _ => {
                let takes = match (tls, unix) {
                    (false, false) => "nbd:// takes no query",
                    (true, false) => "nbds:// takes tls-certificates=DIR and tls-hostname=NAME",
                    (false, true) => "nbd+unix:// takes socket=PATH",
                    (true, true) => "nbds+unix:// takes socket=PATH, tls-certificates=DIR and tls-hostname=NAME",
                };
                return Err(bad(format!("`{s}`: `{k}={v}` is not understood ({takes})")));
            }
        }
    }
    let endpoint = if unix {
        if u.host_str().is_some_and(|h| !h.is_empty()) || u.port().is_some() {
            return Err(bad(format!(
                "`{s}`: a unix-socket URI names no host (write {}:///EXPORT?socket=PATH)",
                u.scheme()
            )));
        }
        Endpoint::Unix(socket.ok_or_else(|| bad(format!("`{s}`: {}:// needs ?socket=PATH", u.scheme())))?)
    } else {
        let host = u.host_str().filter(|h| !h.is_empty()).ok_or_else(|| bad(format!("`{s}`: no HOST")))?;
        let port = u.port().unwrap_or(DEFAULT_PORT);
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let addr = std::net::ToSocketAddrs::to_socket_addrs(&(bare, port))
            .map_err(|e| bad(format!("`{s}`: `{host}` does not resolve ({e})")))?
            .next()
            .ok_or_else(|| bad(format!("`{s}`: `{host}` resolves to no address")))?;
        hostname.get_or_insert_with(|| bare.to_owned());
        Endpoint::Tcp(addr)
    };
    let tls = match (tls, certs) {
        (false, _) => None,
        (true, None) => {
            return Err(bad(format!(
                "`{s}`: {}:// needs tls-certificates=DIR (ca-cert.pem, client-cert.pem, client-key.pem)",
                u.scheme()
            )))
        }
        (true, Some(dir)) => {
            let mut creds = crate::tls::ClientCredentials::in_dir(&dir);
            creds.check_name = hostname.is_some();
            let config = crate::tls::client_config(&creds, "tls-certificates").map_err(bad)?;
            Some(TlsClient { config, server_name: hostname.unwrap_or_else(|| "localhost".into()) })
        }
    };
    Ok(NbdUri { endpoint, export, tls })
}

/// Decodes `%XX` escapes (the URL parser leaves them in a non-special scheme's path).
fn percent_decode(v: &str) -> Result<String, String> {
    let mut out = Vec::with_capacity(v.len());
    let b = v.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = v.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
            out.push(hex.ok_or_else(|| format!("`{}` is not a %XX escape", &v[i..(i + 3).min(v.len())]))?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("`{v}` does not decode to UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_forms() {
        let u = parse("nbd://127.0.0.1:10900/vm%201").unwrap();
        assert_eq!(u.endpoint, Endpoint::Tcp("127.0.0.1:10900".parse().unwrap()));
        assert_eq!(u.export, "vm 1");
        assert!(u.tls.is_none());
        let u = parse("nbd://[::1]/").unwrap();
        assert_eq!(u.endpoint, Endpoint::Tcp("[::1]:10809".parse().unwrap()));
        assert_eq!(u.export, "");
    }

    #[test]
    fn unix_forms() {
        let u = parse("nbd+unix:///disk?socket=/run/x%20y+z.sock").unwrap();
        assert_eq!(u.endpoint, Endpoint::Unix("/run/x y+z.sock".into()));
        assert_eq!(u.export, "disk");
        let u = parse("nbd+unix://?socket=/s").unwrap();
        assert_eq!(u.export, "");
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let e = |s: &str| parse(s).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e("nbd+unix:///x").contains("needs ?socket=PATH"), "{}", e("nbd+unix:///x"));
        assert!(e("nbd+unix://host/x?socket=/s").contains("names no host"));
        assert!(e("nbd://h:1/x?socket=/s").contains("`socket=/s` is not understood (nbd:// takes no query)"));
        assert!(e("nbds://127.0.0.1:1/x").contains("needs tls-certificates=DIR"));
        assert!(e("nbds+unix:///x?socket=/s").contains("needs tls-certificates=DIR"));
        assert!(e("nbd+unix:///x?socket=/s&tls-certificates=/d").contains("takes socket=PATH"));
        assert!(e("http://h/x").contains("scheme `http`"));
        assert!(e("nbd://127.0.0.1:1/a%zz").contains("`%zz` is not a %XX escape"));
        assert!(e("nbds+unix:///x?socket=/s&tls-certificates=/nonexistent").contains("/nonexistent/ca-cert.pem"));
        assert!(is_uri("nbds+unix:///x?socket=/s".as_ref()) && !is_uri("/var/nbd://x".as_ref()));
    }
}
