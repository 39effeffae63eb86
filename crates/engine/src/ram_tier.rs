//! The RAM tier (`[cache] ram`, issue 58 point 5): clean copies of the hottest cached
//! blocks in memory in front of the SSDs, as CacheLib's hybrid cache keeps a DRAM cache
//! in front of its flash devices.
//!
//! - **Inclusive and clean only.** A RAM copy is a copy of sectors an SSD slot holds; the
//!   SSD keeps the block (dirty data included), so the tier never holds the only copy of
//!   anything and losing it (a restart, a crash) loses nothing. Nothing of it is journaled.
//! - **Filled on SSD hits** (CacheLib promotes an item to DRAM on every flash hit): a read
//!   served from an SSD slot also writes what it read into a RAM slot, staged from that
//!   read, in the next phase, not waited for — no extra device read. [`RamFill::SecondHit`]
//!   fills only on a block's second SSD hit among the recent ones (a ghost list as long as
//!   the tier), as CacheLib's DRAM admission can be made to require; `cachevisor simulate`
//!   measures both (`docs/simulator.md`).
//! - **Served** when its copy holds every sector a read wants: the read is one RAM op.
//! - **Kept coherent** by dropping a copy whenever its SSD slot changes: any SSD write to
//!   the slot (a client write, a fill, a move), the slot forgotten (evicted, freed, moved
//!   away) or sectors of it invalidated. A request and the requests after it on the same
//!   block never overlap (`inflight.rs`), so a copy filled by one is complete before the
//!   next reads it; a fill that fails, or never runs, drops the copy (`repair.rs`).
//! - **Sized by the same allocator**: with partitions, a vDisk may hold RAM copies in
//!   proportion to its cache target (a vDisk under its share takes the slot of the one
//!   most over its own); shared, one LRU over every vDisk.
//! - A RAM slot with ops in flight is never reused (its own pin counts: the store table's
//!   pins count store slots).
//!
//! Hand-written: bookkeeping over the engine's own slots and jobs.

use crate::engine::Engine;
use crate::output::{DeviceOp, Location, OpKind, Output, NO_SLOT};
use crate::sector_bits::{SectorBits, SectorRange};
use cachevisor_trace::VmId;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;

/// When an SSD hit fills the RAM tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RamFill {
    /// Every SSD hit (CacheLib's default promotion from flash to DRAM).
    #[default]
    EveryHit,
    /// A block's second SSD hit while it is among the tier's recent SSD hits.
    SecondHit,
}

impl std::str::FromStr for RamFill {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "every-hit" => Ok(RamFill::EveryHit),
            "second-hit" => Ok(RamFill::SecondHit),
            _ => Err(format!("ram fill '{s}': use every-hit or second-hit")),
        }
    }
}

/// The tier's counters ([`Engine::ram_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RamStats {
    /// RAM slots (blocks the tier holds at most).
    pub slots: u64,
    /// Slots holding a copy.
    pub used: u64,
    /// Reads served from RAM, every vDisk's.
    pub hits: u64,
    /// Copies written (new ones, and sectors added to one).
    pub fills: u64,
    /// Copies dropped to make room for another.
    pub evictions: u64,
    /// Copies dropped because their SSD slot changed.
    pub dropped: u64,
}

/// A vDisk's copies, least recently used first.
#[derive(Debug, Clone, Copy)]
struct VmList {
    head: u32,
    tail: u32,
    count: u64,
    hits: u64,
}

impl Default for VmList {
    fn default() -> Self {
        VmList { head: NO_SLOT, tail: NO_SLOT, count: 0, hits: 0 }
    }
}

