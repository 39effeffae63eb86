//! The systemd watchdog (`systemd.rs`) against a real daemon in this process: fed while
//! the engine loop ticks, starved once it stops (a halted data path), so systemd's
//! `WatchdogSec` would run out and restart the service. The notify socket is a datagram
//! socket this test binds; the environment variables are set before anything starts (this
//! file holds one test, so nothing else reads them concurrently).

mod common;

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

fn messages(sock: &UnixDatagram, for_: Duration) -> Vec<String> {
    let end = Instant::now() + for_;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < end {
        sock.set_read_timeout(Some((end - Instant::now()).max(Duration::from_millis(1)))).unwrap();
        match sock.recv(&mut buf) {
            Ok(n) => out.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(_) => break,
        }
    }
    out
}

#[test]
fn the_watchdog_is_fed_while_the_engine_ticks_and_starved_once_it_stops() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    std::env::set_var("NOTIFY_SOCKET", &path);
    std::env::set_var("WATCHDOG_USEC", "100000"); // 100 ms: a ping every 50 ms
    let cfg = common::config(dir.path(), "1MiB", &[("a", "4MiB", "wb")]);
    let running = common::serve(&cfg);
    assert!(cachevisor_server::systemd::under_service_manager());
    cachevisor_server::systemd::ready("serving 1 exports");
    let period = cachevisor_server::systemd::start_watchdog(running.daemon.clone()).expect("a watchdog period");
    assert_eq!(period, Duration::from_millis(100));
    let first = messages(&sock, Duration::from_millis(100));
    assert!(first[0].contains("READY=1") && first[0].contains("STATUS=serving 1 exports"), "{first:?}");
    let fed = messages(&sock, Duration::from_millis(600));
    let pings = fed.iter().filter(|m| m.contains("WATCHDOG=1")).count();
    assert!(pings >= 5, "{pings} pings in 600 ms at a 50 ms interval: {fed:?}");
    // The engine loop stops (a halted data path: no device I/O, no timers).
    running.daemon.stop_serving();
    let _ = messages(&sock, Duration::from_millis(150)); // a ping already on its way
    let starved = messages(&sock, Duration::from_millis(600));
    assert!(
        !starved.iter().any(|m| m.contains("WATCHDOG=1")),
        "the watchdog was fed after the engine loop stopped: {starved:?}"
    );
}
