//! Accept loops: TCP (loopback by default) and unix sockets, one thread per connection,
//! at most `listen.max_connections` at once, each handshake done within
//! `listen.handshake_timeout` (`conn_limits.rs`). A connection's failure (protocol
//! violation, client vanishing) ends only that connection; the server keeps serving the
//! others.

use crate::daemon::metrics::latency_of;
use crate::daemon::Daemon;
use crate::process::conn_limits::{is_timeout, ConnLimit, Deadline, Timed};
use cachevisor_nbd::handshake::{greet, options, Exports, Negotiated};
use cachevisor_nbd::polling::{Pollers, PollingReader};
use cachevisor_nbd::tls::{ServerTls, TlsMode};
use cachevisor_nbd::tls_authz::Identity;
use cachevisor_nbd::tls_stream;
use cachevisor_nbd::transmission::serve;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a server's connections poll for requests (`cachevisor_nbd::polling`), and its limits.
#[derive(Debug, Clone)]
pub(crate) struct Polling {
    /// How long a reader polls before it sleeps (zero: never).
    pub poll: Duration,
    /// The readers that may poll at once.
    pub pollers: Arc<Pollers>,
    /// Established connections at once (TCP and unix together).
    pub limit: Arc<ConnLimit>,
    /// Connections still in their handshake, apart from the established ones
    /// (`preauth.rs`).
    pub preauth: Arc<crate::process::preauth::PreAuth>,
    /// How long a client has to finish the handshake (TLS's included).
    pub handshake_timeout: Duration,
    /// TLS, when `listen.tls` is on or require.
    pub tls: Option<Arc<ServerTls>>,
}

/// A stream whose halves can be used apart (TCP and unix sockets).
pub(crate) trait Split: Read + Write + Sized {
    /// A second handle on the same connection.
    fn split(&self) -> std::io::Result<Self>;
    /// Shuts the connection down (from another thread: its blocked reads end).
    fn shut(&self);
}

impl Split for std::net::TcpStream {
    fn split(&self) -> std::io::Result<Self> {
        self.try_clone()
    }
    fn shut(&self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }
}

impl Split for std::os::unix::net::UnixStream {
    fn split(&self) -> std::io::Result<Self> {
        self.try_clone()
    }
    fn shut(&self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }
}

/// The daemon's exports for one connection's handshake, which leaves the pool of
/// connections in their handshake (`preauth.rs`) before its client is told it is
/// connected: a connection evicted after that reply (its thread slow to leave) was a
/// served client closed under its first request.
struct Leaving<'a> {
    d: &'a Daemon,
    place: &'a crate::process::preauth::Place,
}

impl Exports for Leaving<'_> {
    fn exports(&self) -> Vec<cachevisor_nbd::backend::ExportInfo> {
        Exports::exports(self.d)
    }
    fn block_size(&self) -> u64 {
        Exports::block_size(self.d)
    }
    fn entering(&self, _id: u32) -> bool {
        self.place.leave()
    }
}

/// Negotiates on `s`, with TLS when the client starts it: the outcome, the TLS
/// connection to carry on over (if any) and the verified client's names.
fn negotiate<S: Read + Write>(
    s: &mut S,
    d: &Leaving<'_>,
    tls: Option<&ServerTls>,
) -> std::io::Result<(Negotiated, Option<rustls::ServerConnection>, Option<Identity>)> {
    let Some(mut session) = greet(s)? else { return Ok((Negotiated::Closed, None, None)) };
    session.tls = tls.map_or(TlsMode::Off, |t| t.mode);
    let outcome = options(s, d, &mut session)?;
    let (Negotiated::StartTls, Some(tls)) = (&outcome, tls) else { return Ok((outcome, None, None)) };
    let mut conn = tls_stream::accept(tls.config(), s)?;
    session.secure();
    // rustls verified the chain against the CA; the leaf names the client.
    session.peer = match conn.peer_certificates().and_then(|c| c.first()) {
        Some(leaf) => {
            Some(Identity::from_der(leaf).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?)
        }
        None => None,
    };
    let outcome = options(&mut rustls::Stream::new(&mut conn, s), d, &mut session)?;
    Ok((outcome, Some(conn), session.peer))
}

