//! Where a block's slot comes from: the free list (slots pinned by ops in flight set
//! aside), else a victim of the VM's replacement policy (pinned ones passed over, dirty
//! ones written back first), and how a slot is let go (forgotten, released, evicted).

use crate::engine::{Alloc, Engine};
use crate::output::{Evicted, Output};
use crate::replacement::Replacement;
use crate::slot_table::{key_block, key_vm, FREE_KEY};
use cachevisor_trace::VmId;

/// Pinned victims a miss passes over before it bypasses (`unpinned_victim`), and dirty
/// ones a steal from a paced shrink passes over looking for a clean one (`steal_from`).
const VICTIM_SCAN: usize = 64;
/// Next victims ELICA-Traffic looks at for one of the store a miss wants
/// ([`Engine::traffic_victim`]).
const TRAFFIC_SCAN: usize = 8;

impl Engine {
    /// Forgets a slot's block (already out of its policy): index, bits, owner's count.
    /// The slot is on no list afterwards; the caller reuses it or frees it.
    #[inline]
    pub(crate) fn forget(&mut self, vm: VmId, s: u32) {
        let key = self.slots.key(s);
        if self.ram.on() {
            self.ram.ssd_changed(s);
        }
        self.dur.left_vouched(key, s);
        let slots = &self.slots;
        self.index.remove(key, s, |x| slots.key(x));
        self.slots.set_key(s, FREE_KEY);
        self.note(s);
        self.valid.clear_all(s);
        self.dirty.clear_all(s);
        self.vms[vm as usize].used -= 1;
        self.count_store(vm, s, -1);
        self.prewarmed.end(s);
        self.prefetcher.forgotten(s);
        self.classes.forgotten(s, vm);
        self.shared_budget.forgotten(s);
    }

    /// Returns a slot (already out of its policy) to the free list.
    pub(crate) fn release(&mut self, vm: VmId, s: u32) {
        self.forget(vm, s);
        self.free_slot(s);
    }

    /// Takes a victim from `vm`'s policy (or the shared one), writes it back if dirty and
    /// forgets it. Returns the slot, on no list, for the caller to reuse or free.
    #[inline]
    pub(crate) fn evict_from(&mut self, vm: VmId, sync: bool, out: &mut Output) -> Option<(u32, Evicted)> {
        let mut s = match self.traffic_victim(vm) {
            Some(s) => s,
            None => self.unpinned_victim(vm)?,
        };
        if self.is_protected(s) {
            s = self.unprotected_victim(vm, s);
        }
        let key = self.slots.key(s);
        let owner = key_vm(key);
        let dirty_sectors = self.writeback(owner, s, (0, self.spb), 0, sync, out);
        if dirty_sectors > 0
            && self
                .req
                .blocks
                .is_some_and(|(vm, first, last, _)| owner == vm && (first..=last).contains(&key_block(key)))
        {
            self.req.evicted_dirty.push((key, self.req.phase_base + 2));
        }
        self.forget(owner, s);
        Some((s, Evicted { vm: owner, block: key_block(key), dirty_sectors }))
    }

    /// Whether slot `s` holds a prewarmed block still protected now, or a block of a
    /// pinned I/O class under its cap (`io_class.rs`).
    #[inline]
    fn is_protected(&self, s: u32) -> bool {
        self.prewarmed.protects(s, self.now_ms) || (self.classes.any() && self.class_pinned(s))
    }

    fn class_pinned(&self, s: u32) -> bool {
        let vm = key_vm(self.slots.key(s));
        let partition =
            if self.shared.is_some() { self.slot_count() } else { self.vms.get(vm as usize).map_or(0, |p| p.target) };
        self.classes.pins(s, vm, partition)
    }

    /// `first` is a protected prewarmed block: the next victims (at most [`VICTIM_SCAN`])
    /// are tried for one that is not; the protected ones passed over go back to their
    /// policy as if just used (their protection is that priority). All protected: `first`
    /// is taken after all — protection never makes a miss bypass the cache.
    fn unprotected_victim(&mut self, vm: VmId, first: u32) -> u32 {
        let mut aside = vec![first];
        let mut found = None;
        while aside.len() < VICTIM_SCAN {
            let Some(x) = self.unpinned_victim(vm) else { break };
            if !self.is_protected(x) {
                found = Some(x);
                break;
            }
            aside.push(x);
        }
        let taken = match found {
            Some(x) => x,
            None => aside.remove(0),
        };
        for x in aside {
            self.with_repl(vm, |r, t| r.insert(t, x));
        }
        taken
    }

