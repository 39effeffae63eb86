//! One of the host's cache devices failing while the others work. With one device, a
//! vDisk whose device errors reach the threshold passes through (`mode.rs`). With
//! several, the errors of an op on a cache device count against that *device*: at the
//! threshold (`Engine::set_error_threshold`) the device is dropped and the vDisks keep
//! their cache on the others —
//! - it takes no new block (its cap is 0: `device_placement.rs` passes it over);
//! - its clean blocks are forgotten at once (the backing store has them; a block with
//!   ops in flight leaves as those ops fail, the repair dropping its clean sectors), so a
//!   request that failed on one and is tried again (the daemon retries an EIO) reads the
//!   backing store;
//! - its dirty blocks — their only copy was there — are kept and count as poisoned
//!   (`seals.rs`; derived, not recorded, so a repair putting one back keeps it so):
//!   never written back (garbage or nothing would replace the backing store's older
//!   bytes), never a victim, and a read of one fails (EIO), so no client is served stale
//!   data as if it were its last write. The metadata keeps them: a restart with the
//!   device back (its label intact) serves them, one without it refuses, naming the
//!   vDisks (`server/src/daemon/cache_devices.rs`). Mirrored dirty data, which would lose
//!   nothing here, is the next step.
//!
//! When the failing device is the last one working, its errors count against the vDisks
//! as with one device (they pass through). Sans-IO: the driver reports op failures as
//! usual; the engine decides, and a driver takes the losses to report them
//! ([`Engine::take_device_losses`]).

use crate::engine::Engine;
use crate::slot_table::pack_key;
use crate::stores::StoreId;
use cachevisor_trace::VmId;

/// What dropping a failed cache device lost: its store, the clean blocks forgotten, and
/// per vDisk the dirty blocks only it held (kept, unreadable).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeviceLoss {
    /// The device's store (0: `[cache] path`; `i`: the `i`-th `[[cache.device]]`).
    pub store: StoreId,
    /// Clean blocks forgotten.
    pub clean_blocks: u64,
    /// `(vm, blocks)`: dirty blocks whose only copy was on the device.
    pub dirty_blocks: Vec<(VmId, u64)>,
    /// `(vm, blocks)`: dirty blocks on the device served from their mirror on another
    /// (`dirty_mirror.rs`): nothing lost.
    pub mirrored_blocks: Vec<(VmId, u64)>,
}

/// One more block of `vm` in a per-vDisk count (`DeviceLoss`'s lists).
pub(crate) fn count_block(list: &mut Vec<(VmId, u64)>, vm: VmId) {
    match list.iter_mut().find(|(v, _)| *v == vm) {
        Some((_, n)) => *n += 1,
        None => list.push((vm, 1)),
    }
}

/// Each local device's error count and whether it was dropped.
#[derive(Debug, Clone, Default)]
pub(crate) struct DeviceHealth {
    errors: Vec<u64>,
    failed: Vec<bool>,
    /// Whether any was (one branch on the hot path when none).
    any_failed: bool,
    /// Losses not yet taken by the driver.
    losses: Vec<DeviceLoss>,
}

impl DeviceHealth {
    fn grow(&mut self, st: StoreId) {
        let n = st as usize + 1;
        if self.errors.len() < n {
            self.errors.resize(n, 0);
            self.failed.resize(n, false);
        }
    }

    /// Whether store `st` was dropped.
    #[inline]
    pub(crate) fn failed(&self, st: StoreId) -> bool {
        self.failed.get(st as usize).copied().unwrap_or(false)
    }
}

impl Engine {
    /// An op on cache store `st` failed with a device error: counted against the device
    /// when it is one of several local devices and another still works (then dropped at
    /// the threshold); returns whether it was (else it counts against the vDisk).
    pub(crate) fn count_device_store_error(&mut self, st: StoreId) -> bool {
        if !self.stores.several_devices() || !self.stores.layout().kind(st).is_local() {
            return false;
        }
        let others = self.stores.local_ids().any(|o| o != st && !self.health.failed(o));
        if !others {
            return false; // the last device working: the vDisks pass through
        }
        self.health.grow(st);
        if self.health.failed(st) {
            return true; // dropped already: its ops fail as they drain
        }
        self.health.errors[st as usize] += 1;
        if self.flight.error_threshold().is_some_and(|t| self.health.errors[st as usize] >= t) {
            let loss = self.fail_device(st);
            self.health.losses.push(loss);
        }
        true
    }

