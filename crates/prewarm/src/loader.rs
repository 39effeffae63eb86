//! The prewarm loader: a plan's reads handed out in order, paced, yielding to the VMs' own
//! I/O, with its progress (Nutanix prewarming slides, "Cache mechanics: prewarming").
//!
//! A sans-IO state machine: the driver asks [`Loader::poll_read`] for the next read (with
//! which disks are busy with client requests right now), performs it through the engine
//! (which skips blocks already cached and reports when the cache has no room), and hands
//! the outcome back to [`Loader::complete`]. [`Loader::poll_timeout`] says when pacing
//! next allows a read. Loading stops when the plan is exhausted or the cache is full.
//!
//! Yielding: while a disk serves client requests, at most `busy_depth` prewarm reads
//! (default 1) are in flight on it, so a client miss queues behind at most that many;
//! on an idle disk up to `idle_depth`. A read whose disk is at its limit is passed over
//! for the next runs of other disks (looking at most `LOOKAHEAD` runs ahead), so one busy
//! disk does not stop the others' prewarming.

use crate::pacer::{PaceConfig, Pacer};
use crate::plan::Run;

/// Runs looked at past a blocked one.
const LOOKAHEAD: usize = 256;

/// How a loader goes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoaderConfig {
    /// Pacing (rate, busy rate, burst).
    pub pace: PaceConfig,
    /// Bytes per object (the cache block size).
    pub block_size: u64,
    /// Prewarm reads in flight per disk while it serves client requests (≥ 1).
    pub busy_depth: u32,
    /// Prewarm reads in flight per disk while it is idle (≥ 1).
    pub idle_depth: u32,
}

/// What a loader has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// Objects in the plan.
    pub planned: u64,
    /// Objects in reads handed out.
    pub issued: u64,
    /// Objects loaded into the cache.
    pub loaded: u64,
    /// Objects found cached already (by the VM's own requests, or an earlier load).
    pub skipped: u64,
    /// Bytes read from backing for prewarming.
    pub bytes_read: u64,
    /// When the first read was handed out (ns).
    pub started_ns: Option<u64>,
    /// When loading ended (ns): the last read completed with the plan exhausted, or the
    /// cache filled up.
    pub finished_ns: Option<u64>,
    /// Sets whose loading stopped early because their share of the cache had no room.
    pub sets_full: u32,
}

/// One read's outcome, from the engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadOutcome {
    /// Objects loaded.
    pub loaded: u32,
    /// Objects already cached (not read).
    pub skipped: u32,
    /// The set's share of the cache had no room for the rest (its loading stops).
    pub no_room: bool,
}

/// What [`Loader::scan`] found.
enum Scan {
    /// Pending index `.0` may go now (its disk busy: `.1`).
    Now(usize, bool),
    /// Nothing may go now; pacing allows one at this time.
    Later(u64),
    /// Nothing to hand out until a completion.
    Nothing,
}

/// Hands out a plan's reads.
#[derive(Debug, Clone)]
pub struct Loader {
    cfg: LoaderConfig,
    runs: Vec<Run>,
    /// Indices of runs not handed out yet, in plan order.
    pending: std::collections::VecDeque<usize>,
    in_flight: Vec<u32>,
    pacer: Pacer,
    progress: Progress,
    stopped: bool,
}

impl Loader {
    /// A loader for `runs` (in the order to load them; sets index disks).
    pub fn new(cfg: LoaderConfig, runs: Vec<Run>) -> Loader {
        let max_read = runs.iter().map(|r| r.len as u64 * cfg.block_size).max().unwrap_or(cfg.block_size);
        let sets = runs.iter().map(|r| r.set as usize + 1).max().unwrap_or(0);
        let progress = Progress { planned: runs.iter().map(|r| r.len as u64).sum(), ..Progress::default() };
        Loader {
            pending: (0..runs.len()).collect(),
            in_flight: vec![0; sets],
            pacer: Pacer::new(cfg.pace, max_read),
            cfg,
            runs,
            progress,
            stopped: false,
        }
    }

