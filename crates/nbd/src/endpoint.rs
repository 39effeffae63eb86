//! Where an NBD server is reached — a TCP address or a unix socket path — and the socket
//! our client holds to it, so the client, its TLS layer and the NBD backing store work the
//! same over both transports (libnbd's `nbd://` and `nbd+unix://` families).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

/// An NBD server's address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `HOST:PORT`.
    Tcp(SocketAddr),
    /// A unix socket's path.
    Unix(PathBuf),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Tcp(a) => write!(f, "{a}"),
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl From<SocketAddr> for Endpoint {
    fn from(a: SocketAddr) -> Endpoint {
        Endpoint::Tcp(a)
    }
}

impl Endpoint {
    /// Connects, giving up after `limit` when given (a unix socket connects at once or
    /// fails, so the limit applies to TCP only).
    pub fn connect(&self, limit: Option<Duration>) -> io::Result<Sock> {
        Ok(match (self, limit) {
            (Endpoint::Tcp(a), Some(l)) => Sock::Tcp(TcpStream::connect_timeout(a, l)?),
            (Endpoint::Tcp(a), None) => Sock::Tcp(TcpStream::connect(a)?),
            (Endpoint::Unix(p), _) => Sock::Unix(UnixStream::connect(p)?),
        })
    }
}

/// A connected socket of either kind.
#[derive(Debug)]
pub enum Sock {
    /// TCP (Nagle off: requests are small and latency-bound).
    Tcp(TcpStream),
    /// A unix stream socket.
    Unix(UnixStream),
}

impl Sock {
    /// The TCP stream, when this is one (tests that misbehave on purpose).
    pub fn as_tcp(&self) -> Option<&TcpStream> {
        match self {
            Sock::Tcp(s) => Some(s),
            Sock::Unix(_) => None,
        }
    }

    /// Sets both the read and the write timeout (`None`: block forever).
    pub fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Sock::Unix(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
        }
    }

    /// Turns Nagle's algorithm off on TCP (nothing to do on a unix socket).
    pub fn set_nodelay(&self) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_nodelay(true),
            Sock::Unix(_) => Ok(()),
        }
    }
}

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.read(buf),
            Sock::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.write(buf),
            Sock::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.flush(),
            Sock::Unix(s) => s.flush(),
        }
    }
}
