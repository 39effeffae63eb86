//! The NBD front end: wire format ([`proto`]), negotiation ([`handshake`]) and the
//! request loop ([`transmission_async`], on the data path's asynchronous API).

pub mod client;
pub mod endpoint;
pub mod export_backend;
pub mod handshake;
pub mod option_replay;
pub mod polling;
pub mod proto;
pub mod structured;
pub mod tls_stream;
pub mod transmission_async;
pub mod uri;
