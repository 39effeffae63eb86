//! CRC32C of the sectors the daemon wrote to its cache stores (dirty blocks carry
//! a checksum). A client write, or a copy of checksummed bytes between slots (a
//! migration), gives each sector it wrote the checksum of its bytes; a fill from a backing
//! store (clean bytes the backing store also has) and a failed write give none; a commit
//! forgets the sectors its records call clean and the slots they free, so what is kept is
//! about the dirty data. Every cache read is checked before its bytes reach a client or a
//! backing store: a mismatch fails the op (`Failure::Corrupt`: EIO to the client, the
//! slot poisoned in the engine, never written back) and is counted and logged. The
//! engine's seal records (`engine/src/seals.rs`) carry the checksums of a cold dirty
//! block's sectors into the journal, so a restart checks those blocks too.
//!
//! A sharded map of per-slot checksum arrays is written by hand: nothing more is needed,
//! and no crate keeps per-sector checksums beside a cache. CRC32C is the `crc32c` crate's
//! (SSE 4.2 / ARMv8 instructions: a 4 KiB block in well under a microsecond).

use cachevisor_engine::SlotRecord;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// Bytes a checksum covers.
const SECTOR: usize = 512;
/// Shards of the map (device threads check reads in parallel).
const SHARDS: usize = 16;
/// Slots whose mismatch was logged, at most (then only counted).
const LOGGED_MAX: usize = 4096;

/// One slot's sector checksums.
#[derive(Debug, Clone)]
struct SlotSums {
    /// Sectors with a checksum, one bit each.
    known: Vec<u64>,
    crc: Box<[u32]>,
}

/// The daemon's checksums of its cache stores' sectors.
#[derive(Debug)]
pub struct BlockSums {
    spb: u32,
    shards: Vec<Mutex<HashMap<u32, SlotSums>>>,
    mismatches: AtomicU64,
    logged: Mutex<HashSet<u32>>,
}

/// The checksum of one sector's bytes.
pub fn sector_sum(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

impl BlockSums {
    /// Checksums for a cache of `block_size` blocks (none kept yet).
    pub fn new(block_size: u64) -> BlockSums {
        BlockSums {
            spb: (block_size / SECTOR as u64).max(1) as u32,
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            mismatches: AtomicU64::new(0),
            logged: Mutex::new(HashSet::new()),
        }
    }

    fn shard(&self, slot: u32) -> std::sync::MutexGuard<'_, HashMap<u32, SlotSums>> {
        self.shards[slot as usize % SHARDS].lock().unwrap_or_else(|p| p.into_inner())
    }

    fn empty(&self) -> SlotSums {
        SlotSums { known: vec![0; (self.spb as usize).div_ceil(64)], crc: vec![0; self.spb as usize].into() }
    }

    /// Sectors from `first` of `slot` were written with `data` (whole sectors).
    pub fn wrote(&self, slot: u32, first: u32, data: &[u8]) {
        let mut m = self.shard(slot);
        let s = m.entry(slot).or_insert_with(|| self.empty());
        for (k, chunk) in data.chunks(SECTOR).enumerate() {
            let i = first as usize + k;
            if i < s.crc.len() && chunk.len() == SECTOR {
                s.crc[i] = sector_sum(chunk);
                s.known[i / 64] |= 1 << (i % 64);
            }
        }
    }

    /// Sectors `lo..hi` of `slot` have no checksum (clean bytes, or a failed write).
    pub fn forget(&self, slot: u32, lo: u32, hi: u32) {
        let mut m = self.shard(slot);
        let Some(s) = m.get_mut(&slot) else { return };
        for i in lo as usize..(hi as usize).min(s.crc.len()) {
            s.known[i / 64] &= !(1 << (i % 64));
        }
        if s.known.iter().all(|&w| w == 0) {
            m.remove(&slot);
        }
    }

    /// A committed record: a free slot keeps nothing, a held one only its dirty sectors'.
    /// (Runs before the engine learns the commit is durable: a freed slot is not reused
    /// before then, so nothing newer is forgotten.)
    pub fn prune(&self, r: &SlotRecord) {
        if r.block.is_none() {
            self.shard(r.slot).remove(&r.slot);
            return;
        }
        let mut m = self.shard(r.slot);
        let Some(s) = m.get_mut(&r.slot) else { return };
        for (w, d) in s.known.iter_mut().zip(r.dirty.iter().chain(std::iter::repeat(&0))) {
            *w &= d;
        }
        if s.known.iter().all(|&w| w == 0) {
            m.remove(&r.slot);
        }
    }

    /// The checksums a seal record carries: each dirty sector's, in order; `None` when one
    /// is not known (the record is journaled without: nothing is claimed).
    pub fn of_record(&self, r: &SlotRecord) -> Option<Vec<u32>> {
        let m = self.shard(r.slot);
        let s = m.get(&r.slot)?;
        let mut out = Vec::new();
        for i in 0..self.spb as usize {
            if r.dirty.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1) {
                if s.known[i / 64] >> (i % 64) & 1 == 0 {
                    return None;
                }
                out.push(s.crc[i]);
            }
        }
        Some(out)
    }

    /// A warm start: `slot`'s newest record was a seal with `sums` for its `dirty` sectors.
    pub fn restore(&self, slot: u32, dirty: &[u64], sums: &[u32]) {
        let mut s = self.empty();
        let mut it = sums.iter();
        for i in 0..self.spb as usize {
            if dirty.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1) {
                let Some(&c) = it.next() else { break };
                s.crc[i] = c;
                s.known[i / 64] |= 1 << (i % 64);
            }
        }
        self.shard(slot).insert(slot, s);
    }

    /// Checks `data`, read from sectors `first..` of `slot`; returns the first sector whose
    /// bytes differ from its checksum (counted and logged once per slot).
    pub fn check(&self, slot: u32, first: u32, data: &[u8]) -> Option<u32> {
        let bad = {
            let m = self.shard(slot);
            let s = m.get(&slot)?;
            data.chunks(SECTOR).enumerate().find_map(|(k, chunk)| {
                let i = first as usize + k;
                let known = i < s.crc.len() && s.known[i / 64] >> (i % 64) & 1 == 1;
                (known && chunk.len() == SECTOR && sector_sum(chunk) != s.crc[i]).then_some(i as u32)
            })
        }?;
        self.mismatches.fetch_add(1, Relaxed);
        Some(bad)
    }

    /// Whether this is the first mismatch logged for `slot` (later ones are only counted).
    pub fn first_report(&self, slot: u32) -> bool {
        let mut l = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        l.len() < LOGGED_MAX && l.insert(slot)
    }

    /// Cache reads that failed their checksum since start.
    pub fn mismatches(&self) -> u64 {
        self.mismatches.load(Relaxed)
    }

    /// Slots with checksums kept.
    pub fn slots(&self) -> usize {
        (0..SHARDS).map(|i| self.shards[i].lock().unwrap_or_else(|p| p.into_inner()).len()).sum()
    }
}

