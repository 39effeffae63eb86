//! The engine's timers: the controller interval, the background flusher and the global
//! cleaner's trigger, so every driver (simulator, daemon) runs the exact same sequence.
//! A driver asks [`Engine::poll_timeout`] when the engine next needs it and calls
//! [`Engine::handle_timeout`] at (or after) that time; the engine then emits the
//! controller interval's events (`interval.rs`: [`crate::Event::Sample`],
//! [`crate::Event::Interval`]) and submits the flusher's write-back as background jobs.
//!
//! The flusher keeps a dirty target like bcache's `writeback_percent`: it writes back
//! only while more than `dirty_target` of the pool is dirty, so hot blocks that are
//! rewritten often stay dirty (their rewrites cost no write-back and, in the daemon, no
//! barrier), at a rate bcache's PI controller sets from how far over the target the
//! cache is (`flush_rate.rs`) and at most `blocks_per_period` blocks per period (the
//! configured rate).

use crate::engine::Engine;
use crate::flush_rate::FlushRate;
use crate::output::Output;
use cachevisor_trace::VmId;

/// When the engine needs its driver.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Schedule {
    /// Controller interval in ns (0: no interval events, unless `interval_requests`).
    pub interval_ns: u64,
    /// Controller interval in requests run instead of time (0: by time).
    pub interval_requests: u64,
    /// Sampling points per interval, its end the last ([`Event::Sample`]; 0 or 1: none
    /// before the end).
    pub samples: u32,
    /// Background write-back (`None`: off).
    pub flusher: Option<Flusher>,
}

/// The background flusher's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Flusher {
    /// Time between steps in ns (> 0).
    pub period_ns: u64,
    /// Blocks written back per step at most (≥ 1).
    pub blocks_per_period: u64,
    /// Fraction of the pool's slots allowed to stay dirty (0 writes everything back).
    pub dirty_target: f64,
}

/// Blocks one flusher job writes back at most while the cache is idle (no client request
/// for [`crate::flush_rate::IDLE_STEPS`] steps, none since the last).
pub const FLUSH_JOB_BLOCKS: u64 = 4;
/// Blocks one flusher job writes back at most under client load: a client miss on the
/// same backing store waits behind a whole job, so under load a job is one write, as
/// write-back ahead's are. Measured on `experiment elica` (7,200 rpm backing models):
/// jobs of 4 took the p99.9 from 15.5 / 16.3 ms (no flusher; local-only / ELICA-Traffic)
/// to 20.6 / 19.9 ms, jobs of 1 give 15.2 / 15.6 ms.
pub const FLUSH_JOB_BLOCKS_UNDER_LOAD: u64 = 1;

/// Timer state inside [`Engine`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Timers {
    schedule: Schedule,
    next_flush: Option<u64>,
    /// Where the flusher's sweep of the dirty bitmap goes on.
    flush_cursor: u32,
    /// Blocks the flusher may still write back in this step (`flush_step` refills them).
    flush_tokens: u64,
    /// The cache's dirty blocks above which the flusher writes back (its target).
    flush_above: u64,
    /// Global cleaner watermarks in free slots (low, high).
    cleaner: Option<(u64, u64)>,
    /// The flusher's rate controller.
    rate: FlushRate,
    /// Client requests since the last flusher step (the controller's idle test).
    requests: u64,
}

impl Timers {
    /// A client request arrived (the flusher's idle test counts them).
    #[inline]
    pub(crate) fn request_arrived(&mut self) {
        self.requests += 1;
    }
}

impl Engine {
    /// Sets the timers, starting at driver time `now_ns` (the first interval ends one
    /// interval later, the flusher's first step one period later).
    pub fn set_schedule(&mut self, now_ns: u64, schedule: Schedule) {
        let by_requests = schedule.interval_requests > 0;
        let length = if by_requests { schedule.interval_requests } else { schedule.interval_ns };
        self.interval.set(length, by_requests, schedule.samples, now_ns);
        let t = &mut self.timers;
        t.next_flush = schedule.flusher.map(|f| now_ns.saturating_add(f.period_ns.max(1)));
        t.schedule = schedule;
        self.ahead.set_flushing(schedule.flusher.is_some());
    }

