//! Where every block id entering the engine is checked against its vDisk, so that no
//! input — a client request, a trace line, a snapshot's prewarm set, a replayed journal
//! record — can name a block of another vDisk. A block key holds the VM id in its top 16
//! bits and the block number below ([`crate::slot_table::BLOCK_BITS`]): a block number of
//! 2^48 or more would become another VM's block. So:
//! - a VM id is below [`MAX_VMS`];
//! - a vDisk's size, when a driver gives it ([`Engine::set_disk_size`]), fits the key —
//!   at most [`MAX_DISK_BLOCKS`] blocks — or is refused;
//! - a request's byte range, a prewarm load's blocks and a restored slot's block lie
//!   within the vDisk (within the key's range when no size was given: the simulator's
//!   traces, which have none), checked without overflow.
//!
//! The vDisk's last block may be partial (an image of 1,000,000 bytes has 245 blocks of
//! 4 KiB, the last one 576 bytes): its ops cover the whole block, and a driver reads zeros
//! past the end of the store and writes nothing there (the daemon's `backing.rs`).

use crate::config::MAX_VMS;
use crate::engine::Engine;
use crate::slot_table::BLOCK_BITS;
use cachevisor_trace::VmId;

/// Most blocks one vDisk may have: the block number's bits in a key.
pub const MAX_DISK_BLOCKS: u64 = 1 << BLOCK_BITS;

/// Why a request or block is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// The VM id does not fit a block key.
    #[error("vm id {vm} is beyond the engine's {MAX_VMS} vDisks")]
    VmId {
        /// The VM.
        vm: VmId,
    },
    /// A byte range reaches past the vDisk's end (or past 2^64).
    #[error("{len} bytes at offset {offset} of vm {vm} reach past its end ({end} bytes)")]
    PastEnd {
        /// The VM.
        vm: VmId,
        /// First byte.
        offset: u64,
        /// Bytes.
        len: u64,
        /// The vDisk's size in bytes (or the most the key addresses).
        end: u64,
    },
    /// Blocks past the vDisk's last one.
    #[error("block {block} of vm {vm} is past its last block ({blocks} blocks)")]
    BlockPastEnd {
        /// The VM.
        vm: VmId,
        /// The block.
        block: u64,
        /// The vDisk's blocks.
        blocks: u64,
    },
    /// A vDisk size with more blocks than a key can name.
    #[error(
        "a vDisk of {size} bytes has more than {MAX_DISK_BLOCKS} blocks of {block_size} bytes (the most one cache \
         addresses): use a larger block size"
    )]
    DiskTooLarge {
        /// The size asked for.
        size: u64,
        /// The engine's block size.
        block_size: u64,
    },
}

/// The most bytes a key addresses at blocks of `1 << shift` bytes (saturated at 2^64 - 1).
pub(crate) fn key_range_bytes(shift: u32) -> u64 {
    MAX_DISK_BLOCKS.checked_shl(shift).filter(|&b| b >> shift == MAX_DISK_BLOCKS).unwrap_or(u64::MAX)
}

/// Whether a vDisk of `size` bytes fits the keys of an engine with blocks of
/// `block_size` bytes: for a driver's configuration check, before any engine exists.
pub fn check_disk_size(size: u64, block_size: u64) -> Result<(), RangeError> {
    let blocks = size.div_ceil(block_size.max(1));
    if blocks > MAX_DISK_BLOCKS {
        return Err(RangeError::DiskTooLarge { size, block_size });
    }
    Ok(())
}

impl Engine {
    /// Sets `vm`'s size in bytes: requests, prewarm loads and restored blocks past it are
    /// refused from now on. Refused (nothing changes) when the disk has more blocks than a
    /// key can name.
    pub fn set_disk_size(&mut self, vm: VmId, size: u64) -> Result<(), RangeError> {
        Self::check_vm(vm)?;
        check_disk_size(size, self.cfg.block_size)?;
        self.ensure_vm(vm);
        self.vms[vm as usize].disk_end = size;
        Ok(())
    }

    /// `vm`'s size in bytes as the engine checks it (the key's range when never set).
    pub fn disk_size(&self, vm: VmId) -> u64 {
        self.vms.get(vm as usize).map_or(key_range_bytes(self.shift), |p| p.disk_end)
    }

    /// `vm`'s blocks (a partial last block counted).
    pub fn disk_blocks(&self, vm: VmId) -> u64 {
        self.disk_size(vm).div_ceil(self.cfg.block_size).min(MAX_DISK_BLOCKS)
    }

