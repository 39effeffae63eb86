//! Scenario files (TOML): everything a simulation needs, with defaults for all but the
//! traces, validated with messages that name the key. The parsed scenario is embedded in
//! every result file, so a run can be repeated exactly.
//!
//! ```toml
//! [cache]
//! size = "256MiB"          # total SSD cache
//! block_size = "4KiB"      # 512B ..= 1MiB, power of two
//! replacement = "clock"    # lru | fifo | clock | two-pool | s3fifo; unset: the allocator's own
//! write_policy = "wb"      # wb | wt | wa | ro (wi = ro)
//! partition = "static"     # static (per-VM targets ∝ weight) | shared (unmanaged)
//! fill = "block"           # block | request
//! allocator = "static"     # see `cachevisor_policy::registry::NAMES`
//! reallocate = true        # re-run the allocator every window (default: the policy's own
//!                          # choice — s-cave, eci-cache, centaur, symflex-proportional do)
//! params = { m = 5 }       # the allocator's parameters over the seed's defaults
//! objects = "blocks"       # blocks | nutanix-dsf (HM1/HM3 metadata objects, open loop)
//! lookahead = false        # oracle: allocate on the coming window's curves (open loop:
//!                          # by trace time; closed: each VM's next requests, at its pace)
//!
//! [devices]
//! ssd = "860-evo"          # preset name or an inline table (see DeviceSpec)
//! backing = "hdd-7200"
//! backing_layout = "per-vm" # per-vm (one backing device per VM) | shared
//! ssd_count = 1            # cache devices of the `ssd` model, the cache split equally
//! mirror_dirty = true      # dirty data on two devices (the daemon's default with two or
//!                          # more; refused with one)
//! ram = "1GiB"             # a RAM tier of clean copies in front of the SSDs (unset: none)
//! ram_fill = "every-hit"   # every-hit | second-hit: which SSD hits copy a block to RAM
//! ram_device = "dram"      # the RAM tier's model
//!
//! [replay]
//! mode = "closed"          # open (trace timestamps / speedup) | closed (queue_depth per VM)
//! speedup = 1.0
//! queue_depth = 4
//! window = "1s"            # metrics/allocation window: virtual time, or "128req" (requests)
//! max_requests = 0         # 0 = whole trace
//! repeat_for = "600s"      # closed loop: replay each VM's trace repeatedly this long
//!
//! [trace]
//! files = ["../shared/traces/websearch-small.mqsim.txt"]
//! vm_mode = "file"         # file | device
//!
//! [[synthetic]]            # extra VMs from Nutanix-schema YAML files
//! config = "workload.yaml"
//!
//! [[vm]]                   # per-VM settings by name
//! name = "websearch-small"
//! weight = 2.0
//! ratio = 3.0              # target share of hit throughput (symflex-proportional)
//! min = "16MiB"            # smallest allocation
//! sequential_cutoff = "4MiB" # contiguous runs longer than this bypass the cache
//! write_policy = "ro"
//!
//! [failover]               # the node fails and the VMs resume on a cold, prewarmed
//! at = "30min"             # node: see `failover.rs` for every key
//!
//! [[phase]]                # settings that change at a point in virtual time
//! at = "370s"
//! vm = [{ name = "websearch-small", ratio = 4.0 }]
//! ```

use crate::device::DeviceSpec;
use cachevisor_engine::AdmissionPolicy;
use cachevisor_engine::{FillMode, PartitionMode, ReplacementKind, WritePolicy};
use cachevisor_trace::formats::generic_csv::CsvColumns;
use cachevisor_trace::units::{parse_duration_ns, parse_size};
use cachevisor_trace::{Format, VmMode};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use cachevisor_engine::cache_settings::DEFAULT_WRITEBACK_AHEAD;

