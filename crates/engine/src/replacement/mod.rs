//! Replacement policies behind one trait, one file each, and the registry that builds
//! them by name. A policy orders the resident slots of one partition (or of the whole
//! pool when unpartitioned) and picks victims; it never touches keys, the index or bits.

pub(crate) mod clock;
mod fifo;
mod lru;
mod s3fifo;
mod two_pool;

pub use clock::Clock;
pub use fifo::Fifo;
pub use lru::Lru;
pub use s3fifo::S3Fifo;
pub use two_pool::TwoPool;

use crate::slot_table::SlotTable;
use std::fmt;
use std::str::FromStr;

/// The contract every replacement policy meets.
///
/// The engine calls `insert` once when a slot receives a block, `touch` on every later hit
/// of that slot, `remove` when it drops the block for another reason (invalidation,
/// VM drop), and `evict` when it needs a slot back. Between `insert` and `evict`/`remove`
/// the slot is *resident*: `len` counts exactly the resident slots.
pub trait Replacement {
    /// Makes `s` resident. It must not be resident already.
    fn insert(&mut self, t: &mut SlotTable, s: u32);
    /// Makes `s` resident as a prewarmed block (loaded ahead of any request). Prewarm
    /// loads most important first, so a policy with an order puts each one *behind* the
    /// ones loaded before it: the first loaded stays longest. Default: as [`Self::insert`].
    fn insert_prewarmed(&mut self, t: &mut SlotTable, s: u32) {
        self.insert(t, s);
    }
    /// Records a hit on resident `s`.
    fn touch(&mut self, t: &mut SlotTable, s: u32);
    /// Forgets resident `s` without choosing it as a victim.
    fn remove(&mut self, t: &mut SlotTable, s: u32);
    /// Makes `new` (not resident) resident in `old`'s place — its position, its policy
    /// byte — and forgets `old`: the block in `old` moved to `new` (migration between
    /// cache stores, ELICA §3.6) without changing what is evicted next.
    fn replace(&mut self, t: &mut SlotTable, old: u32, new: u32);
    /// Chooses a victim, forgets it and returns it; `None` only when nothing is resident.
    fn evict(&mut self, t: &mut SlotTable) -> Option<u32>;
    /// Resident slots.
    fn len(&self) -> usize;
    /// Whether nothing is resident.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The partition's capacity changed (policies with internal splits resize them).
    fn set_capacity(&mut self, _slots: u64) {}
    /// Resident slots in the order they would be evicted if nothing else happened
    /// (for tests and debugging; may be approximate for CLOCK-like policies).
    fn dump(&self, t: &SlotTable) -> Vec<u32>;
    /// Up to `k` resident slots that are evicted soonest if nothing else happens, soonest
    /// first, pushed to `out`, without changing anything (write-back ahead of eviction,
    /// `writeback_ahead.rs`). Exact for list policies; for CLOCK-like ones the blocks the
    /// hand would take without another pass (counter 0), among the next `4·k` looked at.
    fn peek_victims(&self, t: &SlotTable, k: usize, out: &mut Vec<u32>);
}

/// Counts a hit in bits 0–3 of the policy byte, saturating at 15: the reference counter
/// that policies without their own use of the byte keep for S-CAVE's rECS scan.
#[inline]
pub(crate) fn bump_counter(t: &mut SlotTable, s: u32) {
    let a = &mut t.aux[s as usize];
    if *a & 0x0f < 0x0f {
        *a += 1;
    }
}

/// The names users pick from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReplacementKind {
    /// Least recently used.
    Lru,
    /// First in, first out.
    Fifo,
    /// CLOCK with a 4-bit reference counter per block (S-CAVE §III, §V-D).
    Clock,
    /// Two-pool LRU: single-touch and multi-touch pools, 20/80 (Nutanix slides).
    TwoPool,
    /// S3-FIFO (Yang et al., SOSP'23).
    S3fifo,
}

