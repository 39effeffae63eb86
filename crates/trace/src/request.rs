//! The one normalized request type every reader produces and every driver consumes.
//!
//! A request is a byte range of one VM's virtual disk at a point in time. Readers never
//! split requests into cache blocks; the engine does that (see `cachevisor-engine`).

use serde::{Deserialize, Serialize};

/// Dense VM / vDisk identifier, an index into the stream's VM name table.
pub type VmId = u32;

/// Direction of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// Read from the virtual disk.
    Read,
    /// Write to the virtual disk.
    Write,
}

impl Op {
    /// `true` for [`Op::Write`].
    pub fn is_write(self) -> bool {
        matches!(self, Op::Write)
    }
}

/// One block I/O request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Request {
    /// Timestamp in nanoseconds from the trace's own origin.
    pub time_ns: u64,
    /// Which VM / vDisk issued it.
    pub vm: VmId,
    /// Read or write.
    pub op: Op,
    /// Byte offset on the virtual disk.
    pub offset: u64,
    /// Length in bytes (never 0 for requests readers emit).
    pub len: u32,
}

impl Request {
    /// One past the last byte this request touches.
    pub fn end(&self) -> u64 {
        self.offset + self.len as u64
    }
}