    /// Sets (or clears) the global cleaner's watermarks in free slots: when a request
    /// leaves fewer than `low` free, the cleaner reclaims up to `high` (S-CAVE §V-B).
    pub fn set_cleaner(&mut self, watermarks: Option<(u64, u64)>) {
        self.timers.cleaner = watermarks;
    }

    /// The flusher's rate at its last step in blocks per second (0 before the first
    /// step or without a flusher).
    pub fn flush_rate(&self) -> f64 {
        self.timers.rate.blocks_per_s()
    }

    /// The global cleaner's watermarks (low, high) in free slots, if set.
    pub fn cleaner(&self) -> Option<(u64, u64)> {
        self.timers.cleaner
    }

    /// The free-slot goal to clean to now, when the cleaner's low watermark is crossed.
    pub fn cleaner_due(&self) -> Option<u64> {
        self.timers.cleaner.filter(|&(low, _)| self.free_slots() < low).map(|(_, high)| high)
    }

    /// The next time the engine needs [`Self::handle_timeout`], if any.
    pub fn poll_timeout(&self) -> Option<u64> {
        match (self.interval.next_due_ns(), self.timers.next_flush) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs what is due at `now_ns`: each sampling point and end of the interval passed
    /// ([`Event::Sample`], [`Event::Interval`], in order: `interval.rs`), and a flusher
    /// step (a background job) if its period passed.
    pub fn handle_timeout(&mut self, now_ns: u64) {
        self.ahead.at(now_ns);
        self.seals.at(now_ns);
        self.interval_due(now_ns);
        if let (Some(at), Some(f)) = (self.timers.next_flush, self.timers.schedule.flusher) {
            if at <= now_ns {
                // One step however late the driver is: the rate is a ceiling, not a debt.
                self.timers.next_flush = Some(now_ns.saturating_add(f.period_ns.max(1)));
                self.flush_step(f);
            }
        }
    }

    /// A flusher step: the rate controller (`flush_rate.rs`) says how many blocks this
    /// step may write back (tokens, not carried over: the rate is a ceiling, not a debt),
    /// and every vDisk with dirty blocks is looked at. The writing is the vDisks' background write-back jobs' (`writeback_ahead.rs`):
    /// while the cache holds more dirty blocks than the target, a vDisk whose backing store
    /// is idle and runs no such job writes up to [`FLUSH_JOB_BLOCKS`] of them back, and
    /// the next once that one ends — so the flusher uses the backing stores' idle time and
    /// a client miss waits behind at most one small job, never behind a step's worth of
    /// writes (on a 7,200 rpm disk, 409 writes were ~3 s: re-measured
    /// experiments).
    fn flush_step(&mut self, f: Flusher) {
        let above = (f.dirty_target.clamp(0.0, 1.0) * self.slot_count() as f64) as u64;
        let dirty: u64 = self.vms.iter().map(|p| p.dirty_blocks).sum();
        let t = &mut self.timers;
        t.flush_above = above;
        t.flush_tokens = t.rate.step(&f, dirty, above, std::mem::take(&mut t.requests));
        for vm in 0..self.vm_count() as VmId {
            if self.vms[vm as usize].dirty_blocks > 0 {
                self.ahead.queue(vm);
            }
        }
        self.run_writeback_ahead();
    }

    /// The flusher's next job for `vm` (its backing store idle, no background job of its
    /// running): up to [`FLUSH_JOB_BLOCKS`] of its dirty blocks while the cache holds more
    /// than the target and the step has tokens left. Returns the blocks written.
    pub(crate) fn flush_job_for(&mut self, vm: VmId) -> u32 {
        let t = &self.timers;
        if t.schedule.flusher.is_none() || t.flush_tokens == 0 {
            return 0;
        }
        let dirty: u64 = self.vms.iter().map(|p| p.dirty_blocks).sum();
        if dirty <= self.timers.flush_above {
            return 0;
        }
        let idle = self.timers.rate.idle() && self.timers.requests == 0;
        let job = if idle { FLUSH_JOB_BLOCKS } else { FLUSH_JOB_BLOCKS_UNDER_LOAD };
        let n = (dirty - self.timers.flush_above).min(self.timers.flush_tokens).min(job);
        let mut cursor = self.timers.flush_cursor;
        let keys = self.dirty_batch(Some(vm), &mut cursor, n as usize);
        self.timers.flush_cursor = cursor;
        if keys.is_empty() {
            return 0;
        }
        let Some(id) = self.destage_job(&keys) else { return 0 };
        self.timers.flush_tokens -= keys.len() as u64;
        self.ahead.job_started(vm, id, 0);
        keys.len() as u32
    }

    /// Writes back the dirty blocks of `keys` (block keys) as one background job, leaving
    /// them cached clean (pinned ones skipped); in persistent mode their clean state is
    /// not journaled (the flusher's rule, `durability.rs`). The flusher and write-back
    /// ahead of eviction use it. Returns the job, `None` when nothing was written.
    pub(crate) fn destage_job(&mut self, keys: &[u64]) -> Option<crate::ReqId> {
        self.dur.set_lazy_clean(true);
        let id = self.submit_job(|e, out| {
            let mut one = Output::default();
            for &k in keys {
                e.destage_block(crate::slot_table::key_vm(k), crate::slot_table::key_block(k), &mut one);
                out.ops.append(&mut one.ops);
            }
        });
        self.dur.set_lazy_clean(false);
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EngineConfig, Event};
    use cachevisor_trace::{Op, Request};

    fn write(e: &mut Engine, b: u64) {
        let mut out = Output::default();
        e.access(0, &Request { time_ns: 0, vm: 0, op: Op::Write, offset: b * 4096, len: 4096 }, &mut out);
    }

    #[test]
    fn intervals_fire_in_order_and_catch_up() {
        let mut e = Engine::new(EngineConfig::with_slots(8)).unwrap();
        assert_eq!(e.poll_timeout(), None);
        e.set_schedule(100, Schedule { interval_ns: 1000, flusher: None, ..Default::default() });
        assert_eq!(e.poll_timeout(), Some(1100));
        e.handle_timeout(1099);
        assert_eq!(e.poll_event(), None, "not due yet");
        e.handle_timeout(3500);
        let got: Vec<_> = std::iter::from_fn(|| e.poll_event()).collect();
        assert_eq!(
            got,
            [
                Event::Interval { at_ns: 1100, index: 0 },
                Event::Interval { at_ns: 2100, index: 1 },
                Event::Interval { at_ns: 3100, index: 2 }
            ]
        );
        assert_eq!(e.poll_timeout(), Some(4100));
    }

    #[test]
    fn the_flusher_keeps_its_dirty_target_and_rate() {
        let mut e = Engine::new(EngineConfig::with_slots(10)).unwrap();
        let mut out = Output::default();
        e.set_target(0, 10, &mut out);
        for b in 0..8 {
            write(&mut e, b);
        }
        // 30% of 10 slots may stay dirty; 2 blocks per step once idle (no client request
        // for IDLE_STEPS steps, counted after the first step, which sees the 8 writes:
        // under load, 5 blocks over target are 1/8 block a second).
        let f = Flusher { period_ns: 10, blocks_per_period: 2, dirty_target: 0.3 };
        e.set_schedule(0, Schedule { interval_ns: 0, flusher: Some(f), ..Default::default() });
        let mut steps = 0;
        while e.partition(0).dirty_blocks > 3 {
            let at = e.poll_timeout().unwrap();
            e.handle_timeout(at);
            steps += 1;
            let mut written = 0;
            while let Some(op) = e.poll_op() {
                written += op.kind.is_write() as u64;
                e.handle_completion(at, op.handle(), Ok(()));
                while let Some(op) = e.poll_op() {
                    written += op.kind.is_write() as u64;
                    e.handle_completion(at, op.handle(), Ok(()));
                }
            }
            assert!(written <= 2, "at most the rate per step");
            assert!(written == 0 || steps >= crate::flush_rate::IDLE_STEPS, "nothing before the cache is idle");
            assert!(steps < 20);
        }
        assert_eq!((e.partition(0).dirty_blocks, steps), (3, crate::flush_rate::IDLE_STEPS + 3));
        // At the target: further steps write nothing.
        let at = e.poll_timeout().unwrap();
        e.handle_timeout(at);
        assert_eq!(e.poll_op(), None);
        assert_eq!(e.partition(0).used, 8, "written back, still cached");
        e.check_invariants().unwrap();
    }

    /// the flusher writes in the backing store's idle time, in small jobs, one
    /// after another: nothing while a client miss is on the backing store, then jobs of
    /// one block while clients are active (`FLUSH_JOB_BLOCKS_UNDER_LOAD`) and of at most
    /// `FLUSH_JOB_BLOCKS` once the cache is idle, the next starting as the last ends, up
    /// to the step's tokens.
    #[test]
    fn the_flusher_waits_for_an_idle_backing_store_and_writes_small_jobs() {
        let mut e = Engine::new(EngineConfig::with_slots(64)).unwrap();
        e.set_target(0, 64, &mut Output::default());
        for b in 0..60 {
            write(&mut e, b);
        }
        let f = Flusher { period_ns: 10, blocks_per_period: 4, dirty_target: 0.0 };
        e.set_schedule(0, Schedule { interval_ns: 0, flusher: Some(f), ..Default::default() });
        // A read miss: its backing read stays in flight.
        e.submit(0, &Request { time_ns: 0, vm: 0, op: Op::Read, offset: 63 * 4096, len: 4096 });
        let miss = e.poll_op().unwrap();
        assert_eq!(miss.kind, crate::OpKind::BackingRead);
        e.handle_timeout(10);
        assert_eq!(e.poll_op(), None, "no write-back while the client's miss is on the backing store");
        e.handle_completion(10, miss.handle(), Ok(()));
        // The backing store is idle, the cache is not (a request came in this step): jobs
        // of one block, one at a time, up to the step's 4.
        let run_jobs = |e: &mut Engine, t: u64| {
            let (mut written, mut most_in_flight) = (0u64, 0usize);
            loop {
                let ops: Vec<_> = std::iter::from_fn(|| e.poll_op()).collect();
                if ops.is_empty() {
                    return (written, most_in_flight);
                }
                let backing = ops.iter().filter(|o| o.kind == crate::OpKind::BackingWrite).count();
                most_in_flight = most_in_flight.max(backing);
                written += backing as u64;
                for op in ops {
                    e.handle_completion(t, op.handle(), Ok(()));
                }
            }
        };
        assert_eq!(run_jobs(&mut e, 10), (4, 1), "the step's tokens, job after job, one block each");
        assert_eq!(e.partition(0).dirty_blocks, 56);
        // Steps with no request: once the cache is idle, jobs of FLUSH_JOB_BLOCKS.
        let mut most = 0;
        for step in 2..=crate::flush_rate::IDLE_STEPS as u64 + 1 {
            e.handle_timeout(step * 10);
            most = most.max(run_jobs(&mut e, step * 10).1);
        }
        assert_eq!(most, 4, "idle: whole jobs of FLUSH_JOB_BLOCKS");
        e.check_invariants().unwrap();
    }

    #[test]
    fn the_cleaner_is_due_below_its_low_watermark() {
        let mut e = Engine::new(EngineConfig::with_slots(4)).unwrap();
        let mut out = Output::default();
        e.set_target(0, 4, &mut out);
        e.set_cleaner(Some((2, 3)));
        write(&mut e, 0);
        write(&mut e, 1);
        assert_eq!(e.cleaner_due(), None);
        write(&mut e, 2);
        assert_eq!(e.cleaner_due(), Some(3));
    }
}
