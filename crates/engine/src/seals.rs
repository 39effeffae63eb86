//! Persistent mode's *sealed* slots: which dirty blocks the journal may carry a
//! checksum for, so a restart can tell the bytes a client wrote from a cache store that
//! lost or garbled them (bcache and dm-cache keep no data checksums; ZFS checksums what
//! its L2ARC returns, which is written once — a cache whose dirty blocks are rewritten in
//! place must say when a checksum stops describing them).
//!
//! A slot whose record has been durable for [`Engine::set_seal_after`] with no change (a
//! block that went cold, dirty) gets a *seal record* in the next commit: its state with
//! `sealed` set, to which the driver adds a CRC32C of each dirty sector, computed from the
//! bytes it wrote there. From the moment that commit is handed out, a client write into
//! the slot waits for an intent commit whose record unseals it (`intents.rs`), so the
//! journal's checksums always describe bytes the store held when they were written, and a
//! crash leaves each sealed sector either matching or garbled — never a newer write's. Any
//! later record of the slot (a change, an intent) unseals it. Hot blocks, rewritten within
//! the window, are never sealed and never wait; a driver checks them against checksums it
//! keeps in memory while it runs.
//!
//! Sealing works by *region* ([`SEAL_REGION_SLOTS`] slots, as dm-integrity's bitmap mode
//! marks regions, not sectors): a slot is sealed only once no client write has gone into
//! its region for the window, and a write that must wait for a sealed slot unseals every
//! sealed slot of its region in the same commit. Random writes over a cache keep its
//! regions unsealed and never wait; a write into a region gone cold waits for one commit,
//! and its neighbours' writes after it none. The rule is checked by the crash model
//! (`tests/crash_consistency.rs`: no sealed sector that is not garbled fails its checksum
//! after any crash, every garbled one does).
//!
//! A cache read that fails its checksum (`Failure::Corrupt`) *poisons* its slot: it is
//! never a victim and never written back (the backing store keeps its older bytes rather
//! than garbage; a read of the block fails), until a client write to the slot lands.

use crate::durability::SlotRecord;
use crate::engine::Engine;
use std::collections::{HashMap, VecDeque};

/// Seals per commit at most (a commit's size stays bounded when many blocks go cold).
pub const MAX_SEALS_PER_COMMIT: usize = 4096;

/// Slots per region: the unit a write unseals and that must be cold to be sealed (16 MiB
/// of 4 KiB blocks: a random writer over a cache waits for at most one commit per 16 MiB
/// gone cold).
pub const SEAL_REGION_SLOTS: u32 = 4096;

/// Sealed slots and seal candidates (persistent mode).
#[derive(Debug, Clone, Default)]
pub(crate) struct Seals {
    /// How long a slot's record stays durable and unchanged before it is sealed (0: never).
    after_ns: u64,
    /// The driver's latest time.
    now_ns: u64,
    /// Sealed slots, one bit each.
    sealed: Vec<u64>,
    /// Per region, when a client write last went into one of its slots.
    written: Vec<u64>,
    /// Slots per region (0: [`SEAL_REGION_SLOTS`]).
    region: u32,
    /// Candidates: slot → when its newest record became durable.
    since: HashMap<u32, u64>,
    /// Candidates in the order they came (each slot once; a stale time is re-queued).
    queue: VecDeque<(u64, u32)>,
    /// Slots whose bytes failed their checksum, with the block key they held then: no
    /// write-back, no eviction.
    poisoned: HashMap<u32, u64>,
    /// Cache reads that failed their checksum, per job (job-table key, slot, block key):
    /// poisoned once the job's repair has put the block back where it was read.
    corrupt_reads: Vec<(usize, u32, u64)>,
}

impl Seals {
    /// A client write goes into slot `s` at the driver's latest time.
    #[inline]
    pub(crate) fn wrote(&mut self, s: u32) {
        if self.after_ns == 0 {
            return;
        }
        let r = (s / self.region_slots()) as usize;
        if self.written.len() <= r {
            self.written.resize(r + 1, 0);
        }
        self.written[r] = self.now_ns;
    }