/// `[cache]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheSection {
    /// Total SSD cache size (`4GiB`).
    pub size: String,
    /// Block size (`4KiB`).
    pub block_size: String,
    /// Replacement policy of the partitions (or the shared pool). Unset: the allocator's
    /// own ([`CacheSection::replacement`]; `Allocator::replacement`: S3-FIFO for
    /// `adaptive`, CLOCK for S-CAVE, LRU otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replacement: Option<ReplacementKind>,
    /// Default write policy.
    pub write_policy: WritePolicy,
    /// Static partitions or one shared pool.
    pub partition: PartitionMode,
    /// What a read miss fills.
    pub fill: FillMode,
    /// Allocation policy for static partitions (`cachevisor_policy::registry::NAMES`).
    /// Curve-driven policies get whole-trace curves from a pre-pass, or recent curves
    /// every window when they reallocate.
    pub allocator: String,
    /// Re-run the allocator at every metrics window (`replay.window`) on each VM's recent
    /// estimates (exact distances, counts halved each window; rECS; miss and hit rates)
    /// instead of only when VMs arrive. An online controller: it sees the past, not the
    /// coming window. Unset: the policy's own default (`Allocator::every_interval`).
    pub reallocate: Option<bool>,
    /// The allocator's parameters over its seed's defaults (`[cache.params]`, e.g.
    /// `m = 5`, `alpha = 0.8` for s-cave; `raw_threshold = 0.1`, `raw_band = 0.03` for eci-cache; `gain`,
    /// `max_step`, `deadband` for symflex-proportional).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, f64>,
    /// Offline oracle: every window, the allocator reads the curves of the window to come
    /// (exact, from a pre-pass) instead of the past — with `optimal`, the per-interval
    /// upper bound. Open loop only (windows must map to trace time).
    pub lookahead: bool,
    /// The daemon's crash-consistent mode: a durable reserve of free slots kept ahead of
    /// need, a miss that finds none bypasses until the next commit, rewrites of
    /// journaled blocks wait for intent commits, and commits are writes to the cache SSD.
    /// Off: the engine as a cache that forgets everything at a restart.
    pub persistent: bool,
    /// Write-back ahead of eviction: the dirty blocks among each VM's next this many
    /// victims are written back, one at a time, while nothing else of the VM is on its
    /// backing store (the engine's `set_writeback_ahead`); 0 turns it off.
    pub writeback_ahead: u32,
    /// The background flusher, as the daemon's (`cachevisor_engine::cache_settings`):
    /// bytes per second written back at most, in 100 ms steps (`16MiB`; `0` = off).
    pub flush_rate: String,
    /// Percent of the cache the flusher leaves dirty (`10`, as the daemon's).
    pub writeback_percent: f64,
    /// What the cache holds: data blocks, or the Nutanix DSF metadata objects
    /// (`dsf_objects.rs`: HM1 and HM3 lookups per 1 MiB vBlock; open loop only).
    pub objects: ObjectModel,
    /// Which read misses take a slot (`all`, `second-hit`, `second-hit:N`,
    /// `probability:P`, `write-budget:RATE`; the engine's `block_admission.rs`); unset: all of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionPolicy>,
    /// Which write misses take a slot; unset: as `admission`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_admission: Option<AdmissionPolicy>,
    /// Prefetch for sequential readers (`none`, `obl`, `amp`, `amp:N`; the engine's
    /// `block_prefetch.rs`); unset: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<cachevisor_engine::PrefetchPolicy>,
    /// Read misses go around the cache while its device's reads take longer than this on
    /// average (`"2ms"`; bcache's `congested_read_threshold_us`; the engine's
    /// `congestion.rs`); unset: never.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub congested_read_threshold: Option<String>,
    /// The same for write misses and the device's writes (`"20ms"`); unset: never.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub congested_write_threshold: Option<String>,
    /// The cache's SSD write budget shared across VMs by marginal hits per SSD write
    /// (`"50MiB/s"` or `"3dwpd"`; the engine's `shared_budget.rs`); unset: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_budget: Option<String>,
}

/// What a simulated cache holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ObjectModel {
    /// Blocks of the VMs' data.
    #[default]
    Blocks,
    /// Nutanix DSF metadata objects (the prewarming study's cache).
    NutanixDsf,
}

