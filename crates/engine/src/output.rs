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
//! - a `staged` write op writes the data that the read op named by its `source` read
//!   (write-back: SSD read then backing write; fill: backing read then SSD write) — that
//!   read is the last `staged` read of the same range in the same output; any other write
//!   op writes the client's data for its range;
//! - `client` ops move the request's own data: a read op's bytes (where they overlap the
//!   request's range) are the reply, a write op's bytes come from the request.
//!
//! Every op has an id, unique in the engine's life, by which a driver reports its
//! completion ([`crate::Engine::handle_completion`]) and a staged write names its source,
//! and a [`Location`]: which device it runs on.

use cachevisor_trace::VmId;

/// An operation's id (unique for the engine's life, increasing in emission order).
pub type OpId = u64;

/// Where an operation runs: the device a driver must address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Location {
    /// A cache store: a row of the engine's store table (`stores.rs`; 0 the local SSD,
    /// the others as `EngineConfig::stores` lists them — what kind each is,
    /// [`crate::StoreLayout::kind`]). Cache ops address its slots
    /// ([`crate::StoreLayout::offset`]).
    Cache(crate::stores::StoreId),
    /// The backing store of a vDisk (the op's `vm`).
    Backing(VmId),
    /// The host's RAM tier (`ram_tier.rs`): clean copies of hot cached blocks in memory.
    /// The op's `slot` is its RAM slot (0.. the tier's slots, not a store slot); its byte
    /// offset there is [`DeviceOp::ram_offset`]. Its ops are [`OpKind::RamRead`] and
    /// [`OpKind::RamWrite`].
    Ram,
}

/// Bytes a driver runs as one device call at most ([`DeviceOp::continues`]): a 1 MiB read
/// of consecutive slots is one call.
pub const MAX_RUN_BYTES: u64 = 1 << 20;

/// No slot: a backing-store op.
pub const NO_SLOT: u32 = u32::MAX;

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
    /// Read a block's clean copy from the RAM tier ([`Location::Ram`]).
    RamRead,
    /// Write a block's clean copy into the RAM tier (staged: what an SSD read returned).
    RamWrite,
}

impl OpKind {
    /// Whether the op targets a cache store (an SSD, or a region another node lends).
    pub fn is_ssd(self) -> bool {
        matches!(self, OpKind::SsdRead | OpKind::SsdWrite)
    }
    /// Whether the op targets the RAM tier.
    pub fn is_ram(self) -> bool {
        matches!(self, OpKind::RamRead | OpKind::RamWrite)
    }
    /// Whether the op writes.
    pub fn is_write(self) -> bool {
        matches!(self, OpKind::SsdWrite | OpKind::BackingWrite | OpKind::RamWrite)
    }
}

/// One device operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DeviceOp {
    /// Its id.
    pub id: OpId,
    /// The request or background job it belongs to ([`crate::Engine::submit`],
    /// [`crate::Engine::submit_job`]); 0 for ops of the synchronous calls.
    pub req: u64,
    /// Which kind of device (cache or backing) and direction.
    pub kind: OpKind,
    /// The device it runs on.
    pub loc: Location,
    /// The VM whose disk the data belongs to.
    pub vm: VmId,
    /// Byte offset on the VM's disk of the data moved.
    pub disk_addr: u64,
    /// Cache ops: the slot (the sectors are those of `disk_addr..+len` inside the block);
    /// [`NO_SLOT`] for backing ops.
    pub slot: u32,
    /// Bytes.
    pub len: u32,
    /// Ordering phase (see the module doc).
    pub phase: u16,
    /// Whether the request's completion waits for it.
    pub sync: bool,
    /// Part of a device-to-device copy (write-back or fill) rather than client data.
    pub staged: bool,
    /// Moves the request's own data (see the module doc).
    pub client: bool,
    /// Staged writes: the read op whose bytes they write ([`Self::source_id`]; non-zero
    /// keeps the op small, op ids start at 1).
    pub source: Option<std::num::NonZeroU64>,
    /// Where the engine keeps its job (the slab key in [`OpHandle`]).
    #[serde(skip)]
    pub(crate) job: u32,
}

/// What a driver keeps of an op in flight to report its completion
/// ([`crate::Engine::handle_completion`]): ordered by op id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpHandle {
    /// The op's id.
    pub id: OpId,
    /// Its job's place in the engine's job table (ids tell a stale handle apart).
    job: u32,
}

impl OpHandle {
    /// The job-table key (inside the engine).
    #[inline]
    pub(crate) fn job(self) -> usize {
        self.job as usize
    }
}

impl DeviceOp {
    /// The handle by which its completion is reported.
    #[inline]
    pub fn handle(&self) -> OpHandle {
        OpHandle { id: self.id, job: self.job }
    }

    /// Whether this op continues `prev` on its device, so a driver may run both as one
    /// device call: same kind and device, and the next cache-store offset (cache ops) or
    /// the next disk address of the same vDisk (backing ops). Runs stay within
    /// [`MAX_RUN_BYTES`]. The daemon's device threads and its io_uring thread coalesce by
    /// this rule (the simulator models each op on its own).
    #[inline]
    pub fn continues(&self, prev: &DeviceOp, block_size: u64) -> bool {
        self.kind == prev.kind
            && self.loc == prev.loc
            && if self.kind.is_ssd() || self.kind.is_ram() {
                self.pool_offset(block_size) == prev.pool_offset(block_size) + prev.len as u64
            } else {
                self.vm == prev.vm && self.disk_addr == prev.disk_addr + prev.len as u64
            }
    }

    /// RAM-tier ops: the byte offset in the tier's memory (the RAM slot × the block size,
    /// plus the op's offset inside its block).
    #[inline]
    pub fn ram_offset(&self, block_size: u64) -> u64 {
        debug_assert!(self.kind.is_ram(), "{self:?} is no RAM-tier op");
        self.pool_offset(block_size)
    }

    /// Staged writes: the id of the read op whose bytes they write.
    #[inline]
    pub fn source_id(&self) -> Option<OpId> {
        self.source.map(|s| s.get())
    }

    /// Cache ops: byte offset over every store's slots in turn (slot × block), only for
    /// comparing ops of one store ([`Self::continues`]); a device's offset is
    /// [`crate::StoreLayout::offset`].
    #[inline]
    fn pool_offset(&self, block_size: u64) -> u64 {
        debug_assert!(block_size.is_power_of_two());
        ((self.slot as u64) << block_size.trailing_zeros()) + (self.disk_addr & (block_size - 1))
    }

    /// The disk block it touches (ops never cross a block) with `block_size` bytes.
    #[inline]
    pub fn block(&self, block_size: u64) -> u64 {
        debug_assert!(block_size.is_power_of_two());
        self.disk_addr >> block_size.trailing_zeros()
    }

    /// The sectors of its block it touches, `lo..hi`, rounded out to whole sectors.
    #[inline]
    pub fn sectors(&self, block_size: u64) -> (u32, u32) {
        debug_assert!(block_size.is_power_of_two());
        let lo = self.disk_addr & (block_size - 1);
        ((lo / 512) as u32, (lo + self.len as u64).div_ceil(512) as u32)
    }
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
