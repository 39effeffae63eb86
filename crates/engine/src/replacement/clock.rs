//! CLOCK with a 4-bit reference counter per block, as S-CAVE manages each private pool
//! (S-CAVE §III "cache monitor", §V-D: counter of 4 bits, reset to 0 when a block is
//! reloaded, incremented on each hit and saturating at 15).
//!
//! The clock is the list read from the back: the back is the hand. To find a victim the
//! hand looks at the block under it; a counter of 0 makes it the victim, otherwise the
//! counter is decremented (generalized CLOCK) and the hand advances (the block moves to
//! the front, i.e. just behind the hand). New blocks enter just behind the hand with
//! counter 0. The counter lives in bits 0–3 of the slot's policy byte, where S-CAVE's rECS
//! sampling and global cleaner read it.

use super::Replacement;
use crate::slot_table::{List, SlotTable};

/// Largest counter value (4 bits).
pub const MAX_COUNTER: u8 = 15;

/// CLOCK (GCLOCK) with 4-bit counters.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    ring: List,
}

impl Replacement for Clock {
    #[inline]
    fn insert(&mut self, t: &mut SlotTable, s: u32) {
        t.aux[s as usize] = 0;
        self.ring.push_front(t, s);
    }
    #[inline]
    fn touch(&mut self, t: &mut SlotTable, s: u32) {
        let c = &mut t.aux[s as usize];
        if *c < MAX_COUNTER {
            *c += 1;
        }
    }
    fn remove(&mut self, t: &mut SlotTable, s: u32) {
        self.ring.unlink(t, s);
    }
    fn replace(&mut self, t: &mut SlotTable, old: u32, new: u32) {
        t.aux[new as usize] = t.aux[old as usize];
        self.ring.replace(t, old, new);
    }
    fn evict(&mut self, t: &mut SlotTable) -> Option<u32> {
        loop {
            let s = self.ring.back()?;
            let c = &mut t.aux[s as usize];
            if *c == 0 {
                self.ring.unlink(t, s);
                return Some(s);
            }
            *c -= 1;
            self.ring.unlink(t, s);
            self.ring.push_front(t, s);
        }
    }
    fn len(&self) -> usize {
        self.ring.len() as usize
    }
    fn dump(&self, t: &SlotTable) -> Vec<u32> {
        self.ring.iter_from_back(t).collect()
    }
    fn peek_victims(&self, t: &SlotTable, k: usize, out: &mut Vec<u32>) {
        out.extend(self.ring.iter_from_back(t).take(4 * k).filter(|&s| t.aux[s as usize] == 0).take(k));
    }
}
