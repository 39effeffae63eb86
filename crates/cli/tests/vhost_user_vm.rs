//! a real Linux guest (QEMU, TCG) whose disks are cachevisor exports served as
//! **vhost-user-blk** devices (`-device vhost-user-blk-pci`, guest memory shared through a
//! memfd) — no NBD in the data path — and whose elastic vSSD is managed from inside the
//! guest: `cachevisor-guest` runs in the guest's initramfs on the vSSD's virtio disk, with
//! a vDisk as its origin and the vSSD's control channel on a virtio-serial port, while the
//! operator inflates and deflates the vSSD through the API. The guest also makes an ext2
//! file system on a vDisk with two queues, writes, syncs, remounts and checks every file.
//! The guest must see no I/O error on its vDisks, every read the manager checks must
//! match, and the daemon must have served both kinds of export over vhost-user.

use cachevisor_testkit as common;

use common::guest_vm::{init, initramfs, kernel_dir, Guest};
use common::*;
use std::path::Path;
use std::time::{Duration, Instant};

/// The guest's /init: finds its disks by their virtio serial (the export name GET_ID
/// returns) and the control port by name, runs the two parts, reports with `GUEST:` lines.
const INIT: &str = r#"i=0
while [ ! -b /dev/vdc ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
dev_of() { for b in /sys/block/vd*; do [ "$(cat $b/serial)" = "$1" ] && echo /dev/${b##*/}; done; }
DATA=$(dev_of data); ORIGIN=$(dev_of origin); VSSD=$(dev_of vssd1)
PORT=""
for p in /sys/class/virtio-ports/*; do [ "$(cat $p/name)" = "cachevisor.vssd1" ] && PORT=/dev/${p##*/}; done
echo "GUEST: disks data=$DATA origin=$ORIGIN vssd=$VSSD control=$PORT vssd-sectors=$(cat /sys/block/${VSSD#/dev/}/size) queues=$(ls /sys/block/${DATA#/dev/}/mq | wc -l)"
mke2fs -q -b 4096 $DATA || echo "GUEST: FAIL mke2fs"
mount -t ext2 $DATA /mnt || echo "GUEST: FAIL mount"
for i in 1 2 3 4 5 6; do dd if=/dev/urandom of=/mnt/f$i bs=64k count=16 2>/dev/null; done
sync
md5sum /mnt/f* > /tmp/sums
umount /mnt
echo 3 > /proc/sys/vm/drop_caches
mount -t ext2 $DATA /mnt || echo "GUEST: FAIL remount"
if md5sum -c /tmp/sums > /tmp/check 2>&1; then echo "GUEST: checksums ok"; else cat /tmp/check; echo "GUEST: checksums FAILED"; fi
umount /mnt
echo "GUEST: manager start"
/bin/cachevisor-guest --vssd $VSSD --control $PORT --origin $ORIGIN --mode write-back --write-ratio 0.3 --verify --duration 24s --interval 2s --io-size 64KiB --hot 0.9:0.3 > /tmp/g.out 2>&1
rc=$?
sed 's/^/GUEST: | /' /tmp/g.out
echo "GUEST: manager exit $rc"
echo "GUEST: vssd io errors $(dmesg | grep "${VSSD#/dev/}" | grep -c -i -E 'I/O error')"
echo "GUEST: io errors $(dmesg | grep -E "${DATA#/dev/}|${ORIGIN#/dev/}" | grep -c -i -E 'I/O error|blk_update_request|critical medium|EXT[24]-fs error')"
dmesg | grep -i -E 'error|warning' | head -20
echo "GUEST: done"
poweroff -f
"#;

/// `POST /vssds/vssd1/target` with `blocks`.
fn set_target(d: &Path, api: &str, blocks: u32) {
    let token = std::fs::read_to_string(d.join("cache.img.meta/api-token")).unwrap();
    ureq::post(&format!("http://{api}/vssds/vssd1/target"))
        .set("Authorization", &format!("Bearer {token}"))
        .send_json(serde_json::json!({ "blocks": blocks }))
        .unwrap();
}

/// vSSD `vssd1`'s valid blocks (from the API).
fn valid_blocks(api: &str) -> u64 {
    let l: serde_json::Value = ureq::get(&format!("http://{api}/vssds")).call().unwrap().into_json().unwrap();
    l.as_array().unwrap().iter().find(|v| v["name"] == "vssd1").unwrap()["valid"].as_u64().unwrap()
}

#[test]
fn a_linux_guest_runs_on_vhost_user_blk_and_manages_its_elastic_vssd_from_inside() {
    let kernel = kernel_dir();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let initrd = initramfs(d, &kernel, &init(INIT), &[(Path::new(common::bins::guest()), "/bin/cachevisor-guest")]);
    std::fs::create_dir(d.join("vhost")).unwrap();
    let api = free_port();
    ServeConfig::new("64MiB")
        .cache("block_size", "4KiB")
        .cache("write_policy", "wb")
        .cache("flush_rate", "0")
        .no_tcp()
        .listen("unix", "nbd.sock")
        .listen("vhost_user", "vhost")
        .api_key("listen", format!("127.0.0.1:{api}"))
        .section("vssd", "size", "32MiB")
        .section("vssd", "deflate_grace", "3s")
        .array_item("vssd.device", &[("name", s("vssd1")), ("max_size", s("32MiB")), ("initial_size", s("8MiB"))])
        .vdisk("data", "data.img", &[("size", s("64MiB"))])
        .vdisk("origin", "origin.img", &[("size", s("96MiB"))])
        .write(d, "vm.toml");
    let daemon = Daemon::start(d, "vm.toml", &[]).unwrap_or_else(|e| panic!("{e:?}"));
    let api = daemon.api.clone().unwrap();
    let socks = ["data", "origin", "vssd1"].map(|n| d.join(format!("vhost/{n}.sock")));
    let end = Instant::now() + Duration::from_secs(10);
    while !socks.iter().all(|s| s.exists()) {
        assert!(Instant::now() < end, "no vhost-user sockets in {}:\n{}", d.join("vhost").display(), daemon.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut args: Vec<String> = Vec::new();
    let mut arg = |a: &str, b: String| args.extend([a.to_string(), b]);
    arg("-smp", "2".into()); // two vCPUs: the guest uses both of the data disk's queues
    arg("-object", "memory-backend-memfd,id=mem,size=512M,share=on".into());
    arg("-machine", "pc,memory-backend=mem".into());
    for (i, (s, queues)) in socks.iter().zip([2, 1, 1]).enumerate() {
        arg("-chardev", format!("socket,id=blk{i},path={}", s.display()));
        arg("-device", format!("vhost-user-blk-pci,chardev=blk{i},num-queues={queues}"));
    }
    arg("-device", "virtio-serial-pci".into());
    arg("-chardev", format!("socket,id=ctl,path={}", d.join("cache.img.meta/vssd1.vssd.sock").display()));
    arg("-device", "virtserialport,chardev=ctl,name=cachevisor.vssd1".into());
    let mut guest = Guest::boot(&kernel, &initrd, "512M", &args);
    let disks = guest.wait_for("GUEST: disks", Duration::from_secs(120));
    assert!(disks.contains("vssd-sectors=65536") && disks.contains("queues=2"), "{disks}");
    assert!(!disks.contains("=/dev/vd ") && !disks.contains("control= "), "a disk or the port is missing: {disks}");
    guest.wait_for("GUEST: manager start", Duration::from_secs(120));
    // The operator resizes the vSSD while the guest's manager runs: grow to all of M,
    // shrink far below, grow again.
    let mut seen = Vec::new();
    std::thread::sleep(Duration::from_secs(4));
    for blocks in [32, 4, 16] {
        set_target(d, &api, blocks);
        std::thread::sleep(Duration::from_secs(6));
        seen.push(valid_blocks(&api));
    }
    guest.wait_for("GUEST: done", Duration::from_secs(240));
    let (status, text, qemu_log) = guest.finish();
    eprintln!("console:\n{text}\nqemu:\n{qemu_log}\nvalid blocks after each resize: {seen:?}");
    assert!(status.success(), "qemu: {status}\n{qemu_log}");
    assert_eq!(seen, [32, 4, 16], "the vSSD did not reach each target within 6 s");
    assert!(!text.contains("GUEST: FAIL") && !text.contains("insmod"), "{text}");
    assert!(text.contains("GUEST: checksums ok"), "{text}");
    assert!(text.contains("GUEST: manager exit 0"), "the manager failed in the guest:\n{text}");
    assert!(text.contains("reads verified"), "{text}");
    assert!(text.contains("GUEST: io errors 0"), "the guest saw I/O errors on its vDisks:\n{text}");
    // The manager followed the resizes: it was given blocks and gave some back.
    let summary = text.lines().find(|l| l.contains("I/Os,")).unwrap_or_default().to_string();
    let number_after = |word: &str| -> u64 {
        let i = summary.find(word).unwrap_or_else(|| panic!("no `{word}` in {summary}")) + word.len();
        summary[i..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
    };
    assert!(number_after("inflated ") >= 24, "8 to 32 blocks: {summary}");
    assert!(number_after("gave back ") >= 28, "32 to 4 blocks: {summary}");
    // The manager writes below the page cache (O_DIRECT, as dm-cache): no write reaches a
    // block after it was given back; only a block the host took (a missed deadline) may
    // fail.
    let vssd_errors: u64 =
        text.lines().find_map(|l| l.strip_prefix("GUEST: vssd io errors ")).unwrap().parse().unwrap();
    assert!(
        vssd_errors == 0 || number_after("gave back ") > 0 && !summary.contains(" 0 taken"),
        "{vssd_errors} I/O errors on the vSSD: {summary}"
    );
    assert!(number_after("GUEST: | ") > 0 && number_after("I/Os, ") > 0, "no I/O or no read checked: {summary}");
    // The vhost-user requests are in the metrics, as NBD requests are.
    let metrics = ureq::get(&format!("http://{api}/metrics")).call().unwrap().into_string().unwrap();
    let count = |vdisk: &str, op: &str| -> u64 {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("cachevisor_request_duration_seconds_count")
                    && l.contains(&format!("vdisk=\"{vdisk}\""))
                    && l.contains(&format!("op=\"{op}\""))
            })
            .and_then(|l| l.split_whitespace().last()?.parse().ok())
            .unwrap_or(0)
    };
    assert!(count("data", "write") > 0 && count("vssd1", "read") > 0 && count("origin", "read") > 0, "{metrics}");
    // Both kinds of export were served over vhost-user, and ended cleanly.
    let log = daemon.log();
    for name in ["data", "origin", "vssd1"] {
        assert!(
            log.lines().any(|l| l.contains("vhost-user front end connected") && l.contains(name)),
            "{name} not served over vhost-user:\n{log}"
        );
    }
}

#[test]
fn a_vhost_user_directory_that_is_not_one_is_refused_naming_the_key_and_names_that_cannot_be_files_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cfg = |vhost: &str, name: &str, file: &str| {
        ServeConfig::new("4MiB")
            .no_tcp()
            .listen("unix", "nbd.sock")
            .listen("vhost_user", vhost)
            .vdisk(name, "a.img", &[("size", s("4MiB"))])
            .write(d, file);
    };
    cfg("missing", "a", "bad.toml");
    let e = Daemon::start(d, "bad.toml", &[]).err().expect("a start with no vhost_user directory");
    assert!(e.output.contains("listen.vhost_user") && e.output.contains("not a directory"), "{}", e.output);
    // An export name that cannot be a socket's file name is served over NBD only, and
    // says so in the log.
    std::fs::create_dir(d.join("vhost")).unwrap();
    cfg("vhost", "../a b", "odd.toml");
    let daemon = Daemon::start(d, "odd.toml", &[]).unwrap_or_else(|e| panic!("{e:?}"));
    let end = Instant::now() + Duration::from_secs(5);
    while !daemon.log().contains("no vhost-user socket") {
        assert!(Instant::now() < end, "{}", daemon.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(daemon.log().contains("not a file name"), "{}", daemon.log());
    assert_eq!(std::fs::read_dir(d.join("vhost")).unwrap().count(), 0);
}

#[test]
fn vhost_user_sockets_follow_vdisks_added_and_removed_through_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("vhost")).unwrap();
    ServeConfig::new("4MiB")
        .no_tcp()
        .listen("unix", "nbd.sock")
        .listen("vhost_user", "vhost")
        .listen("unix_mode", "0660")
        .api()
        .vdisk("a", "a.img", &[("size", s("4MiB"))])
        .write(d, "a.toml");
    let daemon = Daemon::start(d, "a.toml", &[]).unwrap_or_else(|e| panic!("{e:?}"));
    // Listening before the daemon says it serves, with the configured mode.
    assert!(
        daemon.banner.iter().any(|l| l.starts_with("vhost-user-blk: ") && l.ends_with("vhost/a.sock")),
        "{:?}",
        daemon.banner
    );
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(d.join("vhost/a.sock")).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o660);
    let api = daemon.api.clone().unwrap();
    let auth = format!("Bearer {}", std::fs::read_to_string(d.join("cache.img.meta/api-token")).unwrap());
    let appears = |path: &Path, want: bool| {
        let end = Instant::now() + Duration::from_secs(5);
        while path.exists() != want {
            assert!(Instant::now() < end, "{} exists: {}, wanted {want}", path.display(), path.exists());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    ureq::post(&format!("http://{api}/vdisks"))
        .set("Authorization", &auth)
        .send_json(serde_json::json!({"name": "b", "backing": d.join("b.img"), "size": "4MiB"}))
        .unwrap();
    appears(&d.join("vhost/b.sock"), true);
    ureq::delete(&format!("http://{api}/vdisks/a")).set("Authorization", &auth).call().unwrap();
    appears(&d.join("vhost/a.sock"), false);
    assert!(d.join("vhost/b.sock").exists());
    assert!(daemon.log().contains("export gone: vhost-user socket closed"), "{}", daemon.log());
}

/// A QEMU (TCG, not booting: `-S`) with `sock` as a vhost-user-blk device; returns once its
/// monitor prompt is up — QEMU sets the device up (features, memory table, config space)
/// before it — or panics naming `what`.
fn qemu_attached(sock: &Path, what: &str) -> std::process::Child {
    use std::io::Read;
    let mut q = std::process::Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg", "-S", "-nodefaults", "-display", "none", "-monitor", "stdio"])
        .args(["-object", "memory-backend-memfd,id=mem,size=64M,share=on", "-machine", "pc,memory-backend=mem"])
        .args(["-chardev", &format!("socket,id=b,path={}", sock.display()), "-device", "vhost-user-blk-pci,chardev=b"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = q.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut b = [0u8; 256];
        while let Ok(n) = out.read(&mut b) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&b[..n]);
            if String::from_utf8_lossy(&seen).contains("(qemu)") {
                let _ = tx.send(());
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs(60)).is_err() {
        let _ = q.kill();
        let mut err = String::new();
        let _ = q.stderr.take().unwrap().read_to_string(&mut err);
        panic!("{what}: QEMU did not set the vhost-user device up within 60 s: {err}");
    }
    q
}

#[test]
fn a_vhost_user_socket_serves_again_after_its_front_end_dies_or_misbehaves() {
    // each socket served its first front end only (the vring worker
    // had no exit event, so its clean-up never ended and the next QEMU hung).
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("vhost")).unwrap();
    ServeConfig::new("4MiB")
        .no_tcp()
        .listen("vhost_user", "vhost")
        .api()
        .vdisk("a", "a.img", &[("size", s("4MiB"))])
        .vdisk("b", "b.img", &[("size", s("4MiB"))])
        .write(d, "a.toml");
    let daemon = Daemon::start(d, "a.toml", &[]).unwrap_or_else(|e| panic!("{e:?}"));
    let sock = d.join("vhost/a.sock");
    let connected = || daemon.log().matches("vhost-user front end connected").count();
    for i in 0..10 {
        let mut q = qemu_attached(&sock, &format!("front end {i}"));
        let end = Instant::now() + Duration::from_secs(10);
        while connected() < i + 1 {
            assert!(Instant::now() < end, "front end {i} not logged:\n{}", daemon.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        q.kill().unwrap(); // as a crash would
        q.wait().unwrap();
    }
    // One front end that sends garbage, then a good one.
    {
        use std::io::Write;
        let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        let _ = s.write_all(&[0xa5u8; 64]);
    }
    let mut q = qemu_attached(&sock, "after garbage");
    // Its vDisk removed while it is connected: the connection ends and the socket goes.
    let api = daemon.api.clone().unwrap();
    let auth = format!("Bearer {}", std::fs::read_to_string(d.join("cache.img.meta/api-token")).unwrap());
    ureq::delete(&format!("http://{api}/vdisks/a")).set("Authorization", &auth).call().unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while sock.exists() {
        assert!(Instant::now() < end, "the removed vDisk's socket stayed:\n{}", daemon.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = q.kill();
    let _ = q.wait();
}

#[test]
fn an_export_with_allow_gets_a_vhost_user_socket_only_for_whom_the_operator_names() {
    // `allow` restricts NBD clients to certificates; a vhost-user socket
    // has none, so such an export is not offered unless `vhost_user` names who may.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("vhost")).unwrap();
    ServeConfig::new("4MiB")
        .no_tcp()
        .listen("vhost_user", "vhost")
        .listen("unix_mode", "0660")
        .vdisk("open", "open.img", &[("size", s("4MiB"))])
        .vdisk("tenant", "tenant.img", &[("size", s("4MiB")), ("allow", strings(&["CN=host-a"]))])
        .vdisk(
            "mine",
            "mine.img",
            &[("size", s("4MiB")), ("allow", strings(&["CN=host-a"])), ("vhost_user", s("owner"))],
        )
        .vdisk("off", "off.img", &[("size", s("4MiB")), ("vhost_user", s("none"))])
        .write(d, "a.toml");
    let o = std::process::Command::new(bin())
        .current_dir(d)
        .args(["serve", "--check-config", "--config", "a.toml"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{text}{}", String::from_utf8_lossy(&o.stderr));
    for (name, says) in [
        ("open", "mode 0660 (listen.unix_mode)"),
        ("tenant", "not offered: it has `allow`"),
        ("mine", "mode 0600"),
        ("off", "not offered (vhost_user = \"none\")"),
    ] {
        assert!(text.lines().any(|l| l.starts_with(&format!("vhost-user {name}: {says}"))), "{name}: {text}");
    }
    let daemon = Daemon::start(d, "a.toml", &[]).unwrap_or_else(|e| panic!("{e:?}"));
    assert!(daemon.banner.iter().any(|l| l.contains("vhost-user tenant: not offered")), "{:?}", daemon.banner);
    let mode = |n: &str| {
        std::fs::metadata(d.join(format!("vhost/{n}.sock")))
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
    };
    let end = Instant::now() + Duration::from_secs(5);
    while mode("mine").is_err() {
        assert!(Instant::now() < end, "{}", daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!((mode("open").unwrap(), mode("mine").unwrap()), (0o660, 0o600));
    assert!(mode("tenant").is_err() && mode("off").is_err(), "{}", daemon.log());
    // The named one serves a real front end.
    let mut q = qemu_attached(&d.join("vhost/mine.sock"), "mine");
    let _ = q.kill();
    let _ = q.wait();
}
