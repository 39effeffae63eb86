//! Results of a simulation: per-VM and total figures, the time series, and the scenario
//! that produced them; written as JSON and CSV and printed as a table for people.

use crate::device::Device;
use crate::metrics::{Metrics, VmStats, WindowRow};
use crate::scenario::{Resolved, Scenario};
use cachevisor_engine::Engine;
use cachevisor_trace::units::format_size;
use cachevisor_trace::SourceCounts;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::io::{self, Write};
use std::path::Path;

/// Latency summary in microseconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Latency {
    /// Requests measured.
    pub count: u64,
    /// Mean.
    pub mean_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// 99.99th percentile.
    pub p9999_us: f64,
    /// Largest.
    pub max_us: f64,
}

impl Latency {
    fn of(h: &Histogram<u64>) -> Self {
        let us = |ns: u64| (ns as f64 / 1e3 * 1000.0).round() / 1000.0;
        if h.is_empty() {
            return Latency {
                count: 0,
                mean_us: 0.0,
                p50_us: 0.0,
                p99_us: 0.0,
                p999_us: 0.0,
                p9999_us: 0.0,
                max_us: 0.0,
            };
        }
        Latency {
            count: h.len(),
            mean_us: (h.mean() / 1e3 * 1000.0).round() / 1000.0,
            p50_us: us(h.value_at_quantile(0.5)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            p9999_us: us(h.value_at_quantile(0.9999)),
            max_us: us(h.max()),
        }
    }
}

/// The figures of one VM (or of the total).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VmReport {
    /// VM name or `total`.
    pub vm: String,
    /// Requests.
    pub requests: u64,
    /// Read requests.
    pub reads: u64,
    /// Block hit ratio over reads and writes.
    pub hit_ratio: f64,
    /// Read block hit ratio.
    pub read_hit_ratio: f64,
    /// Write block hit ratio (block resident when written).
    pub write_hit_ratio: f64,
    /// Blocks accessed.
    pub blocks: u64,
    /// Blocks that bypassed the cache.
    pub bypassed_blocks: u64,
    /// Blocks inserted.
    pub inserted_blocks: u64,
    /// Blocks evicted.
    pub evicted_blocks: u64,
    /// Dirty extents written back.
    pub writebacks: u64,
    /// SSD bytes read.
    pub ssd_read_bytes: u64,
    /// SSD bytes written (endurance).
    pub ssd_write_bytes: u64,
    /// Of the block reads, the share served from the RAM tier (only with one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ram_read_hit_ratio: Option<f64>,
    /// Backing bytes read.
    pub backing_read_bytes: u64,
    /// Backing bytes written.
    pub backing_write_bytes: u64,
    /// Slots held at the end.
    pub final_used_blocks: u64,
    /// Dirty blocks at the end.
    pub final_dirty_blocks: u64,
    /// Latency of all requests.
    pub latency: Latency,
    /// Latency of reads.
    pub read_latency: Latency,
    /// Latency of writes.
    pub write_latency: Latency,
    /// Complete passes over the VM's trace (closed loop; `replay.repeat_for` repeats it).
    pub iterations: u64,
    /// Virtual time at which the first pass completed, seconds.
    pub first_iteration_s: Option<f64>,
    /// What the VM's entry policies did (admission, prefetch, congestion bypass, I/O
    /// classes), each only when it has one.
    #[serde(flatten)]
    pub entry: cachevisor_engine::EntryState,
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl VmReport {
    fn of(name: &str, s: &VmStats, used: u64, dirty: u64) -> Self {
        VmReport {
            vm: name.to_string(),
            requests: s.requests,
            reads: s.reads,
            hit_ratio: ratio(s.read_hits + s.write_hits, s.read_blocks + s.write_blocks),
            read_hit_ratio: ratio(s.read_hits, s.read_blocks),
            write_hit_ratio: ratio(s.write_hits, s.write_blocks),
            blocks: s.read_blocks + s.write_blocks,
            bypassed_blocks: s.bypassed,
            inserted_blocks: s.inserted,
            evicted_blocks: s.evictions,
            writebacks: s.writebacks,
            ssd_read_bytes: s.ssd_read_bytes,
            ssd_write_bytes: s.ssd_write_bytes,
            ram_read_hit_ratio: None,
            backing_read_bytes: s.backing_read_bytes,
            backing_write_bytes: s.backing_write_bytes,
            final_used_blocks: used,
            final_dirty_blocks: dirty,
            latency: Latency::of(&s.lat),
            read_latency: Latency::of(&s.read_lat),
            write_latency: Latency::of(&s.write_lat),
            iterations: 0,
            first_iteration_s: None,
            entry: Default::default(),
        }
    }
}

/// Engine facts for the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EngineReport {
    /// Slots.
    pub slots: u64,
    /// Block size.
    pub block_size: u64,
    /// Bytes of per-slot metadata.
    pub metadata_bytes: u64,
    /// Metadata bytes per slot.
    pub bytes_per_slot: f64,
    /// Dirty blocks written back ahead of eviction, in backing stores' idle time
    /// (`cache.writeback_ahead`).
    pub written_back_ahead: u64,
    /// Congestion bypass at the end of the run (only when a threshold is set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub congestion: Option<cachevisor_engine::CongestionState>,
    /// The cache's shared write budget at the end of the run (only when one is set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_budget: Option<cachevisor_engine::SharedBudgetState>,
    /// Mirrored dirty data (`devices.mirror_dirty`), when on: dirty blocks with a copy on
    /// another device at the end, and write-back writes that went through to the backing
    /// store for want of a mirror slot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mirror: Option<MirrorFigures>,
    /// The RAM tier (`devices.ram`), when there is one: its slots, copies at the end,
    /// reads it served, copies written, evicted and dropped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ram: Option<cachevisor_engine::RamStats>,
}

