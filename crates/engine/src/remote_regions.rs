//! Cache other nodes of a cluster lend this engine (ELICA §3.1, `EngineConfig::remote`):
//! which region a slot is in, a free list per store (the local one and each lent region),
//! each VM's share of each lender's region (Eq. 4's c_remote, split by lender), and which
//! free slot a VM below its target takes: local or a region where it is below its share,
//! ELICA-Traffic's choice when both are (§3.4: a sequential run local, the rest lent).
//!
//! A VM with no share of a region never takes its slots (they are for the VMs they were
//! lent to); at its target a VM's misses replace its own blocks of any kind, so its
//! shares hold. Hand-written: bookkeeping over the engine's own slot lists.

use crate::engine::Engine;
use crate::slot_table::{List, SlotTable};
use cachevisor_trace::VmId;

/// Where a slot lives: `None` the local cache store, `Some(r)` lent region `r`.
pub(crate) type Store = Option<usize>;

impl Engine {
    /// The lent region slot `s` is in (`None`: local).
    #[inline]
    pub(crate) fn region_of(&self, s: u32) -> Store {
        let s = s as u64;
        if s < self.cfg.slots {
            return None;
        }
        Some(self.region_starts.partition_point(|&start| start <= s) - 1)
    }

    /// `store`'s free list, with the slot table its links live in.
    fn list(&mut self, store: Store) -> (&mut List, &mut SlotTable) {
        let list = match store {
            None => &mut self.free,
            Some(r) => &mut self.free_remote[r],
        };
        (list, &mut self.slots)
    }

    /// Puts a free slot at the back of its store's free list.
    pub(crate) fn free_push_back(&mut self, s: u32) {
        let (list, slots) = self.list(self.region_of(s));
        list.push_back(slots, s);
    }

    /// Puts a free slot at the front of its store's free list.
    pub(crate) fn free_push_front(&mut self, s: u32) {
        let (list, slots) = self.list(self.region_of(s));
        list.push_front(slots, s);
    }

    /// Takes a slot off its store's free list.
    pub(crate) fn free_unlink(&mut self, s: u32) {
        let (list, slots) = self.list(self.region_of(s));
        list.unlink(slots, s);
    }

    /// Takes a free slot with no ops in flight (a slot freed while its write-back runs is
    /// pinned until it ends): a local one first, else a lent one (shared mode).
    #[inline]
    pub(crate) fn take_free(&mut self) -> Option<u32> {
        if let Some(s) = self.take_free_of(None) {
            return Some(s);
        }
        (0..self.free_remote.len()).find_map(|r| self.take_free_of(Some(r)))
    }

    /// Takes a free slot of `store`.
    #[inline]
    pub(crate) fn take_free_of(&mut self, store: Store) -> Option<u32> {
        self.park_pinned_free();
        let (list, slots) = self.list(store);
        let s = list.front()?;
        list.unlink(slots, s);
        Some(s)
    }

    /// Whether a free slot with no ops in flight is left.
    pub(crate) fn free_available(&mut self) -> bool {
        self.park_pinned_free();
        self.free.front().is_some() || self.free_remote.iter().any(|l| l.front().is_some())
    }

    /// Moves pinned slots at the front of the free lists aside ([`Engine::parked`]).
    pub(crate) fn park_pinned_free(&mut self) {
        while let Some(s) = self.free.front().filter(|&s| self.flight.pinned(s)) {
            self.free.unlink(&mut self.slots, s);
            self.parked.insert(s);
        }
        for r in 0..self.free_remote.len() {
            while let Some(s) = self.free_remote[r].front().filter(|&s| self.flight.pinned(s)) {
                self.free_remote[r].unlink(&mut self.slots, s);
                self.parked.insert(s);
            }
        }
    }

    /// The store whose free slot a VM below its target takes now, if one is free: local
    /// while its local part is below its share, a lent region while it is below its share
    /// there; when both are open, ELICA-Traffic's choice (a sequential run local).
    pub(crate) fn free_kind_for(&mut self, vm: VmId) -> Option<Store> {
        self.park_pinned_free();
        if self.cfg.remote.is_empty() {
            return self.free.front().map(|_| None);
        }
        let p = &self.vms[vm as usize];
        let remote_total = p.remote_target.min(p.target);
        let local_ok = p.used - p.remote_used < p.target - remote_total
            && self.free.front().is_some()
            && self.local_used < self.local_limit;
        let region = (p.remote_used < remote_total)
            .then(|| {
                (0..self.free_remote.len()).find(|&r| {
                    p.remote_used_by[r] < p.remote_shares[r]
                        && self.free_remote[r].front().is_some()
                        && self.region_used[r] < self.region_limit[r]
                })
            })
            .flatten();
        match (local_ok, region) {
            (true, Some(r)) => Some(if self.req_sequential && self.traffic_aware { None } else { Some(r) }),
            (true, None) => Some(None),
            (false, Some(r)) => Some(Some(r)),
            (false, None) => None,
        }
    }

