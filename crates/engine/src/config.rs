//! Engine configuration: every tunable with its minimum, maximum and default, validated
//! when the engine is built.

use crate::output::Location;
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

/// Cache another node of a cluster lends this engine (ELICA §3.1's remote cache): its
/// slots follow the local ones and the previous regions', and their ops carry
/// [`Location::Remote`] with the lender's node id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteRegion {
    /// The lending node's id in the cluster.
    pub node: u16,
    /// Slots lent.
    pub slots: u64,
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
    /// Cache lent by other nodes of a cluster, after the `slots` local ones (none on a
    /// single host).
    #[serde(default)]
    pub remote: Vec<RemoteRegion>,
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
            remote: Vec::new(),
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
        if let Some(r) = self.remote.iter().find(|r| r.slots == 0) {
            return Err(format!("remote: the region lent by node {} has no slots", r.node));
        }
        let total = self.remote.iter().try_fold(self.slots, |t, r| t.checked_add(r.slots));
        if total.is_none_or(|t| t > MAX_SLOTS) {
            return Err(format!("remote: local and lent slots together exceed {MAX_SLOTS}"));
        }
        Ok(())
    }

    /// Every slot the engine manages: its own, then the lent regions'.
    pub fn total_slots(&self) -> u64 {
        self.slots + self.remote.iter().map(|r| r.slots).sum::<u64>()
    }

    /// Where slot `slot` lives — the local cache store or a lender's — and its index
    /// there (a driver's byte offset is that index × the block size).
    #[inline]
    pub fn slot_location(&self, slot: u32) -> (Location, u64) {
        let mut at = slot as u64;
        if at < self.slots {
            return (Location::Ssd(0), at);
        }
        at -= self.slots;
        for r in &self.remote {
            if at < r.slots {
                return (Location::Remote { node: r.node }, at);
            }
            at -= r.slots;
        }
        panic!("slot {slot} is past the engine's {} slots", self.total_slots())
    }

    /// Sectors per block.
    pub fn sectors_per_block(&self) -> u32 {
        (self.block_size / SECTOR) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Engine, Output};
    use cachevisor_trace::{Op, Request};

    fn lent() -> EngineConfig {
        let remote = vec![RemoteRegion { node: 2, slots: 3 }, RemoteRegion { node: 5, slots: 1 }];
        EngineConfig { remote, partition: PartitionMode::Shared, ..EngineConfig::with_slots(2) }
    }

    #[test]
    fn lent_regions_follow_the_local_slots() {
        let c = lent();
        assert_eq!(c.total_slots(), 6);
        let at: Vec<_> = (0..6).map(|s| c.slot_location(s)).collect();
        assert_eq!(
            at,
            [
                (Location::Ssd(0), 0),
                (Location::Ssd(0), 1),
                (Location::Remote { node: 2 }, 0),
                (Location::Remote { node: 2 }, 1),
                (Location::Remote { node: 2 }, 2),
                (Location::Remote { node: 5 }, 0),
            ]
        );
    }

    #[test]
    fn ops_on_lent_slots_go_to_the_lender_at_their_offset_there() {
        let c = lent();
        let mut e = Engine::new(c.clone()).unwrap();
        let mut out = Output::default();
        // Six blocks written through (write-back): every slot filled once, each write an op
        // on the slot's store at its index there.
        let mut seen = Vec::new();
        for b in 0..6u64 {
            let req = Request { time_ns: 0, vm: 0, op: Op::Write, offset: b * 4096 + 512, len: 512 };
            e.access(0, &req, &mut out);
            for op in out.ops.iter().filter(|o| o.kind.is_ssd()) {
                assert_eq!(op.loc, c.slot_location(op.slot).0);
                seen.push((op.loc, op.cache_offset(&c)));
            }
        }
        assert_eq!(seen.len(), 6);
        for s in 0..6u32 {
            let (loc, index) = c.slot_location(s);
            assert!(seen.contains(&(loc, index * 4096 + 512)), "slot {s} at {loc:?} {index} in {seen:?}");
        }
    }

    #[test]
    fn bad_regions_are_named() {
        let zero = EngineConfig { remote: vec![RemoteRegion { node: 4, slots: 0 }], ..EngineConfig::with_slots(2) };
        assert!(zero.validate().unwrap_err().contains("node 4 has no slots"));
        let big =
            EngineConfig { remote: vec![RemoteRegion { node: 1, slots: MAX_SLOTS }], ..EngineConfig::with_slots(2) };
        assert!(big.validate().unwrap_err().contains("exceed"));
    }
}
