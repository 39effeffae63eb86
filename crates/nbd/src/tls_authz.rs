//! Who a TLS client is, and which exports it may open: the identity read from the client
//! certificate a verified mutual-TLS handshake presented (its subject's distinguished
//! name and its subject alternative names), and a vDisk's `allow` list matched against
//! it — QEMU's `tls-authz` idea (an allow-list of client DNs) per export, so one tenant's
//! host cannot open another tenant's vDisk.
//!
//! Entry forms (one string each):
//! - a distinguished name, RFC 4514 style: `"CN=host-a"`, `"CN=host-a,O=tenant1"`. Every
//!   `attribute=value` pair given must be in the certificate's subject (attribute names
//!   are case-insensitive; values compare exactly); the order does not matter, so QEMU's
//!   and OpenSSL's orders both work. Commas or plus signs inside a value are escaped
//!   `\,` / `\+` as RFC 4514 writes them.
//! - a subject alternative name: `"DNS:host-a.example"`, `"IP:10.0.0.2"`,
//!   `"URI:spiffe://tenant1/host-a"`, `"email:ops@example"`, exactly as `openssl x509
//!   -text` prints them.
//! - `"*"`: any client the CA verified.
//!
//! Written by hand: the matching is the policy here; the certificate parsing is
//! `x509-parser`'s.

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// A verified client's names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// Subject attributes, `(short name upper-cased, value)`, e.g. `("CN", "host-a")`.
    pub subject: Vec<(String, String)>,
    /// Subject alternative names as `KIND:value` (`DNS:`, `IP:`, `URI:`, `email:`).
    pub alt_names: Vec<String>,
}

