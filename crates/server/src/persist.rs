//! Crash-consistent cache metadata (see `journal` for the format): which slot holds which
//! block of which vDisk, with valid and dirty sectors, kept so that a daemon killed at any
//! moment restarts warm — clean and dirty blocks still cached — and never serves a byte
//! that is not the block's.
//!
//! Rules, with `synced` = the state the journal held at its last fsync:
//! - every change of a slot is appended to the journal after the request's device ops
//!   ran (no fsync: a process crash keeps it; FLUSH/FUA fsync the cache store, then the
//!   journal, so what they cover survives power loss too);
//! - before the cache store is written where the synced state says other data is, a
//!   barrier makes the journal say so first: a slot taken by another block is recorded
//!   free, clean sectors about to be overwritten are recorded invalid (dirty ones stay:
//!   old or new, they are written back later), backing files that took write-backs in
//!   this request are fsynced, the cache store is fsynced, and the journal is fsynced;
//! - a checkpoint (the whole state, written atomically) replaces the journal when it
//!   grows past its limit and at a clean stop.
//!
//! Recovery replays the checkpoint and the journal of the same generation, up to its first
//! torn record, straight into the engine. The cost of the barrier is one fsync pair per request that overwrites
//! synced data (a full cache's misses, write hits on clean blocks); batching victims into
//! a durable free reserve would remove most of them and is the next step.

use crate::journal::{
    read_records, write_file_atomically, Header, Record, CHECKPOINT_MAGIC, HEADER_LEN, JOURNAL_MAGIC,
};
use cachevisor_engine::slot_table::{key_block, key_vm, pack_key, FREE_KEY};
use cachevisor_engine::Engine;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Journal size past which a checkpoint replaces it (and at least 64 bytes per slot).
const JOURNAL_LIMIT: u64 = 64 << 20;

/// One slot's persisted state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotState {
    key: u64,
    valid: Vec<u64>,
    dirty: Vec<u64>,
}

impl SlotState {
    /// The engine's state of `slot`.
    pub fn of(e: &Engine, slot: u32) -> SlotState {
        let spb = (e.config().block_size / 512) as u32;
        let words = spb.div_ceil(64) as usize;
        let mut s = SlotState { key: FREE_KEY, valid: vec![0; words], dirty: vec![0; words] };
        if let Some((vm, block)) = e.slot_block(slot) {
            s.key = pack_key(vm, block);
            for i in 0..spb {
                let (v, d) = e.sector_state(slot, i);
                s.valid[(i / 64) as usize] |= (v as u64) << (i % 64);
                s.dirty[(i / 64) as usize] |= (d as u64) << (i % 64);
            }
        }
        s
    }

    /// The packed key of the block it holds (`FREE_KEY` when free).
    pub fn key(&self) -> u64 {
        self.key
    }

    /// Whether sector `i` is dirty.
    pub fn dirty_at(&self, i: u32) -> bool {
        self.dirty[(i / 64) as usize] >> (i % 64) & 1 == 1
    }
}

/// What recovery replayed.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Journal records replayed after the checkpoint.
    pub journal_records: usize,
    /// Whether the journal ended in a torn record (a crash while appending).
    pub torn_tail: bool,
}

/// Streams an engine's checkpoint records into the given sink and returns the backing
/// stores to sync first (`Engine::checkpoint`).
pub type CheckpointSource<'a> =
    dyn FnMut(&mut dyn FnMut(cachevisor_engine::SlotRecord)) -> Vec<cachevisor_trace::VmId> + 'a;

