//! Write-back ahead of eviction, in a backing store's idle time.
//!
//! Under write-back a miss whose victim is dirty writes that victim to the backing store
//! before its own read (or, for a paced shrink, another VM's miss finds only dirty blocks
//! to take): on an HDD the miss then waits for two disk operations, and the tail of every
//! write-back workload is made of those misses. Here the engine writes back, ahead of
//! time, the dirty blocks among a VM's next victims (`Replacement::peek_victims`) —
//! one small job at a time, and only while nothing else of that VM is on its backing
//! store (no backing op handed out and not completed): cleaning uses the disk's idle
//! time, and a miss arriving meanwhile waits behind at most that one job. When eviction
//! comes the victim is clean and the miss costs one read. (bcache's writeback and OCF's
//! cleaning policies destage by a dirty target and a rate; neither looks at which block
//! is evicted next nor waits for the disk to be idle — the issue 13 measurements showed
//! rate-paced destaging in the miss path's way.)
//!
//! The engine only counts the ops it hands out per backing store, so "idle" is the
//! engine's own view: a backing store shared with other engines or VMs looks idle when
//! only they use it.

use crate::engine::Engine;
use crate::inflight::ReqId;
use crate::output::{DeviceOp, Location};
use crate::replacement::Replacement;
use crate::slot_table::{key_vm, FREE_KEY};
use cachevisor_trace::VmId;

/// Most victims a configuration may have write-back ahead look at (each look costs
/// that many steps of the replacement policy's list).
pub const MAX_WRITEBACK_AHEAD: u32 = 4096;

/// Blocks one write-back-ahead job writes at most.
pub const AHEAD_BATCH: usize = 1;

/// The write-back-ahead state: how far ahead to look, each backing store's ops in flight,
/// the job running per VM, and the VMs to look at next.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ahead {
    /// Next victims looked at per VM (0: off).
    pub(crate) window: u32,
    /// Per VM: backing ops handed out and not completed.
    backing_ops: Vec<u32>,
    /// Per VM: whether its write-back-ahead job runs.
    running: Vec<bool>,
    /// Jobs running (to find a retiring one's VM without a scan of every VM).
    jobs: Vec<(ReqId, VmId)>,
    /// VMs to look at, each once (`queued`).
    check: Vec<VmId>,
    queued: Vec<bool>,
    /// Per VM: its last job failed (a backing store refusing writes); no new one until
    /// a client request of the VM arrives, so a failing store is retried at the clients'
    /// pace, never in a loop of failures.
    paused: Vec<bool>,
    /// Per VM: blocks written back ahead so far.
    written: Vec<u64>,
}

impl Ahead {
    fn grow(&mut self, vm: VmId) {
        let n = vm as usize + 1;
        if self.backing_ops.len() < n {
            self.backing_ops.resize(n, 0);
            self.running.resize(n, false);
            self.queued.resize(n, false);
            self.paused.resize(n, false);
            self.written.resize(n, 0);
        }
    }

    /// An op is handed out: a backing store's count of ops in flight grows.
    #[inline]
    pub(crate) fn issued(&mut self, op: &DeviceOp) {
        if self.window > 0 {
            if let Location::Backing(vm) = op.loc {
                self.grow(vm);
                self.backing_ops[vm as usize] += 1;
            }
        }
    }

    /// An op handed out ended: a backing store left with nothing in flight is looked at.
    #[inline]
    pub(crate) fn completed(&mut self, op: &DeviceOp) {
        if self.window > 0 {
            if let Location::Backing(vm) = op.loc {
                if let Some(n) = self.backing_ops.get_mut(vm as usize).filter(|n| **n > 0) {
                    *n -= 1;
                    if *n == 0 {
                        self.queue(vm);
                    }
                }
            }
        }
    }

    fn queue(&mut self, vm: VmId) {
        self.grow(vm);
        if !std::mem::replace(&mut self.queued[vm as usize], true) {
            self.check.push(vm);
        }
    }
}

