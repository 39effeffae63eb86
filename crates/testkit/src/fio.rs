//! fio as tests run it against an export: crc32c-verified 4 KiB random writes, started in
//! the background so a test can act on the daemon (a device cut, removed) while they run,
//! then waited for with every write checked.

use std::process::{Child, Command, Stdio};

/// fio's crc32c-verified 4 KiB random writes at queue depth 8 on NBD `uri`, over `extra`'s
/// range (`--offset`, `--size`, `--loops`, `--rate_iops`, `--verify_only` …), started
/// (not waited for).
pub fn fio_verified(uri: &str, extra: &[&str]) -> Fio {
    let child = Command::new("fio")
        .args(["--name=v", "--ioengine=nbd", &format!("--uri={uri}"), "--rw=randwrite", "--bs=4k"])
        .args(["--iodepth=8", "--verify=crc32c", "--verify_fatal=1", "--do_verify=1", "--output-format=terse"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fio (apt-get install fio)");
    Fio(child)
}

/// A running fio.
pub struct Fio(Child);

impl Fio {
    /// Waits for fio and asserts that every write it verified read back.
    pub fn wait_ok(self) {
        let out = self.0.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "fio: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
