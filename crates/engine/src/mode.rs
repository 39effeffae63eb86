//! Each request's effective mode, decided in one place, and the write handlers it picks,
//! built from each other as OCF's cache-mode engines are.
//!
//! [`Engine::decide_mode`] reads everything that can change how a request is served — the
//! VM's write policy, its sequential cutoff, pass-through after device errors
//! ([`Engine::set_bypass`], [`Engine::set_error_threshold`]), a driver's no-insert access,
//! a target of 0, and whether the write covers whole sectors — once per request. Per
//! block only what depends on the block is left: whether it is cached, and persistent
//! mode's relocation of a whole clean block (`block_ops.rs`), and whether a durable free
//! slot is left (`slot_alloc.rs`: none means the block bypasses).
//!
//! The write handlers: a **pass-through** write goes to the backing store only; an
//! **invalidating** write is a pass-through that first drops the cached copy of the
//! sectors it writes (their dirty sectors written back before it when needed); a
//! **write-through** write updates the cached copy and the backing store (a miss takes a
//! slot when the mode inserts — write-around is write-through whose misses do not); a
//! **write-back** write updates the cached copy only, dirty.

use crate::config::{PartitionMode, SECTOR};
use crate::engine::Engine;
use crate::write_policy::WritePolicy;
use cachevisor_trace::{Request, VmId};

/// How one request is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mode {
    /// A miss may take a slot (not past the sequential cutoff, not passing through, not
    /// a no-insert access, a static VM's target above 0).
    pub(crate) insert: bool,
    /// What a write does.
    pub(crate) write: WriteMode,
}

impl Default for Mode {
    fn default() -> Mode {
        Mode::FILL
    }
}

impl Mode {
    /// Before any request: misses take slots, writes by write-back (a prewarm's loads
    /// and other jobs run with it).
    pub(crate) const FILL: Mode = Mode { insert: true, write: WriteMode::Back };
}

/// What a write does (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteMode {
    /// Into the cache only, dirty (write-back); a miss takes a slot when the mode inserts,
    /// else passes through.
    Back,
    /// Into the cache and the backing store (write-through); a miss takes a slot when
    /// `allocate` and the mode inserts (write-around: never), else passes through.
    Through {
        /// Whether a miss may take a slot (false: write-around).
        allocate: bool,
    },
    /// To the backing store, dropping the cached copy of the sectors written; their dirty
    /// sectors written back first when `write_back` (read-only/write-invalidate, and a
    /// write not covering whole sectors, which always writes back: the rest of a sector
    /// is not the write's).
    Invalidate {
        /// Write the covered dirty sectors back before the write.
        write_back: bool,
    },
}

impl Engine {
    /// Decides `req`'s mode (once per request: the sequential cutoff's run detector
    /// advances).
    pub(crate) fn decide_mode(&mut self, req: &Request) -> Mode {
        let vm = req.vm;
        let static_target_0 = self.cfg.partition == PartitionMode::Static && self.vms[vm as usize].target == 0;
        let p = &mut self.vms[vm as usize];
        let sequential = p.seq.bypass(req.offset, req.len as u64);
        let insert = !(sequential || p.bypass || self.req.force_no_insert || static_target_0);
        let whole_sectors = (req.offset | req.len as u64).is_multiple_of(SECTOR);
        let write =
            if !whole_sectors { WriteMode::Invalidate { write_back: true } } else { self.policy_write_mode(vm) };
        Mode { insert, write }
    }

    /// The write mode of `vm`'s write policy (for writes of whole sectors). Read-only
    /// writes back the dirty sectors it overwrites only in persistent mode: their bytes
    /// are superseded, but the journal must not call them invalid before the write has
    /// landed (`block_ops.rs`, `drop_cached_for_write`).
    fn policy_write_mode(&self, vm: VmId) -> WriteMode {
        match self.vms[vm as usize].write_policy {
            WritePolicy::Wb => WriteMode::Back,
            WritePolicy::Wt => WriteMode::Through { allocate: true },
            WritePolicy::Wa => WriteMode::Through { allocate: false },
            WritePolicy::Ro => WriteMode::Invalidate { write_back: self.dur.on() },
        }
    }

