//! A vDisk on the data path as the protocol's backend (`cachevisor_nbd::backend`): what
//! NBD transmission and vhost-user-blk serve a vDisk export from.

use crate::{client_error, DataPath};
use cachevisor_nbd::backend::{ClientError, Cmd, Done, ExportBackend};
use cachevisor_trace::VmId;
use std::io;
use std::sync::Arc;

/// A vDisk: the cache's data path.
pub struct VdiskExport {
    /// The data path.
    pub dp: Arc<DataPath>,
    /// The vDisk.
    pub vm: VmId,
    /// A request that fails with EIO is tried again (4 times): on a node that borrows cache
    /// from peers, a lost peer fails the ops on its region, the engine's repair drops
    /// those (clean) blocks, and the retry reads the backing store; with several cache
    /// devices, a device failing (or returning bytes that fail their checksums) has its
    /// clean blocks dropped and its mirrored dirty blocks moved to their copies, and the
    /// retry reads those.
    pub retry_io: bool,
}

/// `cmd` on `vm` (a FUA write when `sync`), tried again `left` times after an EIO.
#[allow(clippy::too_many_arguments)]
fn submit_retrying(dp: Arc<DataPath>, vm: VmId, offset: u64, cmd: Cmd, sync: bool, here: bool, done: Done, left: u32) {
    let again = (left > 0).then(|| cmd.clone());
    let dp2 = dp.clone();
    dp.submit_with(
        vm,
        offset,
        cmd,
        sync,
        here,
        Box::new(move |r| match (r, again) {
            (Err(e @ (ClientError::Io | ClientError::Corrupt)), Some(cmd)) => {
                tracing::info!(
                    vdisk = vm,
                    offset,
                    corrupt = e == ClientError::Corrupt,
                    "request failed with EIO: trying again"
                );
                submit_retrying(dp2, vm, offset, cmd, sync, false, done, left - 1)
            }
            (r, _) => done(r),
        }),
    );
}

impl VdiskExport {
    fn submit_maybe_sync(&self, offset: u64, cmd: Cmd, sync: bool, here: bool, done: Done) {
        if self.retry_io {
            submit_retrying(self.dp.clone(), self.vm, offset, cmd, sync, here, done, 4);
        } else {
            self.dp.submit_with(self.vm, offset, cmd, sync, here, done);
        }
    }
}

impl ExportBackend for VdiskExport {
    fn direct(&self) -> bool {
        self.dp.direct()
    }
    fn serves(&self) -> bool {
        self.dp.serves(self.vm)
    }
    fn submit(&self, offset: u64, cmd: Cmd, here: bool, done: Done) {
        self.submit_maybe_sync(offset, cmd, false, here, done);
    }
    fn submit_fua_write(&self, offset: u64, data: Vec<u8>, here: bool, done: Done) {
        self.submit_maybe_sync(offset, Cmd::Write(data), true, here, done);
    }
    fn hint_cache(&self, offset: u64, len: u64) {
        self.dp.hint_cache(self.vm, offset, len);
    }
    fn allocation(&self, offset: u64, len: u32, one: bool) -> io::Result<Vec<(u32, u32)>> {
        self.dp.allocation(self.vm, offset, len, one)
    }
    fn write_now(&self, offset: u64, data: &[u8]) -> Result<(), ClientError> {
        self.dp.write(self.vm, offset, data, false).map_err(client_error)
    }
    fn flush_now(&self) -> Result<(), ClientError> {
        self.dp.flush(self.vm).map_err(client_error)
    }
}