impl ReplacementKind {
    /// Every policy, for registries and tests.
    pub const ALL: [ReplacementKind; 5] = [
        ReplacementKind::Lru,
        ReplacementKind::Fifo,
        ReplacementKind::Clock,
        ReplacementKind::TwoPool,
        ReplacementKind::S3fifo,
    ];

    /// Command-line name.
    pub fn name(self) -> &'static str {
        match self {
            ReplacementKind::Lru => "lru",
            ReplacementKind::Fifo => "fifo",
            ReplacementKind::Clock => "clock",
            ReplacementKind::TwoPool => "two-pool",
            ReplacementKind::S3fifo => "s3fifo",
        }
    }

    /// Builds the policy for a partition of `capacity` slots.
    pub fn build(self, capacity: u64) -> AnyReplacement {
        let mut r = match self {
            ReplacementKind::Lru => AnyReplacement::Lru(Lru::default()),
            ReplacementKind::Fifo => AnyReplacement::Fifo(Fifo::default()),
            ReplacementKind::Clock => AnyReplacement::Clock(Clock::default()),
            ReplacementKind::TwoPool => AnyReplacement::TwoPool(TwoPool::default()),
            ReplacementKind::S3fifo => AnyReplacement::S3fifo(S3Fifo::default()),
        };
        r.set_capacity(capacity);
        r
    }
}

impl fmt::Display for ReplacementKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReplacementKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.to_ascii_lowercase();
        ReplacementKind::ALL
            .into_iter()
            .find(|k| k.name() == s || (s == "s3-fifo" && *k == ReplacementKind::S3fifo))
            .ok_or_else(|| {
                format!(
                    "unknown replacement policy `{s}` (one of {})",
                    ReplacementKind::ALL.map(|k| k.name()).join(", ")
                )
            })
    }
}

/// Static dispatch over the policies (the hot path avoids virtual calls).
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub enum AnyReplacement {
    Lru(Lru),
    Fifo(Fifo),
    Clock(Clock),
    TwoPool(TwoPool),
    S3fifo(S3Fifo),
}

macro_rules! dispatch {
    ($self:ident, $r:ident => $e:expr) => {
        match $self {
            AnyReplacement::Lru($r) => $e,
            AnyReplacement::Fifo($r) => $e,
            AnyReplacement::Clock($r) => $e,
            AnyReplacement::TwoPool($r) => $e,
            AnyReplacement::S3fifo($r) => $e,
        }
    };
}

impl Replacement for AnyReplacement {
    #[inline]
    fn insert(&mut self, t: &mut SlotTable, s: u32) {
        dispatch!(self, r => r.insert(t, s))
    }
    fn insert_prewarmed(&mut self, t: &mut SlotTable, s: u32) {
        dispatch!(self, r => r.insert_prewarmed(t, s))
    }
    #[inline]
    fn touch(&mut self, t: &mut SlotTable, s: u32) {
        dispatch!(self, r => r.touch(t, s))
    }
    #[inline]
    fn remove(&mut self, t: &mut SlotTable, s: u32) {
        dispatch!(self, r => r.remove(t, s))
    }
    fn replace(&mut self, t: &mut SlotTable, old: u32, new: u32) {
        dispatch!(self, r => r.replace(t, old, new))
    }
    #[inline]
    fn evict(&mut self, t: &mut SlotTable) -> Option<u32> {
        dispatch!(self, r => r.evict(t))
    }
    #[inline]
    fn len(&self) -> usize {
        dispatch!(self, r => r.len())
    }
    fn set_capacity(&mut self, slots: u64) {
        dispatch!(self, r => r.set_capacity(slots))
    }
    fn dump(&self, t: &SlotTable) -> Vec<u32> {
        dispatch!(self, r => r.dump(t))
    }
    fn peek_victims(&self, t: &SlotTable, k: usize, out: &mut Vec<u32>) {
        dispatch!(self, r => r.peek_victims(t, k, out))
    }
}