/// The metadata store of one cache.
pub struct Persistence {
    dir: PathBuf,
    header: Header,
    words: usize,
    journal: File,
    /// The journal file's length after its last whole record: where a failed append is cut
    /// back to, and what `wants_checkpoint` measures.
    journal_end: u64,
    /// An append failed and the journal could not be cut back: nothing more is journaled.
    poisoned: bool,
    /// Appends are failing (logged once when it starts and once when it ends).
    failing: bool,
    slots: u64,
    /// Synced state of slots recorded since the last fsync (`None`: not known, treated as
    /// vouching for other data).
    pre_sync: HashMap<u32, Option<SlotState>>,
    changed: Vec<u32>,
    buf: Vec<u8>,
    /// Slots not to journal while they hold the given key: a write-through whose backing
    /// write is still on its way (the journal must not vouch for data the backing store
    /// does not have yet).
    withheld: HashMap<u32, u64>,
    /// Each VM id's backing store (written into every checkpoint).
    bindings: Vec<Option<crate::backing_identity::Identity>>,
    /// Journal size past which a checkpoint is wanted (tests lower it).
    limit: u64,
}

/// A slot's journaled state just before a request, as the driver knows it: the engine
/// state of the request's own cached blocks, the key of an evicted block, or free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pre {
    /// Free.
    Free,
    /// Held this key (sector bits not needed: a new key always needs a barrier).
    Key(u64),
    /// Exactly this state.
    State(SlotState),
}

/// Expands a sector bitmap into one flag per sector.
pub fn bits_to_bools(words: &[u64], n: u32) -> Vec<bool> {
    (0..n).map(|s| words[(s / 64) as usize] >> (s % 64) & 1 == 1).collect()
}

fn io_err(path: &Path, e: std::io::Error) -> String {
    format!("{}: {e}", path.display())
}

impl Persistence {
    /// Opens (or creates) the metadata in `dir` for a cache of this geometry and replays
    /// it, record by record, into `apply` (checkpoint first, then the journal of the same
    /// generation up to its first torn record); no copy of the slot table is built. A
    /// geometry mismatch is an error: the cached data cannot be interpreted.
    pub fn open(
        dir: &Path,
        block_size: u64,
        slots: u64,
        apply: &mut dyn FnMut(Record) -> Result<(), String>,
    ) -> Result<(Persistence, Recovered), String> {
        std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
        let spb = (block_size / 512) as u32;
        let words = spb.div_ceil(64) as usize;
        let mut rec = Recovered::default();
        let geometry = |h: &Header, what: &Path| -> Result<(), String> {
            if h.block_size != block_size || h.slots != slots {
                return Err(format!(
                    "{}: the cache was written with {} slots of {} bytes, the config asks for {slots} of {block_size}; restore the old cache settings, or delete {} to start cold (cached dirty data would be lost)",
                    what.display(),
                    h.slots,
                    h.block_size,
                    dir.display()
                ));
            }
            Ok(())
        };
        let mut feed = |r: Record| -> Result<(), String> {
            match r {
                Record::Target { .. } => Ok(()), // the configuration decides targets at start
                r @ (Record::Vdisk { .. } | Record::Binding { .. }) => apply(r),
                r @ Record::Free { slot } if (slot as u64) < slots => apply(r),
                Record::Slot { slot, vm, block, valid, dirty }
                    if (slot as u64) < slots && valid.len() == words && dirty.len() == words =>
                {
                    apply(Record::Slot { slot, vm, block, valid, dirty })
                }
                r => Err(format!("record {r:?} does not fit a pool of {slots} slots of {block_size} bytes")),
            }
        };
        let ckpt = dir.join("checkpoint");
        let mut generation = 0;
        if ckpt.exists() {
            let mut f = File::open(&ckpt).map_err(|e| io_err(&ckpt, e))?;
            let mut h = [0u8; HEADER_LEN];
            f.read_exact(&mut h).map_err(|e| io_err(&ckpt, e))?;
            let header = Header::decode(&h, CHECKPOINT_MAGIC).map_err(|e| format!("{}: {e}", ckpt.display()))?;
            geometry(&header, &ckpt)?;
            let (records, clean) = read_records(&mut f).map_err(|e| io_err(&ckpt, e))?;
            if !clean {
                return Err(format!("{}: checkpoint is damaged (it is written atomically, so this is not a crash: the file was altered)", ckpt.display()));
            }
            for r in records {
                feed(r).map_err(|e| format!("{}: {e}", ckpt.display()))?;
            }
            generation = header.generation;
        }
        let jpath = dir.join("journal");
        if jpath.exists() {
            let mut f = File::open(&jpath).map_err(|e| io_err(&jpath, e))?;
            let mut h = [0u8; HEADER_LEN];
            if f.read_exact(&mut h).is_ok() {
                let header = Header::decode(&h, JOURNAL_MAGIC).map_err(|e| format!("{}: {e}", jpath.display()))?;
                geometry(&header, &jpath)?;
                // A journal of another generation was already folded into the checkpoint.
                if header.generation == generation {
                    let (records, clean) = read_records(&mut f).map_err(|e| io_err(&jpath, e))?;
                    rec.journal_records = records.len();
                    rec.torn_tail = !clean;
                    for r in records {
                        feed(r).map_err(|e| format!("{}: {e}", jpath.display()))?;
                    }
                }
            }
        }
        let header = Header { block_size, slots, generation };
        let journal = OpenOptions::new().create(true).append(true).open(&jpath).map_err(|e| io_err(&jpath, e))?;
        let journal_end = journal.metadata().map_err(|e| io_err(&jpath, e))?.len();
        let p = Persistence {
            dir: dir.to_path_buf(),
            header,
            words,
            journal,
            journal_end,
            poisoned: false,
            failing: false,
            slots,
            pre_sync: HashMap::new(),
            changed: Vec::new(),
            buf: Vec::new(),
            withheld: HashMap::new(),
            bindings: Vec::new(),
            limit: JOURNAL_LIMIT.max(slots * 64),
        };
        Ok((p, rec))
    }

