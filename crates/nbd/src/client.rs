//! A minimal blocking NBD client (fixed newstyle, GO, simple replies), over TCP or a unix
//! socket, in plaintext or over TLS (STARTTLS, then the server's certificate checked
//! against a CA and the name dialled, with a client certificate when the server wants
//! one): what the tests, the crash loop and an NBD backing store (`nbd://`, `nbds://`,
//! `nbd+unix://`, `nbds+unix://`; see `uri`) use to talk to a server.

use super::endpoint::{Endpoint, Sock};
use super::proto::*;
use rustls::{ClientConfig, ClientConnection, StreamOwned};
use std::io::{self, Read, Write};
use std::sync::Arc;

/// TLS for a connection: the client configuration (`tls::client_config`) and the name
/// the server's certificate must carry.
#[derive(Clone)]
pub struct TlsClient {
    /// CA, and client certificate if any.
    pub config: Arc<ClientConfig>,
    /// The server's name (a DNS name or an IP address).
    pub server_name: String,
}

/// The connection's byte stream.
enum Wire {
    Plain(Sock),
    Tls(Box<StreamOwned<ClientConnection, Sock>>),
}

impl Read for Wire {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Wire::Plain(s) => s.read(buf),
            Wire::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Wire {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Wire::Plain(s) => s.write(buf),
            Wire::Tls(t) => t.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Wire::Plain(s) => s.flush(),
            Wire::Tls(t) => t.flush(),
        }
    }
}

/// A connection in the transmission phase.
pub struct Client {
    w: Wire,
    cookie: u64,
    /// Export size in bytes.
    pub size: u64,
    /// The export's transmission flags (`TFLAG_*`).
    pub flags: u16,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Sends an option with its data.
fn send_option(s: &mut impl Write, opt: u32, data: &[u8]) -> io::Result<()> {
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    s.write_all(&b)
}

/// Reads one option reply: (type, data).
fn option_reply(s: &mut impl Read) -> io::Result<(u32, Vec<u8>)> {
    let mut h = [0u8; 20];
    s.read_exact(&mut h)?;
    if u64::from_be_bytes(h[0..8].try_into().expect("8")) != REPLY_MAGIC_OPT {
        return Err(invalid("bad option reply magic".into()));
    }
    let kind = u32::from_be_bytes(h[12..16].try_into().expect("4"));
    let mut d = vec![0u8; u32::from_be_bytes(h[16..20].try_into().expect("4")) as usize];
    s.read_exact(&mut d)?;
    Ok((kind, d))
}

impl Client {
    /// Connects to `addr` and negotiates `export` with NBD_OPT_GO.
    pub fn connect(addr: impl Into<Endpoint>, export: &str) -> io::Result<Client> {
        Self::negotiate(addr.into().connect(None)?, export, None)
    }

    /// Connects to `addr` over TLS and negotiates `export`.
    pub fn connect_tls(addr: impl Into<Endpoint>, export: &str, tls: &TlsClient) -> io::Result<Client> {
        Self::negotiate(addr.into().connect(None)?, export, Some(tls))
    }

    /// Like [`Self::connect`] (over TLS when `tls` is given), giving up when connecting
    /// or negotiating takes longer than `limit` (a server that stops accepting after its
    /// connection limit).
    pub fn connect_within(
        addr: &Endpoint,
        export: &str,
        tls: Option<&TlsClient>,
        limit: std::time::Duration,
    ) -> io::Result<Client> {
        let s = addr.connect(Some(limit))?;
        s.set_timeouts(Some(limit))?;
        let c = Self::negotiate(s, export, tls)?;
        c.socket().set_timeouts(None)?;
        Ok(c)
    }

    /// The socket underneath (for timeouts, and tests that misbehave on purpose).
    pub fn socket(&self) -> &Sock {
        match &self.w {
            Wire::Plain(s) => s,
            Wire::Tls(t) => &t.sock,
        }
    }