    /// Drops local cache device `st` (see the module doc); returns what that lost.
    /// A driver may call it for a device it knows is gone.
    pub fn fail_device(&mut self, st: StoreId) -> DeviceLoss {
        self.health.grow(st);
        self.health.failed[st as usize] = true;
        self.health.any_failed = true;
        self.set_store_limit(st, 0);
        let (first, n) = self.stores.layout().range(st);
        // Mirrors first: dirty blocks here with a copy elsewhere move to it.
        let mirrored_blocks = if self.mirrors.len() > 0 { self.mirrors_after_drop(st) } else { Vec::new() };
        let mut loss = DeviceLoss { store: st, clean_blocks: 0, dirty_blocks: Vec::new(), mirrored_blocks };
        for slot in first as u32..(first + n) as u32 {
            let Some((vm, block)) = self.slot_block(slot) else { continue };
            if self.slot_dirty(slot) && self.has_working_mirror(slot) {
                continue; // promoted once its ops drain
            }
            if self.slot_dirty(slot) {
                count_block(&mut loss.dirty_blocks, vm);
                continue;
            }
            let held = self.flight.pinned(slot) || self.flight.holds_block(pack_key(vm, block));
            if !held && self.discard(vm, block, (0, self.spb)) {
                loss.clean_blocks += 1;
                self.mirror_block_idle(pack_key(vm, block));
            }
        }
        loss
    }

    /// Empties local device `st` whose bytes are gone (emptied or replaced while a driver
    /// was down), the device kept in use: its dirty blocks with a mirror on another device
    /// move to it (`dirty_mirror.rs`), its mirrors go (their blocks written back first),
    /// and every other block on it is dropped — dirty ones too (the caller decided they
    /// may go). Returns what that did.
    pub fn empty_device(&mut self, st: StoreId) -> DeviceLoss {
        let mirrored_blocks = if self.mirrors.len() > 0 { self.mirrors_after_drop(st) } else { Vec::new() };
        let mut loss = DeviceLoss { store: st, clean_blocks: 0, dirty_blocks: Vec::new(), mirrored_blocks };
        let (first, n) = self.stores.layout().range(st);
        for slot in first as u32..(first + n) as u32 {
            let Some((vm, _)) = self.slot_block(slot) else { continue };
            if self.slot_dirty(slot) {
                count_block(&mut loss.dirty_blocks, vm);
            } else {
                loss.clean_blocks += 1;
            }
            self.release_slot(slot);
        }
        loss
    }

    /// Whether slot `s` holds dirty sectors on a dropped device (their only copy, which
    /// nothing can read): poisoned, as `seals.rs` calls it.
    #[inline]
    pub(crate) fn lost_on_failed_device(&self, s: u32) -> bool {
        self.health.any_failed
            && self.health.failed(self.store_of(s))
            && self.slot_dirty(s)
            && !self.has_working_mirror(s)
    }

    /// Whether local cache device `st` was dropped.
    pub fn device_failed(&self, st: StoreId) -> bool {
        self.health.failed(st)
    }

