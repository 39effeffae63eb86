//! HTTPS for the API (`[api] tls = true`): the NBD listeners' certificate and key
//! (`tls.rs`, reloaded with them), no client certificates (the bearer token
//! authenticates). The handshake runs inside the connection's first reads and writes, not
//! in the accept loop, so a client that stalls its handshake holds only its own slot and
//! is closed by the API's idle timeout (`conn_limits.rs`) like any quiet connection.
//!
//! Written by hand because tokio-rustls offers the handshake as a future and axum's
//! `Listener` wants a stream at accept time; this is the small adapter between the two.

use crate::api::conns::{ConnIo, ConnListener};
use cachevisor_nbd::tls::ServerTls;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::server::TlsStream;
use tokio_rustls::{Accept, TlsAcceptor};

/// The API's listener: plain HTTP, or HTTPS when given TLS.
pub(crate) struct ApiListener {
    /// Accepts under the API's connection limit and idle timeout.
    pub inner: ConnListener,
    /// HTTPS credentials.
    pub tls: Option<Arc<ServerTls>>,
}

/// An API connection.
pub(crate) enum ApiIo {
    /// Plain HTTP.
    Plain(ConnIo),
    /// TLS handshake under way.
    Handshake(Box<Accept<ConnIo>>),
    /// HTTPS.
    Tls(Box<TlsStream<ConnIo>>),
    /// The handshake failed: every call fails.
    Failed,
}

impl ApiIo {
    /// Drives the handshake; `Ready(Ok)` once the stream is plain or TLS is up.
    fn ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let ApiIo::Handshake(accept) = self {
            match Pin::new(&mut **accept).poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(s)) => *self = ApiIo::Tls(Box::new(s)),
                Poll::Ready(Err(e)) => {
                    tracing::info!(%e, "API TLS handshake failed");
                    *self = ApiIo::Failed;
                    return Poll::Ready(Err(e));
                }
            }
        }
        match self {
            ApiIo::Failed => Poll::Ready(Err(io::Error::new(io::ErrorKind::NotConnected, "TLS handshake failed"))),
            _ => Poll::Ready(Ok(())),
        }
    }
}

/// `$call` on the stream once ready.
macro_rules! on_stream {
    ($self:ident, $cx:ident, |$s:ident| $call:expr) => {{
        let me = $self.get_mut();
        match me.ready($cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        }
        match me {
            ApiIo::Plain($s) => {
                let $s = Pin::new($s);
                $call
            }
            ApiIo::Tls($s) => {
                let $s = Pin::new(&mut **$s);
                $call
            }
            _ => unreachable!("ready() leaves a plain or TLS stream"),
        }
    }};
}

impl AsyncRead for ApiIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        on_stream!(self, cx, |s| s.poll_read(cx, buf))
    }
}

impl AsyncWrite for ApiIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        on_stream!(self, cx, |s| s.poll_write(cx, buf))
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        on_stream!(self, cx, |s| s.poll_flush(cx))
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        on_stream!(self, cx, |s| s.poll_shutdown(cx))
    }
}

impl axum::serve::Listener for ApiListener {
    type Io = ApiIo;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (ApiIo, std::net::SocketAddr) {
        let (io, addr) = self.inner.accept().await;
        match &self.tls {
            None => (ApiIo::Plain(io), addr),
            Some(t) => (ApiIo::Handshake(Box::new(TlsAcceptor::from(t.api_config()).accept(io))), addr),
        }
    }

    fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.inner.local_addr()
    }
}
