//! The channel between a vSSD and the cache manager in its guest (SymFlex §2.4.3, Fig.
//! 4's messages): one unix socket per vSSD (0600; QEMU can carry it into the guest as a
//! virtio-serial port), newline-delimited JSON, both directions at any time.
//!
//! Guest → host, one request per line, each answered by one `reply` line:
//! - `{"op":"hello"}` → `{"reply":"state","block_size":B,"max_blocks":M,"valid":[lbn…],"target":T,"asked":N,"deadline_in_ms":D}`:
//!   the valid-block bitmap as a list (§2.4.1: read at initialization), and any deflate
//!   request outstanding;
//! - `{"op":"release","lbns":[…]}` → `{"reply":"released","lbns":[…]}`, or
//!   `{"reply":"error","message":"…"}` when any block is not a valid block of this vSSD,
//!   is given twice, or more are given than asked (nothing changes then).
//!
//! Host → guest, whenever they happen, `event` lines: `{"event":"inflated","lbns":[…]}`
//! (new valid blocks), `{"event":"deflate","blocks":N,"deadline_in_ms":D}` (give back N by
//! then; N = 0 withdraws the request), `{"event":"released","lbns":[…],"forced":F}`
//! (blocks no longer valid; `forced`: the host took them after the deadline),
//! `{"event":"removed"}`. A guest that reconnects says hello again and gets the state.

use super::service::VssdService;
use cachevisor_vssd::manager::Event;
use cachevisor_vssd::VssdId;
use serde::Deserialize;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Longest request line (a release of a million blocks fits).
const MAX_LINE: usize = 16 << 20;

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
enum Request {
    Hello,
    Release { lbns: Vec<u32> },
}

/// Binds the control socket of vSSD `id` at `path` and serves it on a thread.
pub fn listen(svc: Arc<VssdService>, id: VssdId, path: &Path) -> Result<(), String> {
    let l = crate::service::bind_unix(path, 0o600, None)?;
    std::thread::Builder::new()
        .name(format!("cv-vssd-ctl {id}"))
        .spawn(move || accept(l, svc, id))
        .map_err(|e| e.to_string())?;
    Ok(())
}

fn accept(l: UnixListener, svc: Arc<VssdService>, id: VssdId) {
    for s in l.incoming() {
        let Ok(s) = s else { continue };
        if !svc.exists(id) {
            return;
        }
        let svc = svc.clone();
        let _ = std::thread::Builder::new().name(format!("cv-vssd-guest {id}")).spawn(move || serve(s, &svc, id));
    }
}

fn ms_until(svc: &VssdService, deadline: u64) -> u64 {
    deadline.saturating_sub(svc.now_ns()) / 1_000_000
}

/// The event line for `e`, if it concerns `id`.
fn event_line(svc: &VssdService, id: VssdId, e: &Event) -> Option<Value> {
    Some(match e {
        Event::Inflated { id: i, lbns } if *i == id => json!({ "event": "inflated", "lbns": lbns }),
        Event::DeflateRequested { id: i, blocks, deadline } if *i == id => {
            json!({ "event": "deflate", "blocks": blocks, "deadline_in_ms": ms_until(svc, *deadline) })
        }
        Event::Released { id: i, lbns, forced } if *i == id => {
            json!({ "event": "released", "lbns": lbns, "forced": forced })
        }
        Event::Removed { id: i } if *i == id => json!({ "event": "removed" }),
        _ => return None,
    })
}

fn send(out: &Mutex<UnixStream>, v: &Value) -> std::io::Result<()> {
    let mut line = v.to_string();
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
                    if let Some(line) = event_line(&svc, id, e) {
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
                let _ = send(&out, &json!({ "reply": "error", "message": "request line over 16 MiB: closing" }));
                break;
            }
            Ok(_) => {}
        }
        let reply = match serde_json::from_str::<Request>(line.trim()) {
            Err(e) => json!({ "reply": "error", "message": format!("not a request: {e}") }),
            Ok(Request::Hello) => state(svc, id),
            Ok(Request::Release { lbns }) => match svc.release(id, &lbns) {
                Ok(()) => json!({ "reply": "released", "lbns": lbns }),
                Err(e) => json!({ "reply": "error", "message": e.to_string() }),
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
fn state(svc: &VssdService, id: VssdId) -> Value {
    match (svc.status(id), svc.geometry_of(id)) {
        (Some((st, valid)), Some((block_size, max_blocks))) => json!({
            "reply": "state",
            "block_size": block_size,
            "max_blocks": max_blocks,
            "valid": valid,
            "target": st.target,
            "asked": st.asked,
            "deadline_in_ms": st.deadline.map(|d| ms_until(svc, d)),
        }),
        _ => json!({ "reply": "error", "message": "the vSSD is gone" }),
    }
}
