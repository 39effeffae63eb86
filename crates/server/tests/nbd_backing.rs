//! Another NBD server as the backing store: nbdkit's memory plugin behind the cache.
//! Writes through (and destaged write-back data) land on it; reads of data the cache does
//! not hold come from it.

mod common;
use common::*;
use std::process::{Command, Stdio};

struct Nbdkit(std::process::Child);
impl Drop for Nbdkit {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn nbdkit() -> (Nbdkit, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let c = Command::new("nbdkit")
        .args(["-f", "-i", "127.0.0.1", "-p", &port.to_string(), "memory", "16M"])
        .stderr(Stdio::null())
        .spawn()
        .expect("nbdkit is not installed: apt-get install nbdkit (see .ci/run)");
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return (Nbdkit(c), port);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("nbdkit did not start");
}

#[test]
fn an_nbd_server_behind_the_cache() {
    let (_kit, port) = nbdkit();
    let dir = tempfile::tempdir().unwrap();
    let t = format!("[cache]\npath = \"c.img\"\nsize = \"256KiB\"\n[listen]\ntcp = \"127.0.0.1:0\"\n[[vdisk]]\nname = \"wt\"\nbacking = \"nbd://127.0.0.1:{port}/\"\nwrite_policy = \"wt\"\n");
    let r = serve(&cachevisor_server::Config::parse(&t, "t", dir.path()).unwrap());
    let (mut c, size) = Client::connect(r.tcp.unwrap(), "wt");
    assert_eq!(size, 16 << 20);
    for i in 0..256u64 {
        c.write(i * 4096, &[i as u8; 4096], false).unwrap();
    }
    c.flush().unwrap();
    // Straight from nbdkit: everything written through is there.
    let mut direct = cachevisor_server::nbd::client::Client::connect(format!("127.0.0.1:{port}").parse().unwrap(), "").unwrap();
    for i in (0..256u64).step_by(17) {
        assert_eq!(direct.read(i * 4096, 4096).unwrap().unwrap(), vec![i as u8; 4096]);
    }
    // Data put on the backing behind the cache's back reads through on a miss.
    direct.write(8 << 20, &[0xab; 4096], false).unwrap().unwrap();
    assert_eq!(c.read(8 << 20, 4096).unwrap(), vec![0xab; 4096]);
    for i in 0..256u64 {
        assert_eq!(c.read(i * 4096, 4096).unwrap(), vec![i as u8; 4096]);
    }
}
