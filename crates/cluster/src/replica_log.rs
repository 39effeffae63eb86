//! The owner's side of a replica log, sans-IO ("durability beyond ELICA"): a
//! node whose write-back vDisks replicate writes their client writes into a log a peer
//! keeps (`replica_record.rs`) before acknowledging them, so losing either node loses no
//! acknowledged write — where ELICA keeps write-back data on one SSD only, and Nutanix's
//! OpLog, whose shape this follows (replicate before acknowledging; drain to the extent
//! store), is the model.
//!
//! This state machine decides, the daemon executes: which sequence numbers a write's
//! records get ([`ReplicaLog::reserve`]), and the steps ([`ReplicaLog::poll_action`]):
//!
//! - **Trim** (log half full): once every write with a record below the head `H` has
//!   been reported to the engine (so every block they dirtied is dirty there), write
//!   back every dirty block ([`Action::Destage`]), then make `H` the tail
//!   ([`Action::WriteSuperblock`]): the records below it are void, their data on the
//!   backing store.
//! - **Degrade** (an append or superblock write failed: the peer is lost or cut off):
//!   first tell the cluster the log may not be replayed ([`Action::Publish`] `valid:
//!   false`, in etcd, outside any lease, so it survives the owner); until that is
//!   durable, writes wait ([`Append::Wait`]: the stall); then writes go to the backing
//!   store themselves ([`Append::Bypass`]) — write-through — while the dirty blocks are
//!   drained.
//! - **Resync** (at start, and after a degrade): wait for reported writes, destage, start
//!   a new log (a new id, tail 0: every older record void) in the peer's region, publish
//!   `valid: true`, and append again.
//!
//! Why bypassed writes need no record: the cluster has been told not to replay the log
//! before the first one goes, and told it may again only after a destage that followed
//! them and a new log without their sectors' older records.

use crate::replica_record::{Geometry, Superblock};
use std::collections::BTreeMap;

/// What a write does about its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Append {
    /// Write records `first..first + n` (each at [`Geometry::offset_of`]), then report
    /// [`ReplicaLog::appended`].
    Granted(u64),
    /// The log is full until a trim ends: try again then.
    Full,
    /// The cluster is being told the log is not to be replayed: hold the write.
    Wait,
    /// Write the data to the backing store too (write-through) and acknowledge; no record.
    Bypass,
}

/// A step the driver runs, then reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Write back every block dirty now (of the replicated vDisks) and make it durable on
    /// the backing stores; then [`ReplicaLog::destaged`].
    Destage,
    /// Write this superblock into the peer's log, durably; then
    /// [`ReplicaLog::superblock_written`].
    WriteSuperblock(Superblock),
    /// Record in the cluster's store whether log `log_id` may be replayed; then
    /// [`ReplicaLog::published`].
    Publish {
        /// Whether it may.
        valid: bool,
        /// The log.
        log_id: u64,
    },
}

/// Where the log stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Writes append records.
    Healthy,
    /// Telling the cluster the log is invalid (writes wait).
    Degrading,
    /// The log is invalid in the cluster's view (writes bypass it) and being rebuilt.
    Resyncing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Waiting for every write with a record below `below` to be reported.
    Settle,
    Destage,
    Superblock,
    Publish,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Work {
    step: Step,
    /// Trim: the new tail. Resync: unused.
    below: u64,
    /// An action handed out and not reported yet.
    running: bool,
}

/// One owner's replica log.
#[derive(Debug, Clone)]
pub struct ReplicaLog {
    geometry: Geometry,
    log_id: u64,
    generation: u64,
    head: u64,
    tail: u64,
    health: Health,
    /// Records granted whose writes the engine has not been told of: first → count.
    unreported: BTreeMap<u64, u64>,
    work: Option<Work>,
    /// The next log's id (the driver's randomness: a restarted owner never reuses one).
    next_id: u64,
    /// A failed action is tried again at or after this time (ms).
    retry_at: u64,
    /// Writes bypassed while the log was invalid (for figures).
    pub bypassed: u64,
    /// Trims finished.
    pub trims: u64,
}

/// How long a failed publish or superblock write waits before it is tried again.
pub const RETRY_MS: u64 = 200;

impl ReplicaLog {
    /// A log in a region of `geometry`, at the owner's start: nothing is known of what the
    /// region holds, so it starts by degrading (writes wait until the cluster was told the
    /// old log is void, then bypass it) and resyncs into log `log_id` (random, never 0).
    pub fn new(geometry: Geometry, log_id: u64) -> ReplicaLog {
        ReplicaLog {
            geometry,
            log_id: 0,
            generation: 0,
            head: 0,
            tail: 0,
            health: Health::Degrading,
            unreported: BTreeMap::new(),
            work: None,
            next_id: log_id.max(1),
            retry_at: 0,
            bypassed: 0,
            trims: 0,
        }
    }

    /// Where it stands.
    pub fn health(&self) -> Health {
        self.health
    }

    /// The live log's id (0 before the first resync ended).
    pub fn log_id(&self) -> u64 {
        self.log_id
    }

    /// The ring's geometry.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Sets the ring's geometry while no log is live (the next resync starts one from 0):
    /// the peer's region's size is known only once it answers. `false` while healthy.
    pub fn set_geometry(&mut self, geometry: Geometry) -> bool {
        if self.health == Health::Healthy {
            return false;
        }
        self.geometry = geometry;
        true
    }

