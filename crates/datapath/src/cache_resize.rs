//! Growing and shrinking the cache file under running clients (day-2
//! operations; lvmcache resizes a cache pool only offline). The engine and the metadata
//! are laid out for `cache.max_size` from the start (slot ids, offsets); the slots past
//! the cache's size are withheld from the engine (`withheld.rs`: never taken for a block,
//! never restored from a journal), and the engine's per-slot tables hold only the slots
//! in use (`growable.rs`: a slot past them is withheld and empty, held in no table). A
//! grow extends the file (preallocated, as at start) and then gives the engine the new
//! slots (its tables grow); a shrink withholds the tail slots — their clean blocks moved
//! into free slots before the new end while there are any (`Engine::withhold_moving`),
//! the dirty ones written back, the rest dropped, through the engine's write-back, move
//! and durability rules — writes a checkpoint naming none of them, and only then cuts
//! the file and the engine's tables.
//!
//! Crash model: a block is cached in a tail slot only after the file covers it (grow:
//! file first), and the file is cut only after no durable record names a slot there
//! (shrink: checkpoint first). A start finishes a shrink a crash interrupted: the file is
//! opened long enough for every slot the metadata names and the tail emptied the same
//! way (`Daemon::start`).

use super::store_devices::cache_file;
use super::DataPath;
use std::sync::atomic::Ordering::SeqCst;

impl DataPath {
    /// Slots of the local store in use (the cache's size in blocks); the ones after it,
    /// up to the store's end, are withheld.
    pub fn cache_slots(&self) -> u32 {
        self.shared.local_slots.load(SeqCst)
    }

    /// Slots the local store is laid out for (`cache.max_size` in blocks).
    pub fn max_cache_slots(&self) -> u32 {
        self.shared.layout().range(cachevisor_engine::LOCAL).1 as u32
    }

    /// Shrinks the cache to `to` slots (see the module doc): the tail's clean blocks move
    /// into free slots before it while there are any, the rest is written back if dirty
    /// and dropped; `progress(cached, dirty)` while the tail empties. Returns the blocks
    /// moved. On a failure the tail is given back and the size stays.
    pub fn shrink_cache(&self, to: u32, progress: &mut dyn FnMut(u64, u64)) -> Result<u64, String> {
        let from = self.cache_slots();
        if to >= from {
            return Err(format!("{to} slots is not less than the {from} in use"));
        }
        self.shared.local_slots.store(to, SeqCst);
        let done =
            self.empty_slots(to, from - to, true, progress).and_then(|moved| self.checkpoint_now().map(|()| moved));
        let moved = match done {
            Ok(m) => m,
            Err(e) => {
                self.with_engine_mut(|e| e.return_slots(to, from - to));
                self.shared.local_slots.store(from, SeqCst);
                return Err(format!("{e}; the cache keeps its size"));
            }
        };
        self.cut_file(u64::from(to));
        // The engine's tables past the new end go too (its `growable.rs`): a cache grown
        // and shrunk back holds no memory for the slots it no longer has.
        self.with_engine_mut(|e| e.cut_withheld_tail(to));
        tracing::info!(from, to, moved, "cache shrunk");
        Ok(moved)
    }

    /// Grows the cache to `to` slots (at most [`Self::max_cache_slots`]): the file first,
    /// then the slots.
    pub fn grow_cache(&self, to: u32) -> Result<(), String> {
        let from = self.cache_slots();
        if to <= from || to > self.max_cache_slots() {
            return Err(format!(
                "{to} slots is not between the {from} in use and the {} laid out",
                self.max_cache_slots()
            ));
        }
        let bytes = cachevisor_store::cache_label::DATA_OFFSET + u64::from(to) * self.shared.bs;
        let f = cache_file(&self.shared.ssd).map_err(|e| e.to_string())?;
        cachevisor_store::backing::extend_cache_store(&f, bytes).map_err(|e| format!("the cache file: {e}"))?;
        self.with_engine_mut(|e| e.return_slots(from, to - from));
        self.shared.local_slots.store(to, SeqCst);
        tracing::info!(from, to, "cache grown");
        Ok(())
    }