    /// When a client write last went into `s`'s region.
    fn region_written(&self, s: u32) -> u64 {
        self.written.get((s / self.region_slots()) as usize).copied().unwrap_or(0)
    }

    /// Slots per region.
    fn region_slots(&self) -> u32 {
        if self.region == 0 {
            SEAL_REGION_SLOTS
        } else {
            self.region
        }
    }

    /// Whether slot `s` is sealed (the journal may hold checksums of its dirty sectors).
    pub(crate) fn is_sealed(&self, s: u32) -> bool {
        self.sealed.get(s as usize / 64).is_some_and(|w| w >> (s % 64) & 1 == 1)
    }

    fn set(&mut self, s: u32, on: bool) {
        let w = s as usize / 64;
        if self.sealed.len() <= w {
            if !on {
                return;
            }
            self.sealed.resize(w + 1, 0);
        }
        if on {
            self.sealed[w] |= 1 << (s % 64);
        } else {
            self.sealed[w] &= !(1 << (s % 64));
        }
    }

    /// Notes the driver's time.
    #[inline]
    pub(crate) fn at(&mut self, now_ns: u64) {
        self.now_ns = self.now_ns.max(now_ns);
    }

    /// Whether slot `s`, holding block key `key`, holds bytes that failed their checksum.
    #[inline]
    pub(crate) fn is_poisoned(&self, s: u32, key: u64) -> bool {
        !self.poisoned.is_empty() && self.poisoned.get(&s) == Some(&key)
    }
}

impl Engine {
    /// Persistent mode: seals a slot whose record has been durable for `after_ns` with no
    /// change (0, the default: never). The daemon seals after seconds; see the module doc.
    pub fn set_seal_after(&mut self, after_ns: u64) {
        self.seals.after_ns = after_ns;
    }

    /// Slots per sealing region (default [`SEAL_REGION_SLOTS`]; tests use small ones).
    pub fn set_seal_region(&mut self, slots: u32) {
        self.seals.region = slots.max(1);
    }

    /// Whether `slot` is sealed: the journal may hold checksums of its dirty sectors, and a
    /// client write into it waits for a record that unseals it.
    pub fn is_sealed(&self, slot: u32) -> bool {
        self.seals.is_sealed(slot)
    }

    /// A warm start: the newest record of `slot` the journal replayed was sealed (after
    /// [`Self::restore_slot`]); a write into it waits for a record that unseals it.
    pub fn restore_sealed(&mut self, slot: u32) {
        if self.slot_block(slot).is_some() {
            self.seals.set(slot, true);
        }
    }

    /// Slots whose bytes failed their checksum and still hold that block.
    pub fn poisoned_slots(&self) -> usize {
        self.seals.poisoned.iter().filter(|&(&s, &k)| self.slots.key(s) == k).count()
    }

    /// Whether slot `s` holds a block whose bytes cannot be read (they failed their
    /// checksum, or it is dirty on a dropped device with no copy): never a victim, never
    /// written back, never emptied from a withheld run.
    pub fn slot_unreadable(&self, s: u32) -> bool {
        self.poisoned(s)
    }

    /// Whether slot `s` holds bytes that failed their checksum (never a victim, never
    /// written back).
    #[inline]
    pub(crate) fn poisoned(&self, s: u32) -> bool {
        self.seals.is_poisoned(s, self.slots.key(s)) || self.lost_on_failed_device(s)
    }

    /// A cache read of `vm`'s `block` in `slot`, an op of job `job` (its table key),
    /// failed its checksum: the slot is poisoned once the job's repair is done
    /// ([`Self::poison_after_repair`]; a victim's block is back in its slot only then).
    pub(crate) fn corrupt_read(&mut self, job: usize, slot: u32, key: u64) {
        self.seals.corrupt_reads.push((job, slot, key));
    }

