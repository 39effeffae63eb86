//! Destaging everything (or one vDisk) as a background job with progress: the API starts
//! it (`POST /destage`), `GET /destage` and `cachevisor destage` watch it, and `/metrics`
//! exports it. The daemon hands it the work (`Daemon::start_destage`: engine jobs of the
//! same command the background flusher uses, requests going on beside them); this file
//! only runs it on a thread and keeps its progress.

use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A destage run: reports `(done, total)` blocks as it goes; the blocks written back, or
/// why it stopped.
pub type Work = Box<dyn FnOnce(&mut dyn FnMut(u64, u64)) -> Result<u64, String> + Send>;

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

/// The daemon's one destage job (the last one's result stays readable).
#[derive(Debug, Default)]
pub struct Job {
    state: Mutex<(Progress, Option<Instant>)>,
}

impl Job {
    fn lock(&self) -> std::sync::MutexGuard<'_, (Progress, Option<Instant>)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current (or last) job's progress.
    pub fn progress(&self) -> Progress {
        let g = self.lock();
        let mut p = g.0.clone();
        if let (true, Some(t)) = (p.running, g.1) {
            p.elapsed_s = t.elapsed().as_secs_f64();
        }
        p
    }

    /// Starts `work` (destaging `vdisk`, or every vDisk when `None`, in blocks of
    /// `block_size` bytes) on a thread; `Err` with the running job's progress when one is
    /// already running.
    pub fn start(self: &Arc<Self>, vdisk: Option<String>, block_size: u64, work: Work) -> Result<Progress, Progress> {
        {
            let mut g = self.lock();
            if g.0.running {
                drop(g);
                return Err(self.progress());
            }
            *g = (Progress { running: true, vdisk, block_size, ..Progress::default() }, Some(Instant::now()));
        }
        let job = self.clone();
        std::thread::spawn(move || {
            let r = work(&mut |done, total| {
                let mut g = job.lock();
                g.0.done_blocks = done;
                g.0.total_blocks = total;
            });
            let mut g = job.lock();
            g.0.running = false;
            g.0.elapsed_s = g.1.map_or(0.0, |t| t.elapsed().as_secs_f64());
            if let Err(e) = r {
                tracing::error!(%e, "destage job failed");
                g.0.error = Some(e);
            } else {
                tracing::info!(blocks = g.0.done_blocks, seconds = g.0.elapsed_s, "destage job done");
            }
        });
        Ok(self.progress())
    }
}
