//! Destaging everything (or one vDisk) as a background job with progress: the API starts
//! it (`POST /destage`), `GET /destage` and `cachevisor destage` watch it, and `/metrics`
//! exports it. The daemon hands it the work (`Daemon::start_destage`: engine jobs of the
//! same command the background flusher uses, requests going on beside them); this file
//! only runs it on a thread and keeps its progress.

use crate::job_slot::JobSlot;
use std::sync::Arc;

/// A destage run: reports `(done, total)` blocks as it goes; the blocks written back, or
/// why it stopped.
pub(crate) type Work = Box<dyn FnOnce(&mut dyn FnMut(u64, u64)) -> Result<u64, String> + Send>;

/// A destage job's progress.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Progress {
    /// A job is running.
    pub running: bool,
    /// The vDisk destaged (none: every vDisk).
    pub vdisk: Option<String>,
    /// Blocks written back so far.
    pub done_blocks: u64,
    /// Blocks written back so far plus dirty blocks left (grows when writes arrive).
    pub total_blocks: u64,
    /// Seconds since the job started (until it ended).
    pub elapsed_s: f64,
    /// Why the job stopped early.
    pub error: Option<String>,
    /// Bytes per block.
    pub block_size: u64,
}

crate::job_progress!(Progress);

/// The daemon's one destage job (the last one's result stays readable).
#[derive(Debug, Default)]
pub struct Job(Arc<JobSlot<Progress>>);

impl Job {
    /// The current (or last) job's progress.
    pub fn progress(&self) -> Progress {
        self.0.progress()
    }

    /// Starts `work` (destaging `vdisk`, or every vDisk when `None`, in blocks of
    /// `block_size` bytes) on a thread; `Err` with the running job's progress when one is
    /// already running.
    pub fn start(&self, vdisk: Option<String>, block_size: u64, work: Work) -> Result<Progress, Progress> {
        let initial = Progress { vdisk, block_size, ..Progress::default() };
        self.0.start(
            "destage",
            initial,
            move |update| {
                work(&mut |done, total| {
                    update(&mut |p: &mut Progress| {
                        p.done_blocks = done;
                        p.total_blocks = total;
                    })
                })
                .map(|_| ())
            },
            |p| match &p.error {
                Some(e) => tracing::error!(%e, "destage job failed"),
                None => tracing::info!(blocks = p.done_blocks, seconds = p.elapsed_s, "destage job done"),
            },
        )
    }
}
