//! Per-vDisk counters of the data path, counted as replies leave (one source of truth for
//! the status API and the Prometheus collector), and the error threshold after which a
//! vDisk passes through to its backing store.

use super::{Core, Kind, Shared};
use cachevisor_engine::BlockOutcome;
use cachevisor_trace::VmId;

/// Per-export counters.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct ExportStats {
    /// Read requests.
    pub reads: u64,
    /// Write requests.
    pub writes: u64,
    /// Block accesses that hit.
    pub hit_blocks: u64,
    /// Block accesses.
    pub blocks: u64,
    /// Of the block accesses, by reads.
    pub read_blocks: u64,
    /// Of the hits, by reads.
    pub read_hit_blocks: u64,
    /// Of the block accesses, those that bypassed the cache (write-around, sequential
    /// cutoff, a miss that found no durable free slot).
    pub bypassed_blocks: u64,
    /// Of the block accesses, those that took a new cache slot.
    pub inserted_blocks: u64,
    /// Bytes read by clients.
    pub read_bytes: u64,
    /// Bytes written by clients.
    pub write_bytes: u64,
    /// Flushes.
    pub flushes: u64,
    /// TRIM requests.
    pub trims: u64,
    /// Device errors returned as EIO.
    pub errors: u64,
    /// The vDisk bypasses the cache after too many device errors: the engine's word
    /// (`Engine::bypass_cause`), filled as the counters are read (`DataPath::stats`).
    pub passthrough: bool,
}

/// Counts a reply to a request of `kind` of `len` bytes of `vm` with its block outcomes.
pub(super) fn count_reply(stats: &mut [ExportStats], vm: VmId, kind: Kind, len: u64, blocks: &[BlockOutcome]) {
    let Some(s) = stats.get_mut(vm as usize) else { return };
    let (n, hits) = (blocks.len() as u64, blocks.iter().filter(|b| b.hit).count() as u64);
    s.bypassed_blocks += blocks.iter().filter(|b| b.bypassed).count() as u64;
    s.inserted_blocks += blocks.iter().filter(|b| b.inserted).count() as u64;
    match kind {
        Kind::Read => {
            s.reads += 1;
            s.read_bytes += len;
            s.blocks += n;
            s.hit_blocks += hits;
            s.read_blocks += n;
            s.read_hit_blocks += hits;
        }
        Kind::Write => {
            s.writes += 1;
            s.write_bytes += len;
            s.blocks += n;
            s.hit_blocks += hits;
        }
        Kind::Flush => s.flushes += 1,
        Kind::Discard => s.trims += 1,
    }
}

impl Shared {
    /// Takes the engine's device-error counts into the counters and logs a vDisk the
    /// engine switched to pass-through at its error threshold
    /// (`Engine::set_error_threshold`): it keeps its dirty blocks cached (reads of them
    /// hit) until they are written back (the daemon's interval drains them).
    pub(super) fn count_errors(&self, core: &mut Core) {
        for vm in 0..core.stats.len() {
            let errors = core.engine.device_errors(vm as VmId);
            let s = &mut core.stats[vm];
            if errors == s.errors {
                continue;
            }
            let crossed = core.engine.error_threshold().is_some_and(|t| s.errors < t && errors >= t);
            s.errors = errors;
            let name = &core.names[vm];
            tracing::error!(vdisk = %name, errors, "device error");
            if crossed {
                let p = core.engine.partition(vm as VmId);
                tracing::error!(vdisk = %name, errors, cached = p.used, dirty = p.dirty_blocks, "error threshold reached: the vDisk passes through to its backing store from now on; its dirty blocks stay cached (reads of them hit) until they are written back");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_counts_its_hits_insertions_and_bypasses() {
        let b = |hit, inserted, bypassed| BlockOutcome { block: 0, hit, inserted, bypassed, evicted: None };
        let mut stats = vec![ExportStats::default(); 2];
        count_reply(
            &mut stats,
            1,
            Kind::Write,
            12288,
            &[b(true, false, false), b(false, true, false), b(false, false, true)],
        );
        count_reply(&mut stats, 1, Kind::Read, 4096, &[b(false, false, true)]);
        let s = stats[1];
        assert_eq!((s.writes, s.reads, s.blocks, s.hit_blocks), (1, 1, 4, 1));
        assert_eq!((s.inserted_blocks, s.bypassed_blocks, s.read_blocks), (1, 2, 1));
        assert_eq!(stats[0].blocks, 0);
    }
}
