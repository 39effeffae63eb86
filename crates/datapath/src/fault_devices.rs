//! The data path's devices wrapped with faults, for tests (`cachevisor_store::faults`):
//! each cache store's device fails its N-th write and delays its reads on command, each
//! backing store delays its reads and pauses its next extent query. A data path started
//! with faults runs every cache op on the device threads (whose devices these are), not
//! on the io_uring thread; one started without them has none of this in its path.

use crate::injected::StoreDevice;
use cachevisor_engine::{Device, Io};
use cachevisor_store::backing::Backing;
use cachevisor_store::faults::Faults;
use std::sync::Arc;

/// A cache store's device that misbehaves as `faults` say.
struct FaultyStore {
    inner: StoreDevice,
    faults: Arc<Faults>,
}

impl Device for FaultyStore {
    fn submit(&self, now_ns: u64, at: u64, io: Io<'_>) -> std::io::Result<u64> {
        match io {
            Io::Read(_) => self.faults.before_read(),
            Io::Write(_) => self.faults.before_cache_write()?,
            Io::Model { .. } => {}
        }
        self.inner.submit(now_ns, at, io)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.inner.sync()
    }
    fn queue_depth(&self) -> u32 {
        self.inner.queue_depth()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// `stores` wrapped with `faults` when given, else as they are.
pub(crate) fn wrap_stores(stores: Vec<StoreDevice>, faults: Option<&Arc<Faults>>) -> Vec<StoreDevice> {
    let Some(f) = faults else { return stores };
    stores.into_iter().map(|inner| Box::new(FaultyStore { inner, faults: f.clone() }) as StoreDevice).collect()
}

/// `backing` wrapped with `faults`.
pub(crate) fn faulty_backing(backing: Arc<Backing>, faults: &Arc<Faults>) -> Arc<Backing> {
    Arc::new(Backing::with_faults(backing, faults.clone()))
}
