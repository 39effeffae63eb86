//! Device threads: ops taken from the queue run on the cache store or a backing store with
//! no lock held, runs of ops contiguous on a device as one call (the next cache-store
//! offset, or the next disk address of the same backing store, up to [`MAX_RUN_BYTES`]: a
//! 1 MiB read of consecutive slots is one `pread`), and their completions go back to the
//! engine. After a halt no op touches a device: each fails with `Failure::Shutdown`.

use super::logged_writes::OpResult;
use super::{Bytes, Core, Shared, Work};
use cachevisor_engine::{DeviceOp, Failure, Io, Location, OpKind, ReqId, MAX_RUN_BYTES};
use cachevisor_store::backing::Backing;
use cachevisor_trace::VmId;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::Arc;

/// Whose ops a client thread runs: its own request's (only those on the cache store with
/// `ssd_only`, and no replicated write's: a backing store may be slow, a replicated write
/// waits for its log, and an NBD reader running either itself would read no further
/// request meanwhile).
#[derive(Debug, Clone, Copy)]
pub(super) struct Own {
    pub(super) req: ReqId,
    pub(super) ssd_only: bool,
}

fn no_device() -> std::io::Error {
    std::io::Error::other("no such device (a removed vDisk)")
}

/// The failure a driver reports for an I/O error.
pub(super) fn failure(e: &std::io::Error) -> Failure {
    // Errors wrapped with the file they concern keep their kind, not their errno.
    if e.raw_os_error() == Some(ENOSPC) || e.kind() == std::io::ErrorKind::StorageFull {
        Failure::NoSpace
    } else if e.kind() == std::io::ErrorKind::NotConnected {
        Failure::Shutdown
    } else {
        Failure::Io
    }
}

/// ENOSPC without a libc dependency (Linux).
const ENOSPC: i32 = 28;

impl Shared {
    /// Reads `buf.len()` bytes at `at` of the device `loc` names: a cache store's
    /// device (`store_devices.rs`) or a vDisk's backing store.
    fn dev_read(&self, loc: Location, buf: &mut [u8], at: u64) -> std::io::Result<()> {
        match loc {
            Location::Cache(st) => self.store(st)?.submit(0, at, Io::Read(buf)).map(drop),
            Location::Backing(vm) => self.backing(vm)?.read_at(buf, at),
            Location::Ram => Err(std::io::Error::other("a RAM-tier op on a device thread (`ram_memory.rs` runs them)")),
        }
    }

    /// Writes `data` at `at` of the device `loc` names.
    fn dev_write(&self, loc: Location, data: &[u8], at: u64) -> std::io::Result<()> {
        match loc {
            Location::Cache(st) => self.store(st)?.submit(0, at, Io::Write(data)).map(drop),
            Location::Backing(vm) => self.backing(vm)?.write_at(data, at),
            Location::Ram => Err(std::io::Error::other("a RAM-tier op on a device thread (`ram_memory.rs` runs them)")),
        }
    }

    /// Makes every cache store's completed writes durable (each store's device, named
    /// in the error: today the cache file; a store the daemon does not serve has none).
    pub(super) fn sync_stores(&self) -> std::io::Result<()> {
        let stores = self.stores.read().unwrap_or_else(|p| p.into_inner()).clone();
        for d in &stores {
            d.sync().map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", d.describe())))?;
        }
        Ok(())
    }

    /// Cache store `st`'s device.
    fn store(&self, st: cachevisor_engine::StoreId) -> std::io::Result<Arc<super::store_devices::StoreDevice>> {
        let stores = self.stores.read().unwrap_or_else(|p| p.into_inner());
        stores.get(st as usize).cloned().ok_or_else(|| std::io::Error::other(format!("no cache store {st}")))
    }