    /// Passes `vm` through once its device errors reach `errors` (`u64::MAX`, the
    /// default: never): checked as ops complete ([`Self::set_bypass`]).
    pub fn set_error_threshold(&mut self, errors: u64) {
        self.flight.set_error_threshold(errors);
    }

    /// The device errors at which a VM passes through (`None`: never).
    pub fn error_threshold(&self) -> Option<u64> {
        self.flight.error_threshold()
    }

    /// Whether `vm` passes through ([`Self::set_bypass`], or its errors reached the
    /// threshold).
    pub fn bypassed(&self, vm: VmId) -> bool {
        self.vms.get(vm as usize).is_some_and(|p| p.bypass)
    }

    /// Why `vm` passes through, if it does: its device errors reached the threshold
    /// (its dirty blocks are drained to the backing store, then its cache released:
    /// `cachevisor_policy::controller::PassThroughDrain`), or a driver said so (a cache
    /// detached: the driver empties the cache its own way).
    pub fn bypass_cause(&self, vm: VmId) -> Option<BypassCause> {
        let p = self.vms.get(vm as usize).filter(|p| p.bypass)?;
        Some(if p.bypass_errors { BypassCause::DeviceErrors } else { BypassCause::Driver })
    }

    /// Counts a device error of `vm`'s; at the threshold, `vm` passes through.
    pub(crate) fn count_device_error(&mut self, vm: VmId) {
        if self.flight.count_error(vm) {
            if !self.bypassed(vm) {
                self.set_bypass(vm, true);
            }
            self.vms[vm as usize].bypass_errors = true;
        }
    }
}

/// Why a VM passes through ([`Engine::bypass_cause`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum BypassCause {
    /// Its device errors reached the threshold ([`Engine::set_error_threshold`]).
    DeviceErrors,
    /// A driver turned it on ([`Engine::set_bypass`]: a cache detached).
    Driver,
}

#[cfg(test)]
mod tests {
    use crate::config::EngineConfig;
    use crate::output::{OpKind, Output};
    use crate::write_policy::WritePolicy;
    use crate::{Engine, Failure};
    use cachevisor_trace::{Op, Request};

    fn engine(policy: WritePolicy) -> Engine {
        let mut e = Engine::new(EngineConfig { write_policy: policy, ..EngineConfig::with_slots(8) }).unwrap();
        e.set_target(0, 8, &mut Output::default());
        e
    }

    fn req(op: Op, offset: u64, len: u32) -> Request {
        Request { time_ns: 0, vm: 0, op, offset, len }
    }

    /// The ops' kinds of one access.
    fn kinds(e: &mut Engine, r: Request) -> Vec<OpKind> {
        let mut out = Output::default();
        e.access(0, &r, &mut out);
        out.ops.iter().map(|o| o.kind).collect()
    }

    use OpKind::*;

    #[test]
    fn each_write_handler_does_its_own_ops() {
        // Write-back: a miss takes a slot, the cache alone is written, dirty.
        let mut e = engine(WritePolicy::Wb);
        assert_eq!(kinds(&mut e, req(Op::Write, 0, 4096)), [SsdWrite]);
        assert_eq!(e.partition(0).dirty_blocks, 1);
        // Write-through: a miss takes a slot, both written, clean.
        let mut e = engine(WritePolicy::Wt);
        assert_eq!(kinds(&mut e, req(Op::Write, 0, 4096)), [SsdWrite, BackingWrite]);
        assert_eq!((e.partition(0).used, e.partition(0).dirty_blocks), (1, 0));
        // Write-around: a miss passes through; a hit updates both copies.
        let mut e = engine(WritePolicy::Wa);
        assert_eq!(kinds(&mut e, req(Op::Write, 0, 4096)), [BackingWrite]);
        assert_eq!(e.partition(0).used, 0);
        kinds(&mut e, req(Op::Read, 0, 4096));
        assert_eq!(kinds(&mut e, req(Op::Write, 0, 4096)), [SsdWrite, BackingWrite]);
        // Read-only (write-invalidate): the backing store alone, the cached copy dropped.
        let mut e = engine(WritePolicy::Ro);
        kinds(&mut e, req(Op::Read, 0, 4096));
        assert_eq!(kinds(&mut e, req(Op::Write, 0, 4096)), [BackingWrite]);
        assert_eq!(e.partition(0).used, 0);
    }

