//! Two-pool LRU of the Nutanix cache (prewarming slides, "Inside the cache: pools"): a
//! single-touch pool and a multi-touch pool, LRU each, multi-touch larger (80/20 split).
//!
//! A new block enters the single-touch pool; a hit there promotes it to the multi-touch
//! pool; a hit in the multi-touch pool refreshes it. When the multi-touch pool holds more
//! than 80% of the partition's capacity its LRU block is demoted to the front of the
//! single-touch pool; victims come from the single-touch pool's back (from the
//! multi-touch pool only when the single-touch pool is empty). The slides do not say what
//! overflowing the multi-touch pool does; demotion is what Nutanix's unified cache and
//! 2Q-style designs do, stated here as our choice. Bit 4 of the policy byte marks the pool.

use super::Replacement;
use crate::slot_table::{List, SlotTable};

const MULTI: u8 = 1 << 4;

/// Share of capacity for the multi-touch pool, in percent.
pub const MULTI_PERCENT: u64 = 80;

/// Single-touch / multi-touch LRU pools.
#[derive(Debug, Clone, Default)]
pub struct TwoPool {
    single: List,
    multi: List,
    multi_cap: u64,
}

impl Replacement for TwoPool {
    fn insert(&mut self, t: &mut SlotTable, s: u32) {
        t.aux[s as usize] = 0;
        self.single.push_front(t, s);
    }
    /// Prewarming (the slides' "Cache mechanics: prewarming"): into the multi-touch pool
    /// until it is full, then the single-touch pool; behind the blocks loaded before it.
    fn insert_prewarmed(&mut self, t: &mut SlotTable, s: u32) {
        if (self.multi.len() as u64) < self.multi_cap {
            t.aux[s as usize] = MULTI;
            self.multi.push_back(t, s);
        } else {
            t.aux[s as usize] = 0;
            self.single.push_back(t, s);
        }
    }
    fn touch(&mut self, t: &mut SlotTable, s: u32) {
        if t.aux[s as usize] & MULTI != 0 {
            self.multi.move_to_front(t, s);
        } else {
            self.single.unlink(t, s);
            t.aux[s as usize] |= MULTI;
            self.multi.push_front(t, s);
        }
    }
    fn remove(&mut self, t: &mut SlotTable, s: u32) {
        if t.aux[s as usize] & MULTI != 0 {
            self.multi.unlink(t, s);
        } else {
            self.single.unlink(t, s);
        }
    }
    fn replace(&mut self, t: &mut SlotTable, old: u32, new: u32) {
        t.aux[new as usize] = t.aux[old as usize];
        if t.aux[old as usize] & MULTI != 0 {
            self.multi.replace(t, old, new);
        } else {
            self.single.replace(t, old, new);
        }
    }
    fn evict(&mut self, t: &mut SlotTable) -> Option<u32> {
        while self.multi.len() as u64 > self.multi_cap {
            let s = self.multi.pop_back(t)?;
            t.aux[s as usize] &= !MULTI;
            self.single.push_front(t, s);
        }
        match self.single.pop_back(t) {
            Some(s) => Some(s),
            None => self.multi.pop_back(t),
        }
    }
    fn len(&self) -> usize {
        (self.single.len() + self.multi.len()) as usize
    }
    fn set_capacity(&mut self, slots: u64) {
        self.multi_cap = slots * MULTI_PERCENT / 100;
    }
    fn dump(&self, t: &SlotTable) -> Vec<u32> {
        self.single.iter_from_back(t).chain(self.multi.iter_from_back(t)).collect()
    }
    /// The single-touch pool's coldest, then the multi-touch pool's (demotions of an
    /// over-full multi pool are not foreseen).
    fn peek_victims(&self, t: &SlotTable, k: usize, out: &mut Vec<u32>) {
        out.extend(self.single.iter_from_back(t).chain(self.multi.iter_from_back(t)).take(k));
    }
}
