//! What the daemon reports about itself — each vDisk's state and counters, write-back
//! progress — as the HTTP API returns it and the metrics collector reads it (a snapshot,
//! so neither depends on the daemon).

use crate::datapath::ExportStats;

/// One vDisk's state and counters, as the API and metrics report it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VdiskStatus {
    /// Export name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Write policy.
    pub write_policy: cachevisor_engine::WritePolicy,
    /// Cache blocks held.
    pub used_blocks: u64,
    /// Partition target in blocks.
    pub target_blocks: u64,
    /// Dirty blocks.
    pub dirty_blocks: u64,
    /// Dirty blocks written back ahead of eviction while the backing store was idle.
    pub written_back_ahead: u64,
    /// Cache block size in bytes (the unit of the block counts).
    pub block_size: u64,
    /// Counters.
    pub stats: ExportStats,
}

/// The daemon's state at one moment, for one metrics scrape.
#[derive(Debug, Clone)]
pub struct State {
    /// Every served vDisk.
    pub vdisks: Vec<VdiskStatus>,
    /// Blocks written back since the start (flusher, evictions, destage jobs).
    pub destaged_blocks: u64,
    /// The running (or last) destage job.
    pub destage_job: crate::destage_job::Progress,
    /// The running (or last) prewarm.
    pub prewarm: crate::prewarm_job::Progress,
}
