//! Control commands of the engine: partition targets, write-policy switches, flushes,
//! dropping a VM, and invariant checking for tests.

use crate::block_admission::{Admission, AdmissionPolicy, AdmissionState};
use crate::config::PartitionMode;
use crate::engine::Engine;
use crate::output::Output;
use crate::replacement::Replacement;
use crate::slot_table::{key_block, key_vm, FREE_KEY};
use crate::write_policy::WritePolicy;
use cachevisor_trace::VmId;

/// Shrinks the engine finishes later.
#[derive(Debug, Clone, Default)]
pub(crate) struct Shrinks {
    /// Dirty slots a flush leaving write-back skipped (ops in flight on them): written
    /// back once those ops end, so a partition that left write-back keeps nothing dirty.
    left_dirty: Vec<u32>,
    /// A partition may be above its target (a shrink stopped at slots with ops in
    /// flight): checked when a job retires.
    due: bool,
    /// VMs given a paced shrink, to take blocks from while they stay above their targets
    /// (entries go stale as they reach them; skipped then).
    over_target: Vec<VmId>,
}

impl Shrinks {
    /// Nothing to finish yet, the first check due.
    pub(crate) fn due() -> Shrinks {
        Shrinks { due: true, ..Default::default() }
    }

    /// Whether dirty slots a flush skipped wait for a write-back.
    pub(crate) fn left_dirty_due(&self) -> bool {
        !self.left_dirty.is_empty()
    }

    pub(crate) fn take_left_dirty(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.left_dirty)
    }

    /// Dirty slots to write back once the ops on them end.
    pub(crate) fn leave_dirty(&mut self, slots: impl IntoIterator<Item = u32>) {
        self.left_dirty.extend(slots);
    }

    /// Whether a partition may be above its target; the check is taken (cleared).
    pub(crate) fn take_due(&mut self) -> bool {
        std::mem::take(&mut self.due)
    }

    /// A partition may be above its target: check when a job retires.
    pub(crate) fn set_due(&mut self) {
        self.due = true;
    }

    /// The last VM given a paced shrink still `above` its target; stale entries go.
    #[inline]
    pub(crate) fn donor(&mut self, above: impl Fn(VmId) -> bool) -> Option<VmId> {
        while let Some(&o) = self.over_target.last() {
            if above(o) {
                return Some(o);
            }
            self.over_target.pop();
        }
        None
    }
}

impl Engine {
    /// Sets `vm`'s target in slots. In static mode a shrink evicts the coldest blocks
    /// (writing dirty ones back) until the VM is within its target — blocks with ops in
    /// flight stay until those end, then leave as a background job; a grow lets later
    /// misses claim free slots. In shared mode the target is only recorded.
    pub fn set_target(&mut self, vm: VmId, slots: u64, out: &mut Output) {
        out.clear();
        self.ensure_vm(vm);
        self.vms[vm as usize].target = slots;
        self.vms[vm as usize].paced = false;
        self.shrink.set_due();
        if self.cfg.partition == PartitionMode::Shared {
            return;
        }
        self.with_repl(vm, |r, _| r.set_capacity(slots));
        while self.vms[vm as usize].used > slots {
            let Some((s, _)) = self.evict_from(vm, false, out) else { break };
            self.free_slot(s);
        }
    }

    /// Sets `vm`'s target in slots with a paced shrink (static mode): no block leaves now;
    /// while the VM holds more than its target, each miss of a VM below its own target
    /// that finds no free slot takes one of this VM's blocks (its policy's victim, written
    /// back first when dirty) instead of one of its own. A shrink's write-backs so spread
    /// over the misses that need the space, as in a shared cache, instead of queueing at
    /// the VM's disk at once. The VM's own misses above its target replace its own blocks.
    pub fn set_target_paced(&mut self, vm: VmId, slots: u64) {
        self.ensure_vm(vm);
        let p = &mut self.vms[vm as usize];
        let listed = p.paced && p.used > p.target; // already on `over_target`
        p.target = slots;
        if self.cfg.partition == PartitionMode::Shared {
            return;
        }
        p.paced = true;
        if p.used > slots && !listed {
            self.shrink.over_target.push(vm);
        }
        self.with_repl(vm, |r, _| r.set_capacity(slots));
    }

