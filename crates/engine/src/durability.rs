//! Crash consistency as part of the engine's protocol (persistent mode, the daemon): which
//! metadata must be durable before which device write is decided here, so a driver that
//! runs the engine's commits as told is crash-safe without rules of its own.
//!
//! A driver runs each [`Commit`] it polls ([`Engine::poll_commit`]) in this order: sync
//! the backing stores it names, sync the cache store, append its records to the journal,
//! sync the journal; then [`Engine::handle_commit`]. One commit is in flight at a time;
//! everything that changes meanwhile goes into the next (group commit). Records are
//! snapshots of slots (block, valid and dirty sectors); recovery replays them in order.
//!
//! The invariant: **the durable journal never vouches for bytes the cache store may not
//! hold.** Three rules keep it, and none needs a sync in the common write path:
//! - *data before metadata*: every commit syncs the cache store before its records are
//!   written, and records describe settled slots only (`take_changed` holds back slots with
//!   ops in flight), so a record never reaches the disk ahead of the bytes it describes;
//! - *a durable free reserve*: a slot that loses its block (eviction, invalidation, a
//!   shrink) goes to *limbo* and returns to the free list only once a commit recording it
//!   free is durable; new blocks are only written into free-list slots, which no durable
//!   record claims. Victims are evicted ahead in batches (`reserve` slots), so a miss
//!   rarely waits: the reserve is refilled by a background job and the next commit (a
//!   miss that finds it empty waits for that commit: `slot_wait.rs`);
//! - *intent before overwrite*: a client write into sectors the journal may record as
//!   valid and clean (the slot is *vouched*) waits for a commit that records them dirty
//!   (a crash then leaves either the old bytes, which the backing store also has, or the
//!   new ones, marked dirty — never new bytes labelled clean). Blocks cleaned by the
//!   flusher are not journaled clean (the journal keeps saying dirty, a restart writes
//!   them back once more), so a hot block the flusher cleaned is rewritten without a
//!   commit; the flusher's dirty target keeps most hot blocks dirty anyway.
//!
//! Backing writes: a commit names every backing store written since the last one
//! (write-backs, write-through and write-around writes, failed ones too), so a record that
//! frees or cleans a written-back block, or calls a fill of those bytes clean, is durable
//! only after the backing store holds them.

use crate::engine::Engine;
use crate::inflight::{Failure, ReqId};
use crate::slot_table::FREE_KEY;
use crate::stores::StoreId;
use cachevisor_trace::VmId;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// One slot's state as the journal records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRecord {
    /// The slot.
    pub slot: u32,
    /// (vm, block) it holds; `None` when free.
    pub block: Option<(VmId, u64)>,
    /// Valid sectors, one bit each (64 per word).
    pub valid: Vec<u64>,
    /// Dirty sectors.
    pub dirty: Vec<u64>,
    /// A seal (`seals.rs`): the driver journals a checksum of each dirty sector with it;
    /// any other record of the slot says its checksums no longer hold.
    pub sealed: bool,
    /// A mirror slot (`dirty_mirror.rs`): the second copy of `block`'s dirty sectors
    /// (`valid` = `dirty` = the sectors it holds), in no index.
    pub mirror: bool,
}

/// Work a driver must make durable, in the order given by the module doc. Its records
/// replay in order (frees first), and any prefix of them is a consistent state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    /// Its epoch (increasing; reported back to [`Engine::handle_commit`]).
    pub epoch: u64,
    /// Backing stores to sync first (they took write-backs since the last commit).
    pub sync_backings: Vec<VmId>,
    /// Cache stores to sync next (rows of the store table that took cache writes since
    /// the last commit, failed ones too). A driver may sync more, never fewer.
    pub sync_stores: Vec<StoreId>,
    /// Slot records to append after the cache stores are synced.
    pub records: Vec<SlotRecord>,
}

/// The stores a checkpoint must sync before it is made durable ([`Engine::checkpoint`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Syncs {
    /// Backing stores that took write-backs since the last commit.
    pub backings: Vec<VmId>,
    /// Cache stores that took cache writes since the last commit.
    pub stores: Vec<StoreId>,
}

