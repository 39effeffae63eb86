//! Libvirt and QEMU: the domain XML in `dist/libvirt/vm1.xml` (and docs/daemon.md's
//! copy of its disks) is valid for libvirt's schema (`virt-xml-validate`), and the
//! daemon page's qemu-storage-daemon and qemu-system lines work against a running daemon —
//! data written through the qemu-storage-daemon's export reaches the cachevisor vDisk.

use cachevisor_testkit as common;

use common::{qemu_io_ok, s, Daemon, ServeConfig};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn validates(xml: &Path) -> (bool, String) {
    let o = Command::new("virt-xml-validate")
        .arg(xml)
        .arg("domain")
        .output()
        .expect("virt-xml-validate is installed (libvirt-clients; scripts/setup --tests installs it)");
    (o.status.success(), String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr))
}

#[test]
fn the_domain_xml_validates_and_the_readme_shows_its_disks() {
    let xml = repo().join("dist/libvirt/vm1.xml");
    let (ok, out) = validates(&xml);
    assert!(ok, "{out}");
    // The check can fail: a protocol libvirt does not know.
    let text = std::fs::read_to_string(&xml).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.xml");
    std::fs::write(&bad, text.replace("protocol='nbd'", "protocol='nbdx'")).unwrap();
    assert!(!validates(&bad).0, "a bad protocol validated");
    let readme = std::fs::read_to_string(repo().join("docs/daemon.md")).unwrap();
    let mut rest = text.as_str();
    let mut disks = 0;
    while let Some(at) = rest.find("    <disk ") {
        let end = rest[at..].find("</disk>\n").unwrap() + at + "</disk>\n".len();
        assert!(
            readme.contains(&rest[at..end]),
            "docs/daemon.md's XML differs from the file's disk:\n{}",
            &rest[at..end]
        );
        disks += 1;
        rest = &rest[end..];
    }
    assert_eq!(disks, 2);
}

fn wait_for_socket(p: &Path, c: &mut Child) {
    let t = Instant::now();
    while !p.exists() {
        if let Ok(Some(s)) = c.try_wait() {
            panic!("qemu-storage-daemon exited: {s}");
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no socket {}", p.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `qemu-system-x86_64`, paused, with docs/daemon.md's `-blockdev` for export `export`: still
/// running after two seconds (it opened the export), or its output when it exited.
fn qemu_paused(port: &str, export: &str) -> Result<(), String> {
    let mut c = Command::new("qemu-system-x86_64")
        .args(["-machine", "q35", "-accel", "tcg", "-nodefaults", "-display", "none", "-S", "-monitor", "none"])
        .arg("-blockdev")
        .arg(format!("driver=nbd,node-name=disk0,server.type=inet,server.host=127.0.0.1,server.port={port},export={export},reconnect-delay=30"))
        .args(["-device", "virtio-blk-pci,drive=disk0,physical_block_size=4096,werror=enospc,rerror=report"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qemu-system-x86_64 is installed (scripts/setup --tests)");
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(2) {
        if c.try_wait().unwrap().is_some() {
            let o = c.wait_with_output().unwrap();
            return Err(String::from_utf8_lossy(&o.stderr).to_string());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = c.kill();
    let _ = c.wait();
    Ok(())
}

#[test]
fn the_readme_qemu_lines_reach_a_cachevisor_export() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ServeConfig::new("16MiB")
        .vdisk("vm1", "vm1.img", &[("size", s("8MiB")), ("write_policy", s("wb"))])
        .write(d, "q.toml");
    let a = Daemon::start(d, "q.toml", &[]).unwrap();
    let port = a.nbd.rsplit(':').next().unwrap().to_string();
    let sock = d.join("qsd.sock");
    /// Killed when dropped (a failed assertion must not leave it running).
    struct Killed(Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut qsd = Command::new("qemu-storage-daemon")
        .arg("--blockdev")
        .arg(format!("driver=nbd,node-name=vm1,server.type=inet,server.host=127.0.0.1,server.port={port},export=vm1,reconnect-delay=30"))
        .arg("--nbd-server")
        .arg(format!("addr.type=unix,addr.path={}", sock.display()))
        .args(["--export", "type=nbd,id=vm1,node-name=vm1,name=vm1,writable=on"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Killed)
        .expect("qemu-storage-daemon is installed (qemu-system-common)");
    wait_for_socket(&sock, &mut qsd.0);
    let via_qsd = format!("nbd+unix:///vm1?socket={}", sock.display());
    qemu_io_ok(&via_qsd, &["write -P 0x5a 0 1M", "flush", "read -P 0x5a 0 1M"]);
    drop(qsd);
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x5a 0 1M"]);
    qemu_paused(&port, "vm1").unwrap();
    let e = qemu_paused(&port, "nope").expect_err("QEMU started on an export that does not exist");
    assert!(e.contains("nope") || e.contains("export"), "{e}");
}
