//! The daemon's prewarm job and its progress: `serve --prewarm-from DIR` (or
//! `POST /prewarm`) starts it, `GET /prewarm`, `cachevisor status`, `cachevisor prewarm
//! status` and `/metrics` watch it. The daemon hands it the work (`daemon/prewarming.rs`:
//! the `prewarm` crate's loader, each read an engine job); this file only runs it on a
//! thread and keeps its progress.

use std::sync::{Arc, Mutex};
use std::time::Instant;

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
    /// Seconds since the job started (until it ended).
    pub elapsed_s: f64,
    /// Why the job did not run or stopped early.
    pub error: Option<String>,
}

/// What a job's work reports as it goes.
pub type Report<'a> = &'a mut dyn FnMut(&Progress);

/// A prewarm run: reports its progress; `Err` says why it stopped.
pub type Work = Box<dyn FnOnce(Report) -> Result<(), String> + Send>;

/// The daemon's one prewarm job (the last one's result stays readable).
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

    /// Records a job that could not start (bad or corrupt snapshots): the daemon goes on
    /// cold and the reason is what `progress` shows.
    pub fn refused(&self, from: &str, error: String) {
        *self.lock() = (Progress { from: from.into(), error: Some(error), ..Progress::default() }, None);
    }

    /// Starts `work` on a thread; `Err` with the running job's progress when one runs.
    pub fn start(self: &Arc<Self>, from: &str, work: Work) -> Result<Progress, Progress> {
        {
            let mut g = self.lock();
            if g.0.running {
                drop(g);
                return Err(self.progress());
            }
            *g = (Progress { running: true, from: from.into(), ..Progress::default() }, Some(Instant::now()));
        }
        let job = self.clone();
        std::thread::Builder::new()
            .name("prewarm".into())
            .spawn(move || {
                let r = work(&mut |p: &Progress| {
                    let mut g = job.lock();
                    let from = std::mem::take(&mut g.0.from);
                    g.0 = Progress { running: true, from, ..p.clone() };
                });
                let mut g = job.lock();
                g.0.running = false;
                g.0.elapsed_s = g.1.map_or(0.0, |t| t.elapsed().as_secs_f64());
                match r {
                    Err(e) => {
                        tracing::error!(%e, "prewarm stopped");
                        g.0.error = Some(e);
                    }
                    Ok(()) => tracing::info!(
                        loaded = g.0.loaded_blocks,
                        skipped = g.0.skipped_blocks,
                        seconds = g.0.elapsed_s,
                        "prewarm done"
                    ),
                }
            })
            .expect("spawning the prewarm thread");
        Ok(self.progress())
    }
}
