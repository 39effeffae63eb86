//! The drain of VMs that pass through after device errors, one piece of code for the
//! daemon and the simulator: at each interval's end a VM whose errors reached the engine's
//! threshold (`Engine::bypass_cause` says `DeviceErrors`) writes a step of its dirty
//! blocks back to its backing store — failures leave them dirty, to be tried again next
//! interval — and once nothing of it is dirty, its clean blocks leave the cache (target
//! 0). Meanwhile the allocator's decisions leave its target alone ([`crate::controller::apply`]).
//! A VM passing through because its driver said so (a detached cache) is not drained
//! here: the driver empties the cache its own way. Sans-IO: the step's commands fill an
//! `Output` the driver runs as one background job.

use cachevisor_engine::{BypassCause, Engine, Output};
use cachevisor_trace::VmId;

/// Dirty blocks a VM passing through after errors writes back per interval.
pub const DRAIN_STEP: usize = 256;

/// Where the drain's sweep of the dirty bitmap goes on.
#[derive(Debug, Clone, Default)]
pub struct PassThroughDrain {
    cursor: u32,
}

impl PassThroughDrain {
    /// Whether some VM passes through after device errors and still holds cache (a step
    /// has work to do).
    pub fn due(e: &Engine) -> bool {
        (0..e.vm_count() as VmId).any(|vm| draining(e, vm))
    }

    /// One interval's step into `out` (cleared first): each draining VM's next
    /// [`DRAIN_STEP`] dirty blocks written back (left cached clean), or, with none dirty
    /// left, its cache released. Returns the VMs whose cache this step released.
    pub fn step(&mut self, e: &mut Engine, out: &mut Output) -> Vec<VmId> {
        out.clear();
        let mut released = Vec::new();
        let mut one = Output::default();
        for vm in 0..e.vm_count() as VmId {
            if !draining(e, vm) {
                continue;
            }
            if e.partition(vm).dirty_blocks > 0 {
                for k in e.dirty_batch(Some(vm), &mut self.cursor, DRAIN_STEP) {
                    e.destage_block(vm, cachevisor_engine::slot_table::key_block(k), &mut one);
                    out.ops.append(&mut one.ops);
                }
            } else {
                e.set_target(vm, 0, &mut one);
                out.ops.append(&mut one.ops);
                released.push(vm);
            }
        }
        released
    }
}

/// Whether `vm` passes through after device errors and holds blocks.
fn draining(e: &Engine, vm: VmId) -> bool {
    e.bypass_cause(vm) == Some(BypassCause::DeviceErrors) && e.partition(vm).used > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachevisor_engine::{EngineConfig, Failure, OpKind, PartitionMode, WritePolicy};
    use cachevisor_trace::{Op, Request};

    /// A 64-slot engine, VMs 0 and 1 with 32 slots each, write-back.
    fn engine() -> Engine {
        let cfg = EngineConfig { partition: PartitionMode::Static, ..EngineConfig::with_slots(64) };
        let mut e = Engine::new(cfg).unwrap();
        let mut out = Output::default();
        for vm in 0..2 {
            e.set_write_policy(vm, WritePolicy::Wb, &mut out);
            e.set_target(vm, 32, &mut out);
        }
        e
    }

    /// Runs every op to its end, failing those `fail` picks.
    fn run(e: &mut Engine, fail: impl Fn(OpKind) -> bool) {
        while let Some(op) = e.poll_op() {
            let r = if fail(op.kind) { Err(Failure::Io) } else { Ok(()) };
            e.handle_completion(0, op.handle(), r);
        }
        while e.poll_event().is_some() {}
    }

    fn write(e: &mut Engine, vm: VmId, block: u64) {
        e.submit(0, &Request { time_ns: 0, vm, op: Op::Write, offset: block * 4096, len: 4096 });
        run(e, |_| false);
    }

    #[test]
    fn a_vm_over_its_error_threshold_is_written_back_then_released_and_no_other() {
        let mut e = engine();
        for b in 0..300 {
            write(&mut e, 0, b % 30);
            write(&mut e, 1, b % 30);
        }
        assert_eq!((e.partition(0).dirty_blocks, e.partition(1).dirty_blocks), (30, 30));
        let mut drain = PassThroughDrain::default();
        assert!(!PassThroughDrain::due(&e), "no VM passes through");
        // A read of an uncached block whose backing read fails: one error, the threshold.
        e.set_error_threshold(1);
        e.submit(0, &Request { time_ns: 0, vm: 0, op: Op::Read, offset: 40 * 4096, len: 4096 });
        run(&mut e, |k| k == OpKind::BackingRead);
        assert_eq!(e.bypass_cause(0), Some(BypassCause::DeviceErrors));
        assert!(PassThroughDrain::due(&e));
        // The allocator's decisions leave its target alone until it is drained.
        let ops = crate::controller::apply(&mut e, &crate::allocator::Decision::targets(vec![8, 32]));
        assert!(ops.ops.is_empty() && e.partition(0).target == 32, "kept: {:?}", e.partition(0));
        // A detached cache's bypass is the driver's to drain, not this.
        e.set_bypass(1, true);
        // As a driver runs it: the step as one background job.
        let (mut released, mut ops) = (Vec::new(), Vec::new());
        e.submit_job(|e, out| {
            released = drain.step(e, out);
            ops = out.ops.clone();
        });
        assert!(released.is_empty());
        assert_eq!(ops.iter().filter(|o| o.kind == OpKind::BackingWrite).count(), 30);
        assert!(ops.iter().all(|o| o.vm == 0), "only the VM over its error threshold");
        run(&mut e, |_| false);
        assert_eq!(e.partition(0).dirty_blocks, 0);
        assert_eq!(e.partition(1).dirty_blocks, 30, "the detached VM keeps its dirty blocks");
        e.submit_job(|e, out| released = drain.step(e, out));
        run(&mut e, |_| false);
        assert_eq!(released, vec![0], "nothing dirty: its cache goes");
        assert_eq!(e.partition(0).used, 0);
        assert!(!PassThroughDrain::due(&e), "drained");
    }
}
