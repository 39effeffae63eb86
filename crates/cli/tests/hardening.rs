//! Hardening: each class reproduced with the real daemon process and a
//! real client: a listen path naming a disk image never replaces it (and a stale socket
//! from a SIGKILLed run is served again); no vDisk is backed by the daemon's own files,
//! from the config, the API or a hard link; `check --repair` never writes through a
//! planted link.

use cachevisor_testkit as common;
use common::*;
use std::path::Path;
use std::process::Command;

fn config(dir: &Path, name: &str, listen: &str, backing: &str, extra_vdisk: &str) {
    ServeConfig::new("8MiB")
        .no_tcp()
        .section_toml("listen", listen)
        .api()
        .vdisk_toml("vm1", backing, &format!("size = \"4MiB\"\n{extra_vdisk}"))
        .write(dir, name);
}

fn check_config(dir: &Path, name: &str) -> (Option<i32>, String) {
    let o = Command::new(bin()).current_dir(dir).args(["serve", "--check-config", "--config", name]).output().unwrap();
    (o.status.code(), String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr))
}

#[test]
fn a_socket_path_naming_a_disk_image_is_refused_and_a_stale_socket_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // vm1's image holds a VM's data; the config's unix socket names it by mistake.
    config(d, "a.toml", "tcp = \"127.0.0.1:0\"", "vm1.img", "");
    let a = Daemon::start(d, "a.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x5a 0 4M", "flush"]);
    drop(a);
    let image = std::fs::read(d.join("vm1.img")).unwrap();
    config(d, "typo.toml", "unix = \"vm1.img\"", "vm1.img", "");
    let (code, out) = check_config(d, "typo.toml");
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("listen.unix") && out.contains("not a socket"), "{out}");
    let e = Daemon::start(d, "typo.toml", &[]).err().expect("a socket over a disk image must be refused");
    assert!(e.output.contains("listen.unix") && e.output.contains("not a socket"), "{}", e.output);
    assert_eq!(std::fs::read(d.join("vm1.img")).unwrap(), image, "the image was changed");
    // A vhost-user socket's name held by a regular file: the same.
    std::fs::create_dir(d.join("vhost")).unwrap();
    std::fs::write(d.join("vhost/vm1.sock"), b"not a socket").unwrap();
    config(d, "vh.toml", "vhost_user = \"vhost\"", "vm1.img", "");
    let (code, out) = check_config(d, "vh.toml");
    assert!(code == Some(1) && out.contains("listen.vhost_user (vm1)"), "{out}");
    std::fs::remove_file(d.join("vhost/vm1.sock")).unwrap();
    // A stale socket (its daemon SIGKILLed) is replaced, and served by a real client.
    config(d, "sock.toml", "unix = \"nbd.sock\"", "vm1.img", "");
    let mut a = Daemon::start(d, "sock.toml", &[]).unwrap();
    a.kill9();
    assert!(d.join("nbd.sock").exists(), "the SIGKILLed daemon left its socket");
    let (code, out) = check_config(d, "sock.toml");
    assert_eq!(code, Some(0), "a stale socket is not an error: {out}");
    let a = Daemon::start(d, "sock.toml", &[]).unwrap();
    let uri = format!("nbd+unix:///vm1?socket={}", d.join("nbd.sock").display());
    qemu_io_ok(&uri, &["read -P 0x5a 0 4M"]);
    // A second daemon may not take a live socket (its own cache, the same socket path).
    ServeConfig::new("8MiB")
        .cache("path", "other.img")
        .no_tcp()
        .listen("unix", "nbd.sock")
        .vdisk("vm2", "vm2.img", &[("size", s("4MiB"))])
        .write(d, "other.toml");
    let e = Daemon::start(d, "other.toml", &[]).err().expect("a live socket must not be taken");
    assert!(e.output.contains("running server"), "{}", e.output);
    qemu_io_ok(&uri, &["read -P 0x5a 0 4M"]);
    drop(a);
}

