//! The RAM tier's memory (`cache.ram`, the engine's `ram_tier.rs`): one buffer of the
//! tier's blocks, its ops run at once under the data path's lock by the thread that takes
//! them from the engine (a copy of a few KiB: less than waking a device thread would
//! cost), and their completions handed straight back. Nothing here is durable: the tier
//! holds clean copies of blocks a cache device holds.
//!
//! Hand-written: a memcpy into and out of a `Vec` needs no library.

use super::{Bytes, Core, Shared};
use cachevisor_engine::{DeviceOp, Failure, OpKind};

/// The tier's bytes (allocated zeroed: pages are taken as copies land in them).
#[derive(Debug, Default)]
pub(super) struct RamMemory {
    bytes: Vec<u8>,
    block: u64,
}

impl RamMemory {
    /// Memory for `slots` blocks of `block` bytes (none when 0).
    pub(super) fn new(slots: u64, block: u64) -> RamMemory {
        RamMemory { bytes: vec![0; (slots * block) as usize], block }
    }

    /// The byte range `op` touches.
    fn range(&self, op: &DeviceOp) -> Option<std::ops::Range<usize>> {
        let at = op.ram_offset(self.block) as usize;
        let end = at.checked_add(op.len as usize)?;
        (end <= self.bytes.len()).then_some(at..end)
    }
}

impl Shared {
    /// Runs RAM-tier op `op` and reports it to the engine: a read's bytes are kept for its
    /// request as a device read's are; a write copies what its source read returned.
    pub(super) fn run_ram_op(&self, core: &mut Core, op: DeviceOp) {
        let result = match op.kind {
            OpKind::RamRead => match core.ram.range(&op) {
                Some(r) => {
                    let bytes: Bytes = (bytes::Bytes::copy_from_slice(&core.ram.bytes[r]), op.disk_addr);
                    if op.client {
                        if let Some(w) = core.waiting.get_mut(&op.req) {
                            w.reads.push(bytes.clone());
                        }
                    }
                    core.bufs.entry(op.req).or_default().insert(op.id, bytes);
                    Ok(())
                }
                None => Err(Failure::Io),
            },
            OpKind::RamWrite => {
                let source = op.source_id().and_then(|s| core.bufs.get(&op.req)?.get(&s)).cloned();
                match (source, core.ram.range(&op)) {
                    (Some((buf, base)), Some(r)) if op.disk_addr >= base => {
                        let from = (op.disk_addr - base) as usize;
                        match buf.get(from..from + op.len as usize) {
                            Some(data) => {
                                core.ram.bytes[r].copy_from_slice(data);
                                Ok(())
                            }
                            None => Err(Failure::Io),
                        }
                    }
                    _ => Err(Failure::Io),
                }
            }
            _ => unreachable!("{op:?} is no RAM-tier op"),
        };
        if result.is_err() {
            tracing::error!(?op, "a RAM-tier op found no bytes where the engine said (a bug): the copy is dropped");
        }
        let now = self.now();
        core.engine.handle_completion(now, op.handle(), result);
    }
}
