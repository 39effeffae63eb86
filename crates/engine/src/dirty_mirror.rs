//! Mirrored dirty data over several cache devices (`mirror_dirty`): losing one device
//! loses no acknowledged write. lvmcache does this with a RAID1 cache pool (every block
//! twice, clean ones too); here only dirty data is doubled, per block, as bcache's
//! successor plans `data_replicas` for dirty extents:
//!
//! - a write-back write of a block also goes to the block's *mirror slot* on another
//!   device, in the same phase, as a client op: the request is answered once both copies
//!   are written;
//! - a mirror slot is in no index and no replacement list: it holds the block's dirty
//!   sectors for the day its device-mate fails, nothing reads it before; its sectors are a
//!   superset of the block's dirty ones (a write-back does not shrink them);
//! - the mirror goes back to the free slots once the block is clean (or gone) and nothing
//!   is in flight on it (a failed write-back puts dirty sectors back first: `repair.rs`);
//!   it is let go when its block's last job ends (`jobs.rs`), which a write-back always is;
//! - a read of a dirty block whose bytes fail their checksum moves the block to its
//!   mirror once its ops end, instead of poisoning it (the read tried again is served
//!   from the copy);
//! - a mirror write that fails fails the request and leaves the mirror in place (its
//!   sectors under the write old or new, as the block's own slot after a failed write);
//! - a mirror slot comes from another device's free slots, else from a clean victim on
//!   another device; with neither (or in persistent mode, while that victim's slot waits in
//!   limbo), the write goes through to the backing store instead (counted:
//!   [`Engine::mirror_fallbacks`]) — never a single-copy acknowledgement;
//! - its record in the journal (`SlotRecord::mirror`) names the block and its sectors;
//!   a replay pairs it with the block's record ([`Engine::settle_restored_mirrors`]);
//! - a device dropped (`device_failure.rs`): a dirty block on it whose mirror is on a
//!   working device is *promoted* — the mirror slot becomes the block's slot with the
//!   block's dirty sectors, served from there and written back first; mirrors on the
//!   dropped device are let go and their blocks, single copies now, written back first.
//!
//! Recovery reads a mirror's sectors only where the block's own record says dirty (a
//! write around after a write-back may have left the mirror's copy older than the backing
//! store); a mirror whose block has no record at all (a commit cut after the block's free
//! record) is promoted whole: its sectors are the block's newest or, written back, the
//! backing store's own bytes.

use crate::engine::Engine;
use crate::output::{DeviceOp, Location, OpKind, Output};
use crate::sector_bits::SectorRange;
use crate::slot_table::{key_block, key_vm, pack_key, FREE_KEY};
use crate::stores::StoreId;
use cachevisor_trace::VmId;
use std::collections::HashMap;

/// The mirror slots and what they hold.
#[derive(Debug, Clone, Default)]
pub(crate) struct DirtyMirrors {
    on: bool,
    /// Block key → its mirror slot and the sectors it holds (a bit each).
    by_key: HashMap<u64, (u32, Vec<u64>)>,
    /// Mirror slot → block key.
    of_slot: HashMap<u32, u64>,
    /// Blocks left with one copy of dirty data (their mirror failed or its device was
    /// dropped): slots to write back first.
    single: Vec<u32>,
    /// Write-back writes that went through for want of a mirror slot.
    fallbacks: u64,
    /// Blocks served from their mirror after their device was dropped.
    promoted: u64,
    /// Mirror writes that failed.
    failed_writes: u64,
    /// Blocks whose own copy failed its checksum: moved to their mirror once idle.
    promote: std::collections::HashSet<u64>,
    /// Where a tie for a new block's device starts (`device_placement.rs`).
    pub(crate) next_device: crate::stores::StoreId,
    /// Mirror slots let go whose free record goes after the records of the commit it is
    /// in (`durability.rs`): the block's clean record first, so no replay of a cut commit
    /// finds the block dirty and its copy gone.
    pub(crate) freed: std::collections::BTreeSet<u32>,
}

impl DirtyMirrors {
    #[inline]
    pub(crate) fn on(&self) -> bool {
        self.on
    }