    fn negotiate(mut s: Sock, export: &str, tls: Option<&TlsClient>) -> io::Result<Client> {
        s.set_nodelay()?;
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello)?;
        if u64::from_be_bytes(hello[0..8].try_into().expect("8")) != NBDMAGIC
            || u64::from_be_bytes(hello[8..16].try_into().expect("8")) != IHAVEOPT
        {
            return Err(invalid("not a fixed-newstyle NBD server".into()));
        }
        s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())?;
        let mut w = match tls {
            None => Wire::Plain(s),
            Some(t) => {
                send_option(&mut s, OPT_STARTTLS, &[])?;
                match option_reply(&mut s)? {
                    (REP_ACK, _) => {}
                    (k, d) => {
                        return Err(invalid(format!(
                            "the server refused TLS ({k:#x}): {}",
                            String::from_utf8_lossy(&d)
                        )))
                    }
                }
                let conn = super::tls_stream::connect(t.config.clone(), &t.server_name, &mut s)?;
                Wire::Tls(Box::new(StreamOwned::new(conn, s)))
            }
        };
        let mut go = (export.len() as u32).to_be_bytes().to_vec();
        go.extend_from_slice(export.as_bytes());
        go.extend_from_slice(&0u16.to_be_bytes());
        send_option(&mut w, OPT_GO, &go)?;
        let mut size = None;
        let mut flags = 0u16;
        loop {
            match option_reply(&mut w)? {
                (REP_INFO, d) if d.len() >= 12 && u16::from_be_bytes([d[0], d[1]]) == INFO_EXPORT => {
                    size = Some(u64::from_be_bytes(d[2..10].try_into().expect("8")));
                    flags = u16::from_be_bytes([d[10], d[11]]);
                }
                (REP_INFO, _) => {}
                (REP_ACK, _) => break,
                (k, d) => {
                    return Err(invalid(format!("export `{export}` refused ({k:#x}): {}", String::from_utf8_lossy(&d))))
                }
            }
        }
        Ok(Client { w, cookie: 0, size: size.ok_or_else(|| invalid("no export size".into()))?, flags })
    }

    /// Sends a request and its payload; returns its cookie.
    pub fn send(&mut self, kind: u16, flags: u16, offset: u64, length: u32, payload: &[u8]) -> io::Result<u64> {
        self.cookie += 1;
        let mut b = encode_request(&Request { flags, kind, cookie: self.cookie, offset, length }).to_vec();
        b.extend_from_slice(payload);
        self.w.write_all(&b)?;
        self.w.flush()?;
        Ok(self.cookie)
    }

    /// Reads a simple reply header: (error, cookie).
    pub fn reply(&mut self) -> io::Result<(u32, u64)> {
        let mut h = [0u8; 16];
        self.w.read_exact(&mut h)?;
        if u32::from_be_bytes(h[0..4].try_into().expect("4")) != SIMPLE_REPLY_MAGIC {
            return Err(invalid("bad reply magic".into()));
        }
        Ok((u32::from_be_bytes(h[4..8].try_into().expect("4")), u64::from_be_bytes(h[8..16].try_into().expect("8"))))
    }

    fn done(&mut self, cookie: u64) -> io::Result<Result<(), u32>> {
        let (e, c) = self.reply()?;
        if c != cookie {
            return Err(invalid(format!("reply for cookie {c}, expected {cookie}")));
        }
        Ok(if e == 0 { Ok(()) } else { Err(e) })
    }

    /// Reads `len` bytes at `offset`: outer error = connection, inner = NBD errno.
    pub fn read(&mut self, offset: u64, len: u32) -> io::Result<Result<Vec<u8>, u32>> {
        let c = self.send(CMD_READ, 0, offset, len, &[])?;
        if let Err(e) = self.done(c)? {
            return Ok(Err(e));
        }
        let mut d = vec![0u8; len as usize];
        self.w.read_exact(&mut d)?;
        Ok(Ok(d))
    }

    /// Writes `data` at `offset`, with FUA if asked.
    pub fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> io::Result<Result<(), u32>> {
        let c = self.send(CMD_WRITE, if fua { CMD_FLAG_FUA } else { 0 }, offset, data.len() as u32, data)?;
        self.done(c)
    }

    /// Flushes.
    pub fn flush(&mut self) -> io::Result<Result<(), u32>> {
        let c = self.send(CMD_FLUSH, 0, 0, 0, &[])?;
        self.done(c)
    }

    /// Discards `len` bytes at `offset` (TRIM).
    pub fn trim(&mut self, offset: u64, len: u32) -> io::Result<Result<(), u32>> {
        let c = self.send(CMD_TRIM, 0, offset, len, &[])?;
        self.done(c)
    }
}
