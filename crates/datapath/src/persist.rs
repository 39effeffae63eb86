//! Crash-consistent cache metadata (see `journal` for the format): which slot holds which
//! block of which vDisk, with valid and dirty sectors, kept so that a daemon killed at any
//! moment restarts warm — clean and dirty blocks still cached — and never serves a byte
//! that is not the block's.
//!
//! The rules — which records must be durable before which write — are the engine's
//! persistent mode (`cachevisor_engine::Commit`, `durability.rs`); this file runs its
//! commits in their order (backing stores, cache store, records, journal), writes
//! checkpoints (the whole state, atomically) that replace the journal, and replays
//! checkpoint + journal of the same generation, up to the journal's first torn record,
//! straight into an engine at start.

use cachevisor_engine::Engine;
use cachevisor_store::journal::{
    read_records, read_records_to, write_file_atomically, Header, Record, CHECKPOINT_MAGIC, HEADER_LEN, JOURNAL_MAGIC,
};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Journal size past which a checkpoint replaces it (and at least 64 bytes per slot).
const JOURNAL_LIMIT: u64 = 64 << 20;

/// The journal is written ahead with zeros this far past its records (`journal.rs`: an
/// append then changes no file size, and its sync commits no file-system journal).
const WRITE_AHEAD: u64 = 4 << 20;

/// What recovery replayed.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Journal records replayed after the checkpoint.
    pub journal_records: usize,
    /// Whether the journal ended in a torn record (a crash while appending).
    pub torn_tail: bool,
    /// Where the replayed journal's records end (its header and whole records), when it
    /// was replayed: the next record goes there, not after a torn one or the zeros ahead.
    pub journal_end: Option<u64>,
}

/// Streams an engine's checkpoint records into the given sink and returns the backing
/// stores to sync first (`Engine::checkpoint`).
pub type CheckpointSource<'a> =
    dyn FnMut(&mut dyn FnMut(cachevisor_engine::SlotRecord)) -> cachevisor_engine::Syncs + 'a;

/// The metadata store of one cache.
pub struct Persistence {
    dir: PathBuf,
    header: Header,
    /// `None` while the cache is detached (the data path's `cache_swap.rs`): nothing is journaled.
    journal: Option<File>,
    /// Where the journal's last whole record ends: where the next is written, where a
    /// failed append is cut back to, and what `wants_checkpoint` measures.
    journal_end: u64,
    /// The journal file's length: zeros from `journal_end` on ([`WRITE_AHEAD`]).
    written_ahead: u64,
    /// The journal has no whole header (new metadata, or a crash while one was written):
    /// nothing is written into it until the first checkpoint starts one — its records
    /// would begin the file, where a replay looks for the header ("bad magic"), and the
    /// checkpoint holds what they say (names, bindings).
    headless: bool,
    /// An append failed and the journal could not be cut back: nothing more is journaled.
    poisoned: bool,
    /// Appends are failing (logged once when it starts and once when it ends).
    failing: bool,
    slots: u64,
    buf: Vec<u8>,
    /// Each VM id's backing store (written into every checkpoint).
    bindings: Vec<Option<cachevisor_store::backing_identity::Identity>>,
    /// Journal size past which a checkpoint is wanted (tests lower it).
    limit: u64,
    /// The label the cache store carries (`cache_label.rs`), named in every checkpoint.
    label: Option<cachevisor_store::cache_label::Expected>,
    /// The cache's devices (serial and slots), named in every checkpoint when there are
    /// several (`Record::CacheDevices`).
    devices: Vec<cachevisor_store::journal::DeviceRow>,
}

/// Expands a sector bitmap into one flag per sector.
pub fn bits_to_bools(words: &[u64], n: u32) -> Vec<bool> {
    (0..n).map(|s| words[(s / 64) as usize] >> (s % 64) & 1 == 1).collect()
}

fn io_err(path: &Path, e: std::io::Error) -> String {
    format!("{}: {e}", path.display())
}

