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
//! Recovery reads the checkpoint and the journal of the same generation up to its first
//! torn record. The cost of the barrier is one fsync pair per request that overwrites
//! synced data (a full cache's misses, write hits on clean blocks); batching victims into
//! a durable free reserve would remove most of them and is the next step.

use crate::journal::{read_records, write_file_atomically, Header, Record, CHECKPOINT_MAGIC, HEADER_LEN, JOURNAL_MAGIC};
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
struct SlotState {
    key: u64,
    valid: Vec<u64>,
    dirty: Vec<u64>,
}

/// What recovery found: per slot (VM name, block, valid, dirty) and partition targets.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Occupied slots.
    pub slots: Vec<(u32, String, u64, Vec<bool>, Vec<bool>)>,
    /// Targets by VM name.
    pub targets: Vec<(String, u64)>,
    /// Journal records replayed after the checkpoint.
    pub journal_records: usize,
    /// Whether the journal ended in a torn record (a crash while appending).
    pub torn_tail: bool,
    /// Checkpoint generation.
    pub generation: u64,
}

/// The metadata store of one cache.
pub struct Persistence {
    dir: PathBuf,
    header: Header,
    spb: u32,
    words: usize,
    journal: File,
    journal_len: u64,
    mirror: Vec<SlotState>,
    /// Synced state of slots changed since the last fsync.
    pre_sync: HashMap<u32, SlotState>,
    buf: Vec<u8>,
}

fn bits_to_bools(words: &[u64], n: u32) -> Vec<bool> {
    (0..n).map(|s| words[(s / 64) as usize] >> (s % 64) & 1 == 1).collect()
}

fn io_err(path: &Path, e: std::io::Error) -> String {
    format!("{}: {e}", path.display())
}

