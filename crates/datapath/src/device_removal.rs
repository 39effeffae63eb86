//! Taking one of the cache's devices out under running clients (`cachevisor cache
//! remove`, Open-CAS's `casadm --remove-core` for a cache device of several, bcache's
//! device evacuation): every slot of the device is withheld from the cache
//! (`Engine::withhold_moving`): its clean blocks move to free slots on the other devices
//! while there are any, the rest are dropped; its dirty blocks are written back first (in
//! persistent mode the engine writes a dirty block back rather than move it); mirror
//! slots on it let go of their copies (their blocks written back first,
//! `dirty_mirror.rs`). Once nothing of the device is cached or in flight a checkpoint is
//! written that names none of its slots, and its descriptor is closed: the device can be
//! pulled. The vDisks keep running on the other devices throughout.
//!
//! Until the daemon restarts the device keeps its row in the engine's store table, every
//! slot withheld (so nothing is placed there and the allocators' pool is the other
//! devices'); a start without it in the config finds it gone with nothing on it
//! (`cachevisor-server`'s `device_relayout.rs`).
//!
//! Crash model: until the checkpoint, the durable metadata may name blocks on the
//! device, and the device is still whole (nothing was cut); after it, none. A crash at
//! any moment restarts warm on every device still configured.

use super::DataPath;
use cachevisor_engine::StoreId;
use std::sync::atomic::Ordering::SeqCst;

/// Where a device's removal is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RemovalState {
    /// Being emptied.
    Removing,
    /// Out: nothing of it cached, its descriptor closed.
    Removed,
}

/// A device's removal: where it is and what it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceRemoval {
    /// Removing or removed.
    pub state: RemovalState,
    /// Clean blocks moved to the other devices.
    pub moved: u64,
    /// Dirty blocks written back to the backing stores.
    pub written_back: u64,
    /// Blocks it held when the removal began.
    pub blocks: u64,
}

impl DataPath {
    /// Removes cache device `st` (store 1..: the first, `cache.path`, carries the cache's
    /// identity and stays) — see the module doc. `progress(blocks still on it, of them
    /// dirty)` while it empties. On a failure the device is given back (its slots free
    /// again, still in use) and the error says why.
    pub fn remove_cache_device(
        &self,
        st: StoreId,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DeviceRemoval, String> {
        let s = &self.shared;
        let files = s.device_files.read().unwrap_or_else(|p| p.into_inner()).clone();
        let Some((file, _)) = files.get(usize::from(st).wrapping_sub(1)) else {
            return Err(format!("store {st} is not one of the cache's devices after the first"));
        };
        let layout = s.layout();
        let (first, n) = layout.range(st);
        let (first, n) = (first as u32, n as u32);
        let blocks = {
            let mut core = s.lock();
            if let Some(r) = core.device_removals.get(&st) {
                return Err(format!(
                    "it is {} already",
                    if r.state == RemovalState::Removed { "removed" } else { "being removed" }
                ));
            }
            if core.cache != super::CacheState::Attached {
                return Err(format!("the cache is {}", core.cache.as_str()));
            }
            if core.engine.device_failed(st) {
                return Err(
                    "it was dropped after device errors: nothing of it is used (restart without it in the config)"
                        .into(),
                );
            }
            let others = (0..layout.len() as StoreId)
                .filter(|&o| o != st && layout.kind(o).is_local())
                .any(|o| !core.engine.device_failed(o) && !core.device_removals.contains_key(&o));
            if !others {
                return Err("it is the last device in use".into());
            }
            let blocks = core.engine.store_used(st);
            core.device_removals
                .insert(st, DeviceRemoval { state: RemovalState::Removing, moved: 0, written_back: 0, blocks });
            s.unlock(core);
            blocks
        };
        let written = s.written_back.load(SeqCst);
        let emptied =
            self.empty_slots(first, n, true, progress).and_then(|moved| self.checkpoint_now().map(|()| moved));
        let moved = match emptied {
            Ok(moved) => moved,
            Err(e) => {
                let r = self.run_job(|e, _| e.return_slots(first, n));
                if let Err(f) = r {
                    tracing::error!(failure = ?f, "giving a device back after a failed removal");
                }
                s.lock().device_removals.remove(&st);
                return Err(format!("{e}; the device stays in use"));
            }
        };
        *file.write().unwrap_or_else(|p| p.into_inner()) = None;
        s.ring_let_go(); // the io_uring thread's descriptor of it too
        let done = DeviceRemoval {
            state: RemovalState::Removed,
            moved,
            written_back: s.written_back.load(SeqCst) - written,
            blocks,
        };
        s.lock().device_removals.insert(st, done);
        tracing::info!(
            store = st,
            blocks,
            moved,
            written_back = done.written_back,
            "cache device removed: nothing of it is cached, its descriptor is closed"
        );
        Ok(done)
    }

    /// Each device being removed or removed, by store.
    pub fn device_removals(&self) -> Vec<(StoreId, DeviceRemoval)> {
        self.shared.lock().device_removals.iter().map(|(&st, &r)| (st, r)).collect()
    }
}
