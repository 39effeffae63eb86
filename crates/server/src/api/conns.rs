//! The HTTP API's connections (axum's `Listener`), so that no local user can lock the
//! operator out (64 idle connections filled every slot, and one byte
//! every 7.5 s held them past `api.idle_timeout`). Two rules:
//! - **a deadline for a whole request**: a connection has `api.idle_timeout` from its
//!   start, or from its last response, to deliver a request; bytes it sends do not extend
//!   it (a trickle is cut as surely as silence);
//! - **room made, not refused**: when all [`API_CONNECTIONS`] are taken, a new connection
//!   closes one that is doing nothing — a silent one (no byte since it connected, then
//!   since its last response), oldest first, else the one whose request has been coming
//!   in for longest, if for more than [`TRICKLE`] (a request on loopback arrives in
//!   microseconds). A connection whose request is being answered is never closed; only
//!   when every connection is, the new one is refused (counted).
//!
//! Closes are counted (`/metrics`: idle closes, evictions, refusals).

use crate::guards::Guards;
use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

/// Connections the API serves at once.
pub(crate) const API_CONNECTIONS: usize = 64;
/// How long a request may have been coming in before its connection may be closed to
/// make room.
pub(crate) const TRICKLE: Duration = Duration::from_secs(1);

/// What the table knows of a connection.
#[derive(Default)]
struct State {
    /// Milliseconds (since the table began) of its start or last response.
    last_write: AtomicU64,
    /// Milliseconds of the first byte read since then (`u64::MAX`: none).
    request_from: AtomicU64,
    /// Closed to make room.
    closed: AtomicBool,
    /// It has had a response (a keep-alive connection between requests).
    answered: AtomicBool,
    wake: tokio::sync::Notify,
}

/// The API's connections.
pub(crate) struct ApiConns {
    table: Mutex<BTreeMap<u64, Arc<State>>>,
    next: AtomicU64,
    epoch: tokio::time::Instant,
    counts: Arc<Guards>,
}

impl ApiConns {
    /// An empty table counting into `counts`.
    pub(crate) fn new(counts: Arc<Guards>) -> Arc<ApiConns> {
        Arc::new(ApiConns {
            table: Default::default(),
            next: AtomicU64::new(0),
            epoch: tokio::time::Instant::now(),
            counts,
        })
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// A place for a new connection, closing one that does nothing when the table is
    /// full; `None` (counted) when every connection is being answered.
    fn enter(self: &Arc<Self>) -> Option<(u64, Arc<State>)> {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if t.len() >= API_CONNECTIONS {
            let now = self.now_ms();
            let none = u64::MAX;
            // Silent ones that never had a response first (an idle flood), then silent
            // keep-alive ones, each oldest first.
            let silent = t
                .iter()
                .filter(|(_, s)| s.request_from.load(Relaxed) == none)
                .min_by_key(|(_, s)| (s.answered.load(Relaxed), s.last_write.load(Relaxed)));
            let trickling = || {
                t.iter()
                    .filter(|(_, s)| {
                        let from = s.request_from.load(Relaxed);
                        from != none && now.saturating_sub(from) > TRICKLE.as_millis() as u64
                    })
                    .min_by_key(|(_, s)| s.request_from.load(Relaxed))
            };
            match silent.or_else(trickling).map(|(&id, _)| id) {
                Some(id) => {
                    let s = t.remove(&id).expect("found above");
                    s.closed.store(true, Relaxed);
                    s.wake.notify_one();
                    self.counts.handshakes_evicted.fetch_add(1, Relaxed);
                    tracing::debug!("API connections all taken: one doing nothing closed to make room");
                }
                None => {
                    self.counts.connections_refused.fetch_add(1, Relaxed);
                    return None;
                }
            }
        }
        let id = self.next.fetch_add(1, Relaxed);
        let s = Arc::new(State::default());
        s.last_write.store(self.now_ms(), Relaxed);
        s.request_from.store(u64::MAX, Relaxed);
        t.insert(id, s.clone());
        Some((id, s))
    }
}

/// The API's listener over the table.
pub(crate) struct ConnListener {
    /// The socket.
    pub inner: tokio::net::TcpListener,
    /// The table.
    pub conns: Arc<ApiConns>,
    /// `api.idle_timeout`: how long a connection has to deliver a request.
    pub idle: Duration,
}

/// An accepted API connection in the table, closed (reads and writes fail with
/// `TimedOut`) at its request deadline or when closed to make room.
pub(crate) struct ConnIo {
    io: tokio::net::TcpStream,
    id: u64,
    state: Arc<State>,
    conns: Arc<ApiConns>,
    idle: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
    closed: Pin<Box<dyn Future<Output = ()> + Send + Sync>>,
}

impl Drop for ConnIo {
    fn drop(&mut self) {
        self.conns.table.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
    }
}

impl ConnIo {
    /// The error to fail with once the connection was closed to make room.
    fn gone(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        if self.state.closed.load(Relaxed) || self.closed.as_mut().poll(cx).is_ready() {
            self.state.closed.store(true, Relaxed);
            return Some(io::Error::new(io::ErrorKind::TimedOut, "API connection closed to make room"));
        }
        None
    }

    /// A response went out: the next request has a deadline of its own.
    fn wrote(&mut self) {
        self.state.last_write.store(self.conns.now_ms(), Relaxed);
        self.state.request_from.store(u64::MAX, Relaxed);
        self.state.answered.store(true, Relaxed);
        let next = tokio::time::Instant::now() + self.idle;
        self.deadline.as_mut().reset(next);
    }
}

impl tokio::io::AsyncRead for ConnIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut tokio::io::ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(e) = this.gone(cx) {
            return Poll::Ready(Err(e));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        match &r {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                let now = this.conns.now_ms();
                let _ = this.state.request_from.compare_exchange(u64::MAX, now, Relaxed, Relaxed);
            }
            // Bytes sent do not extend the deadline: only a response does.
            Poll::Pending if this.deadline.as_mut().poll(cx).is_ready() => {
                this.conns.counts.api_idle_closes.fetch_add(1, Relaxed);
                tracing::debug!(idle = ?this.idle, "API connection delivered no whole request in time: closed");
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "API request deadline")));
            }
            _ => {}
        }
        r
    }
}

impl tokio::io::AsyncWrite for ConnIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(e) = this.gone(cx) {
            return Poll::Ready(Err(e));
        }
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.wrote();
        }
        r
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl axum::serve::Listener for ConnListener {
    type Io = ConnIo;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (ConnIo, std::net::SocketAddr) {
        loop {
            match self.inner.accept().await {
                Ok((io, addr)) => {
                    if let Some((id, state)) = self.conns.enter() {
                        let s = state.clone();
                        let closed = Box::pin(async move { s.wake.notified().await });
                        let deadline = Box::pin(tokio::time::sleep(self.idle));
                        let conns = self.conns.clone();
                        return (ConnIo { io, id, state, conns, idle: self.idle, deadline, closed }, addr);
                    }
                }
                Err(e) => {
                    tracing::warn!(%e, "API accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.inner.local_addr()
    }
}
