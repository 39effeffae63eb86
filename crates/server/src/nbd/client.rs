//! A minimal blocking NBD client (fixed newstyle, GO, simple replies): what the tests,
//! the crash loop and (later) an NBD backing store use to talk to a server.

use super::proto::*;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};

/// A connection in the transmission phase.
pub struct Client {
    /// The socket (public so tests can misbehave on purpose).
    pub s: TcpStream,
    cookie: u64,
    /// Export size in bytes.
    pub size: u64,
    /// The export's transmission flags (`TFLAG_*`).
    pub flags: u16,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

impl Client {
    /// Connects to `addr` and negotiates `export` with NBD_OPT_GO.
    pub fn connect(addr: SocketAddr, export: &str) -> io::Result<Client> {
        Self::negotiate(TcpStream::connect(addr)?, export)
    }

    /// Like [`Self::connect`], giving up when connecting or negotiating takes longer
    /// than `limit` (a server that stops accepting after its connection limit).
    pub fn connect_within(addr: SocketAddr, export: &str, limit: std::time::Duration) -> io::Result<Client> {
        let s = TcpStream::connect_timeout(&addr, limit)?;
        s.set_read_timeout(Some(limit))?;
        s.set_write_timeout(Some(limit))?;
        let c = Self::negotiate(s, export)?;
        c.s.set_read_timeout(None)?;
        c.s.set_write_timeout(None)?;
        Ok(c)
    }

    fn negotiate(mut s: TcpStream, export: &str) -> io::Result<Client> {
        s.set_nodelay(true)?;
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello)?;
        if u64::from_be_bytes(hello[0..8].try_into().expect("8")) != NBDMAGIC
            || u64::from_be_bytes(hello[8..16].try_into().expect("8")) != IHAVEOPT
        {
            return Err(invalid("not a fixed-newstyle NBD server".into()));
        }
        s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())?;
        let mut opt = IHAVEOPT.to_be_bytes().to_vec();
        opt.extend_from_slice(&OPT_GO.to_be_bytes());
        opt.extend_from_slice(&(4 + export.len() as u32 + 2).to_be_bytes());
        opt.extend_from_slice(&(export.len() as u32).to_be_bytes());
        opt.extend_from_slice(export.as_bytes());
        opt.extend_from_slice(&0u16.to_be_bytes());
        s.write_all(&opt)?;
        let mut size = None;
        let mut flags = 0u16;
        loop {
            let mut h = [0u8; 20];
            s.read_exact(&mut h)?;
            let kind = u32::from_be_bytes(h[12..16].try_into().expect("4"));
            let mut d = vec![0u8; u32::from_be_bytes(h[16..20].try_into().expect("4")) as usize];
            s.read_exact(&mut d)?;
            match kind {
                REP_INFO if d.len() >= 12 && u16::from_be_bytes([d[0], d[1]]) == INFO_EXPORT => {
                    size = Some(u64::from_be_bytes(d[2..10].try_into().expect("8")));
                    flags = u16::from_be_bytes([d[10], d[11]]);
                }
                REP_INFO => {}
                REP_ACK => break,
                k => {
                    return Err(invalid(format!("export `{export}` refused ({k:#x}): {}", String::from_utf8_lossy(&d))))
                }
            }
        }
        Ok(Client { s, cookie: 0, size: size.ok_or_else(|| invalid("no export size".into()))?, flags })
    }

    /// Sends a request and its payload; returns its cookie.
    pub fn send(&mut self, kind: u16, flags: u16, offset: u64, length: u32, payload: &[u8]) -> io::Result<u64> {
        self.cookie += 1;
        let mut b = encode_request(&Request { flags, kind, cookie: self.cookie, offset, length }).to_vec();
        b.extend_from_slice(payload);
        self.s.write_all(&b)?;
        Ok(self.cookie)
    }

    /// Reads a simple reply header: (error, cookie).
    pub fn reply(&mut self) -> io::Result<(u32, u64)> {
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h)?;
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
        self.s.read_exact(&mut d)?;
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
