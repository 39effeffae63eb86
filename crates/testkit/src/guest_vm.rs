//! A real Linux guest for tests and `bench vhost`: Debian's kernel (unpacked by `scripts/guest-kernel`,
//! which `scripts/test` runs) booted under `qemu-system-x86_64` (TCG) with a busybox
//! initramfs built here — the test's `/init`, the kernel's modules, and any host programs
//! the guest runs (with the shared libraries they load) — its serial console read line by
//! line. Without the guest kernel a test fails saying how to get it; it never skips.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Where `scripts/guest-kernel` put the kernel (or `CACHEVISOR_GUEST_KERNEL`), checked.
#[allow(dead_code)] // the tests'
pub fn kernel_dir() -> PathBuf {
    let k = match std::env::var_os("CACHEVISOR_GUEST_KERNEL") {
        Some(d) => d.into(),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/guest-kernel"),
    };
    assert!(
        k.join("vmlinuz").exists() && k.join("load-order").exists(),
        "no guest kernel at {}: run scripts/guest-kernel (scripts/test does), which unpacks Debian's linux-image-amd64 there",
        k.display()
    );
    k
}

/// The start of every guest's /init: busybox's applets, /proc, /sys and /dev, the
/// kernel's modules in their order (a failure reported as `GUEST: insmod`).
const PRELUDE: &str = r#"#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /mnt /tmp /bin
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /lib/modules/load-order); do insmod /lib/modules/$m.ko || echo "GUEST: insmod $m failed"; done
"#;

/// A guest's /init: the prelude, then `body` (a shell script).
/// The end of a test guest's /init: remounts /mnt, checks the sums in /tmp/sums, counts
/// the kernel's I/O errors (`GUEST: io errors N`), prints `GUEST: done` and powers off.
#[allow(dead_code)] // the tests'
pub const VERIFY_AND_POWER_OFF: &str = r#"umount /mnt
echo 3 > /proc/sys/vm/drop_caches
mount -t ext2 /dev/vda /mnt || echo "GUEST: FAIL remount"
if md5sum -c /tmp/sums > /tmp/check 2>&1; then echo "GUEST: checksums ok"; else cat /tmp/check; echo "GUEST: checksums FAILED"; fi
echo "GUEST: io errors $(dmesg | grep -c -i -E 'I/O error|blk_update_request|critical medium|EXT[24]-fs error|EXT[24]-fs warning')"
dmesg | grep -i -E 'error|warning' | head -20
umount /mnt
echo "GUEST: done"
poweroff -f
"#;

pub fn init(body: &str) -> String {
    format!("{PRELUDE}{body}")
}

/// Copies `src` into the initramfs at `dest` (relative), executable.
fn put(stage: &Path, src: &Path, dest: &str) {
    let to = stage.join(dest);
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::copy(src, &to).unwrap_or_else(|e| panic!("copying {} into the initramfs: {e}", src.display()));
    let mut mode = std::fs::metadata(&to).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut mode, 0o755);
    std::fs::set_permissions(&to, mode).unwrap();
}

/// The shared libraries `program` loads (ldd's paths; none for a static program).
fn libraries(program: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(program).output().expect("ldd");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with('/')).map(PathBuf::from))
        .collect()
}