    /// Whether slot `s` is a mirror slot.
    #[inline]
    pub(crate) fn is_mirror(&self, s: u32) -> bool {
        !self.of_slot.is_empty() && self.of_slot.contains_key(&s)
    }

    /// A write-back write went through for want of a mirror slot.
    pub(crate) fn fell_back(&mut self) {
        self.fallbacks += 1;
    }

    /// Mirror slots held.
    pub(crate) fn len(&self) -> usize {
        self.of_slot.len()
    }

    /// Every mirror: (slot, block key).
    pub(crate) fn slots(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.of_slot.iter().map(|(&s, &k)| (s, k))
    }

    fn sectors(&self, s: u32) -> Option<&Vec<u64>> {
        self.of_slot.get(&s).and_then(|k| self.by_key.get(k)).map(|(_, bits)| bits)
    }
}

/// A run of sector bits `r` set in `bits`.
fn set_bits(bits: &mut [u64], (lo, hi): SectorRange) {
    for i in lo..hi {
        bits[(i / 64) as usize] |= 1 << (i % 64);
    }
}

fn bit(bits: &[u64], i: u32) -> bool {
    bits[(i / 64) as usize] >> (i % 64) & 1 == 1
}

impl Engine {
    /// Turns mirrored dirty data on or off (see the module doc). Refused with one cache
    /// device (there is nowhere else to put the copy); turning it off lets every mirror go
    /// (the dirty blocks keep their one copy).
    pub fn set_mirror_dirty(&mut self, on: bool) -> Result<(), String> {
        if on && !self.stores.several_devices() {
            return Err("mirror_dirty needs two or more cache devices: a block's copy must be on another device".into());
        }
        self.mirrors.on = on;
        if !on {
            let all: Vec<u64> = self.mirrors.by_key.keys().copied().collect();
            for k in all {
                self.let_mirror_go(k);
            }
        }
        Ok(())
    }

    /// Whether dirty data is mirrored.
    pub fn mirror_dirty(&self) -> bool {
        self.mirrors.on
    }

    /// Blocks with a mirror slot now.
    pub fn mirrored_blocks(&self) -> u64 {
        self.mirrors.len() as u64
    }

    /// Write-back writes that went through to the backing store for want of a mirror slot.
    pub fn mirror_fallbacks(&self) -> u64 {
        self.mirrors.fallbacks
    }

    /// Mirror writes that failed (each failed its request; the mirror is kept).
    pub fn mirror_write_failures(&self) -> u64 {
        self.mirrors.failed_writes
    }

    /// Whether slot `slot` holds dirty sectors with a copy on a working device.
    pub fn slot_mirrored(&self, slot: u32) -> bool {
        slot < self.present() && self.dirty.any(slot, (0, self.spb)) && self.has_working_mirror(slot)
    }

    /// Blocks served from their mirror since a device was dropped.
    pub fn mirrors_promoted(&self) -> u64 {
        self.mirrors.promoted
    }

    /// The mirror slot of `key` (written by this request into `primary`), taken when it
    /// has none: `None` when none can be had (the write goes through).
    /// `out`: the request's ops so far — one on the block already is the write-back of
    /// its older copy, which this request evicted: its mirror stays as it is until that
    /// lands (a failure puts the dirty sectors back there), and this write goes through.
    pub(crate) fn mirror_for_write(&mut self, key: u64, primary: u32, out: &Output) -> Option<u32> {
        let bs = self.cfg.block_size;
        if self.mirrors.by_key.contains_key(&key) && out.ops.iter().any(|o| pack_key(o.vm, o.block(bs)) == key) {
            return None;
        }
        let here = self.store_of(primary);
        let dirty = self.dirty.any(primary, (0, self.spb));
        if let Some(&(m, _)) = self.mirrors.by_key.get(&key) {
            let st = self.store_of(m);
            if st != here && !self.health.failed(st) && !self.is_withheld(m) {
                if !dirty {
                    // A clean block's mirror still waiting to go: what it holds is stale.
                    self.mirrors.by_key.get_mut(&key).expect("present").1.fill(0);
                }
                return Some(m);
            }
            if dirty {
                return None; // kept: it may hold acknowledged sectors a failed write puts back
            }
            self.let_mirror_go(key);
        }
        if dirty {
            // Dirty sectors with no copy (a block promoted, or whose mirror's device was
            // dropped): a new mirror would not hold them, nor the old bytes a failed write
            // leaves. Through, until the write-back queued for the block cleans it.
            return None;
        }
        let m = self.mirror_slot_off(here, key_vm(key))?;
        let words = self.spb.div_ceil(64) as usize;
        self.mirrors.by_key.insert(key, (m, vec![0; words]));
        self.mirrors.of_slot.insert(m, key);
        self.note(m);
        Some(m)
    }

