//! The slabs of SymFlex's Fatcache use (§4.2), pure: a key-value cache whose slabs are
//! the vSSD's blocks. Each slab is one block cut into equal slots of one class (slot
//! sizes double from 512 bytes to the block size, so every slot is sector-aligned for an
//! O_DIRECT vSSD; Fatcache grows its classes by 1.25); an item goes in a slot of the
//! smallest class it fits. Slabs are on one of §4.2's lists: free (valid, unused),
//! open (the one slab of a class being filled), full (filled, oldest first), or — not
//! held — invalid. A class that needs a slab takes a free one, else evicts the oldest full
//! slab of any class (Fatcache's slab eviction: the items in it are dropped). A deflate
//! gives free slabs first, then slabs whose items were all deleted or replaced, then the
//! oldest full ones, then open ones. Keys are indexed in memory, as Fatcache does.

use crate::block_cache::Lbn;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

/// The smallest slot.
pub const MIN_SLOT: u64 = 512;

/// Where an item is: its slab, slot and length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemAt {
    /// The slab (vSSD block).
    pub lbn: Lbn,
    /// The slot in it.
    pub slot: u32,
    /// The item's bytes.
    pub len: u32,
}

/// A slab in use.
#[derive(Debug, Clone)]
struct Slab {
    class: usize,
    /// The key in each slot used so far (None: deleted or replaced).
    slots: Vec<Option<Vec<u8>>>,
    live: u32,
}

/// The slab table.
#[derive(Debug, Clone)]
pub struct SlabTable {
    block: u64,
    /// Slot size of each class.
    classes: Vec<u64>,
    free: BTreeSet<Lbn>,
    slabs: BTreeMap<Lbn, Slab>,
    /// Per class, the slab being filled.
    open: Vec<Option<Lbn>>,
    /// Filled slabs, oldest first.
    full: VecDeque<Lbn>,
    index: HashMap<Vec<u8>, ItemAt>,
}

impl SlabTable {
    /// A table over blocks of `block` bytes, holding the `valid` ones (all free).
    pub fn new(block: u64, valid: &[Lbn]) -> SlabTable {
        let mut classes = Vec::new();
        let mut size = MIN_SLOT.min(block);
        while size <= block {
            classes.push(size);
            size *= 2;
        }
        SlabTable {
            block,
            open: vec![None; classes.len()],
            classes,
            free: valid.iter().copied().collect(),
            slabs: BTreeMap::new(),
            full: VecDeque::new(),
            index: HashMap::new(),
        }
    }

    /// The slot size an item of `len` bytes takes (None: larger than a slab).
    pub fn slot_size(&self, len: u64) -> Option<u64> {
        self.classes.iter().copied().find(|&s| s >= len)
    }

    /// Where `key`'s item is.
    pub fn get(&self, key: &[u8]) -> Option<ItemAt> {
        self.index.get(key).copied()
    }

    /// The byte offset of `at` on the vSSD.
    pub fn offset(&self, at: ItemAt) -> u64 {
        let class = self.slabs[&at.lbn].class;
        u64::from(at.lbn) * self.block + u64::from(at.slot) * self.classes[class]
    }

    /// Items held.
    pub fn items(&self) -> usize {
        self.index.len()
    }

    /// Free slabs (valid, unused).
    pub fn free_slabs(&self) -> usize {
        self.free.len()
    }

    /// Blocks held (valid).
    pub fn valid(&self) -> usize {
        self.free.len() + self.slabs.len()
    }

    /// The blocks held, ascending.
    pub fn valid_lbns(&self) -> Vec<Lbn> {
        let mut v: Vec<Lbn> = self.free.iter().chain(self.slabs.keys()).copied().collect();
        v.sort_unstable();
        v
    }

    /// Forgets `key`'s item (its slot stays used until its slab is reused).
    pub fn delete(&mut self, key: &[u8]) -> bool {
        let Some(at) = self.index.remove(key) else { return false };
        let slab = self.slabs.get_mut(&at.lbn).expect("an indexed item's slab is held");
        slab.slots[at.slot as usize] = None;
        slab.live -= 1;
        true
    }

    /// A slot for `key`'s item of `len` bytes (any older item of the key forgotten), and
    /// the keys evicted to make room; None when it is larger than a slab or no block is
    /// held.
    pub fn put(&mut self, key: &[u8], len: u64) -> Option<(ItemAt, Vec<Vec<u8>>)> {
        self.delete(key);
        let class = self.classes.iter().position(|&s| s >= len)?;
        let per_slab = (self.block / self.classes[class]) as usize;
        let mut evicted = Vec::new();
        let lbn = match self.open[class] {
            Some(l) => l,
            None => {
                let l = match self.free.pop_first() {
                    Some(l) => l,
                    None => {
                        let victim = self.full.pop_front().or_else(|| self.open.iter().flatten().next().copied())?;
                        evicted = self.drop_slab(victim);
                        victim
                    }
                };
                self.slabs.insert(l, Slab { class, slots: Vec::with_capacity(per_slab), live: 0 });
                self.open[class] = Some(l);
                l
            }
        };
        let slab = self.slabs.get_mut(&lbn).expect("the open slab is held");
        let slot = slab.slots.len() as u32;
        slab.slots.push(Some(key.to_vec()));
        slab.live += 1;
        if slab.slots.len() == per_slab {
            self.open[class] = None;
            self.full.push_back(lbn);
        }
        let at = ItemAt { lbn, slot, len: len as u32 };
        self.index.insert(key.to_vec(), at);
        Some((at, evicted))
    }