#[test]
fn no_vdisk_is_backed_by_the_daemons_own_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    config(d, "a.toml", "tcp = \"127.0.0.1:0\"", "vm1.img", "");
    let a = Daemon::start(d, "a.toml", &[]).unwrap();
    let token_path = d.join("cache.img.meta/api-token");
    let token = std::fs::read_to_string(&token_path).unwrap().trim().to_string();
    let api = a.api.clone().unwrap();
    std::fs::hard_link(&token_path, d.join("innocent.img")).unwrap();
    let add = |backing: &Path| {
        let o = Command::new("curl")
            .args(["-sS", "--fail-with-body", "-X", "POST", "-H", &format!("Authorization: Bearer {token}")])
            .args(["-H", "Content-Type: application/json", "-d"])
            .arg(format!("{{\"name\": \"x\", \"backing\": \"{}\"}}", backing.display()))
            .arg(format!("http://{api}/vdisks"))
            .output()
            .unwrap();
        (o.status.success(), String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr))
    };
    for (p, why) in [
        (token_path.clone(), "metadata directory"),
        (d.join("cache.img.meta/checkpoint"), "metadata directory"),
        (d.join("innocent.img"), "hard link"),
        (d.join("cache.img"), "cache store"),
        ("/proc/self/environ".into(), "/proc"),
        ("/dev/zero".into(), "character device"),
    ] {
        let (ok, text) = add(&p);
        assert!(!ok && text.contains(why), "{}: {text}", p.display());
    }
    // Nothing was added: a real client finds no export `x`.
    let (ok, out) = qemu_io(&a.uri("x"), &["read 0 512"]);
    assert!(!ok, "{out}");
    drop(a);
    // From the config: --check-config and the start name the key, and create nothing.
    config(d, "own.toml", "tcp = \"127.0.0.1:0\"", "cache.img.meta/api-token", "");
    let (code, out) = check_config(d, "own.toml");
    assert!(code == Some(1) && out.contains("vdisk[0] (vm1).backing") && out.contains("metadata directory"), "{out}");
    let e = Daemon::start(d, "own.toml", &[]).err().expect("refused");
    assert!(e.output.contains("vdisk[0] (vm1).backing"), "{}", e.output);
    assert_eq!(std::fs::read_to_string(&token_path).unwrap().trim(), token);
}

#[test]
fn repair_never_writes_through_a_planted_link() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    config(d, "a.toml", "tcp = \"127.0.0.1:0\"", "vm1.img", "write_policy = \"wb\"\n");
    let mut a = Daemon::start(d, "a.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x33 0 1M", "flush"]);
    a.kill9();
    let meta = d.join("cache.img.meta");
    std::fs::write(d.join("victim"), b"precious").unwrap();
    std::os::unix::fs::symlink(d.join("victim"), meta.join("checkpoint.tmp")).unwrap();
    let o = Command::new(bin()).args(["check", "--repair", "--metadata"]).arg(&meta).output().unwrap();
    assert!(o.status.success(), "{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read(d.join("victim")).unwrap(), b"precious");
    assert!(std::fs::symlink_metadata(meta.join("checkpoint")).unwrap().is_file(), "checkpoint became a link");
    // The start's checkpoint goes the same way; the data is all there.
    std::os::unix::fs::symlink(d.join("victim"), meta.join("checkpoint.tmp")).unwrap();
    let a = Daemon::start(d, "a.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x33 0 1M"]);
    assert_eq!(std::fs::read(d.join("victim")).unwrap(), b"precious");
    // A metadata directory others may write into is refused by name.
    drop(a);
    std::fs::set_permissions(&meta, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let e = Daemon::start(d, "a.toml", &[]).err().expect("a world-writable metadata directory");
    assert!(e.output.contains("chmod go-w"), "{}", e.output);
}

/// `POST` to the daemon's API with its token: (2xx, body).
fn post(d: &Path, api: &str, path: &str) -> (bool, String) {
    let token = std::fs::read_to_string(d.join("cache.img.meta/api-token")).unwrap().trim().to_string();
    let o = Command::new("curl")
        .args(["-sS", "-m", "30", "--fail-with-body", "-X", "POST", "-H", &format!("Authorization: Bearer {token}")])
        .arg(format!("http://{api}{path}"))
        .output()
        .unwrap();
    (o.status.success(), String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr))
}