    /// A free slot for a VM below its target ([`Self::free_kind_for`]).
    pub(crate) fn take_free_below_target(&mut self, vm: VmId) -> Option<u32> {
        let store = self.free_kind_for(vm)?;
        self.take_free_of(store)
    }

    /// Counts slot `s` in or out of `vm`'s lent slots (`delta` ±1).
    #[inline]
    pub(crate) fn count_store(&mut self, vm: VmId, s: u32, delta: i64) {
        match self.region_of(s) {
            Some(r) => {
                let p = &mut self.vms[vm as usize];
                p.remote_used = p.remote_used.wrapping_add_signed(delta);
                p.remote_used_by[r] = p.remote_used_by[r].wrapping_add_signed(delta);
                self.region_used[r] = self.region_used[r].wrapping_add_signed(delta);
            }
            None => self.local_used = self.local_used.wrapping_add_signed(delta),
        }
    }

    /// Slots in use in the local store (every VM's).
    pub fn used_local(&self) -> u64 {
        self.local_used
    }

    /// Caps the slots this engine's VMs may hold in the local store: in a cluster, the
    /// node's SSD less what its borrowers hold in the regions it lent them (`u64::MAX`: no
    /// cap, the default). A VM below its target at the cap takes a block from a VM above
    /// its own (paced) or replaces one of its own, as with no free slot.
    pub fn set_local_limit(&mut self, slots: u64) {
        self.local_limit = slots;
    }

    /// Slots in use in the region `lender` lent this engine (every VM's; 0 when it lent
    /// none): what this engine holds on that node's SSD.
    pub fn used_in_region(&self, lender: u16) -> u64 {
        self.region_index(lender).map_or(0, |r| self.region_used[r])
    }

    /// Slots the VMs' shares of `lender`'s region still lack (their shares less what they
    /// hold there, summed over the VMs below theirs).
    pub fn region_shortfall(&self, lender: u16) -> u64 {
        match self.region_index(lender) {
            Some(r) => self.vms.iter().map(|p| p.remote_shares[r].saturating_sub(p.remote_used_by[r])).sum(),
            None => 0,
        }
    }

    /// Caps the slots this engine may hold in `lender`'s region (every VM's together): the
    /// space that node has free for it now. A driver that shares one SSD between a
    /// lender's own VMs and its borrowers sets it, so the two never hold more than the
    /// SSD (`u64::MAX`: no cap, the default). Slots held above a lowered cap stay; new
    /// blocks stop taking free ones.
    pub fn set_region_limit(&mut self, lender: u16, slots: u64) {
        if let Some(r) = self.region_index(lender) {
            self.region_limit[r] = slots;
        }
    }

    fn region_index(&self, lender: u16) -> Option<usize> {
        self.cfg.remote.iter().position(|x| x.node == lender)
    }

    /// Whether region `r` is below its cap ([`Self::set_region_limit`]).
    #[inline]
    pub(crate) fn region_open(&self, r: usize) -> bool {
        self.region_used[r] < self.region_limit[r]
    }

    /// Whether ELICA-Traffic's choice is on (default): a sequential run takes local slots
    /// first when both kinds are open; off (ELICA-Load), lent ones first like the rest.
    pub fn set_traffic_aware(&mut self, on: bool) {
        self.traffic_aware = on;
    }

    /// Whether ELICA-Traffic's choice also applies as a full partition turns over (off by
    /// default): a sequential miss then replaces the VM's coldest local block, a random
    /// one its coldest lent block, among its next 8 victims, instead of the policy's
    /// victim wherever it is (docs/cluster.md measures both).
    pub fn set_traffic_turnover(&mut self, on: bool) {
        self.traffic_turnover = on;
    }

    /// Sets `vm`'s shares of the regions other nodes lent, by lender node id (ELICA's
    /// c_remote split by lender; at most its target in all — the rest of it is local). A
    /// lender this engine has no region of is refused by name; lenders not listed get 0.
    pub fn set_remote_shares(&mut self, vm: VmId, shares: &[(u16, u64)]) -> Result<(), String> {
        let mut by_region = vec![0u64; self.cfg.remote.len()];
        for &(node, slots) in shares {
            let r = self.region_index(node).ok_or_else(|| format!("no region lent by node {node}"))?;
            by_region[r] += slots;
        }
        self.ensure_vm(vm);
        let p = &mut self.vms[vm as usize];
        p.remote_target = by_region.iter().sum();
        p.remote_shares = by_region;
        Ok(())
    }

    /// Sets how many of `vm`'s target slots are lent ones, from any lender: the regions'
    /// shares filled in order, each up to its size. A VM below its target takes a free slot
    /// of the kind still below its share ([`Self::free_kind_for`]); a lower share is reached
    /// as blocks leave.
    pub fn set_remote_target(&mut self, vm: VmId, slots: u64) {
        let mut left = slots;
        let shares: Vec<(u16, u64)> = self
            .cfg
            .remote
            .iter()
            .map(|r| {
                let take = left.min(r.slots);
                left -= take;
                (r.node, take)
            })
            .collect();
        self.set_remote_shares(vm, &shares).expect("every region's lender is known");
    }
}