    /// Gives back up to `n` slots held above their targets by VMs given a paced shrink
    /// ([`Self::set_target_paced`]) and frees them: clean blocks first (dropped: the
    /// backing store has them), then at most `dirty` written back first in `out` (a few
    /// per call, so the write-backs never queue ahead of the donors' misses on their disks
    /// in a burst); returns how many. For space a driver must hand to someone the
    /// engine does not see: in a cluster, the blocks its borrowers may put in the region
    /// this node lent them (ELICA §3.1: a lender's own VMs and its borrowers share one
    /// SSD).
    pub fn give_back(&mut self, n: u64, dirty: u64, out: &mut Output) -> u64 {
        let (mut freed, mut written) = (0, 0);
        while freed < n {
            let Some(donor) = self.paced_donor() else { break };
            let ops = out.ops.len();
            let Some(s) = self.take_from_paced(donor, written < dirty, out) else { break };
            written += (out.ops.len() > ops) as u64;
            self.moving.free_later(s);
            freed += 1;
        }
        self.free_deferred();
        freed
    }

    /// Sets what decides which of `vm`'s misses enter the cache, as a vDisk's or VM's
    /// configuration gives it (the daemon's `[[vdisk]]`, the simulator's `[[vm]]` over its
    /// `[cache]`): sequential cutoff (unset: left as it is), admission, prefetch and I/O
    /// classes. An error names the class that is wrong; nothing is set then.
    pub fn set_entry(&mut self, vm: VmId, entry: &VmEntry<'_>) -> Result<(), String> {
        let classes = crate::io_class::IoClassSection::resolve_all(entry.classes)?;
        if let Some(c) = entry.sequential_cutoff {
            self.set_sequential_cutoff(vm, c);
        }
        self.set_admission(vm, entry.admission.0, entry.admission.1);
        self.set_prefetch_policy(vm, entry.prefetch);
        self.set_io_classes(vm, classes)
    }

    /// Sets `vm`'s sequential cutoff in bytes (0 = off; see `sequential_cutoff`).
    pub fn set_sequential_cutoff(&mut self, vm: VmId, bytes: u64) {
        self.ensure_vm(vm);
        self.vms[vm as usize].seq.cutoff = bytes;
    }

    /// Sets which of `vm`'s read and write misses enter the cache (`block_admission.rs`);
    /// a change starts the vDisk's history of misses and its counts afresh. Blocks already
    /// cached stay.
    pub fn set_admission(&mut self, vm: VmId, read: AdmissionPolicy, write: AdmissionPolicy) {
        self.ensure_vm(vm);
        let v = vm as usize;
        if self.admission.len() <= v {
            self.admission.resize_with(v + 1, || None);
        }
        self.admission[v] = (read != AdmissionPolicy::All || write != AdmissionPolicy::All).then(|| {
            // The window: as many misses as the cache has usable slots; the seed: the
            // VM's id; a write budget in drive writes per day: of the whole cache.
            let block = self.cfg.block_size;
            let slots = self.slot_count();
            Admission::new(read, write, self.usable_slots(), 0x5eed_0000 ^ vm as u64, block, slots * block)
        });
    }

    /// Slots the cache can use now: all but the withheld ones (a cache shrunk online, a
    /// region lent to a vSSD).
    fn usable_slots(&self) -> usize {
        (self.slot_count() - self.withheld_slots()).max(1) as usize
    }

    /// Admission histories follow the cache's usable slots ("sized by the cache"): called
    /// when slots are withheld or returned.
    pub(crate) fn refit_admission(&mut self) {
        let n = self.usable_slots();
        for a in self.admission.iter_mut().flatten() {
            a.set_window(n);
        }
        self.classes.set_windows(n);
    }

    /// `vm`'s admission: its read and write policies, what they admitted and rejected,
    /// the bytes its history of misses takes and its write budget's state (`None` for a
    /// VM admitting every miss).
    pub fn admission(&self, vm: VmId) -> Option<AdmissionState> {
        Some(self.admission.get(vm as usize)?.as_ref()?.state())
    }