    /// Where the engine's cache stores' slots are now.
    pub(super) fn layout(&self) -> Arc<cachevisor_engine::StoreLayout> {
        self.layout.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `vm`'s backing store.
    pub(super) fn backing(&self, vm: VmId) -> std::io::Result<Arc<Backing>> {
        self.backings.read().unwrap_or_else(|p| p.into_inner()).get(vm as usize).cloned().ok_or_else(no_device)
    }

    /// Runs queued ops until stopped: client ops first; background ops on at most half
    /// the threads, so write-backs to a slow backing store never take every thread from
    /// the clients' cache I/O.
    pub(super) fn device_thread(&self) {
        loop {
            let (run, background) = {
                let mut core = self.lock();
                loop {
                    if let Some(run) = self.pop_run(&mut core, false, None) {
                        break (run, false);
                    }
                    if core.background_busy < self.exec.threads().div_ceil(2) {
                        if let Some(run) = self.pop_run(&mut core, true, None) {
                            core.background_busy += 1;
                            break (run, true);
                        }
                    }
                    if core.stop {
                        return;
                    }
                    core = self.wake.wait(core).unwrap_or_else(|p| p.into_inner());
                }
            };
            let (results, ticket) = self.execute_run(&run);
            let mut core = self.lock();
            if background {
                core.background_busy -= 1;
                if !core.background.is_empty() {
                    self.wake.notify_one(); // a thread held back may take the next one
                }
            }
            self.finish_run(&mut core, run, results, ticket);
            self.unlock(core);
        }
    }

    /// The next queued op — a client request's first; a background job's only with
    /// `background` (device threads: a client thread helping out takes none, it would
    /// wait behind a slow write-back); with `only`, the first op of that request or job
    /// (a client thread runs its own ops, never another request's slow miss) — and those
    /// right behind it that continue it on its device.
    pub(super) fn pop_run(&self, core: &mut Core, background: bool, only: Option<Own>) -> Option<Vec<Work>> {
        let (queue, at) = match only {
            Some(Own { req, ssd_only }) => {
                // A replicated write's op is left to the io_uring thread too: its reply
                // waits for the log anyway, and this thread would read no further request
                // meanwhile.
                let runs_here = |op: &DeviceOp| !ssd_only || (self.local_only(op) && !self.replicated(op));
                let mine =
                    |q: &std::collections::VecDeque<Work>| q.iter().position(|w| w.op.req == req && runs_here(&w.op));
                if let Some(i) = mine(&core.work) {
                    (&mut core.work, i)
                } else {
                    let i = mine(&core.background)?;
                    (&mut core.background, i)
                }
            }
            None => {
                // With the io_uring thread on, cache-file ops are its own.
                let eligible = |q: &std::collections::VecDeque<Work>| {
                    q.iter().position(|w| self.exec.threads_take(self.local_only(&w.op)))
                };
                if let Some(i) = eligible(&core.work) {
                    (&mut core.work, i)
                } else if background {
                    let i = eligible(&core.background)?;
                    (&mut core.background, i)
                } else {
                    return None;
                }
            }
        };
        Some(self.take_run(queue, at, only))
    }

    /// The op at `at` of `queue` and those right behind it that continue it on its device
    /// (of the same request with `only`), up to [`MAX_RUN_BYTES`].
    pub(super) fn take_run(
        &self,
        queue: &mut std::collections::VecDeque<Work>,
        at: usize,
        only: Option<Own>,
    ) -> Vec<Work> {
        let first = queue.remove(at).expect("an op at `at`");
        self.exec.taken(self.local_only(&first.op));
        let mut total = first.op.len as u64;
        let mut run = vec![first];
        while let Some(next) = queue.get(at) {
            let prev = &run[run.len() - 1].op;
            let o = &next.op;
            let follows = only.is_none_or(|own| o.req == own.req) && o.continues(prev, self.bs);
            if !follows || total + o.len as u64 > MAX_RUN_BYTES {
                break;
            }
            total += o.len as u64;
            let next = queue.remove(at).expect("an op");
            self.exec.taken(self.local_only(&next.op));
            run.push(next);
        }
        run
    }

    /// Runs a run of ops as one device call (none after a halt: every op fails); the
    /// outcomes, and the ticket of its records in the replica log.
    pub(super) fn execute_run(&self, run: &[Work]) -> (Vec<OpResult>, Option<u64>) {
        self.busy.fetch_add(1, SeqCst);
        let r = if self.halted.load(SeqCst) {
            (vec![Err(Failure::Shutdown); run.len()], None)
        } else {
            self.calls.fetch_add(1, Relaxed);
            self.device_call(run)
        };
        self.busy.fetch_sub(1, SeqCst);
        r
    }

    fn device_call(&self, run: &[Work]) -> (Vec<OpResult>, Option<u64>) {
        let first = &run[0].op;
        let total: usize = run.iter().map(|w| w.op.len as usize).sum();
        let at = run_address(run, &self.layout());
        let mut ticket = None;
        let r = if first.kind.is_write() {
            match write_data(run) {
                Some(data) => {
                    ticket = self.log_run(run);
                    let r = self.dev_write(first.loc, &data, at);
                    self.note_write_sums(run, &data, r.is_ok());
                    r.map(|()| bytes::Bytes::new())
                }
                None => return (vec![Err(Failure::Io); run.len()], None),
            }
        } else {
            let mut buf = vec![0u8; total];
            self.dev_read(first.loc, &mut buf, at).map(|()| bytes::Bytes::from(buf))
        };
        let mut results = run_results(run, r);
        self.check_read_sums(run, &mut results);
        (results, ticket)
    }

    /// Records an op's outcome (a read's bytes kept for its request) and lets the engine
    /// go on.
    pub(super) fn complete(&self, core: &mut Core, op: DeviceOp, r: Result<Option<Bytes>, Failure>) {
        let result = match r {
            Ok(Some(bytes)) => {
                if op.client {
                    if let Some(wt) = core.waiting.get_mut(&op.req) {
                        // The ops of a coalesced run share one buffer: keep it once.
                        let same = |b: &bytes::Bytes| b.as_ptr() == bytes.0.as_ptr() && b.len() == bytes.0.len();
                        if !wt.reads.last().is_some_and(|(b, _)| same(b)) {
                            wt.reads.push(bytes.clone());
                        }
                    }
                }
                if op.kind == OpKind::SsdRead && op.staged && !op.client {
                    // A write-back's or a move's source: a cache write from it copies
                    // checksummed bytes.
                    core.cache_sources.insert((op.req, op.id));
                }
                core.bufs.entry(op.req).or_default().insert(op.id, bytes);
                Ok(())
            }
            Ok(None) => {
                if op.staged && op.kind == OpKind::BackingWrite {
                    self.written_back.fetch_add(1, Relaxed);
                }
                Ok(())
            }
            Err(f) => {
                if let Some(j) = core.jobs.get_mut(&op.req) {
                    j.failure.get_or_insert(f);
                }
                // A peer's region that fails is lost until the cluster's next allocation
                // says otherwise: no new block goes there (`Engine::lose_lender`).
                if let cachevisor_engine::Location::Cache(st) = op.loc {
                    if let cachevisor_engine::StoreKind::Lent { node } = self.layout().kind(st) {
                        if f != Failure::Shutdown && core.engine.lose_lender(node) {
                            tracing::warn!(
                                lender = node,
                                "a peer's lent region failed: it takes no new block until the next allocation"
                            );
                        }
                    }
                }
                Err(f)
            }
        };
        debug_assert!(
            op.kind != OpKind::SsdRead
                || result.is_err()
                || core.bufs.get(&op.req).is_some_and(|m| m.contains_key(&op.id))
        );
        let now = self.now();
        core.engine.handle_completion(now, op.handle(), result);
        for loss in core.engine.take_device_losses() {
            let dirty: u64 = loss.dirty_blocks.iter().map(|d| d.1).sum();
            let mirrored: u64 = loss.mirrored_blocks.iter().map(|d| d.1).sum();
            let vdisks: Vec<String> = loss
                .dirty_blocks
                .iter()
                .map(|&(vm, n)| format!("{} {n}", core.names.get(vm as usize).map_or("?", |s| s.as_str())))
                .collect();
            tracing::error!(
                store = loss.store,
                clean_dropped = loss.clean_blocks,
                dirty_unreadable = dirty,
                dirty_served_from_mirrors = mirrored,
                vdisks = %vdisks.join(", "),
                "a cache device failed past the error threshold and was dropped: the vDisks keep their cache on the others; its clean blocks were forgotten (read from the backing stores again); its mirrored dirty blocks are served from their copies on the other devices and written back first; dirty blocks whose only copy it held (none when every one was mirrored) are kept and fail their reads (a restart with the device back serves them)"
            );
        }
        self.pump(core);
    }
}

/// The device address a run starts at (cache-store offset, or disk address).
pub(super) fn run_address(run: &[Work], layout: &cachevisor_engine::StoreLayout) -> u64 {
    let first = &run[0].op;
    if first.kind.is_ssd() {
        layout.offset(first)
    } else {
        first.disk_addr
    }
}

/// Whether a run's disk addresses are contiguous too (sequential I/O): then one buffer
/// serves every op with no copy.
fn disk_contiguous(run: &[Work]) -> bool {
    run.windows(2).all(|p| p[1].op.disk_addr == p[0].op.disk_addr + p[0].op.len as u64)
}

/// The bytes a write run writes, in device order (borrowed when one request's buffer
/// holds them all); `None` when an op has no data for its range.
pub(super) fn write_data(run: &[Work]) -> Option<std::borrow::Cow<'_, [u8]>> {
    let first = &run[0].op;
    let total: usize = run.iter().map(|w| w.op.len as usize).sum();
    let (bytes, base) = run[0].data.as_ref()?;
    let same = disk_contiguous(run)
        && run.iter().all(|w| {
            w.data.as_ref().is_some_and(|(b, s)| b.as_ptr() == bytes.as_ptr() && b.len() == bytes.len() && s == base)
        });
    if same && first.disk_addr >= *base && first.disk_addr - base + total as u64 <= bytes.len() as u64 {
        let from = (first.disk_addr - base) as usize;
        return Some(std::borrow::Cow::Borrowed(&bytes[from..from + total]));
    }
    let mut data = Vec::with_capacity(total);
    for w in run {
        let (bytes, base) = w.data.as_ref()?;
        let from = w.op.disk_addr.checked_sub(*base)? as usize;
        data.extend_from_slice(bytes.get(from..from + w.op.len as usize)?);
    }
    Some(std::borrow::Cow::Owned(data))
}

