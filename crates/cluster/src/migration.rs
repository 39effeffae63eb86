//! Moving a VM's cache chunk from one node's SSD to another's (ELICA §3.6), as explicit
//! per-block states, with the coherency rules of §3.7:
//!
//! - **Gradual Migration** (§3.6.1): nothing moves by itself. A write goes to the
//!   destination and drops the source's copy; a read hits the destination, else the
//!   source — served from there and moved to the destination —, else the disk, and the
//!   block is promoted into the destination.
//! - **Instant Migration** (§3.6.2): the same routing, plus a background copy of the
//!   source's blocks, in address order, each dropped from the source once it is written
//!   at the destination.
//! - **Update safety** (§3.7 (a)–(c) and "Instant Migration and Update Safety"): a block
//!   written before its copy starts is copied with its new data (a); a write that arrives
//!   while its block's copy is in flight goes to the destination, and the copy, carrying
//!   older data, is discarded when it completes (b: "the destination node invalidates
//!   incoming data and replaces it with the new one"); a block already moved has one copy,
//!   at the destination (c). A dirty block moves dirty: nothing is written back by moving.
//!
//! The driver serves requests and performs the copies; this machine says where each
//! request goes and whether a completed copy may land. Hand-written: a small table of
//! states per block, nothing a library offers.

use rustc_hash::FxHashMap;

/// How a chunk moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// Blocks move when accessed (§3.6.1).
    Gradual,
    /// Blocks are also copied in the background, in address order (§3.6.2).
    Instant,
}

/// Where a read is served from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    /// The destination's cache.
    Dest,
    /// The source's cache; the driver then writes the block to the destination (with its
    /// dirty state) and drops it at the source — before the next request on the block.
    SourceThenMove,
    /// The disk subsystem; the driver then promotes the block into the destination.
    BackingThenPromote,
}

/// A block's state in the migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Cached at the source (`dirty`: newer than the disk), not at the destination.
    AtSource { dirty: bool },
    /// Being copied in the background (IM) from the source; still served from there.
    Copying { dirty: bool },
    /// At the destination only.
    AtDest,
}

/// What happened to a completed background copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyOutcome {
    /// It lands: the destination now holds the block (dirty as it was), the source drops
    /// its copy.
    Landed {
        /// Whether the block is dirty.
        dirty: bool,
    },
    /// A write overtook it: the destination holds newer data; the copy is discarded.
    Discarded,
}

/// One chunk's migration from a source node to a destination node.
#[derive(Debug, Clone)]
pub struct Migration {
    scheme: Scheme,
    blocks: FxHashMap<u64, State>,
    /// Blocks at the source not yet copied, in address order (IM's background copy).
    to_copy: Vec<u64>,
    next: usize,
}

impl Migration {
    /// A migration of the chunk whose blocks the source caches now (`(block, dirty)`).
    /// The destination's space is reserved by the caller before it starts (§3.6.1).
    pub fn new(scheme: Scheme, at_source: impl IntoIterator<Item = (u64, bool)>) -> Migration {
        let mut blocks = FxHashMap::default();
        let mut to_copy = Vec::new();
        for (b, dirty) in at_source {
            blocks.insert(b, State::AtSource { dirty });
            to_copy.push(b);
        }
        to_copy.sort_unstable();
        Migration { scheme, blocks, to_copy, next: 0 }
    }

    /// Blocks still cached at the source (its reserved capacity, §3.6).
    pub fn at_source(&self) -> usize {
        self.blocks.values().filter(|s| !matches!(s, State::AtDest)).count()
    }

    /// Whether the source holds nothing of the chunk any more (its space can be freed).
    pub fn done(&self) -> bool {
        self.at_source() == 0
    }

    /// A read of block `b`.
    pub fn read(&mut self, b: u64) -> ReadFrom {
        match self.blocks.get(&b).copied() {
            Some(State::AtDest) => ReadFrom::Dest,
            Some(State::AtSource { .. }) => {
                self.blocks.insert(b, State::AtDest);
                ReadFrom::SourceThenMove
            }
            // A read of a block being copied is served from the source (it is current
            // there) and moves it now; the copy in flight will find it at the destination.
            Some(State::Copying { .. }) => {
                self.blocks.insert(b, State::AtDest);
                ReadFrom::SourceThenMove
            }
            None => {
                self.blocks.insert(b, State::AtDest);
                ReadFrom::BackingThenPromote
            }
        }
    }

