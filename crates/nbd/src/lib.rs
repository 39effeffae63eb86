//! The NBD protocol (the NBD project's proto.md) and its TLS: the wire format
//! ([`proto`], [`structured`]), the server's negotiation ([`handshake`]) and request loop
//! ([`transmission`]) over any [`backend::ExportBackend`], a client ([`client`], [`uri`])
//! for NBD backing stores and peers, and TLS with client certificates ([`tls`],
//! [`tls_authz`], [`tls_stream`]). It knows exports only through the backend trait and
//! [`handshake::Exports`]: never the daemon, the cache or the engine.

#![warn(unreachable_pub)]

pub mod backend;
pub mod client;
pub mod endpoint;
pub mod handshake;
pub mod option_replay;
pub mod polling;
pub mod proto;
pub mod structured;
pub mod tls;
pub mod tls_authz;
pub mod tls_chain_only;
pub mod tls_stream;
pub mod transmission;
pub mod uri;

/// `s` with control characters (a NUL, a newline) and non-printing ones escaped, for a
/// log line or a message that quotes what a client or a file named.
pub fn log_safe(s: &str) -> String {
    s.escape_debug().to_string()
}
