//! Day-2: growing and shrinking the cache online. A reload whose `cache.size`
//! changed (within `cache.max_size`) resizes the running cache with a real NBD client
//! (qemu-io) connected: a grow extends the file and the new slots take blocks, a shrink
//! writes the tail's dirty blocks back and cuts the file; a size past `max_size` is
//! refused naming it. After a SIGKILL with dirty blocks past a smaller `cache.size` in
//! the file, the start finishes the shrink. Every byte written reads back throughout.

use cachevisor_testkit as common;

use common::{bin, client, client_ok, qemu_io_ok, s, Daemon, ServeConfig};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn write_config(d: &Path, size: &str) {
    ServeConfig::new(size)
        .cache("max_size", "64MiB")
        .no_writeback()
        .api()
        .section("prewarm", "snapshot_every", "0")
        .vdisk("vm1", "vm1.img", &[("size", s("32MiB")), ("write_policy", s("wb"))])
        .vdisk("vm2", "vm2.img", &[("size", s("32MiB"))])
        .write(d, "c.toml");
}

/// `cachevisor ARGS… --api API --token-file …`: (exit code, stdout + stderr).
fn cli(d: &Path, a: &Daemon, args: &[&str]) -> (i32, String) {
    let o = Command::new(bin())
        .args(args)
        .args(["--api", a.api.as_deref().unwrap(), "--token-file"])
        .arg(d.join("cache.img.meta/api-token"))
        .env_remove("CACHEVISOR_API_TOKEN")
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
    )
}

fn state(d: &Path, a: &Daemon) -> serde_json::Value {
    let (code, out) = cli(d, a, &["cache", "status", "--json"]);
    assert_eq!(code, 0, "{out}");
    serde_json::from_str(&out).unwrap()
}

fn file_len(d: &Path) -> u64 {
    // The cache's bytes, after the store's 4 KiB label (`cache_label.rs`).
    std::fs::metadata(d.join("cache.img")).unwrap().len() - 4096
}

fn reads_back(a: &Daemon) {
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x11 0 8M", "read -P 0x12 8M 24M"]);
    qemu_io_ok(&a.uri("vm2"), &["read -P 0x21 0 16M"]);
}

#[test]
fn the_cache_grows_and_shrinks_online_with_a_client_connected() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_config(d, "16MiB");
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    let st = state(d, &a);
    assert_eq!((st["size_bytes"].as_u64(), st["max_size_bytes"].as_u64()), (Some(16 << 20), Some(64 << 20)), "{st}");
    assert_eq!(file_len(d), 16 << 20, "the file is the size, not the most it may grow to");
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x11 0 8M"]);

    // Grow with a client connected and waiting.
    let c = client(&a.uri("vm1"), &["write -P 0x12 8M 4M".into(), "sleep 2000".into(), "read -P 0x12 8M 4M".into()]);
    std::thread::sleep(Duration::from_millis(500));
    write_config(d, "48MiB");
    let (code, out) = cli(d, &a, &["reload"]);
    assert!(code == 0 && out.contains("grown from 16.00 MiB to 48.00 MiB"), "{code} {out}");
    assert_eq!(file_len(d), 48 << 20);
    client_ok(c);
    // The new slots take blocks: more cached than the old size held.
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x12 8M 24M"]);
    qemu_io_ok(&a.uri("vm2"), &["write -P 0x21 0 16M", "read -P 0x21 0 16M"]);
    let st = state(d, &a);
    assert!(st["cached_blocks"].as_u64().unwrap() > 4096, "{st}");
    let dirty = st["dirty_blocks"].as_u64().unwrap();
    assert!(dirty > 2048, "{st}");

    // Past max_size: refused by name, nothing changed.
    write_config(d, "128MiB");
    let (code, out) = cli(d, &a, &["reload"]);
    assert!(code == 1 && out.contains("cache.max_size"), "{code} {out}");
    assert_eq!((state(d, &a)["size_bytes"].as_u64(), file_len(d)), (Some(48 << 20), 48 << 20));

    // Shrink with a client connected: the tail's dirty blocks are written back first.
    let c = client(&a.uri("vm2"), &["sleep 1500".into(), "read -P 0x21 0 16M".into()]);
    write_config(d, "8MiB");
    let (code, out) = cli(d, &a, &["reload"]);
    assert!(code == 0 && out.contains("shrunk from 48.00 MiB to 8.00 MiB"), "{code} {out}");
    assert_eq!(file_len(d), 8 << 20);
    let st = state(d, &a);
    assert!(st["cached_blocks"].as_u64().unwrap() <= 2048, "{st}");
    client_ok(c);
    // A size that is not whole MiB is reported as it is ("grown to 16 MiB").
    write_config(d, "8.5MiB");
    let (code, out) = cli(d, &a, &["reload"]);
    assert!(code == 0 && out.contains("grown from 8.00 MiB to 8.50 MiB"), "{code} {out}");
    write_config(d, "8MiB");
    let (code, out) = cli(d, &a, &["reload"]);
    assert!(code == 0 && out.contains("shrunk from 8.50 MiB to 8.00 MiB"), "{code} {out}");
    reads_back(&a);
    drop(a);
}

#[test]
fn a_start_finishes_a_shrink_of_a_cache_holding_dirty_blocks_past_the_new_size() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_config(d, "48MiB");
    let mut a = Daemon::start(d, "c.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x11 0 8M", "write -P 0x12 8M 24M"]);
    qemu_io_ok(&a.uri("vm2"), &["write -P 0x21 0 16M"]);
    let dirty = state(d, &a)["dirty_blocks"].as_u64().unwrap();
    assert!(dirty > 2048, "more dirty blocks than an 8 MiB cache holds: {dirty}");
    // SIGKILL, then the file says 8 MiB: the start writes the dirty blocks cached past
    // it back before it serves, and cuts the file.
    a.kill9();
    write_config(d, "8MiB");
    let a = Daemon::start(d, "c.toml", &[]).unwrap();
    assert!(
        a.log().contains("the blocks cached past it were moved into free slots, or written back and dropped"),
        "{}",
        a.log()
    );
    assert_eq!(file_len(d), 8 << 20);
    assert_eq!(state(d, &a)["size_bytes"].as_u64(), Some(8 << 20));
    reads_back(&a);
    // A geometry change is still refused: max_size fixes the layout.
    drop(a);
    std::fs::write(d.join("c.toml"), std::fs::read_to_string(d.join("c.toml")).unwrap().replace("64MiB", "96MiB"))
        .unwrap();
    let e = Daemon::start(d, "c.toml", &[]).err().expect("refused");
    assert!(e.output.contains("slots"), "{}", e.output);
}
