//! What the engine hands back: per-block outcomes and the device operations the driver
//! must perform, in an order that is safe to execute one after another.
//!
//! Each operation carries a `phase`: operations of one phase may run in parallel, and a
//! phase starts when every operation of the previous phase of the same output has
//! completed. The list order is a safe sequential order too (each block's operations
//! appear in phase order; different blocks' operations are independent). `sync` operations are the ones the request waits for; the others
//! (a read miss's fill of the SSD) only load the devices.
//!
//! Where data comes from, which a driver that moves real bytes must follow:
//! - every op names the VM and the disk byte range its data belongs to (`disk_addr`);
//! - a read request's data for each sector is what the last read op (SSD or backing)
//!   covering that sector of the VM's disk returned;
//! - a `staged` write op writes the data that the last `staged` read op of the same range
//!   in the same output read (write-back: SSD read then backing write; fill: backing read
//!   then SSD write); any other write op writes the client's data for its range.

use cachevisor_trace::VmId;

/// Device an operation targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum OpKind {
    /// Read from the SSD cache store.
    SsdRead,
    /// Write to the SSD cache store.
    SsdWrite,
    /// Read from the VM's backing store.
    BackingRead,
    /// Write to the VM's backing store.
    BackingWrite,
}

impl OpKind {
    /// Whether the op targets the SSD.
    pub fn is_ssd(self) -> bool {
        matches!(self, OpKind::SsdRead | OpKind::SsdWrite)
    }
    /// Whether the op writes.
    pub fn is_write(self) -> bool {
        matches!(self, OpKind::SsdWrite | OpKind::BackingWrite)
    }
}

/// One device operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DeviceOp {
    /// Which device and direction.
    pub kind: OpKind,
    /// The VM whose disk the data belongs to.
    pub vm: VmId,
    /// Byte offset on the VM's disk of the data moved.
    pub disk_addr: u64,
    /// SSD ops: byte address in the cache store (`slot × block + sector × 512`); 0 otherwise.
    pub ssd_addr: u64,
    /// Bytes.
    pub len: u32,
    /// Ordering phase (see the module doc).
    pub phase: u8,
    /// Whether the request's completion waits for it.
    pub sync: bool,
    /// Part of a device-to-device copy (write-back or fill) rather than client data.
    pub staged: bool,
}

/// A block that lost its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Evicted {
    /// Owner.
    pub vm: VmId,
    /// Block number on the owner's disk.
    pub block: u64,
    /// Dirty sectors written back before the slot was reused.
    pub dirty_sectors: u32,
}

/// What happened to one block of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct BlockOutcome {
    /// Block number on the VM's disk.
    pub block: u64,
    /// Every sector the request needed was served by (reads) or already held in (writes)
    /// the cache.
    pub hit: bool,
    /// The block received a new slot.
    pub inserted: bool,
    /// The request bypassed the cache for this block (no slot could be had, or the write
    /// policy sends it around the cache).
    pub bypassed: bool,
    /// The block whose slot was taken, if any.
    pub evicted: Option<Evicted>,
}

/// Reusable output buffers of one call.
#[derive(Debug, Clone, Default)]
pub struct Output {
    /// Per-block outcomes (requests only; empty for commands).
    pub blocks: Vec<BlockOutcome>,
    /// Device operations in safe sequential order.
    pub ops: Vec<DeviceOp>,
}

impl Output {
    /// Empties both lists, keeping capacity.
    pub fn clear(&mut self) {
        self.blocks.clear();
        self.ops.clear();
    }

    /// Whether every block of the request hit.
    pub fn all_hit(&self) -> bool {
        !self.blocks.is_empty() && self.blocks.iter().all(|b| b.hit)
    }
}
