//! Test helpers: a service on a free loopback port over temporary files, and a minimal
//! NBD client speaking the wire format directly (so tests can also misbehave on purpose).

#![allow(dead_code)]

#[allow(unused_imports)] // the TLS tests'
pub use cachevisor_testkit::certs;

use cachevisor_nbd::proto::*;
use cachevisor_server::config::Config;
use cachevisor_server::service::{start, Running};
pub use cachevisor_store::faults::Faults;
#[allow(unused_imports)] // each test binary uses some
pub use cachevisor_testkit::config::{s, strings, ServeConfig};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;

/// A config with a `cache` of the given size and `(name, size, write policy)` exports; no
/// background write-back (flusher and write-back ahead off), so tests can count dirty blocks.
pub fn config(dir: &Path, cache: &str, disks: &[(&str, &str, &str)]) -> Config {
    parse(dir, &server_config(cache, disks))
}

/// [`config`]'s configuration, to add to before it is parsed ([`parse`]).
pub fn server_config(cache: &str, disks: &[(&str, &str, &str)]) -> ServeConfig {
    let mut c = ServeConfig::new(cache).no_writeback();
    for (name, size, wp) in disks {
        c = c.vdisk(name, &format!("{name}.img"), &[("size", s(size)), ("write_policy", s(wp))]);
    }
    c
}

/// `c` parsed as the daemon does, with paths relative to `dir`.
pub fn parse(dir: &Path, c: &ServeConfig) -> Config {
    Config::parse(&c.toml(), "test config", dir).unwrap()
}

/// Starts a service.
pub fn serve(cfg: &Config) -> Running {
    start(cfg).unwrap()
}

/// Starts a service whose cache and backing stores fail or slow down on command
/// (`cachevisor_store::faults`; its cache ops then run on device threads, not io_uring).
pub fn serve_faulty(cfg: &Config) -> (Running, std::sync::Arc<Faults>) {
    let faults = std::sync::Arc::new(Faults::default());
    let opts = cachevisor_server::daemon::StartOptions { faults: Some(faults.clone()), ..Default::default() };
    (cachevisor_server::service::start_with(cfg, &opts).unwrap(), faults)
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

/// Whether the peer closes the connection (EOF or reset) after whatever it still sends
/// (a TLS alert), before the socket's read timeout.
pub fn ends(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => return !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
        }
    }
}

/// The crate's client with test-friendly wrappers (panics on connection errors).
pub struct Client {
    pub s: std::net::TcpStream,
    inner: cachevisor_nbd::client::Client,
}

impl Client {
    /// Connects and negotiates `export`; returns the client and the export size.
    pub fn connect(addr: SocketAddr, export: &str) -> (Client, u64) {
        let inner = cachevisor_nbd::client::Client::connect(addr, export).unwrap();
        inner.socket().as_tcp().unwrap().set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
        let size = inner.size;
        (Client { s: inner.socket().as_tcp().unwrap().try_clone().unwrap(), inner }, size)
    }

    /// Sends a request (and payload); returns its cookie.
    pub fn send(&mut self, kind: u16, flags: u16, offset: u64, length: u32, payload: &[u8]) -> u64 {
        self.inner.send(kind, flags, offset, length, payload).unwrap()
    }

    /// Reads a simple reply header: (error, cookie).
    pub fn reply(&mut self) -> std::io::Result<(u32, u64)> {
        self.inner.reply()
    }

    /// Reads; Err(errno) on an error reply.
    pub fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, u32> {
        self.inner.read(offset, len).unwrap()
    }

    /// Writes; Err(errno) on an error reply.
    pub fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<(), u32> {
        self.inner.write(offset, data, fua).unwrap()
    }

    /// Flushes.
    pub fn flush(&mut self) -> Result<(), u32> {
        self.inner.flush().unwrap()
    }
}

/// A writer rewrites `blocks` blocks of `export` round robin (each block carries its
/// version, its number and a pattern) while four readers read `reads` blocks each and
/// check that each read returns its own block, whole, in at least the version acknowledged
/// before the read was sent. Returns the writes done.
pub fn check_monotonic_reads(addr: SocketAddr, export: &str, blocks: u64, reads: u64) -> u64 {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
    use std::sync::Arc;
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..blocks).map(|_| 0.into()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (acked, stop, export) = (acked.clone(), stop.clone(), export.to_string());
        std::thread::spawn(move || {
            let (mut c, _) = Client::connect(addr, &export);
            let mut v = 0u64;
            while !stop.load(SeqCst) {
                v += 1;
                let b = (v * 5) % blocks;
                let mut data = vec![(v % 251) as u8; 4096];
                data[..8].copy_from_slice(&v.to_le_bytes());
                data[8..16].copy_from_slice(&b.to_le_bytes());
                c.write(b * 4096, &data, false).unwrap();
                acked[b as usize].store(v, SeqCst);
            }
            v
        })
    };
    let readers: Vec<_> = (0..4u64)
        .map(|t| {
            let (acked, export) = (acked.clone(), export.to_string());
            std::thread::spawn(move || {
                let (mut c, _) = Client::connect(addr, &export);
                for i in 0..reads {
                    let b = (i * 3 + t * 7) % blocks;
                    let floor = acked[b as usize].load(SeqCst);
                    let data = c.read(b * 4096, 4096).unwrap();
                    let got = u64::from_le_bytes(data[..8].try_into().unwrap());
                    assert!(got >= floor, "block {b}: version {got} read after version {floor} was acknowledged");
                    if got > 0 {
                        assert_eq!(
                            u64::from_le_bytes(data[8..16].try_into().unwrap()),
                            b,
                            "block {b}: read another block's data (version {got})"
                        );
                        assert!(
                            data[16..].iter().all(|&x| x == (got % 251) as u8),
                            "block {b}: torn read of version {got}"
                        );
                    }
                }
            })
        })
        .collect();
    for h in readers {
        h.join().unwrap();
    }
    stop.store(true, SeqCst);
    writer.join().unwrap()
}

/// A command-line tool the tests drive (Debian packages `.ci/run` installs).
pub fn tool(name: &str) -> std::process::Command {
    let found = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(found, "`{name}` is not installed: apt-get install qemu-utils fio nbdkit (see .ci/run)");
    std::process::Command::new(name)
}

/// An nbdkit server, killed when dropped.
pub struct Nbdkit(pub std::process::Child);
impl Drop for Nbdkit {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// nbdkit's memory plugin (16 MiB) with `filters` and their `params`, on a free port.
pub fn nbdkit(filters: &[&str], params: &[&str]) -> (Nbdkit, u16) {
    nbdkit_memory("16M", filters, params)
}

/// nbdkit's (sparse) memory plugin of `size` with `filters` and their `params`, on a free
/// port.
pub fn nbdkit_memory(size: &str, filters: &[&str], params: &[&str]) -> (Nbdkit, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let c = Nbdkit(
        tool("nbdkit")
            .args(["-f", "-i", "127.0.0.1", "-p", &port.to_string()])
            .args(filters)
            .args(["memory", size])
            .args(params)
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("starting nbdkit"),
    );
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return (c, port);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("nbdkit did not start");
}

/// Waits until the daemon's prewarm ended; its progress.
pub fn prewarm_done(r: &Running) -> cachevisor_server::prewarm_job::Progress {
    let t = std::time::Instant::now();
    loop {
        let p = r.daemon.prewarm_job().progress();
        if !p.running {
            return p;
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(60), "prewarm did not end: {p:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
