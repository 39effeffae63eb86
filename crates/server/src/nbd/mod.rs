//! The NBD front end: wire format ([`proto`]), negotiation ([`handshake`]) and the
//! request loop ([`transmission`]).

pub mod client;
pub mod handshake;
pub mod proto;
pub mod transmission;
