//! Taking one of the cache's devices out under a running daemon (day-2 operations:
//! `cachevisor cache remove PATH`, `POST /cache/devices/remove`). The data path empties
//! the device and closes it (the data path's `device_removal.rs`); here the daemon finds
//! the device by its path, refuses what it cannot do (the first device, `cache.path`,
//! carries the cache's identity; a cache of one device is detached instead), lets go of
//! its owner lock once it is out, and notes the removal in the metadata directory's
//! overlay (`vdisk_overlay.rs`), so a restart leaves the device out until the
//! configuration file no longer lists it.

use super::{Daemon, OpError};
use crate::own_files::same_path;
use cachevisor_datapath::DeviceRemoval;
use std::path::Path;

impl Daemon {
    /// The store of the cache device at `path`, refused (naming the devices) when it is
    /// none of them or the first.
    fn device_store(&self, path: &Path) -> Result<u16, OpError> {
        if !self.several_cache_devices() {
            return Err(OpError::Invalid(
                "the cache has one device: `cachevisor cache detach` takes it out (every vDisk passes through)".into(),
            ));
        }
        let devices = self.cache_device_paths();
        let Some(st) = devices.iter().position(|p| same_path(p, path)) else {
            let list: Vec<String> = devices.iter().map(|p| p.display().to_string()).collect();
            return Err(OpError::Invalid(format!(
                "{} is not one of the cache's devices ({})",
                path.display(),
                list.join(", ")
            )));
        };
        if st == 0 {
            return Err(OpError::Invalid(format!(
                "{} is cache.path, the device that carries the cache's identity (the other devices' labels derive from it): it stays; remove another, or stop the daemon to replace it",
                path.display()
            )));
        }
        Ok(st as u16)
    }

    /// Removes the cache device at `path` (see the module doc): `progress(blocks still on
    /// it, of them dirty)` while it empties.
    pub fn remove_cache_device(
        &self,
        path: &Path,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DeviceRemoval, OpError> {
        let st = self.device_store(path)?;
        let path = self.cache_device_paths()[st as usize].clone();
        let done = self
            .dp
            .remove_cache_device(st, progress)
            .map_err(|e| OpError::Invalid(format!("{}: {e}", path.display())))?;
        if let Some(o) = self.owner.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            o.release_device(&path);
        }
        // The allocator divides the smaller cache now (its pool left out the device's
        // slots as they were withheld).
        self.redivide();
        // Out now; kept out at the next start (a failure to note it only means the start
        // takes the device back, empty).
        let mut overlay = self.overlay.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = overlay.change(&self.meta_dir, |o| o.remove_device(&path)) {
            tracing::error!(device = %path.display(), error = %e, "the removal could not be noted for the next start: take the device out of the configuration file");
        }
        Ok(done)
    }

    /// A reloaded file no longer lists the cache device at `path`: removed online, unless
    /// it is out already (removed before, or left out at start); what was done, for the
    /// reload's report. The overlay's note of an earlier removal is forgotten (the file
    /// says it now).
    pub(crate) fn remove_file_device(&self, path: &Path) -> Result<Option<String>, String> {
        let forget = |d: &Daemon| {
            let mut overlay = d.overlay.lock().unwrap_or_else(|e| e.into_inner());
            let path = path.to_path_buf();
            overlay.change(&d.meta_dir, move |o| o.removed_devices.retain(|p| !same_path(p, &path)))
        };
        let st = self.cache_device_paths().iter().position(|p| same_path(p, path));
        let out = st.is_none_or(|st| self.dp.device_removals().iter().any(|(s, _)| usize::from(*s) == st));
        if out {
            forget(self)?;
            return Ok(None);
        }
        let mut logged = std::time::Instant::now();
        let done = self
            .remove_cache_device(path, &mut |cached, dirty| {
                if logged.elapsed() > std::time::Duration::from_secs(5) {
                    tracing::info!(device = %path.display(), cached, dirty, "reload: removing a cache device: emptying it");
                    logged = std::time::Instant::now();
                }
            })
            .map_err(|e| format!("cache.device {} removed: {e}", path.display()))?;
        forget(self)?;
        Ok(Some(format!(
            "cache.device {} removed: {} blocks moved to the other devices, {} written back",
            path.display(),
            done.moved,
            done.written_back
        )))
    }

    /// Whether the cache device at `path` can be removed now (the API checks before it
    /// starts the removal in the background).
    pub fn check_device_removal(&self, path: &Path) -> Result<(), OpError> {
        self.device_store(path).map(|_| ())
    }
}