    /// Whether writing sectors `lo..hi` of `slot`, which will hold `new_key`, needs a
    /// barrier first (see the module doc); `pre` = its journaled state before the request.
    pub fn needs_barrier(&self, slot: u32, new_key: u64, (lo, hi): (u32, u32), pre: &Pre) -> bool {
        let synced = match self.pre_sync.get(&slot) {
            Some(None) => return true, // unknown: assume it vouches for other data
            Some(Some(s)) => Pre::State(s.clone()),
            None => pre.clone(),
        };
        match synced {
            Pre::Free => false,
            Pre::Key(k) => k != FREE_KEY,
            Pre::State(s) if s.key == FREE_KEY => false,
            Pre::State(s) if s.key != new_key => true,
            Pre::State(s) => (lo..hi).any(|i| {
                let (w, b) = ((i / 64) as usize, i % 64);
                s.valid[w] >> b & 1 == 1 && s.dirty[w] >> b & 1 == 0
            }),
        }
    }

    fn append(&mut self, slot: u32, state: &SlotState, pre: Option<&Pre>) {
        self.pre_sync.entry(slot).or_insert_with(|| match pre {
            Some(Pre::State(s)) => Some(s.clone()),
            Some(Pre::Free) => {
                Some(SlotState { key: FREE_KEY, valid: vec![0; self.words], dirty: vec![0; self.words] })
            }
            _ => None,
        });
        if state.key == FREE_KEY || state.valid.iter().all(|&w| w == 0) {
            Record::Free { slot }.encode(&mut self.buf);
        } else {
            Record::Slot {
                slot,
                vm: key_vm(state.key) as u16,
                block: key_block(state.key),
                valid: state.valid.clone(),
                dirty: state.dirty.clone(),
            }
            .encode(&mut self.buf);
        }
    }