/// Mirrored dirty data's figures at the end of a run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MirrorFigures {
    /// Dirty blocks with their copy on another device.
    pub mirrored_blocks: u64,
    /// Write-back writes that went through for want of a mirror slot.
    pub fallbacks: u64,
}

/// Device utilization.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceReport {
    /// Role and model.
    pub device: String,
    /// Busy time / virtual run time (can exceed 1 for multi-channel devices).
    pub utilization: f64,
    /// Utilization per server (channel or head) over the whole run.
    pub load: f64,
    /// The longest an op waited in its queue, seconds: a device that was saturated, even
    /// only in bursts, makes ops wait for whole seconds and latencies measure the queue.
    pub max_queue_wait_s: f64,
    /// Bytes it read over the run.
    pub bytes_read: u64,
    /// Bytes it wrote over the run (a cache device's writes are its wear).
    pub bytes_written: u64,
}

/// Queue wait (seconds) from which a device counts as saturated.
pub const SATURATED_WAIT_S: f64 = 1.0;

/// Counters of one trace input.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceCounts {
    /// Requests read.
    pub requests: u64,
    /// Records without a request (headers, other actions, other SCSI commands).
    pub ignored: u64,
    /// Malformed records skipped.
    pub skipped_bad: u64,
}

impl From<SourceCounts> for TraceCounts {
    fn from(c: SourceCounts) -> Self {
        TraceCounts { requests: c.requests, ignored: c.ignored, skipped_bad: c.skipped_bad }
    }
}

/// Everything a run produced.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimResult {
    /// The scenario, as given.
    pub scenario: Scenario,
    /// Its resolved numbers.
    pub resolved: Resolved,
    /// Engine facts.
    pub engine: EngineReport,
    /// The replay model that ran (`model_choice.rs`): `full` or `cache` (no devices, no
    /// latency: the latency and device figures are then zero).
    #[serde(default)]
    pub model: crate::model_choice::Model,
    /// Why that model.
    #[serde(default)]
    pub model_reason: String,
    /// Virtual time from start to the last completion, seconds (the cache model: the
    /// last request's trace time).
    pub virtual_time_s: f64,
    /// Per input.
    pub traces: Vec<TraceCounts>,
    /// Devices.
    pub devices: Vec<DeviceReport>,
    /// Per VM.
    pub vms: Vec<VmReport>,
    /// All VMs.
    pub total: VmReport,
    /// Time series.
    pub windows: Vec<WindowRow>,
    /// Failover and prewarming figures (`[failover]` scenarios; the other figures are
    /// then the destination node's, or the source's in `warm` mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failover: Option<crate::failover::FailoverReport>,
}