/// A commit handed to the driver: its epoch, records, slots leaving limbo, and what it
/// syncs (put back for the next commit if it fails).
#[derive(Debug, Clone)]
struct InFlightCommit {
    epoch: u64,
    records: Vec<SlotRecord>,
    leaving: Vec<u32>,
    backings: Vec<VmId>,
    stores: Vec<StoreId>,
}

/// Persistent-mode state inside [`Engine`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Durability {
    on: bool,
    /// Free slots kept durable ahead of need.
    reserve: u64,
    next_epoch: u64,
    durable: u64,
    /// The commit in flight.
    in_flight: Option<InFlightCommit>,
    /// The newest settled state of each slot that changed since the last commit took it.
    settled: BTreeMap<u32, SlotRecord>,
    /// Slots freed whose free record is not in a commit yet.
    limbo_new: Vec<u32>,
    /// (epoch, slot): free once that epoch is durable.
    limbo: VecDeque<(u64, u32)>,
    /// Per slot, the sectors the journal may record valid and clean (`words` u64 each).
    vouched: Vec<u64>,
    words: usize,
    /// Intent records for the next commit: slots a held write will overwrite, with the
    /// clean sectors it covers marked dirty and nothing else changed (pinned meanwhile).
    intents: Vec<SlotRecord>,
    /// Jobs held until an epoch is durable: ((id, job-table key), epoch; `None` = the next
    /// commit).
    held: Vec<((ReqId, usize), Option<u64>)>,
    /// Flushes waiting: (request, epoch; `None` = the next commit).
    flushes: Vec<(ReqId, Option<u64>)>,
    /// Blocks whose old slot the journal may still record clean-valid (the slot is in
    /// limbo): a backing write to them waits for the commit that frees that slot, or a
    /// crash would leave the old bytes labelled clean beside newer ones in the backing.
    vouched_elsewhere: std::collections::HashMap<u64, u32>,
    /// VMs whose backing stores took write-backs since the last commit.
    wrote_back: BTreeSet<VmId>,
    /// Cache stores that took cache writes since the last commit.
    wrote_stores: BTreeSet<StoreId>,
    /// The driver asked for a commit.
    wanted: bool,
    /// The reserve refill job running, if any.
    refill_job: Option<ReqId>,
    /// Requests that waited for a commit to free a slot (`slot_wait.rs`).
    slot_waits: u64,
    /// The last commit failed (a full file system): no miss waits for the next one.
    commits_failing: bool,
    /// Write-backs by the flusher do not journal their clean state.
    lazy_clean: bool,
}

impl Durability {
    /// Whether persistent mode is on.
    #[inline]
    pub(crate) fn on(&self) -> bool {
        self.on
    }

    /// Slot `s` leaves block `key` (evicted, moved): if the journal may still record it
    /// there valid and clean, a write of that block to its backing store waits for the
    /// commit that frees `s` ([`Engine::hold_for_vouched`]).
    #[inline]
    pub(crate) fn left_vouched(&mut self, key: u64, s: u32) {
        if self.on && self.is_vouched(s) {
            self.vouched_elsewhere.insert(key, s);
        }
    }

    /// Whether the journal may still record sectors `lo..hi` of block `key` valid and
    /// clean in a slot the block left.
    pub(crate) fn vouched_elsewhere(&self, key: u64, (lo, hi): (u32, u32)) -> bool {
        !self.vouched_elsewhere.is_empty()
            && self.vouched_elsewhere.get(&key).is_some_and(|&s| {
                let v = self.vouched_sectors(s);
                (lo..hi).any(|i| v.get((i / 64) as usize).is_some_and(|w| w >> (i % 64) & 1 == 1))
            })
    }

    /// Whether any block left a slot the journal may still record it in.
    pub(crate) fn any_vouched_elsewhere(&self) -> bool {
        !self.vouched_elsewhere.is_empty()
    }

    /// Takes `slot` back for a block (a repair or a restore puts one in it): out of
    /// limbo, vouching for no block it held before; whether it was in limbo.
    pub(crate) fn take_back(&mut self, slot: u32) -> bool {
        self.vouched_elsewhere.retain(|_, &mut v| v != slot);
        match self.limbo_new.iter().position(|&s| s == slot) {
            Some(i) => {
                self.limbo_new.swap_remove(i);
                true
            }
            None => self.take_from_limbo(slot),
        }
    }