impl CacheSection {
    /// The keys it shares with the daemon's `[cache]`, for their one check.
    pub fn keys(&self) -> cachevisor_policy::cache_settings::CacheKeys<'_> {
        cachevisor_policy::cache_keys!(self)
    }

    /// The replacement policy in force: the one set, else the allocator's own (LRU for an
    /// allocator name the registry does not know; validation reports that).
    pub fn replacement(&self) -> ReplacementKind {
        self.replacement.unwrap_or_else(|| cachevisor_policy::registry::replacement_for(&self.allocator))
    }
}

impl Default for CacheSection {
    fn default() -> Self {
        CacheSection {
            size: "256MiB".into(),
            block_size: "4KiB".into(),
            replacement: None,
            write_policy: WritePolicy::Wb,
            partition: PartitionMode::Static,
            fill: FillMode::Block,
            allocator: "static".into(),
            reallocate: None,
            params: BTreeMap::new(),
            lookahead: false,
            persistent: false,
            writeback_ahead: DEFAULT_WRITEBACK_AHEAD,
            flush_rate: cachevisor_engine::cache_settings::default_flush_rate(),
            writeback_percent: cachevisor_engine::cache_settings::DEFAULT_WRITEBACK_PERCENT,
            objects: ObjectModel::Blocks,
            admission: None,
            write_admission: None,
            prefetch: None,
            congested_read_threshold: None,
            congested_write_threshold: None,
            write_budget: None,
        }
    }
}

/// A device given by preset name or in full.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DeviceChoice {
    /// One of [`DeviceSpec::PRESETS`].
    Preset(String),
    /// Full parameters.
    Spec(DeviceSpec),
}

impl DeviceChoice {
    /// The parameters.
    pub fn resolve(&self) -> Result<DeviceSpec, String> {
        let spec = match self {
            DeviceChoice::Preset(p) => DeviceSpec::preset(p)?,
            DeviceChoice::Spec(s) => s.clone(),
        };
        spec.validate().map_err(|e| format!("{}: {e}", spec.name()))?;
        Ok(spec)
    }
}

/// Where VMs' backing data lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackingLayout {
    /// Each VM has its own backing device.
    PerVm,
    /// All VMs share one backing device.
    Shared,
}

/// `[devices]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DevicesSection {
    /// The cache device.
    pub ssd: DeviceChoice,
    /// The backing device (model of each VM's, or the shared one).
    pub backing: DeviceChoice,
    /// One backing device per VM or one for all.
    pub backing_layout: BackingLayout,
    /// Cache devices of the `ssd` model the cache is split over, in equal parts
    /// (1 ..= 64): each its own queue, one allocation over all (`device_placement.rs`).
    #[serde(skip_serializing_if = "is_one")]
    pub ssd_count: u32,
    /// Dirty data mirrored on two devices, as the daemon's `cache.mirror_dirty`
    /// (`dirty_mirror.rs`): unset, on with two or more devices; refused with one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mirror_dirty: Option<bool>,
    /// A RAM tier in front of the cache devices (`"4GiB"`; unset: none), as the daemon's
    /// `cache.ram` (`ram_tier.rs`): clean copies of hot blocks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ram: Option<String>,
    /// When an SSD hit fills the RAM tier: `every-hit` (CacheLib's rule) or `second-hit`.
    #[serde(skip_serializing_if = "is_every_hit")]
    pub ram_fill: cachevisor_engine::RamFill,
    /// The RAM tier's device model (preset `dram`).
    #[serde(skip_serializing_if = "is_dram")]
    pub ram_device: DeviceChoice,
}

fn is_every_hit(f: &cachevisor_engine::RamFill) -> bool {
    *f == cachevisor_engine::RamFill::EveryHit
}

fn is_dram(d: &DeviceChoice) -> bool {
    matches!(d, DeviceChoice::Preset(p) if p == "dram")
}

impl DevicesSection {
    /// Whether dirty data is mirrored (the daemon's rule); the error names the key.
    pub fn mirrors(&self) -> Result<bool, String> {
        match (self.mirror_dirty, self.ssd_count > 1) {
            (Some(true), false) => {
                Err("devices.mirror_dirty: mirroring needs two or more devices (devices.ssd_count)".into())
            }
            (Some(on), _) => Ok(on),
            (None, several) => Ok(several),
        }
    }