    /// ELICA-Traffic at a full partition (§3.4): a sequential run's miss takes the VM's
    /// coldest *local* block, a random one its coldest *lent* block, among its next
    /// [`TRAFFIC_SCAN`] victims (`peek_victims`: the others keep their places), so
    /// sequential data stays local and random data goes remote as the partition turns
    /// over, not only while it fills. `None` (take the policy's victim as usual): not a
    /// VM with both stores, traffic-aware turnover off ([`Engine::set_traffic_turnover`]),
    /// or none of the wanted store that close to eviction.
    fn traffic_victim(&mut self, vm: VmId) -> Option<u32> {
        let p = &self.vms[vm as usize];
        // Only a VM holding blocks in both stores has a choice.
        let both = p.held[0] > 0 && p.held[0] < p.used;
        if !self.traffic.turnover() || self.shared.is_some() || !both {
            return None;
        }
        let want_local = self.req.sequential;
        let mut peeked = std::mem::take(&mut self.scratch.peek_buf);
        peeked.clear();
        self.vms[vm as usize].repl.as_ref()?.peek_victims(&self.slots, TRAFFIC_SCAN, &mut peeked);
        let found = peeked.iter().copied().find(|&s| {
            (self.store_of(s) == crate::stores::LOCAL) == want_local && !self.victim_pinned(s) && !self.is_protected(s)
        });
        self.scratch.peek_buf = peeked;
        let s = found?;
        self.with_repl(vm, |r, t| r.remove(t, s));
        Some(s)
    }

    /// Whether slot `s` may not be a victim now: ops in flight on it, or (persistent mode:
    /// any; else one already handled) a block of the request being served.
    #[inline]
    fn victim_pinned(&self, s: u32) -> bool {
        self.flight.pinned(s)
            || self.poisoned(s)
            || self.req.blocks.is_some_and(|(vm, first, last, current)| {
                let k = self.slots.key(s);
                let end = if self.dur.on() { last } else { current };
                key_vm(k) == vm && (first..=end).contains(&key_block(k))
            })
    }

    /// The policy's next victim among slots with no ops in flight (pinned ones it offers
    /// are put back: they are in use right now). `None` when every resident slot is pinned.
    #[inline]
    fn unpinned_victim(&mut self, vm: VmId) -> Option<u32> {
        let s = self.with_repl(vm, |r, t| r.evict(t))?;
        // Persistent mode: no block of the request at all (one it evicted would reach the
        // backing store before the commit freeing its old, vouched-for slot).
        if !self.victim_pinned(s) {
            return Some(s);
        }
        // At most VICTIM_SCAN pinned victims are passed over: when more of the policy's
        // coldest blocks have ops in flight (fills queued behind an overloaded backing
        // store), the new block bypasses rather than every miss scanning them all.
        let mut aside = vec![s];
        let found = loop {
            match self.with_repl(vm, |r, t| r.evict(t)) {
                Some(s) if self.victim_pinned(s) && aside.len() < VICTIM_SCAN => aside.push(s),
                Some(s) if self.victim_pinned(s) => {
                    aside.push(s);
                    break None;
                }
                other => break other,
            }
        };
        for s in aside {
            self.with_repl(vm, |r, t| r.insert(t, s));
        }
        found
    }

    /// Evicts one of `vm`'s blocks (or the shared policy's) for a new block: its slot, or
    /// in persistent mode a durable free one (the victim's goes to limbo); `None` when no
    /// victim can be had, or no durable free slot is left — then nothing is evicted (the
    /// partition keeps its blocks; the new block bypasses the cache — dispatch holds a
    /// miss back instead while slots are on their way back from limbo, `slot_wait.rs`).
    fn victim_slot(&mut self, vm: VmId, sync: bool, out: &mut Output) -> Option<(u32, Option<Evicted>)> {
        self.place_victim(out, |e, out| e.evict_from(vm, sync, out))
    }

