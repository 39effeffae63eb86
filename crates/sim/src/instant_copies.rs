//! Instant Migration's bulk copies on one node (ELICA §3.6.2): for each VM the cluster
//! driver started an Instant migration for, one engine job of `batch` block moves
//! (`Engine::migrate_some`) in flight at a time, the next as soon as it retires — the
//! seed's IM copies "aggressively, without throttling"; one job at a time per VM keeps
//! the copies in the source's slot order. A VM whose call moved nothing (every misplaced
//! block busy, or no free slot where it should go) waits for the driver's next
//! [`InstantCopies::rearm`] instead of scanning its slots again on every completion.

use cachevisor_engine::{Engine, ReqId};
use cachevisor_trace::VmId;

/// One VM's bulk copy.
#[derive(Debug, Clone, Copy)]
struct Copying {
    vm: VmId,
    job: Option<ReqId>,
    armed: bool,
}

/// The bulk copies of a node.
#[derive(Debug, Clone, Default)]
pub(crate) struct InstantCopies {
    batch: u64,
    vms: Vec<Copying>,
}

impl InstantCopies {
    /// Copies of `batch` blocks per job.
    pub(crate) fn new(batch: u64) -> Self {
        InstantCopies { batch, vms: Vec::new() }
    }

    /// Starts copying `vm`'s misplaced blocks.
    pub(crate) fn start(&mut self, vm: VmId) {
        match self.vms.iter_mut().find(|c| c.vm == vm) {
            Some(c) => c.armed = true,
            None => self.vms.push(Copying { vm, job: None, armed: true }),
        }
    }

    /// Stops copying `vm`'s (its migration ended); a job in flight runs to its end.
    pub(crate) fn stop(&mut self, vm: VmId) {
        self.vms.retain(|c| c.vm != vm);
    }

    /// Lets every VM that moved nothing last time try again.
    pub(crate) fn rearm(&mut self) {
        for c in &mut self.vms {
            c.armed = true;
        }
    }

    /// A job retired: its VM may copy its next batch.
    pub(crate) fn retired(&mut self, req: ReqId) {
        if let Some(c) = self.vms.iter_mut().find(|c| c.job == Some(req)) {
            c.job = None;
        }
    }

    /// Submits the next batch of every VM with none in flight; whether any was submitted.
    pub(crate) fn issue(&mut self, engine: &mut Engine) -> bool {
        let mut any = false;
        for c in self.vms.iter_mut().filter(|c| c.armed && c.job.is_none()) {
            let batch = self.batch;
            c.job = engine.submit_job(|e, out| {
                e.migrate_some(c.vm, batch, out);
            });
            c.armed = c.job.is_some();
            any |= c.job.is_some();
        }
        any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachevisor_engine::{EngineConfig, MigrationScheme, Output, PartitionMode, StoreSpec};
    use cachevisor_trace::{Op, Request};

    #[test]
    fn one_batch_in_flight_per_vm_until_nothing_is_left() {
        let cfg = EngineConfig {
            partition: PartitionMode::Static,
            stores: vec![StoreSpec::lent(1, 16)],
            ..EngineConfig::with_slots(16)
        };
        let mut e = Engine::new(cfg).unwrap();
        e.set_target(0, 10, &mut Output::default());
        for b in 0..10 {
            let mut out = Output::default();
            e.access(0, &Request { time_ns: 0, vm: 0, op: Op::Write, offset: b * 4096, len: 4096 }, &mut out);
        }
        e.set_remote_shares(0, &[(1, 10)]).unwrap();
        e.set_migration(0, MigrationScheme::Instant);
        let mut im = InstantCopies::new(4);
        im.start(0);
        let mut jobs = 0;
        loop {
            if !im.issue(&mut e) {
                break;
            }
            jobs += 1;
            assert!(!im.issue(&mut e), "a second batch while one is in flight");
            // Run the job to its end: reads, then writes.
            while let Some(op) = e.poll_op() {
                e.handle_completion(0, op.handle(), Ok(()));
            }
            while let Some(ev) = e.poll_event() {
                if let cachevisor_engine::Event::Retired { req, .. } = ev {
                    im.retired(req);
                }
            }
        }
        assert_eq!(jobs, 3, "10 blocks in batches of 4");
        assert_eq!((e.partition(0).remote_used, e.migration_stats(0).misplaced), (10, 0));
        e.check_invariants().unwrap();
    }
}