impl SimResult {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn build(
        sc: &Scenario,
        res: Resolved,
        engine: &Engine,
        m: &Metrics,
        names: &[String],
        windows: Vec<WindowRow>,
        end_ns: u64,
        traces: Vec<TraceCounts>,
        ssds: &[std::cell::Ref<'_, Device>],
        backing: &[Device],
        ram: Option<&Device>,
    ) -> Self {
        let ram_on = ram.is_some();
        let ram_ratio = |r: &mut VmReport, s: &VmStats| {
            if ram_on {
                r.ram_read_hit_ratio = Some(ratio(s.ram_hits, s.read_blocks));
            }
        };
        let empty = VmStats::default();
        let mut total = VmStats::default();
        let (mut used, mut dirty) = (0, 0);
        let vms = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let s = m.vms.get(i).unwrap_or(&empty);
                total.merge(s);
                let p = engine.partition(i as u32);
                used += p.used;
                dirty += p.dirty_blocks;
                let mut r =
                    VmReport { entry: engine.entry_state(i as u32), ..VmReport::of(n, s, p.used, p.dirty_blocks) };
                ram_ratio(&mut r, s);
                r
            })
            .collect();
        let md = engine.metadata_bytes() as u64;
        let util = |d: &Device| if end_ns == 0 { 0.0 } else { d.busy_ns() as f64 / end_ns as f64 };
        let report = |device: String, d: &Device| DeviceReport {
            device,
            utilization: util(d),
            load: util(d) / d.servers() as f64,
            max_queue_wait_s: d.max_wait_ns() as f64 / 1e9,
            bytes_read: d.bytes_read(),
            bytes_written: d.bytes_written(),
        };
        let mut devices: Vec<DeviceReport> = ssds
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let which = if ssds.len() > 1 { format!(" #{i}") } else { String::new() };
                report(format!("ssd {}{which}", d.spec().name()), d)
            })
            .collect();
        if let Some(d) = ram {
            devices.push(report(format!("ram {}", d.spec().name()), d));
        }
        for (i, d) in backing.iter().enumerate() {
            let who = if backing.len() == 1 { "all".to_string() } else { names.get(i).cloned().unwrap_or_default() };
            devices.push(report(format!("backing {} ({who})", d.spec().name()), d));
        }
        SimResult {
            scenario: sc.clone(),
            resolved: res.clone(),
            engine: EngineReport {
                slots: res.slots,
                block_size: res.cache.block_size,
                metadata_bytes: md,
                bytes_per_slot: md as f64 / res.slots as f64,
                written_back_ahead: engine.written_back_ahead(),
                congestion: engine.congestion(),
                write_budget: engine.write_budget(),
                mirror: engine.mirror_dirty().then(|| MirrorFigures {
                    mirrored_blocks: engine.mirrored_blocks(),
                    fallbacks: engine.mirror_fallbacks(),
                }),
                ram: (ram_on).then(|| engine.ram_stats()),
            },
            model: Default::default(),
            model_reason: String::new(),
            virtual_time_s: end_ns as f64 / 1e9,
            traces,
            devices,
            vms,
            total: {
                let mut t = VmReport::of("total", &total, used, dirty);
                ram_ratio(&mut t, &total);
                t
            },
            windows,
            failover: None,
        }
    }

    /// The same, marked as run by `model` (chosen for `why`).
    pub(crate) fn with_model(mut self, model: crate::model_choice::Model, why: String) -> Self {
        self.model = model;
        self.model_reason = why;
        self
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("results serialize")
    }

    /// Writes `result.json` (everything, the scenario included), `scenario.toml` (the
    /// scenario that produced the run, to repeat it with `simulate --scenario`), and plain
    /// CSV with one header row: `vms.csv` and `windows.csv`.
    pub fn write_files(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("result.json"), self.to_json())?;
        let scenario = toml::to_string(&self.scenario).unwrap_or_default();
        std::fs::write(
            dir.join("scenario.toml"),
            format!("# The scenario of this run: cachevisor simulate --scenario scenario.toml\n{scenario}"),
        )?;
        let mut f = io::BufWriter::new(std::fs::File::create(dir.join("vms.csv"))?);
        writeln!(f, "vm,requests,reads,hit_ratio,read_hit_ratio,write_hit_ratio,mean_us,p50_us,p99_us,p999_us,p9999_us,ssd_read_bytes,ssd_write_bytes,backing_read_bytes,backing_write_bytes,evicted_blocks,writebacks,final_used_blocks,final_dirty_blocks")?;
        for v in self.vms.iter().chain(std::iter::once(&self.total)) {
            let l = &v.latency;
            writeln!(
                f,
                "{},{},{},{:.6},{:.6},{:.6},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                v.vm,
                v.requests,
                v.reads,
                v.hit_ratio,
                v.read_hit_ratio,
                v.write_hit_ratio,
                l.mean_us,
                l.p50_us,
                l.p99_us,
                l.p999_us,
                l.p9999_us,
                v.ssd_read_bytes,
                v.ssd_write_bytes,
                v.backing_read_bytes,
                v.backing_write_bytes,
                v.evicted_blocks,
                v.writebacks,
                v.final_used_blocks,
                v.final_dirty_blocks
            )?;
        }
        f.flush()?;
        let mut f = io::BufWriter::new(std::fs::File::create(dir.join("windows.csv"))?);
        writeln!(
            f,
            "window,t_end_s,vm,requests,accesses,hit_ratio,used_blocks,target_blocks,dirty_blocks,miss_blocks,recs"
        )?;
        for w in &self.windows {
            let recs = w.recs.map_or(String::new(), |r| format!("{r:.6}"));
            writeln!(
                f,
                "{},{},{},{},{},{:.6},{},{},{},{},{recs}",
                w.window,
                w.t_end_s,
                w.vm,
                w.requests,
                w.accesses,
                w.hit_ratio,
                w.used_blocks,
                w.target_blocks,
                w.dirty_blocks,
                w.miss_blocks
            )?;
        }
        f.flush()
    }

    /// A table for people: one row per VM and the total.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let r = &self.resolved;
        s.push_str(&format!(
            "cache {} in {} blocks ({} slots), {} / {} / {}, metadata {:.1} B/slot, {} blocks written back ahead of eviction, {:.2} s virtual\n",
            format_size(r.cache.cache_bytes),
            format_size(r.cache.block_size),
            r.slots,
            self.scenario.cache.replacement(),
            self.scenario.cache.write_policy,
            self.scenario.cache.partition.name(),
            self.engine.bytes_per_slot,
            self.engine.written_back_ahead,
            self.virtual_time_s
        ));
        s.push_str(&format!("model: {}, {}\n", self.model.name(), self.model_reason));
        s.push_str(&format!(
            "{:<24} {:>9} {:>7} {:>7} {:>7} {:>9} {:>9} {:>9} {:>10} {:>10}\n",
            "vm", "requests", "hit%", "rd hit%", "wr hit%", "mean µs", "p99 µs", "p99.9 µs", "SSD wr", "backing rd"
        ));
        let cache_model = self.model == crate::model_choice::Model::Cache;
        // The cache model times nothing: its latency columns are dashes, not zeros.
        let us = |x: f64| if cache_model { "-".to_string() } else { format!("{x:.1}") };
        for v in self.vms.iter().chain(std::iter::once(&self.total)) {
            s.push_str(&format!(
                "{:<24} {:>9} {:>7.2} {:>7.2} {:>7.2} {:>9} {:>9} {:>9} {:>10} {:>10}\n",
                truncate(&v.vm, 24),
                v.requests,
                v.hit_ratio * 100.0,
                v.read_hit_ratio * 100.0,
                v.write_hit_ratio * 100.0,
                us(v.latency.mean_us),
                us(v.latency.p99_us),
                us(v.latency.p999_us),
                format_size(v.ssd_write_bytes),
                format_size(v.backing_read_bytes)
            ));
        }
        let ssds: Vec<_> = self.devices.iter().filter(|d| d.device.starts_with("ssd ")).collect();
        if ssds.len() > 1 && !cache_model {
            for d in ssds {
                s.push_str(&format!(
                    "{}: {:.0}% busy per server, wrote {}, read {}\n",
                    d.device,
                    d.load * 100.0,
                    format_size(d.bytes_written),
                    format_size(d.bytes_read)
                ));
            }
        }
        if let Some(m) = self.engine.mirror {
            s.push_str(&format!(
                "dirty data mirrored on two devices: {} dirty blocks with a copy at the end, {} writes went through for want of a mirror slot\n",
                m.mirrored_blocks, m.fallbacks
            ));
        }
        if let Some(r) = self.engine.ram {
            s.push_str(&format!(
                "RAM tier of {} blocks ({}): {:.1}% of block reads served from it ({} hits), {} copies written, {} evicted, {} dropped as their blocks changed\n",
                r.slots,
                self.scenario.devices.ram_fill_name(),
                100.0 * self.total.ram_read_hit_ratio.unwrap_or(0.0),
                r.hits,
                r.fills,
                r.evictions,
                r.dropped
            ));
        }
        for w in self.saturation_warnings() {
            s.push_str(&format!("warning: {w}\n"));
        }
        s
    }

    /// A sentence per saturated device (an op waited [`SATURATED_WAIT_S`] or more in its
    /// queue): the offered load exceeded what it serves, at least in bursts, and latencies
    /// measure its queue.
    pub fn saturation_warnings(&self) -> Vec<String> {
        let open = self.scenario.replay.mode == crate::scenario::ReplayMode::Open;
        // Ops reach a device after their request's earlier ops, so a device downstream of
        // the bottleneck sees long waits too: name the busiest of those that waited.
        self.devices
            .iter()
            .filter(|d| d.max_queue_wait_s >= SATURATED_WAIT_S)
            .max_by(|a, b| a.load.total_cmp(&b.load))
            .into_iter()
            .map(|d| {
                let advice = if open { "; lower the speed-up (--speedup) or replay closed-loop (--mode closed)" } else { "" };
                format!(
                    "{} is saturated: an op waited {:.1} s in its queue ({:.0}% busy per server over the run), so latencies measure the queue{advice}",
                    d.device,
                    d.max_queue_wait_s,
                    d.load * 100.0
                )
            })
            .collect()
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let t: String = s.chars().take(n - 1).collect();
        format!("{t}…")
    }
}