    /// Sends misses around the cache while the cache device's reads (writes) take longer
    /// than `read_ns` (`write_ns`) on average (`congestion.rs`; `None`: never).
    pub fn set_congestion(&mut self, read_ns: Option<u64>, write_ns: Option<u64>) {
        self.congestion.set(read_ns, write_ns);
    }

    /// Congestion bypass's state (`None` when it is off).
    pub fn congestion(&self) -> Option<crate::congestion::CongestionState> {
        self.congestion.on().then(|| self.congestion.state(self.ahead.now_ns()))
    }

    /// `vm`'s read and write misses sent around the cache for congestion.
    pub fn congestion_bypassed(&self, vm: VmId) -> [u64; 2] {
        self.congestion.bypassed(vm)
    }

    /// Sets `vm`'s I/O classes (`io_class.rs`; empty: none); their counts start afresh,
    /// blocks already cached count as unclassified. At most [`crate::io_class::MAX_CLASSES`].
    pub fn set_io_classes(&mut self, vm: VmId, classes: Vec<crate::io_class::IoClass>) -> Result<(), String> {
        if classes.len() > crate::io_class::MAX_CLASSES {
            return Err(format!("{} I/O classes: at most {}", classes.len(), crate::io_class::MAX_CLASSES));
        }
        self.ensure_vm(vm);
        let block = self.cfg.block_size;
        let slots = self.slot_count();
        let window = self.usable_slots();
        self.classes.set(vm, classes, window, 0xc1a5_0000 ^ vm as u64, block, slots * block);
        Ok(())
    }

    /// `vm`'s I/O classes' figures, its unclassified requests first (`None`: no classes).
    pub fn io_classes(&self, vm: VmId) -> Option<Vec<crate::io_class::ClassCounts>> {
        self.classes.counts(vm)
    }

    /// What `vm`'s entry policies did: admission, prefetch, congestion bypass, I/O classes.
    pub fn entry_state(&self, vm: VmId) -> EntryState {
        EntryState {
            admission: self.admission(vm),
            prefetch: self.prefetch_state(vm),
            congestion_bypassed: self.congestion_bypassed(vm),
            classes: self.io_classes(vm),
            budget_share: self.shared_budget.share(vm),
        }
    }

    /// Sets `vm`'s prefetch policy (`block_prefetch.rs`); its stream and counts start
    /// afresh. Blocks already prefetched stay.
    pub fn set_prefetch_policy(&mut self, vm: VmId, policy: crate::block_prefetch::PrefetchPolicy) {
        self.ensure_vm(vm);
        self.prefetcher.set(vm, policy);
    }

    /// `vm`'s prefetch: its policy, what it loaded and how much of it was read, and the
    /// stream's degree and trigger distance (`None` for a VM that does not prefetch).
    pub fn prefetch_state(&self, vm: VmId) -> Option<crate::block_prefetch::PrefetchState> {
        Some(self.prefetcher.streams.get(vm as usize)?.as_ref()?.state())
    }

    /// Whether a client miss of block `key` of `vm` (a write when `write`) may take a
    /// slot: always when the request's mode sends it around the cache anyway (then
    /// `allocate` refuses it, and admission does not count it), else as `vm`'s admission
    /// says.
    #[inline]
    pub(crate) fn admits_miss(&mut self, vm: VmId, key: u64, write: bool) -> bool {
        if !self.req.mode.insert {
            return true;
        }
        if self.congestion.on() && self.congestion.bypass(vm, write, self.ahead.now_ns()) {
            return false;
        }
        let class_verdict = if self.classes.any() {
            let partition = if self.shared.is_some() { self.slot_count() } else { self.vms[vm as usize].target };
            self.classes.admit(vm, self.req.class, key, write, self.now_ms, partition)
        } else {
            None
        };
        let own = match (class_verdict, self.admission.get_mut(vm as usize)) {
            (Some(verdict), _) => verdict,
            (None, Some(Some(a))) => a.admit(key, write, self.now_ms),
            _ => true,
        };
        // What the VM's own policy lets in meets the cache's shared budget.
        own && (!self.shared_budget.on() || self.shared_budget.admit(vm, self.now_ms))
    }

