//! A node's prewarm loader at work: the `prewarm` crate's [`Loader`] asked for reads as
//! virtual time goes on, each read run as an engine job ([`Engine::prewarm_load`]) whose
//! ops queue on the device models like any background work, and its outcome handed back
//! when the job retires. A VM's disk counts as busy while the VM has requests in flight.

use cachevisor_engine::{Engine, PrewarmOutcome, ReqId};
use cachevisor_prewarm::{Loader, Progress, ReadOutcome, Run};
use cachevisor_trace::VmId;
use rustc_hash::FxHashMap as HashMap;

/// The loader, the VM each of its sets belongs to, and its jobs in flight.
pub(crate) struct Prewarming {
    loader: Loader,
    /// Set index → VM on this node (`None`: a set no VM here has; its runs were dropped).
    set_vm: Vec<Option<VmId>>,
    jobs: HashMap<ReqId, (Run, PrewarmOutcome)>,
}

impl Prewarming {
    /// A loader whose set `i` is VM `set_vm[i]`; runs of sets with no VM must have been
    /// left out of the loader's plan.
    pub(crate) fn new(loader: Loader, set_vm: Vec<Option<VmId>>) -> Prewarming {
        Prewarming { loader, set_vm, jobs: HashMap::default() }
    }

    /// Progress so far.
    pub(crate) fn progress(&self) -> Progress {
        self.loader.progress()
    }

    /// When the loader next wants to issue, given each VM's client requests in flight.
    pub(crate) fn due(&self, now: u64, busy: &[u32]) -> Option<u64> {
        self.loader.poll_timeout(now, |s| busy_of(&self.set_vm, s, busy))
    }

    /// Starts every read the loader allows at `now`; whether any started.
    pub(crate) fn issue(&mut self, now: u64, engine: &mut Engine, busy: &[u32]) -> bool {
        let mut any = false;
        loop {
            let set_vm = &self.set_vm;
            let Some(run) = self.loader.poll_read(now, |s| busy_of(set_vm, s, busy)) else { return any };
            any = true;
            let vm = self.set_vm[run.set as usize].expect("runs of sets with no VM are not planned");
            let mut outcome = PrewarmOutcome::default();
            match engine.submit_job(|e, out| outcome = e.prewarm_load(vm, run.first, run.len, out)) {
                Some(id) => {
                    self.jobs.insert(id, (run, outcome));
                }
                // Nothing to read (all cached, or no room): done at once.
                None => self.loader.complete(run, now, read_outcome(outcome, false)),
            }
        }
    }

    /// A job retired: if it was a prewarm read, its outcome goes back to the loader.
    pub(crate) fn retired(&mut self, now: u64, id: ReqId, failed: bool) {
        if let Some((run, outcome)) = self.jobs.remove(&id) {
            self.loader.complete(run, now, read_outcome(outcome, failed));
        }
    }
}

/// Whether set `set`'s VM has client requests in flight.
fn busy_of(set_vm: &[Option<VmId>], set: u32, busy: &[u32]) -> bool {
    set_vm[set as usize].is_some_and(|vm| busy.get(vm as usize).is_some_and(|&n| n > 0))
}

/// The engine's outcome as the loader counts it (a failed read loaded nothing).
fn read_outcome(o: PrewarmOutcome, failed: bool) -> ReadOutcome {
    ReadOutcome { loaded: if failed { 0 } else { o.loaded }, skipped: o.skipped, no_room: o.no_room }
}
