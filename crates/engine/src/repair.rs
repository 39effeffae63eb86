//! Repairs after a failed device op. The engine commits its state when it emits a
//! request's ops (a write-back marks its block clean, an eviction forgets the victim, a
//! fill marks sectors valid); while they are in flight the request's blocks and slots are
//! held (`inflight.rs`), so nobody sees that state early. When one op fails, the request
//! stops (no later phase runs) and, once nothing of it is in flight, this puts back what
//! did not happen, so data a client was told is written is never lost:
//! - a cache write that did not complete leaves no data: its sectors leave the cache;
//! - a failed cache read drops only clean sectors (the backing store has them); dirty
//!   ones stay, their only copy is there;
//! - a failed client write leaves the sectors it covered dirty where they were dirty
//!   before (the bytes are the old data or the failed write's, either is allowed after a
//!   failed write) and drops the others — an acknowledged dirty sector is never dropped;
//! - a write-back that did not complete leaves its sectors dirty in the slot they were
//!   read from: no later write to that slot ran (it would be in a later phase), so the
//!   block is put back there, dirty, displacing a block the request had put in its place;
//! - a move between cache stores (migration) that did not complete puts the block back in
//!   the slot it was copied from, which nothing reused while the copy was in flight —
//!   unless that slot's store takes no block any more (a lost lender) and the block is
//!   clean: then it is dropped;
//! - a RAM-tier op that did not complete drops its copy (the SSD still holds the block).

use crate::engine::Engine;
use crate::inflight::{Job, OpState};
use crate::output::OpKind;
use cachevisor_trace::VmId;

impl Engine {
    /// Corrects the engine after `job` stopped on a failure (nothing of it in flight).
    pub(crate) fn repair(&mut self, job: &Job) {
        let bs = self.cfg.block_size;
        let done = |i: usize| job.state[i] == OpState::Done;
        let issued = |i: usize| matches!(job.state[i], OpState::Done | OpState::Failed);
        // RAM-tier ops that did not complete: the copy goes (`ram_tier.rs`; a fill whose
        // SSD read failed never ran).
        for (i, op) in job.out.ops.iter().enumerate() {
            if op.loc == crate::output::Location::Ram && !done(i) {
                self.ram_op_lost(op.slot);
            }
        }
        // Moves between cache stores (`migration.rs`) that did not complete: the block goes
        // back to the slot it was copied from, with its sectors as they are now (nothing
        // changed them: the job held the block), before the rule below would drop them.
        for op in &job.out.ops {
            if op.kind != OpKind::SsdWrite || !op.staged {
                continue;
            }
            let Some(read) = op.source_id().and_then(|src| job.out.ops.iter().find(|o| o.id == src)) else { continue };
            let (vm, block) = (op.vm, op.block(bs));
            let copied = job.out.ops.iter().enumerate().all(|(k, o)| {
                !(o.slot == op.slot || o.slot == read.slot) || (o.vm, o.block(bs)) != (vm, block) || done(k)
            });
            if read.kind != OpKind::SsdRead || copied || self.slot_block(op.slot) != Some((vm, block)) {
                continue;
            }
            let spb = self.spb;
            let (valid, dirty): (Vec<bool>, Vec<bool>) = (0..spb).map(|k| self.sector_state(op.slot, k)).unzip();
            self.release_slot(op.slot);
            self.vms[vm as usize].moved -= 1;
            let source = self.store_of(read.slot);
            if self.stores.limit(source) == 0 && !dirty.contains(&true) {
                // Its source store takes no block now (a lost lender, `lose_lender`): a
                // clean block is dropped (the backing store has it), never put back there.
                continue;
            }
            self.restore_slot(read.slot, vm, block, &valid, &dirty).expect("a move's source slot waits for it");
        }
        // Cache writes that did not complete: their sectors hold nothing.
        for (i, op) in job.out.ops.iter().enumerate() {
            if op.kind == OpKind::SsdWrite && !done(i) && self.slot_block(op.slot) == Some((op.vm, op.block(bs))) {
                self.discard(op.vm, op.block(bs), op.sectors(bs));
            }
        }
        // Mirror writes that did not complete (`dirty_mirror.rs`): the sectors they
        // covered are the mirror's only where the block was dirty before the request.
        for (i, op) in job.out.ops.iter().enumerate() {
            if op.kind == OpKind::SsdWrite && !done(i) && self.mirrors.is_mirror(op.slot) {
                let key = crate::slot_table::pack_key(op.vm, op.block(bs));
                let spb = self.spb as usize;
                let before =
                    job.pre.iter().position(|&(_, k)| k == key).map(|k| &job.pre_dirty[k * spb..(k + 1) * spb]);
                self.mirror_write_failed(op.slot, op.sectors(bs), before);
            }
        }
        // Failed cache reads: their clean sectors go.
        for (i, op) in job.out.ops.iter().enumerate() {
            if op.kind == OpKind::SsdRead && job.state[i] == OpState::Failed {
                let (lo, hi) = op.sectors(bs);
                if self.slot_block(op.slot) == Some((op.vm, op.block(bs))) {
                    self.recompose(op.slot, op.vm, op.block(bs), |i, v, d| {
                        if (lo..hi).contains(&i) && !d {
                            (false, false)
                        } else {
                            (v, d)
                        }
                    });
                }
            }
        }
        // A failed client write: sectors it covered that were dirty stay dirty.
        if let Some(req) = job.req.filter(|r| r.op.is_write()) {
            let client_failed = job.out.ops.iter().enumerate().any(|(i, o)| o.client && !done(i));
            let spb = self.spb as usize;
            for (k, (slot, key)) in job.pre.iter().enumerate().filter(|_| client_failed) {
                let dirty = &job.pre_dirty[k * spb..(k + 1) * spb];
                let (vm, block) = (crate::slot_table::key_vm(*key), crate::slot_table::key_block(*key));
                // The slot went to another block in this request whose data was written
                // there: this block's bytes are gone from it (a dirty one was written back
                // first, or the request would not have reached that write).
                let taken = job.out.ops.iter().enumerate().any(|(i, o)| {
                    issued(i) && o.kind == OpKind::SsdWrite && o.slot == *slot && (o.vm, o.block(bs)) != (vm, block)
                });
                let holds = self.slot_block(*slot) == Some((vm, block))
                    || (self.slot_block(*slot).is_none() && self.lookup(vm, block).is_none());
                if taken || !holds {
                    continue;
                }
                let (lo, hi) = sectors_of(req.offset, req.len as u64, bs, block);
                self.recompose(*slot, vm, block, |i, v, d| {
                    if (lo..hi).contains(&i) {
                        (dirty[i as usize], dirty[i as usize])
                    } else {
                        (v, d)
                    }
                });
            }
            // Blocks the write brought into a slot keep nothing of it: not cached before, or
            // cached elsewhere (evicted and taken again by this request, or moved) — by
            // slot and key, as one may sit in the slot of a block it evicted.
            if client_failed {
                for b in req.offset / bs..req.end().div_ceil(bs) {
                    let key = crate::slot_table::pack_key(req.vm, b);
                    if self.lookup(req.vm, b).is_some_and(|s| !job.pre.contains(&(s, key))) {
                        self.discard(req.vm, b, sectors_of(req.offset, req.len as u64, bs, b));
                    }
                }
            }
        }
        // Write-backs that did not complete: dirty again where they were read from.
        for (i, op) in job.out.ops.iter().enumerate() {
            if op.kind != OpKind::BackingWrite || !op.staged || done(i) {
                continue;
            }
            let Some(read) = op.source_id().and_then(|src| job.out.ops.iter().find(|o| o.id == src)) else { continue };
            let (lo, hi) = op.sectors(bs);
            let (slot, vm, block) = (read.slot, op.vm, op.block(bs));
            self.recompose(slot, vm, block, |i, v, d| if (lo..hi).contains(&i) { (true, true) } else { (v, d) });
        }
    }