    /// Progress so far.
    pub fn progress(&self) -> Progress {
        self.progress
    }

    /// Whether nothing is left to hand out or wait for.
    pub fn finished(&self) -> bool {
        self.progress.finished_ns.is_some() || (self.pending.is_empty() && self.in_flight.iter().all(|&n| n == 0))
    }

    /// The next read allowed at `now_ns`, if any; `busy(set)` says whether that set's disk
    /// is serving client requests now.
    pub fn poll_read(&mut self, now_ns: u64, busy: impl Fn(u32) -> bool) -> Option<Run> {
        let Scan::Now(k, b) = self.scan(now_ns, &busy) else { return None };
        let r = self.runs[self.pending.remove(k).expect("scanned")];
        self.pacer.take(now_ns, r.len as u64 * self.cfg.block_size, b);
        self.in_flight[r.set as usize] += 1;
        self.progress.issued += r.len as u64;
        self.progress.started_ns.get_or_insert(now_ns);
        Some(r)
    }

    /// When pacing next lets a read go, if one is waiting only for pacing (`None`: nothing
    /// to hand out, or only reads of disks at their depth — a completion frees those).
    pub fn poll_timeout(&self, now_ns: u64, busy: impl Fn(u32) -> bool) -> Option<u64> {
        match self.scan(now_ns, &busy) {
            Scan::Now(..) => Some(now_ns),
            Scan::Later(t) => Some(t),
            Scan::Nothing => None,
        }
    }

    /// The first run (within the lookahead) whose disk is below its depth: whether pacing
    /// lets it go now, else when it will (the earliest over the runs looked at).
    fn scan(&self, now_ns: u64, busy: &impl Fn(u32) -> bool) -> Scan {
        if self.stopped {
            return Scan::Nothing;
        }
        let mut later: Option<u64> = None;
        for (k, &i) in self.pending.iter().enumerate().take(LOOKAHEAD) {
            let r = self.runs[i];
            let b = busy(r.set);
            let depth = if b { self.cfg.busy_depth } else { self.cfg.idle_depth }.max(1);
            if self.in_flight[r.set as usize] >= depth {
                continue;
            }
            let at = self.pacer.ready_at(now_ns, r.len as u64 * self.cfg.block_size, b);
            if at <= now_ns {
                return Scan::Now(k, b);
            }
            later = Some(later.map_or(at, |t| t.min(at)));
        }
        later.map_or(Scan::Nothing, Scan::Later)
    }

    /// Stops handing out reads (those in flight still complete).
    pub fn stop(&mut self) {
        self.stopped = true;
        self.pending.clear();
    }