impl Persistence {
    /// Opens (or creates) the metadata in `dir` for a cache of this geometry and recovers
    /// its state. A geometry mismatch is an error: the cached data cannot be interpreted.
    pub fn open(dir: &Path, block_size: u64, slots: u64) -> Result<(Persistence, Recovered), String> {
        std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
        let spb = (block_size / 512) as u32;
        let words = spb.div_ceil(64) as usize;
        let empty = SlotState { key: FREE_KEY, valid: vec![0; words], dirty: vec![0; words] };
        let mut mirror = vec![empty; slots as usize];
        let mut rec = Recovered::default();
        let mut names: HashMap<u16, String> = HashMap::new();
        let mut targets: HashMap<u16, u64> = HashMap::new();
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
        let mut apply = |r: Record, mirror: &mut Vec<SlotState>| -> Result<(), String> {
            match r {
                Record::Vdisk { vm, name } => {
                    names.insert(vm, name);
                }
                Record::Target { vm, blocks } => {
                    targets.insert(vm, blocks);
                }
                Record::Free { slot } => {
                    let s = mirror.get_mut(slot as usize).ok_or(format!("record for slot {slot} beyond the pool"))?;
                    *s = SlotState { key: FREE_KEY, valid: vec![0; words], dirty: vec![0; words] };
                }
                Record::Slot { slot, vm, block, valid, dirty } => {
                    if valid.len() != words {
                        return Err(format!("slot {slot}: record has {} bitmap words, expected {words}", valid.len()));
                    }
                    let s = mirror.get_mut(slot as usize).ok_or(format!("record for slot {slot} beyond the pool"))?;
                    *s = SlotState { key: pack_key(vm as u32, block), valid, dirty };
                }
            }
            Ok(())
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
                apply(r, &mut mirror).map_err(|e| format!("{}: {e}", ckpt.display()))?;
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
                        apply(r, &mut mirror).map_err(|e| format!("{}: {e}", jpath.display()))?;
                    }
                }
            }
        }
        for (slot, s) in mirror.iter().enumerate() {
            if s.key == FREE_KEY || s.valid.iter().all(|&w| w == 0) {
                continue;
            }
            let vm = key_vm(s.key) as u16;
            let name = names.get(&vm).cloned().ok_or(format!("slot {slot}: VM id {vm} has no vDisk name in the metadata"))?;
            rec.slots.push((slot as u32, name, key_block(s.key), bits_to_bools(&s.valid, spb), bits_to_bools(&s.dirty, spb)));
        }
        rec.targets = targets.into_iter().filter_map(|(vm, t)| names.get(&vm).map(|n| (n.clone(), t))).collect();
        rec.generation = generation;
        let header = Header { block_size, slots, generation };
        let journal = OpenOptions::new().create(true).append(true).open(&jpath).map_err(|e| io_err(&jpath, e))?;
        let empty = SlotState { key: FREE_KEY, valid: vec![0; words], dirty: vec![0; words] };
        let p = Persistence { dir: dir.to_path_buf(), header, spb, words, journal, journal_len: 0, mirror: vec![empty; slots as usize], pre_sync: HashMap::new(), buf: Vec::new() };
        Ok((p, rec))
    }

    /// The engine's state of `slot`.
    fn engine_state(&self, e: &Engine, slot: u32) -> SlotState {
        let mut s = SlotState { key: FREE_KEY, valid: vec![0; self.words], dirty: vec![0; self.words] };
        if let Some((vm, block)) = e.slot_block(slot) {
            s.key = pack_key(vm, block);
            for i in 0..self.spb {
                let (v, d) = e.sector_state(slot, i);
                s.valid[(i / 64) as usize] |= (v as u64) << (i % 64);
                s.dirty[(i / 64) as usize] |= (d as u64) << (i % 64);
            }
        }
        s
    }

    fn synced(&self, slot: u32) -> &SlotState {
        self.pre_sync.get(&slot).unwrap_or(&self.mirror[slot as usize])
    }

    /// Whether writing sectors `lo..hi` of `slot`, which will hold `new_key`, needs a
    /// barrier first (see the module doc).
    pub fn needs_barrier(&self, slot: u32, new_key: u64, (lo, hi): (u32, u32)) -> bool {
        let s = self.synced(slot);
        if s.key == FREE_KEY {
            return false;
        }
        if s.key != new_key {
            return true;
        }
        (lo..hi).any(|i| {
            let (w, b) = ((i / 64) as usize, i % 64);
            s.valid[w] >> b & 1 == 1 && s.dirty[w] >> b & 1 == 0
        })
    }

    fn append(&mut self, slot: u32, state: SlotState) {
        let old = std::mem::replace(&mut self.mirror[slot as usize], state.clone());
        self.pre_sync.entry(slot).or_insert(old);
        if state.key == FREE_KEY || state.valid.iter().all(|&w| w == 0) {
            Record::Free { slot }.encode(&mut self.buf);
        } else {
            Record::Slot { slot, vm: key_vm(state.key) as u16, block: key_block(state.key), valid: state.valid, dirty: state.dirty }.encode(&mut self.buf);
        }
    }

    /// Journals the barrier states of `writes` (slot, new key, sector range) and makes
    /// them durable: `backings` and the cache store are fsynced, then the journal.
    pub fn barrier(&mut self, writes: &[(u32, u64, (u32, u32))], ssd: &File, backings: &[&File]) -> std::io::Result<()> {
        for &(slot, new_key, (lo, hi)) in writes {
            let cur = self.mirror[slot as usize].clone();
            let state = if cur.key != new_key {
                SlotState { key: FREE_KEY, valid: vec![0; self.words], dirty: vec![0; self.words] }
            } else {
                let mut s = cur;
                for i in lo..hi {
                    let (w, b) = ((i / 64) as usize, i % 64);
                    if s.dirty[w] >> b & 1 == 0 {
                        s.valid[w] &= !(1 << b);
                    }
                }
                s
            };
            self.append(slot, state);
        }
        for b in backings {
            b.sync_data()?;
        }
        self.sync(ssd)
    }

    /// Appends a record for every slot in `slots` whose engine state differs from the
    /// journaled one, and writes them (one write, no fsync).
    pub fn record(&mut self, e: &Engine, slots: impl IntoIterator<Item = u32>) -> std::io::Result<()> {
        for slot in slots {
            let now = self.engine_state(e, slot);
            if now != self.mirror[slot as usize] {
                self.append(slot, now);
            }
        }
        self.write_buffered()
    }

    /// Records every slot that changed (after bulk commands).
    pub fn record_all(&mut self, e: &Engine) -> std::io::Result<()> {
        self.record(e, 0..self.mirror.len() as u32)
    }

    /// Journals a partition target.
    pub fn record_target(&mut self, vm: u16, blocks: u64) -> std::io::Result<()> {
        Record::Target { vm, blocks }.encode(&mut self.buf);
        self.write_buffered()
    }

    fn write_buffered(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            self.journal.write_all(&self.buf)?;
            self.journal_len += self.buf.len() as u64;
            self.buf.clear();
        }
        Ok(())
    }

    /// Makes everything journaled so far durable: cache store data first, then journal.
    pub fn sync(&mut self, ssd: &File) -> std::io::Result<()> {
        self.write_buffered()?;
        ssd.sync_data()?;
        self.journal.sync_data()?;
        self.pre_sync.clear();
        Ok(())
    }

    /// Whether the journal has grown past its limit.
    pub fn wants_checkpoint(&self) -> bool {
        self.journal_len > JOURNAL_LIMIT.max(self.mirror.len() as u64 * 64)
    }

    /// Writes the whole state (`names` by VM id, `targets`) as the next checkpoint and
    /// starts an empty journal of its generation.
    pub fn checkpoint(&mut self, e: &Engine, names: &[String], targets: &[u64], ssd: &File) -> std::io::Result<()> {
        self.record_all(e)?;
        ssd.sync_data()?;
        let mut body = Vec::new();
        for (vm, n) in names.iter().enumerate() {
            Record::Vdisk { vm: vm as u16, name: n.clone() }.encode(&mut body);
        }
        for (vm, &t) in targets.iter().enumerate() {
            Record::Target { vm: vm as u16, blocks: t }.encode(&mut body);
        }
        for (slot, s) in self.mirror.iter().enumerate() {
            if s.key != FREE_KEY {
                Record::Slot { slot: slot as u32, vm: key_vm(s.key) as u16, block: key_block(s.key), valid: s.valid.clone(), dirty: s.dirty.clone() }.encode(&mut body);
            }
        }
        let header = Header { generation: self.header.generation + 1, ..self.header };
        write_file_atomically(&self.dir.join("checkpoint"), CHECKPOINT_MAGIC, &header, &body)?;
        let jpath = self.dir.join("journal");
        write_file_atomically(&jpath, JOURNAL_MAGIC, &header, &[])?;
        self.journal = OpenOptions::new().append(true).open(&jpath)?;
        self.header = header;
        self.journal_len = 0;
        self.pre_sync.clear();
        Ok(())
    }

    /// Takes the engine's state as the journaled one (after recovery rebuilt it).
    pub fn adopt(&mut self, e: &Engine) {
        for slot in 0..self.mirror.len() as u32 {
            self.mirror[slot as usize] = self.engine_state(e, slot);
        }
        self.pre_sync.clear();
    }
}
