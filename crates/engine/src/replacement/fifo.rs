//! First in, first out: hits change nothing, the victim is the oldest insertion.

use super::{bump_counter, Replacement};
use crate::slot_table::{List, SlotTable};

/// FIFO over one intrusive list.
#[derive(Debug, Clone, Default)]
pub struct Fifo {
    list: List,
}

impl Replacement for Fifo {
    #[inline]
    fn insert(&mut self, t: &mut SlotTable, s: u32) {
        t.aux[s as usize] = 0;
        self.list.push_front(t, s);
    }
    #[inline]
    fn touch(&mut self, t: &mut SlotTable, s: u32) {
        bump_counter(t, s);
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