    /// Sets the cache's write budget shared across VMs (`shared_budget.rs`; `None`: off);
    /// what it measured starts afresh. A rate in drive writes per day is of the cache's
    /// capacity now.
    pub fn set_write_budget(&mut self, rate: Option<crate::write_budget::BudgetRate>) {
        let block = self.cfg.block_size;
        self.shared_budget.set(rate, self.slot_count() * block, block);
    }

    /// The cache's shared write budget: its target, what was written and each VM's share
    /// (`None`: off).
    pub fn write_budget(&self) -> Option<crate::shared_budget::SharedBudgetState> {
        self.shared_budget.state()
    }

    /// Changes `vm`'s write policy; to any policy but write-back, its dirty blocks are
    /// flushed first.
    pub fn set_write_policy(&mut self, vm: VmId, policy: WritePolicy, out: &mut Output) {
        out.clear();
        self.ensure_vm(vm);
        // Any dirty block goes, not only write-back's: a lazy switch to write-through
        // ([`Self::set_write_policy_lazy`]) leaves some (found by the crash-consistency
        // model: write-through → read-only kept them, and read-only writes around them).
        if policy != WritePolicy::Wb && self.vms[vm as usize].dirty_blocks > 0 {
            // Dirty blocks with ops in flight are written back once those end.
            let skipped = self.flush_into(Some(vm), out);
            self.shrink.leave_dirty(skipped);
        }
        self.vms[vm as usize].write_policy = policy;
    }

    /// Changes `vm`'s write policy like [`Self::set_write_policy`], but leaving write-back
    /// for write-through flushes nothing: the dirty blocks stay cached and dirty until they leave as they
    /// would under write-back — written back when evicted, or ahead of eviction in the
    /// backing store's idle time (`writeback_ahead.rs`) — or a [`Self::flush`]; reads hit
    /// them, a write through one cleans the sectors it writes. No device work here. The
    /// allocators' decisions use it (`controller::apply`): a flush at the switch put all
    /// of a VM's dirty blocks on its disk at once (CloudPhysics's in policy-compare:
    /// 92 s of queue), and paced in the background it slowed every miss while it lasted
    /// (docs/policies.md).
    ///
    /// Only between write-back and write-through (what `adaptive` chooses between):
    /// another policy, or a VM on another one, is left as it is and `false` returned — a
    /// read-only or write-around partition with dirty blocks is a state the engine keeps
    /// only for a bypassed vDisk ([`Self::set_bypass`]); use [`Self::set_write_policy`].
    pub fn set_write_policy_lazy(&mut self, vm: VmId, policy: WritePolicy) -> bool {
        self.ensure_vm(vm);
        let lazy = |p: WritePolicy| matches!(p, WritePolicy::Wb | WritePolicy::Wt);
        let p = &mut self.vms[vm as usize];
        if !lazy(policy) || !lazy(p.write_policy) {
            return false;
        }
        p.write_policy = policy;
        true
    }

    /// Takes `vm` out of the cache without losing data (a driver's pass-through after
    /// device errors): from now on its writes go around the cache (read-only policy: they
    /// go to the backing store and invalidate the cached sectors they overwrite) and its
    /// misses take no slots, while its dirty blocks stay cached — reads still hit them —
    /// until they are written back ([`Self::destage_block`]). No device work here. `false`
    /// lets misses take slots again (the write policy stays what it is).
    pub fn set_bypass(&mut self, vm: VmId, on: bool) {
        self.ensure_vm(vm);
        let p = &mut self.vms[vm as usize];
        p.bypass = on;
        if on {
            p.write_policy = WritePolicy::Ro;
        } else {
            p.bypass_errors = false;
        }
    }

    /// Writes back every dirty block of `vm` (all VMs when `None`); blocks stay cached clean.
    pub fn flush(&mut self, vm: Option<VmId>, out: &mut Output) {
        out.clear();
        self.flush_into(vm, out);
    }

