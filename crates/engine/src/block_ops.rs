//! What a request does to one block, by the mode decided for it (`mode.rs`): a read hit or
//! a miss and its fill; a write by its handler — passing through, invalidating (dirty
//! sectors written back first when needed), write-through or write-back (in place, or
//! relocated away from vouched-for sectors) — and the valid/dirty bookkeeping and
//! write-backs they cause (the policies' table in `write_policy.rs`).

use crate::config::{FillMode, SECTOR};
use crate::engine::Engine;
use crate::mode::WriteMode;
use crate::output::{BlockOutcome, DeviceOp, OpKind, Output};
use crate::replacement::Replacement;
use crate::sector_bits::SectorRange;
use crate::slot_table::{key_block, pack_key};
use cachevisor_trace::VmId;

impl Engine {
    #[inline]
    pub(crate) fn read_block(&mut self, vm: VmId, b: u64, r: SectorRange, out: &mut Output) {
        let key = pack_key(vm, b);
        if let Some(s) = self.index.get(key, |x| self.slots.key(x)) {
            self.touch(vm, s);
            if self.valid.all(s, r) {
                // The RAM tier first; an SSD hit may fill it from the same read.
                let ram = self.ram.on() && !self.ram_read(vm, b, s, r, out);
                let fill = if ram { self.ram_fill_slot(vm, s) } else { None };
                let op =
                    DeviceOp { client: true, staged: fill.is_some(), ..self.ssd(OpKind::SsdRead, vm, s, r, 0, true) };
                if !self.ram.on() || ram {
                    let read = self.emit(out, op);
                    if let Some(q) = fill {
                        self.ram_fill(vm, b, q, r, read, out);
                    }
                }
                out.blocks.push(BlockOutcome { block: b, hit: true, inserted: false, bypassed: false, evicted: None });
                return;
            }
            // Partial hit: valid sectors from the SSD, the rest from backing, then filled.
            let mut valid_runs = std::mem::take(&mut self.scratch.runs);
            self.valid.runs(s, r, true, &mut valid_runs);
            for &run in &valid_runs {
                let op = DeviceOp { client: true, ..self.ssd(OpKind::SsdRead, vm, s, run, 0, true) };
                self.emit(out, op);
            }
            self.scratch.runs = valid_runs;
            let fill = if self.cfg.fill == FillMode::Block { (0, self.spb) } else { r };
            self.fill(vm, b, s, fill, 0, true, out);
            out.blocks.push(BlockOutcome { block: b, hit: false, inserted: false, bypassed: false, evicted: None });
            return;
        }
        let admitted = self.admits_miss(vm, key, false);
        match admitted.then(|| self.allocate(vm, key, false, out)).flatten() {
            Some(a) => {
                let fill = if self.cfg.fill == FillMode::Block { (0, self.spb) } else { r };
                self.fill(vm, b, a.slot, fill, a.phase, true, out);
                out.blocks.push(BlockOutcome {
                    block: b,
                    hit: false,
                    inserted: true,
                    bypassed: false,
                    evicted: a.evicted,
                });
            }
            None => {
                let op = DeviceOp { client: true, ..self.backing(OpKind::BackingRead, vm, b, r, 0, true) };
                self.emit(out, op);
                out.blocks.push(BlockOutcome { block: b, hit: false, inserted: false, bypassed: true, evicted: None });
            }
        }
    }

