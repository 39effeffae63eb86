//! Control of a running data path: commands run as engine jobs a caller waits for
//! (resizes, write-policy switches, destaging), vDisks added and removed, the policy
//! hooks, the trace recorder, a checkpoint on demand and a crash-like halt.

use super::{Core, DataPath, ExportStats, IntervalHook, JobWait, ObserveHook, SampleHook, Shared};
use cachevisor_engine::{Engine, Failure, Output};
use cachevisor_store::backing::Backing;
use cachevisor_store::journal::Record;
use cachevisor_trace::VmId;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::{Arc, Condvar};
use std::time::{Duration, Instant};

/// Dirty blocks a destage job takes per engine job.
const DESTAGE_STEP: usize = 256;

/// Times a failed destage step is tried again before the destage gives up.
const RETRIES: u32 = 3;

impl Shared {
    /// Dirty blocks of `vm` (or of every vDisk).
    fn dirty_left(core: &Core, vm: Option<VmId>) -> u64 {
        match vm {
            Some(v) => core.engine.partition(v).dirty_blocks,
            None => (0..core.names.len()).map(|v| core.engine.partition(v as VmId).dirty_blocks).sum(),
        }
    }
}

impl DataPath {
    /// Runs `f` on the engine (its ops, if any, become a background job: `Engine::
    /// submit_job`) and waits until every op of it ended. `Ok(false)`: it emitted no op.
    /// Waits while requests are held (a checkpoint draining), since commands are not run
    /// then.
    pub fn run_job(&self, f: impl FnOnce(&mut Engine, &mut Output)) -> Result<bool, Failure> {
        let s = &self.shared;
        let cv = Arc::new(Condvar::new());
        let mut core = s.lock();
        while core.engine.requests_held() && !s.halted.load(SeqCst) {
            core = cv.wait_timeout(core, Duration::from_millis(2)).map_or_else(|p| p.into_inner().0, |g| g.0);
        }
        if s.halted.load(SeqCst) {
            return Err(Failure::Shutdown);
        }
        core.engine.set_clock(s.now()); // a job sees the time it runs at (prewarm deadlines)
        let Some(id) = core.engine.submit_job(f) else {
            s.pump(&mut core);
            s.unlock(core);
            return Ok(false);
        };
        core.jobs.insert(id, JobWait { cv: cv.clone(), failed: None, failure: None });
        s.pump(&mut core);
        loop {
            if let Some(failed) = core.jobs.get(&id).and_then(|j| j.failed) {
                let j = core.jobs.remove(&id).expect("waited for");
                s.unlock(core);
                return if failed { Err(j.failure.unwrap_or(Failure::Io)) } else { Ok(true) };
            }
            if s.halted.load(SeqCst) {
                core.jobs.remove(&id);
                return Err(Failure::Shutdown);
            }
            core = s.help_or_wait(core, &cv, Some(super::devices::Own { req: id, ssd_only: false }));
        }
    }

    /// Replaces the engine's timers (the allocation interval and the flusher) from now.
    pub fn set_schedule(&self, schedule: cachevisor_engine::Schedule) {
        let now = self.shared.now();
        self.with_engine_mut(|e| e.set_schedule(now, schedule));
    }

    /// Runs `f` on the engine and starts what it submitted (policy decisions, settings).
    pub fn with_engine_mut<R>(&self, f: impl FnOnce(&mut Engine) -> R) -> R {
        let mut core = self.shared.lock();
        let r = f(&mut core.engine);
        self.shared.pump(&mut core);
        self.shared.unlock(core);
        r
    }