    /// Intent records for the next commit (`intents.rs`).
    pub(crate) fn add_intents(&mut self, intents: Vec<SlotRecord>) {
        self.intents.extend(intents);
    }

    /// Job `id` (at job-table `key`) holds until the next commit is durable.
    pub(crate) fn hold_job(&mut self, id: ReqId, key: usize) {
        self.held.push(((id, key), None));
    }

    /// Job `id` retired: if it was the reserve refill, the refill is over.
    #[inline]
    pub(crate) fn job_retired(&mut self, id: ReqId) {
        if self.refill_job == Some(id) {
            self.refill_job = None;
        }
    }

    /// Whether a miss with no durable free slot may wait for the next commit
    /// (`slot_wait.rs`): persistent mode, slots on their way back (in limbo, or a refill
    /// evicting ahead), and the last commit did not fail.
    pub(crate) fn slots_coming(&self) -> bool {
        self.on && !self.commits_failing && (self.limbo_len() > 0 || self.refill_job.is_some())
    }

    /// A request waited for a commit to free a slot.
    pub(crate) fn count_slot_wait(&mut self) {
        self.slot_waits += 1;
    }

    pub(crate) fn slot_waits(&self) -> u64 {
        self.slot_waits
    }

    /// Whether write-backs now leave their clean state out of the journal (the flusher's).
    #[inline]
    pub(crate) fn lazy_clean(&self) -> bool {
        self.lazy_clean
    }

    /// Write-backs from now leave their clean state out of the journal (persistent mode),
    /// or journal it again (`false`).
    pub(crate) fn set_lazy_clean(&mut self, on: bool) {
        self.lazy_clean = on && self.on;
    }

    /// Whether the journal may record some sector of slot `s` valid and clean.
    pub(crate) fn is_vouched(&self, s: u32) -> bool {
        self.vouched_sectors(s).iter().any(|&w| w != 0)
    }

    /// The sectors of slot `s` the journal may record valid and clean.
    pub(crate) fn vouched_sectors(&self, s: u32) -> &[u64] {
        let at = s as usize * self.words;
        self.vouched.get(at..at + self.words).unwrap_or(&[])
    }

    /// Forgets the vouched sectors of slots `k` and after (the tables were cut there).
    pub(crate) fn forget_slots_from(&mut self, k: u32) {
        self.vouched.truncate(k as usize * self.words);
        self.vouched.shrink_to_fit();
    }

    /// Adds (`or`) or sets the vouched sectors of slot `s`.
    pub(crate) fn vouch(&mut self, s: u32, bits: &[u64], or: bool) {
        if self.words == 0 {
            self.words = bits.len().max(1);
        }
        let at = s as usize * self.words;
        if self.vouched.len() < at + self.words {
            self.vouched.resize(at + self.words, 0);
        }
        for (w, b) in self.vouched[at..at + self.words].iter_mut().zip(bits) {
            *w = if or { *w | b } else { *b };
        }
    }

    /// Takes `slot` out of the committed part of limbo; false if it is not there.
    pub(crate) fn take_from_limbo(&mut self, slot: u32) -> bool {
        match self.limbo.iter().position(|&(_, s)| s == slot) {
            Some(i) => {
                self.limbo.remove(i);
                true
            }
            None => false,
        }
    }

    /// Whether `slot` is in limbo.
    pub(crate) fn in_limbo(&self, slot: u32) -> bool {
        self.limbo_new.contains(&slot) || self.limbo.iter().any(|&(_, s)| s == slot)
    }

    /// Limbo slots (freed, not yet durable as free).
    pub(crate) fn limbo_len(&self) -> usize {
        self.limbo_new.len() + self.limbo.len()
    }
}

/// The durable reserve of free slots the daemon keeps for a cache of `slots` (and the
/// simulator models): 1 per 256 slots, between 1 and 1,024.
pub fn durable_reserve(slots: u64) -> u64 {
    (slots / 256).clamp(1, 1024)
}