    /// `ram_fill` as the scenario spells it.
    pub fn ram_fill_name(&self) -> &'static str {
        match self.ram_fill {
            cachevisor_engine::RamFill::EveryHit => "filled on every SSD hit",
            cachevisor_engine::RamFill::SecondHit => "filled on a block's second SSD hit",
        }
    }

    /// The RAM tier's blocks of `block_size` bytes (0: none), at most the cache's
    /// `cache_blocks` (an inclusive tier holds no more); the error names the key.
    pub fn ram_blocks(&self, block_size: u64, cache_blocks: u64) -> Result<u64, String> {
        let Some(s) = &self.ram else { return Ok(0) };
        let bytes = parse_size(s).map_err(|e| format!("devices.ram: {e}"))?;
        if bytes == 0 {
            return Ok(0);
        }
        if bytes < block_size {
            return Err(format!("devices.ram: {s} holds no block of {block_size} bytes"));
        }
        if bytes / block_size > cache_blocks {
            return Err(format!(
                "devices.ram: {s} is more than the cache ({cache_blocks} blocks of {block_size} bytes): the RAM tier holds copies of cached blocks only"
            ));
        }
        Ok(bytes / block_size)
    }
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl Default for DevicesSection {
    fn default() -> Self {
        DevicesSection {
            ssd: DeviceChoice::Preset("860-evo".into()),
            backing: DeviceChoice::Preset("hdd-7200".into()),
            backing_layout: BackingLayout::PerVm,
            ssd_count: 1,
            mirror_dirty: None,
            ram: None,
            ram_fill: Default::default(),
            ram_device: DeviceChoice::Preset("dram".into()),
        }
    }
}

/// Replay discipline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplayMode {
    /// Requests arrive at their trace timestamps divided by `speedup`.
    Open,
    /// Each VM keeps `queue_depth` requests outstanding, ignoring timestamps.
    Closed,
}

/// `[replay]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReplaySection {
    /// Open or closed loop.
    pub mode: ReplayMode,
    /// Open loop: divide trace times by this (> 0).
    pub speedup: f64,
    /// Closed loop: outstanding requests per VM (1 ..= 1024).
    pub queue_depth: u32,
    /// Metrics and allocation window: virtual time (`1s`) or a request count (`128req`).
    pub window: String,
    /// Stop after this many requests (0 = all).
    pub max_requests: u64,
    /// Flush dirty blocks when the trace ends (background, counted).
    pub flush_at_end: bool,
    /// Closed loop: replay each VM's trace again and again until this much virtual time
    /// has passed (`600s`), counting passes (S-CAVE §VI-D's repeated runs). Unset: once.
    pub repeat_for: Option<String>,
    /// The replay model: `auto` (default: the cache model unless the scenario needs
    /// device time), `cache` or `full` (`model_choice.rs`).
    pub model: crate::model_choice::ModelChoice,
}

impl Default for ReplaySection {
    fn default() -> Self {
        ReplaySection {
            mode: ReplayMode::Closed,
            speedup: 1.0,
            queue_depth: 4,
            window: "1s".into(),
            max_requests: 0,
            flush_at_end: false,
            repeat_for: None,
            model: Default::default(),
        }
    }
}

/// `[trace]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct TraceSection {
    /// Trace files (relative paths are relative to the scenario file).
    pub files: Vec<PathBuf>,
    /// Force a format instead of detecting it.
    pub format: Option<Format>,
    /// One VM per file or per device key.
    pub vm_mode: Option<VmMode>,
    /// Skip and count malformed records.
    pub skip_bad: bool,
    /// blkparse action to keep (default `D`).
    pub blkparse_action: Option<String>,
    /// Generic CSV column mapping.
    pub csv_columns: Option<String>,
    /// VM renames.
    pub rename: BTreeMap<String, String>,
}

/// `[[synthetic]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyntheticSection {
    /// Nutanix-schema YAML file.
    pub config: PathBuf,
    /// Later workloads of the same VM: from `at`, the VM runs `config` instead (a working
    /// set change, SymFlex §5.2's fourth window).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub then: Vec<WorkloadChange>,
}

