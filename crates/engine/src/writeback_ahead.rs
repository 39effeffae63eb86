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
//! is evicted next nor waits for the disk to be idle — our measurements (docs/policies.md) showed
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
    window: u32,
    /// The background flusher runs (`timers.rs`): its jobs go through the same per-VM
    /// slot, in the backing stores' idle time.
    flushing: bool,
    /// Per VM: backing ops handed out and not completed.
    backing_ops: Vec<u32>,
    /// Per VM: whether its write-back-ahead job runs.
    running: Vec<bool>,
    /// Jobs running (to find a retiring one's VM without a scan of every VM), with the
    /// blocks each writes back ahead (0 for a paced clean job).
    jobs: Vec<(ReqId, VmId, u32)>,
    /// VMs to look at, each once (`queued`).
    check: Vec<VmId>,
    queued: Vec<bool>,
    /// Per VM: its last job failed (a backing store refusing writes); no new one until
    /// a client request of the VM arrives, so a failing store is retried at the clients'
    /// pace, never in a loop of failures.
    paused: Vec<bool>,
    /// Per VM: blocks written back ahead so far (counted as their job retires without a
    /// failure: on the backing store by then).
    written: Vec<u64>,
    /// The driver's time as of the last call that passed one (submit, completion).
    now_ns: u64,
    /// Per VM: when its backing store last went from idle to busy.
    busy_since: Vec<u64>,
    /// Per VM: time its backing store had ops of this engine in flight, idle periods
    /// ended so far.
    busy_ns: Vec<u64>,
}

impl Ahead {
    /// Whether write-back ahead of eviction is on.
    #[inline]
    pub(crate) fn on(&self) -> bool {
        self.window > 0
    }

    /// The background flusher runs (or stops).
    pub(crate) fn set_flushing(&mut self, on: bool) {
        self.flushing = on;
    }
    fn grow(&mut self, vm: VmId) {
        let n = vm as usize + 1;
        if self.backing_ops.len() < n {
            self.backing_ops.resize(n, 0);
            self.running.resize(n, false);
            self.queued.resize(n, false);
            self.paused.resize(n, false);
            self.written.resize(n, 0);
            self.busy_since.resize(n, 0);
            self.busy_ns.resize(n, 0);
        }
    }

    /// An op is handed out: a backing store's count of ops in flight grows (an idle one
    /// starts a busy period).
    #[inline]
    pub(crate) fn issued(&mut self, op: &DeviceOp) {
        if let Location::Backing(vm) = op.loc {
            self.grow(vm);
            let v = vm as usize;
            if self.backing_ops[v] == 0 {
                self.busy_since[v] = self.now_ns;
            }
            self.backing_ops[v] += 1;
        }
    }

    /// An op handed out ended: a backing store left with nothing in flight ends its busy
    /// period and is looked at.
    #[inline]
    pub(crate) fn completed(&mut self, op: &DeviceOp) {
        if let Location::Backing(vm) = op.loc {
            let v = vm as usize;
            if let Some(n) = self.backing_ops.get_mut(v).filter(|n| **n > 0) {
                *n -= 1;
                if *n == 0 {
                    self.busy_ns[v] += self.now_ns.saturating_sub(self.busy_since[v]);
                    if self.window > 0 || self.flushing {
                        self.queue(vm);
                    }
                }
            }
        }
    }

    /// Whether `vm`'s one background write-back job (write-back ahead's, or a paced
    /// clean job's, `paced_clean.rs`) runs.
    pub(crate) fn job_running(&self, vm: VmId) -> bool {
        self.running.get(vm as usize).copied().unwrap_or(false)
    }

    /// `vm`'s background write-back job `id` started, writing `ahead` blocks back ahead of
    /// eviction (0: a paced clean job); [`Engine::ahead_retired`] ends it.
    pub(crate) fn job_started(&mut self, vm: VmId, id: ReqId, ahead: u32) {
        self.grow(vm);
        self.running[vm as usize] = true;
        self.jobs.push((id, vm, ahead));
    }