/// A seal replayed: (engine VM id, block), its dirty sectors, their checksums.
type Seal = ((u32, u64), Vec<u64>, Vec<u32>);

/// Seal records met while metadata is replayed: the newest record of each slot decides.
#[derive(Debug, Default)]
pub struct Replayed {
    seals: HashMap<u32, Seal>,
}

impl Replayed {
    /// A slot record replayed: `sums` when it is a seal (engine VM id `vm`).
    pub fn slot(&mut self, slot: u32, vm: u32, block: u64, dirty: &[u64], sums: Option<Vec<u32>>) {
        match sums {
            Some(s) => {
                self.seals.insert(slot, ((vm, block), dirty.to_vec(), s));
            }
            None => {
                self.seals.remove(&slot);
            }
        }
    }

    /// A free record replayed.
    pub fn free(&mut self, slot: u32) {
        self.seals.remove(&slot);
    }

    /// After the replay (and whatever the start dropped since): each seal whose slot still
    /// holds its block is sealed in the engine, and its checksums kept. Returns how many.
    pub fn apply(self, engine: &mut cachevisor_engine::Engine, sums: &BlockSums) -> usize {
        let mut n = 0;
        for (slot, ((vm, block), dirty, s)) in self.seals {
            if engine.slot_block(slot) == Some((vm, block)) {
                engine.restore_sealed(slot);
                sums.restore(slot, &dirty, &s);
                n += 1;
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(slot: u32, dirty: u64, sealed: bool) -> SlotRecord {
        SlotRecord { slot, block: Some((0, 1)), valid: vec![0xff], dirty: vec![dirty], sealed, mirror: false }
    }

    #[test]
    fn written_sectors_are_checked_and_a_garbled_one_is_named() {
        let s = BlockSums::new(4096);
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        s.wrote(3, 0, &data);
        assert_eq!(s.check(3, 0, &data), None);
        assert_eq!(s.check(3, 2, &data[1024..2048]), None, "a part, from its sector");
        let mut bad = data.clone();
        bad[5 * 512 + 17] ^= 1;
        assert_eq!(s.check(3, 0, &bad), Some(5));
        assert_eq!(s.check(3, 0, &vec![0; 4096]), Some(0), "zeros where data was written");
        assert_eq!(s.mismatches(), 2);
        assert!(s.first_report(3) && !s.first_report(3));
        assert_eq!(s.check(4, 0, &bad), None, "nothing known of slot 4");
    }

    #[test]
    fn a_seal_carries_the_dirty_sectors_sums_only_when_all_are_known() {
        let s = BlockSums::new(4096);
        let data = vec![9u8; 4096];
        s.wrote(1, 0, &data);
        let sums = s.of_record(&record(1, 0b1010_0001, true)).unwrap();
        assert_eq!(sums, vec![sector_sum(&data[..512]); 3]);
        s.forget(1, 5, 6);
        assert_eq!(s.of_record(&record(1, 0b1010_0001, true)), None, "sector 5 unknown after a failed write");
        // Restored from a seal: the same checks.
        let r = BlockSums::new(4096);
        r.restore(7, &[0b11], &[sector_sum(&data[..512]), sector_sum(&[1u8; 512])]);
        assert_eq!(r.check(7, 0, &data[..1024]), Some(1));
        assert_eq!(r.check(7, 2, &[0u8; 512]), None, "a clean sector is not checked");
    }

    #[test]
    fn commits_prune_clean_sectors_and_freed_slots() {
        let s = BlockSums::new(4096);
        s.wrote(2, 0, &[1u8; 4096]);
        s.prune(&record(2, 0b11, false));
        assert_eq!(s.check(2, 0, &[0u8; 4096]), Some(0));
        assert_eq!(s.check(2, 2, &[0u8; 512]), None, "clean now: forgotten");
        s.prune(&SlotRecord { slot: 2, block: None, valid: vec![0], dirty: vec![0], sealed: false, mirror: false });
        assert_eq!((s.slots(), s.check(2, 0, &[0u8; 512])), (0, None));
    }
}