/// A VM's workload from a point in time on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadChange {
    /// Nutanix-schema YAML file.
    pub config: PathBuf,
    /// When it starts (`735s`), trace time from the VM's start.
    pub at: String,
}

/// `[[vm]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmSection {
    /// VM name as the trace names it (after renames).
    pub name: String,
    /// Share of the cache relative to other VMs (static partitioning), > 0.
    #[serde(default = "one")]
    pub weight: f64,
    /// Target share of hit throughput relative to other VMs (SymFlex §5.2 SLA ratio), > 0.
    #[serde(default = "one")]
    pub ratio: f64,
    /// Smallest allocation (`16MiB`), honoured by every allocator when the minimums fit.
    pub min: Option<String>,
    /// Contiguous run (`4MiB`) after which the VM's stream stops taking cache slots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequential_cutoff: Option<String>,
    /// Write policy for this VM.
    pub write_policy: Option<WritePolicy>,
    /// Which of this VM's read misses take a slot (as `[cache] admission`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionPolicy>,
    /// Which of its write misses take a slot; unset: as its `admission`, else the cache's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_admission: Option<AdmissionPolicy>,
    /// Its prefetch (as `[cache] prefetch`); unset: the cache's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<cachevisor_engine::PrefetchPolicy>,
    /// Its I/O classes (`[[vm.class]]`: match by size, range, op; pinned, max_occupancy,
    /// admission; the engine's `io_class.rs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub class: Vec<cachevisor_engine::IoClassSection>,
    /// Cluster mode: the `[[node]]` it runs on (by name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

impl VmSection {
    /// A VM's section with every setting at its default.
    pub fn named(name: &str) -> VmSection {
        VmSection {
            name: name.into(),
            weight: 1.0,
            ratio: 1.0,
            min: None,
            sequential_cutoff: None,
            write_policy: None,
            admission: None,
            write_admission: None,
            prefetch: None,
            class: Vec::new(),
            node: None,
        }
    }
}

/// One VM's settings from a phase on: only the keys given change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmChange {
    /// VM name.
    pub name: String,
    /// New weight.
    pub weight: Option<f64>,
    /// New throughput ratio.
    pub ratio: Option<f64>,
    /// New write policy.
    pub write_policy: Option<WritePolicy>,
}

/// `[[phase]]`: settings that change at a point in virtual time (e.g. SymFlex's new
/// ratios at t = 370 min).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseSection {
    /// When (`370min`), virtual time from the start.
    pub at: String,
    /// Per-VM changes.
    #[serde(default)]
    pub vm: Vec<VmChange>,
}

fn one() -> f64 {
    1.0
}

/// A whole scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Scenario {
    /// Cache settings.
    pub cache: CacheSection,
    /// Devices.
    pub devices: DevicesSection,
    /// Replay discipline.
    pub replay: ReplaySection,
    /// Trace inputs.
    pub trace: TraceSection,
    /// Generated VMs.
    pub synthetic: Vec<SyntheticSection>,
    /// Per-VM settings.
    pub vm: Vec<VmSection>,
    /// Changes over time, in any order.
    pub phase: Vec<PhaseSection>,
    /// A node failure with prewarming on the destination (`failover.rs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failover: Option<crate::failover::FailoverSection>,
    /// Cluster mode: the nodes (`cluster_sim.rs`); none = one host.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub node: Vec<crate::cluster_scenario::NodeSection>,
    /// Cluster mode: how cache is shared across the nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<crate::cluster_scenario::ClusterSection>,
}

/// Windows a run keeps at most (each a row per VM in the result): past it the run is
/// refused — at its start when `replay.repeat_for` says how long it lasts, else when its
/// virtual time gets there.
pub const MAX_WINDOWS: u64 = 1_000_000;

/// Numbers resolved from a scenario's strings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Resolved {
    /// The `[cache]` settings shared with the daemon, checked once
    /// (`cachevisor_policy::cache_settings`).
    #[serde(flatten)]
    pub cache: cachevisor_policy::cache_settings::CacheSettings,
    /// Slots = cache / block (or DSF objects).
    pub slots: u64,
    /// Window ns.
    pub window_ns: u64,
    /// Windows of this many requests instead (`window = "128req"`, S-CAVE §VI-C).
    pub window_requests: Option<u64>,
    /// `replay.repeat_for` in ns (closed loop: replay each VM's trace this long).
    pub repeat_for_ns: Option<u64>,
}