    /// Writes back the dirty blocks of `vm` (or all) without ops in flight; returns the
    /// dirty slots skipped because they had ops in flight.
    fn flush_into(&mut self, vm: Option<VmId>, out: &mut Output) -> Vec<u32> {
        let spb = self.spb;
        let mut skipped = Vec::new();
        for s in 0..self.slots.len() as u32 {
            let key = self.slots.key(s);
            if key == FREE_KEY {
                continue;
            }
            let owner = key_vm(key);
            // A poisoned block (`seals.rs`, or on a dropped device) is never written back.
            if vm.is_none_or(|v| v == owner) && self.vms[owner as usize].dirty_blocks > 0 && !self.poisoned(s) {
                if !self.flight.pinned(s) {
                    self.writeback(owner, s, (0, spb), 0, false, out);
                } else if self.dirty.any(s, (0, spb)) {
                    skipped.push(s);
                }
            }
        }
        skipped
    }

    /// Flushes and forgets every block of `vm` and sets its target to 0.
    pub fn drop_vm(&mut self, vm: VmId, out: &mut Output) {
        out.clear();
        self.ensure_vm(vm);
        self.flush_into(Some(vm), out);
        for s in 0..self.slots.len() as u32 {
            let key = self.slots.key(s);
            if key != FREE_KEY && key_vm(key) == vm {
                self.with_repl(vm, |r, t| r.remove(t, s));
                self.release(vm, s);
            }
        }
        self.vms[vm as usize].target = 0;
        self.shrink.set_due();
        if self.cfg.partition == PartitionMode::Static {
            self.with_repl(vm, |r, _| r.set_capacity(0));
        }
    }

    /// Checks every structural invariant; the error says which one broke. For tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut used = vec![0u64; self.vms.len()];
        let mut dirty = vec![0u64; self.vms.len()];
        // Poisoned blocks are never victims: a VM may hold them above its target.
        let mut poisoned = vec![0u64; self.vms.len()];
        let mut held = vec![vec![0u64; self.stores.len()]; self.vms.len()];
        let mut store_used = vec![0u64; self.stores.len()];
        for s in 0..self.slots.len() as u32 {
            let key = self.slots.key(s);
            if key == FREE_KEY {
                if self.valid.any(s, (0, self.spb)) || self.dirty.any(s, (0, self.spb)) {
                    return Err(format!("free slot {s} has valid or dirty sectors"));
                }
                continue;
            }
            if self.index.get(key, |x| self.slots.key(x)) != Some(s) {
                return Err(format!("slot {s} is not found by its key"));
            }
            let vm = key_vm(key) as usize;
            used[vm] += 1;
            held[vm][self.store_of(s) as usize] += 1;
            store_used[self.store_of(s) as usize] += 1;
            if self.dirty.any(s, (0, self.spb)) {
                dirty[vm] += 1;
            }
            poisoned[vm] += u64::from(self.poisoned(s));
            for sec in 0..self.spb {
                if self.dirty.get(s, sec) && !self.valid.get(s, sec) {
                    return Err(format!("slot {s} sector {sec} dirty but not valid"));
                }
            }
            if !self.valid.any(s, (0, self.spb)) {
                return Err(format!("resident slot {s} has no valid sector"));
            }
        }
        let total: u64 = used.iter().sum();
        if self.index.count() as u64 != total {
            return Err(format!("index holds {} entries for {total} resident slots", self.index.count()));
        }
        let limbo = self.dur.limbo_len() as u64;
        let idle = self.withheld.idle_len() as u64;
        let mirrors = self.mirrors.len() as u64;
        if total + self.free_slots() + limbo + idle + mirrors != self.slots.len() as u64 {
            return Err(format!(
                "{total} used + {} free + {limbo} in limbo + {idle} withheld + {mirrors} mirrors != {} slots",
                self.free_slots(),
                self.slots.len()
            ));
        }
        self.check_mirrors()?;
        if let Some(s) = self.withheld.broken(|s| self.slots.key(s) != FREE_KEY) {
            return Err(format!("withheld slot {s} holds a block or is not withheld"));
        }
        for st in self.stores.ids() {
            let (counted, holds) = (self.stores.used(st), store_used[st as usize]);
            if counted != holds {
                return Err(format!("store {st}: counted {counted} slots in use, holds {holds}"));
            }
        }
        for (vm, p) in self.vms.iter().enumerate() {
            if p.used != used[vm] {
                return Err(format!("vm {vm}: counted {} used slots, holds {}", p.used, used[vm]));
            }
            if p.held != held[vm] {
                return Err(format!("vm {vm}: counted {:?} slots by store, holds {:?}", p.held, held[vm]));
            }
            if p.dirty_blocks != dirty[vm] {
                return Err(format!("vm {vm}: counted {} dirty blocks, holds {}", p.dirty_blocks, dirty[vm]));
            }
            if let Some(r) = &p.repl {
                if r.len() as u64 != p.used {
                    return Err(format!("vm {vm}: policy tracks {} slots, VM holds {}", r.len(), p.used));
                }
                if p.used > p.target + poisoned[vm] && !p.paced && !self.flight.has_pins() {
                    return Err(format!("vm {vm}: holds {} slots above its target {}", p.used, p.target));
                }
            }
        }
        if let Some(r) = &self.shared {
            if r.len() as u64 != total {
                return Err(format!("shared policy tracks {} slots, {total} are used", r.len()));
            }
        }
        Ok(())
    }
}