#[test]
fn files_read_whole_are_regular_and_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    config(d, "a.toml", "tcp = \"127.0.0.1:0\"", "vm1.img", "");
    let a = Daemon::start(d, "a.toml", &[]).unwrap();
    let api = a.api.clone().unwrap();
    let good = std::fs::read_to_string(d.join("a.toml")).unwrap();
    // The config replaced by a link to /dev/zero, then by a FIFO: each reload is refused
    // at once, naming the file, and the daemon serves on.
    std::fs::remove_file(d.join("a.toml")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", d.join("a.toml")).unwrap();
    let (ok, text) = post(d, &api, "/reload");
    assert!(!ok && text.contains("a.toml") && text.contains("character device"), "{text}");
    std::fs::remove_file(d.join("a.toml")).unwrap();
    let fifo = d.join("a.toml");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let (ok, text) = post(d, &api, "/reload");
    assert!(!ok && text.contains("FIFO"), "{text}");
    qemu_io_ok(&a.uri("vm1"), &["write -P 7 0 64k", "read -P 7 0 64k"]);
    std::fs::remove_file(d.join("a.toml")).unwrap();
    std::fs::write(d.join("a.toml"), good).unwrap();
    let (ok, text) = post(d, &api, "/reload");
    assert!(ok, "{text}");
    let mut a = a;
    a.kill9();
    // `cachevisor check` on a FIFO journal: an error naming it, not a hang.
    let meta = d.join("cache.img.meta");
    std::fs::remove_file(meta.join("journal")).unwrap();
    assert!(Command::new("mkfifo").arg(meta.join("journal")).status().unwrap().success());
    let o = Command::new(bin()).args(["check", "--metadata"]).arg(&meta).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && text.contains("journal") && text.contains("FIFO"), "{text}");
}

fn cache_config(dir: &Path) {
    ServeConfig::new("16MiB")
        .no_writeback()
        .vdisk("vm1", "vm1.img", &[("size", s("32MiB")), ("write_policy", s("wb"))])
        .vdisk("vm2", "vm2.img", &[("size", s("8MiB"))])
        .write(dir, "wb.toml");
}

fn check_metadata(meta: &Path) -> (Option<i32>, String) {
    let o = Command::new(bin()).args(["check", "--metadata"]).arg(meta).output().unwrap();
    (o.status.code(), String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr))
}