    /// The driver's time as of the last call that passed one.
    #[inline]
    pub(crate) fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// The driver's time `now_ns` passed in (submit, completion, timeout): busy periods
    /// are measured against it (it never goes back).
    #[inline]
    pub(crate) fn at(&mut self, now_ns: u64) {
        self.now_ns = self.now_ns.max(now_ns);
    }

    pub(crate) fn queue(&mut self, vm: VmId) {
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

    /// Time `vm`'s backing store has had ops of this engine in flight so far, in the
    /// driver's time (ns, as passed to `submit` and `handle_completion`): how busy this
    /// engine keeps it (`adaptive`'s write-policy choice reads it per window).
    pub fn backing_busy_ns(&self, vm: VmId) -> u64 {
        let a = &self.ahead;
        let v = vm as usize;
        let ongoing = match a.backing_ops.get(v) {
            Some(&n) if n > 0 => a.now_ns.saturating_sub(a.busy_since[v]),
            _ => 0,
        };
        a.busy_ns.get(v).copied().unwrap_or(0) + ongoing
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
    /// request of it was dispatched or retired — its blocks unpinned —, another VM's miss
    /// took one of its blocks).
    #[inline]
    pub(crate) fn ahead_look_at(&mut self, vm: VmId) {
        if self.ahead.window > 0 || self.ahead.flushing {
            self.ahead.queue(vm);
        }
    }

    /// A client request of `vm` arrived: write-back ahead paused by a failure resumes.
    #[inline]
    pub(crate) fn ahead_client_request(&mut self, vm: VmId) {
        if self.ahead.window > 0 || self.ahead.flushing {
            self.ahead.grow(vm);
            self.ahead.paused[vm as usize] = false;
            self.ahead.queue(vm);
        }
    }

    /// A job retired: if it was a VM's background write-back job (write-back ahead's or a
    /// paced clean job), that VM may start another (write-back ahead, after a failed one,
    /// only once a client request of the VM comes).
    #[inline]
    pub(crate) fn ahead_retired(&mut self, id: ReqId, failed: bool) {
        if let Some(i) = self.ahead.jobs.iter().position(|&(j, _, _)| j == id) {
            let (_, vm, ahead) = self.ahead.jobs.swap_remove(i);
            if !failed {
                self.ahead.written[vm as usize] += ahead as u64;
            }
            self.ahead.running[vm as usize] = false;
            self.ahead.paused[vm as usize] |= failed;
            self.ahead.queue(vm);
        }
    }

    /// Starts a write-back-ahead job for each VM looked at whose backing store is idle,
    /// that runs none yet and has dirty blocks among its next victims — or, with none
    /// there, the flusher's job for it (`Engine::flush_job_for`).
    pub(crate) fn run_writeback_ahead(&mut self) {
        if self.ahead.check.is_empty() || self.flight.held() {
            return;
        }
        let check = std::mem::take(&mut self.ahead.check);
        let mut peeked = std::mem::take(&mut self.scratch.peek_buf);
        for &vm in &check {
            self.ahead.queued[vm as usize] = false;
            let v = vm as usize;
            let idle = self.ahead.backing_ops[v] == 0 && !self.ahead.running[v] && !self.ahead.paused[v];
            if !idle || self.vms.get(v).is_none_or(|p| p.dirty_blocks == 0) {
                continue;
            }
            peeked.clear();
            let window = self.ahead.window as usize;
            if window == 0 {
                self.flush_job_for(vm);
                continue;
            }
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
                // Nothing near eviction: the flusher's turn, if it has one.
                self.flush_job_for(vm);
                continue;
            }
            if let Some(id) = self.destage_job(&chosen[..n]) {
                self.ahead.job_started(vm, id, n as u32);
            }
        }
        self.scratch.peek_buf = peeked;
        if self.ahead.check.is_empty() {
            self.ahead.check = check;
            self.ahead.check.clear();
        }
    }
}