/// Runs one connection to its end.
pub(crate) fn connection<S: Split + Timed + std::os::fd::AsFd + Send + Sync + 'static>(
    mut s: S,
    d: &Daemon,
    peer: &str,
    p: &Polling,
) {
    // In the pool of connections still in their handshake until it ends (`preauth.rs`):
    // they take no established slot, and the oldest makes room for a newer one.
    let source = peer.rsplit_once(':').map_or(peer, |(ip, _)| ip);
    let shut = match s.split() {
        Ok(c) => c,
        Err(e) => return tracing::warn!(peer, %e, "cannot split the connection"),
    };
    let place = p.preauth.enter(source, Box::new(move || shut.shut()));
    let leaving = Leaving { d, place: &place };
    let negotiated = negotiate(
        &mut Deadline { s: &mut s, deadline: Instant::now() + p.handshake_timeout },
        &leaving,
        p.tls.as_deref(),
    );
    let evicted = place.evicted();
    drop(place);
    if evicted {
        return tracing::debug!(peer, "closed in its handshake to make room for a newer connection");
    }
    if let Err(e) = s.set_timeouts(None) {
        return tracing::warn!(peer, %e, "cannot clear the handshake's timeout");
    }
    match negotiated {
        Ok((Negotiated::Export(vm, replies), tls, who)) => {
            // An established slot, only now (`listen.max_connections`).
            let Some(_slot) = p.limit.enter() else {
                return tracing::info!(peer, "connection limit reached: closed after its handshake");
            };
            let Some(export) = d.export(vm) else { return }; // removed meanwhile
            let client = who.as_ref().map(Identity::describe).unwrap_or_default();
            tracing::info!(peer, export = %export.name, tls = tls.is_some(), client = %client, "connected");
            let writer = match s.split() {
                Ok(w) => w,
                Err(e) => return tracing::warn!(peer, %e, "cannot split the connection"),
            };
            // A lent region's name carries the map epoch: its metrics are labelled by the
            // borrower alone, so the label set does not grow with every epoch.
            let lent = vm & crate::vssd::startup::VSSD_EXPORT == 0
                && vm & (crate::cluster::lent::LENT_EXPORT | crate::cluster::replica_host::REPLICA_EXPORT) != 0;
            let label = if lent { export.name.split('@').next().unwrap_or(&export.name) } else { &export.name };
            let latency = Some(latency_of(d.metrics(), label));
            let reader = PollingReader::new(s, p.poll, p.pollers.clone());
            let served = match tls {
                None => serve(reader, writer, d.export_backend(vm), (export.size, replies), latency),
                Some(conn) => {
                    let (r, w) = tls_stream::split(conn, reader, writer);
                    serve(r, w, d.export_backend(vm), (export.size, replies), latency)
                }
            };
            if let Err(e) = served {
                tracing::info!(peer, %e, "connection ended");
            }
        }
        Ok((_, _, _)) => tracing::info!(peer, "negotiation ended without an export"),
        Err(e) if is_timeout(&e) => {
            d.guards.handshake_timeouts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::info!(peer, timeout = ?p.handshake_timeout, "handshake not finished in time: closed");
        }
        Err(e) => tracing::info!(peer, %e, "negotiation failed"),
    }
}

/// Accepts TCP connections forever.
pub(crate) fn tcp(l: TcpListener, d: Arc<Daemon>, p: Polling) {
    for s in l.incoming() {
        match s {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                let peer = s.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                let (d, p) = (d.clone(), p.clone());
                cachevisor_datapath::named(format!("cv-nbd {peer}"), move || connection(s, &d, &peer, &p));
            }
            Err(e) => tracing::warn!(%e, "accept failed"),
        }
    }
}

/// Accepts unix-socket connections forever.
pub(crate) fn unix(l: UnixListener, d: Arc<Daemon>, p: Polling) {
    for s in l.incoming() {
        if d.is_stopped() {
            return; // the listener closes (`Running`'s drop wakes it)
        }
        match s {
            Ok(s) => {
                let (d, p) = (d.clone(), p.clone());
                cachevisor_datapath::named("cv-nbd unix".into(), move || connection(s, &d, "unix", &p));
            }
            Err(e) => tracing::warn!(%e, "accept failed"),
        }
    }
}