    /// Removes slab `lbn` from every list and its items from the index: their keys.
    fn drop_slab(&mut self, lbn: Lbn) -> Vec<Vec<u8>> {
        let Some(slab) = self.slabs.remove(&lbn) else { return Vec::new() };
        if self.open[slab.class] == Some(lbn) {
            self.open[slab.class] = None;
        }
        self.full.retain(|&l| l != lbn);
        let keys: Vec<Vec<u8>> = slab.slots.into_iter().flatten().collect();
        for k in &keys {
            self.index.remove(k);
        }
        keys
    }

    /// New valid blocks: free slabs.
    pub fn inflate(&mut self, lbns: &[Lbn]) {
        for &l in lbns {
            if !self.slabs.contains_key(&l) {
                self.free.insert(l);
            }
        }
    }

    /// Blocks gone (taken by the host, the vSSD removed): their items are dropped; the
    /// keys dropped.
    pub fn lost(&mut self, lbns: &[Lbn]) -> Vec<Vec<u8>> {
        let mut keys = Vec::new();
        for &l in lbns {
            self.free.remove(&l);
            keys.extend(self.drop_slab(l));
        }
        keys
    }

    /// Picks up to `n` slabs to give back (§4.2's order: free, emptied, oldest full, open),
    /// drops their items and stops holding them: the blocks and the keys dropped.
    pub fn release(&mut self, n: u32) -> (Vec<Lbn>, Vec<Vec<u8>>) {
        let n = n as usize;
        let mut out: Vec<Lbn> = Vec::new();
        while out.len() < n {
            let Some(l) = self.free.pop_first() else { break };
            out.push(l);
        }
        let emptied: Vec<Lbn> = self.slabs.iter().filter(|(_, s)| s.live == 0).map(|(&l, _)| l).collect();
        let oldest_full = self.full.iter().copied();
        let open: Vec<Lbn> = self.open.iter().flatten().copied().collect();
        let mut order: Vec<Lbn> = emptied;
        order.extend(oldest_full.filter(|l| !order.contains(l)).collect::<Vec<_>>());
        order.extend(open.into_iter().filter(|l| !order.contains(l)).collect::<Vec<_>>());
        let mut keys = Vec::new();
        for l in order.into_iter().take(n - out.len()) {
            keys.extend(self.drop_slab(l));
            out.push(l);
        }
        out.sort_unstable();
        (out, keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_go_in_the_smallest_class_and_a_full_table_evicts_the_oldest_slab() {
        let mut t = SlabTable::new(4096, &[0, 1]);
        assert_eq!(t.slot_size(100), Some(512));
        assert_eq!(t.slot_size(513), Some(1024));
        assert_eq!(t.slot_size(4097), None);
        // Eight 512-byte items fill slab 0; the ninth opens slab 1.
        for i in 0..9u8 {
            let (at, ev) = t.put(&[i], 500).unwrap();
            assert!(ev.is_empty());
            assert_eq!(at.lbn, if i < 8 { 0 } else { 1 });
        }
        assert_eq!(t.offset(t.get(&[3]).unwrap()), 3 * 512);
        // A 2 KiB item needs a slab of its class: none free, so the oldest full (0) goes.
        let (at, ev) = t.put(b"big", 2000).unwrap();
        assert_eq!(at.lbn, 0);
        assert_eq!(ev.len(), 8);
        assert!(t.get(&[0]).is_none() && t.get(&[8]).is_some());
        assert_eq!(t.offset(at), 0);
    }

    #[test]
    fn a_deflate_gives_free_then_emptied_then_oldest_full_slabs() {
        let mut t = SlabTable::new(1024, &[0, 1, 2, 3, 4]);
        // Slab 0: a, b (full); slab 1: c, d (full); slab 2: e (open).
        for k in [b"a", b"b", b"c", b"d", b"e"] {
            t.put(k, 400).unwrap();
        }
        t.delete(b"c");
        t.delete(b"d"); // slab 1 emptied
        let (l, keys) = t.release(2);
        assert_eq!((l, keys.len()), (vec![3, 4], 0), "free slabs first");
        let (l, keys) = t.release(1);
        assert_eq!((l, keys.len()), (vec![1], 0), "then the emptied one");
        let (l, keys) = t.release(1);
        assert_eq!((l, keys), (vec![0], vec![b"a".to_vec(), b"b".to_vec()]), "then the oldest full one");
        let (l, keys) = t.release(5);
        assert_eq!((l, keys), (vec![2], vec![b"e".to_vec()]));
        assert_eq!((t.valid(), t.items()), (0, 0));
        assert!(t.put(b"x", 10).is_none(), "no block held: nothing stored");
        t.inflate(&[7]);
        assert_eq!(t.put(b"x", 10).unwrap().0.lbn, 7);
    }

    #[test]
    fn a_replaced_item_frees_its_old_slot_and_lost_blocks_drop_their_items() {
        let mut t = SlabTable::new(1024, &[0, 1]);
        t.put(b"k", 400).unwrap();
        t.put(b"j", 400).unwrap();
        let (at, _) = t.put(b"k", 400).unwrap();
        assert_eq!((at.lbn, at.slot), (1, 0));
        assert_eq!(t.items(), 2);
        assert_eq!(t.lost(&[1]), vec![b"k".to_vec()]);
        assert_eq!(t.get(b"k"), None);
        assert_eq!(t.valid_lbns(), vec![0]);
    }
}
