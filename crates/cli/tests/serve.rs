//! The daemon as a real process: started from a config file, killed with SIGKILL at random
//! points while a client writes with FLUSH and FUA, and restarted, again and again. After
//! every restart each write the client saw made durable reads back exactly (a block written
//! after its last flush may read as any version written since), and the cache comes back
//! warm. `CACHEVISOR_CRASH_LOOPS` sets the number of rounds (default 50).

use cachevisor_nbd::client::Client;
use cachevisor_testkit::{s, ServeConfig};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const BLOCK: usize = 4096;
const BLOCKS: u64 = 512; // a 2 MiB disk through a 256 KiB cache: evictions all the time

struct Server {
    child: Child,
    addr: SocketAddr,
    warm_blocks: u64,
}

fn start(dir: &Path) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cachevisor"))
        .args(["serve", "--config"])
        .arg(dir.join("serve.toml"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut warm_blocks = 0;
    let addr = loop {
        let l = lines.next().expect("server exited before printing its URIs").unwrap();
        if let Some(rest) = l.strip_prefix("# warm start: ") {
            warm_blocks = rest.split_whitespace().next().unwrap().parse().unwrap();
        } else if let Some(rest) = l.strip_prefix("nbd://") {
            break rest.split('/').next().unwrap().parse().unwrap();
        }
    };
    Server { child, addr, warm_blocks }
}

/// Block contents: the version in the first 8 bytes, then its low byte repeated.
fn content(version: u64) -> Vec<u8> {
    let mut b = vec![version as u8; BLOCK];
    b[..8].copy_from_slice(&version.to_le_bytes());
    b
}

#[test]
fn sigkill_at_random_points_loses_no_flushed_write_and_restarts_warm() {
    let rounds: u64 = std::env::var("CACHEVISOR_CRASH_LOOPS").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
    let dir = tempfile::tempdir().unwrap();
    ServeConfig::new("256KiB")
        .vdisk("wb", "wb.img", &[("size", s("2MiB")), ("write_policy", s("wb"))])
        .write(dir.path(), "serve.toml");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
    // Per block: the version known durable, and versions written since (any may survive).
    let mut durable: HashMap<u64, u64> = HashMap::new();
    let mut since: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut version = 0u64;
    let mut warm_restarts = 0;
    let (mut killed_mid_write, mut recovered_total) = (0u64, 0u64);
    let mut server = start(dir.path());
    for round in 0..rounds {
        // Write until the server is killed under us.
        let kill_after = Duration::from_micros(rng.gen_range(0..40_000));
        let pid = server.child.id();
        let killer = std::thread::spawn(move || {
            std::thread::sleep(kill_after);
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        });
        let Ok(mut c) = Client::connect(server.addr, "wb") else {
            killer.join().unwrap();
            let _ = server.child.wait();
            server = start(dir.path());
            continue;
        };
        loop {
            let block = rng.gen_range(0..BLOCKS);
            version += 1;
            let fua = rng.gen_bool(0.1);
            since.entry(block).or_default().push(version);
            match c.write(block * BLOCK as u64, &content(version), fua) {
                Ok(Ok(())) if fua => {
                    durable.insert(block, version);
                    since.get_mut(&block).unwrap().clear();
                }
                Ok(Ok(())) => {}
                Ok(Err(e)) => panic!("round {round}: write error {e}"),
                Err(_) => {
                    killed_mid_write += 1;
                    break;
                }
            }
            if rng.gen_bool(0.05) {
                match c.flush() {
                    Ok(Ok(())) => {
                        for (b, v) in since.drain() {
                            if let Some(&last) = v.last() {
                                durable.insert(b, last);
                            }
                        }
                    }
                    Ok(Err(e)) => panic!("round {round}: flush error {e}"),
                    Err(_) => break,
                }
            }
        }
        killer.join().unwrap();
        let _ = server.child.wait();
        server = start(dir.path());
        if !durable.is_empty() {
            assert!(server.warm_blocks > 0, "round {round}: restarted cold with {} durable blocks", durable.len());
            recovered_total += server.warm_blocks;
            warm_restarts += 1;
        }
        // Every block reads as its durable version or a later written one; that becomes
        // the new truth.
        let mut c = Client::connect(server.addr, "wb").unwrap();
        for b in 0..BLOCKS {
            let got = c.read(b * BLOCK as u64, BLOCK as u32).unwrap().unwrap();
            let v = u64::from_le_bytes(got[..8].try_into().unwrap());
            let ok_versions: Vec<u64> =
                durable.get(&b).copied().into_iter().chain(since.get(&b).into_iter().flatten().copied()).collect();
            if !durable.contains_key(&b) && got.iter().all(|&x| x == 0) {
                continue; // never durably written: zeros are right
            }
            assert!(
                ok_versions.contains(&v) && got == content(v),
                "round {round}: block {b} reads version {v}, durable {:?}, written since {:?}",
                durable.get(&b),
                since.get(&b)
            );
            durable.insert(b, v);
        }
        since.clear();
    }
    eprintln!("{rounds} rounds, {version} writes, {killed_mid_write} kills during a write, {warm_restarts} warm restarts, {recovered_total} blocks recovered in all, {} blocks durable at the end", durable.len());
    server.child.kill().unwrap();
    let _ = server.child.wait();
    // Every restart with durable data was asserted warm above; this guards against a run
    // where kills came so early that little was tested. A round whose kill lands before the
    // client connects restarts without counting, which a loaded machine makes likelier.
    assert!(warm_restarts as u64 >= rounds * 9 / 10, "{warm_restarts} warm restarts in {rounds} rounds");
}