    /// Job `job` stopped and was repaired: the slots its reads found corrupt are poisoned
    /// when they hold the block they were read for — unless the block is dirty with a
    /// copy on another device (`dirty_mirror.rs`): it moves there once its ops end.
    pub(crate) fn poison_after_repair(&mut self, job: usize) {
        if self.seals.corrupt_reads.is_empty() {
            return;
        }
        let (mine, rest): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.seals.corrupt_reads).into_iter().partition(|c| c.0 == job);
        self.seals.corrupt_reads = rest;
        for (_, slot, key) in mine {
            if self.slots.key(slot) == key && !self.promote_when_idle(slot) {
                self.seals.poisoned.insert(slot, key);
            }
        }
    }

    /// A client write to `slot` landed: its bytes are the client's again.
    #[inline]
    pub(crate) fn unpoison(&mut self, slot: u32) {
        if !self.seals.poisoned.is_empty() {
            self.seals.poisoned.remove(&slot);
        }
    }

    /// A commit carrying `records` is durable: the ones of slots holding dirty sectors
    /// become seal candidates from now.
    pub(crate) fn seal_candidates(&mut self, records: &[SlotRecord]) {
        if self.seals.after_ns == 0 {
            return;
        }
        let now = self.seals.now_ns;
        for r in records.iter().filter(|r| r.block.is_some() && !r.sealed && r.dirty.iter().any(|&w| w != 0)) {
            if self.seals.since.insert(r.slot, now).is_none() {
                self.seals.queue.push_back((now, r.slot));
            }
        }
    }

    /// A commit carrying `records` is durable: a slot whose record there is not a seal is
    /// unsealed (the journal's newest word on it carries no checksum). Until then a slot
    /// stays sealed, whatever memory says: a write dispatched meanwhile waits for a commit
    /// after it.
    pub(crate) fn unseal_durable(&mut self, records: &[SlotRecord]) {
        if self.seals.sealed.is_empty() {
            return;
        }
        for r in records.iter().filter(|r| !r.sealed) {
            self.seals.set(r.slot, false);
        }
    }

    /// Whether a candidate is due for its seal (a commit is due then).
    pub(crate) fn seals_due(&self) -> bool {
        let s = &self.seals;
        s.after_ns != 0 && s.queue.front().is_some_and(|&(t, _)| s.now_ns.saturating_sub(t) >= s.after_ns)
    }

    /// The seal records for the commit being built (`taken`: slots that already have a
    /// record in it — a change, an intent). Each returned slot is sealed from now.
    pub(crate) fn take_seals(&mut self, taken: &[SlotRecord]) -> Vec<SlotRecord> {
        let mut seals = Vec::new();
        let (after, now) = (self.seals.after_ns, self.seals.now_ns);
        if after == 0 {
            return seals;
        }
        let mut retry = Vec::new();
        let taken: std::collections::HashSet<u32> = taken.iter().map(|r| r.slot).collect();
        while let Some(&(t, s)) = self.seals.queue.front() {
            if now.saturating_sub(t) < after || seals.len() >= MAX_SEALS_PER_COMMIT {
                break;
            }
            self.seals.queue.pop_front();
            let Some(&newest) = self.seals.since.get(&s) else { continue };
            if newest != t {
                retry.push((newest, s)); // a newer record came since: wait from then
                continue;
            }
            let dirty = self.slot_block(s).is_some() && self.dirty.any(s, (0, self.spb));
            if !dirty || self.seals.is_sealed(s) || self.poisoned(s) {
                self.seals.since.remove(&s);
                continue;
            }
            let region = self.seals.region_written(s);
            if now.saturating_sub(region) < after {
                // Its region is written to: sealed once that stops.
                self.seals.since.insert(s, region);
                retry.push((region, s));
                continue;
            }
            if self.flight.pinned(s) || taken.contains(&s) || self.dur.in_limbo(s) {
                // Busy now (a write-back reading it, a record in this commit): later.
                self.seals.since.insert(s, now);
                retry.push((now, s));
                continue;
            }
            self.seals.since.remove(&s);
            let mut r = self.record_of(s);
            r.sealed = true;
            self.seals.set(s, true);
            seals.push(r);
        }
        self.seals.queue.extend(retry);
        seals
    }

    /// The unsealing records a write that waits for sealed slot `s` takes along: every
    /// other sealed slot of its region that nothing is in flight on (its state is settled),
    /// so the region's next writes need no commit. `skip`: slots with a record already.
    pub(crate) fn region_unseals(&self, s: u32, skip: &[u32]) -> Vec<SlotRecord> {
        let n = self.seals.region_slots();
        let first = s / n * n;
        let end = (first + n).min(self.present());
        (first..end)
            .filter(|&n| n != s && self.seals.is_sealed(n) && !skip.contains(&n))
            .filter(|&n| self.slot_block(n).is_some() && !self.flight.pinned(n))
            .map(|n| self.record_of(n))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::{Engine, EngineConfig, Output};
    use cachevisor_trace::{Op, Request};

    fn write(e: &mut Engine, now: u64, b: u64) -> crate::ReqId {
        e.submit(now, &Request { time_ns: now, vm: 0, op: Op::Write, offset: b * 4096, len: 4096 })
    }

    /// Runs every op and commit until nothing moves; returns the records journaled.
    fn settle(e: &mut Engine, now: u64) -> Vec<crate::SlotRecord> {
        let mut journal = Vec::new();
        loop {
            let mut moved = false;
            while let Some(op) = e.poll_op() {
                e.handle_completion(now, op.handle(), Ok(()));
                moved = true;
            }
            while e.poll_event().is_some() {}
            if let Some(c) = e.poll_commit() {
                journal.extend(c.records.clone());
                e.handle_commit(now, c.epoch, Ok(()));
                moved = true;
            }
            if !moved {
                return journal;
            }
        }
    }

    #[test]
    fn a_cold_dirty_block_is_sealed_and_a_write_into_it_waits_for_the_unsealing_record() {
        let mut e = Engine::new(EngineConfig::with_slots(64)).unwrap();
        e.set_target(0, 64, &mut Output::default());
        e.set_persistent(2);
        e.set_seal_after(1_000);
        write(&mut e, 0, 3);
        e.request_commit();
        let first = settle(&mut e, 10);
        let slot = e.lookup(0, 3).unwrap();
        assert!(first.iter().any(|r| r.slot == slot && !r.sealed), "{first:?}");
        assert!(!e.is_sealed(slot), "not before the window");
        e.handle_timeout(500);
        e.request_commit();
        assert!(settle(&mut e, 500).iter().all(|r| !r.sealed), "still within the window");
        e.handle_timeout(1_010);
        e.request_commit();
        let sealed = settle(&mut e, 1_010);
        assert_eq!(sealed.iter().filter(|r| r.sealed).map(|r| r.slot).collect::<Vec<_>>(), [slot]);
        assert!(e.is_sealed(slot));
        // A write into it: no cache write before a commit unseals the slot.
        write(&mut e, 1_020, 3);
        let ops: Vec<_> = std::iter::from_fn(|| e.poll_op()).collect();
        assert!(ops.is_empty(), "held for the intent: {ops:?}");
        let c = e.poll_commit().expect("the intent commit");
        assert!(c.records.iter().any(|r| r.slot == slot && !r.sealed));
        assert!(e.is_sealed(slot), "sealed until the unsealing record is durable");
        e.handle_commit(1_030, c.epoch, Ok(()));
        assert!(!e.is_sealed(slot));
        let op = e.poll_op().expect("the write goes once the unsealing record is durable");
        assert_eq!((op.kind, op.slot), (crate::OpKind::SsdWrite, slot));
        e.check_invariants().unwrap();
    }

    #[test]
    fn a_hot_block_is_never_sealed_and_never_waits() {
        let mut e = Engine::new(EngineConfig::with_slots(64)).unwrap();
        e.set_target(0, 64, &mut Output::default());
        e.set_persistent(2);
        e.set_seal_after(1_000);
        for t in (0..5_000).step_by(300) {
            write(&mut e, t, 3);
            let op = e.poll_op().unwrap_or_else(|| panic!("at {t}: the write runs at once"));
            e.handle_completion(t, op.handle(), Ok(()));
            e.handle_timeout(t);
            e.request_commit();
            settle(&mut e, t);
            assert!(!e.is_sealed(e.lookup(0, 3).unwrap()), "rewritten every 300 ns, sealed after 1,000");
        }
    }

    #[test]
    fn a_write_into_a_cold_region_waits_once_and_unseals_its_neighbours() {
        let mut e = Engine::new(EngineConfig::with_slots(64)).unwrap();
        e.set_target(0, 64, &mut Output::default());
        e.set_persistent(2);
        e.set_seal_after(1_000);
        e.set_seal_region(8);
        for b in 0..4 {
            write(&mut e, 0, b);
        }
        e.request_commit();
        settle(&mut e, 10);
        e.handle_timeout(2_000);
        e.request_commit();
        let sealed = settle(&mut e, 2_000).iter().filter(|r| r.sealed).count();
        assert_eq!(sealed, 4);
        // The first write waits for the commit that unseals all four.
        write(&mut e, 2_100, 0);
        assert!(e.poll_op().is_none(), "held");
        let c = e.poll_commit().unwrap();
        assert_eq!(c.records.iter().filter(|r| !r.sealed).count(), 4, "{:?}", c.records);
        e.handle_commit(2_100, c.epoch, Ok(()));
        settle(&mut e, 2_100);
        // The neighbours' writes go at once.
        for b in 1..4 {
            write(&mut e, 2_200, b);
            let op = e.poll_op().expect("no wait");
            e.handle_completion(2_200, op.handle(), Ok(()));
        }
        // Written within the window: the region is not sealed again, however old a slot's record.
        e.handle_timeout(3_150);
        e.request_commit();
        assert!(settle(&mut e, 3_150).iter().all(|r| !r.sealed));
        // Their records durable at 3,150 and the region cold since 2,200: sealed at 4,150.
        e.handle_timeout(4_200);
        e.request_commit();
        assert_eq!(settle(&mut e, 4_200).iter().filter(|r| r.sealed).count(), 4, "cold again: sealed");
    }

    #[test]
    fn a_poisoned_slot_is_never_written_back_until_a_write_lands() {
        let mut e = Engine::new(EngineConfig::with_slots(64)).unwrap();
        e.set_target(0, 64, &mut Output::default());
        write(&mut e, 0, 3);
        settle(&mut e, 0);
        let slot = e.lookup(0, 3).unwrap();
        // A write-back whose cache read fails its checksum.
        let mut out = Output::default();
        e.submit_job(|e, out| {
            e.destage_block(0, 3, out);
        });
        let read = e.poll_op().unwrap();
        assert_eq!(read.kind, crate::OpKind::SsdRead);
        e.handle_completion(0, read.handle(), Err(crate::Failure::Corrupt));
        settle(&mut e, 0);
        assert_eq!((e.poisoned_slots(), e.partition(0).dirty_blocks), (1, 1), "kept dirty, poisoned");
        assert_eq!(e.destage_block(0, 3, &mut out), 0, "no write-back of a poisoned block");
        write(&mut e, 10, 3);
        settle(&mut e, 10);
        assert_eq!(e.poisoned_slots(), 0, "a write landed: its bytes are the client's");
        assert_eq!(e.lookup(0, 3), Some(slot));
        assert_eq!(e.destage_block(0, 3, &mut out), 1);
    }
}