    /// A read handed out ended at `now_ns` with `outcome`.
    pub fn complete(&mut self, run: Run, now_ns: u64, outcome: ReadOutcome) {
        let n = &mut self.in_flight[run.set as usize];
        *n = n.saturating_sub(1);
        let p = &mut self.progress;
        p.loaded += outcome.loaded as u64;
        p.skipped += outcome.skipped as u64;
        p.bytes_read += outcome.loaded as u64 * self.cfg.block_size;
        if outcome.no_room {
            // This set's share of the cache is full: its other reads are dropped (in a
            // shared pool every set finds that on its next read).
            p.sets_full += 1;
            let runs = &self.runs;
            self.pending.retain(|&i| runs[i].set != run.set);
        }
        if self.pending.is_empty() && self.in_flight.iter().all(|&n| n == 0) {
            p.finished_ns.get_or_insert(now_ns);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(rate: Option<u64>) -> LoaderConfig {
        LoaderConfig {
            pace: PaceConfig { rate, busy_rate: 4096, burst: 0 },
            block_size: 4096,
            busy_depth: 1,
            idle_depth: 2,
        }
    }

    fn run(set: u32, first: u64, len: u32) -> Run {
        Run { set, first, len }
    }

    #[test]
    fn reads_go_in_order_within_depth_and_yield_on_a_busy_disk() {
        let mut l = Loader::new(cfg(None), vec![run(0, 0, 1), run(0, 5, 1), run(0, 9, 1), run(1, 3, 2)]);
        assert_eq!(l.progress().planned, 5);
        let idle = |_| false;
        assert_eq!(l.poll_read(0, idle), Some(run(0, 0, 1)));
        assert_eq!(l.poll_read(0, idle), Some(run(0, 5, 1)));
        // Disk 0 at its idle depth (2): disk 1's run goes past it.
        assert_eq!(l.poll_read(0, idle), Some(run(1, 3, 2)));
        assert_eq!(l.poll_read(0, idle), None);
        l.complete(run(0, 0, 1), 10, ReadOutcome { loaded: 1, ..ReadOutcome::default() });
        // Disk 0 busy with client I/O: depth 1, and one read is still in flight.
        assert_eq!(l.poll_read(10, |s| s == 0), None);
        l.complete(run(0, 5, 1), 20, ReadOutcome { loaded: 0, skipped: 1, no_room: false });
        // Busy: the busy bucket (4 kB/s, one read's worth) lets one through.
        assert_eq!(l.poll_read(20, |s| s == 0), Some(run(0, 9, 1)));
        assert!(!l.finished());
        l.complete(run(1, 3, 2), 30, ReadOutcome { loaded: 2, ..ReadOutcome::default() });
        l.complete(run(0, 9, 1), 40, ReadOutcome { loaded: 1, ..ReadOutcome::default() });
        let p = l.progress();
        assert!(l.finished());
        assert_eq!((p.issued, p.loaded, p.skipped, p.bytes_read), (5, 4, 1, 4 * 4096));
        assert_eq!((p.started_ns, p.finished_ns, p.sets_full), (Some(0), Some(40), 0));
    }

    #[test]
    fn paced_reads_wait_for_their_tokens_and_a_full_cache_stops_loading() {
        // 8 kB/s, reads of 4 kB, burst one read: one now, the next 0.5 s later.
        let mut l = Loader::new(cfg(Some(8192)), vec![run(0, 0, 1), run(0, 1, 1), run(0, 2, 1), run(1, 0, 1)]);
        assert_eq!(l.poll_read(0, |_| false), Some(run(0, 0, 1)));
        assert_eq!(l.poll_read(0, |_| false), None);
        assert_eq!(l.poll_timeout(0, |_| false), Some(500_000_000));
        assert_eq!(l.poll_read(500_000_000, |_| false), Some(run(0, 1, 1)));
        l.complete(run(0, 0, 1), 600_000_000, ReadOutcome { loaded: 1, ..ReadOutcome::default() });
        l.complete(run(0, 1, 1), 700_000_000, ReadOutcome { loaded: 0, skipped: 0, no_room: true });
        // Set 0 is full: its last run is dropped; set 1's still goes.
        assert_eq!(l.poll_read(2_000_000_000, |_| false), Some(run(1, 0, 1)));
        assert_eq!(l.poll_timeout(2_000_000_000, |_| false), None);
        assert!(!l.finished());
        l.complete(run(1, 0, 1), 2_100_000_000, ReadOutcome { loaded: 1, ..ReadOutcome::default() });
        let p = l.progress();
        assert!(l.finished());
        assert_eq!((p.issued, p.loaded, p.sets_full, p.finished_ns), (3, 2, 1, Some(2_100_000_000)));
        // A stopped loader hands out nothing more.
        let mut l = Loader::new(cfg(None), vec![run(0, 0, 1), run(0, 1, 1)]);
        l.stop();
        assert_eq!(l.poll_read(0, |_| false), None);
        assert!(l.finished());
    }
}