    /// Reads the invalid sectors of `range` from backing (sync) and writes them into the
    /// slot (async, from `phase` on, at least after the reads); `client`: the backing
    /// reads serve a client request (else a background job's, a prewarm load).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fill(
        &mut self,
        vm: VmId,
        b: u64,
        s: u32,
        range: SectorRange,
        phase: u16,
        client: bool,
        out: &mut Output,
    ) {
        let mut runs = std::mem::take(&mut self.scratch.runs2);
        if self.valid.any(s, (0, self.spb)) {
            self.valid.runs(s, range, false, &mut runs);
        } else {
            runs.clear();
            runs.push(range);
        }
        let first = self.next_op;
        for &run in &runs {
            let op = DeviceOp { staged: true, client, ..self.backing(OpKind::BackingRead, vm, b, run, 0, true) };
            self.emit(out, op);
        }
        for (i, &run) in runs.iter().enumerate() {
            let op = self.ssd(OpKind::SsdWrite, vm, s, run, phase.max(1), false);
            self.emit(out, DeviceOp { staged: true, source: std::num::NonZeroU64::new(first + i as u64), ..op });
            self.valid.set(s, run);
            self.note(s);
        }
        self.scratch.runs2 = runs;
    }

    /// A write of bytes `lo..hi` of block `b`, by the request's mode (`mode.rs`).
    #[inline]
    pub(crate) fn write_block(&mut self, vm: VmId, b: u64, (lo, hi): (u64, u64), out: &mut Output) {
        let r = ((lo / SECTOR) as u32, hi.div_ceil(SECTOR) as u32);
        match self.req.mode.write {
            WriteMode::Invalidate { write_back } => self.write_invalidating(vm, b, (lo, hi), write_back, out),
            WriteMode::Through { allocate } => self.write_cached(vm, b, r, false, allocate, out),
            WriteMode::Back => self.write_cached(vm, b, r, true, true, out),
        }
    }

    /// The pass-through handler: bytes `lo..hi` of block `b` to the backing store only,
    /// from `phase` on.
    fn write_passing(&mut self, vm: VmId, b: u64, (lo, hi): (u64, u64), phase: u16, out: &mut Output) {
        let op = DeviceOp {
            disk_addr: (b << self.shift) + lo,
            len: (hi - lo) as u32,
            client: true,
            ..self.backing(OpKind::BackingWrite, vm, b, (0, 0), phase, true)
        };
        self.emit(out, op);
        out.blocks.push(BlockOutcome { block: b, hit: false, inserted: false, bypassed: true, evicted: None });
    }

    /// The invalidating handler (read-only / write-invalidate, and writes not covering
    /// whole sectors): the cached copy of the sectors written is dropped — their dirty
    /// sectors written back first when `write_back` — then the write passes through.
    fn write_invalidating(&mut self, vm: VmId, b: u64, (lo, hi): (u64, u64), write_back: bool, out: &mut Output) {
        let r = ((lo / SECTOR) as u32, hi.div_ceil(SECTOR) as u32);
        let phase = self.drop_cached_for_write(vm, self.lookup(vm, b), r, write_back, out);
        self.write_passing(vm, b, (lo, hi), phase, out);
    }

    /// The write-through (`dirty` false) and write-back (`dirty` true) handlers: the
    /// cached copy is written — a miss takes a slot when `allocate` and the request's mode
    /// inserts, else the write passes through — and, write-through, the backing store too.
    fn write_cached(&mut self, vm: VmId, b: u64, r: SectorRange, dirty: bool, allocate: bool, out: &mut Output) {
        let key = pack_key(vm, b);
        let resident = self.index.get(key, |x| self.slots.key(x));
        let (slot, phase, inserted, evicted) = match resident {
            Some(s) if dirty && self.relocates(s, r) => {
                // Persistent mode: a write-back write of a whole block the journal vouches
                // clean moves to a durable free slot instead of waiting for an intent
                // commit; the old slot, still the journal's copy until the commit that
                // frees it, goes to limbo.
                self.with_repl(vm, |rp, t| rp.remove(t, s));
                self.release(vm, s);
                match self.allocate(vm, key, true, out) {
                    Some(a) => (Some(a.slot), a.phase, false, None),
                    None => (None, 0, false, None),
                }
            }
            Some(s) => {
                self.touch(vm, s);
                (Some(s), 0, false, None)
            }
            None if allocate && self.admits_miss(vm, key, true) => match self.allocate(vm, key, true, out) {
                Some(a) => (Some(a.slot), a.phase, true, a.evicted),
                None => (None, 0, false, None),
            },
            None => (None, 0, false, None),
        };
        let Some(s) = slot else {
            return self.write_passing(vm, b, (r.0 as u64 * SECTOR, r.1 as u64 * SECTOR), 0, out);
        };
        let mut dirty = dirty && !self.writes_through_at(s);
        // Mirrored dirty data: the copy's slot on another device, or through instead.
        let mirror = if dirty && self.mirrors.on() { self.mirror_for_write(key, s, out) } else { None };
        if dirty && self.mirrors.on() && mirror.is_none() {
            self.mirrors.fell_back();
            dirty = false;
        }
        let op = DeviceOp { client: true, ..self.ssd(OpKind::SsdWrite, vm, s, r, phase, true) };
        self.emit(out, op);
        self.valid.set(s, r);
        self.note(s);
        if let Some(m) = mirror {
            self.write_mirror(vm, b, m, r, phase, out);
        }
        if dirty {
            self.mark_dirty(vm, s, r);
        } else {
            let op = DeviceOp { client: true, ..self.backing(OpKind::BackingWrite, vm, b, r, 0, true) };
            self.emit(out, op);
            self.clear_dirty(vm, s, r);
        }
        out.blocks.push(BlockOutcome { block: b, hit: resident.is_some(), inserted, bypassed: false, evicted });
    }

    /// Whether a write-back write of sectors `r` to resident slot `s` moves the block
    /// to a free slot (persistent mode, the whole block, a clean block some of
    /// which the journal vouches clean, and a durable free slot to move to): the common
    /// rewrite of clean cached data then needs no commit before its cache write
    /// (`durability.rs`). The old slot goes to limbo; a crash before the new record is
    /// durable finds the block clean in it or (its free record durable) not cached: the
    /// backing store holds the same bytes either way.
    #[inline]
    fn relocates(&mut self, s: u32, r: SectorRange) -> bool {
        self.dur.on()
            && r == (0, self.spb)
            && self.dur.is_vouched(s)
            // A dirty sector's only copy is here: its slot must stay the journal's copy
            // until the new slot's record is durable, which a free record committed first
            // would break (the new write may still be in flight).
            && !self.dirty.any(s, (0, self.spb))
            && !self.flight.pinned(s)
            && self.free_available()
    }

    /// Before a write around the cache (the read-only policy's, or one not covering whole
    /// sectors): the sectors `r` of the block cached in `slot` (if it is) are dropped, the
    /// dirty ones written back first when `write_back` (always for a write not covering
    /// whole sectors: the rest of a sector is theirs). Returns the phase the write's own backing write goes
    /// in (after that write-back). The write-back is what keeps a flushed write in
    /// persistent mode: its cache read pins the slot, so the slot's record — invalid or
    /// free now — settles only once the write has landed, and the commit that journals it
    /// syncs the backing store first; dropped with no op on the slot, the dirty sectors
    /// could be journaled invalid before the write reached the disk, and a crash would
    /// leave the backing store older than a flush had promised (found by the
    /// crash-consistency model with the read-only policy drawn). An intent keeps the
    /// sectors dirty in the journal meanwhile (`intents.rs`).
    fn drop_cached_for_write(
        &mut self,
        vm: VmId,
        slot: Option<u32>,
        r: SectorRange,
        write_back: bool,
        out: &mut Output,
    ) -> u16 {
        let Some(s) = slot else { return 0 };
        let phase = if write_back && self.writeback(vm, s, r, 0, true, out) > 0 { 2 } else { 0 };
        if self.dirty.any(s, r) {
            self.req.keep.push(s); // pinned with the request (`InRequest::keep`)
        }
        self.invalidate(vm, s, r);
        phase
    }

    // ----- slot bookkeeping -----

    #[inline]
    pub(crate) fn touch(&mut self, vm: VmId, s: u32) {
        self.prewarmed.end(s); // a prewarmed block's first touch ends its protection
        self.prefetcher.touched(s);
        if !self.slots.last_access_ms.is_empty() {
            self.slots.last_access_ms[s as usize] = self.now_ms;
        }
        self.with_repl(vm, |r, t| r.touch(t, s));
        if self.shared_budget.on() {
            self.shared_budget.touched(vm, s);
        }
        if self.moving.any() {
            self.note_hit_for_migration(vm, s);
        }
    }

    fn mark_dirty(&mut self, vm: VmId, s: u32, r: SectorRange) {
        if !self.dirty.any(s, (0, self.spb)) {
            self.vms[vm as usize].dirty_blocks += 1;
        }
        self.dirty.set(s, r);
        self.note(s);
    }

    fn clear_dirty(&mut self, vm: VmId, s: u32, r: SectorRange) {
        let was = self.dirty.any(s, (0, self.spb));
        self.dirty.clear(s, r);
        // The flusher's write-backs leave the journal saying dirty (`durability.rs`).
        if !self.dur.lazy_clean() {
            self.note(s);
        }
        if was && !self.dirty.any(s, (0, self.spb)) {
            self.vms[vm as usize].dirty_blocks -= 1;
        }
    }

    /// Drops sectors `r` of a slot; a slot left with no valid sector is freed.
    pub(crate) fn invalidate(&mut self, vm: VmId, s: u32, r: SectorRange) {
        if self.ram.on() {
            self.ram.ssd_changed(s);
        }
        self.clear_dirty(vm, s, r);
        self.valid.clear(s, r);
        self.note(s);
        if !self.valid.any(s, (0, self.spb)) {
            self.with_repl(vm, |r, t| r.remove(t, s));
            self.release(vm, s);
        }
    }

    /// Writes back the dirty sectors of `r` in slot `s` (SSD read in `phase`, backing
    /// write in `phase + 1`) and cleans them; returns the sectors written back.
    pub(crate) fn writeback(
        &mut self,
        vm: VmId,
        s: u32,
        r: SectorRange,
        phase: u16,
        sync: bool,
        out: &mut Output,
    ) -> u32 {
        if !self.dirty.any(s, r) {
            return 0;
        }
        let mut runs = std::mem::take(&mut self.scratch.runs);
        self.dirty.runs(s, r, true, &mut runs);
        let block = key_block(self.slots.key(s));
        let mut n = 0;
        for &run in &runs {
            let read = self.emit(out, DeviceOp { staged: true, ..self.ssd(OpKind::SsdRead, vm, s, run, phase, sync) });
            let write = self.backing(OpKind::BackingWrite, vm, block, run, phase + 1, sync);
            self.emit(out, DeviceOp { staged: true, source: std::num::NonZeroU64::new(read), ..write });
            n += run.1 - run.0;
        }
        self.scratch.runs = runs;
        if n > 0 {
            self.clear_dirty(vm, s, r);
        }
        n
    }
}
