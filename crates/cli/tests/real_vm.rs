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

mod common;
use common::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The guest's /init: loads the modules, makes and fills a file system in two phases
/// (the second while the host restarts the daemon), checks it after a remount, and reports
/// on the serial console with `GUEST:` lines.
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /mnt /tmp /bin
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /lib/modules/load-order); do insmod /lib/modules/$m.ko || echo "GUEST: insmod $m failed"; done
i=0
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
umount /mnt
echo 3 > /proc/sys/vm/drop_caches
mount -t ext2 /dev/vda /mnt || echo "GUEST: FAIL remount"
if md5sum -c /tmp/sums > /tmp/check 2>&1; then echo "GUEST: checksums ok"; else cat /tmp/check; echo "GUEST: checksums FAILED"; fi
echo "GUEST: io errors $(dmesg | grep -c -i -E 'I/O error|blk_update_request|critical medium|EXT[24]-fs error|EXT[24]-fs warning')"
dmesg | grep -i -E 'error|warning' | head -20
umount /mnt
echo "GUEST: done"
poweroff -f
"#;

/// Where `scripts/guest-kernel` put the kernel (or `CACHEVISOR_GUEST_KERNEL`).
fn kernel_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CACHEVISOR_GUEST_KERNEL") {
        return d.into();
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/guest-kernel")
}

/// Builds the initramfs (newc cpio): static busybox, /init, the kernel's modules.
fn initramfs(dir: &Path, kernel: &Path) -> PathBuf {
    let stage = dir.join("initramfs");
    std::fs::create_dir_all(stage.join("bin")).unwrap();
    std::fs::create_dir_all(stage.join("lib/modules")).unwrap();
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("busybox is not installed (Debian's busybox-static; scripts/test installs it)");
    let ldd = Command::new("ldd")
        .arg(busybox)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr))
        .unwrap_or_default();
    assert!(
        ldd.contains("not a dynamic executable") || ldd.contains("statically linked"),
        "{busybox} must be static (Debian's busybox-static): {ldd}"
    );
    std::fs::copy(busybox, stage.join("bin/busybox")).unwrap();
    std::fs::write(stage.join("init"), INIT).unwrap();
    let mut mode = std::fs::metadata(stage.join("init")).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut mode, 0o755);
    std::fs::set_permissions(stage.join("init"), mode).unwrap();
    for e in std::fs::read_dir(kernel.join("modules")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), stage.join("lib/modules").join(e.file_name())).unwrap();
    }
    std::fs::copy(kernel.join("load-order"), stage.join("lib/modules/load-order")).unwrap();
    let out = dir.join("initramfs.cpio");
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("cd '{}' && find . | cpio -o -H newc --quiet > '{}'", stage.display(), out.display()))
        .status()
        .expect("sh");
    assert!(ok.success(), "cpio failed (Debian's cpio; scripts/test installs it)");
    out
}

/// vDisk `guest`'s read hits since the daemon started (from the API).
fn read_hits(api: &str) -> u64 {
    let v: serde_json::Value = ureq::get(&format!("http://{api}/vdisks")).call().unwrap().into_json().unwrap();
    v[0]["stats"]["read_hit_blocks"].as_u64().unwrap()
}

#[test]
fn a_linux_guest_survives_a_daemon_crash_without_an_io_error() {
    let kernel = kernel_dir();
    assert!(
        kernel.join("vmlinuz").exists() && kernel.join("load-order").exists(),
        "no guest kernel at {}: run scripts/guest-kernel (scripts/test does), which unpacks Debian's linux-image-amd64 there",
        kernel.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let initrd = initramfs(d, &kernel);
    let (port, api) = (free_port(), free_port());
    let pki = certs::Pki::new(&d.join("pki"));
    let host = pki.client("hypervisor", "/O=tenant1/CN=hypervisor-1", None, 1);
    std::fs::write(
        d.join("vm.toml"),
        format!(
            "[cache]\npath = \"cache.img\"\nsize = \"128MiB\"\nblock_size = \"4KiB\"\nwrite_policy = \"wb\"\nflush_rate = \"0\"\n\
             [listen]\ntcp = \"127.0.0.1:{port}\"\ntls = \"require\"\ntls_dir = \"pki/server\"\n[api]\nlisten = \"127.0.0.1:{api}\"\n\
             [[vdisk]]\nname = \"guest\"\nbacking = \"guest.img\"\nsize = \"256MiB\"\nallow = [\"CN=hypervisor-1,O=tenant1\"]\n"
        ),
    )
    .unwrap();
    let mut daemon = Daemon::start(d, "vm.toml", &[]).unwrap_or_else(|e| panic!("{e:?}"));
    let mut qemu = Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg", "-m", "256M", "-nographic", "-no-reboot", "-nodefaults", "-serial", "stdio"])
        .arg("-kernel")
        .arg(kernel.join("vmlinuz"))
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", "console=ttyS0 panic=-1 loglevel=4"])
        .args(["-object", &format!("tls-creds-x509,id=tls0,dir={},endpoint=client", host.display())])
        .arg("-blockdev")
        .arg(format!("driver=nbd,node-name=disk,server.type=inet,server.host=127.0.0.1,server.port={port},export=guest,tls-creds=tls0,reconnect-delay=30"))
        .args(["-device", "virtio-blk-pci,drive=disk"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qemu-system-x86_64 is not installed (Debian's qemu-system-x86; scripts/test installs it)");
    let (tx, rx) = mpsc::channel::<String>();
    let out = qemu.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let mut console: Vec<String> = Vec::new();
    let started = Instant::now();
    let wait_for = |marker: &str, console: &mut Vec<String>| {
        let end = Instant::now() + Duration::from_secs(120);
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) => {
                    let hit = l.contains(marker);
                    console.push(l);
                    if hit {
                        return;
                    }
                }
                Err(_) => panic!("no `{marker}` from the guest; console:\n{}", console.join("\n")),
            }
        }
    };
    wait_for("GUEST: phase1 written", &mut console);
    // The daemon dies while the guest writes its second phase; QEMU holds the requests and
    // reconnects to the restarted daemon.
    daemon.kill9();
    std::thread::sleep(Duration::from_millis(500));
    let daemon = Daemon::start(d, "vm.toml", &[]).unwrap_or_else(|e| panic!("{e:?}"));
    assert!(daemon.banner.iter().any(|l| l.starts_with("# warm start")), "{:?}", daemon.banner);
    wait_for("GUEST: done", &mut console);
    let status = qemu.wait().unwrap();
    let mut qemu_log = String::new();
    std::io::Read::read_to_string(&mut qemu.stderr.take().unwrap(), &mut qemu_log).unwrap();
    let text = console.join("\n");
    eprintln!("guest ran {:.1} s; console:\n{text}\nqemu:\n{qemu_log}", started.elapsed().as_secs_f64());
    // QEMU's NBD client came back to the restarted daemon (the second phase's writes and
    // syncs waited for it) ...
    assert!(daemon.log().contains("connected"), "QEMU did not reconnect:\n{}", daemon.log());
    assert!(status.success(), "qemu: {status}");
    assert!(!text.contains("GUEST: FAIL") && !text.contains("failed"), "{text}");
    assert!(text.contains("GUEST: checksums ok"), "{text}");
    assert!(text.contains("GUEST: io errors 0"), "the guest saw I/O errors:\n{text}");
    assert!(read_hits(daemon.api.as_deref().unwrap()) > 0, "the restarted cache served no hits");
}
