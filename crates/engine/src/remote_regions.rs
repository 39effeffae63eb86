//! Cache other nodes of a cluster lend this engine (ELICA §3.1; stores of kind
//! `StoreKind::Lent` in the store table, `stores.rs`): each VM's share of each lender's
//! region (Eq. 4's c_remote, split by lender), and which store's free slot a VM below its
//! target takes: local or a region where it is below its share, ELICA-Traffic's choice
//! when both are (§3.4: a sequential run local, the rest lent).
//!
//! A VM with no share of a region never takes its slots (they are for the VMs they were
//! lent to); at its target a VM's misses replace its own blocks of any kind, so its
//! shares hold. Hand-written: bookkeeping over the engine's own slot lists.

use crate::config::StoreKind;
use crate::engine::Engine;
use crate::stores::{StoreId, LOCAL};
use cachevisor_trace::VmId;

/// ELICA-Traffic's choices (§3.4).
#[derive(Debug, Clone)]
pub(crate) struct Traffic {
    /// A sequential run takes local slots first ([`Engine::set_traffic_aware`]).
    aware: bool,
    /// ... and at a full partition too ([`Engine::set_traffic_turnover`]).
    turnover: bool,
}

impl Default for Traffic {
    /// Aware (sequential runs local first), no turnover.
    fn default() -> Traffic {
        Traffic { aware: true, turnover: false }
    }
}

impl Traffic {
    /// Whether it does at a full partition too (victims chosen by store).
    #[inline]
    pub(crate) fn turnover(&self) -> bool {
        self.aware && self.turnover
    }
}

impl Engine {
    /// The store whose free slot a VM below its target takes now, if one is free: local
    /// while its local part is below its share, a lent region while it is below its share
    /// there; when both are open, ELICA-Traffic's choice (a sequential run local).
    pub(crate) fn free_kind_for(&mut self, vm: VmId) -> Option<StoreId> {
        self.park_pinned_free();
        if self.stores.len() == 1 {
            return self.stores.free_list(LOCAL).front().map(|_| LOCAL);
        }
        if self.stores.several_devices() {
            // The host's devices alone (no lent region beside them: `EngineConfig::validate`).
            return self.local_store_for_new_block();
        }
        let p = &self.vms[vm as usize];
        let remote_total = p.remote_target.min(p.target);
        let local_ok = p.held[0] < p.target - remote_total && self.stores.open(LOCAL);
        let region = (p.used - p.held[0] < remote_total)
            .then(|| (1..self.stores.len()).find(|&r| p.held[r] < p.shares[r] && self.stores.open(r as StoreId)))
            .flatten();
        match (local_ok, region) {
            (true, Some(r)) => Some(if self.req.sequential && self.traffic.aware { LOCAL } else { r as StoreId }),
            (true, None) => Some(LOCAL),
            (false, Some(r)) => Some(r as StoreId),
            (false, None) => None,
        }
    }

    /// A free slot for a VM below its target ([`Self::free_kind_for`]).
    pub(crate) fn take_free_below_target(&mut self, vm: VmId) -> Option<u32> {
        let store = self.free_kind_for(vm)?;
        self.take_free_of(store)
    }

    /// Slots in use in the region `lender` lent this engine (every VM's; 0 when it lent
    /// none): what this engine holds on that node's SSD.
    pub fn used_in_region(&self, lender: u16) -> u64 {
        self.region_index(lender).map_or(0, |r| self.store_used(r))
    }

    /// Slots the VMs' shares of `lender`'s region still lack (their shares less what they
    /// hold there, summed over the VMs below theirs).
    pub fn region_shortfall(&self, lender: u16) -> u64 {
        match self.region_index(lender) {
            Some(r) => self.vms.iter().map(|p| p.shares[r as usize].saturating_sub(p.held[r as usize])).sum(),
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
            self.set_store_limit(r, slots);
        }
    }