    /// A free slot on a working device other than `here`; else a clean victim of `vm` on
    /// one, freed (at once usable outside persistent mode; in limbo until the next commit
    /// in it: `None` now).
    fn mirror_slot_off(&mut self, here: StoreId, vm: VmId) -> Option<u32> {
        if let Some(st) = self.store_for_mirror(here) {
            return self.take_free_of(st);
        }
        let s = self.clean_victim_off(vm, here)?;
        let owner = key_vm(self.slots.key(s));
        self.forget(owner, s);
        self.free_slot(s);
        self.store_for_mirror(here).and_then(|st| self.take_free_of(st))
    }

    /// The device a mirror slot comes from: [`crate::device_placement::choose`] over the
    /// working devices other than `here` with a free slot.
    fn store_for_mirror(&mut self, here: StoreId) -> Option<StoreId> {
        self.park_pinned_free();
        let stores = &self.stores;
        crate::device_placement::choose(stores.local_ids().filter(|&st| st != here && stores.open(st)).map(|st| {
            crate::device_placement::Candidate { store: st, free: stores.free_count(st), queued: stores.queued(st) }
        }))
    }

    /// Emits the mirror's copy of a write-back write of sectors `r` of `vm`'s block `b`
    /// into slot `m`, in `phase`, and records the sectors it holds.
    pub(crate) fn write_mirror(&mut self, vm: VmId, b: u64, m: u32, r: SectorRange, phase: u16, out: &mut Output) {
        let op = self.op(OpKind::SsdWrite, Location::Cache(self.store_of(m)), vm, b, m, r, phase, true);
        self.emit(out, DeviceOp { client: true, ..op });
        if let Some((_, bits)) = self.mirrors.by_key.get_mut(&pack_key(vm, b)) {
            set_bits(bits, r);
        }
        self.note(m);
    }

    /// Lets `key`'s mirror go (its slot to the free slots, or limbo in persistent mode).
    fn let_mirror_go(&mut self, key: u64) {
        let Some((m, _)) = self.mirrors.by_key.remove(&key) else { return };
        self.mirrors.promote.remove(&key);
        // The block's record goes in the same commit (a write-back leaves it dirty in
        // the journal otherwise: `Engine::set_lazy_clean`), ahead of the mirror's free:
        // settled now (a read pinning it later would hold a noted record back).
        if let Some(p) = self.lookup(key_vm(key), key_block(key)) {
            self.settle_slot_now(p);
        }
        self.mirrors.of_slot.remove(&m);
        self.note(m);
        self.free_slot(m);
        if self.dur.on() {
            self.mirrors.freed.insert(m); // after `free_slot`, which forgets older entries
        }
    }

    /// Mirror slot `m` is withheld (`withheld.rs`): its block is written back (into `out`),
    /// so the mirror goes when that ends; a clean block's mirror goes now. Nothing while
    /// ops are in flight on them (`Engine::withhold_step` tries again).
    pub(crate) fn vacate_mirror(&mut self, m: u32, out: &mut Output) {
        let Some(&k) = self.mirrors.of_slot.get(&m) else { return };
        if self.flight.pinned(m) || self.flight.holds_block(k) {
            return;
        }
        if self.health.failed(self.store_of(m)) {
            // On a dropped device: no copy any more.
            self.drop_failed_mirror(k);
            return;
        }
        match self.lookup(key_vm(k), key_block(k)) {
            Some(p) if self.dirty.any(p, (0, self.spb)) => {
                if !self.flight.pinned(p) && !self.poisoned(p) {
                    self.writeback(key_vm(k), p, (0, self.spb), 0, false, out);
                }
            }
            // Not while an op of the job being built writes it back (a call before this
            // one emitted it: the block looks clean already).
            _ if out.ops.iter().any(|o| pack_key(o.vm, o.block(self.cfg.block_size)) == k) => {}
            _ => self.let_mirror_go(k),
        }
    }

