//! The committer and the ticker. The committer runs the engine's commits in the order
//! their contract gives (`Persistence::commit`: backing stores, cache store, records,
//! journal), one at a time (group commit: what arrives meanwhile joins the next), with
//! the metadata records the daemon adds (a vDisk's name and backing binding) appended
//! first; past the journal limit (or when asked) it holds requests until nothing is in
//! flight and writes a checkpoint. The ticker runs the engine's timers (flusher steps,
//! the interval's sampling points and ends, handed to the policy's hooks as events), and asks for a commit every second, so the journal stays close to
//! the cache and a restart after a crash is warm.
//!
//! A failed commit (a full metadata file system) is handed to the engine at once (writes
//! and flushes waiting on it fail with ENOSPC; nothing acknowledged is dropped), then the
//! committer pauses before the next one — 10 ms, doubling to at most 1 s while commits
//! keep failing — so a full disk costs neither a core nor the log: the first failure and
//! the recovery are logged once each, every failure is counted (`/metrics`).

use super::{Core, Shared};
use crate::persist::Persistence;
use cachevisor_store::journal::Record;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::time::{Duration, Instant};

impl Shared {
    pub(super) fn committer(&self) {
        let mut checkpointing = false;
        // Commits failed in a row (the pause before the next grows with them).
        let mut failing = 0u32;
        loop {
            let (c, meta) = {
                let mut core = self.lock();
                loop {
                    if self.halted.load(SeqCst) {
                        return; // nothing more is written
                    }
                    if let Some(c) = core.commit.take() {
                        self.busy.fetch_add(1, SeqCst);
                        break (c, std::mem::take(&mut core.meta));
                    }
                    if core.want_checkpoint && !checkpointing {
                        checkpointing = true;
                        let now = self.now();
                        core.engine.hold_requests(true, now);
                    }
                    if checkpointing && core.engine.quiescent() {
                        self.checkpoint(&mut core, &mut self.persist.lock().unwrap_or_else(|p| p.into_inner()));
                        checkpointing = false;
                        continue;
                    }
                    if core.stop && !core.committing {
                        return;
                    }
                    if checkpointing {
                        // Waiting for the work in flight to drain.
                        core = self
                            .commit_cv
                            .wait_timeout(core, Duration::from_millis(2))
                            .map_or_else(|p| p.into_inner().0, |g| g.0);
                    } else {
                        core = self.commit_cv.wait(core).unwrap_or_else(|p| p.into_inner());
                    }
                }
            };
            let backings: Vec<_> = c.sync_backings.iter().filter_map(|&vm| self.backing(vm).ok()).collect();
            let backing_refs: Vec<&cachevisor_store::backing::Backing> = backings.iter().map(|b| &**b).collect();
            let r = {
                let mut persist = self.persist.lock().unwrap_or_else(|p| p.into_inner());
                append_meta(&mut persist, &meta).and_then(|()| {
                    persist.commit(&c, &|| self.sync_stores(), &backing_refs, &|r| self.sums.of_record(r))
                })
            };
            // Checksums of sectors the records call clean, and of freed slots, are not
            // kept (before the engine hears of the commit: no freed slot is reused yet).
            for r in &c.records {
                self.sums.prune(r);
            }
            self.busy.fetch_sub(1, SeqCst);
            match &r {
                Err(e) => {
                    self.commit_failures.fetch_add(1, Relaxed);
                    if failing == 0 {
                        tracing::error!(%e, epoch = c.epoch, "commit failed: its records are tried again, with pauses up to 1 s, until one succeeds (counted in cachevisor_commit_failures_total)");
                    }
                    failing += 1;
                }
                Ok(()) if failing > 0 => {
                    tracing::info!(failures = failing, "commits succeed again");
                    failing = 0;
                }
                Ok(()) => {}
            }
            let mut core = self.lock();
            if r.is_err() {
                // Tried again first at the next commit (recording them twice is harmless).
                let mut m = meta;
                m.append(&mut core.meta);
                core.meta = m;
            }
            let now = self.now();
            core.engine.handle_commit(now, c.epoch, r.map_err(|e| super::devices::failure(&e)));
            core.committing = false;
            // The journal past its limit: hold requests until nothing is in flight, then a
            // checkpoint replaces it (commits go on meanwhile: held writes need them).
            if !checkpointing && self.persist.lock().unwrap_or_else(|p| p.into_inner()).wants_checkpoint() {
                checkpointing = true;
                core.engine.hold_requests(true, now);
            }
            self.pump(&mut core);
            self.unlock(core);
            if failing > 0 {
                let pause = Duration::from_millis(10u64 << failing.min(7)).min(Duration::from_secs(1));
                let until = Instant::now() + pause;
                while Instant::now() < until && !self.halted.load(SeqCst) {
                    std::thread::sleep(Duration::from_millis(10).min(pause));
                }
            }
        }
    }

    /// Writes a checkpoint of the quiescent engine and lets requests go on (a failed one
    /// leaves the journal in force and is tried again after the next commit).
    fn checkpoint(&self, core: &mut Core, persist: &mut Persistence) {
        self.busy.fetch_add(1, SeqCst);
        let Core { engine, names, .. } = core;
        let targets: Vec<u64> = (0..names.len()).map(|v| engine.partition(v as u32).target).collect();
        let backings = self.backings.read().unwrap_or_else(|p| p.into_inner()).clone();
        let sums = |r: &cachevisor_engine::SlotRecord| self.sums.of_record(r);
        let r = persist.checkpoint_records(
            names,
            &targets,
            &|| self.sync_stores(),
            &backings,
            &mut |emit| engine.checkpoint(emit),
            &sums,
        );
        self.busy.fetch_sub(1, SeqCst);
        match r {
            Ok(()) => {
                core.engine.checkpoint_done();
                self.checkpoints.fetch_add(1, Relaxed);
            }
            Err(e) => tracing::error!(%e, "checkpoint failed: the journal stays in force"),
        }
        core.want_checkpoint = false;
        let now = self.now();
        core.engine.hold_requests(false, now);
        self.pump(core);
    }

    pub(super) fn ticker(&self, period: Duration) {
        let mut last_commit = Instant::now();
        loop {
            std::thread::sleep(period);
            let mut core = self.lock();
            if core.stop || self.halted.load(SeqCst) {
                return;
            }
            let now = self.now();
            core.engine.handle_timeout(now);
            if last_commit.elapsed() >= Duration::from_secs(1) {
                core.engine.request_commit();
                last_commit = Instant::now();
            }
            self.pump(&mut core);
            self.unlock(core);
            self.ticks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Appends the daemon's metadata records (before the commit's slot records, which may
/// name the vDisk they introduce).
fn append_meta(persist: &mut Persistence, meta: &[Record]) -> std::io::Result<()> {
    for r in meta {
        match r {
            Record::Vdisk { vm, name } => persist.record_vdisk(*vm, name)?,
            Record::Binding { vm, identity } => persist.record_binding(*vm, identity)?,
            Record::Target { vm, blocks } => persist.record_target(*vm, *blocks)?,
            Record::Slot { .. }
            | Record::Mirror { .. }
            | Record::Free { .. }
            | Record::CacheLabel(_)
            | Record::CacheDevices(_) => {}
        }
    }
    Ok(())
}
