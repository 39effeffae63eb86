//! The channel between a vSSD and the cache manager in its guest (SymFlex §2.4.3, Fig.
//! 4's messages): one unix socket per vSSD (0600; QEMU can carry it into the guest as a
//! virtio-serial port), newline-delimited JSON, both directions at any time.
//!
//! The messages are `cachevisor_vssd::protocol`'s (documented there).

use super::service::VssdService;
use cachevisor_vssd::manager::Event;
use cachevisor_vssd::protocol::{Notice, Reply, Request};
use cachevisor_vssd::VssdId;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Longest request line (a release of a million blocks fits).
const MAX_LINE: usize = 16 << 20;

/// Binds the control socket of vSSD `id` at `path` and serves it on a thread; errors
/// start with `key`.
pub fn listen(svc: Arc<VssdService>, id: VssdId, path: &Path, key: &str) -> Result<(), String> {
    let l = crate::listen_path::bind_unix(path, key, 0o600, None)?;
    let (s, p) = (svc.clone(), path.to_path_buf());
    let t = std::thread::Builder::new()
        .name(format!("cv-vssd-ctl {id}"))
        .spawn(move || {
            accept(l, &s, id);
            // Closed: the socket file goes unless something else is there by now.
            if crate::listen_path::inspect(&p, "").ok() == Some(crate::listen_path::AtPath::StaleSocket) {
                let _ = std::fs::remove_file(&p);
            }
        })
        .map_err(|e| e.to_string())?;
    svc.add_control(path.to_path_buf(), t);
    Ok(())
}

/// Serves the guests that connect to `l` until the vSSD is gone or the region halts.
fn accept(l: UnixListener, svc: &Arc<VssdService>, id: VssdId) {
    for s in l.incoming() {
        let Ok(s) = s else { continue };
        if !svc.exists(id) || svc.halted() {
            return;
        }
        let svc = svc.clone();
        let _ = std::thread::Builder::new().name(format!("cv-vssd-guest {id}")).spawn(move || serve(s, &svc, id));
    }
}

fn ms_until(svc: &VssdService, deadline: u64) -> u64 {
    deadline.saturating_sub(svc.now_ns()) / 1_000_000
}

/// The notice for `e`, if it concerns `id`.
fn notice(svc: &VssdService, id: VssdId, e: &Event) -> Option<Notice> {
    Some(match e {
        Event::Inflated { id: i, lbns } if *i == id => Notice::Inflated { lbns: lbns.clone() },
        Event::DeflateRequested { id: i, blocks, deadline } if *i == id => {
            Notice::Deflate { blocks: *blocks, deadline_in_ms: ms_until(svc, *deadline) }
        }
        Event::Released { id: i, lbns, forced } if *i == id => Notice::Released { lbns: lbns.clone(), forced: *forced },
        Event::Removed { id: i } if *i == id => Notice::Removed,
        _ => return None,
    })
}

fn send(out: &Mutex<UnixStream>, v: &impl serde::Serialize) -> std::io::Result<()> {
    let mut line = serde_json::to_string(v).expect("a message serializes");
    line.push('\n');
    out.lock().unwrap_or_else(|p| p.into_inner()).write_all(line.as_bytes())
}

/// One guest connection: requests answered on this thread, events sent by another.
fn serve(s: UnixStream, svc: &Arc<VssdService>, id: VssdId) {
    let Ok(w) = s.try_clone() else { return };
    let out = Arc::new(Mutex::new(w));
    let done = Arc::new(AtomicBool::new(false));
    // Events from now on (a hello's state covers what came before).
    let (_, mut at) = svc.events(u64::MAX, Duration::ZERO);
    let events = {
        let (svc, out, done) = (svc.clone(), out.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let (ev, next) = svc.events(at, Duration::from_millis(500));
                at = next;
                for e in &ev {
                    if let Some(line) = notice(&svc, id, e) {
                        if send(&out, &line).is_err() {
                            return;
                        }
                    }
                }
            }
        })
    };
    let mut r = BufReader::new(s);
    let mut line = String::new();
    loop {
        line.clear();
        match std::io::Read::take(&mut r, MAX_LINE as u64 + 1).read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(n) if n > MAX_LINE => {
                let message = "request line over 16 MiB: closing".to_string();
                let _ = send(&out, &Reply::Error { message });
                break;
            }
            Ok(_) => {}
        }
        let reply = match serde_json::from_str::<Request>(line.trim()) {
            Err(e) => Reply::Error { message: format!("not a request: {e}") },
            Ok(Request::Hello) => state(svc, id),
            Ok(Request::Release { lbns }) => match svc.release(id, &lbns) {
                Ok(()) => Reply::Released { lbns },
                Err(e) => Reply::Error { message: e.to_string() },
            },
        };
        if send(&out, &reply).is_err() {
            break;
        }
    }
    done.store(true, Ordering::Relaxed);
    let _ = events.join();
}

/// The `state` reply.
fn state(svc: &VssdService, id: VssdId) -> Reply {
    match (svc.hello(id), svc.geometry_of(id)) {
        (Some((st, valid)), Some((block_size, max_blocks))) => Reply::State {
            block_size,
            max_blocks,
            valid,
            target: st.target,
            asked: st.asked,
            deadline_in_ms: st.deadline.map(|d| ms_until(svc, d)),
        },
        _ => Reply::Error { message: "the vSSD is gone".into() },
    }
}
