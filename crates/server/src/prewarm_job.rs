//! The daemon's prewarm job and its progress: `serve --prewarm-from DIR` (or
//! `POST /prewarm`) starts it, `GET /prewarm`, `cachevisor status`, `cachevisor prewarm
//! status` and `/metrics` watch it. The daemon hands it the work (`daemon/prewarming.rs`:
//! the `prewarm` crate's loader, each read an engine job); this file only runs it on a
//! thread and keeps its progress.

use crate::job_slot::JobSlot;
use std::sync::Arc;

/// A prewarm job's progress.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Progress {
    /// A job is running.
    pub running: bool,
    /// Where its snapshots came from.
    pub from: String,
    /// Snapshots read.
    pub snapshots: usize,
    /// Blocks in the prewarm set (after the size limit), of vDisks served here.
    pub planned_blocks: u64,
    /// Blocks loaded into the cache.
    pub loaded_blocks: u64,
    /// Blocks found cached already (or busy with a client request).
    pub skipped_blocks: u64,
    /// Bytes read from the backing stores for prewarming.
    pub read_bytes: u64,
    /// vDisks whose share of the cache filled before their part of the set was loaded.
    pub full_vdisks: u32,
    /// vDisks served here that the snapshots name (their sets are prewarmed).
    #[serde(default)]
    pub matched_vdisks: Vec<String>,
    /// Sets in the snapshots that name no vDisk served here (skipped).
    #[serde(default)]
    pub unmatched_sets: Vec<String>,
    /// Blocks the snapshots name past the end of their vDisk (a larger disk's snapshot, or
    /// a damaged one): skipped, never read.
    #[serde(default)]
    pub out_of_range_blocks: u64,
    /// Seconds since the job started (until it ended).
    pub elapsed_s: f64,
    /// Why the job did not run or stopped early.
    pub error: Option<String>,
    /// `prewarm.online`: whether the online parameters chose the set and rate (`false`:
    /// the snapshots carried no activity, so `limit` and `rate` did); absent when off.
    pub online: Option<bool>,
    /// vDisks the online parameters left out (their own traffic re-warms them soon, or
    /// they hardly reused their cache).
    pub online_skipped: Vec<String>,
    /// The prewarm rate, bytes/s (`None`: unlimited).
    pub rate_bytes: Option<u64>,
    /// How long a prewarmed block is kept from eviction before its first touch, ms.
    pub protect_ms: Option<u32>,
}

/// What a job's work reports as it goes.
pub type Report<'a> = &'a mut dyn FnMut(&Progress);

/// A prewarm run: reports its progress; `Err` says why it stopped.
pub type Work = Box<dyn FnOnce(Report) -> Result<(), String> + Send>;

crate::job_progress!(Progress);

/// The daemon's one prewarm job (the last one's result stays readable).
#[derive(Debug, Default)]
pub struct Job(Arc<JobSlot<Progress>>);

impl Job {
    /// The current (or last) job's progress.
    pub fn progress(&self) -> Progress {
        self.0.progress()
    }

    /// Records a job that could not start (bad or corrupt snapshots): the daemon goes on
    /// cold and the reason is what `progress` shows.
    pub fn refused(&self, from: &str, error: String) {
        self.0.set(Progress { from: from.into(), error: Some(error), ..Progress::default() });
    }

    /// Starts `work` on a thread, showing `initial` (what was planned) until it reports;
    /// `Err` with the running job's progress when one runs.
    pub fn start(&self, initial: Progress, work: Work) -> Result<Progress, Progress> {
        self.0.start(
            "prewarm",
            initial,
            move |update| {
                work(&mut |p: &Progress| {
                    update(&mut |cur: &mut Progress| {
                        let from = std::mem::take(&mut cur.from);
                        *cur = Progress { running: true, from, ..p.clone() };
                    })
                })
            },
            |p| match &p.error {
                Some(e) => tracing::error!(%e, "prewarm stopped"),
                None => tracing::info!(
                    loaded = p.loaded_blocks,
                    skipped = p.skipped_blocks,
                    seconds = p.elapsed_s,
                    "prewarm done"
                ),
            },
        )
    }
}
