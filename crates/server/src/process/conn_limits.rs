//! Limits that keep clients from tying the daemon up: at most `listen.max_connections`
//! NBD connections at once (each is a thread), and a handshake that must finish within
//! `listen.handshake_timeout` — an absolute deadline, so a client that trickles a byte at
//! a time is closed as surely as one that sends nothing. A connection over the limit is
//! closed at once; reaching the limit and leaving it are logged once each, and refusals
//! and timeouts are counted (`/metrics`). The API has its own table (`api/conns.rs`).

use crate::guards::Guards;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Connections at once, and what was refused.
#[derive(Debug)]
pub(crate) struct ConnLimit {
    what: &'static str,
    max: usize,
    active: AtomicUsize,
    at_limit: AtomicBool,
    pub(crate) counts: Arc<Guards>,
}

/// A connection's place under the limit, given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot(Arc<ConnLimit>);

impl Drop for Slot {
    fn drop(&mut self) {
        let l = &self.0;
        l.active.fetch_sub(1, Relaxed);
        if l.at_limit.swap(false, Relaxed) {
            tracing::info!(what = l.what, max = l.max, "below the connection limit again");
        }
    }
}

impl ConnLimit {
    /// At most `max` connections of `what` (a label for the log).
    pub(crate) fn new(what: &'static str, max: usize, counts: Arc<Guards>) -> Arc<ConnLimit> {
        Arc::new(ConnLimit { what, max, active: AtomicUsize::new(0), at_limit: AtomicBool::new(false), counts })
    }

    /// A slot for a new connection, or `None` (counted; logged when the limit is first
    /// reached) when `max` are open.
    pub(crate) fn enter(self: &Arc<Self>) -> Option<Slot> {
        if self.active.fetch_add(1, Relaxed) >= self.max {
            self.active.fetch_sub(1, Relaxed);
            self.counts.connections_refused.fetch_add(1, Relaxed);
            if !self.at_limit.swap(true, Relaxed) {
                tracing::warn!(
                    what = self.what,
                    max = self.max,
                    "connection limit reached: new connections are closed until one ends (listen.max_connections)"
                );
            }
            return None;
        }
        Some(Slot(self.clone()))
    }

    /// Connections open now.
    #[cfg(test)]
    fn active(&self) -> usize {
        self.active.load(Relaxed)
    }
}

/// A socket whose read timeout can be set (TCP and unix streams).
pub(crate) trait Timed {
    /// Sets the read and write timeouts (`None`: block).
    fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()>;
}

impl Timed for std::net::TcpStream {
    fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(t)?;
        self.set_write_timeout(t)
    }
}

impl Timed for std::os::unix::net::UnixStream {
    fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(t)?;
        self.set_write_timeout(t)
    }
}

/// A stream every read and write of which must end by `deadline`.
pub(crate) struct Deadline<'a, S: Timed> {
    /// The stream.
    pub s: &'a mut S,
    /// When the handshake must be done.
    pub deadline: Instant,
}

impl<S: Timed> Deadline<'_, S> {
    fn arm(&self) -> io::Result<()> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the handshake took too long"));
        }
        self.s.set_timeouts(Some(left))
    }
}

impl<S: Timed + Read> Read for Deadline<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.arm()?;
        self.s.read(buf)
    }
}

impl<S: Timed + Write> Write for Deadline<'_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.arm()?;
        self.s.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.s.flush()
    }
}

/// Whether `e` is a timeout (a read or write past its deadline).
pub(crate) fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_refuses_past_max_and_frees_on_drop() {
        let l = ConnLimit::new("nbd", 2, Default::default());
        let (a, b) = (l.enter().unwrap(), l.enter().unwrap());
        assert!(l.enter().is_none());
        assert_eq!(l.counts.read(Default::default()).connections_refused, 1);
        drop(a);
        let c = l.enter().unwrap();
        assert_eq!(l.active(), 2);
        drop((b, c));
        assert_eq!(l.active(), 0);
    }

    #[test]
    fn a_trickling_peer_meets_the_deadline() {
        let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || {
            for _ in 0..20 {
                if b.write_all(b"x").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(30));
            }
        });
        let start = Instant::now();
        let mut d = Deadline { s: &mut a, deadline: start + Duration::from_millis(200) };
        let mut buf = [0u8; 64];
        let mut got = 0;
        let e = loop {
            match d.read(&mut buf) {
                Ok(n) => got += n,
                Err(e) => break e,
            }
        };
        assert!(got > 0, "bytes came before the deadline");
        assert!(is_timeout(&e), "{e}");
        assert!(start.elapsed() < Duration::from_millis(500));
        drop(a);
        t.join().unwrap();
    }
}
