//! Rebuilding engine state from persisted metadata (a daemon's warm restart): a block is
//! put back into the very slot whose bytes hold it, with its valid and dirty sectors.
//! Replacement order is not persisted; restored blocks enter their policy in the order
//! they are restored (callers restore in slot order, or oldest first when they know it).

use crate::config::PartitionMode;
use crate::engine::Engine;
use crate::replacement::Replacement;
use crate::slot_table::{pack_key, FREE_KEY};
use cachevisor_trace::VmId;

impl Engine {
    /// Puts `vm`'s `block` into free slot `slot` with the given valid and dirty sectors
    /// (one bool per sector; dirty implies valid). Errors name what is inconsistent: the
    /// block past its vDisk's end (`disk_range.rs`), the slot taken or out of range, the block already cached, no valid sector, a sector
    /// count that is not the block's.
    pub fn restore_slot(
        &mut self,
        slot: u32,
        vm: VmId,
        block: u64,
        valid: &[bool],
        dirty: &[bool],
    ) -> Result<(), String> {
        self.check_blocks(vm, block, 1).map_err(|e| format!("slot {slot}: {e}"))?;
        if slot as u64 >= self.slot_count() {
            return Err(format!("slot {slot} is beyond the pool ({} slots)", self.slot_count()));
        }
        if valid.len() != self.spb as usize || dirty.len() != self.spb as usize {
            return Err(format!("slot {slot}: {} sector flags for {} sectors per block", valid.len(), self.spb));
        }
        if !valid.iter().any(|&v| v) || dirty.iter().zip(valid).any(|(&d, &v)| d && !v) {
            return Err(format!("slot {slot}: no valid sector, or a dirty sector that is not valid"));
        }
        // Past a growable engine's tables: they grow to hold it, the slots between free as
        // in a fresh engine (`growable.rs`) — only for a record that is otherwise sound.
        self.grow_tables(slot + 1, 0);
        if self.slots.key(slot) != FREE_KEY || self.mirrors.is_mirror(slot) {
            return Err(format!("slot {slot} is already in use"));
        }
        self.ensure_vm(vm);
        if self.lookup(vm, block).is_some() {
            return Err(format!("vm {vm} block {block} is cached twice (slot {slot})"));
        }
        let key = pack_key(vm, block);
        // Persistent mode: a slot freed moments ago (a repair puts its block back) is in
        // limbo, not on the free list.
        if !self.dur.take_back(slot) && !self.stores.unpark(slot) && !self.withheld.take_back(slot) {
            // (A withheld slot a failed write-back's repair puts its block back in is
            // still pinned, so never lent out yet; `withhold_step` empties it again.)
            self.free_unlink(slot);
        }
        self.slots.set_key(slot, key);
        self.note(slot);
        self.index.insert(key, slot);
        for (s, (&v, &d)) in valid.iter().zip(dirty).enumerate() {
            let r = (s as u32, s as u32 + 1);
            if v {
                self.valid.set(slot, r);
            }
            if d {
                self.dirty.set(slot, r);
            }
        }
        // The journal may say clean: set (never cleared here — an older record may still
        // say clean; only a durable commit clears it).
        let mut bits = vec![0u64; valid.len().div_ceil(64)];
        for (i, _) in valid.iter().zip(dirty).enumerate().filter(|(_, (&v, &d))| v && !d) {
            bits[i / 64] |= 1 << (i % 64);
        }
        self.dur.vouch(slot, &bits, true);
        self.count_store(vm, slot, 1);
        let p = &mut self.vms[vm as usize];
        p.used += 1;
        if dirty.iter().any(|&d| d) {
            p.dirty_blocks += 1;
        }
        if self.cfg.partition == PartitionMode::Static && p.used > p.target {
            // Never evict restored (possibly dirty) data to honour a target: it grows.
            let t = p.used;
            p.target = t;
            self.with_repl(vm, |r, _| r.set_capacity(t));
        }
        self.with_repl(vm, |r, t| r.insert(t, slot));
        Ok(())
    }
}

impl Engine {
    /// Empties `slot` whatever it holds (dirty sectors included): replaying metadata where
    /// a later record supersedes an earlier one. Returns whether it held a block.
    pub fn release_slot(&mut self, slot: u32) -> bool {
        if self.mirrors.is_mirror(slot) {
            self.drop_mirror_slot(slot);
            return true;
        }
        if slot >= self.present() || self.slots.key(slot) == FREE_KEY {
            return false;
        }
        let vm = crate::slot_table::key_vm(self.slots.key(slot));
        self.invalidate(vm, slot, (0, self.spb));
        true
    }
}

#[cfg(test)]
mod tests {
    use crate::{Engine, EngineConfig, Output};
    use cachevisor_trace::{Op, Request};

    #[test]
    fn restored_blocks_hit_and_keep_their_dirty_sectors() {
        let mut e = Engine::new(EngineConfig::with_slots(16)).unwrap();
        let mut out = Output::default();
        e.set_target(0, 4, &mut out);
        let all = [true; 8];
        let mut dirty = [false; 8];
        dirty[2] = true;
        e.restore_slot(9, 0, 77, &all, &dirty).unwrap();
        e.restore_slot(3, 0, 5, &all, &[false; 8]).unwrap();
        assert!(e.restore_slot(3, 0, 6, &all, &[false; 8]).unwrap_err().contains("in use"));
        assert!(e.restore_slot(4, 0, 5, &all, &[false; 8]).unwrap_err().contains("twice"));
        assert!(e.restore_slot(99, 0, 1, &all, &[false; 8]).unwrap_err().contains("beyond"));
        assert!(e.restore_slot(4, 0, 1, &[false; 8], &[false; 8]).is_err());
        e.check_invariants().unwrap();
        assert_eq!((e.lookup(0, 77), e.partition(0).dirty_blocks, e.partition(0).used), (Some(9), 1, 2));
        e.access(0, &Request { time_ns: 0, vm: 0, op: Op::Read, offset: 77 * 4096, len: 4096 }, &mut out);
        assert!(out.all_hit());
        e.flush(None, &mut out);
        assert_eq!(
            out.ops
                .iter()
                .filter(|o| o.staged && o.kind == crate::OpKind::BackingWrite)
                .map(|o| o.disk_addr)
                .collect::<Vec<_>>(),
            [77 * 4096 + 2 * 512]
        );
    }
}
