//! ELICA's global stripe-based address mapping table (§3.1): for each stripe of each
//! vDisk, the node whose SSD caches it. A vDisk's stripes live on its home node (where
//! its VM runs) unless the map says otherwise, so the table holds only the exceptions —
//! the stripes lent to remote nodes — and a lookup is one hash probe (O(1), §3.1: "kept
//! in-memory and accessed using constant-time hash lookups").
//!
//! Every change is an explicit update applied at a version: [`OwnershipMap::apply`] takes
//! the version the caller's decision was made against and refuses a stale one, so two
//! deciders cannot interleave, and a replica that applies the same updates in the same
//! order holds the same map (what part 2 keeps in etcd). Hand-written: a hash map with a
//! version counter; nothing to borrow from a library.

use cachevisor_trace::VmId;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

/// A node of the cluster.
pub type NodeId = u16;

/// One change to the map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Update {
    /// vDisk `vdisk` now runs on `node` (its VM was placed or moved there): its stripes
    /// not lent elsewhere are cached there.
    Home {
        /// The vDisk.
        vdisk: VmId,
        /// Its home node.
        node: NodeId,
    },
    /// Stripe `stripe` of `vdisk` is cached on `node` (a remote node lending cache, or
    /// the home node again).
    Assign {
        /// The vDisk.
        vdisk: VmId,
        /// The stripe.
        stripe: u64,
        /// Its node.
        node: NodeId,
    },
    /// vDisk `vdisk` is gone: its home and every stripe it had are forgotten.
    Remove {
        /// The vDisk.
        vdisk: VmId,
    },
}

/// An update made against an older version of the map than the current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("ownership update made at version {made_at}, the map is at version {current}: decide again on the current map")]
pub struct StaleVersion {
    /// The version the update was made against.
    pub made_at: u64,
    /// The map's version.
    pub current: u64,
}

/// The map.
#[derive(Debug, Clone, Default)]
pub struct OwnershipMap {
    /// Blocks per stripe (≥ 1).
    stripe_blocks: u64,
    /// Home node by vDisk.
    homes: FxHashMap<VmId, NodeId>,
    /// Stripes cached away from their vDisk's home.
    lent: FxHashMap<(VmId, u64), NodeId>,
    version: u64,
}

impl OwnershipMap {
    /// An empty map of stripes of `stripe_blocks` cache blocks.
    pub fn new(stripe_blocks: u64) -> OwnershipMap {
        OwnershipMap { stripe_blocks: stripe_blocks.max(1), ..OwnershipMap::default() }
    }

    /// The current version (0 for a new map; each applied batch adds 1).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Blocks per stripe.
    pub fn stripe_blocks(&self) -> u64 {
        self.stripe_blocks
    }

    /// The stripe block `block` belongs to.
    #[inline]
    pub fn stripe_of(&self, block: u64) -> u64 {
        block / self.stripe_blocks
    }

    /// The home node of `vdisk`, if it is placed.
    pub fn home(&self, vdisk: VmId) -> Option<NodeId> {
        self.homes.get(&vdisk).copied()
    }

    /// The node caching block `block` of `vdisk` (`None`: the vDisk is not placed).
    #[inline]
    pub fn owner(&self, vdisk: VmId, block: u64) -> Option<NodeId> {
        let home = *self.homes.get(&vdisk)?;
        Some(self.lent.get(&(vdisk, self.stripe_of(block))).copied().unwrap_or(home))
    }

    /// Stripes of `vdisk` cached away from its home, with their nodes (any order).
    pub fn lent_stripes(&self, vdisk: VmId) -> impl Iterator<Item = (u64, NodeId)> + '_ {
        self.lent.iter().filter(move |((v, _), _)| *v == vdisk).map(|(&(_, s), &n)| (s, n))
    }

    /// Stripes cached away from their homes, in all.
    pub fn lent_count(&self) -> usize {
        self.lent.len()
    }

    /// Applies `updates` in order as one batch made against version `made_at`; the new
    /// version. A stale `made_at` changes nothing. An `Assign` to a vDisk with no home
    /// is taken as placing the stripe there with the home unknown — refused instead:
    /// every stripe's vDisk must be placed first (the error names it).
    pub fn apply(&mut self, made_at: u64, updates: &[Update]) -> Result<u64, ApplyError> {
        if made_at != self.version {
            return Err(ApplyError::Stale(StaleVersion { made_at, current: self.version }));
        }
        // Check the whole batch first, so a refused batch changes nothing.
        let mut placed: Vec<VmId> = Vec::new();
        let mut removed: Vec<VmId> = Vec::new();
        for u in updates {
            match *u {
                Update::Home { vdisk, .. } => {
                    placed.push(vdisk);
                    removed.retain(|&v| v != vdisk);
                }
                Update::Remove { vdisk } => {
                    removed.push(vdisk);
                    placed.retain(|&v| v != vdisk);
                }
                Update::Assign { vdisk, .. } => {
                    let known =
                        (self.homes.contains_key(&vdisk) && !removed.contains(&vdisk)) || placed.contains(&vdisk);
                    if !known {
                        return Err(ApplyError::NotPlaced(vdisk));
                    }
                }
            }
        }
        for u in updates {
            match *u {
                Update::Home { vdisk, node } => {
                    self.homes.insert(vdisk, node);
                    // Stripes lent to the new home are simply home now.
                    self.lent.retain(|&(v, _), n| v != vdisk || *n != node);
                }
                Update::Assign { vdisk, stripe, node } => {
                    if self.homes.get(&vdisk) == Some(&node) {
                        self.lent.remove(&(vdisk, stripe));
                    } else {
                        self.lent.insert((vdisk, stripe), node);
                    }
                }
                Update::Remove { vdisk } => {
                    self.homes.remove(&vdisk);
                    self.lent.retain(|&(v, _), _| v != vdisk);
                }
            }
        }
        self.version += 1;
        Ok(self.version)
    }
}

