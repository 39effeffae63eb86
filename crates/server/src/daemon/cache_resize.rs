//! Growing and shrinking the cache online (day-2 operations): a reload whose
//! `cache.size` changed, within `cache.max_size`, resizes the running cache
//! (the data path's `cache_resize.rs`: grow = the file extended, then the new slots given to
//! the engine; shrink = the tail's dirty blocks written back and every block there
//! dropped, a checkpoint, then the file cut). The configuration file stays the truth: a
//! restart runs at the size it says (and finishes a shrink a crash interrupted).

use super::Daemon;
use cachevisor_datapath::CacheState;

impl Daemon {
    /// Whether the cache can be resized to `bytes` now; the refusal names the key.
    pub(crate) fn check_cache_resize(&self, bytes: u64) -> Result<u32, String> {
        let bs = self.block_size;
        if !bytes.is_multiple_of(bs) {
            return Err(format!("cache.size: {bytes} bytes is not a multiple of block_size ({bs})"));
        }
        let slots = bytes / bs;
        let max = u64::from(self.dp.max_cache_slots());
        if slots > max {
            return Err(format!(
                "cache.size: {bytes} bytes is more than cache.max_size ({} bytes), what the cache was laid out for at start: raise cache.max_size and restart",
                max * bs
            ));
        }
        if self.several_cache_devices() {
            return Err("cache.size: a cache over several devices ([[cache.device]]) is resized by a restart".into());
        }
        if self.vssd.is_some() {
            return Err("cache.size: the vSSD region ([vssd]) is laid out after the cache's blocks".into());
        }
        if self.peer_links.is_some() || self.cluster().is_some() {
            return Err("cache.size: a cluster node's cache ([cluster]) is laid out with its peers' regions: restart it to resize".into());
        }
        if self.dp.cache_state() != CacheState::Attached {
            return Err(format!("cache.size: the cache is {}: attach it first", self.dp.cache_state().as_str()));
        }
        Ok(slots as u32)
    }

    /// Resizes the cache to `bytes` (checked by [`Self::check_cache_resize`]); returns
    /// what it did.
    pub(crate) fn resize_cache(&self, bytes: u64) -> Result<String, String> {
        // One at a time with a detach or attach (and vDisk changes).
        let _swap = self.carried.lock().unwrap_or_else(|e| e.into_inner());
        let to = self.check_cache_resize(bytes)?;
        let from = self.dp.cache_slots();
        let bs = self.block_size;
        // Exact sizes (`16.50 MiB`, not a whole MiB rounded down).
        let mib = |slots: u32| cachevisor_trace::units::format_size(u64::from(slots) * bs);
        match to.cmp(&from) {
            std::cmp::Ordering::Equal => Ok(format!("cache.size: {} already", mib(to))),
            std::cmp::Ordering::Greater => {
                self.dp.grow_cache(to)?;
                // The allocator re-divides the larger cache now, whether or not it runs
                // every interval (a static division made for the old size would leave
                // the new slots unused).
                self.redivide();
                Ok(format!("cache.size: grown from {} to {}", mib(from), mib(to)))
            }
            std::cmp::Ordering::Less => {
                let tail = self.dp.with_engine(|e| e.withhold_cost(to, from - to));
                let moved = self.dp.shrink_cache(to, &mut |_, _| {})?;
                self.redivide();
                Ok(format!(
                    "cache.size: shrunk from {} to {} (of {} blocks cached past the new end, {moved} moved into free slots, the rest dropped, {} dirty ones written back first)",
                    mib(from),
                    mib(to),
                    tail.cached,
                    tail.dirty
                ))
            }
        }
    }
}