impl Engine {
    /// Turns write-back ahead of eviction on (`window` > 0: the dirty blocks among each
    /// VM's next `window` victims are written back while its backing store is idle) or
    /// off (0). Changes no block; takes effect with the next op handed out.
    /// At most [`MAX_WRITEBACK_AHEAD`] (larger values are clamped; configs refuse them).
    pub fn set_writeback_ahead(&mut self, window: u32) {
        self.ahead.window = window.min(MAX_WRITEBACK_AHEAD);
    }

    /// Blocks written back ahead of eviction so far.
    pub fn written_back_ahead(&self) -> u64 {
        self.ahead.written.iter().sum()
    }

    /// Blocks of `vm` written back ahead of eviction so far.
    pub fn written_back_ahead_of(&self, vm: VmId) -> u64 {
        self.ahead.written.get(vm as usize).copied().unwrap_or(0)
    }

    /// `vm`'s next victims may have changed without its backing store doing anything (a
    /// request of it was admitted or retired — its blocks unpinned —, another VM's miss
    /// took one of its blocks).
    #[inline]
    pub(crate) fn ahead_look_at(&mut self, vm: VmId) {
        if self.ahead.window > 0 {
            self.ahead.queue(vm);
        }
    }

    /// A client request of `vm` arrived: write-back ahead paused by a failure resumes.
    #[inline]
    pub(crate) fn ahead_client_request(&mut self, vm: VmId) {
        if self.ahead.window > 0 {
            self.ahead.grow(vm);
            self.ahead.paused[vm as usize] = false;
            self.ahead.queue(vm);
        }
    }

    /// A job retired: if it was a VM's write-back-ahead job, that VM may start another
    /// (after a failed one, only once a client request of the VM comes).
    #[inline]
    pub(crate) fn ahead_retired(&mut self, id: ReqId, failed: bool) {
        if let Some(i) = self.ahead.jobs.iter().position(|&(j, _)| j == id) {
            let (_, vm) = self.ahead.jobs.swap_remove(i);
            self.ahead.running[vm as usize] = false;
            self.ahead.paused[vm as usize] |= failed;
            self.ahead.queue(vm);
        }
    }

    /// Starts a write-back-ahead job for each VM looked at whose backing store is idle,
    /// that runs none yet and has dirty blocks among its next victims.
    pub(crate) fn run_writeback_ahead(&mut self) {
        if self.ahead.check.is_empty() || self.flight.hold {
            return;
        }
        let check = std::mem::take(&mut self.ahead.check);
        let mut peeked = std::mem::take(&mut self.peek_buf);
        for &vm in &check {
            self.ahead.queued[vm as usize] = false;
            let v = vm as usize;
            let idle = self.ahead.backing_ops[v] == 0 && !self.ahead.running[v] && !self.ahead.paused[v];
            if !idle || self.vms.get(v).is_none_or(|p| p.dirty_blocks == 0) {
                continue;
            }
            peeked.clear();
            let window = self.ahead.window as usize;
            let repl = match &self.shared {
                Some(r) => Some(r),
                None => self.vms[v].repl.as_ref(),
            };
            let Some(repl) = repl else { continue };
            repl.peek_victims(&self.slots, window, &mut peeked);
            let spb = self.spb;
            let mut chosen = [0u64; AHEAD_BATCH];
            let mut n = 0;
            for &s in &peeked {
                let k = self.slots.key(s);
                if k != FREE_KEY && key_vm(k) == vm && !self.flight.pinned(s) && self.dirty.any(s, (0, spb)) {
                    chosen[n] = k;
                    n += 1;
                    if n == AHEAD_BATCH {
                        break;
                    }
                }
            }
            if n == 0 {
                continue;
            }
            if let Some(id) = self.destage_job(&chosen[..n]) {
                self.ahead.written[v] += n as u64;
                self.ahead.running[v] = true;
                self.ahead.jobs.push((id, vm));
            }
        }
        self.peek_buf = peeked;
        if self.ahead.check.is_empty() {
            self.ahead.check = check;
            self.ahead.check.clear();
        }
    }
}