impl Engine {
    /// Turns on persistent mode (after a warm restart's replay, before serving), keeping
    /// `reserve` free slots durable ahead of need. Only the asynchronous face is
    /// crash-consistent; the engine's slots that are free now are free in the journal.
    pub fn set_persistent(&mut self, reserve: u64) {
        self.dur.on = true;
        self.dur.reserve = reserve.max(1);
        self.dur.next_epoch = self.dur.next_epoch.max(1);
        self.track_changes(true);
    }

    /// Whether persistent mode is on.
    pub fn persistent(&self) -> bool {
        self.dur.on
    }

    /// Asks for a commit of whatever changed (a driver's timer: keeps the journal close
    /// to the cache's state so a restart is warm).
    pub fn request_commit(&mut self) {
        self.dur.wanted = true;
    }

    /// A flush: the reply comes once everything acknowledged before it is durable.
    pub fn submit_flush(&mut self) -> ReqId {
        let id = self.flight.new_id();
        self.dur.flushes.push((id, None));
        id
    }

    /// The next commit to run, if one is due and none is in flight.
    #[inline]
    pub fn poll_commit(&mut self) -> Option<Commit> {
        if !self.dur.on {
            return None;
        }
        self.next_commit()
    }

    fn next_commit(&mut self) -> Option<Commit> {
        // A flush joins the next commit: every write acknowledged before it has retired,
        // so its slot's settled state is waiting there.
        let ready = |f: &(ReqId, Option<u64>)| f.1.is_none();
        let d = &self.dur;
        if !d.on || d.in_flight.is_some() {
            return None;
        }
        let due = d.wanted
            || !d.intents.is_empty()
            || d.held.iter().any(|h| h.1.is_none())
            || d.flushes.iter().any(ready)
            // A freed slot with an op still in flight (a victim's write-back reading it)
            // gets its free record once the op ends: committing before is empty work.
            || d.limbo_new.iter().any(|&s| !self.flight.pinned(s))
            || !d.wrote_back.is_empty()
            || self.seals_due();
        if !d.on || d.in_flight.is_some() || !due {
            return None;
        }
        let epoch = self.dur.next_epoch;
        self.dur.next_epoch += 1;
        self.dur.wanted = false;
        self.settle();
        let mut records: BTreeMap<u32, SlotRecord> = std::mem::take(&mut self.dur.settled);
        // Intents: recorded ahead of the held writes they cover. A slot freed after its
        // intent was taken keeps its free record (it vouches for nothing, and a write
        // held for that slot's block waits for exactly that record: `hold_for_vouched`);
        // a slot freed before cannot have one (an intent needs the block still there).
        for r in std::mem::take(&mut self.dur.intents) {
            if records.get(&r.slot).is_none_or(|s| s.block.is_some()) {
                records.insert(r.slot, r);
            }
        }
        // Frees first: replaying any prefix of a commit never finds a block in two slots
        // (a block that moved was freed from its old slot in the same or an earlier commit).
        let (mut records, held): (Vec<SlotRecord>, Vec<SlotRecord>) =
            records.into_values().partition(|r| r.block.is_none());
        // A block's mirror before the block (`dirty_mirror.rs`): no cut commit leaves the
        // block dirty without its copy.
        let (mirrors, held): (Vec<SlotRecord>, Vec<SlotRecord>) = held.into_iter().partition(|r| r.mirror);
        records.extend(mirrors);
        records.extend(held);
        if !self.mirrors.freed.is_empty() {
            // Mirror frees last (`dirty_mirror.rs`), until one is durable (`handle_commit`).
            let freed = &self.mirrors.freed;
            let (late, early): (Vec<SlotRecord>, Vec<SlotRecord>) =
                records.into_iter().partition(|r| r.block.is_none() && freed.contains(&r.slot));
            records = early;
            records.extend(late);
        }
        let seals = self.take_seals(&records);
        records.extend(seals);
        // Freed slots whose free record is in this commit leave limbo when it is durable.
        let freed: BTreeSet<u32> = records.iter().filter(|r| r.block.is_none()).map(|r| r.slot).collect();
        let (leaving, staying): (Vec<u32>, Vec<u32>) =
            std::mem::take(&mut self.dur.limbo_new).into_iter().partition(|s| freed.contains(s));
        self.dur.limbo_new = staying;
        for h in self.dur.held.iter_mut() {
            h.1.get_or_insert(epoch);
        }
        for f in self.dur.flushes.iter_mut() {
            if ready(f) {
                f.1 = Some(epoch);
            }
        }
        let backings: Vec<VmId> = std::mem::take(&mut self.dur.wrote_back).into_iter().collect();
        let stores: Vec<StoreId> = std::mem::take(&mut self.dur.wrote_stores).into_iter().collect();
        self.dur.limbo.extend(leaving.iter().map(|&s| (epoch, s)));
        self.dur.in_flight = Some(InFlightCommit {
            epoch,
            records: records.clone(),
            leaving,
            backings: backings.clone(),
            stores: stores.clone(),
        });
        Some(Commit { epoch, sync_backings: backings, sync_stores: stores, records })
    }