/// The slots the metadata in `dir` was laid out for (its checkpoint's header, else its
/// journal's); `None` when it has neither (a new cache).
pub fn recorded_slots(dir: &Path) -> Result<Option<u64>, String> {
    for (name, magic) in [("checkpoint", CHECKPOINT_MAGIC), ("journal", JOURNAL_MAGIC)] {
        let path = dir.join(name);
        if !path.exists() {
            continue;
        }
        let mut f = cachevisor_files::bounded_read::open_regular(&path).map_err(|e| io_err(&path, e))?;
        let mut h = [0u8; HEADER_LEN];
        if f.read_exact(&mut h).is_err() {
            continue; // a journal cut before its header: nothing in it
        }
        let header = Header::decode(&h, magic).map_err(|e| format!("{}: {e}", path.display()))?;
        return Ok(Some(header.slots));
    }
    Ok(None)
}

/// Replays the metadata in `dir` for a cache of this geometry, record by record, into
/// `apply` (checkpoint first, then the journal of the same generation up to its first
/// torn record), reading only; returns what was replayed and the generation. A geometry
/// mismatch is an error: the cached data cannot be interpreted.
pub fn replay(
    dir: &Path,
    block_size: u64,
    slots: u64,
    apply: &mut dyn FnMut(Record) -> Result<(), String>,
) -> Result<(Recovered, u64), String> {
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
            r @ (Record::Vdisk { .. } | Record::Binding { .. } | Record::CacheLabel(_) | Record::CacheDevices(_)) => {
                apply(r)
            }
            r @ Record::Free { slot } if (slot as u64) < slots => apply(r),
            Record::Mirror { slot, vm, block, sectors } if (slot as u64) < slots && sectors.len() == words => {
                apply(Record::Mirror { slot, vm, block, sectors })
            }
            Record::Slot { slot, vm, block, valid, dirty, sums }
                if (slot as u64) < slots && valid.len() == words && dirty.len() == words =>
            {
                apply(Record::Slot { slot, vm, block, valid, dirty, sums })
            }
            // A region another node lends (slots after the local ones, `[cluster]
            // peers`): its blocks are never dirty (the engine's lent write-through) and
            // not restored — this node cannot vouch for a lender's bytes after a restart.
            Record::Free { .. } => Ok(()),
            Record::Slot { slot, dirty, .. } if dirty.iter().all(|w| *w == 0) => {
                tracing::debug!(slot, "a block in a lent region is not restored");
                Ok(())
            }
            r => Err(format!("record {r:?} does not fit a pool of {slots} slots of {block_size} bytes")),
        }
    };
    let ckpt = dir.join("checkpoint");
    let mut generation = 0;
    if ckpt.exists() {
        let mut f = cachevisor_files::bounded_read::open_regular(&ckpt).map_err(|e| io_err(&ckpt, e))?;
        let mut h = [0u8; HEADER_LEN];
        f.read_exact(&mut h).map_err(|e| io_err(&ckpt, e))?;
        let header = Header::decode(&h, CHECKPOINT_MAGIC).map_err(|e| format!("{}: {e}", ckpt.display()))?;
        geometry(&header, &ckpt)?;
        let (records, clean) = read_records(&mut f).map_err(|e| io_err(&ckpt, e))?;
        if !clean {
            return Err(format!(
                "{}: checkpoint is damaged (it is written atomically, so this is not a crash: the file was altered)",
                ckpt.display()
            ));
        }
        for r in records {
            feed(r).map_err(|e| format!("{}: {e}", ckpt.display()))?;
        }
        generation = header.generation;
    }
    let jpath = dir.join("journal");
    if jpath.exists() {
        let mut f = cachevisor_files::bounded_read::open_regular(&jpath).map_err(|e| io_err(&jpath, e))?;
        let mut h = [0u8; HEADER_LEN];
        if f.read_exact(&mut h).is_ok() {
            let header = Header::decode(&h, JOURNAL_MAGIC).map_err(|e| format!("{}: {e}", jpath.display()))?;
            geometry(&header, &jpath)?;
            // A journal of another generation was already folded into the checkpoint.
            if header.generation == generation {
                let (records, clean, end) = read_records_to(&mut f).map_err(|e| io_err(&jpath, e))?;
                rec.journal_records = records.len();
                rec.torn_tail = !clean;
                rec.journal_end = Some(HEADER_LEN as u64 + end);
                for r in records {
                    feed(r).map_err(|e| format!("{}: {e}", jpath.display()))?;
                }
            }
        }
    }
    Ok((rec, generation))
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
        cachevisor_files::private_files::ensure_dir(dir).map_err(|e| io_err(dir, e))?;
        let (rec, generation) = replay(dir, block_size, slots, apply)?;
        let jpath = dir.join("journal");
        let header = Header { block_size, slots, generation };
        let journal = cachevisor_files::private_files::own_options()
            .create(true)
            .write(true)
            .truncate(false)
            .open(&jpath)
            .map_err(|e| io_err(&jpath, e))?;
        let len = journal.metadata().map_err(|e| io_err(&jpath, e))?.len();
        // The next record goes right after the last whole one: a torn record and the
        // zeros written ahead are cut (a journal of another generation stays as it is:
        // the checkpoint a start writes replaces it).
        let journal_end = match rec.journal_end {
            Some(end) if end < len => {
                journal.set_len(end).map_err(|e| io_err(&jpath, e))?;
                end
            }
            _ => len,
        };
        let p = Persistence {
            dir: dir.to_path_buf(),
            header,
            journal: Some(journal),
            journal_end,
            written_ahead: journal_end,
            headless: journal_end < HEADER_LEN as u64,
            poisoned: false,
            failing: false,
            slots,
            buf: Vec::new(),
            bindings: Vec::new(),
            limit: JOURNAL_LIMIT.max(slots * 64),
            label: None,
            devices: Vec::new(),
        };
        Ok((p, rec))
    }

    /// Journals that VM id `vm` is the vDisk `name` (a vDisk added while running).
    pub fn record_vdisk(&mut self, vm: u16, name: &str) -> std::io::Result<()> {
        Record::Vdisk { vm, name: name.to_string() }.encode(&mut self.buf);
        self.write_buffered()
    }

    /// Journals that VM id `vm`'s cached blocks belong to backing store `identity` (kept
    /// for every later checkpoint).
    pub fn record_binding(
        &mut self,
        vm: u16,
        identity: &cachevisor_store::backing_identity::Identity,
    ) -> std::io::Result<()> {
        if self.bindings.len() <= vm as usize {
            self.bindings.resize(vm as usize + 1, None);
        }
        self.bindings[vm as usize] = Some(identity.clone());
        Record::Binding { vm, identity: identity.clone() }.encode(&mut self.buf);
        self.write_buffered()
    }

    /// The label the cache store carries, as the checkpoints name it.
    pub fn label(&self) -> Option<cachevisor_store::cache_label::Expected> {
        self.label
    }

    /// The cache's devices as the checkpoints name them (empty: one device).
    pub fn devices(&self) -> &[cachevisor_store::journal::DeviceRow] {
        &self.devices
    }

    /// Names the label the cache store carries in every checkpoint from the next one on.
    pub fn set_label(&mut self, label: cachevisor_store::cache_label::Expected) {
        self.label = Some(label);
    }

    /// Names the cache's devices (serial and slots of each, in store order) in every
    /// checkpoint from the next one on; one device is named by the header alone.
    pub fn set_devices(&mut self, rows: &[cachevisor_store::journal::DeviceRow]) {
        self.devices = if rows.len() > 1 { rows.to_vec() } else { Vec::new() };
    }

    /// Lays the metadata out for `slots` from the next checkpoint on (the start that
    /// replayed another layout, `Record::CacheDevices`, writes one next: the journal's
    /// records until then name no slot).
    pub fn set_slots(&mut self, slots: u64) {
        self.slots = slots;
        self.header.slots = slots;
        self.limit = JOURNAL_LIMIT.max(slots * 64);
    }

    /// The generation the next checkpoint gets.
    pub fn next_generation(&self) -> u64 {
        self.header.generation + 1
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
        if self.headless {
            self.buf.clear();
            return Ok(());
        }
        let Some(journal) = self.journal.as_mut() else {
            // Detached: the vDisk records are kept in memory (names by the data path,
            // bindings here) and go into the checkpoint that reattaching writes.
            self.buf.clear();
            return Ok(());
        };
        if !self.buf.is_empty() {
            let end = self.journal_end + self.buf.len() as u64;
            if end > self.written_ahead {
                // Zeros ahead (one size change, one file-system commit, per 4 MiB of
                // records); where they do not fit (a nearly full file system), the append
                // alone extends the file, as an append always did.
                // A journal rarely outgrows its limit.
                let to = end + WRITE_AHEAD.min(self.limit.max(4096));
                // Only with room to spare: zeros written into the last free megabytes of a
                // file system the backing store or cache file shares would fail their
                // writes meanwhile (a write-back's ENOSPC, `data_safety.rs`'s full shared
                // file system, one run in three).
                if room_for(journal, to - self.written_ahead) {
                    match write_zeros(journal, self.written_ahead, to) {
                        Ok(()) => self.written_ahead = to,
                        Err(_) => {
                            let _ = journal.set_len(self.written_ahead);
                        }
                    }
                }
            }
            if let Err(e) = journal.write_all_at(&self.buf, self.journal_end) {
                if journal.set_len(self.journal_end).is_err() {
                    self.poisoned = true;
                }
                self.written_ahead = self.journal_end;
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
            self.journal_end = end;
            self.written_ahead = self.written_ahead.max(end);
            self.buf.clear();
        }
        Ok(())
    }

    /// Runs one of the engine's commits (persistent mode, `cachevisor_engine::Commit`) in
    /// the order its contract gives: sync the backing stores it names, sync the cache
    /// stores (`sync_cache`), append its records, sync the journal. On error the journal is cut back to its
    /// last whole record (the engine retries the records in its next commit).
    pub fn commit(
        &mut self,
        c: &cachevisor_engine::Commit,
        sync_cache: &dyn Fn() -> std::io::Result<()>,
        backings: &[&cachevisor_store::backing::Backing],
        sums: SumsOf<'_>,
    ) -> std::io::Result<()> {
        if self.headless && !c.records.is_empty() {
            return Err(std::io::Error::other(format!(
                "{} slot records before the first checkpoint: no journal to go to yet",
                c.records.len()
            )));
        }
        if self.journal.is_none() && !c.records.is_empty() {
            // Every slot is withheld while detached: a slot record here is a bug, and
            // failing it fails the writes that wait on it rather than losing them.
            return Err(std::io::Error::other(format!(
                "the cache is detached: {} slot records have no journal to go to",
                c.records.len()
            )));
        }
        for b in backings {
            b.sync().map_err(|e| std::io::Error::new(e.kind(), format!("syncing a backing store: {e}")))?;
        }
        sync_cache().map_err(|e| std::io::Error::new(e.kind(), format!("syncing the cache store: {e}")))?;
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        for r in &c.records {
            slot_record(r, sums).encode(&mut buf);
        }
        self.buf = buf;
        let r = self.write_buffered();
        if r.is_err() {
            self.buf.clear(); // the engine sends these records again
        }
        r?;
        match &self.journal {
            Some(j) => j.sync_data().map_err(|e| self.named(e, "journal")),
            None => Ok(()),
        }
    }

    /// Closes the journal: the metadata directory leaves with a detached cache
    /// (the data path's `cache_swap.rs`), after a checkpoint that names no slot. Until
    /// [`Self::reattach`] and the checkpoint after it, commits carry no slot record.
    pub fn detach(&mut self) {
        self.journal = None;
        self.buf.clear();
    }

    /// Whether the journal is closed ([`Self::detach`]).
    pub fn detached(&self) -> bool {
        self.journal.is_none()
    }

    /// Takes the metadata directory again after [`Self::detach`] (created when missing:
    /// a new SSD). The generation moves past any checkpoint or journal found there, so
    /// the checkpoint written next never continues another generation's journal; the
    /// journal opens with that checkpoint ([`Self::checkpoint_records`]).
    pub fn reattach(&mut self) -> std::io::Result<()> {
        cachevisor_files::private_files::ensure_dir(&self.dir)?;
        let found = |name: &str, magic| -> u64 {
            let mut h = [0u8; HEADER_LEN];
            File::open(self.dir.join(name))
                .and_then(|mut f| f.read_exact(&mut h))
                .ok()
                .and_then(|()| Header::decode(&h, magic).ok())
                .map_or(0, |h| h.generation)
        };
        let newest = found("checkpoint", CHECKPOINT_MAGIC).max(found("journal", JOURNAL_MAGIC));
        self.header.generation = self.header.generation.max(newest);
        Ok(())
    }

    /// Sets the journal size past which [`Self::wants_checkpoint`] says yes.
    pub fn set_journal_limit(&mut self, bytes: u64) {
        self.limit = bytes;
    }

    /// Writes a checkpoint from an engine in persistent mode (`records` streams every held
    /// slot's record, as `Engine::checkpoint` does, and returns the backing stores to sync
    /// first) and starts an empty journal of its generation. Order: backing stores, cache
    /// stores (`sync_cache`), checkpoint (atomic), journal.
    pub fn checkpoint_records(
        &mut self,
        names: &[String],
        targets: &[u64],
        sync_cache: &dyn Fn() -> std::io::Result<()>,
        backings: &[std::sync::Arc<cachevisor_store::backing::Backing>],
        records: &mut CheckpointSource<'_>,
        sums: SumsOf<'_>,
    ) -> std::io::Result<()> {
        let header = Header { generation: self.header.generation + 1, ..self.header };
        let (bindings, label, devices) = (self.bindings.clone(), self.label, self.devices.clone());
        // Streamed in 1 MiB pieces (no copy of the slot table); the backing stores and the
        // cache store are synced before the file is renamed into place.
        write_file_atomically(&self.dir.join("checkpoint"), CHECKPOINT_MAGIC, &header, &mut |w| {
            let mut b = Vec::new();
            vdisk_records(names, targets, &bindings, (label, &devices), &mut b);
            let mut failed: Option<std::io::Error> = None;
            let sync = records(&mut |r| {
                if r.block.is_some() {
                    slot_record(&r, sums).encode(&mut b);
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
            // Every cache store is synced whatever the engine names.
            for vm in sync.backings {
                if let Some(back) = backings.get(vm as usize) {
                    back.sync()?;
                }
            }
            sync_cache()
        })?;
        self.start_journal(header)
    }

    /// Starts an empty journal of `header`'s generation (after its checkpoint is in place).
    fn start_journal(&mut self, header: Header) -> std::io::Result<()> {
        let jpath = self.dir.join("journal");
        write_file_atomically(&jpath, JOURNAL_MAGIC, &header, &mut |_| Ok(()))?;
        let journal = cachevisor_files::private_files::own_options().write(true).open(&jpath)?;
        self.journal_end = journal.metadata()?.len();
        self.written_ahead = self.journal_end;
        self.headless = false;
        self.journal = Some(journal);
        self.header = header;
        Ok(())
    }

    /// Whether the journal has grown past its limit.
    pub fn wants_checkpoint(&self) -> bool {
        self.journal_end > self.limit
    }

    /// Writes the whole state of an engine not serving yet (`names` by VM id, `targets`)
    /// as the next checkpoint and starts an empty journal of its generation (at start,
    /// after the replay). Streams from the engine: no copy of the slot table is held.
    pub fn checkpoint(
        &mut self,
        e: &Engine,
        names: &[String],
        targets: &[u64],
        ssd: &File,
        sums: SumsOf<'_>,
    ) -> std::io::Result<()> {
        ssd.sync_data()?;
        let header = Header { generation: self.header.generation + 1, ..self.header };
        write_file_atomically(&self.dir.join("checkpoint"), CHECKPOINT_MAGIC, &header, &mut |w| {
            let mut b = Vec::new();
            vdisk_records(names, targets, &self.bindings, (self.label, &self.devices), &mut b);
            for slot in 0..self.slots as u32 {
                if e.slot_block(slot).is_some() {
                    let r = cachevisor_engine::SlotRecord { sealed: e.is_sealed(slot), ..e.record_of(slot) };
                    slot_record(&r, sums).encode(&mut b);
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

/// The records every checkpoint starts with: the cache store's label, vDisk names and
/// targets by VM id, and the backing store each named vDisk is bound to.
fn vdisk_records(
    names: &[String],
    targets: &[u64],
    bindings: &[Option<cachevisor_store::backing_identity::Identity>],
    (label, devices): (Option<cachevisor_store::cache_label::Expected>, &[cachevisor_store::journal::DeviceRow]),
    b: &mut Vec<u8>,
) {
    if let Some(l) = label {
        Record::CacheLabel(l).encode(b);
    }
    if !devices.is_empty() {
        Record::CacheDevices(devices.to_vec()).encode(b);
    }
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

/// The checksums a seal record carries (`BlockSums::of_record`; `None`: none known).
pub type SumsOf<'a> = &'a dyn Fn(&cachevisor_engine::SlotRecord) -> Option<Vec<u32>>;

/// No checksums (a tool that writes metadata without a data path).
pub fn no_sums(_: &cachevisor_engine::SlotRecord) -> Option<Vec<u32>> {
    None
}

/// The journal record of an engine slot record (free when it holds nothing valid); a
/// seal carries its dirty sectors' checksums when `sums` knows them all.
fn slot_record(r: &cachevisor_engine::SlotRecord, sums: SumsOf<'_>) -> Record {
    match r.block {
        Some((vm, block)) if r.mirror => {
            Record::Mirror { slot: r.slot, vm: vm as u16, block, sectors: r.valid.clone() }
        }
        Some((vm, block)) if r.valid.iter().any(|&w| w != 0) => Record::Slot {
            slot: r.slot,
            vm: vm as u16,
            block,
            valid: r.valid.clone(),
            dirty: r.dirty.clone(),
            sums: if r.sealed { sums(r) } else { None },
        },
        _ => Record::Free { slot: r.slot },
    }
}

/// Whether `f`'s file system has room for `bytes` more and still four times as much free
/// after (unknown: no).
fn room_for(f: &File, bytes: u64) -> bool {
    rustix::fs::fstatvfs(f).is_ok_and(|s| s.f_bavail.saturating_mul(s.f_frsize) >= bytes.saturating_mul(5))
}

/// Writes zeros into `f` from `from` to `to` (real zeros, not a hole or an unwritten
/// extent: writing into those would change the file system's metadata again).
fn write_zeros(f: &File, from: u64, to: u64) -> std::io::Result<()> {
    let zeros = vec![0u8; (to - from).min(1 << 20) as usize];
    let mut at = from;
    while at < to {
        let n = (to - at).min(zeros.len() as u64) as usize;
        f.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachevisor_store::journal::write_file_atomically;

    fn no_records(_: Record) -> Result<(), String> {
        Ok(())
    }

    /// Reattached to a directory holding another generation's journal (a metadata
    /// directory left on a reused SSD), the next checkpoint takes a generation past it:
    /// a replay never continues that journal with our checkpoint.
    #[test]
    fn a_reattached_journal_starts_past_every_generation_found() {
        let dir = tempfile::tempdir().unwrap();
        let meta = dir.path().join("meta");
        let (mut p, _) = Persistence::open(&meta, 4096, 16, &mut no_records).unwrap();
        let empty = |_: &mut dyn FnMut(cachevisor_engine::SlotRecord)| cachevisor_engine::Syncs::default();
        p.checkpoint_records(&["vm0".into()], &[0], &|| Ok(()), &[], &mut { empty }, &no_sums).unwrap();
        p.detach();
        assert!(p.detached());
        // Detached: the daemon's records stay in memory, a slot record is refused.
        p.record_vdisk(0, "vm0").unwrap();
        let c = cachevisor_engine::Commit {
            epoch: 1,
            records: Vec::new(),
            sync_backings: Vec::new(),
            sync_stores: Vec::new(),
        };
        p.commit(&c, &|| Ok(()), &[], &no_sums).unwrap();
        let slot = cachevisor_engine::SlotRecord {
            slot: 3,
            block: Some((0, 7)),
            valid: vec![!0],
            dirty: vec![0],
            sealed: false,
            mirror: false,
        };
        let e =
            p.commit(&cachevisor_engine::Commit { records: vec![slot], ..c }, &|| Ok(()), &[], &no_sums).unwrap_err();
        assert!(e.to_string().contains("detached"), "{e}");
        // Another cache's journal of generation 9 appears where ours was.
        std::fs::remove_dir_all(&meta).unwrap();
        std::fs::create_dir(&meta).unwrap();
        let foreign = Header { block_size: 4096, slots: 16, generation: 9 };
        write_file_atomically(&meta.join("journal"), JOURNAL_MAGIC, &foreign, &mut |_| Ok(())).unwrap();
        p.reattach().unwrap();
        p.checkpoint_records(&["vm0".into()], &[0], &|| Ok(()), &[], &mut { empty }, &no_sums).unwrap();
        assert!(!p.detached());
        let mut names = Vec::new();
        let (_, generation) = replay(&meta, 4096, 16, &mut |r| {
            if let Record::Vdisk { name, .. } = r {
                names.push(name);
            }
            Ok(())
        })
        .unwrap();
        assert_eq!((generation, names), (10, vec!["vm0".to_string()]));
    }

    /// The journal is written ahead with zeros; a restart replays every record before
    /// them, cuts them (and a torn record), and a record journaled before the next
    /// checkpoint goes right after the last whole one — never after the zeros, where a
    /// replay would not find it.
    #[test]
    fn records_after_a_restart_follow_the_last_whole_record_not_the_zeros_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let meta = dir.path().join("meta");
        let names = |meta: &Path| {
            let mut v = Vec::new();
            let (rec, _) = replay(meta, 4096, 16, &mut |r| {
                if let Record::Vdisk { name, .. } = r {
                    v.push(name);
                }
                Ok(())
            })
            .unwrap();
            (v, rec.torn_tail)
        };
        let journal = meta.join("journal");
        {
            let (mut p, _) = Persistence::open(&meta, 4096, 16, &mut no_records).unwrap();
            let empty = |_: &mut dyn FnMut(cachevisor_engine::SlotRecord)| cachevisor_engine::Syncs::default();
            p.checkpoint_records(&[], &[], &|| Ok(()), &[], &mut { empty }, &no_sums).unwrap();
            p.record_vdisk(0, "a").unwrap();
            p.record_vdisk(1, "b").unwrap();
        }
        let len = std::fs::metadata(&journal).unwrap().len();
        assert!(len >= 4096, "zeros written ahead of the records ({len} bytes)");
        assert_eq!(names(&meta), (vec!["a".to_string(), "b".to_string()], false), "zeros ahead: a clean end");
        // A record torn in the space ahead (its first bytes written, the rest not).
        let mut torn = Vec::new();
        Record::Vdisk { vm: 2, name: "torn".into() }.encode(&mut torn);
        let (_, _, end) = read_records_to(&mut &std::fs::read(&journal).unwrap()[HEADER_LEN..]).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&journal)
            .unwrap()
            .write_all_at(&torn[..torn.len() / 2], HEADER_LEN as u64 + end)
            .unwrap();
        assert_eq!(names(&meta), (vec!["a".to_string(), "b".to_string()], true));
        {
            let (mut p, rec) = Persistence::open(&meta, 4096, 16, &mut no_records).unwrap();
            assert_eq!((rec.journal_records, rec.torn_tail), (2, true));
            p.record_vdisk(3, "c").unwrap();
        }
        assert_eq!(names(&meta), (vec!["a".to_string(), "b".to_string(), "c".to_string()], false));
    }

    /// A start on fresh metadata that journals records (bindings) and stops before its
    /// first checkpoint leaves a journal the next start reads (it holds none of them: the
    /// checkpoint would have).
    #[test]
    fn records_journaled_before_the_first_checkpoint_leave_a_readable_journal() {
        let dir = tempfile::tempdir().unwrap();
        let meta = dir.path().join("meta");
        {
            let (mut p, _) = Persistence::open(&meta, 4096, 16, &mut no_records).unwrap();
            for vm in 0..4 {
                p.record_vdisk(vm, "a-vdisk-with-a-long-name").unwrap();
            }
        }
        let (_, rec) = Persistence::open(&meta, 4096, 16, &mut no_records).expect("the journal reads");
        assert_eq!((rec.journal_records, rec.torn_tail), (0, false));
    }
}