    /// Cuts a regular cache file to `slots` blocks (a block device keeps its size).
    fn cut_file(&self, slots: u64) {
        let Ok(f) = cache_file(&self.shared.ssd) else { return };
        let regular = f.metadata().is_ok_and(|m| m.file_type().is_file());
        if regular {
            if let Err(e) = f.set_len(cachevisor_store::cache_label::DATA_OFFSET + slots * self.shared.bs) {
                tracing::warn!(%e, "the cache file keeps its old length (its tail is no longer used)");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::tests::{block_at as pattern, open_wb};
    use crate::DataPath;
    use rand::{Rng, SeedableRng};
    use std::collections::HashMap;

    const BS: u64 = 4096;

    /// Versioned writes and reads of 96 blocks through a cache whose size moves between
    /// 8 and 64 slots (of 64 laid out) every few requests: every read returns the last
    /// version written, the cache never holds a block past its size, the file is as long
    /// as the size after each resize; after a flush and a crash-like stop, a restart
    /// reads every last version back.
    #[test]
    fn resizing_under_writes_keeps_every_write_and_nothing_past_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let open = || open_wb(dir.path(), 64, 1, true);
        let dp = open();
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut last: HashMap<u64, u64> = HashMap::new();
        let file_len = || std::fs::metadata(dir.path().join("cache.img")).unwrap().len();
        for i in 1..=1500u64 {
            let b = rng.gen_range(0..96u64);
            if rng.gen_bool(0.6) {
                dp.write(0, b * BS, &pattern(0, b, i), false).unwrap();
                last.insert(b, i);
            } else {
                let mut buf = vec![0u8; BS as usize];
                dp.read(0, b * BS, &mut buf).unwrap();
                let want = last.get(&b).map_or(vec![0u8; BS as usize], |&v| pattern(0, b, v));
                assert!(buf == want, "step {i}: block {b} is not its last write");
            }
            if i % 50 == 0 {
                let to = rng.gen_range(8..=64u32);
                let from = dp.cache_slots();
                match to.cmp(&from) {
                    std::cmp::Ordering::Less => {
                        dp.shrink_cache(to, &mut |_, _| {}).unwrap();
                    }
                    std::cmp::Ordering::Greater => dp.grow_cache(to).unwrap(),
                    std::cmp::Ordering::Equal => {}
                }
                assert_eq!(dp.cache_slots(), to);
                let want = cachevisor_store::cache_label::DATA_OFFSET + u64::from(to) * BS;
                assert_eq!(file_len(), want, "step {i}: the file follows the size (after the label)");
                dp.with_engine(|e| {
                    assert!((to..64).all(|s| e.slot_block(s).is_none()), "step {i}: a block past the end");
                    e.check_invariants()
                })
                .unwrap();
            }
        }
        let e = dp.grow_cache(65).unwrap_err();
        assert!(e.contains("65"), "{e}");
        dp.flush(0).unwrap();
        dp.halt();
        drop(dp);
        let dp = open();
        for (b, v) in last {
            let mut buf = vec![0u8; BS as usize];
            dp.read(0, b * BS, &mut buf).unwrap();
            assert!(buf == pattern(0, b, v), "after the restart: block {b}");
        }
    }

    /// A shrink keeps what fits: clean blocks past the new end move into the free slots
    /// before it (dirty ones never move in persistent mode: they are written back and
    /// dropped), and every block reads back its bytes.
    #[test]
    fn a_shrink_moves_clean_blocks_into_free_slots() {
        let dir = tempfile::tempdir().unwrap();
        let dp = open_wb(dir.path(), 64, 1, true);
        for b in 0..64u64 {
            dp.write(0, b * BS, &pattern(0, b, 1), false).unwrap();
        }
        dp.flush(0).unwrap();
        dp.destage(Some(0), &mut |_, _| {}).unwrap(); // clean, still cached
        let in_tail =
            |dp: &DataPath| dp.with_engine(|e| (0..64).filter(|&b| e.lookup(0, b).is_some_and(|s| s >= 48)).count());
        assert_eq!(in_tail(&dp), 16, "a full cache: 16 blocks in slots 48..64");
        // Free 16 slots before 48 (discarded blocks leave the cache) and make it durable.
        let head: Vec<u64> = dp.with_engine(|e| (0..64).filter(|&b| e.lookup(0, b).is_some_and(|s| s < 16)).collect());
        for &b in &head {
            dp.discard(0, b * BS, BS as u32).unwrap();
        }
        dp.checkpoint_now().unwrap();
        let moved = dp.shrink_cache(48, &mut |_, _| {}).unwrap();
        assert_eq!(moved, 16, "every clean block past the end found a free slot");
        dp.with_engine(|e| {
            let kept = (0..64u64).filter(|&b| !head.contains(&b)).filter(|&b| e.lookup(0, b).is_some()).count();
            assert_eq!(kept, 48, "every block not discarded is still cached");
            e.check_invariants()
        })
        .unwrap();
        for b in (0..64u64).filter(|b| !head.contains(b)) {
            let mut buf = vec![0u8; BS as usize];
            dp.read(0, b * BS, &mut buf).unwrap();
            assert!(buf == pattern(0, b, 1), "block {b} after its move");
        }
    }
}
