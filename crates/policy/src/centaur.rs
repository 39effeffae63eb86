//! `centaur`: a Centaur-like baseline, the dynamic partitioning ECI-Cache reports against
//! (ECI-Cache abstract: "compared to the state-of-the-art dynamic cache partitioning
//! scheme"): each VM sized by plain reuse distance over every access, reads and writes
//! alike, and every VM write-back. Same sizing and solver as ECI-Cache
//! ([`crate::reuse_sizing`]), so the two differ only in what ECI-Cache changes.

use crate::allocator::{Allocator, Decision, Needs, Pool, VmDemand};
use crate::reuse_sizing::size_by_reuse;
use cachevisor_engine::WritePolicy;

/// Reuse-distance sizing, write-back for all.
#[derive(Debug, Clone, Default)]
pub struct Centaur;

impl Allocator for Centaur {
    fn name(&self) -> &'static str {
        "centaur"
    }

    fn every_interval(&self) -> bool {
        true
    }

    fn needs(&self) -> Needs {
        Needs { hit_curves: true, ..Needs::default() }
    }

    fn allocate(&mut self, pool: &Pool, vms: &[VmDemand]) -> Decision {
        Decision {
            targets: size_by_reuse(pool, vms, |v| &v.hit_curve),
            write_policies: vec![Some(WritePolicy::Wb); vms.len()],
            uncapped: false,
            paced_shrinks: false,
        }
    }
}