    /// Journals the barrier states of `writes` (slot, new key, sector range, state before
    /// the request) and makes them durable: `backings` and the cache store are fsynced,
    /// then the journal.
    pub fn barrier(
        &mut self,
        writes: &[(u32, u64, (u32, u32), Pre)],
        ssd: &File,
        backings: &[&crate::backing::Backing],
    ) -> std::io::Result<()> {
        for (slot, new_key, (lo, hi), pre) in writes {
            let free = SlotState { key: FREE_KEY, valid: vec![0; self.words], dirty: vec![0; self.words] };
            let state = match pre {
                Pre::State(cur) if cur.key == *new_key => {
                    let mut s = cur.clone();
                    for i in *lo..*hi {
                        let (w, b) = ((i / 64) as usize, i % 64);
                        if s.dirty[w] >> b & 1 == 0 {
                            s.valid[w] &= !(1 << b);
                        }
                    }
                    s
                }
                _ => free,
            };
            self.append(*slot, &state, Some(pre));
        }
        for b in backings {
            b.sync()?;
        }
        self.sync(ssd)
    }

    /// Journals the current state of every slot the engine reports changed since the last
    /// call; `pre(slot)` gives a slot's state before the request where the driver knows it.
    pub fn record(&mut self, e: &mut Engine, pre: impl Fn(u32) -> Option<Pre>) -> std::io::Result<()> {
        let mut changed = std::mem::take(&mut self.changed);
        e.take_changed(&mut changed);
        if !self.withheld.is_empty() {
            changed.retain(|s| {
                self.withheld.get(s).is_none_or(|&key| e.slot_block(*s).map(|(v, b)| pack_key(v, b)) != Some(key))
            });
        }
        for &slot in &changed {
            let now = SlotState::of(e, slot);
            let p = pre(slot);
            self.append(slot, &now, p.as_ref());
        }
        self.changed = changed;
        self.write_buffered()
    }

    /// Keeps `slots` (each holding `key`) out of the journal until [`Self::release`],
    /// as long as they hold that key.
    pub fn withhold(&mut self, slots: &[(u32, u64)]) {
        self.withheld.extend(slots.iter().copied());
    }

    /// Stops withholding `slots` without journaling them (their write was abandoned).
    pub fn unwithhold(&mut self, slots: &[(u32, u64)]) {
        for (slot, _) in slots {
            self.withheld.remove(slot);
        }
    }

    /// Journals the current state of withheld `slots` and stops withholding them.
    pub fn release(&mut self, e: &Engine, slots: &[(u32, u64)]) -> std::io::Result<()> {
        for &(slot, _) in slots {
            self.withheld.remove(&slot);
            let now = SlotState::of(e, slot);
            self.append(slot, &now, None);
        }
        self.write_buffered()
    }

    /// Journals every change after a bulk command (states before it are unknown).
    pub fn record_all(&mut self, e: &mut Engine) -> std::io::Result<()> {
        self.record(e, |_| None)
    }

    /// Journals that VM id `vm` is the vDisk `name` (a vDisk added while running).
    pub fn record_vdisk(&mut self, vm: u16, name: &str) -> std::io::Result<()> {
        Record::Vdisk { vm, name: name.to_string() }.encode(&mut self.buf);
        self.write_buffered()
    }

    /// Journals that VM id `vm`'s cached blocks belong to backing store `identity` (kept
    /// for every later checkpoint).
    pub fn record_binding(&mut self, vm: u16, identity: &crate::backing_identity::Identity) -> std::io::Result<()> {
        if self.bindings.len() <= vm as usize {
            self.bindings.resize(vm as usize + 1, None);
        }
        self.bindings[vm as usize] = Some(identity.clone());
        Record::Binding { vm, identity: identity.clone() }.encode(&mut self.buf);
        self.write_buffered()
    }

    /// Journals VM `vm`'s partition target.
    pub fn record_target(&mut self, vm: u16, blocks: u64) -> std::io::Result<()> {
        Record::Target { vm, blocks }.encode(&mut self.buf);
        self.write_buffered()
    }

    /// `e` with the metadata file it concerns (the kind is kept: ENOSPC stays StorageFull).
    fn named(&self, e: std::io::Error, file: &str) -> std::io::Error {
        std::io::Error::new(e.kind(), format!("{}: {e}", self.dir.join(file).display()))
    }