    /// Reports the commit of `epoch` done (`Ok`: durable) or failed (its records are
    /// tried again in the next commit; writes waiting on it fail, flushes fail).
    pub fn handle_commit(&mut self, now_ns: u64, epoch: u64, result: Result<(), Failure>) {
        let Some(InFlightCommit { epoch: e, records, leaving, backings, stores }) = self.dur.in_flight.take() else {
            return;
        };
        debug_assert_eq!(e, epoch, "one commit in flight");
        self.seals.at(now_ns);
        self.dur.commits_failing = result.is_err();
        match result {
            Ok(()) => {
                self.dur.durable = epoch;
                if !self.mirrors.freed.is_empty() {
                    // Mirror frees durable: those slots are plain free ones from now.
                    for r in records.iter().filter(|r| r.block.is_none()) {
                        self.mirrors.freed.remove(&r.slot);
                    }
                }
                self.unseal_durable(&records);
                self.seal_candidates(&records);
                // The journal's newest word on these slots (unless a newer record waits).
                for r in &records {
                    if !self.dur.settled.contains_key(&r.slot) {
                        self.dur.vouch(r.slot, &clean_valid_bits(r), false);
                    }
                }
                while let Some(&(e, s)) = self.dur.limbo.front() {
                    if e > epoch {
                        break;
                    }
                    self.dur.limbo.pop_front();
                    let none = vec![0; self.dur.words.max(1)];
                    self.dur.vouch(s, &none, false);
                    self.dur.vouched_elsewhere.retain(|_, &mut v| v != s);
                    self.free_push_back(s);
                }
                let (done, rest): (Vec<_>, Vec<_>) =
                    std::mem::take(&mut self.dur.flushes).into_iter().partition(|f| f.1.is_some_and(|e| e <= epoch));
                self.dur.flushes = rest;
                for (id, _) in done {
                    self.flight.answer_at_once(id, Ok(()), false);
                }
                let (go, rest): (Vec<_>, Vec<_>) =
                    std::mem::take(&mut self.dur.held).into_iter().partition(|h| h.1.is_some_and(|e| e <= epoch));
                self.dur.held = rest;
                for (id, _) in go {
                    self.release_held(id, None);
                }
            }
            Err(f) => {
                for r in records {
                    self.dur.settled.entry(r.slot).or_insert(r);
                }
                self.dur.limbo.retain(|&(e, _)| e != epoch);
                self.dur.limbo_new.extend(leaving);
                self.dur.wrote_back.extend(backings);
                self.dur.wrote_stores.extend(stores);
                let (failed, rest): (Vec<_>, Vec<_>) =
                    std::mem::take(&mut self.dur.flushes).into_iter().partition(|x| x.1 == Some(epoch));
                self.dur.flushes = rest;
                for (id, _) in failed {
                    self.flight.answer_at_once(id, Err(f), true);
                }
                let (failed, rest): (Vec<_>, Vec<_>) =
                    std::mem::take(&mut self.dur.held).into_iter().partition(|x| x.1 == Some(epoch));
                self.dur.held = rest;
                for (id, _) in failed {
                    self.release_held(id, Some(f));
                }
            }
        }
        self.dispatch_after_commit(now_ns);
    }

    /// Whether any commit, held write or flush is outstanding (a driver's stop waits).
    pub fn commit_pending(&self) -> bool {
        let d = &self.dur;
        d.in_flight.is_some() || !d.held.is_empty() || !d.flushes.is_empty() || !d.limbo_new.is_empty()
    }