    /// [`Self::victim_slot`] with the victim from `evict`.
    #[inline]
    fn place_victim(
        &mut self,
        out: &mut Output,
        evict: impl FnOnce(&mut Engine, &mut Output) -> Option<(u32, Evicted)>,
    ) -> Option<(u32, Option<Evicted>)> {
        if self.dur.on() && !self.free_available() {
            return None;
        }
        let (s, e) = evict(self, out)?;
        if !self.dur.on() {
            return Some((s, Some(e)));
        }
        self.free_slot(s);
        Some((self.take_free()?, Some(e)))
    }

    /// Takes a block from `donor`, a VM above its target after a paced shrink, for another
    /// VM's miss: the first clean one among its policy's next [`VICTIM_SCAN`] victims, so
    /// the miss waits for no write-back to the donor's disk; dirty ones passed over stay
    /// cached and are queued for a background write-back ([`Engine::run_paced_clean`]) that
    /// leaves them clean for later misses. With none clean, the victim is written back first as usual.
    fn steal_from(&mut self, donor: VmId, sync: bool, out: &mut Output) -> Option<(u32, Evicted)> {
        let (found, passed) = self.clean_victim(donor, None);
        self.queue_clean_ahead(donor, passed, found.is_some());
        let Some(s) = found else { return self.evict_from(donor, sync, out) };
        let key = self.slots.key(s);
        self.forget(key_vm(key), s);
        Some((s, Evicted { vm: key_vm(key), block: key_block(key), dirty_sectors: 0 }))
    }

    /// `vm`'s own victim for its miss (routed to a store below its share when it migrates).
    fn own_victim(&mut self, vm: VmId, sync: bool, out: &mut Output) -> Option<(u32, Option<Evicted>)> {
        let (s, evicted) = self.victim_slot(vm, sync, out)?;
        if self.moving.any() && self.vms[vm as usize].migration != crate::MigrationScheme::Off {
            Some((self.promote_to_destination(vm, s), evicted))
        } else {
            Some((s, evicted))
        }
    }

    /// A clean block of paced donor `donor` for another VM's miss, the dirty ones passed
    /// over queued for a background write-back; `None` when none of its next victims is
    /// clean.
    fn steal_clean(&mut self, donor: VmId) -> Option<(u32, Evicted)> {
        let (found, passed) = self.clean_victim(donor, None);
        self.queue_clean_ahead(donor, passed, found.is_some());
        let s = found?;
        let key = self.slots.key(s);
        self.forget(key_vm(key), s);
        Some((s, Evicted { vm: key_vm(key), block: key_block(key), dirty_sectors: 0 }))
    }

    /// Dirty blocks a steal from paced donor `donor` passed over: when write-back ahead of
    /// eviction is on and the steal found a clean block, left to it (the donor's idle
    /// time keeps its next victims clean); else — the donor's disk too busy for that, or
    /// ahead off — queued for a background write-back ([`Engine::run_paced_clean`]), so
    /// the shrink goes on. Measured both ways in docs/policies.md.
    fn queue_clean_ahead(&mut self, donor: VmId, passed: Vec<u32>, found: bool) {
        if self.ahead.on() && found {
            self.ahead_look_at(donor);
            return;
        }
        self.paced_clean.queue(donor, passed);
    }

    /// A block of paced donor `donor` given back ([`Engine::give_back`]): a clean one among
    /// its next [`VICTIM_SCAN`] victims (the dirty ones passed over stay, queued for
    /// nothing), else — when `dirty_ok` — its victim, written back in `out` first.
    pub(crate) fn take_from_paced(&mut self, donor: VmId, dirty_ok: bool, out: &mut Output) -> Option<u32> {
        let (found, _) = self.clean_victim(donor, None);
        match found {
            Some(s) => {
                self.forget(donor, s);
                Some(s)
            }
            None if dirty_ok => self.evict_from(donor, false, out).map(|(s, _)| s),
            None => None,
        }
    }