/// Each op's outcome from a run's device call: a write's, or a read's bytes (one shared
/// buffer when the run is contiguous on the disk too, else a piece each).
pub(super) fn run_results(run: &[Work], r: std::io::Result<bytes::Bytes>) -> Vec<Result<Option<Bytes>, Failure>> {
    let first = &run[0].op;
    match r {
        Err(e) => {
            if crate::injected::is_remote_failure(&e) {
                // Reported once per failure window by the peer's device.
                tracing::debug!(op = ?first, ops = run.len(), %e, "an op on a peer's lent region failed");
            } else if e.kind() != std::io::ErrorKind::NotConnected {
                tracing::error!(op = ?first, ops = run.len(), %e, "device operation failed");
            }
            vec![Err(failure(&e)); run.len()]
        }
        Ok(_) if first.kind.is_write() => vec![Ok(None); run.len()],
        Ok(buf) if disk_contiguous(run) => {
            let shared: Bytes = (buf, first.disk_addr);
            run.iter().map(|_| Ok(Some(shared.clone()))).collect()
        }
        Ok(buf) => {
            let mut at = 0;
            run.iter()
                .map(|w| {
                    let piece = buf.slice(at..at + w.op.len as usize); // no copy
                    at += w.op.len as usize;
                    Ok(Some((piece, w.op.disk_addr)))
                })
                .collect()
        }
    }
}
