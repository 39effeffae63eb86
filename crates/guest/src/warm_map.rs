//! A guest cache's map saved at a clean stop and taken back at the next start: SymFlex
//! §5.3 keeps a persistent vSSD's blocks across its VM's restarts, and the guest must know
//! what they hold to start warm (dm-cache keeps that on its metadata device). Each entry
//! carries a CRC-32 of the block's bytes, checked against the vSSD at the restore: a block
//! the host did not keep (a vSSD without P, a block taken or re-zeroed meanwhile) fails
//! the check and is not trusted. The file is removed when it is read, so a crash after a
//! start never trusts a map older than what the cache did since.

use crate::block_cache::{AppId, Lbn, OriginBlock};
use crate::guest_cache::{BlockDevice, GuestCache};
use serde::{Deserialize, Serialize};
use std::io;
use std::path::Path;

#[derive(Serialize, Deserialize)]
struct SavedMap {
    block_size: u64,
    origin_size: u64,
    /// (lbn, origin block, app, CRC-32 of the block's bytes).
    entries: Vec<(Lbn, OriginBlock, AppId, u32)>,
}

impl<V: BlockDevice, O: BlockDevice> GuestCache<V, O> {
    /// Writes every dirty block back, then saves the map to `path` (written whole, then
    /// renamed over the old one, both synced).
    pub fn save_map(&mut self, path: &Path) -> io::Result<usize> {
        self.flush()?;
        let mut entries = Vec::new();
        let mut buf = vec![0u8; self.block_size() as usize];
        for (lbn, origin, app) in self.cache().cached() {
            if self.vssd_read(lbn, &mut buf).is_ok() {
                entries.push((lbn, origin, app, crc32fast::hash(&buf)));
            }
        }
        let m = SavedMap { block_size: self.block_size(), origin_size: self.origin_size(), entries };
        let tmp = path.with_extension("tmp");
        {
            let f = std::fs::File::create(&tmp)?;
            serde_json::to_writer(&f, &m).map_err(io::Error::other)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(m.entries.len())
    }

    /// Takes back the entries of the map at `path` whose blocks are valid, free and still
    /// hold the bytes saved (how many); removes the file. None saved: 0.
    pub fn restore_map(&mut self, path: &Path) -> io::Result<usize> {
        let text = match std::fs::read(path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        std::fs::remove_file(path)?;
        let m: SavedMap = serde_json::from_slice(&text)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))?;
        if m.block_size != self.block_size() || m.origin_size != self.origin_size() {
            tracing::warn!(path = %path.display(), "a saved cache map of another geometry: starting cold");
            return Ok(0);
        }
        let mut buf = vec![0u8; self.block_size() as usize];
        let mut taken = 0;
        let valid = self.cache().valid_lbns();
        for (lbn, origin, app, crc) in m.entries {
            let ok = valid.binary_search(&lbn).is_ok()
                && self.vssd_read(lbn, &mut buf).is_ok()
                && crc32fast::hash(&buf) == crc;
            if ok && self.adopt(app, lbn, origin) {
                taken += 1;
            }
        }
        Ok(taken)
    }
}
