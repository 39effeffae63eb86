//! A cache device added under a running daemon (day-2 operations: `cachevisor cache add
//! PATH --size SIZE`, `POST /cache/devices/add`, or a reload of a file that lists one
//! more `[[cache.device]]`). The data path makes it one more store of the engine's table
//! (the data path's `device_addition.rs`); here the daemon refuses what it cannot do
//! (vSSDs and a cluster's lent regions are laid out after the devices; a detached cache),
//! locks and sizes the device as a start does (created when missing, mode 0600), turns
//! mirrored dirty data on when it is the default (`cache.mirror_dirty` unset: on with two
//! or more devices), lets the allocator divide the larger cache, and notes the device in
//! the metadata directory's overlay (`vdisk_overlay.rs`) so a restart keeps it until the
//! configuration file lists it.

use super::{Daemon, OpError};
use crate::own_files::same_path;
use std::path::Path;

impl Daemon {
    /// Adds the cache device at `path`, `size` of it used (see the module doc); returns
    /// what it did.
    pub fn add_cache_device(&self, path: &Path, size: &str) -> Result<String, OpError> {
        let cache = self.file_config.lock().unwrap_or_else(|e| e.into_inner()).cache.clone();
        self.add_device_as(path, size, &cache)
    }

    /// [`Self::add_cache_device`] under the cache settings `cache` (a reload's new file:
    /// the caller holds the configuration's lock).
    fn add_device_as(&self, path: &Path, size: &str, cache: &crate::config::CacheConfig) -> Result<String, OpError> {
        let invalid = |e: String| OpError::Invalid(format!("{}: {e}", path.display()));
        if self.vssd.is_some() {
            return Err(invalid("the vSSD region ([vssd]) is laid out after the cache's devices: restart with the device in the configuration".into()));
        }
        if self.peer_links.is_some() || self.cluster().is_some() {
            return Err(invalid("a cluster node's cache ([cluster]) is laid out with its peers' regions after its devices: restart with the device in the configuration".into()));
        }
        self.cache_must_be_in("adding a cache device").map_err(OpError::Invalid)?;
        let bytes = cachevisor_trace::units::parse_size(size).map_err(|e| invalid(format!("size: {e}")))?;
        let bs = self.block_size;
        if bytes == 0 || !bytes.is_multiple_of(bs) {
            return Err(invalid(format!("size: {bytes} bytes is not a positive multiple of the block size ({bs})")));
        }
        let slots = bytes / bs;
        // Slot ids are 32-bit over every device: checked before anything is created.
        let total = self.dp.with_engine(|e| e.slot_count());
        if slots > u64::from(u32::MAX) - total.min(u64::from(u32::MAX)) {
            return Err(invalid(format!(
                "size: {} blocks past the cache's {total} would pass the {} slot ids a cache has",
                slots,
                u32::MAX
            )));
        }
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let devices = self.cache_device_paths();
        if devices.iter().any(|p| same_path(p, &path)) {
            return Err(invalid("it is one of the cache's devices already".into()));
        }
        let key = format!("cache.device[{}].path", devices.len() - 1);
        {
            let mut owner = self.owner.lock().unwrap_or_else(|e| e.into_inner());
            let o = owner.as_mut().ok_or_else(|| OpError::Other("the daemon is stopping".into()))?;
            o.lock_device(&path, &key, &self.meta_dir).map_err(OpError::Invalid)?;
        }
        let release = || {
            if let Some(o) = self.owner.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                o.release_device(&path);
            }
        };
        let opened = cachevisor_store::backing::open_cache_store(
            &path,
            cachevisor_store::cache_label::DATA_OFFSET + slots * bs,
            cache.direct,
        );
        let (file, direct) = match opened {
            Ok(f) => f,
            Err(e) => {
                release();
                return Err(invalid(e.to_string()));
            }
        };
        // Noted for the next start before any block can land on it: a crash after that
        // restarts with the device (a crash before the add's checkpoint: as a new one).
        let mut overlay = self.overlay.lock().unwrap_or_else(|e| e.into_inner());
        let noted = crate::config::CacheDevice { path: path.clone(), size: size.to_string() };
        if let Err(e) = overlay.change(&self.meta_dir, |o| o.add_device(noted)) {
            release();
            return Err(OpError::Unsaved(e));
        }
        if let Err(e) = self.dp.add_cache_device(file, direct, slots) {
            release();
            if let Err(u) = overlay.change(&self.meta_dir, |o| o.added_devices.retain(|d| !same_path(&d.path, &path))) {
                tracing::error!(device = %path.display(), error = %u, "a failed add stays noted for the next start (which takes the device as a new one)");
            }
            return Err(invalid(e));
        }
        drop(overlay);
        self.cache_devices.lock().unwrap_or_else(|e| e.into_inner()).push(path.clone());
        let mirrored = cache.mirror_dirty.is_none()
            && self.dp.with_engine_mut(|e| !e.mirror_dirty() && e.set_mirror_dirty(true).is_ok());
        self.redivide();
        Ok(format!(
            "cache device {} added: {} blocks ({}){}",
            path.display(),
            slots,
            cachevisor_trace::units::format_size(bytes),
            if mirrored { "; dirty data is mirrored over two devices from now on" } else { "" }
        ))
    }
}

impl Daemon {
    /// A reloaded file lists cache device `d` anew: added online, unless it runs already
    /// (added with `cache add`: the file owns it now, the overlay's note is forgotten);
    /// what was done, for the reload's report.
    pub(crate) fn add_file_device(
        &self,
        d: &crate::config::CacheDevice,
        cache: &crate::config::CacheConfig,
    ) -> Result<Option<String>, String> {
        let running = self.cache_device_paths().iter().any(|p| same_path(p, &d.path));
        if !running {
            self.add_device_as(&d.path, &d.size, cache)
                .map_err(|e| format!("cache.device {} added: {e}", d.path.display()))?;
        }
        let path = d.path.clone();
        let mut overlay = self.overlay.lock().unwrap_or_else(|e| e.into_inner());
        overlay.change(&self.meta_dir, move |o| o.added_devices.retain(|a| !same_path(&a.path, &path)))?;
        Ok((!running).then(|| format!("cache.device {} ({}) added", d.path.display(), d.size)))
    }
}