    /// Empties mirror slot `m` (a replay's later record of it supersedes this one).
    pub(crate) fn drop_mirror_slot(&mut self, m: u32) {
        if let Some(&k) = self.mirrors.of_slot.get(&m) {
            self.let_mirror_go(k);
        }
    }

    /// Block key `k` is held by no job any more: its mirror goes if the block is clean or
    /// gone; a dirty block on a dropped device is promoted to its mirror.
    pub(crate) fn mirror_block_idle(&mut self, k: u64) {
        let Some(&(m, _)) = self.mirrors.by_key.get(&k) else { return };
        if self.flight.pinned(m) {
            return;
        }
        if self.health.failed(self.store_of(m)) {
            self.drop_failed_mirror(k);
            return;
        }
        match self.lookup(key_vm(k), key_block(k)) {
            // In flight on the block's slot (a `keep` pin): its record is not settled yet.
            Some(p) if self.flight.pinned(p) => {}
            Some(p) if self.dirty.any(p, (0, self.spb)) => {
                if self.health.failed(self.store_of(p)) || self.mirrors.promote.remove(&k) {
                    self.promote_mirror(k);
                }
            }
            _ => self.let_mirror_go(k),
        }
    }

    /// The block of `k`, dirty in slot `p` on a dropped device, moves to its mirror slot
    /// with its dirty sectors (the mirror holds them all); written back first. Returns
    /// whether it moved.
    pub(crate) fn promote_mirror(&mut self, k: u64) -> bool {
        let Some((m, bits)) = self.mirrors.by_key.get(&k).cloned() else { return false };
        let (vm, block) = (key_vm(k), key_block(k));
        let spb = self.spb as usize;
        let dirty: Vec<bool> = match self.lookup(vm, block) {
            Some(p) => {
                let d = (0..spb as u32).map(|i| self.dirty.get(p, i) && bit(&bits, i)).collect();
                self.release_slot(p);
                d
            }
            None => (0..spb as u32).map(|i| bit(&bits, i)).collect(),
        };
        self.mirrors.by_key.remove(&k);
        self.mirrors.of_slot.remove(&m);
        self.mirrors.promote.remove(&k);
        if !dirty.contains(&true) {
            self.note(m);
            self.free_slot(m);
            return false;
        }
        // Onto the free slots first: `restore_slot` takes it from there (or from limbo).
        self.free_slot(m);
        self.restore_slot(m, vm, block, &dirty, &dirty).expect("a mirror slot holds no block");
        self.mirrors.promoted += 1;
        self.mirrors.single.push(m);
        true
    }

    /// A mirror's write into `m` of sectors `lo..hi` did not complete (`repair.rs`): the
    /// request fails, and the mirror stays as the block's copy — as the block's own slot
    /// does after a failed write, its sectors under the write that were dirty before hold
    /// the old bytes or the new, either allowed after a failed write (the others leave
    /// it: they never held the block's bytes there); the rest are untouched. (Dropping it would leave the
    /// block's acknowledged dirty sectors with one copy on a device that may fail next.)
    /// A device whose writes keep failing is dropped at the error threshold, and its
    /// mirrors with it (`mirrors_after_drop`).
    /// `dirty_before`: the block's dirty sectors before the request, when it was cached.
    pub(crate) fn mirror_write_failed(&mut self, m: u32, (lo, hi): SectorRange, dirty_before: Option<&[bool]>) {
        self.mirrors.failed_writes += 1;
        let Some(&k) = self.mirrors.of_slot.get(&m) else { return };
        let Some((_, bits)) = self.mirrors.by_key.get_mut(&k) else { return };
        for i in lo..hi {
            // Never written there (a new mirror, or a sector clean before): nothing of it.
            if !dirty_before.is_some_and(|d| d[i as usize]) {
                bits[(i / 64) as usize] &= !(1 << (i % 64));
            }
        }
        self.note(m);
    }

