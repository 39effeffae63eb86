//! Background write-backs of the dirty blocks a paced shrink's steals passed over
//! (`slot_alloc.rs`), paced per donor: at most one such job per VM in flight, of at most
//! [`CLEAN_BATCH`] blocks, sharing the VM's one background write-back job slot with
//! write-back ahead of eviction (`writeback_ahead.rs`).
//!
//! Writing them all back as one job (what this replaced) put up to [`CLEAN_AHEAD_MAX`]
//! writes at once on the donor's backing store, and an HDD serves them in order: the
//! donor's next miss waited behind all of them — 1.6–4.3 s of queue on policy-compare's
//! donors, tpcc's p99.9 681 ms against static's 94 (docs/policies.md). Paced,
//! a donor's miss waits behind at most one batch.

use crate::engine::Engine;
use crate::slot_table::{key_vm, FREE_KEY};
use cachevisor_trace::VmId;

/// Dirty blocks of paced shrinks queued for write-back at most.
pub(crate) const CLEAN_AHEAD_MAX: usize = 4096;

/// Blocks one paced clean job writes back at most: a donor's miss waits behind at most
/// this many write-backs. Measured on policy-compare and its held-out mixes (64 / 256
/// MiB, docs/policies.md): 1 kept donors' p99.9 lowest but slowed shrinks (hit ratio
/// 22.8% at 256 MiB, under the shared cache); 16 and 64 let donors' p99.9 reach 110–245
/// ms; 4 keeps them at 62–83 ms with 24.2%.
pub(crate) const CLEAN_BATCH: usize = 4;

/// Per donor VM, the dirty slots its steals passed over, waiting for a write-back.
#[derive(Debug, Clone, Default)]
pub(crate) struct PacedClean {
    /// Per VM: slots queued (they may have gone clean, been freed or reused since).
    queues: Vec<Vec<u32>>,
    /// VMs with a non-empty queue, each once.
    waiting: Vec<VmId>,
    /// Slots queued in all.
    len: usize,
}

impl PacedClean {
    /// Queues `slots` of donor `vm`, as many as fit under [`CLEAN_AHEAD_MAX`].
    pub(crate) fn queue(&mut self, vm: VmId, slots: impl IntoIterator<Item = u32>) {
        let v = vm as usize;
        if self.queues.len() <= v {
            self.queues.resize_with(v + 1, Vec::new);
        }
        let q = &mut self.queues[v];
        let was_empty = q.is_empty();
        let room = CLEAN_AHEAD_MAX.saturating_sub(self.len);
        let before = q.len();
        q.extend(slots.into_iter().take(room));
        self.len += q.len() - before;
        if was_empty && !q.is_empty() {
            self.waiting.push(vm);
        }
    }
}

impl Engine {
    /// Starts a clean job for each donor with queued slots and no background write-back
    /// job of its own running: up to [`CLEAN_BATCH`] of its queued slots that are still
    /// its, dirty, unpinned and above target (blocks gone or clean by now are dropped;
    /// pinned ones wait in the queue for a later pass).
    pub(crate) fn run_paced_clean(&mut self) {
        if self.paced_clean.len == 0 || self.flight.held() {
            return;
        }
        let waiting = std::mem::take(&mut self.paced_clean.waiting);
        let spb = self.spb;
        for vm in waiting {
            let v = vm as usize;
            let mut q = std::mem::take(&mut self.paced_clean.queues[v]);
            if !self.ahead.job_running(vm) {
                let before = q.len();
                let mut chosen = [0u32; CLEAN_BATCH];
                let mut n = 0;
                q.retain(|&s| {
                    if n == CLEAN_BATCH {
                        return true;
                    }
                    let k = self.slots.key(s);
                    let p = &self.vms[v];
                    if k == FREE_KEY
                        || key_vm(k) != vm
                        || !self.dirty.any(s, (0, spb))
                        || !(p.paced && p.used > p.target)
                    {
                        return false;
                    }
                    if self.flight.pinned(s) {
                        return true;
                    }
                    chosen[n] = s;
                    n += 1;
                    false
                });
                self.paced_clean.len -= before - q.len();
                if n > 0 {
                    let id = self.submit_job(|e, out| {
                        for &s in &chosen[..n] {
                            e.writeback(vm, s, (0, spb), 0, false, out);
                        }
                    });
                    if let Some(id) = id {
                        self.ahead.job_started(vm, id, 0);
                    }
                }
            }
            let keep = !q.is_empty();
            self.paced_clean.queues[v] = q;
            if keep {
                self.paced_clean.waiting.push(vm);
            }
        }
    }
}