impl Engine {
    /// Drops sectors `lo..hi` of `vm`'s `block` from the cache, dirty or not (their bytes
    /// in the cache store are no longer trustworthy: a failed device write or read). A
    /// block left with no valid sector frees its slot. Returns whether the block was cached.
    pub fn discard(&mut self, vm: VmId, block: u64, (lo, hi): (u32, u32)) -> bool {
        let Some(s) = self.lookup(vm, block) else { return false };
        let hi = hi.min(self.spb);
        if lo < hi {
            self.invalidate(vm, s, (lo, hi));
        }
        true
    }
}

impl Engine {
    /// Up to `max` dirty blocks of `vm` (or of every VM) as keys in backing-address order
    /// (by VM, then block): the next batch for a flusher or destage job, found by scanning
    /// the dirty bitmap from slot `cursor` on (wrapping around at most once, skipping clean
    /// words); `cursor` moves past the last slot taken, so successive batches sweep the
    /// whole cache.
    pub fn dirty_batch(&self, vm: Option<VmId>, cursor: &mut u32, max: usize) -> Vec<u64> {
        let n = self.slots.len() as u32;
        let none_dirty = match vm {
            Some(v) => self.vms.get(v as usize).is_none_or(|p| p.dirty_blocks == 0),
            None => self.vms.iter().all(|p| p.dirty_blocks == 0),
        };
        let mut keys = Vec::new();
        if max == 0 || n == 0 || none_dirty {
            return keys;
        }
        let start = *cursor % n;
        let mut at = start;
        let mut wrapped = false;
        loop {
            let end = if wrapped { start } else { n };
            let Some(s) = self.dirty.next_set_slot(at, end) else {
                if wrapped || start == 0 {
                    break;
                }
                (wrapped, at) = (true, 0);
                continue;
            };
            let key = self.slots.key(s);
            if key != FREE_KEY && vm.is_none_or(|v| key_vm(key) == v) {
                keys.push(key);
                if keys.len() == max {
                    *cursor = (s + 1) % n;
                    break;
                }
            }
            at = s + 1;
        }
        keys.sort_unstable();
        keys
    }

    /// The blocks in `lo..hi` of `vm` that are cached dirty (some sector not yet on the
    /// backing store), in order: what a block-status answer must count as data whatever
    /// the backing store says. Looks each block up for a short range, scans the dirty
    /// bitmap (skipping clean words) for a long one.
    pub fn dirty_blocks_in(&self, vm: VmId, lo: u64, hi: u64) -> Vec<u64> {
        if self.vms.get(vm as usize).is_none_or(|p| p.dirty_blocks == 0) || lo >= hi {
            return Vec::new();
        }
        let n = self.slots.len() as u32;
        if hi - lo <= u64::from(n / 64).max(64) {
            return (lo..hi).filter(|&b| self.lookup(vm, b).is_some_and(|s| self.slot_dirty(s))).collect();
        }
        let mut blocks = Vec::new();
        let mut at = 0;
        while let Some(s) = self.dirty.next_set_slot(at, n) {
            let key = self.slots.key(s);
            if key != FREE_KEY && key_vm(key) == vm && (lo..hi).contains(&key_block(key)) {
                blocks.push(key_block(key));
            }
            at = s + 1;
        }
        blocks.sort_unstable();
        blocks
    }