    /// Writes every dirty block of `vm` (or of every vDisk) back, a job of up to 256
    /// blocks at a time (requests go on between and beside them; its write-backs run on
    /// the device threads concurrently, contiguous ones coalesced), calling
    /// `progress(done, done + left)` after each; blocks stay cached, clean. Ends when
    /// nothing is dirty (writes arriving meanwhile are destaged too), then makes it
    /// durable. Returns the blocks written back.
    pub fn destage(&self, vm: Option<VmId>, progress: &mut dyn FnMut(u64, u64)) -> Result<u64, Failure> {
        let mut cursor = 0u32;
        let mut done = 0u64;
        let mut stalled = 0;
        let mut failures = 0;
        loop {
            let (keys, before) = {
                let core = self.shared.lock();
                let before = Shared::dirty_left(&core, vm);
                if before == 0 {
                    break;
                }
                (core.engine.dirty_batch(vm, &mut cursor, DESTAGE_STEP), before)
            };
            let mut n = 0u64;
            let r = self.run_job(|e, out| {
                let mut one = Output::default();
                for k in keys {
                    let (v, b) =
                        (cachevisor_engine::slot_table::key_vm(k), cachevisor_engine::slot_table::key_block(k));
                    if e.destage_block(v, b, &mut one) > 0 {
                        n += 1;
                    }
                    out.ops.append(&mut one.ops);
                }
            });
            // A failed write-back leaves its block dirty; an I/O error may be transient (a
            // backing store restarting, a network blip): tried again a few times with
            // back-off before the destage gives up. A full store or a stop is final.
            let left = Shared::dirty_left(&self.shared.lock(), vm);
            match r {
                Err(_) if left < before => failures = 0, // some got through: go on
                Err(Failure::Io) if failures < RETRIES => {
                    failures += 1;
                    tracing::warn!(attempt = failures, "write-back failed; trying again");
                    std::thread::sleep(Duration::from_millis(100 << failures));
                }
                Err(f) => return Err(f),
                Ok(_) => failures = 0,
            }
            done += n;
            progress(done, done + left);
            // Blocks with requests in flight are skipped; they come round again.
            stalled = if n == 0 { stalled + 1 } else { 0 };
            if stalled > 0 {
                if stalled > 5000 {
                    tracing::warn!(left, "destaging stalled: blocks stay dirty behind requests in flight");
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.flush(vm.unwrap_or(0))?;
        Ok(done)
    }

    /// Writes back, once, every block of `vms` dirty when it starts (a replica log's
    /// trim: every record below the new tail must have its data on the backing store);
    /// blocks with ops in flight are waited for and written back after them (a later
    /// write's bytes cover the earlier); then makes it durable. Unlike [`Self::destage`]
    /// it ends under a steady stream of writes. Returns the blocks written back.
    pub fn destage_pass(&self, vms: &[VmId]) -> Result<u64, Failure> {
        let mut left: Vec<(VmId, u64)> = {
            let core = self.shared.lock();
            let mut v = Vec::new();
            for &vm in vms {
                let mut cursor = 0u32;
                for k in core.engine.dirty_batch(Some(vm), &mut cursor, usize::MAX) {
                    v.push((vm, cachevisor_engine::slot_table::key_block(k)));
                }
            }
            v
        };
        let mut done = 0u64;
        let mut rounds = 0u32;
        while !left.is_empty() {
            let mut skipped = Vec::new();
            for chunk in left.chunks(DESTAGE_STEP) {
                self.run_job(|e, out| {
                    let mut one = Output::default();
                    for &(vm, b) in chunk {
                        if e.destage_block(vm, b, &mut one) > 0 {
                            done += 1;
                        } else {
                            skipped.push((vm, b));
                        }
                        out.ops.append(&mut one.ops);
                    }
                })?;
            }
            // Skipped and still dirty: an op in flight on it; written back once it ends.
            let core = self.shared.lock();
            skipped.retain(|&(vm, b)| !core.engine.dirty_blocks_in(vm, b, b + 1).is_empty());
            drop(core);
            left = skipped;
            if !left.is_empty() {
                rounds += 1;
                if rounds > 20_000 {
                    return Err(Failure::Io);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        for &vm in vms {
            self.flush(vm)?;
        }
        Ok(done)
    }

    /// Sets the policy's hooks: each request as it is submitted, each ended interval, and
    /// each sampling point of an interval.
    pub fn set_hooks(
        &self,
        observe: Option<ObserveHook>,
        on_interval: Option<IntervalHook>,
        on_sample: Option<SampleHook>,
    ) {
        let mut core = self.shared.lock();
        core.observe = observe;
        core.on_interval = on_interval;
        core.on_sample = on_sample;
    }

    /// Adds a vDisk: VM id `vm` (the next one) named `name` on `backing`, with `meta`
    /// (its name and backing binding) journaled before this returns; the caller sets it
    /// up in the engine first.
    pub fn add_vm(&self, name: &str, backing: Arc<Backing>, meta: Vec<Record>) -> Result<VmId, Failure> {
        let vm = {
            let mut core = self.shared.lock();
            let vm = core.names.len() as VmId;
            let backing = match &self.shared.faults {
                Some(f) => crate::fault_devices::faulty_backing(backing, f),
                None => backing,
            };
            self.shared.backings.write().unwrap_or_else(|p| p.into_inner()).push(backing);
            core.names.push(name.to_string());
            core.stats.push(ExportStats::default());
            core.removed.push(false);
            core.meta.extend(meta);
            core.engine.request_commit();
            vm
        };
        self.flush(vm)?;
        Ok(vm)
    }

    /// The VM id the next [`Self::add_vm`] gives.
    pub fn next_vm(&self) -> VmId {
        self.shared.lock().names.len() as VmId
    }

    /// Journals `meta` (a backing binding, a target) at the next commit and waits for it.
    pub fn record(&self, meta: Vec<Record>) -> Result<(), Failure> {
        {
            let mut core = self.shared.lock();
            core.meta.extend(meta);
            core.engine.request_commit();
        }
        self.flush(0)
    }

    /// Removes vDisk `vm`: its requests are refused from now on (those in flight end),
    /// its dirty blocks are written back and made durable, then its cache is released and
    /// its backing store closed. On error the vDisk is served again.
    pub fn remove_vm(&self, vm: VmId) -> Result<(), Failure> {
        self.shared.lock().removed[vm as usize] = true;
        let r = (|| -> Result<(), Failure> {
            self.destage(Some(vm), &mut |_, _| {})?;
            // What requests already past the check wrote meanwhile is written back here;
            // blocks with ops in flight are skipped and come round again.
            let deadline = Instant::now() + Duration::from_secs(30);
            while self.shared.lock().engine.partition(vm).used > 0 {
                self.run_job(|e, out| e.drop_vm(vm, out))?;
                if Instant::now() > deadline {
                    return Err(Failure::Io);
                }
                if self.shared.lock().engine.partition(vm).used > 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            self.flush(vm)
        })();
        let mut core = self.shared.lock();
        if r.is_err() {
            core.removed[vm as usize] = false;
            return r;
        }
        core.names[vm as usize].clear(); // a checkpoint maps no slot to it
        self.shared.backings.write().unwrap_or_else(|p| p.into_inner())[vm as usize] = Arc::new(Backing::Removed);
        Ok(())
    }

    /// `vm`'s counters.
    pub fn stats(&self, vm: VmId) -> ExportStats {
        let core = self.shared.lock();
        let s = core.stats.get(vm as usize).copied().unwrap_or_default();
        let passthrough = core.engine.bypass_cause(vm) == Some(cachevisor_engine::BypassCause::DeviceErrors);
        ExportStats { passthrough, ..s }
    }

    /// Block accesses that hit, summed over every vDisk.
    pub fn hit_blocks_total(&self) -> u64 {
        self.shared.lock().stats.iter().map(|s| s.hit_blocks).sum()
    }

    /// Records every request from now on with `w` (`None` stops); returns the previous
    /// recorder (to finish it).
    pub fn set_recorder(&self, w: Option<cachevisor_trace::TraceWriter>) -> Option<cachevisor_trace::TraceWriter> {
        std::mem::replace(&mut self.shared.lock().recorder, w)
    }

    /// Ends a controller interval now (the engine's timer ends them every interval).
    pub fn interval_now(&self) {
        let mut core = self.shared.lock();
        Shared::interval(&mut core);
        self.shared.pump(&mut core);
        self.shared.unlock(core);
    }

    /// Waits (running queued ops meanwhile) until no request or job is in flight, at most
    /// `limit`; returns whether that happened.
    pub fn wait_idle(&self, limit: Duration) -> bool {
        let s = &self.shared;
        let deadline = Instant::now() + limit;
        let cv = Condvar::new();
        let mut core = s.lock();
        while core.engine.in_flight() > 0 {
            if Instant::now() > deadline || s.halted.load(SeqCst) {
                s.unlock(core);
                return false;
            }
            core = s.help_or_wait_briefly(core, &cv);
        }
        s.unlock(core);
        true
    }

    /// The background flusher's rate at its last step in bytes per second (its PI
    /// controller's choice, `engine/src/flush_rate.rs`; 0 without a flusher).
    pub fn flush_rate_bytes(&self) -> u64 {
        let core = self.shared.lock();
        (core.engine.flush_rate() * core.engine.config().block_size as f64) as u64
    }

    /// Write-backs of dirty data completed so far (flusher, evictions, destaging).
    pub fn written_back(&self) -> u64 {
        self.shared.written_back.load(Relaxed)
    }

    /// Writes a checkpoint now (requests held until the work in flight drained): the
    /// next start replays no journal. Fails after 30 s of work that does not drain.
    pub fn checkpoint_now(&self) -> Result<(), String> {
        let before = self.checkpoints();
        {
            let mut core = self.shared.lock();
            core.want_checkpoint = true;
            core.engine.request_commit();
            self.shared.pump(&mut core);
        }
        self.shared.commit_cv.notify_all();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.checkpoints() > before {
                return Ok(());
            }
            if !self.shared.lock().want_checkpoint && self.checkpoints() == before {
                return Err("the checkpoint failed (see the log): the journal stays in force".into());
            }
            if Instant::now() > deadline || self.shared.halted.load(SeqCst) {
                return Err("no checkpoint after 30 s: requests in flight did not drain".into());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Stops all device I/O and metadata writes at once, as if the process had died here:
    /// every request in flight or later fails with `Failure::Shutdown`, and this returns
    /// once no device call or commit is under way (at most 30 s), so another process may
    /// take the files over. Nothing is written: a restart recovers like after a SIGKILL.
    pub fn halt(&self) {
        let s = &self.shared;
        s.halted.store(true, SeqCst);
        {
            let mut core = s.lock();
            let ids: Vec<_> = core.waiting.keys().copied().collect();
            for id in ids {
                let w = core.waiting.get_mut(&id).expect("waiting");
                if w.callback.is_some() {
                    let w = core.waiting.remove(&id).expect("waiting");
                    core.callbacks.push((w.callback.expect("a callback"), Err(Failure::Shutdown)));
                } else if w.done.is_none() {
                    w.done = Some(Err(Failure::Shutdown));
                    if let Some(cv) = &w.waiter {
                        cv.notify_one();
                    }
                }
            }
            for j in core.jobs.values() {
                j.cv.notify_all();
            }
            s.unlock(core);
        }
        s.wake.notify_all();
        s.commit_cv.notify_all();
        let deadline = Instant::now() + Duration::from_secs(30);
        while s.busy.load(SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        for b in s.backings.write().unwrap_or_else(|p| p.into_inner()).iter_mut() {
            *b = Arc::new(Backing::Removed);
        }
    }

    /// Metadata commits that failed so far (each retried after a pause).
    pub fn commit_failures(&self) -> u64 {
        self.shared.commit_failures.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Cache reads whose bytes failed their checksum since start (`block_sums.rs`).
    pub fn checksum_mismatches(&self) -> u64 {
        self.shared.sums.mismatches()
    }

    /// Client requests that found no durable free cache slot and waited for a metadata
    /// commit since start (`engine/src/slot_wait.rs`): a journal disk too slow for the
    /// miss rate shows here.
    pub fn slot_waits(&self) -> u64 {
        self.shared.lock().engine.slot_waits()
    }

    /// What the io_uring thread did since start, and whether it runs now.
    pub fn ring_counts(&self) -> crate::RingCounts {
        self.shared.exec.ring_counts()
    }

    /// The data path's own counters the daemon reports beside its guards'.
    pub fn counts(&self) -> DataPathCounts {
        DataPathCounts {
            commit_failures: self.commit_failures(),
            checksum_mismatches: self.checksum_mismatches(),
            slot_waits: self.slot_waits(),
        }
    }

    /// Rounds the ticker ran (the engine's timers under its lock, every 20 ms): it stops
    /// when the engine loop is stuck or the data path halted.
    pub fn ticks(&self) -> u64 {
        self.shared.ticks.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether [`Self::halt`] ran.
    pub fn halted(&self) -> bool {
        self.shared.halted.load(SeqCst)
    }
}

/// The data path's counters of trouble below the protocol, since start.
#[derive(Debug, Clone, Copy, Default)]
pub struct DataPathCounts {
    /// Metadata commits that failed (and were retried after a pause).
    pub commit_failures: u64,
    /// Cache reads whose bytes failed their checksum.
    pub checksum_mismatches: u64,
    /// Client requests that waited for a commit to free a cache slot.
    pub slot_waits: u64,
}
