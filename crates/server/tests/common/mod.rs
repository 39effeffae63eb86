//! Test helpers: a service on a free loopback port over temporary files, and a minimal
//! NBD client speaking the wire format directly (so tests can also misbehave on purpose).

#![allow(dead_code)]

use cachevisor_server::config::Config;
use cachevisor_server::nbd::proto::*;
use cachevisor_server::service::{start, Running};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;

/// A config with a `cache` of the given size and `(name, size, write policy)` exports.
pub fn config(dir: &Path, cache: &str, disks: &[(&str, &str, &str)]) -> Config {
    let mut t = format!("[cache]\npath = \"cache.img\"\nsize = \"{cache}\"\n[listen]\ntcp = \"127.0.0.1:0\"\n");
    for (name, size, wp) in disks {
        t += &format!("[[vdisk]]\nname = \"{name}\"\nbacking = \"{name}.img\"\nsize = \"{size}\"\nwrite_policy = \"{wp}\"\n");
    }
    Config::parse(&t, "test config", dir).unwrap()
}

/// Starts a service.
pub fn serve(cfg: &Config) -> Running {
    start(cfg).unwrap()
}

/// A raw NBD connection.
pub struct Client {
    pub s: TcpStream,
    cookie: u64,
}

/// Reads the server greeting and sends client flags.
pub fn greet(addr: SocketAddr, cflags: u32) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    assert_eq!(u64::from_be_bytes(hello[0..8].try_into().unwrap()), NBDMAGIC);
    assert_eq!(u64::from_be_bytes(hello[8..16].try_into().unwrap()), IHAVEOPT);
    s.write_all(&cflags.to_be_bytes()).unwrap();
    s
}

/// Sends an option.
pub fn send_option(s: &mut TcpStream, opt: u32, data: &[u8]) {
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    s.write_all(&b).unwrap();
}

/// Reads one option reply: (option, reply type, data).
pub fn read_option_reply(s: &mut TcpStream) -> std::io::Result<(u32, u32, Vec<u8>)> {
    let mut h = [0u8; 20];
    s.read_exact(&mut h)?;
    assert_eq!(u64::from_be_bytes(h[0..8].try_into().unwrap()), REPLY_MAGIC_OPT);
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
    let mut d = vec![0u8; len];
    s.read_exact(&mut d)?;
    Ok((u32::from_be_bytes(h[8..12].try_into().unwrap()), u32::from_be_bytes(h[12..16].try_into().unwrap()), d))
}

/// GO data for `name` with no info requests.
pub fn go_data(name: &str) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&0u16.to_be_bytes());
    d
}

/// Whether the peer has closed the connection (EOF or reset).
pub fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0) | Err(_))
}

impl Client {
    /// Connects and negotiates `export` with GO; returns the client and the export size.
    pub fn connect(addr: SocketAddr, export: &str) -> (Client, u64) {
        let mut s = greet(addr, FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
        send_option(&mut s, OPT_GO, &go_data(export));
        let mut size = 0;
        loop {
            let (_, kind, d) = read_option_reply(&mut s).unwrap();
            match kind {
                REP_INFO if u16::from_be_bytes([d[0], d[1]]) == INFO_EXPORT => size = u64::from_be_bytes(d[2..10].try_into().unwrap()),
                REP_INFO => {}
                REP_ACK => break,
                k => panic!("GO refused: {k:#x} {}", String::from_utf8_lossy(&d)),
            }
        }
        (Client { s, cookie: 0 }, size)
    }

    /// Sends a request (and payload); returns its cookie.
    pub fn send(&mut self, kind: u16, flags: u16, offset: u64, length: u32, payload: &[u8]) -> u64 {
        self.cookie += 1;
        let mut b = encode_request(&Request { flags, kind, cookie: self.cookie, offset, length }).to_vec();
        b.extend_from_slice(payload);
        self.s.write_all(&b).unwrap();
        self.cookie
    }

    /// Reads a simple reply header: (error, cookie).
    pub fn reply(&mut self) -> std::io::Result<(u32, u64)> {
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h)?;
        assert_eq!(u32::from_be_bytes(h[0..4].try_into().unwrap()), SIMPLE_REPLY_MAGIC);
        Ok((u32::from_be_bytes(h[4..8].try_into().unwrap()), u64::from_be_bytes(h[8..16].try_into().unwrap())))
    }

    /// Reads `len` bytes at `offset`; Err(errno) on an error reply.
    pub fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, u32> {
        let c = self.send(CMD_READ, 0, offset, len, &[]);
        let (e, cookie) = self.reply().unwrap();
        assert_eq!(cookie, c);
        if e != 0 {
            return Err(e);
        }
        let mut d = vec![0u8; len as usize];
        self.s.read_exact(&mut d).unwrap();
        Ok(d)
    }

    /// Writes; Err(errno) on an error reply.
    pub fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<(), u32> {
        let c = self.send(CMD_WRITE, if fua { CMD_FLAG_FUA } else { 0 }, offset, data.len() as u32, data);
        let (e, cookie) = self.reply().unwrap();
        assert_eq!(cookie, c);
        if e == 0 { Ok(()) } else { Err(e) }
    }

    /// Flushes.
    pub fn flush(&mut self) -> Result<(), u32> {
        let c = self.send(CMD_FLUSH, 0, 0, 0, &[]);
        let (e, cookie) = self.reply().unwrap();
        assert_eq!(cookie, c);
        if e == 0 { Ok(()) } else { Err(e) }
    }
}
