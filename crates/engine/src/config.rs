//! Engine configuration: every tunable with its minimum, maximum and default, validated
//! when the engine is built.

use crate::replacement::ReplacementKind;
use crate::write_policy::WritePolicy;
use serde::{Deserialize, Serialize};

/// Smallest block (cache line) size: one sector.
pub const MIN_BLOCK: u64 = 512;
/// Largest block size (SymFlex's vSSD blocks).
pub const MAX_BLOCK: u64 = 1 << 20;
/// Default block size (S-CAVE).
pub const DEFAULT_BLOCK: u64 = 4096;
/// Sector size: the unit of valid/dirty tracking.
pub const SECTOR: u64 = 512;
/// Most slots one engine manages (slot ids are 32-bit, one value reserved).
pub const MAX_SLOTS: u64 = u32::MAX as u64 - 1;
/// Most VMs (VM ids take 16 bits of a block key).
pub const MAX_VMS: u32 = 1 << 16;

/// How slots are shared among VMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PartitionMode {
    /// Private pools with target sizes (S-CAVE's private pools); a VM evicts only its own
    /// blocks and grows into free slots up to its target.
    #[default]
    Static,
    /// One replacement over every slot, no targets: the "unmanaged" baseline.
    Shared,
}

impl PartitionMode {
    /// Command-line and report name.
    pub fn name(self) -> &'static str {
        match self {
            PartitionMode::Static => "static",
            PartitionMode::Shared => "shared",
        }
    }
}

/// What a read miss brings into the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum FillMode {
    /// The whole block (what block caches and stack-distance analyses assume).
    #[default]
    Block,
    /// Only the sectors the request read (no read amplification on large blocks).
    Request,
}

/// Engine settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    /// Block size in bytes: a power of two in [`MIN_BLOCK`, `MAX_BLOCK`], default 4 KiB.
    pub block_size: u64,
    /// Number of SSD slots: 1 ..= [`MAX_SLOTS`].
    pub slots: u64,
    /// Partitioned or shared.
    pub partition: PartitionMode,
    /// Replacement policy (per partition, or global when shared).
    pub replacement: ReplacementKind,
    /// Write policy a VM starts with.
    pub write_policy: WritePolicy,
    /// What a read miss fills.
    pub fill: FillMode,
    /// Keep a last-access time per slot (4 bytes per slot).
    pub track_last_access: bool,
}

impl EngineConfig {
    /// A config of `slots` slots with every other setting at its default.
    pub fn with_slots(slots: u64) -> Self {
        EngineConfig {
            block_size: DEFAULT_BLOCK,
            slots,
            partition: PartitionMode::Static,
            replacement: ReplacementKind::Lru,
            write_policy: WritePolicy::Wb,
            fill: FillMode::Block,
            track_last_access: false,
        }
    }

    /// Checks every bound; the message names the setting.
    pub fn validate(&self) -> Result<(), String> {
        if !self.block_size.is_power_of_two() || !(MIN_BLOCK..=MAX_BLOCK).contains(&self.block_size) {
            return Err(format!("block_size: {} is not a power of two between 512 B and 1 MiB", self.block_size));
        }
        if self.slots == 0 || self.slots > MAX_SLOTS {
            return Err(format!("slots: {} is outside 1..={MAX_SLOTS} (cache size / block size)", self.slots));
        }
        Ok(())
    }

    /// Sectors per block.
    pub fn sectors_per_block(&self) -> u32 {
        (self.block_size / SECTOR) as u32
    }
}
