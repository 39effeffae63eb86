//! Persistent mode's *intent before overwrite* rule (`durability.rs`), at dispatch: a
//! client write into sectors the journal may record valid and clean waits for a commit
//! that records them dirty (or, for a write around the cache, invalid); a write-back of a
//! block the journal still records clean in a slot in limbo waits for the commit that
//! frees that slot.

use crate::durability::SlotRecord;
use crate::engine::Engine;
use crate::inflight::{Failure, ReqId};
use crate::output::{DeviceOp, Output};
use crate::slot_table::pack_key;
use cachevisor_trace::Request;

impl Engine {
    /// Persistent mode: the slots a write would overwrite where the journal may record
    /// valid clean sectors (they need an intent commit first; `durability.rs`).
    pub(crate) fn vouched_before(&self, req: &Request) -> Vec<SlotRecord> {
        self.request_keys(req)
            .filter_map(|key| self.lookup(req.vm, crate::slot_table::key_block(key)))
            .filter(|&s| self.dur.is_vouched(s) || self.seals.is_sealed(s))
            .map(|s| self.record_of(s))
            .collect()
    }

    /// Persistent mode: the sealed slots a read's blocks hold (a fill into one needs an
    /// unsealing record first, like a client write: `seals.rs`).
    pub(crate) fn sealed_before(&self, req: &Request) -> Vec<SlotRecord> {
        self.request_keys(req)
            .filter_map(|key| self.lookup(req.vm, crate::slot_table::key_block(key)))
            .filter(|&s| self.seals.is_sealed(s))
            .map(|s| self.record_of(s))
            .collect()
    }