    /// Blocks of `vm` in `lo..hi` whose bytes may be on the cache store only: cached
    /// dirty, or with work in flight — a write-back marks its block clean when it is handed
    /// out (`writeback`), before its backing write has run, and the block stays busy until
    /// that job retires. BLOCK_STATUS reports them as data (a client skipping what it is
    /// told reads as zeros would otherwise skip a block mid-write-back). Ascending.
    pub fn unsettled_blocks_in(&self, vm: VmId, lo: u64, hi: u64) -> Vec<u64> {
        let mut blocks = self.dirty_blocks_in(vm, lo, hi);
        let before = blocks.len();
        blocks.extend(
            self.flight
                .held_blocks()
                .filter(|&k| k != FREE_KEY && key_vm(k) == vm && (lo..hi).contains(&key_block(k)))
                .map(key_block),
        );
        if blocks.len() > before {
            blocks.sort_unstable();
            blocks.dedup();
        }
        blocks
    }

    /// Writes block `block` of `vm` back if it is cached dirty, leaving it cached clean
    /// (one block of a [`Self::dirty_batch`]); returns the blocks written back (0 or 1).
    pub fn destage_block(&mut self, vm: VmId, block: u64, out: &mut Output) -> u64 {
        out.clear();
        let Some(s) = self.lookup(vm, block).filter(|&s| !self.flight.pinned(s) && !self.poisoned(s)) else { return 0 };
        (self.writeback(vm, s, (0, self.spb), 0, false, out) > 0) as u64
    }
}

#[cfg(test)]
mod tests {
    use crate::{Engine, EngineConfig, OpKind, Output};
    use cachevisor_trace::{Op, Request};

