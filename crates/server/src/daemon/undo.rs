//! Bringing the engine back in line with the devices after an operation failed. The engine
//! commits its state when it emits operations (a write-back marks a block clean, an
//! eviction forgets it), so when an op fails — a full backing store, a dying device — the
//! ops from the failed one on did not happen, and the engine's state must be corrected
//! before anything is journaled, or data a client was told is written is lost:
//! - a write-back that did not complete (or whose backing store could not be synced)
//!   leaves its sectors dirty in the slot they were read from, whose bytes still hold
//!   them (no later write to that slot ran); the block is put back there, dirty;
//! - a cache-store write that did not complete leaves no data: its sectors leave the cache;
//! - a failed client write leaves the sectors it covered as they were where they were
//!   dirty (the bytes are the old data or the failed write's, either is allowed after a
//!   failed write) — an acknowledged dirty sector is never dropped for a failed write;
//! - a failed cache-store read drops only clean sectors (the backing store has them);
//!   dirty ones stay, their only copy is there.
//!
//! (The engine redesign with in-flight state and completions will make this the engine's
//! own job; until then the driver repairs with `release_slot`/`restore_slot`.)

use super::*;
use crate::persist::Pre;
use cachevisor_engine::DeviceOp;
use std::collections::HashMap;

/// A client write's VM, offset and length, for undoing its effect.
pub(super) type WriteRange = (VmId, u64, u64);

/// The slot, disk block and sector range an SSD op touches.
pub(super) fn ssd_place(op: &DeviceOp, bs: u64) -> (u32, u64, (u32, u32)) {
    let slot = op.slot;
    let first = ((op.disk_addr % bs) / 512) as u32;
    (slot, op.disk_addr / bs, (first, first + op.len.div_ceil(512)))
}

/// Corrects `e` after `ops` stopped at index `at` (ops from `at` on did not complete;
/// `at == ops.len()`: all ran but the write-backs among them are not durable, e.g. the
/// backing store's sync failed). `pre` holds the states before the request of the slots a
/// client write found cached, and `write` its range. Returns the blocks put back dirty.
pub(super) fn undo(
    e: &mut Engine,
    ops: &[DeviceOp],
    at: usize,
    pre: &HashMap<u32, Pre>,
    write: Option<WriteRange>,
) -> u64 {
    let bs = e.config().block_size;
    let spb = (bs / 512) as u32;
    let at = at.min(ops.len());
    // Cache-store writes that did not complete: their sectors hold nothing.
    for op in ops[at..].iter().filter(|o| o.kind == OpKind::SsdWrite) {
        let (slot, block, range) = ssd_place(op, bs);
        if e.slot_block(slot) == Some((op.vm, block)) {
            e.discard(op.vm, block, range);
        }
    }
    // A failed cache-store read: its clean sectors go (the backing store has them).
    if let Some(op) = ops.get(at).filter(|o| o.kind == OpKind::SsdRead) {
        let (slot, block, (lo, hi)) = ssd_place(op, bs);
        if e.slot_block(slot) == Some((op.vm, block)) {
            e.recompose(
                slot,
                op.vm,
                block,
                |i, v, d| if (lo..hi).contains(&i) && !d { (false, false) } else { (v, d) },
            );
        }
    }
    // A failed client write: sectors it covered that were dirty stay dirty, the others
    // read from the backing store again.
    if let Some((vm, offset, len)) = write {
        for (&slot, p) in pre {
            let Pre::State(st) = p else { continue };
            let Some((pv, pb)) = (st.key() != cachevisor_engine::slot_table::FREE_KEY).then(|| {
                (cachevisor_engine::slot_table::key_vm(st.key()), cachevisor_engine::slot_table::key_block(st.key()))
            }) else {
                continue;
            };
            let holds =
                e.slot_block(slot) == Some((pv, pb)) || (e.slot_block(slot).is_none() && e.lookup(pv, pb).is_none());
            // The slot went to another block in this request and that block's data (maybe
            // part of it, from the failed op) was written there: the block's bytes are gone
            // from it (a dirty one was written back first).
            let taken = ops[..(at + 1).min(ops.len())].iter().any(|o| {
                o.kind == OpKind::SsdWrite && ssd_place(o, bs).0 == slot && (o.vm, ssd_place(o, bs).1) != (pv, pb)
            });
            if !holds || taken || pv != vm {
                continue;
            }
            let (lo, hi) = sectors_of(offset, len, bs, pb);
            e.recompose(
                slot,
                pv,
                pb,
                |i, v, d| if (lo..hi).contains(&i) { (st.dirty_at(i), st.dirty_at(i)) } else { (v, d) },
            );
        }
        // Blocks the write brought into the cache: nothing of the failed write stays.
        if len > 0 {
            for b in offset / bs..(offset + len).div_ceil(bs) {
                if e.lookup(vm, b).is_some_and(|s| !pre.contains_key(&s)) {
                    e.discard(vm, b, sectors_of(offset, len, bs, b));
                }
            }
        }
    }
    // Write-backs that did not complete (or are not durable): dirty again where they were
    // read from, unless a completed cache-store write replaced that slot's bytes since.
    let mut restored = 0;
    for (j, op) in ops.iter().enumerate().filter(|(_, o)| o.kind == OpKind::BackingWrite && o.staged) {
        let Some((r, read)) = ops[..j].iter().enumerate().rev().find(|(_, o)| {
            o.kind == OpKind::SsdRead
                && o.staged
                && o.vm == op.vm
                && o.disk_addr <= op.disk_addr
                && op.disk_addr + op.len as u64 <= o.disk_addr + o.len as u64
        }) else {
            continue;
        };
        let (slot, block, _) = ssd_place(read, bs);
        // Cache-store writes that ran after the read, the failed one included (it may have
        // written part of its data).
        if j < at
            && ops[r + 1..(at + 1).min(ops.len())]
                .iter()
                .any(|o| o.kind == OpKind::SsdWrite && ssd_place(o, bs).0 == slot)
        {
            continue; // the write-back completed and the slot holds other data now
        }
        let lo = ((op.disk_addr % bs) / 512) as u32;
        let hi = (lo + op.len / 512).min(spb);
        if e.recompose(slot, op.vm, block, |i, v, d| if (lo..hi).contains(&i) { (true, true) } else { (v, d) }) {
            restored += 1;
        }
    }
    if restored > 0 {
        tracing::warn!(blocks = restored, "write-back did not complete: the blocks stay dirty in the cache");
    }
    restored
}

/// After a client write's backing write failed with the lock released: the sectors it
/// covered leave the cache unless dirty (the backing store did not take the new data;
/// dirty sectors are older acknowledged data the write did not replace in the cache).
pub(super) fn drop_clean(e: &mut Engine, vm: VmId, offset: u64, len: u64) {
    let bs = e.config().block_size;
    if len == 0 {
        return;
    }
    for b in offset / bs..(offset + len).div_ceil(bs) {
        let Some(slot) = e.lookup(vm, b) else { continue };
        let (lo, hi) = sectors_of(offset, len, bs, b);
        e.recompose(slot, vm, b, |i, v, d| if (lo..hi).contains(&i) && !d { (false, false) } else { (v, d) });
    }
}

#[cfg(test)]
mod tests;
