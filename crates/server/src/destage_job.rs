//! Destaging everything (or one vDisk) as a background job with progress: the API starts
//! it (`POST /destage`), `GET /destage` and `cachevisor destage` watch it, and `/metrics`
//! exports it. The job runs [`Daemon::destage_all`]: steps of the same engine command the
//! background flusher uses, with the lock released between steps so foreground I/O goes on.

use crate::daemon::Daemon;
use cachevisor_trace::VmId;
use std::sync::{Arc, Mutex};
use std::time::Instant;

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

    /// Starts destaging `vm` (or every vDisk) on a thread; `Err` with the running job's
    /// progress when one is already running.
    pub fn start(daemon: &Arc<Daemon>, vm: Option<VmId>) -> Result<Progress, Progress> {
        let job = daemon.destage_job();
        {
            let mut g = job.lock();
            if g.0.running {
                drop(g);
                return Err(job.progress());
            }
            let vdisk = vm.and_then(|v| daemon.export(v)).map(|e| e.name);
            *g = (
                Progress { running: true, vdisk, block_size: daemon.block_size(), ..Progress::default() },
                Some(Instant::now()),
            );
        }
        let d = daemon.clone();
        std::thread::spawn(move || {
            let job = d.destage_job();
            let r = d.destage_all(vm, &mut |done, total| {
                let mut g = job.lock();
                g.0.done_blocks = done;
                g.0.total_blocks = total;
            });
            let mut g = job.lock();
            g.0.running = false;
            g.0.elapsed_s = g.1.map_or(0.0, |t| t.elapsed().as_secs_f64());
            if let Err(e) = r {
                tracing::error!(%e, "destage job failed");
                g.0.error = Some(e.to_string());
            } else {
                tracing::info!(blocks = g.0.done_blocks, seconds = g.0.elapsed_s, "destage job done");
            }
        });
        Ok(job.progress())
    }
}