    /// Appends the buffered records. When the append fails (a full file system), the
    /// journal is cut back to its last whole record — a torn record would hide every later
    /// one from recovery — and the records stay buffered for the next attempt, in order.
    fn write_buffered(&mut self) -> std::io::Result<()> {
        if self.poisoned {
            return Err(std::io::Error::other(
                "the metadata journal could not be repaired after a failed append: restart the daemon",
            ));
        }
        if !self.buf.is_empty() {
            if let Err(e) = self.journal.write_all(&self.buf) {
                if self.journal.set_len(self.journal_end).is_err() {
                    self.poisoned = true;
                }
                if !self.failing {
                    self.failing = true;
                    tracing::error!(%e, dir = %self.dir.display(), "cannot append to the metadata journal: writes and flushes fail until it can (the records wait in memory, in order)");
                }
                return Err(self.named(e, "journal"));
            }
            if self.failing {
                self.failing = false;
                tracing::info!(dir = %self.dir.display(), "the metadata journal takes appends again");
            }
            self.journal_end += self.buf.len() as u64;
            self.buf.clear();
        }
        Ok(())
    }

    /// Makes everything journaled so far durable: cache store data first, then journal.
    pub fn sync(&mut self, ssd: &File) -> std::io::Result<()> {
        self.write_buffered()?;
        ssd.sync_data().map_err(|e| std::io::Error::new(e.kind(), format!("syncing the cache store: {e}")))?;
        self.journal.sync_data().map_err(|e| self.named(e, "journal"))?;
        // Clearing costs the table's capacity, which a burst can leave large.
        if self.pre_sync.capacity() > 4096 {
            self.pre_sync = HashMap::new();
        } else {
            self.pre_sync.clear();
        }
        Ok(())
    }

    /// Runs one of the engine's commits (persistent mode, `cachevisor_engine::Commit`) in
    /// the order its contract gives: sync the backing stores it names, sync the cache
    /// store, append its records, sync the journal. On error the journal is cut back to its
    /// last whole record (the engine retries the records in its next commit).
    pub fn commit(
        &mut self,
        c: &cachevisor_engine::Commit,
        ssd: &File,
        backings: &[&crate::backing::Backing],
    ) -> std::io::Result<()> {
        for b in backings {
            b.sync().map_err(|e| std::io::Error::new(e.kind(), format!("syncing a backing store: {e}")))?;
        }
        ssd.sync_data().map_err(|e| std::io::Error::new(e.kind(), format!("syncing the cache store: {e}")))?;
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        for r in &c.records {
            slot_record(r).encode(&mut buf);
        }
        self.buf = buf;
        let r = self.write_buffered();
        if r.is_err() {
            self.buf.clear(); // the engine sends these records again
        }
        r?;
        self.journal.sync_data().map_err(|e| self.named(e, "journal"))
    }

    /// Sets the journal size past which [`Self::wants_checkpoint`] says yes.
    pub fn set_journal_limit(&mut self, bytes: u64) {
        self.limit = bytes;
    }

    /// Writes a checkpoint from an engine in persistent mode (`records` streams every held
    /// slot's record, as `Engine::checkpoint` does, and returns the backing stores to sync
    /// first) and starts an empty journal of its generation. Order: backing stores, cache
    /// store, checkpoint (atomic), journal.
    pub fn checkpoint_records(
        &mut self,
        names: &[String],
        targets: &[u64],
        ssd: &File,
        backings: &[std::sync::Arc<crate::backing::Backing>],
        records: &mut CheckpointSource<'_>,
    ) -> std::io::Result<()> {
        let header = Header { generation: self.header.generation + 1, ..self.header };
        let bindings = self.bindings.clone();
        // Streamed in 1 MiB pieces (no copy of the slot table); the backing stores and the
        // cache store are synced before the file is renamed into place.
        write_file_atomically(&self.dir.join("checkpoint"), CHECKPOINT_MAGIC, &header, &mut |w| {
            let mut b = Vec::new();
            vdisk_records(names, targets, &bindings, &mut b);
            let mut failed: Option<std::io::Error> = None;
            let sync = records(&mut |r| {
                if r.block.is_some() {
                    slot_record(&r).encode(&mut b);
                }
                if b.len() > 1 << 20 && failed.is_none() {
                    failed = w.write_all(&b).err();
                    b.clear();
                }
            });
            if let Some(e) = failed {
                return Err(e);
            }
            w.write_all(&b)?;
            for vm in sync {
                if let Some(back) = backings.get(vm as usize) {
                    back.sync()?;
                }
            }
            ssd.sync_data()
        })?;
        self.start_journal(header)
    }