    /// The devices dropped since the last call, with what each lost (for the driver's log
    /// and metrics).
    pub fn take_device_losses(&mut self) -> Vec<DeviceLoss> {
        std::mem::take(&mut self.health.losses)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::config::{EngineConfig, PartitionMode};
    use crate::inflight::{Event, Failure};
    use crate::output::{Location, OpKind};
    use crate::Engine;
    use cachevisor_trace::{Op, Request};

    pub(crate) fn req(op: Op, block: u64) -> Request {
        Request { time_ns: 0, vm: 0, op, offset: block * 4096, len: 4096 }
    }

    /// Runs `r` to its reply, failing every op on store `bad` (when given); its result.
    pub(crate) fn run(e: &mut Engine, r: Request, bad: Option<u16>) -> Result<(), Failure> {
        run_failing(e, r, bad, Failure::Io)
    }

    /// [`run`], the ops on `bad` failing with `f` (`Corrupt`: its reads only, as the data
    /// path checks a read's bytes).
    fn run_failing(e: &mut Engine, r: Request, bad: Option<u16>, f: Failure) -> Result<(), Failure> {
        let id = e.submit(0, &r);
        let mut reply = None;
        loop {
            let mut progressed = false;
            while let Some(op) = e.poll_op() {
                progressed = true;
                let fail = bad.is_some_and(|b| op.loc == Location::Cache(b))
                    && (f != Failure::Corrupt || op.kind == OpKind::SsdRead);
                e.handle_completion(0, op.handle(), if fail { Err(f) } else { Ok(()) });
            }
            while let Some(ev) = e.poll_event() {
                progressed = true;
                if let Event::Reply { req, result, .. } = ev {
                    if req == id {
                        reply = Some(result);
                    }
                }
            }
            if !progressed {
                return reply.expect("a reply");
            }
        }
    }

    /// Two devices of 8 slots; blocks 0..16 read (clean) and, with `wb`, 16..20 written.
    fn two_devices(wb: bool) -> Engine {
        let cfg =
            EngineConfig { partition: PartitionMode::Shared, ..EngineConfig::with_slots(1) }.over_devices(&[8, 8]);
        let mut e = Engine::new(cfg).unwrap();
        e.set_error_threshold(3);
        for b in 0..12 {
            run(&mut e, req(Op::Read, b), None).unwrap();
        }
        if wb {
            for b in 12..16 {
                run(&mut e, req(Op::Write, b), None).unwrap();
            }
        }
        e
    }

    #[test]
    fn a_failing_device_is_dropped_and_the_vdisk_keeps_its_cache_on_the_other() {
        let mut e = two_devices(false);
        let on1: Vec<u64> = (0..12).filter(|&b| e.lookup(0, b).is_some_and(|s| e.layout().store_of(s) == 1)).collect();
        assert_eq!(on1.len(), 6, "placed in turn");
        // Reads of blocks on device 1 fail: each drops its clean block; the retry (the
        // daemon's) reads the backing store.
        // (A retry before the drop fills the block into its slot there again: that
        // write fails too, and counts.)
        let mut failed = 0;
        for &b in &on1 {
            if e.device_failed(1) {
                break;
            }
            failed += u32::from(run(&mut e, req(Op::Read, b), Some(1)) == Err(Failure::Io));
            assert_eq!(run(&mut e, req(Op::Read, b), Some(1)), Ok(()), "tried again: from the backing store");
        }
        assert!(e.device_failed(1) && failed == 2, "3 errors (2 reads, a fill): the threshold; {failed} reads failed");
        assert!(!e.bypassed(0), "the vDisk keeps its cache");
        let losses = e.take_device_losses();
        assert_eq!(losses.len(), 1);
        assert_eq!((losses[0].store, losses[0].dirty_blocks.len()), (1, 0));
        assert_eq!(e.store_used(1), 0, "its clean blocks are forgotten");
        // New blocks land on device 0 only; hits there keep working.
        for b in 100..120 {
            run(&mut e, req(Op::Read, b), Some(1)).unwrap();
            assert!(e.lookup(0, b).is_none_or(|s| e.layout().store_of(s) == 0));
        }
        assert_eq!(e.store_used(1), 0);
        e.check_invariants().unwrap();
    }

    #[test]
    fn a_device_returning_garbage_is_dropped_and_the_vdisk_not_sent_through() {
        let mut e = two_devices(false);
        let on1: Vec<u64> = (0..12).filter(|&b| e.lookup(0, b).is_some_and(|s| e.layout().store_of(s) == 1)).collect();
        // Every read there fails its checksum: the block is dropped (clean), the retry
        // fills it from the backing store, and three such reads are the threshold.
        for &b in &on1[..3] {
            assert!(!e.device_failed(1));
            assert_eq!(run_failing(&mut e, req(Op::Read, b), Some(1), Failure::Corrupt), Err(Failure::Corrupt));
            assert_eq!(run(&mut e, req(Op::Read, b), None), Ok(()), "tried again: from the backing store");
        }
        assert!(e.device_failed(1), "three bad reads: dropped");
        assert!(!e.bypassed(0), "not the vDisk's error");
        assert_eq!(e.store_used(1), 0);
        e.check_invariants().unwrap();
    }

    #[test]
    fn a_device_withheld_whole_moves_its_clean_blocks_writes_back_its_dirty_ones_and_takes_no_more() {
        // Two devices of 8: blocks 0..6 read, 6..8 written (4 on each, placed in turn).
        let cfg =
            EngineConfig { partition: PartitionMode::Shared, ..EngineConfig::with_slots(1) }.over_devices(&[8, 8]);
        let mut e = Engine::new(cfg).unwrap();
        for b in 0..8 {
            run(&mut e, req(if b < 6 { Op::Read } else { Op::Write }, b), None).unwrap();
        }
        let (first, n) = e.layout().range(1);
        let on1 = |e: &Engine| (0..8).filter(|&b| e.lookup(0, b).is_some_and(|s| e.layout().store_of(s) == 1)).count();
        assert_eq!((on1(&e), e.store_used(0), e.partition(0).dirty_blocks), (4, 4, 2));
        let mut out = crate::Output::default();
        let moved = e.withhold_moving(first as u32, n as u32, &mut out).unwrap();
        assert!(moved > 0, "blocks moved into device 0's free slots");
        // (Outside persistent mode a dirty block moves too; in it, it is written back.)
        let mut written_back = 0;
        loop {
            for op in out.ops.drain(..) {
                written_back += u32::from(op.kind == OpKind::BackingWrite);
                e.handle_completion(0, op.handle(), Ok(()));
            }
            while e.poll_event().is_some() {}
            if e.withhold_step(&mut out) == 0 && out.ops.is_empty() {
                break;
            }
        }
        assert!(e.withheld_ready(first as u32, n as u32));
        assert_eq!((on1(&e), e.store_used(1)), (0, 0));
        assert_eq!(e.partition(0).dirty_blocks + u64::from(written_back), 2, "nothing dirty dropped unwritten");
        assert_eq!(
            (0..8).filter(|&b| e.lookup(0, b).is_some()).count() as u32 + written_back,
            8,
            "kept or written back"
        );
        // New blocks land on device 0 only.
        for b in 100..120 {
            run(&mut e, req(Op::Read, b), None).unwrap();
            assert!(e.lookup(0, b).is_none_or(|s| e.layout().store_of(s) == 0));
        }
        assert_eq!(e.store_used(1), 0);
        e.check_invariants().unwrap();
    }

    #[test]
    fn a_dirty_block_on_a_dropped_device_is_kept_unreadable_and_never_written_back() {
        let mut e = two_devices(true);
        let dirty1: Vec<u64> =
            (12..16).filter(|&b| e.lookup(0, b).is_some_and(|s| e.layout().store_of(s) == 1)).collect();
        assert!(!dirty1.is_empty());
        let clean: u64 =
            (0..12).filter(|&b| e.lookup(0, b).is_some_and(|s| e.layout().store_of(s) == 1)).count() as u64;
        let loss = e.fail_device(1);
        assert_eq!((loss.clean_blocks, loss.dirty_blocks.clone()), (clean, vec![(0, dirty1.len() as u64)]));
        for &b in &dirty1 {
            // Still cached and dirty, unreadable (its device fails every op), not a victim.
            assert!(e.lookup(0, b).is_some());
            assert_eq!(run(&mut e, req(Op::Read, b), Some(1)), Err(Failure::Io));
            let mut out = crate::Output::default();
            assert_eq!(e.destage_block(0, b, &mut out), 0, "no write-back of a lost block");
            assert!(!out.ops.iter().any(|o| o.kind == OpKind::BackingWrite));
        }
        assert!(!e.bypassed(0));
        e.check_invariants().unwrap();
    }

    #[test]
    fn with_one_device_left_working_errors_send_the_vdisk_through() {
        let mut e = two_devices(false);
        e.fail_device(1);
        for b in 0..12 {
            let _ = run(&mut e, req(Op::Read, b), Some(0));
        }
        assert!(!e.device_failed(0), "the last device is not dropped");
        assert!(e.bypassed(0), "its errors count against the vDisk, as with one device");
    }
}
