//! Batched submission for an O_DIRECT cache store: one thread owns an io_uring (through
//! tokio-uring's owned-buffer API, so no `unsafe` here) and keeps up to [`DEPTH`] runs of
//! cache-store ops in flight, taken from the queues as they come (client ops first). With
//! a thread per op, every O_DIRECT read or write cost a wakeup and a sleep on each side;
//! here a burst of ops is one submission and its completions one pass. Written by hand
//! over tokio-uring because the engine's ops, not a stream of futures, say what to run.
//! Where io_uring is unavailable (an old kernel, a sandbox), the device threads run these
//! ops as before.

use super::devices::{run_address, run_results, write_data};
use super::logged_writes::OpResult;
use super::{Core, Shared, Work};
use cachevisor_engine::Failure;
use cachevisor_files::aligned_buf::aligned_offset;
use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::Arc;
use tokio_uring::buf::BoundedBuf;

/// Cache-store runs in flight at most.
const DEPTH: usize = 64;

impl Shared {
    /// The next run of cache-store ops for the ring (a client's first).
    fn pop_ssd_run(&self, core: &mut Core) -> Option<Vec<Work>> {
        let ssd = |q: &std::collections::VecDeque<Work>| q.iter().position(|w| self.local_only(&w.op));
        if let Some(i) = ssd(&core.work) {
            return Some(self.take_run(&mut core.work, i, None));
        }
        let i = ssd(&core.background)?;
        Some(self.take_run(&mut core.background, i, None))
    }

    /// Runs one run of cache-store ops through the ring (none after a halt); the
    /// outcomes, and the ticket of its records in the replica log.
    async fn ring_call(&self, f: &tokio_uring::fs::File, run: &[Work]) -> (Vec<OpResult>, Option<u64>) {
        if self.halted.load(SeqCst) {
            return (vec![Err(Failure::Shutdown); run.len()], None);
        }
        self.calls.fetch_add(1, Relaxed);
        let total: usize = run.iter().map(|w| w.op.len as usize).sum();
        let at = run_address(run, &self.layout()) + cachevisor_store::cache_label::DATA_OFFSET; // after the label
        let mut v = self.io_pool.take(total);
        let off = aligned_offset(&v);
        let short = || std::io::Error::other("short transfer on the cache store");
        let mut ticket = None;
        let r = if run[0].op.kind.is_write() {
            match write_data(run) {
                Some(d) => v[off..off + total].copy_from_slice(&d),
                None => return (vec![Err(Failure::Io); run.len()], None),
            }
            ticket = self.log_run(run);
            let (res, buf) = f.write_at(v.slice(off..off + total), at).submit().await;
            let buf = buf.into_inner();
            let r = res.and_then(|n| if n == total { Ok(bytes::Bytes::new()) } else { Err(short()) });
            self.note_write_sums(run, &buf[off..off + total], r.is_ok());
            self.io_pool.give(buf);
            r
        } else {
            let (res, buf) = f.read_at(v.slice(off..off + total), at).await;
            let v = buf.into_inner();
            match res {
                // The I/O buffer itself becomes the reply's bytes (back in the pool after).
                Ok(n) if n == total => Ok(self.io_pool.freeze(v, off, total)),
                Ok(_) => Err(short()),
                Err(e) => Err(e),
            }
        };
        self.exec.ring_call_done(r.is_ok());
        let mut results = run_results(run, r);
        self.check_read_sums(run, &mut results);
        (results, ticket)
    }
}

/// Starts the ring thread for `shared`'s cache store; `None` (the device threads run the
/// cache-store ops) when io_uring cannot be set up.
pub(super) fn start(shared: Arc<Shared>) -> Option<std::thread::JoinHandle<()>> {
    let file = store_devices_file(&shared)?;
    let (tx, rx) = std::sync::mpsc::channel::<bool>();
    let handle = super::named("cv-ring".into(), move || {
        let started = tx.clone();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            tokio_uring::start(async move {
                let _ = started.send(true);
                ring_loop(shared, tokio_uring::fs::File::from_std(file)).await;
            })
        }));
        if r.is_err() {
            let _ = tx.send(false);
        }
    });
    if rx.recv().unwrap_or(false) {
        Some(handle)
    } else {
        let _ = handle.join();
        tracing::warn!("io_uring is not available: the cache store's O_DIRECT I/O runs on device threads");
        None
    }
}

/// A descriptor of the cache file for the ring (`None` when detached).
fn store_devices_file(shared: &Shared) -> Option<std::fs::File> {
    super::store_devices::cache_file(&shared.ssd).ok()?.try_clone().ok()
}

/// Takes cache-store runs as they are queued and keeps up to [`DEPTH`] in flight until
/// the data path stops; each completes its ops when its I/O ends.
async fn ring_loop(shared: Arc<Shared>, file: tokio_uring::fs::File) {
    let file = Rc::new(file);
    let in_flight = Rc::new(Cell::new(0usize));
    loop {
        let (stop, runs) = {
            let mut core = shared.lock();
            let mut runs = Vec::new();
            while in_flight.get() + runs.len() < DEPTH {
                match shared.pop_ssd_run(&mut core) {
                    Some(r) => runs.push(r),
                    None => break,
                }
            }
            (core.stop, runs)
        };
        if runs.is_empty() {
            if (stop || shared.ring_stop.load(SeqCst)) && in_flight.get() == 0 {
                // Like the device threads, the ring ends once its queue is empty and
                // nothing is left in the kernel's hands; what a completion queues after
                // that goes to the device threads still running. Its descriptor of the
                // cache file is closed first (a detach waits for `ring_on` to fall).
                if let Ok(f) = Rc::try_unwrap(file) {
                    let _ = f.close().await;
                }
                let core = shared.lock();
                shared.exec.set_ring(false);
                drop(core);
                shared.wake.notify_all();
                return;
            }
            shared.exec.ring_notify().notified().await;
            continue;
        }
        for run in runs {
            in_flight.set(in_flight.get() + 1);
            shared.busy.fetch_add(1, SeqCst);
            let (s, f, n) = (shared.clone(), file.clone(), in_flight.clone());
            tokio_uring::spawn(async move {
                let (results, ticket) = s.ring_call(&f, &run).await;
                n.set(n.get() - 1);
                let mut core = s.lock();
                s.finish_run(&mut core, run, results, ticket);
                s.unlock(core);
                s.busy.fetch_sub(1, SeqCst);
                s.exec.ring_notify().notify_one(); // room for more
            });
        }
    }
}