#[test]
fn a_cache_store_emptied_or_replaced_while_down_is_never_served_as_data() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    cache_config(d);
    // The held-out case: 8 MiB acknowledged in write-back (not on vm1.img), SIGKILL, the
    // cache file truncated to nothing.
    let mut a = Daemon::start(d, "wb.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x61 0 8M", "flush"]);
    qemu_io_ok(&a.uri("vm2"), &["write -P 0x62 0 1M", "read -P 0x62 0 1M"]);
    a.kill9();
    let (code, out) = check_metadata(&d.join("cache.img.meta"));
    assert!(code == Some(0) && out.contains("its label matches"), "{out}");
    let kept = std::fs::read(d.join("cache.img")).unwrap();
    std::fs::OpenOptions::new().write(true).open(d.join("cache.img")).unwrap().set_len(0).unwrap();
    let e = Daemon::start(d, "wb.toml", &[]).err().expect("an emptied cache store must not be served");
    assert!(
        e.output.contains("not the cache store its metadata")
            && e.output.contains("`vm1` 2048 blocks (8.00 MiB)")
            && e.output.contains("--discard-dirty vm1")
            && !e.output.contains("`vm2`"),
        "{}",
        e.output
    );
    let (code, out) = check_metadata(&d.join("cache.img.meta"));
    assert!(code == Some(1) && out.contains("a start would refuse") && out.contains("`vm1` 2048 blocks"), "{out}");
    // The store put back: served warm, every byte the client wrote.
    std::fs::write(d.join("cache.img"), &kept).unwrap();
    let mut a = Daemon::start(d, "wb.toml", &[]).unwrap();
    assert!(a.banner.iter().any(|l| l.contains("(2048 dirty)")), "{:?}", a.banner);
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x61 0 8M"]);
    a.kill9();
    // A copy of the store from before that start (same identity, older generation) is
    // refused too: its bytes are not the metadata's.
    std::fs::write(d.join("cache.img"), &kept).unwrap();
    let mut a = Daemon::start(d, "wb.toml", &[]).unwrap(); // kept's generation is still accepted once
    a.kill9();
    let newer = std::fs::read(d.join("cache.img")).unwrap();
    let mut a = Daemon::start(d, "wb.toml", &[]).unwrap();
    a.kill9();
    std::fs::write(d.join("cache.img"), &kept).unwrap();
    let e = Daemon::start(d, "wb.toml", &[]).err().expect("an old copy must not be served");
    assert!(e.output.contains("older or newer copy"), "{}", e.output);
    std::fs::write(d.join("cache.img"), &newer).unwrap();
    // Another cache's store in its place: refused; with the dirty data discarded
    // deliberately, a cold start that says so, and vm1 reads its backing store (the 8 MiB
    // were never written back: zeros), never the foreign store's bytes.
    let other = tempfile::tempdir().unwrap();
    cache_config(other.path());
    let mut b = Daemon::start(other.path(), "wb.toml", &[]).unwrap();
    qemu_io_ok(&b.uri("vm1"), &["write -P 0x7e 0 8M", "flush"]);
    b.kill9();
    std::fs::copy(other.path().join("cache.img"), d.join("cache.img")).unwrap();
    let e = Daemon::start(d, "wb.toml", &[]).err().expect("a foreign store");
    assert!(e.output.contains("another cache store"), "{}", e.output);
    let a = Daemon::start(d, "wb.toml", &["--discard-dirty", "vm1"]).unwrap();
    assert!(a.banner.iter().any(|l| l.starts_with("# cold start")), "{:?}", a.banner);
    qemu_io_ok(&a.uri("vm1"), &["read -P 0 0 8M"]);
    qemu_io_ok(&a.uri("vm2"), &["read -P 0x62 0 1M"]);
}

#[test]
fn a_cache_store_with_only_clean_blocks_replaced_while_down_starts_cold() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    cache_config(d);
    let mut a = Daemon::start(d, "wb.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm2"), &["write -P 0x62 0 4M", "read -P 0x62 0 4M"]);
    a.kill9();
    std::fs::OpenOptions::new().write(true).open(d.join("cache.img")).unwrap().set_len(0).unwrap();
    let (code, out) = check_metadata(&d.join("cache.img.meta"));
    assert!(code == Some(0) && out.contains("comes up cold"), "{out}");
    let a = Daemon::start(d, "wb.toml", &[]).unwrap();
    assert!(a.banner.iter().any(|l| l.starts_with("# cold start") && l.contains("all clean")), "{:?}", a.banner);
    qemu_io_ok(&a.uri("vm2"), &["read -P 0x62 0 4M"]);
}