    #[test]
    fn a_write_of_part_of_a_sector_invalidates_after_writing_dirty_sectors_back() {
        let mut e = engine(WritePolicy::Wb);
        kinds(&mut e, req(Op::Write, 0, 4096));
        // Bytes 100..200 of a dirty cached block: its dirty sector goes back first (cache
        // read, backing write), then the write, and the sector is no longer cached.
        assert_eq!(kinds(&mut e, req(Op::Write, 100, 100)), [SsdRead, BackingWrite, BackingWrite]);
        assert!(!e.holds(0, 0, (0, 1)) && e.holds(0, 0, (1, 8)));
    }

    #[test]
    fn what_stops_inserting_stops_it_for_every_policy() {
        for policy in [WritePolicy::Wb, WritePolicy::Wt] {
            // A target of 0.
            let mut e = Engine::new(EngineConfig { write_policy: policy, ..EngineConfig::with_slots(8) }).unwrap();
            assert_eq!(kinds(&mut e, req(Op::Write, 0, 4096)), [BackingWrite], "{policy:?}: target 0");
            assert_eq!(kinds(&mut e, req(Op::Read, 0, 4096)), [BackingRead]);
            // Past the sequential cutoff.
            let mut e = engine(policy);
            e.set_sequential_cutoff(0, 8192);
            kinds(&mut e, req(Op::Read, 0, 8192));
            assert_eq!(kinds(&mut e, req(Op::Read, 8192, 4096)), [BackingRead], "{policy:?}: cutoff");
            // A no-insert access.
            let mut e = engine(policy);
            let mut out = Output::default();
            e.access_no_insert(0, &req(Op::Read, 0, 4096), &mut out);
            assert_eq!(out.ops.iter().map(|o| o.kind).collect::<Vec<_>>(), [BackingRead]);
        }
    }

    #[test]
    fn the_error_threshold_turns_pass_through_on_in_the_engine() {
        let mut e = engine(WritePolicy::Wb);
        e.set_error_threshold(2);
        for i in 0..2u64 {
            assert!(!e.bypassed(0));
            let id = e.submit(0, &req(Op::Read, i * 4096, 4096));
            while let Some(op) = e.poll_op() {
                let fail = op.kind == BackingRead;
                e.handle_completion(0, op.handle(), if fail { Err(Failure::Io) } else { Ok(()) });
            }
            while e.poll_event().is_some() {}
            let _ = id;
        }
        assert!(e.bypassed(0) && e.device_errors(0) == 2);
        assert_eq!(e.bypass_cause(0), Some(super::BypassCause::DeviceErrors));
        // Passing through: writes go around the cache, misses take no slots.
        assert_eq!(kinds(&mut e, req(Op::Write, 8 * 4096, 4096)), [BackingWrite]);
        assert_eq!(e.partition(0).write_policy, WritePolicy::Ro);
        // A driver's bypass on top keeps the cause; ending it ends both.
        e.set_bypass(0, true);
        assert_eq!(e.bypass_cause(0), Some(super::BypassCause::DeviceErrors));
        e.set_bypass(0, false);
        assert_eq!(e.bypass_cause(0), None);
        e.set_bypass(0, true);
        assert_eq!(e.bypass_cause(0), Some(super::BypassCause::Driver), "a detached cache's bypass");
    }
}
