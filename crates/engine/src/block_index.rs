//! The block index: which slot holds block (vm, block). A fixed-capacity open-addressing
//! table of 4-byte slot ids with linear probing and backward-shift deletion; the key is
//! not stored in the table but read from the slot table.
//!
//! Hand-written because the general maps store the 8-byte key beside the value and round
//! capacity to powers of two plus a control byte (≈ 10–24 bytes per cached block), while
//! the engine knows its slot count up front: 2 entries of 4 bytes per slot = 8 bytes per
//! cached block at a load factor of at most 0.5 (short probe runs, cheap deletions), which
//! is what lets a 1 TiB SSD at 4 KiB blocks fit in 8 GiB of metadata.

const EMPTY: u32 = u32::MAX;

/// Slot ids hashed by the block key of the slot.
#[derive(Debug, Clone)]
pub struct BlockIndex {
    table: Vec<u32>,
}

#[inline]
fn hash(key: u64) -> u64 {
    let k = key ^ (key >> 29);
    let k = k.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let k = k ^ (k >> 32);
    k.wrapping_mul(0x94d0_49bb_1331_11eb)
}

impl BlockIndex {
    /// An index for up to `slots` entries.
    pub fn new(slots: usize) -> Self {
        let cap = (2 * slots + 1).max(4);
        BlockIndex { table: vec![EMPTY; cap] }
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        ((hash(key) as u128 * self.table.len() as u128) >> 64) as usize
    }

    #[inline]
    fn next(&self, i: usize) -> usize {
        if i + 1 == self.table.len() {
            0
        } else {
            i + 1
        }
    }

    /// The slot holding `key`, where `key_of(slot)` is each slot's key.
    #[inline]
    pub fn get(&self, key: u64, key_of: impl Fn(u32) -> u64) -> Option<u32> {
        let mut i = self.home(key);
        loop {
            let s = self.table[i];
            if s == EMPTY {
                return None;
            }
            if key_of(s) == key {
                return Some(s);
            }
            i = self.next(i);
        }
    }

    /// Adds `slot` under `key` (the caller guarantees the key is absent).
    #[inline]
    pub fn insert(&mut self, key: u64, slot: u32) {
        let mut i = self.home(key);
        while self.table[i] != EMPTY {
            i = self.next(i);
        }
        self.table[i] = slot;
    }

    /// Removes `key` (held by `slot`); `key_of` must still give every entry's key.
    pub fn remove(&mut self, key: u64, slot: u32, key_of: impl Fn(u32) -> u64) {
        let mut i = self.home(key);
        while self.table[i] != slot {
            debug_assert!(self.table[i] != EMPTY, "removing an absent key");
            i = self.next(i);
        }
        // Backward-shift: pull later entries of the probe run into the hole.
        let mut hole = i;
        let mut j = self.next(i);
        loop {
            let s = self.table[j];
            if s == EMPTY {
                break;
            }
            let h = self.home(key_of(s));
            // Can the entry at j live at `hole`? Yes if its home is not in (hole, j] cyclically.
            let movable = if hole <= j { h <= hole || h > j } else { h <= hole && h > j };
            if movable {
                self.table[hole] = s;
                hole = j;
            }
            j = self.next(j);
        }
        self.table[hole] = EMPTY;
    }

    /// Bytes of memory held.
    pub fn memory_bytes(&self) -> usize {
        self.table.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        #[test]
        fn behaves_like_a_map(ops in prop::collection::vec((any::<bool>(), 0u64..64), 1..400)) {
            let slots = 32usize;
            let mut idx = BlockIndex::new(slots);
            let mut keys = vec![u64::MAX; slots];
            let mut free: Vec<u32> = (0..slots as u32).collect();
            let mut model: HashMap<u64, u32> = HashMap::new();
            for (ins, key) in ops {
                if ins && !model.contains_key(&key) && !free.is_empty() {
                    let s = free.pop().unwrap();
                    keys[s as usize] = key;
                    idx.insert(key, s);
                    model.insert(key, s);
                } else if let Some(s) = model.remove(&key) {
                    idx.remove(key, s, |x| keys[x as usize]);
                    keys[s as usize] = u64::MAX;
                    free.push(s);
                }
                for k in 0..64 {
                    prop_assert_eq!(idx.get(k, |x| keys[x as usize]), model.get(&k).copied());
                }
            }
        }
    }
}