    /// `k`'s mirror is on a dropped device: it goes, and the block, dirty with one copy,
    /// is written back first.
    fn drop_failed_mirror(&mut self, k: u64) {
        self.let_mirror_go(k);
        if let Some(p) = self.lookup(key_vm(k), key_block(k)).filter(|&p| self.dirty.any(p, (0, self.spb))) {
            self.mirrors.single.push(p);
        }
    }

    /// A read of slot `s` failed its checksum (`seals.rs`): if it holds a dirty block with
    /// a copy on a working device, the block moves there once its ops end
    /// ([`Self::mirror_block_idle`]) and a read tried again (the daemon retries an EIO) is
    /// served from the copy; returns whether it will (else the slot is poisoned).
    pub(crate) fn promote_when_idle(&mut self, s: u32) -> bool {
        if self.mirrors.len() > 0 && self.slot_dirty(s) && self.has_working_mirror(s) {
            let k = self.slots.key(s);
            self.mirrors.promote.insert(k);
            return true;
        }
        false
    }

    /// Device `st` was dropped: mirrors on it go (their blocks written back first); dirty
    /// blocks on it with a mirror elsewhere are promoted now, or when their ops drain.
    /// Returns the blocks promoted or waiting to be, per vDisk.
    pub(crate) fn mirrors_after_drop(&mut self, st: StoreId) -> Vec<(VmId, u64)> {
        let mut saved: Vec<(VmId, u64)> = Vec::new();
        let all: Vec<(u32, u64)> = self.mirrors.slots().collect();
        for (m, k) in all {
            let primary = self.lookup(key_vm(k), key_block(k));
            if self.store_of(m) == st {
                if self.flight.pinned(m) {
                    // Goes once its ops drain (`mirror_block_idle`).
                    if let Some(p) = primary.filter(|&p| self.dirty.any(p, (0, self.spb))) {
                        self.mirrors.single.push(p);
                    }
                } else {
                    self.drop_failed_mirror(k);
                }
                continue;
            }
            let Some(p) = primary.filter(|&p| self.store_of(p) == st && self.dirty.any(p, (0, self.spb))) else {
                continue;
            };
            let vm = key_vm(k);
            crate::device_failure::count_block(&mut saved, vm);
            if !self.flight.pinned(p) && !self.flight.holds_block(k) && !self.flight.pinned(m) {
                self.promote_mirror(k);
            }
        }
        saved
    }

    /// Whether dirty slot `p` has a mirror on a working device (so its device failing
    /// loses nothing).
    pub(crate) fn has_working_mirror(&self, p: u32) -> bool {
        let k = self.slots.key(p);
        self.mirrors.by_key.get(&k).is_some_and(|&(m, _)| !self.health.failed(self.store_of(m)))
    }

