//! The daemon's devices behind the engine's store table: each row gets a
//! [`cachevisor_engine::Device`] — the cache file for the local store, an [`Unserved`]
//! device for a region another node lends until the daemon has the cluster's NBD client
//! — and a device thread runs a cache op on its store's device, the committer
//! syncs every store's. A new store kind is a row kind in the engine and one `Device`
//! here. (The io_uring thread serves the cache file and the O_DIRECT cache devices:
//! `ring.rs`.)

use cachevisor_engine::{Device, Io, StoreKind, StoreLayout, Unserved};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// A store's device in the daemon (device threads share it).
pub(super) use crate::injected::StoreDevice;

thread_local! {
    /// Each thread's aligned buffer for an O_DIRECT cache file.
    static BOUNCE: std::cell::RefCell<cachevisor_files::aligned_buf::AlignedBuf> = Default::default();
}

/// The cache file as the data path holds it: `None` while the cache is detached
/// (`cache_swap.rs`), when no descriptor of it stays open.
pub(super) type CacheSlot = Arc<std::sync::RwLock<Option<Arc<File>>>>;

/// The cache file in `slot`, or the error an op on a detached cache gets (none should
/// come: every slot is withheld first).
pub(super) fn cache_file(slot: &CacheSlot) -> std::io::Result<Arc<File>> {
    slot.read().unwrap_or_else(|p| p.into_inner()).clone().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotConnected, "the cache store is not open: the cache is detached (cachevisor cache attach), or this device was missing at start")
    })
}

/// The local store: the cache file, O_DIRECT through aligned buffers when it was
/// opened so.
pub(super) struct CacheFile {
    file: CacheSlot,
    direct: bool,
    size: u64,
}

impl Device for CacheFile {
    fn submit(&self, now_ns: u64, at: u64, io: Io<'_>) -> std::io::Result<u64> {
        let file = cache_file(&self.file)?;
        let at = at + cachevisor_store::cache_label::DATA_OFFSET; // after the label
        match io {
            Io::Read(buf) if self.direct => {
                BOUNCE.with(|b| cachevisor_files::aligned_buf::read_at(&file, &mut b.borrow_mut(), buf, at))
            }
            Io::Read(buf) => file.read_exact_at(buf, at),
            Io::Write(data) if self.direct => {
                BOUNCE.with(|b| cachevisor_files::aligned_buf::write_at(&file, &mut b.borrow_mut(), data, at))
            }
            Io::Write(data) => file.write_all_at(data, at),
            Io::Model { .. } => {
                Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "a model's op (no data) on the cache file"))
            }
        }?;
        Ok(now_ns)
    }

    fn sync(&self) -> std::io::Result<()> {
        match &*self.file.read().unwrap_or_else(|p| p.into_inner()) {
            Some(f) => f.sync_data(),
            None => Ok(()), // detached: nothing of it is cached
        }
    }

    fn queue_depth(&self) -> u32 {
        1
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn describe(&self) -> String {
        format!("the cache file{}", if self.direct { " (O_DIRECT)" } else { "" })
    }
}

/// A cache device's file in `file` as a store's device (`size` bytes after its label;
/// O_DIRECT through aligned buffers when `direct`): a device added online.
pub(super) fn cache_file_device(file: CacheSlot, direct: bool, size: u64) -> StoreDevice {
    Box::new(CacheFile { file, direct, size })
}

impl super::Shared {
    /// Whether `op` runs on a cache device of this host the io_uring thread serves (the
    /// cache file, and every O_DIRECT `[[cache.device]]` once it has a descriptor of it:
    /// `ring.rs`): the ring's ops when it runs, and a client thread's own with `ssd_only`
    /// (a replicated vDisk's client write too: its record goes to the log beside it, and
    /// its completion waits there, `logged_writes.rs`). Every other store's go to the
    /// device threads.
    #[inline]
    pub(super) fn local_only(&self, op: &cachevisor_engine::DeviceOp) -> bool {
        match op.loc {
            cachevisor_engine::Location::Cache(st) => {
                st < 64 && self.ring_mask.load(std::sync::atomic::Ordering::Relaxed) & (1 << st) != 0
            }
            _ => false,
        }
    }

