//! The engine under the data path's lock: pumping its ops to the device threads and the
//! io_uring thread, its commits to the committer and its events to the waiting clients
//! (`pump`); entering a client request, and a client thread running its own request's
//! cache-store ops or waiting for its reply (`enter`, `run`, `help_or_wait`).

use super::*;

impl Shared {
    pub(super) fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves the engine's ready ops to the device queue, its events to the waiting
    /// clients (and the policy hook), and its next commit to the committer; wakes whoever
    /// has something to do.
    pub(super) fn pump(&self, core: &mut Core) {
        let (mut queued, mut queued_ssd) = (0usize, 0usize);
        loop {
            while let Some(op) = core.engine.poll_op() {
                if op.loc == cachevisor_engine::Location::Ram {
                    self.run_ram_op(core, op); // memory: at once, here (`ram_memory.rs`)
                    continue;
                }
                let data = if !op.kind.is_write() {
                    None
                } else if op.staged {
                    // A staged write's source read is an op of the same request or job.
                    op.source_id().and_then(|s| core.bufs.get(&op.req)?.get(&s)).cloned()
                } else {
                    core.waiting.get(&op.req).and_then(|w| w.write.clone())
                };
                let sum = match op.kind {
                    cachevisor_engine::OpKind::SsdWrite if op.client => SumAction::Set,
                    cachevisor_engine::OpKind::SsdWrite => {
                        let copied = op.source_id().is_some_and(|s| core.cache_sources.contains(&(op.req, s)));
                        if copied {
                            SumAction::Set
                        } else {
                            SumAction::Clear
                        }
                    }
                    _ => SumAction::None,
                };
                if core.waiting.contains_key(&op.req) {
                    core.work.push_back(Work { op, data, sum });
                } else {
                    core.background.push_back(Work { op, data, sum });
                }
                queued += 1;
                let on_file = self.local_only(&op);
                queued_ssd += on_file as usize;
                self.exec.queued(on_file);
            }
            let Some(ev) = core.engine.poll_event() else { break };
            match ev {
                Event::Reply { req, result, blocks } => {
                    let Some(w) = core.waiting.get(&req) else { continue };
                    stats::count_reply(&mut core.stats, w.vm, w.kind, w.len, &blocks);
                    if result.is_err() {
                        self.count_errors(core);
                    }
                    let w = core.waiting.get_mut(&req).expect("waiting");
                    if w.callback.is_some() {
                        let w = core.waiting.remove(&req).expect("waiting");
                        let f = w.callback.expect("a callback");
                        core.callbacks.push((f, result.map(|()| w.reads)));
                    } else {
                        w.done = Some(result);
                        if let Some(cv) = &w.waiter {
                            cv.notify_one();
                        }
                    }
                }
                Event::Retired { req, failed } => {
                    core.bufs.remove(&req);
                    if !core.cache_sources.is_empty() {
                        core.cache_sources.retain(|&(r, _)| r != req);
                    }
                    if failed {
                        self.count_errors(core);
                    }
                    if let Some(j) = core.jobs.get_mut(&req) {
                        j.failed = Some(failed);
                        j.cv.notify_all();
                    }
                }
                Event::Interval { .. } => Self::interval(core),
                Event::Sample { k, of, .. } => {
                    if let Some(mut hook) = core.on_sample.take() {
                        hook(&core.engine, k, of);
                        core.on_sample = Some(hook);
                    }
                }
            }
        }
        if !core.committing {
            if let Some(c) = core.engine.poll_commit() {
                core.commit = Some(c);
                core.committing = true;
                self.commit_cv.notify_one();
            }
        }
        // One device thread per queued op, not every thread on every change (on a small
        // machine a herd of wakeups costs more than the I/O).
        if !core.quiet {
            self.exec.wake(&self.wake, queued_ssd, queued, core.work.len() + core.background.len());
        }
    }

    /// The end of a controller interval: the policy hook runs, the trace recording's
    /// buffered lines are written (so it can be followed).
    pub(super) fn interval(core: &mut Core) {
        if let Some(mut hook) = core.on_interval.take() {
            hook(&mut core.engine);
            core.on_interval = Some(hook);
        }
        if let Some(w) = core.recorder.as_mut() {
            let _ = w.flush();
        }
    }

