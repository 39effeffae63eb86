//! One background job at a time with progress anyone may read — what the destage and the
//! prewarm jobs share: starting refuses while one runs (and returns its progress), the
//! work updates the progress as it goes, and the end records the elapsed time and the
//! error, so the last job's result stays readable until the next starts.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// A job's progress record.
pub(crate) trait JobProgress: Clone + Default + Send + 'static {
    /// Whether the job runs.
    fn running(&self) -> bool;
    /// Marks it running or ended.
    fn set_running(&mut self, on: bool);
    /// Seconds since it started.
    fn set_elapsed(&mut self, s: f64);
    /// Why it stopped early.
    fn set_error(&mut self, e: String);
}

/// Implements [`JobProgress`] for a progress struct with `running: bool`,
/// `elapsed_s: f64` and `error: Option<String>` fields.
#[macro_export]
macro_rules! job_progress {
    ($t:ty) => {
        impl $crate::job_slot::JobProgress for $t {
            fn running(&self) -> bool {
                self.running
            }
            fn set_running(&mut self, on: bool) {
                self.running = on;
            }
            fn set_elapsed(&mut self, s: f64) {
                self.elapsed_s = s;
            }
            fn set_error(&mut self, e: String) {
                self.error = Some(e);
            }
        }
    };
}

/// The slot.
#[derive(Debug, Default)]
pub(crate) struct JobSlot<P> {
    state: Mutex<(P, Option<Instant>)>,
}

impl<P: JobProgress> JobSlot<P> {
    fn lock(&self) -> MutexGuard<'_, (P, Option<Instant>)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current (or last) job's progress, its elapsed time up to now while it runs.
    pub(crate) fn progress(&self) -> P {
        let g = self.lock();
        let mut p = g.0.clone();
        if let (true, Some(t)) = (p.running(), g.1) {
            p.set_elapsed(t.elapsed().as_secs_f64());
        }
        p
    }

    /// Records `p` as the last job's result without running anything (a job refused
    /// before it started).
    pub(crate) fn set(&self, p: P) {
        *self.lock() = (p, None);
    }

    /// Runs `work` on a thread named `name`, from the progress `initial` (marked
    /// running); `Err` with the running job's progress when one runs. `work` gets a
    /// function to update the progress; its `Err` is recorded as the job's error, and
    /// `done` is called with the final progress.
    pub(crate) fn start<W, D>(self: &Arc<Self>, name: &str, initial: P, work: W, done: D) -> Result<P, P>
    where
        W: FnOnce(&mut dyn FnMut(&mut dyn FnMut(&mut P))) -> Result<(), String> + Send + 'static,
        D: FnOnce(&P) + Send + 'static,
    {
        {
            let mut g = self.lock();
            if g.0.running() {
                drop(g);
                return Err(self.progress());
            }
            let mut p = initial;
            p.set_running(true);
            *g = (p, Some(Instant::now()));
        }
        let slot = self.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let r = work(&mut |f: &mut dyn FnMut(&mut P)| f(&mut slot.lock().0));
                let mut g = slot.lock();
                g.0.set_running(false);
                let elapsed = g.1.map_or(0.0, |t| t.elapsed().as_secs_f64());
                g.0.set_elapsed(elapsed);
                if let Err(e) = r {
                    g.0.set_error(e);
                }
                done(&g.0);
            })
            .expect("spawning a job thread");
        Ok(self.progress())
    }
}