    /// Records in use (head − tail).
    pub fn used(&self) -> u64 {
        self.head - self.tail
    }

    /// What a write covering `n` records does now.
    pub fn reserve(&mut self, n: u64) -> Append {
        match self.health {
            Health::Degrading => Append::Wait,
            Health::Resyncing => {
                self.bypassed += 1;
                Append::Bypass
            }
            Health::Healthy if self.head + n - self.tail > self.geometry.slots => Append::Full,
            Health::Healthy => {
                let first = self.head;
                self.head += n;
                self.unreported.insert(first, n);
                Append::Granted(first)
            }
        }
    }

    /// Records `first..first + n` were written (`ok`) or not: a failure degrades the log.
    pub fn appended(&mut self, ok: bool) {
        if !ok {
            self.degrade();
        }
    }

    /// The write holding records from `first` was reported to the engine (after
    /// [`Self::appended`], whatever its outcome).
    pub fn reported(&mut self, first: u64) {
        self.unreported.remove(&first);
    }

    fn degrade(&mut self) {
        if self.health == Health::Healthy {
            self.health = Health::Degrading;
            self.work = None;
        }
    }

    /// The next action, at `now_ms` (none while one runs, or while nothing is due).
    pub fn poll_action(&mut self, now_ms: u64) -> Option<Action> {
        if now_ms < self.retry_at {
            return None;
        }
        if self.health == Health::Degrading {
            return match self.work {
                Some(w) if w.running => None,
                _ => {
                    self.work = Some(Work { step: Step::Publish, below: 0, running: true });
                    Some(Action::Publish { valid: false, log_id: self.log_id })
                }
            };
        }
        if self.work.is_none() {
            let trim = self.health == Health::Healthy && self.used() * 2 >= self.geometry.slots;
            if trim || self.health == Health::Resyncing {
                self.work = Some(Work { step: Step::Settle, below: self.head, running: false });
            }
        }
        let w = self.work.as_mut()?;
        if w.running {
            return None;
        }
        match w.step {
            Step::Settle => {
                let below = if self.health == Health::Resyncing { u64::MAX } else { w.below };
                if self.unreported.keys().next().is_some_and(|&first| first < below) {
                    return None;
                }
                w.step = Step::Destage;
                w.running = true;
                Some(Action::Destage)
            }
            Step::Destage => None,
            Step::Superblock => {
                w.running = true;
                Some(Action::WriteSuperblock(self.superblock_next()))
            }
            Step::Publish => {
                w.running = true;
                Some(Action::Publish { valid: true, log_id: self.next_id })
            }
        }
    }

    fn superblock_next(&self) -> Superblock {
        let w = self.work.expect("a superblock step");
        match self.health {
            Health::Resyncing => Superblock {
                generation: self.generation + 1,
                log_id: self.next_id,
                tail: 0,
                block: self.geometry.block,
            },
            _ => Superblock {
                generation: self.generation + 1,
                log_id: self.log_id,
                tail: w.below,
                block: self.geometry.block,
            },
        }
    }

    /// The destage ended (`ok`: every block dirty when it started is on the backing
    /// stores, durably).
    pub fn destaged(&mut self, now_ms: u64, ok: bool) {
        let Some(w) = self.work.as_mut() else { return };
        if w.step != Step::Destage {
            return;
        }
        w.running = false;
        if ok {
            w.step = Step::Superblock;
        } else {
            w.step = Step::Settle; // from the start, after a pause
            self.retry_at = now_ms + RETRY_MS;
        }
    }

    /// The superblock [`Action::WriteSuperblock`] named was written durably (`ok`) or not.
    pub fn superblock_written(&mut self, now_ms: u64, ok: bool) {
        let Some(w) = self.work else { return };
        if w.step != Step::Superblock {
            return;
        }
        let sb = self.superblock_next();
        if !ok {
            match self.health {
                Health::Healthy => self.degrade(),
                _ => {
                    self.work = Some(Work { running: false, ..w });
                    self.retry_at = now_ms + RETRY_MS;
                }
            }
            return;
        }
        self.generation = sb.generation;
        if self.health == Health::Resyncing {
            self.work = Some(Work { step: Step::Publish, below: 0, running: false });
        } else {
            self.tail = sb.tail;
            self.trims += 1;
            self.work = None;
        }
    }

    /// The cluster's store recorded what [`Action::Publish`] said (`ok`) or could not.
    pub fn published(&mut self, now_ms: u64, ok: bool) {
        let Some(w) = self.work else { return };
        if w.step != Step::Publish {
            return;
        }
        if !ok {
            self.work = Some(Work { running: false, ..w });
            self.retry_at = now_ms + RETRY_MS;
            return;
        }
        match self.health {
            Health::Degrading => {
                self.health = Health::Resyncing;
                self.work = None;
            }
            _ => {
                // The new log is live: records from 0 of `next_id`.
                self.health = Health::Healthy;
                self.log_id = self.next_id;
                self.next_id = self.next_id.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407).max(1);
                self.head = 0;
                self.tail = 0;
                self.work = None;
            }
        }
    }
}