/// The RAM slots and what they hold.
#[derive(Debug, Clone, Default)]
pub(crate) struct RamTier {
    n: u32,
    fill: RamFill,
    /// Per RAM slot: the SSD slot whose copy it holds (`NO_SLOT`: none).
    of: Vec<u32>,
    /// Per RAM slot: the block key its SSD slot held when the copy was made.
    key: Vec<u64>,
    vm: Vec<VmId>,
    valid: Option<SectorBits>,
    pins: Vec<u16>,
    prev: Vec<u32>,
    next: Vec<u32>,
    last_use: Vec<u64>,
    tick: u64,
    /// `tick` when the request being processed began: a copy used since is never its
    /// victim (its op, emitted, is not pinned until the request is dispatched).
    pub(crate) req_from: u64,
    lists: Vec<VmList>,
    by_ssd: FxHashMap<u32, u32>,
    /// Free RAM slots with no op in flight.
    free: Vec<u32>,
    /// SSD slots hit recently without a copy ([`RamFill::SecondHit`]).
    ghost: VecDeque<u32>,
    ghosted: rustc_hash::FxHashSet<u32>,
    stats: RamStats,
}

impl RamTier {
    #[inline]
    pub(crate) fn on(&self) -> bool {
        self.n > 0
    }

    /// The use counter (what `req_from` is set to).
    #[inline]
    pub(crate) fn tick(&self) -> u64 {
        self.tick
    }

    /// The SSD slot `s` changed (written, forgotten, sectors invalidated): its copy goes.
    #[inline]
    pub(crate) fn ssd_changed(&mut self, s: u32) {
        if let Some(q) = self.by_ssd.remove(&s) {
            self.stats.dropped += 1;
            self.release(q);
        }
    }

    /// Takes RAM slot `q` out of its list and frees it (once no op is in flight on it).
    fn release(&mut self, q: u32) {
        let i = q as usize;
        if self.of[i] == NO_SLOT {
            return;
        }
        self.by_ssd.remove(&self.of[i]);
        self.unlink(q);
        self.of[i] = NO_SLOT;
        if self.pins[i] == 0 {
            self.free.push(q);
        }
    }