#[test]
fn connections_that_never_finish_their_handshake_cannot_keep_real_clients_out() {
    // 1,030 idle TCP connections took every NBD slot; real clients
    // failed ("Failed to read initial magic"), renewably every handshake_timeout.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    config(d, "a.toml", "tcp = \"127.0.0.1:0\"\nhandshake_timeout = \"10min\"", "vm1.img", "");
    let a = Daemon::start(d, "a.toml", &[]).unwrap();
    // An established client (python3-libnbd) holds its connection through the flood.
    // Debian's python3-libnbd is for the system's python.
    let mut held = Command::new("/usr/bin/python3")
        .args(["-c", "import nbd,sys\nh=nbd.NBD()\nh.connect_uri(sys.argv[1])\nh.pwrite(b'\\x42'*4096, 0)\nprint('up', flush=True)\nsys.stdin.readline()\nassert h.pread(4096, 0) == b'\\x42'*4096\nprint('held ok', flush=True)\n", &a.uri("vm1")])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(held.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "up");
    let flood: Vec<std::net::TcpStream> = (0..1030).map(|_| std::net::TcpStream::connect(&a.nbd).unwrap()).collect();
    // A new real client gets in, more than once.
    for i in 0..3 {
        qemu_io_ok(
            &a.uri("vm1"),
            &[&format!("write -P {} 65536 4096", i + 1), &format!("read -P {} 65536 4096", i + 1)],
        );
    }
    std::io::Write::write_all(held.stdin.as_mut().unwrap(), b"\n").unwrap();
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "held ok");
    assert!(held.wait().unwrap().success());
    // The evictions are counted and logged once.
    let metrics =
        Command::new("curl").arg("-s").arg(format!("http://{}/metrics", a.api.clone().unwrap())).output().unwrap();
    let m = String::from_utf8_lossy(&metrics.stdout);
    let evicted: u64 = m
        .lines()
        .find(|l| l.starts_with("cachevisor_handshakes_evicted_total"))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
        .unwrap_or(0);
    assert!(evicted > 700, "{m}");
    assert_eq!(a.log().matches("the oldest are closed to make room").count(), 1, "{}", a.log());
    drop(flood);
}