impl Identity {
    /// The identity in a client certificate (DER), or why it cannot be read.
    pub fn from_der(der: &[u8]) -> Result<Identity, String> {
        let (_, cert) =
            X509Certificate::from_der(der).map_err(|e| format!("the client certificate cannot be parsed: {e}"))?;
        let registry = x509_parser::objects::oid_registry();
        let mut subject = Vec::new();
        for rdn in cert.subject().iter() {
            for atv in rdn.iter() {
                let name = x509_parser::objects::oid2abbrev(atv.attr_type(), registry)
                    .map(|s| s.to_ascii_uppercase())
                    .unwrap_or_else(|_| atv.attr_type().to_id_string());
                // "emailAddress" is abbreviated by OpenSSL as "emailAddress"; keep both cases simple.
                let value = atv.as_str().map(str::to_owned).unwrap_or_else(|_| hex(atv.attr_value().data));
                subject.push((name, value));
            }
        }
        let mut alt_names = Vec::new();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for n in &san.value.general_names {
                match n {
                    GeneralName::DNSName(s) => alt_names.push(format!("DNS:{s}")),
                    GeneralName::URI(s) => alt_names.push(format!("URI:{s}")),
                    GeneralName::RFC822Name(s) => alt_names.push(format!("email:{s}")),
                    GeneralName::IPAddress(b) => {
                        if let Some(ip) = ip_of(b) {
                            alt_names.push(format!("IP:{ip}"));
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(Identity { subject, alt_names })
    }

    /// The subject as one RFC 4514-style line, for logs ("CN=host-a,O=tenant1").
    pub fn describe(&self) -> String {
        let dn: Vec<String> = self.subject.iter().rev().map(|(k, v)| format!("{k}={v}")).collect();
        if dn.is_empty() {
            self.alt_names.join(",")
        } else {
            dn.join(",")
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn ip_of(b: &[u8]) -> Option<std::net::IpAddr> {
    match b.len() {
        4 => Some(std::net::IpAddr::from(<[u8; 4]>::try_from(b).ok()?)),
        16 => Some(std::net::IpAddr::from(<[u8; 16]>::try_from(b).ok()?)),
        _ => None,
    }
}

/// One checked `allow` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Any,
    Subject(Vec<(String, String)>),
    AltName(String),
}

/// Splits `s` at unescaped `sep`s, unescaping `\x` to `x`.
fn split_escaped(s: &str, sep: &[char]) -> Vec<String> {
    let (mut parts, mut cur, mut chars) = (Vec::new(), String::new(), s.chars());
    while let Some(c) = chars.next() {
        match c {
            '\\' => cur.extend(chars.next()),
            c if sep.contains(&c) => parts.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    parts.push(cur);
    parts
}

fn parse(entry: &str) -> Result<Entry, String> {
    let e = entry.trim();
    if e == "*" {
        return Ok(Entry::Any);
    }
    for kind in ["DNS:", "IP:", "URI:", "email:"] {
        if let Some(v) = e.strip_prefix(kind).filter(|v| !v.is_empty()) {
            let v = if kind == "IP:" {
                v.parse::<std::net::IpAddr>().map_err(|_| format!("`{entry}`: `{v}` is not an IP address"))?.to_string()
            } else {
                v.to_owned()
            };
            return Ok(Entry::AltName(format!("{kind}{v}")));
        }
    }
    let mut pairs = Vec::new();
    for part in split_escaped(e, &[',', '+']) {
        let Some((k, v)) = part.split_once('=') else {
            return Err(format!(
                "`{entry}`: `{part}` is not ATTRIBUTE=value (entries are \"CN=name,O=org\", \"DNS:name\", \"IP:addr\", \"URI:uri\", \"email:addr\" or \"*\")"
            ));
        };
        let k = k.trim().to_ascii_uppercase();
        if k.is_empty() || v.trim().is_empty() {
            return Err(format!("`{entry}`: `{part}` has an empty attribute or value"));
        }
        pairs.push((k, v.trim().to_owned()));
    }
    Ok(Entry::Subject(pairs))
}

/// Checks an `allow` list; the error names the bad entry.
pub fn check(allow: &[String]) -> Result<(), String> {
    allow.iter().try_for_each(|e| parse(e).map(drop))
}

/// Whether a client with `who` (None: no verified certificate) may open an export whose
/// `allow` list is `allow` (empty: any client that passed the server's TLS policy).
pub fn allows(allow: &[String], who: Option<&Identity>) -> bool {
    if allow.is_empty() {
        return true;
    }
    let Some(who) = who else { return false };
    allow.iter().filter_map(|e| parse(e).ok()).any(|e| match e {
        Entry::Any => true,
        Entry::AltName(n) => who.alt_names.contains(&n),
        Entry::Subject(pairs) => pairs.iter().all(|p| who.subject.contains(p)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(subject: &[(&str, &str)], alt: &[&str]) -> Identity {
        Identity {
            subject: subject.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            alt_names: alt.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn entries_match_subject_pairs_in_any_order_and_alt_names_exactly() {
        let a = who(&[("C", "GB"), ("O", "tenant1"), ("CN", "host-a")], &["DNS:host-a.example", "IP:10.0.0.2"]);
        let list = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(allows(&list(&["CN=host-a"]), Some(&a)));
        assert!(allows(&list(&["o=tenant1, CN=host-a"]), Some(&a)));
        assert!(allows(&list(&["CN=host-a,O=tenant1,C=GB"]), Some(&a)));
        assert!(!allows(&list(&["CN=host-a,O=tenant2"]), Some(&a)));
        assert!(!allows(&list(&["CN=host-b"]), Some(&a)));
        assert!(!allows(&list(&["CN=host-"]), Some(&a)), "a prefix is not a match");
        assert!(allows(&list(&["CN=host-b", "DNS:host-a.example"]), Some(&a)));
        assert!(allows(&list(&["IP:10.0.0.2"]), Some(&a)));
        assert!(!allows(&list(&["DNS:host-b.example"]), Some(&a)));
        assert!(allows(&list(&["*"]), Some(&a)));
        assert!(!allows(&list(&["*"]), None), "a list needs a verified certificate");
        assert!(allows(&[], None), "no list: the server's TLS policy decides alone");
        // Escaped commas belong to the value.
        let b = who(&[("O", "Acme, Inc."), ("CN", "b")], &[]);
        assert!(allows(&list(&["O=Acme\\, Inc.,CN=b"]), Some(&b)));
    }

    #[test]
    fn bad_entries_are_named() {
        let e = check(&["CN=a".into(), "host-a".into()]).unwrap_err();
        assert!(e.contains("`host-a`") && e.contains("ATTRIBUTE=value"), "{e}");
        assert!(check(&["IP:nope".into()]).unwrap_err().contains("not an IP address"));
        assert!(check(&["CN=".into()]).unwrap_err().contains("empty"));
        assert!(check(&["*".into(), "DNS:x".into(), "URI:spiffe://t/h".into()]).is_ok());
    }
}