    /// Whether `op` is a client write whose records go to the replica log.
    pub(super) fn replicated(&self, op: &cachevisor_engine::DeviceOp) -> bool {
        op.client && op.kind.is_write() && self.replicator.get().is_some_and(|r| r.covers(op.vm))
    }
}

/// One device per row of `layout` (blocks of `block` bytes): `ssd` (the cache file's
/// slot, with whether it is O_DIRECT) for the local store, `devices[i - 1]` likewise for
/// cache device `i`, for a lent one the device `peers` opens (the cluster's: a peer's
/// region over NBD), else one that refuses every op.
pub(super) fn store_devices(
    layout: &StoreLayout,
    block: u64,
    (ssd, direct): (&CacheSlot, bool),
    devices: &[(CacheSlot, bool)],
    peers: Option<&Arc<dyn crate::injected::RemoteStores>>,
) -> Vec<StoreDevice> {
    (0..layout.len())
        .map(|i| {
            let id = i as cachevisor_engine::StoreId;
            let size = layout.range(id).1 * block;
            match layout.kind(id) {
                StoreKind::Local => Box::new(CacheFile { file: ssd.clone(), direct, size }) as StoreDevice,
                StoreKind::Device { index } => match devices.get(index as usize - 1) {
                    Some((file, direct)) => {
                        Box::new(CacheFile { file: file.clone(), direct: *direct, size }) as StoreDevice
                    }
                    None => Box::new(Unserved { what: format!("cache device {index} (no file for it)"), size }),
                },
                StoreKind::Lent { node } => peers.and_then(|p| p.device(node, size)).unwrap_or_else(|| {
                    Box::new(Unserved { what: format!("a cache region node {node} lends (no such peer)"), size })
                }),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachevisor_engine::{EngineConfig, StoreSpec};

    #[test]
    fn the_local_row_is_the_cache_file_and_a_lent_row_refuses_naming_its_lender() {
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("c"))
            .unwrap();
        f.set_len(48 * 4096).unwrap();
        let cfg = EngineConfig { stores: vec![StoreSpec::lent(3, 16)], ..EngineConfig::with_slots(32) };
        let f = Arc::new(f);
        let slot: CacheSlot = Arc::new(std::sync::RwLock::new(Some(f.clone())));
        let devs = store_devices(&StoreLayout::new(&cfg), 4096, (&slot, false), &[], None);
        assert_eq!((devs.len(), devs[0].size(), devs[1].size()), (2, 32 * 4096, 16 * 4096));
        assert_eq!(devs[0].submit(7, 8192, Io::Write(&[5u8; 4096])).unwrap(), 7);
        let mut back = [0u8; 4096];
        devs[0].submit(8, 8192, Io::Read(&mut back)).unwrap();
        assert_eq!(back, [5u8; 4096]);
        devs[0].sync().unwrap();
        assert!(devs[0].submit(0, 0, Io::Model { write: false, len: 4096 }).is_err());
        let e = devs[1].submit(0, 0, Io::Write(&[1u8; 4096])).unwrap_err();
        assert!(e.to_string().contains("node 3"), "{e}");
        // Nothing of the refused write reached the cache file; the write landed after the
        // label's 4 KiB.
        let mut all = vec![0u8; 48 * 4096];
        f.read_exact_at(&mut all, 0).unwrap();
        assert!(all.iter().enumerate().all(|(i, &b)| b == if (12288..16384).contains(&i) { 5 } else { 0 }));
        // Detached: an op is refused naming it, a sync has nothing to do.
        *slot.write().unwrap() = None;
        let e = devs[0].submit(0, 0, Io::Read(&mut back)).unwrap_err();
        assert!(e.to_string().contains("detached"), "{e}");
        devs[0].sync().unwrap();
    }
}
