//! Batched submission for O_DIRECT cache devices: one thread owns an io_uring (through
//! tokio-uring's owned-buffer API, so no `unsafe` here) and keeps up to [`DEPTH`] runs of
//! cache-device ops in flight, taken from the queues as they come (client ops first). With
//! a thread per op, every O_DIRECT read or write cost a wakeup and a sleep on each side;
//! here a burst of ops is one submission and its completions one pass. Written by hand
//! over tokio-uring because the engine's ops, not a stream of futures, say what to run.
//! Where io_uring is unavailable (an old kernel, a sandbox), the device threads run these
//! ops as before.
//!
//! It serves the cache file and every other O_DIRECT cache device (`[[cache.device]]`),
//! a descriptor of each: when a device is added or removed the data path bumps the
//! device list's generation and the ring opens or closes its descriptors before it takes
//! another run ([`Shared::ring_let_go`] waits for that, so a removed device has no
//! descriptor left open); which stores it serves is `Shared::ring_mask`.

use super::devices::{run_address, run_results, write_data};
use super::logged_writes::OpResult;
use super::{Core, Shared, Work};
use cachevisor_engine::{Failure, Location, StoreId};
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

    /// Asks the io_uring thread to take the device list in again (a device removed: its
    /// slot emptied, so no op of it is in flight) and waits until it has, so that none of
    /// its descriptors stays open (at most 10 s; at once when the ring is off).
    pub(super) fn ring_let_go(&self) {
        let want = self.ring_gen[0].fetch_add(1, SeqCst) + 1;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while self.exec.ring_on() && self.ring_gen[1].load(SeqCst) < want && std::time::Instant::now() < deadline {
            self.exec.ring_notify().notify_one();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Runs one run of cache-device ops through the ring (none after a halt); the
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

/// Starts the ring thread for `shared`'s cache devices; `None` (the device threads run
/// their ops) when io_uring cannot be set up.
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

/// The ring's descriptors by store id: the cache file's (store 0), then one of each O_DIRECT
/// device in use (stores below 64), taken in at a generation of the device list.
struct RingFiles {
    files: Vec<Option<Rc<tokio_uring::fs::File>>>,
}

impl RingFiles {
    /// The devices as the data path has them now (under its lock), the cache file's
    /// descriptor kept; sets which stores the ring serves and recounts the queued ops
    /// left to the device threads.
    fn take_in(shared: &Shared, core: &Core, cache_file: Rc<tokio_uring::fs::File>) -> RingFiles {
        let mut files = vec![Some(cache_file)];
        let mut mask = 1u64;
        let devices = shared.device_files.read().unwrap_or_else(|p| p.into_inner()).clone();
        for (i, (slot, direct)) in devices.iter().enumerate().take(63) {
            let f = direct
                .then(|| super::store_devices::cache_file(slot).ok()?.try_clone().ok())
                .flatten()
                .map(|f| Rc::new(tokio_uring::fs::File::from_std(f)));
            if f.is_some() {
                mask |= 1 << (i + 1);
            }
            files.push(f);
        }
        if shared.ring_mask.swap(mask, SeqCst) != mask && !devices.is_empty() {
            tracing::info!(
                devices = mask.count_ones(),
                of = devices.len() + 1,
                "cache devices whose I/O runs through io_uring (O_DIRECT ones in use)"
            );
        }
        shared.exec.recount(core.work.iter().chain(&core.background).filter(|w| !shared.local_only(&w.op)).count());
        RingFiles { files }
    }

    /// The descriptor for a run on store `st`.
    fn of(&self, st: StoreId) -> Option<Rc<tokio_uring::fs::File>> {
        self.files.get(usize::from(st)).cloned().flatten()
    }
}

/// Takes cache-store runs as they are queued and keeps up to [`DEPTH`] in flight until
/// the data path stops; each completes its ops when its I/O ends.
async fn ring_loop(shared: Arc<Shared>, file: tokio_uring::fs::File) {
    let file = Rc::new(file);
    let in_flight = Rc::new(Cell::new(0usize));
    let mut files: Option<RingFiles> = None;
    let mut gen = u64::MAX;
    loop {
        let (stop, runs) = {
            let mut core = shared.lock();
            // The device list changed (or this is the first pass): open the new devices'
            // descriptors, close the removed ones' (nothing of theirs is in flight).
            let now = shared.ring_gen[0].load(SeqCst);
            if now != gen {
                drop(files.take()); // closes what is gone before anything is reopened
                files = Some(RingFiles::take_in(&shared, &core, file.clone()));
                gen = now;
                shared.ring_gen[1].store(now, SeqCst);
            }
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
                // that goes to the device threads still running. Its descriptors are
                // closed first (a detach waits for `ring_on` to fall).
                drop(files.take());
                if let Ok(f) = Rc::try_unwrap(file) {
                    let _ = f.close().await;
                }
                let core = shared.lock();
                shared.exec.set_ring(false);
                shared.ring_mask.store(1, SeqCst);
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
            let st = match run[0].op.loc {
                Location::Cache(st) => st,
                _ => unreachable!("the ring takes cache-device ops only"),
            };
            let f = files.as_ref().and_then(|f| f.of(st));
            let (s, n) = (shared.clone(), in_flight.clone());
            tokio_uring::spawn(async move {
                let (results, ticket) = match &f {
                    Some(f) => s.ring_call(f, &run).await,
                    // Not one it serves (a bug: the mask said so): failed, not lost.
                    None => {
                        tracing::error!(store = st, "the io_uring thread has no descriptor of a store it took ops of");
                        (vec![Err(Failure::Io); run.len()], None)
                    }
                };
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
