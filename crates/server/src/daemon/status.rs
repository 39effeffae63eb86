//! What the daemon reports about itself — each vDisk's state and counters, write-back
//! progress — as the HTTP API returns it and the metrics collector reads it (a snapshot,
//! so neither depends on the daemon).

use cachevisor_datapath::ExportStats;

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
    /// Share of the cache relative to the others (static, symflex-weighted).
    pub weight: f64,
    /// Target share of hit throughput (symflex-proportional).
    pub ratio: f64,
    /// Dirty blocks.
    pub dirty_blocks: u64,
    /// Dirty blocks written back ahead of eviction while the backing store was idle.
    pub written_back_ahead: u64,
    /// Its blocks with a copy in the RAM tier now (`cache.ram`; 0 without one).
    pub ram_blocks: u64,
    /// Block reads the RAM tier served since the start.
    pub ram_hit_blocks: u64,
    /// Cache block size in bytes (the unit of the block counts).
    pub block_size: u64,
    /// Counters.
    pub stats: ExportStats,
    /// What its entry policies did (admission, prefetch, congestion bypass, I/O classes),
    /// each only when it has one.
    #[serde(flatten)]
    pub entry: cachevisor_engine::EntryState,
}

/// The daemon's state at one moment, for one metrics scrape.
#[derive(Debug, Clone)]
pub struct State {
    /// Every served vDisk.
    pub vdisks: Vec<VdiskStatus>,
    /// Blocks written back since the start (flusher, evictions, destage jobs).
    pub destaged_blocks: u64,
    /// The background flusher's rate now, bytes per second.
    pub flush_rate_bytes: u64,
    /// The running (or last) destage job.
    pub destage_job: crate::destage_job::Progress,
    /// The running (or last) prewarm.
    pub prewarm: crate::prewarm_job::Progress,
    /// What the daemon refused or gave up on to protect itself.
    pub guards: GuardCounts,
    /// NBD_CMD_CACHE hints in blocks: queued, loaded, skipped (cached already), dropped.
    pub cache_hints: [u64; 4],
    /// The vSSD region, when there is one.
    pub vssd_region: Option<VssdRegionStatus>,
    /// This node's cluster state, when it is a node of one.
    pub cluster: Option<ClusterGauges>,
    /// The cache file: (1 while attached else 0, its size, the most it may grow to), bytes.
    pub cache: [u64; 3],
    /// Whether the cache file's I/O runs through io_uring, and the calls it made.
    pub ring: cachevisor_datapath::RingCounts,
    /// Congestion bypass, when a threshold is set.
    pub congestion: Option<cachevisor_engine::CongestionState>,
    /// The cache's shared write budget (`[cache] write_budget`), when set.
    pub write_budget: Option<cachevisor_engine::SharedBudgetState>,
    /// Mirrored dirty data (`cache.mirror_dirty`), when on.
    pub mirror: Option<crate::daemon::cache_swap::MirrorReport>,
    /// The RAM tier (`cache.ram`), when there is one.
    pub ram: Option<cachevisor_engine::RamStats>,
    /// Each device of a cache over several (none for one).
    pub devices: Vec<crate::daemon::cache_swap::CacheDeviceReport>,
}

/// A cluster node's state as gauges (`[cluster]`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClusterGauges {
    /// 1 while it holds a valid lease (serves peers), else 0 (fenced).
    pub serving: u64,
    /// 1 while it leads.
    pub leading: u64,
    /// The map epoch it is at.
    pub epoch: u64,
    /// Live members it sees.
    pub members: u64,
    /// Requests to etcd that failed.
    pub etcd_errors: u64,
    /// vDisks it serves whose claim another node holds.
    pub claim_conflicts: u64,
    /// Records read from etcd and ignored (`cluster/bad_records.rs`).
    pub bad_records: u64,
}

/// The vSSD region's share of the SSD (`vssd.budget`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VssdRegionStatus {
    /// Blocks in the region now (granted by the cache, or all of a region of its own).
    pub blocks: u64,
    /// The most it may hold now (its size, or a shared budget's weighted share).
    pub cap_blocks: u64,
    /// Cache slots withheld from the host cache for it (emptied or being emptied).
    pub withheld_slots: u64,
}

pub(crate) use crate::guards::GuardCounts;
