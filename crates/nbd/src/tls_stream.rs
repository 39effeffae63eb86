//! A TLS connection whose two directions run on different threads: NBD transmission
//! reads requests on the connection's reader thread while replies are written by
//! whichever data-path thread completes a request (`transmission.rs`). rustls's
//! `Stream` wants one owner, so the connection state sits behind a mutex that is held
//! only while records are decrypted or encrypted, never across socket I/O:
//!
//! - [`TlsReader`] reads raw bytes from its socket handle into its own buffer (no lock),
//!   then feeds them to rustls and takes the plaintext out (lock held for the crypto).
//! - [`TlsWriter`] encrypts at most 64 KiB of plaintext at a time (lock held) and writes
//!   the records to its socket handle: a small reply copied out and written with the lock
//!   released, a large one straight from rustls's buffers under the lock (`send_ready`).
//!   Writers are serialized by their caller (the transmission's reply mutex), so the
//!   records leave in the order rustls sealed them; anything rustls queued while reading
//!   (a TLS 1.3 KeyUpdate answer) leaves with the next reply, in order.
//!
//! Written by hand because neither rustls nor a maintained crate offers a blocking,
//! thread-split stream (tokio-rustls splits only inside its async runtime). Kernel TLS
//! would make the socket itself splittable, but needs the `tls` module this machine lacks.
//!
//! [`accept`] and [`connect`] run a handshake on a blocking socket (both directions on
//! one thread, within the caller's deadline).

use rustls::{ClientConfig, ClientConnection, Connection, ServerConfig, ServerConnection};
use std::io::{self, IoSlice, Read, Write};
use std::sync::{Arc, Mutex, MutexGuard};

/// Plaintext encrypted per lock hold (rustls's own default send buffer).
const CHUNK: usize = 64 << 10;
/// Raw bytes read from the socket at once.
const RAW: usize = 256 << 10;

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

/// Runs the server side of a handshake on `s`; an error (a bad certificate, garbage, a
/// client that stopped) ends it, after rustls sent its alert.
pub fn accept<S: Read + Write>(config: Arc<ServerConfig>, s: &mut S) -> io::Result<ServerConnection> {
    let mut c = ServerConnection::new(config).map_err(invalid)?;
    while c.is_handshaking() {
        c.complete_io(s)?;
    }
    Ok(c)
}

/// Runs the client side of a handshake with `server` (the name its certificate must
/// carry) on `s`.
pub fn connect<S: Read + Write>(config: Arc<ClientConfig>, server: &str, s: &mut S) -> io::Result<ClientConnection> {
    let name = rustls::pki_types::ServerName::try_from(server.to_owned())
        .map_err(|e| invalid(format!("`{server}` is not a server name: {e}")))?;
    let mut c = ClientConnection::new(config, name).map_err(invalid)?;
    while c.is_handshaking() {
        c.complete_io(s)?;
    }
    Ok(c)
}

type Shared = Arc<Mutex<Connection>>;

fn lock(s: &Shared) -> MutexGuard<'_, Connection> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

/// Splits an established connection into a reading half over `r` and a writing half over
/// `w` (two handles on one socket).
pub fn split<R: Read, W: Write>(conn: impl Into<Connection>, r: R, w: W) -> (TlsReader<R>, TlsWriter<W>) {
    let shared = Arc::new(Mutex::new(conn.into()));
    let reader = TlsReader { shared: shared.clone(), sock: r, raw: vec![0; RAW].into_boxed_slice(), start: 0, end: 0 };
    (reader, TlsWriter { shared, sock: w, scratch: Vec::with_capacity(CHUNK + 1024) })
}

/// The reading half: plaintext out of TLS records read from `R`.
pub struct TlsReader<R> {
    shared: Shared,
    sock: R,
    raw: Box<[u8]>,
    start: usize,
    end: usize,
}

impl<R: Read> Read for TlsReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            {
                let mut c = lock(&self.shared);
                match c.reader().read(buf) {
                    Ok(n) => return Ok(n), // 0: the peer's close_notify
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                if self.start < self.end {
                    let mut pending = &self.raw[self.start..self.end];
                    let n = c.read_tls(&mut pending)?;
                    self.start += n;
                    c.process_new_packets().map_err(invalid)?;
                    continue;
                }
            }
            let n = self.sock.read(&mut self.raw)?;
            if n == 0 {
                return Ok(0); // the socket closed (many NBD clients skip close_notify)
            }
            (self.start, self.end) = (0, n);
        }
    }
}

/// The writing half: plaintext sealed into TLS records written to `W`.
pub struct TlsWriter<W: Write> {
    shared: Shared,
    sock: W,
    scratch: Vec<u8>,
}

/// Moves every record rustls has ready (`c`, locked) to `sock`. Small amounts (a 4 KiB
/// reply) are copied to `scratch` and written after the lock is released, so the reader
/// is not held up by the syscall; large ones (`large`) go from rustls's buffers straight
/// to the socket in `writev`s under the lock — the copy would cost more than the wait.
fn send_ready(
    mut c: MutexGuard<'_, Connection>,
    scratch: &mut Vec<u8>,
    sock: &mut impl Write,
    large: bool,
) -> io::Result<()> {
    if large {
        while c.wants_write() {
            c.write_tls(sock)?;
        }
        return Ok(());
    }
    scratch.clear();
    while c.wants_write() {
        c.write_tls(scratch)?;
    }
    drop(c);
    sock.write_all(scratch)
}

/// Sealed bytes from which [`send_ready`] writes without the copy.
const LARGE: usize = 16 << 10;

impl<W: Write> Write for TlsWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    /// Writes all of `bufs` (small pieces share records: a reply's header and its data).
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut owned: Vec<IoSlice<'_>> = bufs.to_vec();
        let mut rest = &mut owned[..];
        while !rest.is_empty() {
            // At most CHUNK bytes per hold: the reader waits for the lock meanwhile.
            let (mut take, mut n_slices) = (0, 0);
            for s in rest.iter() {
                if take >= CHUNK {
                    break;
                }
                take += s.len();
                n_slices += 1;
            }
            let mut c = lock(&self.shared);
            let n = c.writer().write_vectored(&rest[..n_slices])?;
            if n == 0 && take > 0 {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "TLS send buffer full"));
            }
            send_ready(c, &mut self.scratch, &mut self.sock, n >= LARGE)?;
            IoSlice::advance_slices(&mut rest, n);
        }
        Ok(total)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.sock.flush()
    }
}

impl<W: Write> Drop for TlsWriter<W> {
    /// Says goodbye (close_notify), best effort: the peer may be gone.
    fn drop(&mut self) {
        let mut c = lock(&self.shared);
        c.send_close_notify();
        let _ = send_ready(c, &mut self.scratch, &mut self.sock, false);
    }
}