    /// Sets `slot`'s sector states to what `f(sector, valid, dirty)` says, for `vm`'s
    /// `block`. A slot holding another block is emptied first (its bytes are not that
    /// block's); a slot left with no valid sector is freed. Returns false when the block is
    /// cached in another slot with dirty sectors (that copy is newer; nothing changes).
    /// (Public for drivers repairing after a failure on the synchronous face.)
    pub fn recompose(&mut self, slot: u32, vm: VmId, block: u64, f: impl Fn(u32, bool, bool) -> (bool, bool)) -> bool {
        let spb = self.spb;
        let here = self.slot_block(slot) == Some((vm, block));
        let cur: Vec<(bool, bool)> =
            (0..spb).map(|i| if here { self.sector_state(slot, i) } else { (false, false) }).collect();
        let new: Vec<(bool, bool)> =
            cur.iter().enumerate().map(|(i, &(v, d))| f(i as u32, v, d)).map(|(v, d)| (v || d, d)).collect();
        if here && new == cur {
            return true;
        }
        if let Some(other) = self.lookup(vm, block).filter(|&o| o != slot) {
            if (0..spb).any(|i| self.dirty.get(other, i)) {
                return false;
            }
            self.release_slot(other); // a clean copy: the backing store has it
        }
        self.release_slot(slot);
        if new.iter().any(|&(v, _)| v) {
            let (valid, dirty): (Vec<bool>, Vec<bool>) = new.into_iter().unzip();
            self.restore_slot(slot, vm, block, &valid, &dirty).expect("a freed slot takes its block back");
        }
        true
    }
}

/// The sectors `lo..hi` of block `b` that bytes `offset..offset+len` cover.
pub(crate) fn sectors_of(offset: u64, len: u64, bs: u64, b: u64) -> (u32, u32) {
    let start = b * bs;
    let lo = offset.max(start) - start;
    let hi = (offset + len).min(start + bs) - start;
    ((lo / 512) as u32, hi.div_ceil(512) as u32)
}
