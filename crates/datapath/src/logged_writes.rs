//! A replicated vDisk's client writes held until the replica log has them (the cluster's
//! `replicator.rs`, "durability beyond ELICA"): as a run of writes starts on its device,
//! its replicated ops' records are handed to the log under a ticket; when the device
//! call ends, the ops complete only if the log's outcome is in — else they are held, and
//! the log's thread completes them when it answers. Neither side waits for the other: the
//! local write runs where any cache write runs (the io_uring thread, a client's thread),
//! and the log batches what is queued while its last write to the peer was under way.
//! Before this, a device thread ran each replicated write and slept until its record was
//! on the peer (measured: 12 context switches a write, 1.3x the backing store's IOPS).
//!
//! A log that is not usable answers `Bypass`: the held write's bytes then go through to
//! the backing store before it completes, as a write-through would.

use super::devices::failure;
use super::{Bytes, Core, Shared, Work};
use crate::injected::{LogRecord, Logged};
use cachevisor_engine::{DeviceOp, Failure};
use cachevisor_trace::VmId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// An op's outcome from its device.
pub(super) type OpResult = Result<Option<Bytes>, Failure>;

/// Writes handed to the log and not yet completed.
#[derive(Default)]
pub(super) struct Holds {
    next: AtomicU64,
    held: Mutex<HashMap<u64, Hold>>,
}

/// One write's state between its two parts.
#[derive(Default)]
struct Hold {
    /// Its data records' bytes (written through on `Bypass`).
    data: Vec<(VmId, u64, bytes::Bytes)>,
    /// The local part's ops and outcomes, once it ended.
    local: Option<Vec<(DeviceOp, OpResult)>>,
    /// The log's outcome, once in.
    logged: Option<Result<(), Failure>>,
}

/// An op's outcome given the log's: a write the log failed fails.
fn with_log(r: OpResult, logged: Result<(), Failure>) -> OpResult {
    match (r, logged) {
        (Ok(_), Err(f)) => Err(f),
        (r, _) => r,
    }
}

impl Holds {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Hold>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes held now (tests).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }
}

impl Shared {
    /// Right before a write run's device call: hands its replicated ops' records to the
    /// log (a cache write's bytes as data, a backing write as a tombstone); the ticket
    /// the run's completion waits on ([`Self::finish_run`] must be called with it).
    pub(super) fn log_run(&self, run: &[Work]) -> Option<u64> {
        let log = self.replicator.get()?;
        if !run[0].op.kind.is_write() {
            return None;
        }
        let (mut recs, mut data) = (Vec::new(), Vec::new());
        for w in run.iter().filter(|w| self.replicated(&w.op)) {
            let op = &w.op;
            let bytes = if op.kind.is_ssd() {
                // `write_data` found every op's bytes before this is called.
                let (b, base) = w.data.as_ref()?;
                let from = op.disk_addr.checked_sub(*base)? as usize;
                let piece = b.slice(from..from + op.len as usize);
                data.push((op.vm, op.disk_addr, piece.clone()));
                Some(piece)
            } else {
                None
            };
            recs.push(LogRecord { vm: op.vm, offset: op.disk_addr, len: op.len, data: bytes });
        }
        if recs.is_empty() {
            return None;
        }
        let ticket = self.holds.next.fetch_add(1, Relaxed);
        self.holds.lock().insert(ticket, Hold { data, ..Hold::default() });
        log.submit(ticket, recs);
        Some(ticket)
    }

    /// Completes a run's ops after its device call — unless the run was logged
    /// (`ticket`) and the log has not answered: then they wait for [`Self::logged`].
    pub(super) fn finish_run(&self, core: &mut Core, run: Vec<Work>, results: Vec<OpResult>, ticket: Option<u64>) {
        let mut results = results;
        if let Some(t) = ticket {
            if let Some(log) = self.replicator.get() {
                log.local_done(t);
            }
            let mut held = self.holds.lock();
            let h = held.get_mut(&t).expect("a logged run's hold");
            match h.logged {
                None => {
                    h.local = Some(run.into_iter().map(|w| w.op).zip(results).collect());
                    return;
                }
                Some(logged) => {
                    held.remove(&t);
                    results = results.into_iter().map(|r| with_log(r, logged)).collect();
                }
            }
        }
        for (w, r) in run.into_iter().zip(results) {
            self.complete(core, w.op, r);
        }
    }

    /// The log's outcomes (on its thread): a bypassed write's bytes go to its backing
    /// store first; each write whose local part ended completes.
    pub(super) fn logged(&self, outcomes: Vec<(u64, std::io::Result<Logged>)>) {
        let mut ready = Vec::new();
        for (t, outcome) in outcomes {
            let logged = match outcome {
                Ok(Logged::Appended) => Ok(()),
                Ok(Logged::Bypass) => self.write_through(t),
                Err(e) => Err(failure(&e)),
            };
            let mut held = self.holds.lock();
            let Some(h) = held.get_mut(&t) else { continue };
            match h.local.take() {
                Some(ops) => {
                    held.remove(&t);
                    ready.push((ops, logged));
                }
                None => h.logged = Some(logged),
            }
        }
        if ready.is_empty() {
            return;
        }
        let mut core = self.lock();
        for (ops, logged) in ready {
            for (op, r) in ops {
                self.complete(&mut core, op, with_log(r, logged));
            }
        }
        self.unlock(core);
    }

    /// Writes held write `t`'s data records to their backing stores (the log bypassed).
    fn write_through(&self, t: u64) -> Result<(), Failure> {
        let data = self.holds.lock().get_mut(&t).map(|h| std::mem::take(&mut h.data)).unwrap_or_default();
        for (vm, at, bytes) in data {
            if let Err(e) = self.backing(vm).and_then(|b| b.write_at(&bytes, at)) {
                tracing::error!(vm, at, %e, "a replicated write going through to its backing store (the log unusable) failed");
                return Err(failure(&e));
            }
        }
        Ok(())
    }
}