    /// Slots of blocks left with one copy of dirty data, to write back first.
    pub(crate) fn take_single_copies(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.mirrors.single)
    }

    /// Puts back slots [`Self::take_single_copies`] could not write back yet.
    pub(crate) fn keep_single_copies(&mut self, busy: Vec<u32>) {
        self.mirrors.single.extend(busy);
    }

    /// The journal record of mirror slot `m`, if it is one.
    pub(crate) fn mirror_record(&self, m: u32) -> Option<crate::durability::SlotRecord> {
        let k = *self.mirrors.of_slot.get(&m)?;
        let bits = self.mirrors.sectors(m)?.clone();
        Some(crate::durability::SlotRecord {
            slot: m,
            block: Some((key_vm(k), key_block(k))),
            valid: bits.clone(),
            dirty: bits,
            sealed: false,
            mirror: true,
        })
    }

    /// Replaying metadata: free slot `slot` is `vm`'s `block`'s mirror holding `sectors`
    /// (one bool per sector; a mirror of the block named before is let go). Pair the mirrors with their blocks once every record is in
    /// ([`Self::settle_restored_mirrors`]).
    pub fn restore_mirror(&mut self, slot: u32, vm: VmId, block: u64, sectors: &[bool]) -> Result<(), String> {
        self.check_blocks(vm, block, 1).map_err(|e| format!("slot {slot}: {e}"))?;
        if slot as u64 >= self.slot_count() || sectors.len() != self.spb as usize {
            return Err(format!("slot {slot}: a mirror record beyond the pool or of another block size"));
        }
        if self.slots.key(slot) != FREE_KEY || self.mirrors.is_mirror(slot) {
            return Err(format!("slot {slot} is already in use"));
        }
        let key = pack_key(vm, block);
        // A block's newer mirror replaces an older one whose free record comes later (a
        // commit puts mirror frees last).
        self.let_mirror_go(key);
        if !self.dur.take_back(slot) && !self.stores.unpark(slot) && !self.withheld.take_back(slot) {
            self.free_unlink(slot);
        }
        let mut bits = vec![0u64; self.spb.div_ceil(64) as usize];
        for (i, _) in sectors.iter().enumerate().filter(|(_, &s)| s) {
            set_bits(&mut bits, (i as u32, i as u32 + 1));
        }
        self.mirrors.by_key.insert(key, (slot, bits));
        self.mirrors.of_slot.insert(slot, key);
        Ok(())
    }

    /// After a replay: a mirror whose block is cached dirty stays its mirror; one whose
    /// block is clean goes; one whose block has no record (a commit cut after the block's
    /// free record) becomes the block, dirty where it holds sectors. Returns the blocks
    /// so promoted.
    pub fn settle_restored_mirrors(&mut self) -> u64 {
        let all: Vec<(u32, u64)> = self.mirrors.slots().collect();
        let mut n = 0;
        for (_, k) in all {
            match self.lookup(key_vm(k), key_block(k)) {
                Some(p) if self.dirty.any(p, (0, self.spb)) => {}
                Some(_) => self.let_mirror_go(k),
                None => n += u64::from(self.promote_mirror(k)),
            }
        }
        n
    }

    /// Mirror checks for [`Engine::check_invariants`]: a mirror slot holds no block of its
    /// own, is on another device than its block, and holds every dirty sector of its block
    /// when that block is not in flight.
    pub(crate) fn check_mirrors(&self) -> Result<(), String> {
        for (m, k) in self.mirrors.slots() {
            if self.slots.key(m) != FREE_KEY || self.valid.any(m, (0, self.spb)) {
                return Err(format!("mirror slot {m} holds a block of its own"));
            }
            let Some(p) = self.lookup(key_vm(k), key_block(k)) else { continue };
            if self.flight.holds_block(k) || self.health.failed(self.store_of(p)) {
                continue;
            }
            if self.store_of(p) == self.store_of(m) && self.dirty.any(p, (0, self.spb)) {
                return Err(format!("slot {p} and its mirror {m} are on one device"));
            }
            let bits = self.mirrors.sectors(m).expect("a mirror's sectors");
            if let Some(i) = (0..self.spb).find(|&i| self.dirty.get(p, i) && !bit(bits, i)) {
                return Err(format!("slot {p} sector {i} is dirty and not in its mirror {m}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{EngineConfig, PartitionMode};
    use crate::device_failure::tests::{req, run};
    use crate::output::{Location, OpKind, Output};
    use crate::Engine;
    use cachevisor_trace::Op;

    /// Two devices of 8 slots, dirty data mirrored.
    fn mirrored() -> Engine {
        let cfg =
            EngineConfig { partition: PartitionMode::Shared, ..EngineConfig::with_slots(1) }.over_devices(&[8, 8]);
        let mut e = Engine::new(cfg).unwrap();
        e.set_error_threshold(2);
        e.set_mirror_dirty(true).unwrap();
        e
    }

    #[test]
    fn one_device_refuses_a_mirror() {
        let mut e = Engine::new(EngineConfig::with_slots(8)).unwrap();
        assert!(e.set_mirror_dirty(true).unwrap_err().contains("two or more cache devices"));
    }

    #[test]
    fn a_write_back_write_lands_on_two_devices_and_a_write_back_frees_the_copy() {
        let mut e = mirrored();
        let mut out = Output::default();
        e.access(0, &req(Op::Write, 3), &mut out);
        let writes: Vec<_> = out.ops.iter().filter(|o| o.kind == OpKind::SsdWrite).collect();
        assert_eq!(writes.len(), 2, "{:?}", out.ops);
        assert!(writes.iter().all(|o| o.client && o.sync), "both answer the request");
        assert_ne!(writes[0].loc, writes[1].loc, "on two devices");
        assert_eq!(e.mirrored_blocks(), 1);
        e.check_invariants().unwrap();
        // Reads never touch the mirror.
        let mut e = mirrored();
        run(&mut e, req(Op::Write, 3), None).unwrap();
        let mut out = Output::default();
        e.access(0, &req(Op::Read, 3), &mut out);
        assert_eq!(out.ops.len(), 1);
        // A read and a clean block keep no copy; the flush frees it.
        run(&mut e, req(Op::Read, 4), None).unwrap();
        assert_eq!(e.mirrored_blocks(), 1);
        e.check_invariants().unwrap();
        let id = e.submit_job(|e, out| {
            e.flush(None, out);
        });
        assert!(id.is_some());
        while let Some(op) = e.poll_op() {
            e.handle_completion(0, op.handle(), Ok(()));
        }
        assert_eq!((e.mirrored_blocks(), e.partition(0).dirty_blocks), (0, 0));
        e.check_invariants().unwrap();
    }

    #[test]
    fn a_dropped_device_loses_nothing_mirrored_and_its_blocks_are_served_from_the_copies() {
        let mut e = mirrored();
        for b in 0..6 {
            run(&mut e, req(Op::Write, b), None).unwrap();
        }
        assert_eq!(e.mirrored_blocks(), 6);
        let bad = e.layout().store_of(e.lookup(0, 0).unwrap());
        let good = 1 - bad;
        let on1: Vec<u64> = (0..6).filter(|&b| e.layout().store_of(e.lookup(0, b).unwrap()) == bad).collect();
        let loss = e.fail_device(bad);
        assert!(loss.dirty_blocks.is_empty(), "{loss:?}");
        assert_eq!(loss.mirrored_blocks, vec![(0, on1.len() as u64)]);
        assert_eq!(e.mirrors_promoted(), on1.len() as u64);
        e.check_invariants().unwrap();
        for b in 0..6 {
            // Every block is on the good device now, dirty, and read from there.
            let s = e.lookup(0, b).unwrap();
            assert_eq!(e.layout().store_of(s), good);
            assert!(e.slot_dirty(s));
        }
        // Single copies now: written back first (a job after the next retire), and served.
        for b in 0..6 {
            run(&mut e, req(Op::Read, b), Some(bad)).unwrap();
        }
        let dirty: u64 = e.partition(0).dirty_blocks;
        assert!(dirty <= 6 - on1.len() as u64, "{dirty} dirty: the promoted ones went back first");
        // New writes go through: no second device to mirror on.
        run(&mut e, req(Op::Write, 40), Some(bad)).unwrap();
        assert!(e.lookup(0, 40).is_none_or(|s| !e.slot_dirty(s)));
        assert!(e.mirror_fallbacks() >= 1);
        e.check_invariants().unwrap();
    }

    #[test]
    fn a_failed_mirror_write_fails_the_request_and_leaves_no_copy() {
        let mut e = mirrored();
        let mut out = Output::default();
        e.access(0, &req(Op::Write, 3), &mut out);
        let mirror_store = match out.ops.iter().filter(|o| o.kind == OpKind::SsdWrite).nth(1).unwrap().loc {
            Location::Cache(st) => st,
            other => panic!("{other:?}"),
        };
        let mut e = mirrored();
        assert!(run(&mut e, req(Op::Write, 3), Some(mirror_store)).is_err());
        assert_eq!(e.mirrored_blocks(), 0);
        e.check_invariants().unwrap();
    }
}