impl Scenario {
    /// Reads a scenario file; relative paths inside become relative to its directory.
    pub fn load(path: &Path) -> Result<Scenario, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut s: Scenario = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        s.trace.files.iter_mut().for_each(fix);
        for x in s.synthetic.iter_mut() {
            fix(&mut x.config);
            x.then.iter_mut().for_each(|c| fix(&mut c.config));
        }
        Ok(s)
    }

    /// Each `[[phase]]`'s start in ns with its index, in time order; the error names
    /// the phase (`phase[2].at: …`). The check and the simulator both read them here.
    pub fn phase_times(&self) -> Result<Vec<(u64, usize)>, String> {
        let mut t = Vec::with_capacity(self.phase.len());
        for (i, p) in self.phase.iter().enumerate() {
            t.push((parse_duration_ns(&p.at).map_err(|e| format!("phase[{i}].at: {e}"))?, i));
        }
        t.sort();
        Ok(t)
    }

    /// Checks every value; the message names the key.
    pub fn resolve(&self) -> Result<Resolved, String> {
        let settings = cachevisor_policy::cache_settings::CacheSettings::check(&self.cache.keys())?;
        let (cache_bytes, block_size) = (settings.cache_bytes, settings.block_size);
        let slots = match self.cache.objects {
            ObjectModel::Blocks => cache_bytes / block_size,
            // Objects a cache of this size holds (`dsf_objects.rs`).
            ObjectModel::NutanixDsf => {
                cache_bytes / (1 << 20) * crate::dsf_objects::OBJECTS_PER_MIB
                    + cache_bytes % (1 << 20) * crate::dsf_objects::OBJECTS_PER_MIB / (1 << 20)
            }
        };
        settings.engine_config(slots)?;
        self.devices.ssd.resolve().map_err(|e| format!("devices.ssd: {e}"))?;
        let n = self.devices.ssd_count;
        if !(1..=64).contains(&n) {
            return Err(format!("devices.ssd_count: {n} is outside 1..=64"));
        }
        if u64::from(n) > slots {
            return Err(format!(
                "devices.ssd_count: {n} devices for a cache of {slots} blocks: at least one block each"
            ));
        }
        self.devices.backing.resolve().map_err(|e| format!("devices.backing: {e}"))?;
        let r = &self.replay;
        if !(r.speedup > 0.0 && r.speedup.is_finite()) {
            return Err(format!("replay.speedup: {} must be > 0", r.speedup));
        }
        if !(1..=1024).contains(&r.queue_depth) {
            return Err(format!("replay.queue_depth: {} is outside 1..=1024", r.queue_depth));
        }
        let window_requests = match r.window.trim().strip_suffix("req") {
            Some(n) => Some(
                n.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or(format!("replay.window: `{}` is not a positive request count", r.window))?,
            ),
            None => None,
        };
        let window_ns = if window_requests.is_some() {
            u64::MAX
        } else {
            parse_duration_ns(&r.window).map_err(|e| format!("replay.window: {e}"))?
        };
        if window_ns < 1_000_000 {
            // Each window runs the controller and writes a row: a trace of minutes in
            // windows of nanoseconds would never finish.
            return Err(format!("replay.window: `{}` is under 1ms (or give a request count: \"1000req\")", r.window));
        }
        let repeat_for_ns = match &r.repeat_for {
            Some(t) => {
                let ns = parse_duration_ns(t).map_err(|e| format!("replay.repeat_for: {e}"))?;
                if r.mode != ReplayMode::Closed {
                    return Err("replay.repeat_for: only the closed loop repeats traces (set mode = \"closed\")".into());
                }
                Some(ns)
            }
            None => None,
        };
        if let (Some(ns), None) = (repeat_for_ns, window_requests) {
            let windows = ns / window_ns;
            if windows > MAX_WINDOWS {
                return Err(format!(
                    "replay.window: `{}` over replay.repeat_for `{}` is {windows} windows, more than the {MAX_WINDOWS} a run keeps: use a larger window",
                    r.window,
                    r.repeat_for.as_deref().unwrap_or_default()
                ));
            }
        }
        if self.trace.files.is_empty() && self.synthetic.is_empty() {
            return Err("trace.files: no trace given (and no [[synthetic]] workload)".into());
        }
        if let Some(c) = &self.trace.csv_columns {
            c.parse::<CsvColumns>().map_err(|e| format!("trace.csv_columns: {e}"))?;
        }
        use cachevisor_policy::controller::check_share;
        for (i, v) in self.vm.iter().enumerate() {
            check_share(&format!("vm[{i}] ({}).weight", v.name), v.weight)?;
            check_share(&format!("vm[{i}] ({}).ratio", v.name), v.ratio)?;
            if let Some(m) = &v.min {
                parse_size(m).map_err(|e| format!("vm[{i}] ({}).min: {e}", v.name))?;
            }
            if let Some(m) = &v.sequential_cutoff {
                parse_size(m).map_err(|e| format!("vm[{i}] ({}).sequential_cutoff: {e}", v.name))?;
            }
            cachevisor_engine::IoClassSection::resolve_all(&v.class)
                .map_err(|e| format!("vm[{i}] ({}).{e}", v.name))?;
            let (read, write) = crate::simulator::admissions(&self.cache, Some(v));
            AdmissionPolicy::check_pair(read, write).map_err(|e| format!("vm[{i}] ({}): {e}", v.name))?;
        }
        for (key, v) in [
            ("congested_read_threshold", &self.cache.congested_read_threshold),
            ("congested_write_threshold", &self.cache.congested_write_threshold),
        ] {
            if let Some(v) = v {
                parse_duration_ns(v).map_err(|e| format!("cache.{key}: {e}"))?;
            }
        }
        if let Some(b) = &self.cache.write_budget {
            cachevisor_engine::BudgetRate::parse(b).map_err(|e| format!("cache.write_budget: {e}"))?;
        }
        let (read, write) = crate::simulator::admissions(&self.cache, None);
        AdmissionPolicy::check_pair(read, write).map_err(|e| format!("cache: {e}"))?;
        self.phase_times()?;
        for (i, p) in self.phase.iter().enumerate() {
            for c in &p.vm {
                for (key, v) in [("weight", c.weight), ("ratio", c.ratio)] {
                    if let Some(v) = v {
                        check_share(&format!("phase[{i}] ({}).{key}", c.name), v)?;
                    }
                }
            }
        }
        if self.cache.lookahead && r.mode == ReplayMode::Open && window_requests.is_some() {
            return Err("cache.lookahead: open loop needs a time window (the oracle cuts the trace by time)".into());
        }
        if self.cache.lookahead && r.mode == ReplayMode::Closed && r.repeat_for.is_some() {
            return Err(
                "cache.lookahead: not with replay.repeat_for (the closed-loop oracle reads each VM's trace once)"
                    .into(),
            );
        }
        if self.cache.objects == ObjectModel::NutanixDsf {
            if r.mode != ReplayMode::Open {
                return Err(
                    "cache.objects: the DSF object model replays open loop only (set replay.mode = \"open\")".into()
                );
            }
            if block_size != 4096 {
                return Err(
                    "cache.objects: the DSF object model reads 4 KiB objects (set cache.block_size = \"4KiB\")".into(),
                );
            }
        }
        if let Some(f) = &self.failover {
            let plan = f.resolve(block_size)?;
            if window_requests.is_none() && !plan.at_ns.is_multiple_of(window_ns) {
                return Err(format!(
                    "failover.at: `{}` must fall on a window boundary (replay.window = `{}`), so no window mixes the two nodes",
                    f.at, r.window
                ));
            }
            if self.cache.lookahead {
                return Err("failover: not with cache.lookahead (the oracle reads one node's future)".into());
            }
        }
        Ok(Resolved { cache: settings, slots, window_ns, window_requests, repeat_for_ns })
    }
}