    /// Starts an empty journal of `header`'s generation (after its checkpoint is in place).
    fn start_journal(&mut self, header: Header) -> std::io::Result<()> {
        let jpath = self.dir.join("journal");
        write_file_atomically(&jpath, JOURNAL_MAGIC, &header, &mut |_| Ok(()))?;
        self.journal = OpenOptions::new().append(true).open(&jpath)?;
        self.journal_end = self.journal.metadata()?.len();
        self.header = header;
        self.pre_sync.clear();
        Ok(())
    }

    /// Whether the journal has grown past its limit.
    pub fn wants_checkpoint(&self) -> bool {
        self.journal_end > self.limit
    }

    /// Writes the whole state (`names` by VM id, `targets`) as the next checkpoint and
    /// starts an empty journal of its generation. Streams from the engine: no copy of the
    /// slot table is held.
    pub fn checkpoint(&mut self, e: &mut Engine, names: &[String], targets: &[u64], ssd: &File) -> std::io::Result<()> {
        self.record_all(e)?;
        ssd.sync_data()?;
        let header = Header { generation: self.header.generation + 1, ..self.header };
        write_file_atomically(&self.dir.join("checkpoint"), CHECKPOINT_MAGIC, &header, &mut |w| {
            let mut b = Vec::new();
            vdisk_records(names, targets, &self.bindings, &mut b);
            for slot in 0..self.slots as u32 {
                if e.slot_block(slot).is_some() {
                    let s = SlotState::of(e, slot);
                    Record::Slot {
                        slot,
                        vm: key_vm(s.key) as u16,
                        block: key_block(s.key),
                        valid: s.valid,
                        dirty: s.dirty,
                    }
                    .encode(&mut b);
                }
                if b.len() > 1 << 20 {
                    w.write_all(&b)?;
                    b.clear();
                }
            }
            w.write_all(&b)
        })?;
        self.start_journal(header)
    }
}

/// The records every checkpoint starts with: vDisk names and targets by VM id, and the
/// backing store each named vDisk is bound to.
fn vdisk_records(
    names: &[String],
    targets: &[u64],
    bindings: &[Option<crate::backing_identity::Identity>],
    b: &mut Vec<u8>,
) {
    for (vm, n) in names.iter().enumerate() {
        Record::Vdisk { vm: vm as u16, name: n.clone() }.encode(b);
    }
    for (vm, &t) in targets.iter().enumerate() {
        Record::Target { vm: vm as u16, blocks: t }.encode(b);
    }
    for (vm, id) in bindings.iter().enumerate() {
        if let Some(identity) = id.clone().filter(|_| names.get(vm).is_some_and(|n| !n.is_empty())) {
            Record::Binding { vm: vm as u16, identity }.encode(b);
        }
    }
}

/// The journal record of an engine slot record (free when it holds nothing valid).
fn slot_record(r: &cachevisor_engine::SlotRecord) -> Record {
    match r.block {
        Some((vm, block)) if r.valid.iter().any(|&w| w != 0) => {
            Record::Slot { slot: r.slot, vm: vm as u16, block, valid: r.valid.clone(), dirty: r.dirty.clone() }
        }
        _ => Record::Free { slot: r.slot },
    }
}