    /// The intent records a write's ops need, from the vouched-for slots its blocks held
    /// before the request (`before`) and the sectors the journal may record valid and clean
    /// there: a client cache write into the same slot records the valid sectors it
    /// overwrites valid and dirty (their bytes are the old data until it lands; other
    /// sectors it makes valid are recorded invalid: a crash before it lands leaves nothing
    /// of theirs); a client backing write records those it covers invalid (a crash after
    /// it lands must not leave the old bytes labelled clean in the cache). Dirty sectors
    /// stay dirty either way. A fill (the engine's own cache write of bytes read from the
    /// backing store) into a sealed slot gets the slot's record as it was before: the
    /// sectors it fills stay invalid until a later record, and the seal's checksums stop
    /// describing the slot before the fill changes its bytes (before, a read's fill after
    /// a write around that dropped sealed dirty sectors left the journal's checksums over
    /// the new bytes: a crash then failed them, found by the crash-consistency model).
    pub(crate) fn intents(&self, before: &[SlotRecord], out: &Output) -> Vec<SlotRecord> {
        use crate::output::OpKind;
        let bs = self.cfg.block_size;
        let mut records: Vec<SlotRecord> = Vec::new();
        let mut needed: Vec<u32> = Vec::new();
        // Other sealed slots of the regions this write waits for (`seals.rs`).
        let mut unseals: Vec<SlotRecord> = Vec::new();
        let writes = out.ops.iter().filter(|o| o.client && o.kind == OpKind::SsdWrite);
        let around = out.ops.iter().filter(|o| o.client && o.kind == OpKind::BackingWrite);
        for op in writes.chain(around) {
            let ssd = op.kind == OpKind::SsdWrite;
            // The slot must still hold the block, or have been emptied by this request
            // while its own write-back of the block's dirty sectors keeps it pinned (a
            // write around: `drop_cached_for_write`; its free record settles only after
            // the write, so the commit this write waits for needs the intent). One
            // evicted by this request is recorded free instead, and its backing write
            // waits for that (`hold_for_vouched`).
            let Some(pre) = before.iter().find(|r| {
                let block = Some((op.vm, op.block(bs)));
                let emptied_pinned = || {
                    self.slot_block(r.slot).is_none()
                        && out.ops.iter().any(|o| o.slot == r.slot && Some((o.vm, o.block(bs))) == block)
                };
                (!ssd || r.slot == op.slot)
                    && r.block == block
                    && (self.slot_block(r.slot) == block || emptied_pinned())
            }) else {
                continue;
            };
            if ssd && self.seals.is_sealed(pre.slot) && !needed.contains(&pre.slot) {
                // Its checksums in the journal describe the bytes this write replaces: a
                // record without them first (`seals.rs`), and its region's other sealed
                // slots unsealed along with it.
                needed.push(pre.slot);
                let mut skip: Vec<u32> = records.iter().map(|r| r.slot).collect();
                skip.extend(before.iter().map(|r| r.slot));
                for n in self.region_unseals(pre.slot, &skip) {
                    needed.push(n.slot);
                    unseals.push(n);
                }
            }
            let r = match records.iter_mut().find(|r| r.slot == pre.slot) {
                Some(r) => r,
                None => {
                    records.push(pre.clone());
                    records.last_mut().expect("just pushed")
                }
            };
            let (lo, hi) = op.sectors(bs);
            // Dirty data mirrored (`dirty_mirror.rs`): the clean sectors are recorded invalid
            // instead, so a replay never finds them dirty with no copy on another device.
            let mirrored = ssd && self.mirrors.on();
            let vouched = self.dur.vouched_sectors(pre.slot);
            for i in lo..hi {
                let (w, bit) = ((i / 64) as usize, 1u64 << (i % 64));
                let journal_clean = vouched.get(w).is_some_and(|v| v & bit != 0);
                if journal_clean && !needed.contains(&pre.slot) {
                    // The journal may call it clean whatever memory says now (a repair may
                    // have dropped it without a commit yet): the intent goes even when it
                    // changes nothing here.
                    needed.push(pre.slot);
                }
                if mirrored && r.valid[w] & bit != 0 && r.dirty[w] & bit == 0 {
                    r.valid[w] &= !bit;
                } else if ssd && r.valid[w] & bit != 0 {
                    // Valid here: never clean while the write may land. A sector valid
                    // only in the journal's eyes stays invalid: the journal may call it
                    // clean, or may have dropped it already (the vouched bits are a
                    // superset until a newer record is committed) while the backing
                    // store took newer bytes — recorded dirty, a crash before the write
                    // lands would serve the cache's old bytes as the newest (found by the
                    // crash-consistency model: a write-through write after a write around).
                    r.valid[w] |= bit;
                    r.dirty[w] |= bit;
                } else if !ssd && r.dirty[w] & bit == 0 {
                    // Clean here (in the journal or the record): not once the backing
                    // store may hold newer bytes.
                    r.valid[w] &= !bit;
                }
            }
        }
        let fills = out.ops.iter().filter(|o| !o.client && o.kind == OpKind::SsdWrite);
        for op in fills.filter(|o| self.seals.is_sealed(o.slot)) {
            let block = Some((op.vm, op.block(bs)));
            let Some(pre) = before.iter().find(|r| r.slot == op.slot && r.block == block) else { continue };
            if !needed.contains(&pre.slot) {
                needed.push(pre.slot);
            }
            if !records.iter().any(|r| r.slot == pre.slot) {
                records.push(pre.clone());
            }
        }
        unseals.retain(|u| !records.iter().any(|r| r.slot == u.slot));
        records.append(&mut unseals);
        records.retain(|r| {
            needed.contains(&r.slot)
                || before.iter().any(|p| p.slot == r.slot && (p.dirty != r.dirty || p.valid != r.valid))
        });
        for r in records.iter_mut().filter(|r| r.valid.iter().all(|&w| w == 0)) {
            r.block = None; // nothing valid left: the slot is free in the journal's eyes
        }
        records
    }

    /// Lets a job held for an intent commit go on (`Some(failure)`: the commit failed, the
    /// job fails without running).
    pub(crate) fn release_held(&mut self, (id, key): (ReqId, usize), failure: Option<Failure>) {
        let Some(job) = self.flight.held_job(id, key) else { return };
        job.held = false;
        if let Some(f) = failure {
            job.failure.get_or_insert(f);
        }
        self.advance(key);
    }

    /// Persistent mode: a job writing a block to its backing store while the journal may
    /// still record that block clean in a slot in limbo waits for the next commit (which
    /// frees that slot). Returns whether it is held.
    pub(crate) fn hold_for_vouched(&self, ops: &[DeviceOp]) -> bool {
        if !self.dur.any_vouched_elsewhere() {
            return false;
        }
        let bs = self.cfg.block_size;
        let clean_in_limbo = |op: &DeviceOp| {
            op.kind == crate::output::OpKind::BackingWrite
                && self.dur.vouched_elsewhere(pack_key(op.vm, op.block(bs)), op.sectors(bs))
        };
        ops.iter().any(clean_in_limbo)
    }
}
