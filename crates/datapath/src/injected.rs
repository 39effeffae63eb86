//! What the data path is given from above instead of naming it: the devices of cache
//! stores that are not the local file ([`RemoteStores`]: a peer's lent region, ELICA
//! §3.1), and a log that must hold a client write before it is answered ([`WriteLog`]:
//! a replica on another node). The cluster implements both (`server/src/cluster/`); the
//! data path knows only these traits, so it never depends on the cluster, and a test can
//! inject a device or a log that fails on cue.

use cachevisor_engine::Device;
use cachevisor_trace::VmId;
use std::io;

/// A store's device as the data path runs it.
pub type StoreDevice = Box<dyn Device + Send + Sync>;

/// Opens the devices of cache stores on other nodes.
pub trait RemoteStores: Send + Sync {
    /// The device of the region node `node` (the engine's `StoreKind::Lent { node }`)
    /// lends, `size` bytes; `None` when no such node is known here.
    fn device(&self, node: u16, size: u64) -> Option<StoreDevice>;
}

/// The error of an op on another node's store (it failed, or was refused): that node's
/// trouble, reported once per failure window by its device, not per op by the data path.
#[derive(Debug)]
pub struct RemoteUnavailable(pub String);

impl std::fmt::Display for RemoteUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RemoteUnavailable {}

/// Whether `e` is another node's store failing ([`RemoteUnavailable`]).
pub fn is_remote_failure(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|x| x.is::<RemoteUnavailable>())
}

/// One record to log: a vDisk's disk byte range, with the bytes for a cache write (a
/// data record) or none for a backing write (a tombstone).
pub struct LogRecord {
    /// The vDisk.
    pub vm: VmId,
    /// Disk byte offset.
    pub offset: u64,
    /// Bytes covered.
    pub len: u32,
    /// The bytes (data record), or none (tombstone).
    pub data: Option<bytes::Bytes>,
}

/// What became of a write's records.
#[derive(Debug, PartialEq, Eq)]
pub enum Logged {
    /// In the log: acknowledge.
    Appended,
    /// The log is not usable: write the data through to the backing store, then
    /// acknowledge.
    Bypass,
}

/// Where a log delivers the outcomes of the writes it was given: (ticket, outcome), from
/// the log's own threads.
pub type LogOutcomes = Box<dyn Fn(Vec<(u64, io::Result<Logged>)>) + Send + Sync>;

/// A log of client writes kept before they are answered. The data path hands it a
/// write's records as the write's local part starts and holds the write's completion
/// until the log's outcome arrives (`logged_writes.rs`): no thread waits on the log.
pub trait WriteLog: Send + Sync {
    /// Whether `vm`'s client writes go to the log.
    fn covers(&self, vm: VmId) -> bool;
    /// Where the outcomes go (once, before the first [`Self::submit`]).
    fn attach(&self, outcomes: LogOutcomes);
    /// Queues write `ticket`'s records behind those queued before (a write the engine
    /// let start after another is logged after it); its outcome arrives at the attached
    /// sink later, never from within this call.
    fn submit(&self, ticket: u64, recs: Vec<LogRecord>);
    /// The local part of write `ticket` ended (its blocks are in the cache, or its
    /// write failed): its records count as reported to the engine once written.
    fn local_done(&self, ticket: u64);
}
