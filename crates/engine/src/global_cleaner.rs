//! S-CAVE's global cleaner (S-CAVE §V-B): keeps a reserve of free slots so a VM granted
//! more space finds free blocks at once. It scans the whole pool (not one VM's private
//! pool) from where it last stopped and reclaims blocks whose reference counter is 0,
//! whoever owns them; a block with a non-zero counter has it decremented and is passed
//! over, as a CLOCK hand does, so repeated passes always find victims. It runs only with
//! CLOCK replacement, whose 4-bit counters it reads (bits 0–3 of the policy byte).

use crate::config::PartitionMode;
use crate::engine::Engine;
use crate::output::Output;
use crate::replacement::{clock::MAX_COUNTER, Replacement, ReplacementKind};
use crate::slot_table::{key_vm, FREE_KEY};

impl Engine {
    /// Reclaims unreferenced blocks of any VM until `free_goal` slots are free (or every
    /// counter has been aged to 0 and taken). Dirty victims are written back first
    /// (background ops in `out`). Returns the slots reclaimed. Needs CLOCK replacement and
    /// static partitions; otherwise it does nothing and returns 0.
    pub fn clean(&mut self, free_goal: u64, out: &mut Output) -> u64 {
        out.clear();
        if self.cfg.replacement != ReplacementKind::Clock || self.cfg.partition != PartitionMode::Static {
            return 0;
        }
        let n = self.slots.len() as u32;
        let goal = free_goal.min(n as u64);
        let mut reclaimed = 0;
        // Counters are at most 15, so 16 passes age every block to 0.
        let mut budget = n as u64 * (MAX_COUNTER as u64 + 1);
        while self.free_slots() < goal && budget > 0 {
            budget -= 1;
            let s = self.cleaner_hand;
            self.cleaner_hand = (s + 1) % n;
            let key = self.slots.key(s);
            if key == FREE_KEY || self.flight.pinned(s) {
                continue;
            }
            let counter = &mut self.slots.aux[s as usize];
            if *counter & 0x0f != 0 {
                *counter -= 1;
                continue;
            }
            let owner = key_vm(key);
            self.writeback(owner, s, (0, self.spb), 0, false, out);
            self.with_repl(owner, |r, t| r.remove(t, s));
            self.release(owner, s);
            reclaimed += 1;
        }
        reclaimed
    }
}

#[cfg(test)]
mod tests {
    use crate::{Engine, EngineConfig, Output, ReplacementKind};
    use cachevisor_trace::{Op, Request};

    fn read(e: &mut Engine, vm: u32, block: u64) {
        let mut out = Output::default();
        e.access(0, &Request { time_ns: 0, vm, op: Op::Read, offset: block * 4096, len: 4096 }, &mut out);
    }

    #[test]
    fn reclaims_unreferenced_blocks_of_any_vm_and_keeps_hot_ones() {
        let mut e =
            Engine::new(EngineConfig { replacement: ReplacementKind::Clock, ..EngineConfig::with_slots(20) }).unwrap();
        let mut out = Output::default();
        e.set_target(0, 20, &mut out);
        e.set_target(1, 20, &mut out);
        for b in 0..10 {
            read(&mut e, 0, b);
            read(&mut e, 1, b);
        }
        // VM 0's blocks 0..8 and VM 1's 0..2 are hit twice: counters 2.
        for _ in 0..2 {
            (0..8).for_each(|b| read(&mut e, 0, b));
            (0..2).for_each(|b| read(&mut e, 1, b));
        }
        assert_eq!(e.free_slots(), 0);
        assert_eq!(e.clean(10, &mut out), 10);
        e.check_invariants().unwrap();
        // The 10 cold blocks went, whoever owned them: VM 0 keeps 8, VM 1 keeps 2.
        assert_eq!((e.partition(0).used, e.partition(1).used), (8, 2));
        assert!((0..8).all(|b| e.lookup(0, b).is_some()));
        // Asking for everything ages the hot blocks to 0 and takes them too.
        assert_eq!(e.clean(20, &mut out), 10);
        assert_eq!(e.free_slots(), 20);
    }
}