    /// A write of block `b`: it goes to the destination (dirty there, write-back) and the
    /// source's copy, if any, is dropped (§3.6.1); a copy in flight is overtaken.
    pub fn write(&mut self, b: u64) {
        self.blocks.insert(b, State::AtDest);
    }

    /// IM: the next block to copy in the background (`None`: none left, or Gradual).
    /// The driver reads it at the source and writes it at the destination, then calls
    /// [`Self::copy_done`]. A block is copied at most once: a write or read that moves it
    /// first leaves it at the destination, and its copy is then discarded.
    pub fn next_copy(&mut self) -> Option<u64> {
        if self.scheme != Scheme::Instant {
            return None;
        }
        while self.next < self.to_copy.len() {
            let b = self.to_copy[self.next];
            self.next += 1;
            if let Some(State::AtSource { dirty }) = self.blocks.get(&b).copied() {
                self.blocks.insert(b, State::Copying { dirty });
                return Some(b);
            }
        }
        None
    }

    /// The background copy of `b` completed.
    pub fn copy_done(&mut self, b: u64) -> CopyOutcome {
        match self.blocks.get(&b).copied() {
            Some(State::Copying { dirty }) => {
                self.blocks.insert(b, State::AtDest);
                CopyOutcome::Landed { dirty }
            }
            _ => CopyOutcome::Discarded,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn gradual_moves_on_access_and_instant_copies_in_address_order() {
        let mut g = Migration::new(Scheme::Gradual, [(3, true), (1, false)]);
        assert_eq!(g.next_copy(), None, "GM copies nothing by itself");
        assert_eq!(g.read(1), ReadFrom::SourceThenMove);
        assert_eq!(g.read(1), ReadFrom::Dest);
        assert_eq!(g.read(7), ReadFrom::BackingThenPromote);
        assert_eq!(g.at_source(), 1);
        g.write(3);
        assert!(g.done());
        let mut i = Migration::new(Scheme::Instant, [(9, false), (2, true), (5, false)]);
        let b = i.next_copy().unwrap();
        assert_eq!(b, 2);
        assert_eq!(i.copy_done(b), CopyOutcome::Landed { dirty: true }, "dirty moves dirty");
        let b = i.next_copy().unwrap();
        assert_eq!(b, 5);
        i.write(5); // overtakes the copy in flight
        assert_eq!(i.copy_done(b), CopyOutcome::Discarded);
        assert_eq!(i.read(5), ReadFrom::Dest);
        assert_eq!(i.read(9), ReadFrom::SourceThenMove, "read before its copy: moved by the read");
        assert_eq!(i.next_copy(), None, "9 is at the destination already");
        assert!(i.done());
    }

    /// Steps of the data model.
    #[derive(Debug, Clone)]
    enum Step {
        Read(u64),
        Write(u64),
        StartCopy,
        FinishCopy(usize),
        WriteBackDest(u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => (0u64..12).prop_map(Step::Read),
            3 => (0u64..12).prop_map(Step::Write),
            2 => Just(Step::StartCopy),
            2 => any::<usize>().prop_map(Step::FinishCopy),
            1 => (0u64..12).prop_map(Step::WriteBackDest),
        ]
    }

    proptest! {
        /// Against a versioned data model: the source and destination caches and the
        /// disk hold versions; copies take the source's version when they start and
        /// land when they complete, interleaved with reads and writes. Every read returns
        /// the last written version; a discarded copy never overwrites newer data; when
        /// the migration is done the source holds nothing, and every block's newest
        /// version is at the destination or on the disk (dirty data is never lost).
        #[test]
        fn no_read_is_stale_and_nothing_is_lost(
            scheme in prop::sample::select(vec![Scheme::Gradual, Scheme::Instant]),
            cached in prop::collection::btree_map(0u64..12, any::<bool>(), 0..10),
            steps in prop::collection::vec(step(), 0..80),
        ) {
            let mut latest: BTreeMap<u64, u64> = BTreeMap::new();
            let mut disk: BTreeMap<u64, u64> = BTreeMap::new();
            let mut src: BTreeMap<u64, (u64, bool)> = BTreeMap::new();
            let mut dst: BTreeMap<u64, (u64, bool)> = BTreeMap::new();
            // Initial state: cached blocks at version 1; dirty ones newer than the disk.
            for (&b, &dirty) in &cached {
                latest.insert(b, 1);
                disk.insert(b, if dirty { 0 } else { 1 });
                src.insert(b, (1, dirty));
            }
            let mut m = Migration::new(scheme, cached.iter().map(|(&b, &d)| (b, d)));
            let mut flying: Vec<(u64, (u64, bool))> = Vec::new();
            let mut v = 1;
            let read_ok = |b: u64, got: u64, latest: &BTreeMap<u64, u64>| got == latest.get(&b).copied().unwrap_or(0);
            for s in steps {
                match s {
                    Step::Read(b) => match m.read(b) {
                        ReadFrom::Dest => {
                            let got = dst.get(&b).map(|x| x.0);
                            prop_assert!(got.is_some(), "read of {} sent to the destination, which lacks it", b);
                            prop_assert!(read_ok(b, got.unwrap(), &latest), "stale read of {} at the destination", b);
                        }
                        ReadFrom::SourceThenMove => {
                            let x = src.remove(&b);
                            prop_assert!(x.is_some(), "read of {} sent to the source, which lacks it", b);
                            let x = x.unwrap();
                            prop_assert!(read_ok(b, x.0, &latest), "stale read of {} at the source", b);
                            dst.insert(b, x);
                        }
                        ReadFrom::BackingThenPromote => {
                            prop_assert!(!src.contains_key(&b) && !dst.contains_key(&b), "disk read of {} while cached", b);
                            let got = disk.get(&b).copied().unwrap_or(0);
                            prop_assert!(read_ok(b, got, &latest), "stale disk read of {}", b);
                            dst.insert(b, (got, false));
                        }
                    },
                    Step::Write(b) => {
                        v += 1;
                        latest.insert(b, v);
                        m.write(b);
                        src.remove(&b);
                        dst.insert(b, (v, true));
                    }
                    Step::StartCopy => {
                        if let Some(b) = m.next_copy() {
                            let x = src.get(&b).copied();
                            prop_assert!(x.is_some(), "copy of {} not at the source", b);
                            flying.push((b, x.unwrap()));
                        }
                    }
                    Step::FinishCopy(k) => {
                        if !flying.is_empty() {
                            let (b, data) = flying.remove(k % flying.len());
                            match m.copy_done(b) {
                                CopyOutcome::Landed { dirty } => {
                                    prop_assert_eq!(dirty, data.1);
                                    prop_assert!(read_ok(b, data.0, &latest), "copy of {} landed stale", b);
                                    src.remove(&b);
                                    dst.insert(b, data);
                                }
                                CopyOutcome::Discarded => {}
                            }
                        }
                    }
                    Step::WriteBackDest(b) => {
                        if let Some(x) = dst.get_mut(&b) {
                            if x.1 {
                                disk.insert(b, x.0);
                                x.1 = false;
                            }
                        }
                    }
                }
                prop_assert_eq!(m.at_source(), src.len(), "the source's reserved capacity");
            }
            // Run the background copy to its end (IM), or touch every block (GM).
            loop {
                while let Some(b) = m.next_copy() {
                    let data = src[&b];
                    if let CopyOutcome::Landed { .. } = m.copy_done(b) {
                        src.remove(&b);
                        dst.insert(b, data);
                    }
                }
                for (b, data) in std::mem::take(&mut flying) {
                    if let CopyOutcome::Landed { .. } = m.copy_done(b) {
                        src.remove(&b);
                        dst.insert(b, data);
                    }
                }
                let left: Vec<u64> = src.keys().copied().collect();
                if left.is_empty() { break; }
                for b in left {
                    prop_assert_eq!(m.read(b), ReadFrom::SourceThenMove);
                    let x = src.remove(&b).unwrap();
                    dst.insert(b, x);
                }
            }
            prop_assert!(m.done());
            for (&b, &want) in &latest {
                let newest = match dst.get(&b) {
                    Some(&(ver, dirty)) => { if !dirty { prop_assert_eq!(disk.get(&b).copied().unwrap_or(0), ver); } ver }
                    None => disk.get(&b).copied().unwrap_or(0),
                };
                prop_assert_eq!(newest, want, "block {} lost its last write", b);
            }
        }
    }
}