    /// The store `lender` lent this engine.
    fn region_index(&self, lender: u16) -> Option<StoreId> {
        self.stores.layout().find(StoreKind::Lent { node: lender })
    }

    /// Whether ELICA-Traffic's choice is on (default): a sequential run takes local slots
    /// first when both kinds are open; off (ELICA-Load), lent ones first like the rest.
    pub fn set_traffic_aware(&mut self, on: bool) {
        self.traffic.aware = on;
    }

    /// Whether ELICA-Traffic's choice also applies as a full partition turns over (off by
    /// default): a sequential miss then replaces the VM's coldest local block, a random
    /// one its coldest lent block, among its next 8 victims, instead of the policy's
    /// victim wherever it is (docs/cluster.md measures both).
    pub fn set_traffic_turnover(&mut self, on: bool) {
        self.traffic.turnover = on;
    }

    /// Sets `vm`'s shares of the regions other nodes lent, by lender node id (ELICA's
    /// c_remote split by lender; at most its target in all — the rest of it is local). A
    /// lender this engine has no region of is refused by name; lenders not listed get 0.
    pub fn set_remote_shares(&mut self, vm: VmId, shares: &[(u16, u64)]) -> Result<(), String> {
        let mut by_store = vec![0u64; self.stores.len()];
        for &(node, slots) in shares {
            let r = self.region_index(node).ok_or_else(|| format!("no region lent by node {node}"))?;
            by_store[r as usize] += slots;
        }
        self.ensure_vm(vm);
        let p = &mut self.vms[vm as usize];
        p.remote_target = by_store.iter().sum();
        p.shares = by_store;
        Ok(())
    }

    /// A lender is lost (its node died or cannot be reached): no VM has a share of its
    /// region any more and no new block goes there (the cap is 0); its blocks leave the
    /// cache now — they are clean (`set_lent_write_through`: the backing store has them),
    /// and one left behind would be a victim whose slot a miss reuses, in a region whose
    /// every op fails (measured: a guest's writes failed five times over). Blocks a
    /// request holds in flight leave as their ops fail (the engine's repair drops them);
    /// a dirty one (only without write-through) stays, its only copy is there. Their
    /// targets' lent part is local again. Returns whether that changed anything (it had a
    /// cap, a share or a block).
    pub fn lose_lender(&mut self, lender: u16) -> bool {
        let Some(r) = self.region_index(lender) else { return false };
        let mut changed = self.stores.limit(r) != 0;
        self.set_store_limit(r, 0);
        let (first, n) = self.stores.layout().range(r);
        for slot in first as u32..(first + n) as u32 {
            let Some((vm, block)) = self.slot_block(slot) else { continue };
            let held = self.flight.pinned(slot) || self.flight.holds_block(crate::slot_table::pack_key(vm, block));
            if !held && !self.slot_dirty(slot) {
                changed |= self.discard(vm, block, (0, self.spb));
            }
        }
        for p in &mut self.vms {
            if let Some(x) = p.shares.get_mut(r as usize) {
                changed |= *x > 0;
                p.remote_target = p.remote_target.saturating_sub(*x);
                *x = 0;
            }
        }
        changed
    }

    /// Sets how many of `vm`'s target slots are lent ones, from any lender: the regions'
    /// shares filled in order, each up to its size. A VM below its target takes a free slot
    /// of the kind still below its share ([`Self::free_kind_for`]); a lower share is reached
    /// as blocks leave.
    pub fn set_remote_target(&mut self, vm: VmId, slots: u64) {
        let mut left = slots;
        let shares: Vec<(u16, u64)> = self
            .cfg
            .stores
            .iter()
            .filter_map(|r| {
                let StoreKind::Lent { node } = r.kind else { return None };
                let take = left.min(r.slots);
                left -= take;
                Some((node, take))
            })
            .collect();
        self.set_remote_shares(vm, &shares).expect("every region's lender is known");
    }
}