    fn unlink(&mut self, q: u32) {
        let i = q as usize;
        let l = &mut self.lists[self.vm[i] as usize];
        l.count -= 1;
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NO_SLOT {
            l.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NO_SLOT {
            l.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
    }

    /// Puts `q` at the most recent end of `vm`'s list.
    fn push_mru(&mut self, q: u32, vm: VmId) {
        if self.lists.len() <= vm as usize {
            self.lists.resize(vm as usize + 1, VmList::default());
        }
        let i = q as usize;
        self.vm[i] = vm;
        self.tick += 1;
        self.last_use[i] = self.tick;
        let l = &mut self.lists[vm as usize];
        l.count += 1;
        self.prev[i] = l.tail;
        self.next[i] = NO_SLOT;
        if l.tail == NO_SLOT {
            l.head = q;
        } else {
            self.next[l.tail as usize] = q;
        }
        l.tail = q;
    }

    fn touch(&mut self, q: u32) {
        let vm = self.vm[q as usize];
        self.unlink(q);
        self.push_mru(q, vm);
    }

    /// The least recently used copy of `vm` with no op in flight (a few looked at).
    fn victim_of(&self, vm: VmId) -> Option<u32> {
        let mut q = self.lists.get(vm as usize)?.head;
        for _ in 0..16 {
            if q == NO_SLOT {
                return None;
            }
            if self.pins[q as usize] == 0 && self.last_use[q as usize] <= self.req_from {
                return Some(q);
            }
            q = self.next[q as usize];
        }
        None
    }

    /// Whether an SSD hit on slot `s` fills the tier now.
    fn wants(&mut self, s: u32) -> bool {
        match self.fill {
            RamFill::EveryHit => true,
            RamFill::SecondHit => {
                if self.ghosted.remove(&s) {
                    return true;
                }
                if self.ghost.len() >= self.n as usize {
                    if let Some(old) = self.ghost.pop_front() {
                        self.ghosted.remove(&old);
                    }
                }
                self.ghost.push_back(s);
                self.ghosted.insert(s);
                false
            }
        }
    }
}

impl Engine {
    /// Turns the RAM tier on with `slots` blocks of memory (0: off), filled by `fill`. Set
    /// before the first request; a driver that changes it restarts the engine's tier with
    /// no op of it in flight (every copy is dropped: nothing in it is the only copy).
    pub fn set_ram_tier(&mut self, slots: u64, fill: RamFill) {
        let n = slots.min(u64::from(NO_SLOT - 1)) as u32;
        debug_assert!(self.ram.pins.iter().all(|&p| p == 0), "the RAM tier is reset with ops in flight");
        self.ram = RamTier {
            n,
            fill,
            of: vec![NO_SLOT; n as usize],
            key: vec![0; n as usize],
            vm: vec![0; n as usize],
            valid: (n > 0).then(|| SectorBits::new(n as usize, self.spb)),
            pins: vec![0; n as usize],
            prev: vec![NO_SLOT; n as usize],
            next: vec![NO_SLOT; n as usize],
            last_use: vec![0; n as usize],
            free: (0..n).rev().collect(),
            ..Default::default()
        };
    }

    /// The RAM tier's counters.
    pub fn ram_stats(&self) -> RamStats {
        RamStats { slots: u64::from(self.ram.n), used: self.ram.by_ssd.len() as u64, ..self.ram.stats }
    }

    /// `vm`'s copies in the RAM tier and the reads it served from there.
    pub fn ram_of(&self, vm: VmId) -> (u64, u64) {
        self.ram.lists.get(vm as usize).map_or((0, 0), |l| (l.count, l.hits))
    }

    /// RAM slots `vm` may hold: its share of the tier as its target is of every target
    /// (partitions), the whole tier (shared).
    fn ram_quota(&self, vm: VmId) -> u64 {
        let n = u64::from(self.ram.n);
        if self.shared.is_some() {
            return n;
        }
        let total: u64 = self.vms.iter().map(|p| p.target).sum();
        let mine = self.vms.get(vm as usize).map_or(0, |p| p.target);
        if total == 0 {
            return 0;
        }
        (u128::from(n) * u128::from(mine) / u128::from(total)) as u64
    }

    /// A RAM slot for a new copy of `vm`'s: a free one, else the least recently used copy
    /// of the vDisk most over its share (partitions; `vm`'s own when it is at its share),
    /// or of every vDisk (shared).
    fn ram_slot_for(&mut self, vm: VmId) -> Option<u32> {
        if let Some(q) = self.ram.free.pop() {
            return Some(q);
        }
        let victim_vm = if self.shared.is_some() {
            let lists = &self.ram.lists;
            (0..lists.len())
                .filter(|&v| lists[v].head != NO_SLOT)
                .min_by_key(|&v| self.ram.last_use[lists[v].head as usize])? as VmId
        } else {
            let mine = self.ram.lists.get(vm as usize).map_or(0, |l| l.count);
            let over = (0..self.ram.lists.len() as VmId)
                .map(|v| (v, self.ram.lists[v as usize].count.saturating_sub(self.ram_quota(v))))
                .filter(|&(_, o)| o > 0)
                .max_by_key(|&(_, o)| o);
            match over {
                Some((v, _)) if mine < self.ram_quota(vm) => v,
                _ if mine > 0 => vm,
                _ => return None,
            }
        };
        let q = self.ram.victim_of(victim_vm)?;
        self.ram.stats.evictions += 1;
        self.ram.release(q);
        self.ram.free.pop()
    }

    /// A read of sectors `r` of `vm`'s block `b`, cached in SSD slot `s`, served from its
    /// RAM copy if that holds them: the op is emitted and `true` returned.
    #[inline]
    pub(crate) fn ram_read(&mut self, vm: VmId, b: u64, s: u32, r: SectorRange, out: &mut Output) -> bool {
        let Some(&q) = self.ram.by_ssd.get(&s) else { return false };
        debug_assert_eq!(
            self.ram.key[q as usize],
            self.slots.key(s),
            "RAM slot {q} copies SSD slot {s} of another block"
        );
        if !self.ram.valid.as_ref().is_some_and(|v| v.all(q, r)) {
            return false;
        }
        self.ram.touch(q);
        self.ram.lists[vm as usize].hits += 1;
        self.ram.stats.hits += 1;
        let op = DeviceOp { client: true, ..self.op(OpKind::RamRead, Location::Ram, vm, b, q, r, 0, true) };
        self.emit(out, op);
        true
    }

    /// An SSD hit of sectors `r` of slot `s`: the RAM slot its bytes go to as well, if the
    /// tier takes them now (the caller marks its SSD read staged and calls
    /// [`Self::ram_fill`] with it).
    #[inline]
    pub(crate) fn ram_fill_slot(&mut self, vm: VmId, s: u32) -> Option<u32> {
        if let Some(&q) = self.ram.by_ssd.get(&s) {
            // A copy lacking some sectors: they are added. Touched, so no later block of
            // this request takes the slot for its own copy (before, one did: two blocks'
            // bytes in one RAM slot, found by the crash-consistency model).
            self.ram.touch(q);
            return Some(q);
        }
        if !self.ram.wants(s) {
            return None;
        }
        let q = self.ram_slot_for(vm)?;
        if let Some(v) = self.ram.valid.as_mut() {
            v.clear_all(q); // nothing of its last copy is this block's
        }
        self.ram.of[q as usize] = s;
        self.ram.key[q as usize] = self.slots.key(s);
        self.ram.by_ssd.insert(s, q);
        self.ram.push_mru(q, vm);
        Some(q)
    }

    /// Writes what SSD read `source` returns (sectors `r` of `vm`'s block `b`) into RAM
    /// slot `q`, in the phase after it, not waited for.
    pub(crate) fn ram_fill(&mut self, vm: VmId, b: u64, q: u32, r: SectorRange, source: u64, out: &mut Output) {
        let op = self.op(OpKind::RamWrite, Location::Ram, vm, b, q, r, 1, false);
        self.emit(out, DeviceOp { staged: true, source: std::num::NonZeroU64::new(source), ..op });
        if let Some(v) = self.ram.valid.as_mut() {
            v.set(q, r);
        }
        self.ram.stats.fills += 1;
    }

    /// One more op of a dispatched job on RAM slot `q`.
    #[inline]
    pub(crate) fn ram_pin(&mut self, q: u32) {
        self.ram.pins[q as usize] += 1;
    }

    /// One op on RAM slot `q` ended for good.
    #[inline]
    pub(crate) fn ram_unpin(&mut self, q: u32) {
        let i = q as usize;
        self.ram.pins[i] -= 1;
        // A copy dropped while ops ran on it is free now (one never pinned went at once).
        if self.ram.pins[i] == 0 && self.ram.of[i] == NO_SLOT {
            debug_assert!(!self.ram.free.contains(&q), "RAM slot {q} freed twice");
            self.ram.free.push(q);
        }
    }

    /// A RAM op of a failed job did not complete (failed, or never ran): the copy goes.
    pub(crate) fn ram_op_lost(&mut self, q: u32) {
        if self.ram.of[q as usize] != NO_SLOT {
            self.ram.stats.dropped += 1;
            self.ram.release(q);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EngineConfig, PartitionMode};
    use cachevisor_trace::{Op, Request};

    const BS: u64 = 4096;

    fn engine(slots: u64, ram: u64, fill: RamFill, vms: &[u64]) -> Engine {
        let mut e = Engine::new(EngineConfig::with_slots(slots)).unwrap();
        let mut out = Output::default();
        for (vm, &t) in vms.iter().enumerate() {
            e.set_target(vm as VmId, t, &mut out);
        }
        e.set_ram_tier(ram, fill);
        e
    }

    /// Runs one 4 KiB request of block `b`; the kinds of its ops.
    fn io(e: &mut Engine, vm: VmId, b: u64, op: Op) -> Vec<OpKind> {
        let mut out = Output::default();
        e.access(0, &Request { time_ns: 0, vm, op, offset: b * BS, len: BS as u32 }, &mut out);
        out.ops.iter().map(|o| o.kind).collect()
    }

    #[test]
    fn an_ssd_hit_fills_ram_from_its_own_read_and_the_next_hit_is_served_from_ram() {
        let mut e = engine(8, 2, RamFill::EveryHit, &[8]);
        assert_eq!(io(&mut e, 0, 1, Op::Read), [OpKind::BackingRead, OpKind::SsdWrite]);
        let mut out = Output::default();
        e.access(0, &Request { time_ns: 0, vm: 0, op: Op::Read, offset: BS, len: BS as u32 }, &mut out);
        let (read, fill) = (out.ops[0], out.ops[1]);
        assert_eq!((read.kind, fill.kind, fill.loc), (OpKind::SsdRead, OpKind::RamWrite, Location::Ram));
        assert!(read.staged && read.client && fill.staged && !fill.client && !fill.sync);
        assert_eq!((fill.source_id(), fill.phase), (Some(read.id), 1), "the copy is what the SSD read returned");
        assert_eq!(io(&mut e, 0, 1, Op::Read), [OpKind::RamRead]);
        assert_eq!(e.ram_of(0), (1, 1));
        assert_eq!(e.ram_stats().hits, 1);
    }

    #[test]
    fn a_write_drops_the_copy_and_the_next_read_goes_to_the_ssd() {
        let mut e = engine(8, 2, RamFill::EveryHit, &[8]);
        io(&mut e, 0, 1, Op::Read);
        io(&mut e, 0, 1, Op::Read);
        assert_eq!(io(&mut e, 0, 1, Op::Read), [OpKind::RamRead]);
        assert_eq!(io(&mut e, 0, 1, Op::Write), [OpKind::SsdWrite]);
        assert_eq!(e.ram_stats().used, 0);
        assert_eq!(io(&mut e, 0, 1, Op::Read), [OpKind::SsdRead, OpKind::RamWrite]);
        // Evicted from the SSD (a cache of 1 slot): the copy goes with it.
        let mut e = engine(1, 2, RamFill::EveryHit, &[1]);
        io(&mut e, 0, 1, Op::Read);
        io(&mut e, 0, 1, Op::Read);
        io(&mut e, 0, 2, Op::Read);
        assert_eq!(e.ram_stats().used, 0, "an inclusive tier holds only blocks the SSD holds");
    }

    #[test]
    fn second_hit_fills_only_a_block_hit_again() {
        let mut e = engine(8, 2, RamFill::SecondHit, &[8]);
        io(&mut e, 0, 1, Op::Read);
        assert_eq!(io(&mut e, 0, 1, Op::Read), [OpKind::SsdRead], "first SSD hit: remembered only");
        assert_eq!(io(&mut e, 0, 1, Op::Read), [OpKind::SsdRead, OpKind::RamWrite]);
        assert_eq!(io(&mut e, 0, 1, Op::Read), [OpKind::RamRead]);
    }

    #[test]
    fn the_least_recently_used_copy_makes_room() {
        let mut e = engine(8, 2, RamFill::EveryHit, &[8]);
        for b in [1, 2, 3] {
            io(&mut e, 0, b, Op::Read);
        }
        io(&mut e, 0, 1, Op::Read);
        io(&mut e, 0, 2, Op::Read);
        assert_eq!(io(&mut e, 0, 1, Op::Read), [OpKind::RamRead]); // 2 is the LRU now
        io(&mut e, 0, 3, Op::Read); // fills, evicting 2
        assert_eq!(io(&mut e, 0, 1, Op::Read), [OpKind::RamRead]);
        assert_eq!(io(&mut e, 0, 2, Op::Read), [OpKind::SsdRead, OpKind::RamWrite]);
        assert_eq!(e.ram_stats().evictions, 2);
    }

    #[test]
    fn partitions_share_the_tier_as_their_targets_and_shared_mode_is_one_lru() {
        // Targets 6:2 over a tier of 4: VM 0 may hold 3 copies, VM 1 one.
        let mut e = engine(8, 4, RamFill::EveryHit, &[6, 2]);
        for b in 0..6 {
            io(&mut e, 0, b, Op::Read);
            io(&mut e, 0, b, Op::Read);
        }
        assert_eq!(e.ram_of(0).0, 4, "alone it takes the whole tier");
        for b in 0..2 {
            io(&mut e, 1, b, Op::Read);
            io(&mut e, 1, b, Op::Read);
        }
        assert_eq!((e.ram_of(0).0, e.ram_of(1).0), (3, 1), "VM 1 takes back its share, no more");
        // Shared: the least recently used copy of any VM goes.
        let cfg = EngineConfig { partition: PartitionMode::Shared, ..EngineConfig::with_slots(8) };
        let mut e = Engine::new(cfg).unwrap();
        e.set_ram_tier(2, RamFill::EveryHit);
        for (vm, b) in [(0, 0), (1, 0), (0, 1)] {
            io(&mut e, vm, b, Op::Read);
            io(&mut e, vm, b, Op::Read);
        }
        assert_eq!((e.ram_of(0).0, e.ram_of(1).0), (1, 1));
        assert_eq!(io(&mut e, 1, 0, Op::Read), [OpKind::RamRead]);
        assert_eq!(io(&mut e, 0, 1, Op::Read), [OpKind::RamRead]);
    }

    #[test]
    fn a_read_wanting_sectors_the_copy_lacks_adds_them_from_the_ssd() {
        let mut e = engine(8, 2, RamFill::EveryHit, &[8]);
        io(&mut e, 0, 1, Op::Read);
        let mut out = Output::default();
        let half = |lo: u64| Request { time_ns: 0, vm: 0, op: Op::Read, offset: BS + lo, len: 2048 };
        e.access(0, &half(0), &mut out);
        assert_eq!(out.ops[1].kind, OpKind::RamWrite);
        e.access(0, &half(2048), &mut out);
        assert_eq!(out.ops.iter().map(|o| o.kind).collect::<Vec<_>>(), [OpKind::SsdRead, OpKind::RamWrite]);
        assert_eq!(out.ops[1].slot, 0, "the same RAM slot");
        assert_eq!(io(&mut e, 0, 1, Op::Read), [OpKind::RamRead]);
    }

    #[test]
    fn a_request_never_gives_one_ram_slot_to_two_of_its_blocks() {
        // One RAM slot holding half of block 1; a read of blocks 1 and 2: block 1's copy
        // is completed, and block 2 may not take its slot in the same request.
        let mut e = engine(8, 1, RamFill::EveryHit, &[8]);
        io(&mut e, 0, 1, Op::Read);
        io(&mut e, 0, 2, Op::Read);
        let mut out = Output::default();
        let half = Request { time_ns: 0, vm: 0, op: Op::Read, offset: BS, len: 2048 };
        e.access(0, &half, &mut out);
        assert_eq!(out.ops.iter().filter(|o| o.kind == OpKind::RamWrite).count(), 1);
        e.access(0, &Request { time_ns: 0, vm: 0, op: Op::Read, offset: BS, len: 2 * BS as u32 }, &mut out);
        let fills: Vec<u64> = out.ops.iter().filter(|o| o.kind == OpKind::RamWrite).map(|o| o.block(BS)).collect();
        assert_eq!(fills, [1], "only block 1's copy is written: {:?}", out.ops);
    }
}
