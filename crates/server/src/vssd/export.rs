//! A vSSD (`vssd/`) as the protocol's backend (`cachevisor_nbd::backend`), beside a
//! vDisk on the cache's data path (`cachevisor_datapath::vdisk_export`): NBD transmission
//! and vhost-user-blk drive either through one trait — one request loop, one set of
//! protocol checks, two kinds of store.

use super::service::{VssdIoError, VssdService};
use cachevisor_nbd::backend::{ClientError, Cmd, Done, ExportBackend};
use cachevisor_vssd::io::IoError;
use cachevisor_vssd::VssdId;
use std::io;
use std::sync::Arc;

/// A vSSD: requests run on the calling thread, through the block manager's translation.
pub struct VssdExport {
    /// The vSSD region.
    pub svc: Arc<VssdService>,
    /// The vSSD.
    pub id: VssdId,
}

/// The NBD failure of a vSSD request: a block the vSSD does not hold is EIO (SymFlex's
/// invalid request), past the end EINVAL, a stopped vSSD ESHUTDOWN.
fn failure(e: VssdIoError) -> ClientError {
    match e {
        VssdIoError::Refused(IoError::Invalid(_)) | VssdIoError::Device(_) => ClientError::Io,
        VssdIoError::Refused(IoError::OutOfRange { .. }) => ClientError::OutOfRange,
        VssdIoError::Refused(IoError::NotRunning(_)) => ClientError::Shutdown,
    }
}

impl ExportBackend for VssdExport {
    fn direct(&self) -> bool {
        self.svc.direct()
    }
    fn serves(&self) -> bool {
        self.svc.running(self.id)
    }
    fn submit(&self, offset: u64, cmd: Cmd, here: bool, done: Done) {
        let (svc, id) = (self.svc.clone(), self.id);
        // On this thread when it may (nothing queued behind it: no hand-off's wake-up),
        // else on the I/O threads: a connection's requests in flight reach the SSD together.
        let run = |job: Box<dyn FnOnce() + Send>| if here { job() } else { self.svc.spawn_io(job) };
        match cmd {
            Cmd::Read(len) => run(Box::new(move || {
                let mut buf = vec![0u8; len as usize];
                done(svc.read(id, offset, &mut buf).map(|()| vec![(buf.into(), offset)]).map_err(failure))
            })),
            Cmd::Write(data) => {
                run(Box::new(move || done(svc.write(id, offset, &data).map(|()| Vec::new()).map_err(failure))))
            }
            Cmd::Flush => done(self.flush_now().map(|()| Vec::new())),
            // A hint to the store; a vSSD's blocks are its guest's to manage.
            Cmd::Discard(_) => done(Ok(Vec::new())),
        }
    }
    fn hint_cache(&self, _offset: u64, _len: u64) {}
    fn allocation(&self, _offset: u64, len: u32, one: bool) -> io::Result<Vec<(u32, u32)>> {
        // All data: a block it does not hold fails to read, it is not a hole of zeros.
        let _ = one;
        Ok(vec![(len, 0)])
    }
    fn write_now(&self, offset: u64, data: &[u8]) -> Result<(), ClientError> {
        self.svc.write(self.id, offset, data).map_err(failure)
    }
    fn flush_now(&self) -> Result<(), ClientError> {
        self.svc.flush().map_err(|e| {
            tracing::warn!(vssd = self.id, %e, "vSSD flush failed");
            ClientError::Io
        })
    }
}