    /// Persistent mode: snapshots the slots that changed and have no ops in flight (their
    /// state is settled) for the next commit; a slot's newest snapshot replaces an older
    /// one, so a later job on a slot never holds back the state an earlier flush needs.
    #[inline]
    pub(crate) fn settle(&mut self) {
        if self.dur.on {
            self.settle_changed();
        }
    }

    /// Settles slot `s`'s record now (persistent mode, no op in flight on it; else it is
    /// noted for the next settle).
    pub(crate) fn settle_slot_now(&mut self, s: u32) {
        if !self.dur.on || self.flight.pinned(s) {
            self.note(s);
            return;
        }
        let r = self.record_of(s);
        self.settled(s, r);
    }

    fn settle_changed(&mut self) {
        let mut slots = Vec::new();
        self.take_changed(&mut slots);
        for s in slots {
            let r = self.record_of(s);
            self.settled(s, r);
        }
    }

    /// Slot `s` settled as `r` (no op in flight on it): its record for the next commit.
    /// An intent for it taken before is older than this state and goes: a held write's
    /// own slots are pinned until it runs, so this is a region-mate's unsealing record
    /// (`seals.rs`), which `r` (unsealed) serves as well — kept, it would put back the
    /// sectors a write around dropped since (found by the crash-consistency model: a
    /// flushed write read back older after a crash).
    fn settled(&mut self, s: u32, r: SlotRecord) {
        self.dur.vouch(s, &clean_valid_bits(&r), true);
        if !self.dur.intents.is_empty() {
            self.dur.intents.retain(|i| i.slot != s);
        }
        self.dur.settled.insert(s, r);
    }

    /// Holds (or resumes) the dispatch of requests: they wait and commands are not run,
    /// so the work in flight drains for a checkpoint ([`Self::quiescent`]). Commits go on.
    pub fn hold_requests(&mut self, on: bool, now_ns: u64) {
        self.flight.set_held(on);
        if !on {
            self.dispatch_after_commit(now_ns);
        }
    }

    /// Whether requests are held ([`Self::hold_requests`]): commands submitted as jobs
    /// are not run meanwhile.
    pub fn requests_held(&self) -> bool {
        self.flight.held()
    }

    /// Whether nothing is in flight: no running request or job, no commit (a checkpoint
    /// may be written).
    pub fn quiescent(&self) -> bool {
        self.flight.jobs_in_flight() == 0 && self.dur.in_flight.is_none()
    }

    /// A checkpoint (persistent mode, [`Self::quiescent`], nothing may change until
    /// [`Self::checkpoint_done`]): every held slot's record for `f`, and the backing and
    /// cache stores to sync before the checkpoint is made durable. Nothing in the engine
    /// changes here: a checkpoint that fails leaves the old metadata in force.
    pub fn checkpoint(&mut self, f: &mut dyn FnMut(SlotRecord)) -> Syncs {
        debug_assert!(self.quiescent(), "a checkpoint needs nothing in flight");
        for s in 0..self.slots.len() as u32 {
            if self.slots.key(s) != FREE_KEY {
                // Sealed unless a newer state waits for a commit (it unseals).
                let sealed = self.seals.is_sealed(s) && !self.dur.settled.contains_key(&s);
                f(SlotRecord { sealed, ..self.record_of(s) });
            }
        }
        let mut mirrors: Vec<u32> = self.mirrors.slots().map(|(m, _)| m).collect();
        mirrors.sort_unstable();
        for m in mirrors {
            f(self.record_of(m));
        }
        Syncs {
            backings: self.dur.wrote_back.iter().copied().collect(),
            stores: self.dur.wrote_stores.iter().copied().collect(),
        }
    }