    pub(crate) fn check_vm(vm: VmId) -> Result<(), RangeError> {
        if vm >= MAX_VMS {
            return Err(RangeError::VmId { vm });
        }
        Ok(())
    }

    /// Whether `len` bytes at `offset` of `vm` lie within the vDisk.
    pub fn check_range(&self, vm: VmId, offset: u64, len: u64) -> Result<(), RangeError> {
        Self::check_vm(vm)?;
        let end = self.disk_size(vm);
        if offset.checked_add(len).is_none_or(|e| e > end) {
            return Err(RangeError::PastEnd { vm, offset, len, end });
        }
        Ok(())
    }

    /// Whether blocks `first..first + len` of `vm` lie within the vDisk.
    pub fn check_blocks(&self, vm: VmId, first: u64, len: u64) -> Result<(), RangeError> {
        Self::check_vm(vm)?;
        let blocks = self.disk_blocks(vm);
        if first.checked_add(len).is_none_or(|e| e > blocks) {
            return Err(RangeError::BlockPastEnd { vm, block: first.saturating_add(len.max(1) - 1), blocks });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EngineConfig, Output};
    use cachevisor_trace::{Op, Request};

    #[test]
    fn the_key_range_saturates_at_large_blocks() {
        assert_eq!(key_range_bytes(9), 1 << 57);
        assert_eq!(key_range_bytes(15), 1 << 63);
        assert_eq!(key_range_bytes(16), u64::MAX);
        assert_eq!(key_range_bytes(20), u64::MAX);
    }

    #[test]
    fn a_disk_larger_than_the_key_is_refused() {
        assert!(check_disk_size(1 << 57, 512).is_ok());
        let e = check_disk_size((1 << 57) + 1, 512).unwrap_err();
        assert!(e.to_string().contains("larger block size"), "{e}");
        let mut eng = Engine::new(EngineConfig { block_size: 512, ..EngineConfig::with_slots(4) }).unwrap();
        assert!(eng.set_disk_size(0, 1 << 58).is_err());
        assert_eq!(eng.disk_size(0), 1 << 57, "unchanged");
    }

    #[test]
    fn ranges_are_checked_without_overflow() {
        let mut e = Engine::new(EngineConfig::with_slots(4)).unwrap();
        e.set_disk_size(1, 1_000_000).unwrap();
        assert_eq!(e.disk_blocks(1), 245, "the partial last block counts");
        assert!(e.check_range(1, 999_488, 512).is_ok());
        assert!(e.check_range(1, 999_488, 513).is_err());
        assert!(e.check_range(1, u64::MAX, 1).is_err());
        assert!(e.check_range(0, u64::MAX - 10, 4096).is_err(), "no size: the key's range, no wrap");
        assert!(e.check_range(0, (1 << 60) - 4096, 4096).is_ok());
        assert!(e.check_range(0, 1 << 60, 1).is_err(), "2^48 blocks of 4 KiB");
        assert!(e.check_blocks(1, 244, 1).is_ok());
        assert!(e.check_blocks(1, 245, 1).is_err());
        assert!(e.check_blocks(1, u64::MAX, 2).is_err());
        assert!(e.check_range(MAX_VMS, 0, 1).is_err());
        // A replayed journal record past the disk (or aliasing in a key) is refused.
        let spb = e.config().sectors_per_block() as usize;
        let (v, d) = (vec![true; spb], vec![false; spb]);
        assert!(e.restore_slot(0, 0, 1 << 48, &v, &d).unwrap_err().contains("past its last block"));
        assert!(e.restore_slot(0, 1, 245, &v, &d).is_err());
        e.restore_slot(0, 1, 244, &v, &d).unwrap();
        assert_eq!(e.lookup(0, 244), None, "vm 0's block 244 is not vm 1's");
        assert_eq!(e.lookup(1, 244), Some(0));
        assert_eq!(e.lookup(0, (1 << 48) + 244), None, "a lookup past the key's range never aliases");
        // A prewarm of a larger disk's blocks loads the ones that exist and counts the rest.
        let o = e.prewarm_load(1, 243, 10, &mut Output::default());
        assert_eq!(o.out_of_range, 8);
        let o = e.prewarm_load(1, u64::MAX - 1, 10, &mut Output::default());
        assert_eq!((o.loaded, o.out_of_range), (0, 1), "saturated at 2^64");
        // The sync face does nothing with a request it refuses.
        let mut out = Output::default();
        e.access(0, &Request { time_ns: 0, vm: 1, op: Op::Write, offset: 1 << 20, len: 4096 }, &mut out);
        assert!(out.ops.is_empty() && out.blocks.is_empty());
    }
}