    #[test]
    fn dirty_batches_sweep_the_cache_in_address_order_and_leave_blocks_cached() {
        let mut e = Engine::new(EngineConfig::with_slots(16)).unwrap();
        let mut out = Output::default();
        e.set_target(0, 8, &mut out);
        e.set_target(1, 8, &mut out);
        for b in [9u64, 3, 7, 1, 5] {
            e.access(0, &Request { time_ns: 0, vm: 0, op: Op::Write, offset: b * 4096, len: 4096 }, &mut out);
        }
        for b in [4u64, 2] {
            e.access(0, &Request { time_ns: 0, vm: 1, op: Op::Write, offset: b * 4096, len: 4096 }, &mut out);
        }
        let key = |vm: u32, b: u64| crate::slot_table::pack_key(vm, b);
        // One VM's blocks only, sorted.
        let mut cursor = 0;
        assert_eq!(e.dirty_batch(Some(1), &mut cursor, 10), [key(1, 2), key(1, 4)]);
        let mut written = Vec::new();
        for k in e.dirty_batch(Some(1), &mut 0, 10) {
            assert_eq!(e.destage_block(1, crate::slot_table::key_block(k), &mut out), 1);
            written
                .extend(out.ops.iter().filter(|o| o.kind == OpKind::BackingWrite).map(|o| (o.vm, o.disk_addr / 4096)));
        }
        assert_eq!(written, [(1, 2), (1, 4)]);
        assert_eq!((e.partition(0).dirty_blocks, e.partition(1).dirty_blocks, e.partition(1).used), (5, 0, 2));
        assert!(e.dirty_batch(Some(1), &mut 0, 10).is_empty());
        assert_eq!(e.destage_block(1, 2, &mut out), 0, "clean now: nothing to write");
        // Batches of 2 from a moving cursor sweep every dirty block, then wrap around.
        let mut cursor = 0;
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.extend(e.dirty_batch(None, &mut cursor, 2));
        }
        assert_eq!(seen.len(), 6);
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, [1u64, 3, 5, 7, 9].map(|b| key(0, b)));
        e.check_invariants().unwrap();
    }

    proptest::proptest! {
        /// `dirty_blocks_in` against looking every block up, on both of its paths (short
        /// ranges by lookup, long ones by the bitmap scan).
        #[test]
        fn dirty_blocks_in_a_range_match_brute_force(
            writes in proptest::collection::vec((0u32..2, 0u64..400, proptest::bool::ANY), 0..120),
            lo in 0u64..400,
            span in 0u64..400,
        ) {
            let mut e = Engine::new(EngineConfig::with_slots(128)).unwrap();
            let mut out = Output::default();
            e.set_target(0, 64, &mut out);
            e.set_target(1, 64, &mut out);
            for (vm, b, write) in writes {
                let op = if write { Op::Write } else { Op::Read };
                e.access(0, &Request { time_ns: 0, vm, op, offset: b * 4096, len: 4096 }, &mut out);
            }
            for vm in 0..2 {
                let hi = lo + span;
                let brute: Vec<u64> = (lo..hi).filter(|&b| e.lookup(vm, b).is_some_and(|s| e.slot_dirty(s))).collect();
                proptest::prop_assert_eq!(e.dirty_blocks_in(vm, lo, hi), brute);
            }
        }
    }

    #[test]
    fn bypass_keeps_dirty_blocks_and_takes_no_slots() {
        let mut e = Engine::new(EngineConfig::with_slots(16)).unwrap();
        let mut out = Output::default();
        e.set_target(0, 8, &mut out);
        e.set_write_policy(0, crate::WritePolicy::Wb, &mut out);
        let req = |op, b: u64| Request { time_ns: 0, vm: 0, op, offset: b * 4096, len: 4096 };
        for b in 0..4 {
            e.access(0, &req(Op::Write, b), &mut out);
        }
        e.set_bypass(0, true);
        assert_eq!((e.partition(0).used, e.partition(0).dirty_blocks), (4, 4), "nothing written back, nothing dropped");
        // A dirty block still hits; a miss reads the backing store and takes no slot.
        e.access(0, &req(Op::Read, 1), &mut out);
        assert!(out.all_hit());
        e.access(0, &req(Op::Read, 9), &mut out);
        assert!(out.ops.iter().all(|o| o.kind == OpKind::BackingRead) && e.lookup(0, 9).is_none());
        // A write goes to the backing store and the cached copy of what it covers leaves.
        e.access(0, &req(Op::Write, 2), &mut out);
        assert!(out.ops.iter().all(|o| o.kind == OpKind::BackingWrite) && e.lookup(0, 2).is_none());
        assert_eq!(e.partition(0).dirty_blocks, 3);
        e.check_invariants().unwrap();
        // A one-off read without insertion, outside bypass.
        e.set_bypass(0, false);
        e.access_no_insert(0, &req(Op::Read, 10), &mut out);
        assert!(e.lookup(0, 10).is_none());
        e.access(0, &req(Op::Read, 10), &mut out);
        assert!(e.lookup(0, 10).is_some());
    }
}

/// What decides which of a VM's misses enter the cache ([`Engine::set_entry`]).
#[derive(Debug, Clone, Copy)]
pub struct VmEntry<'a> {
    /// Sequential cutoff in bytes (`None`: left as it is).
    pub sequential_cutoff: Option<u64>,
    /// Read and write misses' admission.
    pub admission: (AdmissionPolicy, AdmissionPolicy),
    /// Prefetch.
    pub prefetch: crate::block_prefetch::PrefetchPolicy,
    /// I/O classes as configured (resolved and checked here).
    pub classes: &'a [crate::io_class::IoClassSection],
}

/// What a VM's entry policies did (`Engine::entry_state`), the block the simulator's
/// report and the daemon's status carry for each VM; each part only when the VM has it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct EntryState {
    /// Its admission, when not every miss enters (`block_admission.rs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionState>,
    /// Its prefetch, when it prefetches (`block_prefetch.rs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<crate::block_prefetch::PrefetchState>,
    /// Read and write misses sent around the cache because its device was congested.
    #[serde(skip_serializing_if = "is_zero_pair")]
    pub congestion_bypassed: [u64; 2],
    /// Its I/O classes' figures, its unclassified requests first (`io_class.rs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub classes: Option<Vec<crate::io_class::ClassCounts>>,
    /// Its part of the cache's shared write budget (`shared_budget.rs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget_share: Option<crate::shared_budget::BudgetShare>,
}

fn is_zero_pair(p: &[u64; 2]) -> bool {
    *p == [0, 0]
}