/// Builds the initramfs (newc cpio) in `dir`: static busybox, `init`, the kernel's
/// modules, and each `(host program, path in the guest)` stripped, with its libraries at
/// their host paths.
pub fn initramfs(dir: &Path, kernel: &Path, init: &str, programs: &[(&Path, &str)]) -> PathBuf {
    let stage = dir.join("initramfs");
    std::fs::create_dir_all(stage.join("lib/modules")).unwrap();
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("busybox is not installed (Debian's busybox-static; scripts/test installs it)");
    assert!(libraries(Path::new(busybox)).is_empty(), "{busybox} must be static (Debian's busybox-static)");
    put(&stage, Path::new(busybox), "bin/busybox");
    std::fs::write(dir.join("init"), init).unwrap();
    put(&stage, &dir.join("init"), "init");
    for e in std::fs::read_dir(kernel.join("modules")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), stage.join("lib/modules").join(e.file_name())).unwrap();
    }
    std::fs::copy(kernel.join("load-order"), stage.join("lib/modules/load-order")).unwrap();
    for (program, at) in programs {
        let stripped = dir.join("stripped");
        let ok = Command::new("strip").arg("-o").arg(&stripped).arg(program).status().expect("strip (binutils)");
        assert!(ok.success(), "strip {} failed", program.display());
        put(&stage, &stripped, at.trim_start_matches('/'));
        for lib in libraries(program) {
            let dest = lib.to_str().unwrap().trim_start_matches('/').to_string();
            put(&stage, &std::fs::canonicalize(&lib).unwrap(), &dest);
        }
    }
    let out = dir.join("initramfs.cpio");
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("cd '{}' && find . | cpio -o -H newc --quiet > '{}'", stage.display(), out.display()))
        .status()
        .expect("sh");
    assert!(ok.success(), "cpio failed (Debian's cpio; scripts/test installs it)");
    out
}

/// A running guest: QEMU and its console's lines so far.
pub struct Guest {
    pub qemu: Child,
    lines: mpsc::Receiver<String>,
    pub console: Vec<String>,
    pub started: Instant,
}

impl Guest {
    /// Boots `kernel` with `initrd` and `mem` of RAM; `args` add QEMU's devices.
    pub fn boot(kernel: &Path, initrd: &Path, mem: &str, args: &[String]) -> Guest {
        Guest::boot_in(None, kernel, initrd, mem, args)
    }

    /// [`Guest::boot`] inside the network namespace `netns` (`ip netns exec`, which execs
    /// QEMU: the child is QEMU itself).
    pub fn boot_in(netns: Option<&str>, kernel: &Path, initrd: &Path, mem: &str, args: &[String]) -> Guest {
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "qemu-system-x86_64"]);
                c
            }
            None => Command::new("qemu-system-x86_64"),
        };
        let mut qemu = cmd
            .args(["-accel", "tcg", "-m", mem, "-nographic", "-no-reboot", "-nodefaults", "-serial", "stdio"])
            .arg("-kernel")
            .arg(kernel.join("vmlinuz"))
            .arg("-initrd")
            .arg(initrd)
            .args(["-append", "console=ttyS0 panic=-1 loglevel=4"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("qemu-system-x86_64 is not installed (Debian's qemu-system-x86; scripts/test installs it)");
        let (tx, lines) = mpsc::channel::<String>();
        let out = qemu.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        Guest { qemu, lines, console: Vec::new(), started: Instant::now() }
    }

    /// Waits (up to `within`) for a console line containing `marker`; panics with the
    /// console and QEMU's errors if it does not come.
    pub fn wait_for(&mut self, marker: &str, within: Duration) -> String {
        let end = Instant::now() + within;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = l.contains(marker);
                    self.console.push(l.clone());
                    if hit {
                        return l;
                    }
                }
                Err(_) => {
                    let _ = self.qemu.kill();
                    let mut err = String::new();
                    if let Some(mut e) = self.qemu.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut e, &mut err);
                    }
                    panic!("no `{marker}` from the guest; console:\n{}\nqemu:\n{err}", self.console.join("\n"))
                }
            }
        }
    }

    /// Waits for QEMU to exit; its status and stderr.
    pub fn finish(mut self) -> (std::process::ExitStatus, String, String) {
        let status = self.qemu.wait().unwrap();
        while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
            self.console.push(l);
        }
        let mut err = String::new();
        std::io::Read::read_to_string(&mut self.qemu.stderr.take().unwrap(), &mut err).unwrap();
        (status, self.console.join("\n"), err)
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.qemu.kill();
        let _ = self.qemu.wait();
    }
}