    /// The checkpoint taken by [`Self::checkpoint`] is durable and replaced the journal:
    /// slots in limbo are free (it does not hold them), nothing is pending, and the vouched
    /// sectors are exactly the clean valid ones.
    pub fn checkpoint_done(&mut self) {
        self.dur.wrote_back.clear();
        self.dur.wrote_stores.clear();
        self.mirrors.freed.clear(); // the journal replaced: no free record pending
        let mut changed = Vec::new();
        self.take_changed(&mut changed);
        // What the checkpoint wrote unsealed (a state newer than the seal).
        let unsealed: Vec<SlotRecord> = std::mem::take(&mut self.dur.settled).into_values().collect();
        self.unseal_durable(&unsealed);
        let none = vec![0u64; self.spb.div_ceil(64) as usize];
        for s in 0..self.slots.len() as u32 {
            if self.slots.key(s) == FREE_KEY {
                self.dur.vouch(s, &none, false);
            } else {
                let r = self.record_of(s);
                self.dur.vouch(s, &clean_valid_bits(&r), false);
            }
        }
        for s in std::mem::take(&mut self.dur.limbo_new) {
            self.free_push_back(s);
        }
        while let Some((_, s)) = self.dur.limbo.pop_front() {
            self.free_push_back(s);
        }
        self.dur.vouched_elsewhere.clear();
    }

    /// The journal record of `slot` as the engine holds it now.
    pub fn record_of(&self, slot: u32) -> SlotRecord {
        if self.mirrors.is_mirror(slot) {
            return self.mirror_record(slot).expect("a mirror slot has a record");
        }
        let words = self.spb.div_ceil(64) as usize;
        let mut r = SlotRecord {
            slot,
            block: self.slot_block(slot),
            valid: vec![0; words],
            dirty: vec![0; words],
            sealed: false,
            mirror: false,
        };
        if self.slots.key(slot) != FREE_KEY {
            for i in 0..self.spb {
                let (v, d) = self.sector_state(slot, i);
                r.valid[(i / 64) as usize] |= (v as u64) << (i % 64);
                r.dirty[(i / 64) as usize] |= (d as u64) << (i % 64);
            }
        }
        r
    }

    /// A slot that lost its block: the free list, or limbo in persistent mode.
    pub(crate) fn free_slot(&mut self, s: u32) {
        if !self.mirrors.freed.is_empty() {
            self.mirrors.freed.remove(&s); // freed as a block's slot now: in commit order
        }
        if self.dur.on {
            self.dur.limbo_new.push(s);
        } else {
            self.free_push_front(s);
        }
    }

    /// Persistent mode: evicts ahead into limbo when free and limbo slots together fall
    /// below the reserve (one background job at a time), from `vm`'s partition (static;
    /// from a paced shrink's VM when `vm` is below its target) or the shared policy.
    pub(crate) fn refill_reserve(&mut self, vm: VmId) {
        let d = &self.dur;
        if !d.on || d.refill_job.is_some() || self.free_slots() + d.limbo_len() as u64 >= d.reserve {
            return;
        }
        // Static partitions: a VM at its target evicts ahead from its own blocks; below
        // it, from a VM above its target after a paced shrink, or else none is needed (it
        // takes free slots as they come back from limbo).
        let want = d.reserve * 2 - self.free_slots() - d.limbo_len() as u64;
        let from = if self.shared.is_some() || self.partition(vm).used >= self.partition(vm).target {
            vm
        } else if let Some(donor) = self.paced_donor() {
            donor
        } else {
            return;
        };
        let job = self.submit_job(|e, out| {
            for _ in 0..want {
                if from != vm && e.partition(from).used <= e.partition(from).target {
                    break;
                }
                let Some((s, _)) = e.evict_from(from, false, out) else { break };
                e.free_slot(s);
            }
        });
        self.dur.refill_job = job;
    }

    /// Notes a cache write to store `st` that ended (failed ones too: torn bytes must be
    /// synced before a record calls anything there valid).
    #[inline]
    pub(crate) fn note_cache_write(&mut self, st: StoreId) {
        if self.dur.on {
            self.dur.wrote_stores.insert(st);
        }
    }

    /// Notes a completed write-back to `vm`'s backing store (its sync goes in the next
    /// commit).
    #[inline]
    pub(crate) fn note_write_back(&mut self, vm: VmId) {
        if self.dur.on {
            self.dur.wrote_back.insert(vm);
        }
    }
}

/// The sectors a record says are valid and clean.
pub(crate) fn clean_valid_bits(r: &SlotRecord) -> Vec<u64> {
    r.valid.iter().zip(&r.dirty).map(|(v, d)| if r.block.is_some() { v & !d } else { 0 }).collect()
}
