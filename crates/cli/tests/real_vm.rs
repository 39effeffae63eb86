//! A real Linux guest on a cachevisor disk: Debian's kernel (unpacked by
//! `scripts/guest-kernel`, which `scripts/test` runs) boots under `qemu-system-x86_64` (TCG)
//! with a busybox initramfs built here, its disk a write-back cachevisor NBD export served
//! over TLS (`tls = "require"`, a client certificate on the vDisk's `allow` list, QEMU's
//! `tls-creds-x509`; certificates made by the test). The guest makes an ext2 file system, writes files, syncs and checksums them; meanwhile the
//! daemon is SIGKILLed and restarted once, and QEMU's NBD client reconnects (a new TLS
//! handshake). The guest must
//! see no I/O error, every checksum must match after a remount, and the restarted cache
//! must serve hits at once (warm restart). Without the guest kernel the test fails, saying
//! how to get it; it never skips silently.

use cachevisor_testkit as common;
use common::guest_vm;
use common::*;
use std::time::Duration;

/// The guest's /init: loads the modules, makes and fills a file system in two phases
/// (the second while the host restarts the daemon), and reports on the serial console with
/// `GUEST:` lines; `guest_vm::VERIFY_AND_POWER_OFF` checks it after a remount.
const INIT: &str = r#"i=0
while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
echo "GUEST: disk $(cat /sys/block/vda/size) sectors"
mke2fs -q -b 4096 /dev/vda || echo "GUEST: FAIL mke2fs"
mount -t ext2 /dev/vda /mnt || echo "GUEST: FAIL mount"
for i in 1 2 3 4 5 6 7 8; do dd if=/dev/urandom of=/mnt/a$i bs=64k count=16 2>/dev/null; done
sync
md5sum /mnt/a* > /tmp/sums
echo "GUEST: phase1 written"
for i in 1 2 3 4 5 6 7 8; do dd if=/dev/urandom of=/mnt/b$i bs=64k count=16 2>/dev/null; sync; sleep 0.25; done
md5sum /mnt/b* >> /tmp/sums
echo "GUEST: phase2 written"
"#;

/// vDisk `guest`'s read hits since the daemon started (from the API).
fn read_hits(api: &str) -> u64 {
    let v: serde_json::Value = ureq::get(&format!("http://{api}/vdisks")).call().unwrap().into_json().unwrap();
    v[0]["stats"]["read_hit_blocks"].as_u64().unwrap()
}

/// How the guest's disk reaches the daemon.
#[derive(Clone, Copy, PartialEq)]
enum Door {
    /// QEMU's NBD client over TLS with a client certificate, `reconnect-delay=30`.
    NbdTls,
    /// vhost-user-blk, the chardev reconnecting every second.
    VhostUser,
}

/// Boots the guest on its disk through `door`, SIGKILLs and restarts the daemon during the
/// second phase, and checks what the guest saw.
fn survive_a_crash(door: Door) {
    let kernel = guest_vm::kernel_dir();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let initrd =
        guest_vm::initramfs(d, &kernel, &guest_vm::init(&format!("{INIT}{}", guest_vm::VERIFY_AND_POWER_OFF)), &[]);
    let (port, api) = (free_port(), free_port());
    let pki = certs::Pki::new(&d.join("pki"));
    let host = pki.client("hypervisor", "/O=tenant1/CN=hypervisor-1", None, 1);
    std::fs::create_dir(d.join("vhost")).unwrap();
    let listen = match door {
        Door::NbdTls => {
            vec![("tcp", s(&format!("127.0.0.1:{port}"))), ("tls", s("require")), ("tls_dir", s("pki/server"))]
        }
        Door::VhostUser => vec![("vhost_user", s("vhost"))],
    };
    // The export has `allow` (TLS clients): over vhost-user the operator names who may
    // open it, here the daemon's own user, as QEMU runs.
    let mut guest = vec![("size", s("256MiB")), ("allow", strings(&["CN=hypervisor-1,O=tenant1"]))];
    if door == Door::VhostUser {
        guest.push(("vhost_user", s("owner")));
    }
    let cfg = listen.into_iter().fold(ServeConfig::new("128MiB").no_tcp(), |c, (k, v)| c.listen(k, v));
    cfg.cache("block_size", "4KiB")
        .cache("write_policy", "wb")
        .cache("flush_rate", "0")
        .api_key("listen", format!("127.0.0.1:{api}"))
        .vdisk("guest", "guest.img", &guest)
        .write(d, "vm.toml");
    let socket = d.join("vhost/guest.sock");
    let wait_socket = |daemon: &Daemon| {
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while door == Door::VhostUser && !socket.exists() {
            assert!(std::time::Instant::now() < end, "no vhost-user socket:\n{}", daemon.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let mut daemon = Daemon::start(d, "vm.toml", &[]).unwrap_or_else(|e| panic!("{e:?}"));
    wait_socket(&daemon);
    let args: Vec<String> = match door {
        Door::NbdTls => vec![
            "-object".into(),
            format!("tls-creds-x509,id=tls0,dir={},endpoint=client", host.display()),
            "-blockdev".into(),
            format!("driver=nbd,node-name=disk,server.type=inet,server.host=127.0.0.1,server.port={port},export=guest,tls-creds=tls0,reconnect-delay=30"),
            "-device".into(),
            "virtio-blk-pci,drive=disk".into(),
        ],
        Door::VhostUser => vec![
            "-object".into(),
            "memory-backend-memfd,id=mem,size=256M,share=on".into(),
            "-machine".into(),
            "pc,memory-backend=mem".into(),
            "-chardev".into(),
            format!("socket,id=disk,path={},reconnect=1", socket.display()),
            "-device".into(),
            "vhost-user-blk-pci,chardev=disk".into(),
        ],
    };
    let mut guest = guest_vm::Guest::boot(&kernel, &initrd, "256M", &args);
    guest.wait_for("GUEST: phase1 written", Duration::from_secs(120));
    // The daemon dies while the guest writes its second phase; QEMU holds the requests and
    // reconnects to the restarted daemon.
    daemon.kill9();
    std::thread::sleep(Duration::from_millis(500));
    let daemon = Daemon::start(d, "vm.toml", &[]).unwrap_or_else(|e| panic!("{e:?}"));
    wait_socket(&daemon);
    assert!(daemon.banner.iter().any(|l| l.starts_with("# warm start")), "{:?}", daemon.banner);
    guest.wait_for("GUEST: done", Duration::from_secs(120));
    let started = guest.started;
    let (status, text, qemu_log) = guest.finish();
    eprintln!("guest ran {:.1} s; console:\n{text}\nqemu:\n{qemu_log}", started.elapsed().as_secs_f64());
    // QEMU came back to the restarted daemon (the second phase's writes and syncs waited
    // for it) ...
    assert!(daemon.log().contains("connected"), "QEMU did not reconnect:\n{}", daemon.log());
    assert!(status.success(), "qemu: {status}");
    assert!(!text.contains("GUEST: FAIL") && !text.contains("failed"), "{text}");
    assert!(text.contains("GUEST: checksums ok"), "{text}");
    assert!(text.contains("GUEST: io errors 0"), "the guest saw I/O errors:\n{text}");
    assert!(read_hits(daemon.api.as_deref().unwrap()) > 0, "the restarted cache served no hits");
}

#[test]
fn a_linux_guest_survives_a_daemon_crash_without_an_io_error() {
    survive_a_crash(Door::NbdTls);
}

#[test]
fn a_linux_guest_on_vhost_user_blk_survives_a_daemon_crash_without_an_io_error() {
    survive_a_crash(Door::VhostUser);
}
