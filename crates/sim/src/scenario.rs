//! Scenario files (TOML): everything a simulation needs, with defaults for all but the
//! traces, validated with messages that name the key. The parsed scenario is embedded in
//! every result file, so a run can be repeated exactly.
//!
//! ```toml
//! [cache]
//! size = "256MiB"          # total SSD cache
//! block_size = "4KiB"      # 512B ..= 1MiB, power of two
//! replacement = "clock"    # lru | fifo | clock | two-pool | s3fifo
//! write_policy = "wb"      # wb | wt | wa | ro (wi = ro)
//! partition = "static"     # static (per-VM targets ∝ weight) | shared (unmanaged)
//! fill = "block"           # block | request
//! allocator = "static"     # static (weights) | optimal (exact DP) | symflex-weighted (fair share)
//! reallocate = false       # true: re-run the allocator every window on recent curves
//!
//! [devices]
//! ssd = "860-evo"          # preset name or an inline table (see DeviceSpec)
//! backing = "hdd-7200"
//! backing_layout = "per-vm" # per-vm (one backing device per VM) | shared
//!
//! [replay]
//! mode = "closed"          # open (trace timestamps / speedup) | closed (queue_depth per VM)
//! speedup = 1.0
//! queue_depth = 4
//! window = "1s"            # metrics window (virtual time)
//! max_requests = 0         # 0 = whole trace
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
//! write_policy = "ro"
//! ```

use crate::device::DeviceSpec;
use cachevisor_engine::{FillMode, PartitionMode, ReplacementKind, WritePolicy};
use cachevisor_trace::formats::generic_csv::CsvColumns;
use cachevisor_trace::units::{parse_duration_ns, parse_size};
use cachevisor_trace::{Format, VmMode};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `[cache]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheSection {
    /// Total SSD cache size (`4GiB`).
    pub size: String,
    /// Block size (`4KiB`).
    pub block_size: String,
    /// Replacement policy.
    pub replacement: ReplacementKind,
    /// Default write policy.
    pub write_policy: WritePolicy,
    /// Static partitions or one shared pool.
    pub partition: PartitionMode,
    /// What a read miss fills.
    pub fill: FillMode,
    /// Allocation policy for static partitions (see `cachevisor_policy::registry`):
    /// `static` (weighted shares), `optimal` (exact DP) or `symflex-weighted` (weighted
    /// fair share with redistribution). Curve-driven policies get whole-trace curves from
    /// a pre-pass, or recent curves every window with `reallocate`.
    pub allocator: String,
    /// Re-run the allocator at every metrics window (`replay.window`) on each VM's recent
    /// hit curve (exact distances, counts halved each window) instead of only when VMs
    /// arrive. An online controller: it sees the past, not the coming window.
    pub reallocate: bool,
}

impl Default for CacheSection {
    fn default() -> Self {
        CacheSection {
            size: "256MiB".into(),
            block_size: "4KiB".into(),
            replacement: ReplacementKind::Lru,
            write_policy: WritePolicy::Wb,
            partition: PartitionMode::Static,
            fill: FillMode::Block,
            allocator: "static".into(),
            reallocate: false,
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
}

impl Default for DevicesSection {
    fn default() -> Self {
        DevicesSection {
            ssd: DeviceChoice::Preset("860-evo".into()),
            backing: DeviceChoice::Preset("hdd-7200".into()),
            backing_layout: BackingLayout::PerVm,
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
    /// Metrics window in virtual time (`1s`).
    pub window: String,
    /// Stop after this many requests (0 = all).
    pub max_requests: u64,
    /// Flush dirty blocks when the trace ends (background, counted).
    pub flush_at_end: bool,
}

impl Default for ReplaySection {
    fn default() -> Self {
        ReplaySection { mode: ReplayMode::Closed, speedup: 1.0, queue_depth: 4, window: "1s".into(), max_requests: 0, flush_at_end: false }
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
    /// Write policy for this VM.
    pub write_policy: Option<WritePolicy>,
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
}

/// Numbers resolved from a scenario's strings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Resolved {
    /// Cache bytes.
    pub cache_bytes: u64,
    /// Block bytes.
    pub block_size: u64,
    /// Slots = cache / block.
    pub slots: u64,
    /// Window ns.
    pub window_ns: u64,
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
        s.synthetic.iter_mut().for_each(|x| fix(&mut x.config));
        Ok(s)
    }

    /// Checks every value; the message names the key.
    pub fn resolve(&self) -> Result<Resolved, String> {
        let cache_bytes = parse_size(&self.cache.size).map_err(|e| format!("cache.size: {e}"))?;
        let block_size = parse_size(&self.cache.block_size).map_err(|e| format!("cache.block_size: {e}"))?;
        let slots = cache_bytes.checked_div(block_size).unwrap_or(0);
        let engine = cachevisor_engine::EngineConfig { block_size, slots, ..cachevisor_engine::EngineConfig::with_slots(1) };
        engine.validate().map_err(|e| format!("cache: {e}"))?;
        cachevisor_policy::registry::build(&self.cache.allocator).map_err(|e| format!("cache.allocator: {e}"))?;
        self.devices.ssd.resolve().map_err(|e| format!("devices.ssd: {e}"))?;
        self.devices.backing.resolve().map_err(|e| format!("devices.backing: {e}"))?;
        let r = &self.replay;
        if !(r.speedup > 0.0 && r.speedup.is_finite()) {
            return Err(format!("replay.speedup: {} must be > 0", r.speedup));
        }
        if !(1..=1024).contains(&r.queue_depth) {
            return Err(format!("replay.queue_depth: {} is outside 1..=1024", r.queue_depth));
        }
        let window_ns = parse_duration_ns(&r.window).map_err(|e| format!("replay.window: {e}"))?;
        if window_ns == 0 {
            return Err("replay.window: must be > 0".into());
        }
        if self.trace.files.is_empty() && self.synthetic.is_empty() {
            return Err("trace.files: no trace given (and no [[synthetic]] workload)".into());
        }
        if let Some(c) = &self.trace.csv_columns {
            c.parse::<CsvColumns>().map_err(|e| format!("trace.csv_columns: {e}"))?;
        }
        for (i, v) in self.vm.iter().enumerate() {
            if !(v.weight > 0.0 && v.weight.is_finite()) {
                return Err(format!("vm[{i}] ({}): weight {} must be > 0", v.name, v.weight));
            }
        }
        Ok(Resolved { cache_bytes, block_size, slots, window_ns })
    }
}
