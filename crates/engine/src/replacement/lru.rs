//! Least recently used: a hit moves the block to the front, the victim is the back.

use super::{bump_counter, Replacement};
use crate::slot_table::{List, SlotTable};

/// LRU over one intrusive list.
#[derive(Debug, Clone, Default)]
pub struct Lru {
    list: List,
}

impl Replacement for Lru {
    #[inline]
    fn insert(&mut self, t: &mut SlotTable, s: u32) {
        t.aux[s as usize] = 0;
        self.list.push_front(t, s);
    }
    /// At the cold end: behind the blocks prewarmed before it (more important) and every
    /// block a request brought in.
    fn insert_prewarmed(&mut self, t: &mut SlotTable, s: u32) {
        t.aux[s as usize] = 0;
        self.list.push_back(t, s);
    }
    #[inline]
    fn touch(&mut self, t: &mut SlotTable, s: u32) {
        bump_counter(t, s);
        self.list.move_to_front(t, s);
    }
    fn remove(&mut self, t: &mut SlotTable, s: u32) {
        self.list.unlink(t, s);
    }
    fn replace(&mut self, t: &mut SlotTable, old: u32, new: u32) {
        t.aux[new as usize] = t.aux[old as usize];
        self.list.replace(t, old, new);
    }
    #[inline]
    fn evict(&mut self, t: &mut SlotTable) -> Option<u32> {
        self.list.pop_back(t)
    }
    fn len(&self) -> usize {
        self.list.len() as usize
    }
    fn dump(&self, t: &SlotTable) -> Vec<u32> {
        self.list.iter_from_back(t).collect()
    }
    fn peek_victims(&self, t: &SlotTable, k: usize, out: &mut Vec<u32>) {
        out.extend(self.list.iter_from_back(t).take(k));
    }
}
