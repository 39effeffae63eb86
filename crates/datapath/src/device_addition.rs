//! A cache device added under running clients (`cachevisor cache add`): the engine gets
//! one more device row at the end of its store table with every new slot withheld
//! (`Engine::add_device`: no slot id moves), the data path a device and a layout for it;
//! the device gets its label (the cache's identity folded with a new serial,
//! `cache_label::Label::device_id`); a checkpoint names the new device list and slot
//! count — before any journal record can name a new slot — and only then are the slots
//! given to the cache (`Engine::return_slots`). From then on the allocators see the
//! larger pool and new blocks may land on the device (`device_placement.rs`).
//!
//! Crash model: before the checkpoint, the durable metadata knows nothing of the device
//! (a restart with it in the configuration takes it as a new, empty device); after it,
//! the device and its label are recorded, and no block was placed there before. A
//! failure after the engine took the row leaves the row withheld (marked removed):
//! nothing is placed there until a restart.

use super::device_removal::{DeviceRemoval, RemovalState};
use super::DataPath;
use cachevisor_engine::StoreId;
use cachevisor_store::cache_label::Label;
use cachevisor_store::journal::DeviceRow;
use std::fs::File;
use std::sync::{Arc, RwLock};

impl DataPath {
    /// Adds `file` (opened O_DIRECT when `direct`; sized for its label and `slots` blocks)
    /// as a cache device of `slots` blocks (see the module doc); returns its store.
    pub fn add_cache_device(&self, file: File, direct: bool, slots: u64) -> Result<StoreId, String> {
        let s = &self.shared;
        if s.lock().cache != super::CacheState::Attached {
            return Err(format!("the cache is {}", s.lock().cache.as_str()));
        }
        // The new device's label: the cache's identity with the next serial.
        let (label, rows) = {
            let persist = s.persist.lock().unwrap_or_else(|p| p.into_inner());
            let Some(expected) = persist.label() else {
                return Err("the cache's metadata names no label (written by an earlier cachevisor): restart with the device in the configuration".into());
            };
            let mut rows = persist.devices().to_vec();
            if rows.is_empty() {
                rows = DeviceRow::in_order(&[s.layout().range(cachevisor_engine::LOCAL).1]);
            }
            let used: Vec<u16> = rows.iter().map(|r| r.serial).collect();
            let serial = DeviceRow::next_serial(&used).ok_or("every device serial is taken")?;
            rows.push(DeviceRow { serial, slots });
            let id = Label::device_id(&expected.id, serial);
            (Label { id, generation: expected.generation, block_size: s.bs }, rows)
        };
        cachevisor_store::cache_label::write(&file, &label).map_err(|e| format!("writing its label: {e}"))?;
        let file: super::store_devices::CacheSlot = Arc::new(RwLock::new(Some(Arc::new(file))));
        // The engine's row, withheld, and the data path's device and layout for it (under
        // the engine's lock: no op can reach the new slots before they are returned).
        let (st, first) = {
            let mut core = s.lock();
            let (st, first) = core.engine.add_device(slots)?;
            let layout = Arc::new(core.engine.layout().clone());
            let size = slots * s.bs;
            let device = super::store_devices::cache_file_device(file.clone(), direct, size);
            s.stores.write().unwrap_or_else(|p| p.into_inner()).push(Arc::new(device));
            s.device_files.write().unwrap_or_else(|p| p.into_inner()).push((file.clone(), direct));
            s.ring_gen[0].fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            s.exec.ring_notify().notify_one(); // the ring opens it
            *s.layout.write().unwrap_or_else(|p| p.into_inner()) = layout;
            s.unlock(core);
            (st, first)
        };
        let total = s.layout().total();
        {
            let mut persist = s.persist.lock().unwrap_or_else(|p| p.into_inner());
            persist.set_slots(total);
            persist.set_devices(&rows);
        }
        let given = self.checkpoint_now().and_then(|()| {
            self.run_job(|e, _| e.return_slots(first, slots as u32)).map(drop).map_err(|f| format!("{f:?}"))
        });
        if let Err(e) = given {
            // The row stays withheld; its descriptor closes.
            *file.write().unwrap_or_else(|p| p.into_inner()) = None;
            let gone = DeviceRemoval { state: RemovalState::Removed, moved: 0, written_back: 0, blocks: 0 };
            s.lock().device_removals.insert(st, gone);
            return Err(format!("{e}; the device is not used (restart to try again)"));
        }
        tracing::info!(
            store = st,
            slots,
            serial = rows.last().map_or(0, |r| r.serial),
            "cache device added: new blocks may land on it"
        );
        Ok(st)
    }
}
