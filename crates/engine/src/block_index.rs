//! The block index: which slot holds block (vm, block). A fixed-capacity open-addressing
//! table of 4-byte slot ids with linear probing and backward-shift deletion (Knuth's
//! Algorithm R); the key is not stored in the table but read from the slot table. Each
//! entry also keeps one byte beside it: its probe distance (4 bits), so a deletion shifts
//! entries back without re-reading and re-hashing their keys, and a 4-bit tag of its key's
//! hash, so a lookup reads the slot table's key (a cache miss per probe: most of a
//! cache-model replay's time went to the misses of lookups that found nothing) only for
//! the one entry in 16 whose tag matches by chance, and for the key itself.
//!
//! Hand-written because the general maps store the 8-byte key beside the value and round
//! capacity to powers of two plus a control byte (≈ 10–24 bytes per cached block), while
//! the engine knows its slot count up front: 1.6 entries of 5 bytes per slot = 8 bytes per
//! cached block at a load factor of at most 0.625, which is what lets a 1 TiB SSD at 4 KiB
//! blocks fit in 8 GiB of metadata.

const EMPTY: u32 = u32::MAX;
/// Probe distances this large are not stored; the key is re-hashed instead.
const FAR: u8 = 0x0f;
/// The distance's bits of an entry's byte; the tag is the other four.
const DIST: u8 = 0x0f;

/// Slot ids hashed by the block key of the slot.
#[derive(Debug, Clone)]
pub struct BlockIndex {
    table: Vec<u32>,
    /// Per entry: tag << 4 | probe distance (capped at [`FAR`]).
    meta: Vec<u8>,
}

#[inline]
fn hash(key: u64) -> u64 {
    let k = key ^ (key >> 29);
    let k = k.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let k = k ^ (k >> 32);
    k.wrapping_mul(0x94d0_49bb_1331_11eb)
}

impl BlockIndex {
    /// Whether the index takes `slots` entries at its load factor.
    pub fn fits(&self, slots: usize) -> bool {
        self.table.len() >= (slots + slots * 3 / 5 + 1).max(4)
    }

    /// An index for up to `slots` entries.
    pub fn new(slots: usize) -> Self {
        let cap = (slots + slots * 3 / 5 + 1).max(4);
        BlockIndex { table: vec![EMPTY; cap], meta: vec![0; cap] }
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        self.home_of(hash(key))
    }

    /// The home of a hash: its high bits, scaled to the table.
    #[inline]
    fn home_of(&self, h: u64) -> usize {
        ((h as u128 * self.table.len() as u128) >> 64) as usize
    }

    /// The tag of a hash, in an entry byte's high nibble: bits 32–35, below the home's
    /// (neighbours in a probe run share their high bits).
    #[inline]
    fn tag_of(h: u64) -> u8 {
        ((h >> 32) as u8) << 4
    }

    #[inline]
    fn next(&self, i: usize) -> usize {
        if i + 1 == self.table.len() {
            0
        } else {
            i + 1
        }
    }

    /// Cyclic distance from `from` forward to `to`.
    #[inline]
    fn gap(&self, from: usize, to: usize) -> usize {
        if to >= from {
            to - from
        } else {
            to + self.table.len() - from
        }
    }

    /// The slot holding `key`, where `key_of(slot)` is each slot's key.
    #[inline]
    pub fn get(&self, key: u64, key_of: impl Fn(u32) -> u64) -> Option<u32> {
        let h = hash(key);
        let (mut i, tag) = (self.home_of(h), Self::tag_of(h));
        loop {
            let s = self.table[i];
            if s == EMPTY {
                return None;
            }
            if self.meta[i] & !DIST == tag && key_of(s) == key {
                return Some(s);
            }
            i = self.next(i);
        }
    }

    /// Hints the CPU to load what a lookup of `key` reads first: its home entry and tag
    /// byte (`prefetch.rs`).
    #[inline]
    pub fn prefetch(&self, key: u64) {
        let i = self.home(key);
        crate::prefetch::hint(&self.table[i]);
        crate::prefetch::hint(&self.meta[i]);
    }

    /// Adds `slot` under `key` (the caller guarantees the key is absent).
    #[inline]
    pub fn insert(&mut self, key: u64, slot: u32) {
        let h = hash(key);
        let mut i = self.home_of(h);
        let mut d = 0usize;
        while self.table[i] != EMPTY {
            i = self.next(i);
            d += 1;
        }
        self.table[i] = slot;
        self.meta[i] = Self::tag_of(h) | d.min(FAR as usize) as u8;
    }

    /// Removes `key` (held by `slot`); `key_of` must still give every entry's key.
    pub fn remove(&mut self, key: u64, slot: u32, key_of: impl Fn(u32) -> u64) {
        let mut i = self.home(key);
        while self.table[i] != slot {
            debug_assert!(self.table[i] != EMPTY, "removing an absent key");
            i = self.next(i);
        }
        // Pull later entries of the probe run back into the hole when their home allows.
        let mut hole = i;
        let mut j = self.next(i);
        loop {
            let s = self.table[j];
            if s == EMPTY {
                break;
            }
            let d = match self.meta[j] & DIST {
                FAR => self.gap(self.home(key_of(s)), j),
                d => d as usize,
            };
            let gap = self.gap(hole, j);
            if d >= gap {
                self.table[hole] = s;
                self.meta[hole] = (self.meta[j] & !DIST) | (d - gap).min(FAR as usize) as u8;
                hole = j;
            }
            j = self.next(j);
        }
        self.table[hole] = EMPTY;
        self.meta[hole] = 0;
    }

    /// Bytes of memory held.
    pub fn memory_bytes(&self) -> usize {
        self.table.capacity() * 4 + self.meta.capacity()
    }

    /// Entries, counted by a full scan (for invariant checks).
    pub fn count(&self) -> usize {
        self.table.iter().filter(|&&s| s != EMPTY).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn long_probe_runs_past_the_stored_distance() {
        // 300 keys with one home: distances of 15 and beyond take the re-hash path.
        let slots = 400usize;
        let mut idx = BlockIndex::new(slots);
        let target = idx.home(0);
        let colliding: Vec<u64> = (0u64..).filter(|&k| idx.home(k) == target).take(300).collect();
        let mut keys = vec![u64::MAX; slots];
        for (s, &k) in colliding.iter().enumerate() {
            keys[s] = k;
            idx.insert(k, s as u32);
        }
        // Remove every other key from the front of the run, checking all lookups each time.
        for s in (0..300).step_by(2) {
            idx.remove(colliding[s], s as u32, |x| keys[x as usize]);
            keys[s] = u64::MAX;
            for (t, &k) in colliding.iter().enumerate() {
                let want = (keys[t] != u64::MAX).then_some(t as u32);
                assert_eq!(idx.get(k, |x| keys[x as usize]), want);
            }
        }
    }

    proptest! {
        #[test]
        fn behaves_like_a_map(ops in prop::collection::vec((any::<bool>(), 0u64..64), 1..400)) {
            let slots = 40usize;
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
