//! The NBD front end: wire format ([`proto`]), negotiation ([`handshake`]) and the
//! request loop ([`transmission`] on the daemon; [`transmission_async`] on the data path
//! the daemon moves to).

pub mod client;
pub mod handshake;
pub mod proto;
pub mod transmission;
pub mod transmission_async;