    /// Submits a client request (a flush when `req` is `None`) to the engine and queues
    /// what it can start; `Err` when the vDisk or the data path is no longer served.
    #[allow(clippy::too_many_arguments)] // the request and its parts, as the engine takes them
    pub(super) fn enter(
        &self,
        core: &mut Core,
        kind: Kind,
        req: Request,
        write: Option<Bytes>,
        sync: bool,
        callback: Option<Done>,
        waiter: Option<Arc<Condvar>>,
    ) -> Result<ReqId, (Failure, Option<Done>)> {
        let vm = req.vm;
        if self.halted.load(Relaxed) || (kind != Kind::Flush && core.removed.get(vm as usize) != Some(&false)) {
            return Err((Failure::Shutdown, callback));
        }
        let now = self.now();
        let req = Request { time_ns: now, ..req };
        let id = match kind {
            Kind::Read | Kind::Write => {
                if let Some(f) = core.observe.as_mut() {
                    f(&req);
                }
                if let Some(w) = core.recorder.as_mut() {
                    if let Err(e) = w.write(&req, &core.names[vm as usize]) {
                        tracing::error!(%e, "trace recording failed: stopped");
                        core.recorder = None;
                    }
                }
                core.engine.submit_with(now, &req, sync)
            }
            Kind::Flush => core.engine.submit_flush(),
            Kind::Discard => core.engine.submit_discard(now, vm, req.offset, req.len),
        };
        let len = req.len as u64;
        core.waiting.insert(id, Waiting { vm, kind, len, done: None, write, reads: Vec::new(), callback, waiter });
        self.pump(core);
        Ok(id)
    }

    /// Submits a request and waits for its reply; returns the bytes its client reads
    /// returned.
    pub(super) fn run(&self, kind: Kind, req: Request, write: Option<Bytes>) -> Result<Vec<Bytes>, Failure> {
        let mut core = self.lock();
        let cv = Arc::new(Condvar::new());
        // Entered quietly: this thread runs the request's first ops itself, so waking the
        // io_uring thread or a device thread for them (an eventfd write and a context
        // switch per hit, measured in `bench datapath`) would find nothing to do. What
        // it leaves queued is woken for once its own run is taken.
        core.quiet = true;
        let entered = self.enter(&mut core, kind, req, write, false, None, Some(cv.clone()));
        core.quiet = false;
        let id = entered.map_err(|(f, _)| f)?;
        let own = self.pop_run(&mut core, false, Some(devices::Own { req: id, ssd_only: false }));
        self.exec.wake_for_left(&self.wake, core.work.len() + core.background.len());
        if let Some(run) = own {
            core = self.run_here(core, run);
        }
        loop {
            if let Some(result) = core.waiting.get(&id).and_then(|w| w.done) {
                let w = core.waiting.remove(&id).expect("waiting");
                self.unlock(core);
                return result.map(|()| w.reads);
            }
            core = self.help_or_wait(core, &cv, Some(devices::Own { req: id, ssd_only: false }));
        }
    }

    /// While waiting on `cv`: runs queued ops on this thread rather than waiting for a
    /// device thread (no hand-off on the common path), delivers pending callbacks, or
    /// sleeps until woken.
    pub(super) fn help_or_wait<'a>(
        &'a self,
        mut core: MutexGuard<'a, Core>,
        cv: &Condvar,
        own: Option<devices::Own>,
    ) -> MutexGuard<'a, Core> {
        if let Some(run) = self.pop_run(&mut core, false, own) {
            return self.run_here(core, run);
        }
        if !core.callbacks.is_empty() {
            self.unlock(core);
            return self.lock();
        }
        cv.wait_timeout(core, Duration::from_millis(50)).map_or_else(|p| p.into_inner().0, |g| g.0)
    }

    /// [`Self::help_or_wait`] for a waiter nobody notifies: sleeps 1 ms at most.
    pub(super) fn help_or_wait_briefly<'a>(&'a self, core: MutexGuard<'a, Core>, cv: &Condvar) -> MutexGuard<'a, Core> {
        if !core.work.is_empty() || !core.callbacks.is_empty() {
            return self.help_or_wait(core, cv, None);
        }
        cv.wait_timeout(core, Duration::from_millis(1)).map_or_else(|p| p.into_inner().0, |g| g.0)
    }

    /// Runs request `req`'s queued ops on the cache store on this thread until none of
    /// them is left; backing store ops (which may be slow: an NBD reader running a slow
    /// miss itself would read no further request meanwhile) and other requests' ops are
    /// left to the device threads.
    pub(super) fn run_own_locked<'a>(&'a self, mut core: MutexGuard<'a, Core>, req: ReqId) -> MutexGuard<'a, Core> {
        while let Some(run) = self.pop_run(&mut core, false, Some(devices::Own { req, ssd_only: true })) {
            core = self.run_here(core, run);
        }
        core
    }

    /// Runs `run` (ops this thread popped) on this thread with the lock released, then
    /// completes them under it.
    fn run_here<'a>(&'a self, core: MutexGuard<'a, Core>, run: Vec<crate::Work>) -> MutexGuard<'a, Core> {
        self.unlock(core);
        let (results, ticket) = self.execute_run(&run);
        let mut core = self.lock();
        self.finish_run(&mut core, run, results, ticket);
        core
    }

    /// Releases the lock, then delivers the replies of asynchronous submissions.
    pub(super) fn unlock(&self, mut core: MutexGuard<'_, Core>) {
        let callbacks = std::mem::take(&mut core.callbacks);
        drop(core);
        for (f, r) in callbacks {
            f(r.map_err(super::client_error));
        }
    }
}