/// Why a batch of updates was refused (nothing of it applied).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// Made against an older version.
    #[error(transparent)]
    Stale(#[from] StaleVersion),
    /// A stripe of a vDisk that is not placed on any node.
    #[error("stripe assigned for vDisk {0}, which is not placed on any node (place it first)")]
    NotPlaced(VmId),
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn stripes_live_at_home_unless_lent_and_stale_batches_change_nothing() {
        let mut m = OwnershipMap::new(64);
        assert_eq!(m.owner(1, 0), None);
        let v =
            m.apply(0, &[Update::Home { vdisk: 1, node: 0 }, Update::Assign { vdisk: 1, stripe: 2, node: 3 }]).unwrap();
        assert_eq!(v, 1);
        assert_eq!((m.owner(1, 0), m.owner(1, 2 * 64 + 5), m.owner(1, 3 * 64)), (Some(0), Some(3), Some(0)));
        // Made against version 0 again: refused, nothing changed.
        let e = m.apply(0, &[Update::Assign { vdisk: 1, stripe: 2, node: 1 }]).unwrap_err();
        assert_eq!(e, ApplyError::Stale(StaleVersion { made_at: 0, current: 1 }));
        assert!(e.to_string().contains("version 0, the map is at version 1"));
        assert_eq!(m.owner(1, 2 * 64), Some(3));
        // A stripe of an unplaced vDisk anywhere in a batch: the whole batch refused.
        let e = m.apply(
            1,
            &[Update::Assign { vdisk: 1, stripe: 9, node: 2 }, Update::Assign { vdisk: 7, stripe: 0, node: 2 }],
        );
        assert_eq!(e, Err(ApplyError::NotPlaced(7)));
        assert_eq!((m.owner(1, 9 * 64), m.version()), (Some(0), 1));
        // The VM moves to node 3: the stripe lent to node 3 is home now.
        m.apply(1, &[Update::Home { vdisk: 1, node: 3 }]).unwrap();
        assert_eq!((m.lent_count(), m.owner(1, 0)), (0, Some(3)));
        m.apply(2, &[Update::Remove { vdisk: 1 }]).unwrap();
        assert_eq!(m.owner(1, 0), None);
    }

    fn update() -> impl Strategy<Value = Update> {
        prop_oneof![
            (0u32..4, 0u16..4).prop_map(|(vdisk, node)| Update::Home { vdisk, node }),
            (0u32..4, 0u64..8, 0u16..4).prop_map(|(vdisk, stripe, node)| Update::Assign { vdisk, stripe, node }),
            (0u32..4).prop_map(|vdisk| Update::Remove { vdisk }),
        ]
    }

    proptest! {
        /// Against a brute-force model (a full table of every stripe): batches applied in
        /// order, some made against stale versions, give the same owner for every block,
        /// and a refused batch changes nothing.
        #[test]
        fn lookups_match_a_full_table(batches in prop::collection::vec((prop::collection::vec(update(), 1..5), any::<bool>()), 1..30)) {
            let mut m = OwnershipMap::new(4);
            // Model: vDisk → (home, stripe → node for all 8 stripes).
            let mut model: BTreeMap<VmId, (NodeId, BTreeMap<u64, NodeId>)> = BTreeMap::new();
            for (batch, stale) in batches {
                let made_at = if stale && m.version() > 0 { m.version() - 1 } else { m.version() };
                let mut next = model.clone();
                let mut ok = made_at == m.version();
                for u in &batch {
                    match *u {
                        Update::Home { vdisk, node } => {
                            let e = next.entry(vdisk).or_insert((node, (0..8).map(|s| (s, node)).collect()));
                            let old = e.0;
                            e.0 = node;
                            // Stripes at the old home follow the VM; lent ones stay.
                            for n in e.1.values_mut() {
                                if *n == old {
                                    *n = node;
                                }
                            }
                        }
                        Update::Assign { vdisk, stripe, node } => match next.get_mut(&vdisk) {
                            Some(e) => {
                                e.1.insert(stripe, node);
                            }
                            None => ok = false,
                        },
                        Update::Remove { vdisk } => {
                            next.remove(&vdisk);
                        }
                    }
                }
                let r = m.apply(made_at, &batch);
                prop_assert_eq!(r.is_ok(), ok, "{:?}", r);
                if ok {
                    model = next;
                }
                for vdisk in 0..4u32 {
                    for stripe in 0..8u64 {
                        let want = model.get(&vdisk).map(|e| e.1[&stripe]);
                        prop_assert_eq!(m.owner(vdisk, stripe * 4 + 3), want, "vdisk {} stripe {}", vdisk, stripe);
                    }
                }
            }
        }
    }
}
