//! S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction", SOSP'23,
//! Algorithm 1): a small FIFO S (10% of capacity), a main FIFO M, and a ghost FIFO G of
//! recently evicted keys (as many as M's capacity), with a 2-bit frequency per block.
//!
//! Insert: into M if the key is in G, else into S. Hit: freq = min(freq + 1, 3).
//! Evict: while S holds at least 10% (or M is empty), take S's tail: freq > 1 moves it to
//! M, otherwise it is the victim and its key enters G. Else take M's tail: freq > 0 gives
//! it another round with freq − 1, otherwise it is the victim. Deviation: freq is kept
//! (not reset) when a block moves from S to M, as in the paper's pseudo-code. Bits 0–1 of
//! the policy byte hold freq, bit 4 marks M. Scan-resistant, so fit for block caches.

use super::Replacement;
use crate::slot_table::{List, SlotTable};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;

const MAIN: u8 = 1 << 4;
const FREQ: u8 = 0b11;

/// S3-FIFO.
#[derive(Debug, Clone, Default)]
pub struct S3Fifo {
    small: List,
    main: List,
    small_cap: u64,
    ghost_cap: usize,
    ghost: VecDeque<(u64, u64)>,
    ghost_gen: FxHashMap<u64, u64>,
    generation: u64,
}

impl S3Fifo {
    fn ghost_take(&mut self, key: u64) -> bool {
        self.ghost_gen.remove(&key).is_some()
    }

    fn ghost_put(&mut self, key: u64) {
        if self.ghost_cap == 0 {
            return;
        }
        self.generation += 1;
        self.ghost_gen.insert(key, self.generation);
        self.ghost.push_back((key, self.generation));
        // Drop stale entries (keys taken back or re-ghosted) at the front, and the oldest
        // live keys while the ghost holds more than its capacity.
        while let Some(&(k, g)) = self.ghost.front() {
            let live = self.ghost_gen.get(&k) == Some(&g);
            if live && self.ghost_gen.len() <= self.ghost_cap {
                break;
            }
            self.ghost.pop_front();
            if live {
                self.ghost_gen.remove(&k);
            }
        }
        // Stale entries behind a live front: compact now and then so memory stays O(cap).
        if self.ghost.len() > 2 * self.ghost_cap + 16 {
            let gens = &self.ghost_gen;
            self.ghost.retain(|(k, g)| gens.get(k) == Some(g));
        }
    }
}

impl Replacement for S3Fifo {
    fn insert(&mut self, t: &mut SlotTable, s: u32) {
        if self.ghost_take(t.key(s)) {
            t.aux[s as usize] = MAIN;
            self.main.push_front(t, s);
        } else {
            t.aux[s as usize] = 0;
            self.small.push_front(t, s);
        }
    }
    #[inline]
    fn touch(&mut self, t: &mut SlotTable, s: u32) {
        let a = &mut t.aux[s as usize];
        if *a & FREQ < 3 {
            *a += 1;
        }
    }
    fn remove(&mut self, t: &mut SlotTable, s: u32) {
        if t.aux[s as usize] & MAIN != 0 {
            self.main.unlink(t, s);
        } else {
            self.small.unlink(t, s);
        }
    }
    fn replace(&mut self, t: &mut SlotTable, old: u32, new: u32) {
        t.aux[new as usize] = t.aux[old as usize];
        if t.aux[old as usize] & MAIN != 0 {
            self.main.replace(t, old, new);
        } else {
            self.small.replace(t, old, new);
        }
    }
    fn evict(&mut self, t: &mut SlotTable) -> Option<u32> {
        loop {
            if !self.small.is_empty() && (self.small.len() as u64 >= self.small_cap || self.main.is_empty()) {
                let s = self.small.pop_back(t)?;
                if t.aux[s as usize] & FREQ > 1 {
                    t.aux[s as usize] |= MAIN;
                    self.main.push_front(t, s);
                } else {
                    self.ghost_put(t.key(s));
                    return Some(s);
                }
            } else {
                let s = self.main.pop_back(t)?;
                let a = &mut t.aux[s as usize];
                if *a & FREQ > 0 {
                    *a -= 1;
                    self.main.push_front(t, s);
                } else {
                    return Some(s);
                }
            }
        }
    }
    fn len(&self) -> usize {
        (self.small.len() + self.main.len()) as usize
    }
    fn set_capacity(&mut self, slots: u64) {
        self.small_cap = (slots / 10).max(1);
        self.ghost_cap = (slots - slots / 10) as usize;
    }
    fn dump(&self, t: &SlotTable) -> Vec<u32> {
        self.small.iter_from_back(t).chain(self.main.iter_from_back(t)).collect()
    }
    /// The small queue's blocks that leave without promotion, then the main queue's with
    /// no frequency left.
    fn peek_victims(&self, t: &SlotTable, k: usize, out: &mut Vec<u32>) {
        let small = self.small.iter_from_back(t).take(4 * k).filter(|&s| t.aux[s as usize] & FREQ <= 1);
        let main = self.main.iter_from_back(t).take(4 * k).filter(|&s| t.aux[s as usize] & FREQ == 0);
        out.extend(small.chain(main).take(k));
    }
}