#[test]
fn small_inputs_are_refused_by_name_before_anything_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // `trace zipf --block-size 0` divided by zero.
    let o = Command::new(bin())
        .current_dir(d)
        .args(["trace", "zipf", "--requests", "10", "--block-size", "0", "-o", "z.bin"])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code() == Some(2) && e.contains("block size") && !e.contains("panicked"), "{e}");
    // Its own output is recognized by `trace info`.
    let o = Command::new(bin())
        .current_dir(d)
        .args(["trace", "zipf", "--requests", "100", "--blocks", "10", "-o", "z.bin"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let o = Command::new(bin()).current_dir(d).args(["trace", "info", "z.bin"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // An invalid max_size + [vssd] config is refused before the cache file or the
    // metadata directory exists.
    ServeConfig::new("8MiB")
        .cache("max_size", "16MiB")
        .section("vssd", "size", "4MiB")
        .vdisk("vm1", "vm1.img", &[("size", s("4MiB"))])
        .write(d, "v.toml");
    let e = Daemon::start(d, "v.toml", &[]).err().expect("refused");
    assert!(e.output.contains("cache.max_size"), "{}", e.output);
    assert!(!d.join("cache.img").exists() && !d.join("cache.img.meta").exists(), "the refused start created files");
    // A negative size and a huge weight are named plainly.
    for (bad, want) in [("size = \"-1MiB\"", "negative"), ("weight = 1e308", "1e308 is outside")] {
        ServeConfig::new("8MiB").vdisk_toml("vm1", "vm1.img", bad).write(d, "w.toml");
        let (code, out) = check_config(d, "w.toml");
        assert!(code == Some(1) && out.contains(want) && out.len() < 400, "{out}");
    }
}

/// Item 0 (checksums): a cache store whose bytes are garbled — while the daemon
/// is down (after a SIGKILL) or under it while it runs — never gives a client or the
/// backing store those bytes: the garbled dirty blocks read as EIO, are counted in
/// `/metrics`, and are never written back; every other block reads what was written.
#[test]
fn garbled_dirty_blocks_are_eio_and_never_written_back() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    cache_config(d);
    let toml = std::fs::read_to_string(d.join("wb.toml"))
        .unwrap()
        .replace("[listen]", "[api]\nlisten = \"127.0.0.1:0\"\n[listen]")
        .replace("[cache]\n", "[cache]\nseal_after = \"2s\"\n");
    std::fs::write(d.join("wb.toml"), toml).unwrap();
    const BLOCKS: u64 = 2048; // 8 MiB of 4 KiB blocks, acknowledged, dirty
    let mut a = Daemon::start(d, "wb.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x61 0 8M", "flush"]);
    // The blocks go cold: sealed (their checksums journaled) after 2 s, committed each second.
    std::thread::sleep(std::time::Duration::from_secs(5));
    a.kill9();
    // 256 KiB of the store's slots (64 blocks) garbled while it is down.
    let garble = |at: u64, len: usize| {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(d.join("cache.img")).unwrap();
        f.write_all_at(&vec![0x5a; len], 4096 + at).unwrap();
        f.sync_all().unwrap();
    };
    let (code, out) = check_metadata(&d.join("cache.img.meta"));
    assert!(code == Some(0) && out.contains("(2048 sealed, 0 failing their checksums)"), "{out}");
    garble(1 << 20, 256 << 10);
    // The offline check reads the sealed blocks and names the loss.
    let (code, out) = check_metadata(&d.join("cache.img.meta"));
    let named =
        out.lines().find(|l| l.contains("dirty blocks of vm1 fail their checksums")).unwrap_or_default().to_string();
    assert!(code == Some(1) && named.starts_with("problem: "), "{out}");
    let a = Daemon::start(d, "wb.toml", &[]).unwrap();
    assert!(
        a.banner.iter().any(|l| l.contains(&format!("({BLOCKS} dirty, {BLOCKS} of them sealed with checksums)"))),
        "{:?}",
        a.banner
    );
    // Every block read on its own: the garbled ones fail, no read returns other bytes.
    let reads = |a: &Daemon| {
        let cmds: Vec<String> = (0..BLOCKS).map(|b| format!("read -P 0x61 {} 4k", b * 4096)).collect();
        let refs: Vec<&str> = cmds.iter().map(|s| s.as_str()).collect();
        let (_, out) = qemu_io(&a.uri("vm1"), &refs);
        assert!(!out.contains("Pattern verification failed"), "{out}");
        out.matches("Input/output error").count()
    };
    let failed = reads(&a);
    assert!((1..=64).contains(&failed), "{failed} blocks failed: only the 64 garbled slots may");
    assert!(named.contains(&format!("problem: {failed} dirty blocks")), "the check named them all: {named}");
    let metrics = |a: &Daemon| {
        let m =
            ureq::get(&format!("http://{}/metrics", a.api.as_ref().unwrap())).call().unwrap().into_string().unwrap();
        let line = m.lines().find(|l| l.starts_with("cachevisor_checksum_mismatches_total")).unwrap().to_string();
        line.rsplit(' ').next().unwrap().parse::<u64>().unwrap()
    };
    assert!(metrics(&a) >= failed as u64);
    assert!(a.log().contains("fail their checksum"), "logged");
    // Write back everything: the garbled blocks stay behind (dirty, poisoned), never on
    // the backing store; every other block is there.
    let (_, out) = destage(a.api.as_deref().unwrap(), &d.join("cache.img.meta/api-token"));
    let backing = std::fs::read(d.join("vm1.img")).unwrap();
    assert!(!backing.contains(&0x5a), "garbled bytes reached the backing store ({out})");
    let on_backing = backing[..8 << 20].chunks(4096).filter(|c| c.iter().all(|&b| b == 0x61)).count();
    assert_eq!(on_backing, BLOCKS as usize - failed, "every other block written back ({out})");
    assert_eq!(reads(&a), failed, "still EIO, never the backing store's older bytes");
    // A client rewriting a lost block heals it.
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x63 0 8M", "read -P 0x63 0 8M"]);
    // Garbled under the running daemon (no restart): the checksums it keeps in memory.
    garble(1 << 20, 64 << 10);
    let cmds: Vec<String> = (0..BLOCKS).map(|b| format!("read -P 0x63 {} 4k", b * 4096)).collect();
    let refs: Vec<&str> = cmds.iter().map(|s| s.as_str()).collect();
    let (_, out) = qemu_io(&a.uri("vm1"), &refs);
    assert!(!out.contains("Pattern verification failed"), "{out}");
    let n = out.matches("Input/output error").count();
    assert!((1..=16).contains(&n), "{n} blocks failed: only the 16 garbled slots may");
}