    /// The first clean block among `donor`'s next [`VICTIM_SCAN`] victims, out of its
    /// policy (`None`: none clean), and the dirty ones passed over (put back, as recent).
    /// `off`: only one on another store than this one (a mirror slot's: `dirty_mirror.rs`).
    fn clean_victim(&mut self, donor: VmId, off: Option<crate::stores::StoreId>) -> (Option<u32>, Vec<u32>) {
        let spb = self.spb;
        let mut passed = Vec::new();
        let mut found = None;
        while passed.len() < VICTIM_SCAN {
            let Some(s) = self.unpinned_victim(donor) else { break };
            if !self.dirty.any(s, (0, spb)) && off.is_none_or(|st| self.store_of(s) != st) {
                found = Some(s);
                break;
            }
            passed.push(s);
        }
        for &s in &passed {
            self.with_repl(donor, |r, t| r.insert(t, s));
        }
        (found, passed)
    }

    /// A clean block of `vm`'s (or the shared policy's) next victims on a working store
    /// other than `off`, out of its policy (the others passed over go back as recent).
    pub(crate) fn clean_victim_off(&mut self, vm: VmId, off: crate::stores::StoreId) -> Option<u32> {
        if self.shared.is_none() && self.vms.get(vm as usize).is_none_or(|p| p.used == 0) {
            return None;
        }
        self.clean_victim(vm, Some(off)).0
    }

    /// A VM above its target after a paced shrink, to take a block from
    /// ([`Engine::set_target_paced`]); stale entries are dropped on the way.
    #[inline]
    pub(crate) fn paced_donor(&mut self) -> Option<VmId> {
        let vms = &self.vms;
        self.shrink.donor(|o| {
            let p = &vms[o as usize];
            p.paced && p.used > p.target
        })
    }

    /// Finds a slot for a new block of `vm` and makes it resident; `None` = bypass.
    #[inline]
    pub(crate) fn allocate(&mut self, vm: VmId, key: u64, sync: bool, out: &mut Output) -> Option<Alloc> {
        // Whether the shared write budget let this block in (taken here, so a miss that
        // finds no slot leaves nothing for a later insert, a prefetch's, to take).
        let governed = self.shared_budget.take_pending();
        if !self.req.mode.insert {
            return None;
        }
        let (used, target) = (self.vms[vm as usize].used, self.vms[vm as usize].target);
        let (slot, evicted) = if self.shared.is_some() {
            match self.take_free() {
                Some(s) => (s, None),
                None => self.victim_slot(vm, sync, out)?,
            }
        } else if target == 0 {
            return None;
        } else if let Some(s) = (used < target).then(|| self.take_free_below_target(vm)).flatten() {
            (s, None)
        } else if let Some(o) = (used < target).then(|| self.paced_donor()).flatten() {
            // A clean block of the donor; with none among its next victims, the VM's own
            // victim (it grows when the donor's queued write-backs left blocks clean,
            // instead of writing one back on this miss's path); a VM with nothing of its
            // own takes the donor's victim, written back first.
            match self.place_victim(out, |e, _| e.steal_clean(o)) {
                Some(x) => x,
                None if used > 0 => self.own_victim(vm, sync, out)?,
                None => self.place_victim(out, |e, out| e.steal_from(o, sync, out))?,
            }
        } else if used > 0 {
            self.own_victim(vm, sync, out)?
        } else {
            return None;
        };
        // A dirty victim's slot is written after its write-back.
        let phase = match evicted {
            Some(e) if e.dirty_sectors > 0 && !self.dur.on() => 2,
            _ => 0,
        };
        self.slots.set_key(slot, key);
        self.classes.inserted(slot, vm, self.req.class);
        self.shared_budget.inserted(slot, governed);
        self.note(slot);
        self.index.insert(key, slot);
        if !self.slots.last_access_ms.is_empty() {
            self.slots.last_access_ms[slot as usize] = self.now_ms;
        }
        self.vms[vm as usize].used += 1;
        self.count_store(vm, slot, 1);
        self.with_repl(vm, |r, t| r.insert(t, slot));
        Some(Alloc { slot, evicted, phase })
    }
}
