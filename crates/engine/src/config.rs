//! Engine configuration: every tunable with its minimum, maximum and default, validated
//! when the engine is built.

use crate::replacement::ReplacementKind;
use crate::stores::StoreLayout;
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

/// What kind of store a row of the engine's store table is (`stores.rs`): where its
/// slots live, so a driver knows which device runs an op on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
pub enum StoreKind {
    /// This node's own cache store (the table's first row, store 0): its first cache
    /// device.
    Local,
    /// Another cache device of this host (`[[cache.device]]`, the simulator's
    /// `devices.ssd_count`): part of the local cache with store 0 — one allocation over
    /// every local device, new blocks placed by free space and queue (`stores.rs`).
    Device {
        /// The device's place among the host's cache devices (1.., device 0 is store 0).
        index: u16,
    },
    /// Cache another node of a cluster lends this engine (ELICA §3.1's remote cache),
    /// reached over the network.
    Lent {
        /// The lending node's id in the cluster.
        node: u16,
    },
}

impl StoreKind {
    /// Whether the store is one of this host's own cache devices (store 0 or another
    /// [`StoreKind::Device`]), not a region another node lends.
    #[inline]
    pub fn is_local(self) -> bool {
        matches!(self, StoreKind::Local | StoreKind::Device { .. })
    }
}

/// A store after the local one (`EngineConfig::stores`): its kind and its slots, which
/// follow the local ones and the previous stores'.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreSpec {
    /// What it is.
    #[serde(flatten)]
    pub kind: StoreKind,
    /// Slots in it.
    pub slots: u64,
}

impl StoreSpec {
    /// `slots` slots lent by node `node`.
    pub fn lent(node: u16, slots: u64) -> StoreSpec {
        StoreSpec { kind: StoreKind::Lent { node }, slots }
    }

    /// `slots` slots on the host's cache device `index` (1..).
    pub fn device(index: u16, slots: u64) -> StoreSpec {
        StoreSpec { kind: StoreKind::Device { index }, slots }
    }
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
    /// The stores after the local one (`slots` slots): the host's other cache devices,
    /// or regions other nodes of a cluster lend (not both yet). Their slots follow the
    /// local ones, in this order.
    #[serde(default)]
    pub stores: Vec<StoreSpec>,
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
            stores: Vec::new(),
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
        if let Some(r) = self.stores.iter().find(|r| r.slots == 0) {
            return Err(format!("stores: the store {:?} has no slots", r.kind));
        }
        if self.stores.iter().any(|r| r.kind == StoreKind::Local) {
            return Err("stores: the local store is the first, given by `slots`".into());
        }
        if let Some((i, r)) =
            self.stores.iter().enumerate().find(|(i, r)| self.stores[..*i].iter().any(|o| o.kind == r.kind))
        {
            return Err(format!("stores: store {} ({:?}) is given twice", i + 1, r.kind));
        }
        if self.stores.iter().any(|r| r.kind == StoreKind::Device { index: 0 }) {
            return Err("stores: device 0 is the local store, given by `slots`; other devices count from 1".into());
        }
        let devices = self.stores.iter().any(|r| matches!(r.kind, StoreKind::Device { .. }));
        if devices && self.stores.iter().any(|r| matches!(r.kind, StoreKind::Lent { .. })) {
            return Err(
                "stores: several cache devices and regions other nodes lend in one engine are not supported yet: use one cache device on a cluster node".into(),
            );
        }
        if self.stores.len() >= u16::MAX as usize {
            return Err(format!("stores: {} stores, at most {}", self.stores.len() + 1, u16::MAX));
        }
        let total = self.stores.iter().try_fold(self.slots, |t, r| t.checked_add(r.slots));
        if total.is_none_or(|t| t > MAX_SLOTS) {
            return Err(format!("stores: the stores' slots together exceed {MAX_SLOTS}"));
        }
        Ok(())
    }

    /// This config over several cache devices of `slots[i]` slots each: the first is the
    /// local store (`slots`), the others [`StoreKind::Device`] stores 1.. (an empty list
    /// changes nothing; the stores it had are replaced).
    pub fn over_devices(self, slots: &[u64]) -> EngineConfig {
        match slots.split_first() {
            None => self,
            Some((&first, rest)) => EngineConfig {
                slots: first,
                stores: rest.iter().enumerate().map(|(i, &n)| StoreSpec::device(i as u16 + 1, n)).collect(),
                ..self
            },
        }
    }

    /// `total` slots split over `devices` devices of equal size (the first ones take one
    /// more when it does not divide): what [`Self::over_devices`] takes.
    pub fn equal_split(total: u64, devices: u64) -> Vec<u64> {
        let n = devices.max(1);
        (0..n).map(|i| total / n + u64::from(i < total % n)).collect()
    }

    /// Every slot the engine manages: the local store's, then the other stores'.
    pub fn total_slots(&self) -> u64 {
        self.slots + self.stores.iter().map(|r| r.slots).sum::<u64>()
    }

    /// Where each store's slots are ([`StoreLayout`]), what a driver looks an op's store
    /// and offset up in.
    pub fn layout(&self) -> StoreLayout {
        StoreLayout::new(self)
    }

    /// Sectors per block.
    pub fn sectors_per_block(&self) -> u32 {
        (self.block_size / SECTOR) as u32
    }
}
