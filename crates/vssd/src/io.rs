//! A guest's reads and writes translated to the region (SymFlex §2.4.2, §3.1.1): split at
//! block boundaries, each logical block mapped to its physical block, physically
//! contiguous pieces merged into one extent. A request touching a logical block with no
//! valid physical block is refused whole (the seed's "invalid request": EIO to the
//! guest), as is one past the device's M blocks. I/O in flight pins its blocks: a block
//! released meanwhile is freed only when the last of it ends.

use crate::geometry::Pbn;
use crate::manager::{AfterCommit, BlockManager, Live, Nanos};
use crate::record::{Record, VssdId};

/// A contiguous piece of a request on the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Byte offset in the region.
    pub region_offset: u64,
    /// Bytes.
    pub len: u64,
    /// Where the bytes are in the request's buffer.
    pub buf_offset: u64,
}

/// A request admitted: where its bytes go; hand it back to `end_io` when it is done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Io {
    /// The vSSD.
    pub id: VssdId,
    /// Its pieces, in buffer order.
    pub extents: Vec<Extent>,
    pbns: Vec<Pbn>,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IoError {
    /// No such vSSD, or its VM is not running.
    #[error("vSSD {0} is not running")]
    NotRunning(VssdId),
    /// Past the device's end.
    #[error("{len} bytes at {offset} are past the device's {size} bytes")]
    OutOfRange {
        /// The request's offset.
        offset: u64,
        /// Its length.
        len: u64,
        /// The device's size.
        size: u64,
    },
    /// A logical block with no valid physical block (§2.4.2's invalid request).
    #[error("logical block {0} is not valid (not inflated, or given back)")]
    Invalid(u32),
}

impl BlockManager {
    /// Admits `len` bytes at `offset` of vSSD `id` at time `now` (for the least recently
    /// used order of forced deflates).
    pub fn start_io(&mut self, id: VssdId, offset: u64, len: u64, now: Nanos) -> Result<Io, IoError> {
        let v = self.state.vssd(id).filter(|v| v.active && !v.removing).ok_or(IoError::NotRunning(id))?;
        let g = self.config.geometry;
        let size = u64::from(v.max_blocks) * g.block_bytes;
        if offset.checked_add(len).is_none_or(|e| e > size) {
            return Err(IoError::OutOfRange { offset, len, size });
        }
        let mut extents: Vec<Extent> = Vec::new();
        let mut pbns = Vec::new();
        for p in g.split(offset, len) {
            let pbn = match v.map.get(&p.lbn) {
                Some(&pbn) if matches!(self.live[pbn as usize], Live::Valid { .. }) => pbn,
                _ => return Err(IoError::Invalid(p.lbn)),
            };
            let at = g.offset_of(pbn) + p.offset;
            match extents.last_mut() {
                Some(e) if e.region_offset + e.len == at => e.len += p.len,
                _ => extents.push(Extent { region_offset: at, len: p.len, buf_offset: p.buf_offset }),
            }
            pbns.push(pbn);
        }
        for &pbn in &pbns {
            self.inflight[pbn as usize] += 1;
            self.last_access[pbn as usize] = now;
        }
        Ok(Io { id, extents, pbns })
    }

    /// A request admitted by `start_io` ended (whatever its outcome).
    /// Returns whether that left the driver work (a released block's last I/O ended: its
    /// `Free` is to be written), so a driver wakes only then.
    pub fn end_io(&mut self, io: Io) -> bool {
        let mut work = false;
        for pbn in io.pbns {
            self.inflight[pbn as usize] -= 1;
            work |= self.inflight[pbn as usize] == 0 && matches!(self.live[pbn as usize], Live::Draining { .. });
            self.drain(pbn);
        }
        work
    }

    /// A released block whose I/O has all ended is freed (its record written).
    pub(crate) fn drain(&mut self, pbn: Pbn) {
        let Live::Draining { id, .. } = self.live[pbn as usize] else { return };
        if self.inflight[pbn as usize] > 0 {
            return;
        }
        // A block released while its Assign still awaited its commit is freed after it
        // (records commit in order), so `Free` can be emitted now.
        self.set_live(pbn, Live::Freeing);
        self.emit(Record::Free { pbn }, Some(AfterCommit::Free(pbn)));
        self.settle(id);
    }
}
