//! Prometheus metrics (`/metrics`): per-vDisk request latency histograms by operation,
//! observed as requests complete, and on every scrape the daemon's counters and gauges
//! (requests, block hits and misses and bytes by operation, flushes, trims, errors, cache held, target, dirty blocks,
//! pass-through, flusher and destage-job progress) read from its state by a collector, so there is one source of truth.

use crate::daemon::status::{State, VdiskStatus};

/// A counter's value for one `outcome` label.
type Outcome = (&'static str, u64);
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels of the latency histogram.
type OpLabels = Vec<(String, String)>;

/// The daemon's metrics.
#[derive(Debug)]
pub struct Metrics {
    latency: Family<OpLabels, Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics { latency: Family::new_with_constructor(|| Histogram::new(exponential_buckets(10e-6, 2.0, 18))) }
    }
}

/// The NBD (and vhost-user) latency histograms of `name`'s commands in `m`.
pub(crate) fn latency_of(m: &Metrics, name: &str) -> cachevisor_nbd::transmission::Latency {
    ["read", "write", "flush", "write_zeroes", "trim", "other"].map(|op| m.histogram(name, op))
}

impl Metrics {
    /// The histogram of `vdisk`'s `op` (a handle sharing the registered one): a connection
    /// takes its handles once, so recording a request allocates nothing.
    pub fn histogram(&self, vdisk: &str, op: &str) -> Histogram {
        self.latency.get_or_create(&vec![("vdisk".into(), vdisk.into()), ("op".into(), op.into())]).clone()
    }

    /// The text exposition of the latency histograms and of `state`.
    pub fn render(&self, state: State) -> String {
        let mut r = Registry::default();
        r.register(
            "cachevisor_request_duration_seconds",
            "Time to serve a request, by vDisk and operation",
            self.latency.clone(),
        );
        r.register_collector(Box::new(StateCollector(state)));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).expect("writing to a String");
        out
    }
}

/// The daemon's state taken for this scrape.
#[derive(Debug)]
struct StateCollector(State);

/// A metric family: name, help, and how to read its value.
type Metric<F> = (&'static str, &'static str, F);
/// Reads a vDisk's counter.
type ReadStatus<T> = fn(&VdiskStatus) -> T;
/// Reads a vDisk's (read, write) pair.
type ReadByOp = fn(&cachevisor_datapath::ExportStats) -> [u64; 2];

impl Collector for StateCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let status = &self.0.vdisks;
        let counters: [Metric<ReadStatus<u64>>; 9] = [
            ("cachevisor_reads", "Read requests", |s| s.stats.reads),
            ("cachevisor_writes", "Write requests", |s| s.stats.writes),
            ("cachevisor_flushes", "Flush requests", |s| s.stats.flushes),
            ("cachevisor_trims", "TRIM requests", |s| s.stats.trims),
            ("cachevisor_errors", "Device errors returned as EIO", |s| s.stats.errors),
            (
                "cachevisor_bypassed_blocks",
                "Block accesses that bypassed the cache (write-around, sequential cutoff, no durable free slot)",
                |s| s.stats.bypassed_blocks,
            ),
            ("cachevisor_inserted_blocks", "Block accesses that took a new cache slot", |s| s.stats.inserted_blocks),
            (
                "cachevisor_written_back_ahead_blocks",
                "Dirty blocks written back ahead of eviction while the backing store was idle",
                |s| s.written_back_ahead,
            ),
            ("cachevisor_ram_hit_blocks", "Block reads served from the RAM tier (cache.ram)", |s| s.ram_hit_blocks),
        ];
        for (name, help, f) in counters {
            let c0 = ConstCounter::new(0u64);
            let mut m = enc.encode_descriptor(name, help, None, c0.metric_type())?;
            for s in status {
                ConstCounter::new(f(s)).encode(m.encode_family(&vec![("vdisk".to_string(), s.name.clone())])?)?;
            }
        }
        // By operation: (read, write) values of each vDisk.
        let by_op: [Metric<ReadByOp>; 3] = [
            ("cachevisor_block_hits", "Block accesses served by the cache, by operation", |s| {
                [s.read_hit_blocks, s.hit_blocks - s.read_hit_blocks]
            }),
            ("cachevisor_block_misses", "Block accesses the cache did not serve, by operation", |s| {
                [s.read_blocks - s.read_hit_blocks, (s.blocks - s.read_blocks) - (s.hit_blocks - s.read_hit_blocks)]
            }),
            ("cachevisor_bytes", "Bytes read and written by clients", |s| [s.read_bytes, s.write_bytes]),
        ];
        for (name, help, f) in by_op {
            let c0 = ConstCounter::new(0u64);
            let mut m = enc.encode_descriptor(name, help, None, c0.metric_type())?;
            for s in status {
                for (op, v) in ["read", "write"].into_iter().zip(f(&s.stats)) {
                    ConstCounter::new(v).encode(m.encode_family(&vec![
                        ("vdisk".to_string(), s.name.clone()),
                        ("op".to_string(), op.to_string()),
                    ])?)?;
                }
            }
        }
        // Admission (`block_admission.rs`): misses admitted and rejected by operation, for
        // the vDisks with a policy other than `all`.
        let c0 = ConstCounter::new(0u64);
        let mut m = enc.encode_descriptor(
            "cachevisor_admission_misses",
            "Cache misses the vDisk's admission let in or sent around the cache, by operation and outcome",
            None,
            c0.metric_type(),
        )?;
        for s in status {
            let Some(a) = &s.entry.admission else { continue };
            let c = a.counts;
            for (op, outcome, v) in [
                ("read", "admitted", c.read_admitted),
                ("read", "rejected", c.read_rejected),
                ("write", "admitted", c.write_admitted),
                ("write", "rejected", c.write_rejected),
            ] {
                ConstCounter::new(v).encode(m.encode_family(&vec![
                    ("vdisk".to_string(), s.name.clone()),
                    ("op".to_string(), op.to_string()),
                    ("outcome".to_string(), outcome.to_string()),
                ])?)?;
            }
        }
        // Prefetch (`block_prefetch.rs`), for the vDisks that prefetch.
        let c0 = ConstCounter::new(0u64);
        let mut m = enc.encode_descriptor(
            "cachevisor_prefetch_blocks",
            "Blocks the vDisk's prefetch loaded, and of them those read and those evicted unread",
            None,
            c0.metric_type(),
        )?;
        for s in status {
            let Some(p) = &s.entry.prefetch else { continue };
            let c = p.counts;
            for (outcome, v) in [("loaded", c.loaded), ("used", c.used), ("wasted", c.wasted)] {
                ConstCounter::new(v).encode(m.encode_family(&vec![
                    ("vdisk".to_string(), s.name.clone()),
                    ("outcome".to_string(), outcome.to_string()),
                ])?)?;
            }
        }
        let mut m = enc.encode_descriptor(
            "cachevisor_prefetch_late_reads",
            "Reads that waited on a prefetch still loading their block",
            None,
            c0.metric_type(),
        )?;
        for s in status {
            let Some(p) = &s.entry.prefetch else { continue };
            ConstCounter::new(p.counts.late).encode(m.encode_family(&vec![("vdisk".to_string(), s.name.clone())])?)?;
        }
        // I/O classes (`io_class.rs`), for the vDisks that have them: blocks held, block
        // accesses by outcome, misses sent around by reason.
        let g0 = ConstGauge::new(0i64);
        let mut m = enc.encode_descriptor(
            "cachevisor_class_cached_blocks",
            "Cache blocks an I/O class holds",
            None,
            g0.metric_type(),
        )?;
        for s in status {
            for c in s.entry.classes.iter().flatten() {
                ConstGauge::new(c.cached_blocks as i64).encode(m.encode_family(&vec![
                    ("vdisk".to_string(), s.name.clone()),
                    ("class".to_string(), c.name.clone()),
                ])?)?;
            }
        }
        type ClassMetric =
            (&'static str, &'static str, &'static str, fn(&cachevisor_engine::ClassCounts) -> [(&'static str, u64); 2]);
        let class_counters: [ClassMetric; 2] = [
            (
                "cachevisor_class_block_accesses",
                "Block accesses of an I/O class's requests, by outcome",
                "outcome",
                |c| [("hit", c.hits), ("miss", c.misses)],
            ),
            (
                "cachevisor_class_rejected_misses",
                "Misses of an I/O class sent around the cache, by reason",
                "reason",
                |c| [("cap", c.rejected_at_cap), ("admission", c.rejected_by_admission)],
            ),
        ];
        for (name, help, label, f) in class_counters {
            let c0 = ConstCounter::new(0u64);
            let mut m = enc.encode_descriptor(name, help, None, c0.metric_type())?;
            for s in status {
                for c in s.entry.classes.iter().flatten() {
                    for (what, v) in f(c) {
                        ConstCounter::new(v).encode(m.encode_family(&vec![
                            ("vdisk".to_string(), s.name.clone()),
                            ("class".to_string(), c.name.clone()),
                            (label.to_string(), what.to_string()),
                        ])?)?;
                    }
                }
            }
        }
        // A write budget's controller (`write_budget.rs`), for the vDisks that have one.
        type Budget = fn(&cachevisor_engine::BudgetState) -> f64;
        let budget: [(&str, &str, Budget); 3] = [
            ("cachevisor_write_budget_target_bytes_per_second", "The vDisk's SSD write budget", |b| {
                b.target_bytes_per_sec
            }),
            ("cachevisor_write_budget_probability", "The probability a governed miss enters the cache now", |b| {
                b.probability
            }),
            ("cachevisor_write_budget_written_bytes", "SSD bytes the vDisk wrote since its budget was set", |b| {
                b.written_bytes as f64
            }),
        ];
        for (name, help, f) in budget {
            let g0 = ConstGauge::new(0f64);
            let mut m = enc.encode_descriptor(name, help, None, g0.metric_type())?;
            for s in status {
                let Some(b) = s.entry.admission.as_ref().and_then(|a| a.budget) else { continue };
                ConstGauge::new(f(&b)).encode(m.encode_family(&vec![("vdisk".to_string(), s.name.clone())])?)?;
            }
        }
        let gauges: [Metric<ReadStatus<i64>>; 4] = [
            ("cachevisor_cached_blocks", "Cache blocks held", |s| s.used_blocks as i64),
            ("cachevisor_target_blocks", "Partition target in blocks", |s| s.target_blocks as i64),
            ("cachevisor_dirty_blocks", "Dirty cache blocks", |s| s.dirty_blocks as i64),
            ("cachevisor_passthrough", "1 when the vDisk bypasses the cache after errors", |s| {
                s.stats.passthrough as i64
            }),
        ];
        for (name, help, f) in gauges {
            let g0 = ConstGauge::new(0i64);
            let mut m = enc.encode_descriptor(name, help, None, g0.metric_type())?;
            for s in status {
                ConstGauge::new(f(s)).encode(m.encode_family(&vec![("vdisk".to_string(), s.name.clone())])?)?;
            }
        }
        let destaged = ConstCounter::new(self.0.destaged_blocks);
        destaged.encode(enc.encode_descriptor(
            "cachevisor_destaged_blocks",
            "Dirty blocks written back (flusher, evictions, destage jobs)",
            None,
            destaged.metric_type(),
        )?)?;
        let rate = ConstGauge::new(self.0.flush_rate_bytes as i64);
        rate.encode(enc.encode_descriptor(
            "cachevisor_flush_rate_bytes_per_second",
            "The background flusher's write-back rate now (its PI controller's choice, at most cache.flush_rate)",
            None,
            rate.metric_type(),
        )?)?;
        let job = &self.0.destage_job;
        let job_gauges = [
            ("cachevisor_destage_job_running", "1 while a destage job runs", job.running as i64),
            (
                "cachevisor_destage_job_done_blocks",
                "Blocks the current (or last) destage job wrote back",
                job.done_blocks as i64,
            ),
            (
                "cachevisor_destage_job_total_blocks",
                "Blocks the current (or last) destage job has to write back in all",
                job.total_blocks as i64,
            ),
        ];
        let pw = &self.0.prewarm;
        let prewarm_gauges = [
            ("cachevisor_prewarm_running", "1 while a prewarm runs", pw.running as i64),
            (
                "cachevisor_prewarm_planned_blocks",
                "Blocks in the current (or last) prewarm set",
                pw.planned_blocks as i64,
            ),
            (
                "cachevisor_prewarm_loaded_blocks",
                "Blocks the current (or last) prewarm loaded",
                pw.loaded_blocks as i64,
            ),
            (
                "cachevisor_prewarm_skipped_blocks",
                "Blocks the current (or last) prewarm found cached or in use",
                pw.skipped_blocks as i64,
            ),
            (
                "cachevisor_prewarm_read_bytes",
                "Bytes the current (or last) prewarm read from backing",
                pw.read_bytes as i64,
            ),
        ];
        let [attached, size, max_size] = self.0.cache.map(|v| v as i64);
        let cache_gauges = [
            (
                "cachevisor_cache_attached",
                "1 while the cache file is in use; 0 while it is detached or being swapped (every vDisk passes through)",
                attached,
            ),
            ("cachevisor_cache_size_bytes", "The cache's size now (cache.size, as a reload last resized it)", size),
            ("cachevisor_cache_max_size_bytes", "The most the cache may grow to while running (cache.max_size)", max_size),
            (
                "cachevisor_cache_io_uring",
                "1 while the cache file's I/O runs through io_uring (O_DIRECT, cache.io_uring, a kernel that allows it); 0 on device threads",
                i64::from(self.0.ring.on),
            ),
        ];
        let m = self.0.mirror.clone();
        let mirror_gauges = m.iter().flat_map(|m| {
            [
                (
                    "cachevisor_mirrored_blocks",
                    "Dirty blocks with their copy on another cache device (cache.mirror_dirty)",
                    m.mirrored_blocks,
                ),
                (
                    "cachevisor_mirror_fallback_writes",
                    "Write-back writes that went through to the backing store for want of a mirror slot",
                    m.fallbacks,
                ),
                (
                    "cachevisor_mirror_promoted_blocks",
                    "Dirty blocks served from their mirror after their device was dropped",
                    m.promoted,
                ),
                ("cachevisor_mirror_failed_writes", "Mirror writes that failed", m.failed_writes),
            ]
            .map(|(n, h, v)| (n, h, v as i64))
        });
        let ram = self.0.ram;
        let ram_gauges = ram.iter().flat_map(|r| {
            [
                ("cachevisor_ram_size_blocks", "Blocks the RAM tier holds at most (cache.ram / block size)", r.slots),
                ("cachevisor_ram_used_blocks", "Blocks with a copy in the RAM tier now", r.used),
                (
                    "cachevisor_ram_filled_blocks",
                    "Copies written into the RAM tier since the start (SSD hits it took)",
                    r.fills,
                ),
                ("cachevisor_ram_evicted_blocks", "RAM copies dropped to make room for another", r.evictions),
                (
                    "cachevisor_ram_dropped_blocks",
                    "RAM copies dropped because their cached block changed (written, evicted, moved)",
                    r.dropped,
                ),
            ]
            .map(|(n, h, v)| (n, h, v as i64))
        });
        let per_vdisk_ram = self.0.vdisks.iter().map(|s| s.ram_blocks).collect::<Vec<_>>();
        if ram.is_some() {
            let g0 = ConstGauge::new(0i64);
            let mut m = enc.encode_descriptor(
                "cachevisor_ram_blocks",
                "A vDisk's blocks with a copy in the RAM tier now",
                None,
                g0.metric_type(),
            )?;
            for (s, &n) in self.0.vdisks.iter().zip(&per_vdisk_ram) {
                ConstGauge::new(n as i64).encode(m.encode_family(&vec![("vdisk".to_string(), s.name.clone())])?)?;
            }
        }
        for (name, help, v) in
            job_gauges.into_iter().chain(prewarm_gauges).chain(cache_gauges).chain(mirror_gauges).chain(ram_gauges)
        {
            let g = ConstGauge::new(v);
            g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        if let Some(r) = self.0.vssd_region {
            let region_gauges = [
                ("cachevisor_vssd_region_blocks", "Blocks in the vSSD region now", r.blocks),
                (
                    "cachevisor_vssd_region_cap_blocks",
                    "The most blocks the vSSD region may hold now (vssd.size, or a shared budget's weighted share)",
                    r.cap_blocks,
                ),
                (
                    "cachevisor_vssd_withheld_cache_blocks",
                    "Cache blocks withheld from the host cache for the vSSD region (vssd.budget = \"shared\")",
                    r.withheld_slots,
                ),
            ];
            for (name, help, v) in region_gauges {
                let g = ConstGauge::new(v as i64);
                g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)?;
            }
        }
        if let Some(c) = self.0.cluster {
            let cluster_gauges = [
                (
                    "cachevisor_cluster_serving",
                    "1 while this node holds its cluster lease (serves peers), 0 when fenced",
                    c.serving,
                ),
                ("cachevisor_cluster_leading", "1 while this node leads the cluster", c.leading),
                ("cachevisor_cluster_epoch", "The cluster map's epoch this node is at", c.epoch),
                ("cachevisor_cluster_members", "Live members of the cluster this node sees", c.members),
                (
                    "cachevisor_cluster_claim_conflicts",
                    "vDisks this node serves whose claim another node holds (two nodes serve them: remove one)",
                    c.claim_conflicts,
                ),
            ];
            for (name, help, v) in cluster_gauges {
                let g = ConstGauge::new(v as i64);
                g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)?;
            }
            let e = ConstCounter::new(c.etcd_errors);
            e.encode(enc.encode_descriptor(
                "cachevisor_cluster_etcd_errors",
                "Requests to etcd that failed (unreachable, timed out, refused)",
                None,
                e.metric_type(),
            )?)?;
            let b = ConstCounter::new(c.bad_records);
            b.encode(enc.encode_descriptor(
                "cachevisor_cluster_bad_records",
                "Records read from etcd and ignored (too large, unreadable, a leader key no lease holds), each change once",
                None,
                b.metric_type(),
            )?)?;
        }
        if let Some(b) = &self.0.write_budget {
            // The cache's shared write budget (`shared_budget.rs`) and each vDisk's share.
            let cache_gauges = [
                (
                    "cachevisor_cache_write_budget_target_bytes_per_second",
                    "The cache's shared SSD write budget",
                    b.target_bytes_per_sec,
                ),
                (
                    "cachevisor_cache_write_budget_written_bytes",
                    "SSD bytes every vDisk wrote since the shared budget was set",
                    b.written_bytes as f64,
                ),
                (
                    "cachevisor_cache_write_budget_unreachable",
                    "1 when the writes the shared budget cannot refuse alone exceeded it in the last period",
                    f64::from(u8::from(b.unreachable)),
                ),
            ];
            for (name, help, v) in cache_gauges {
                let g = ConstGauge::new(v);
                g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)?;
            }
            type Share = fn(&cachevisor_engine::BudgetShare) -> f64;
            let shares: [(&str, &str, Share); 4] = [
                (
                    "cachevisor_write_budget_share_bytes_per_second",
                    "The vDisk's share of the shared budget for admitted misses' writes",
                    |s| s.share_bytes_per_sec.unwrap_or(f64::INFINITY),
                ),
                (
                    "cachevisor_write_budget_share_probability",
                    "The probability a miss of the vDisk its own admission lets in enters now",
                    |s| s.probability,
                ),
                (
                    "cachevisor_write_budget_share_hits_per_admitted_block",
                    "Smoothed hits per block the shared budget let in: what the split ranks by",
                    |s| s.value.unwrap_or(0.0),
                ),
                (
                    "cachevisor_write_budget_share_written_bytes",
                    "SSD bytes the vDisk wrote since the shared budget was set",
                    |s| s.written_bytes as f64,
                ),
            ];
            for (name, help, f) in shares {
                let g0 = ConstGauge::new(0f64);
                let mut m = enc.encode_descriptor(name, help, None, g0.metric_type())?;
                for s in &self.0.vdisks {
                    let Some(share) = s.entry.budget_share else { continue };
                    ConstGauge::new(f(&share))
                        .encode(m.encode_family(&vec![("vdisk".to_string(), s.name.clone())])?)?;
                }
            }
        }
        if !self.0.devices.is_empty() {
            // Each cache device of several: its size, blocks, and state (`[[cache.device]]`).
            type Of = fn(&crate::daemon::cache_swap::CacheDeviceReport) -> f64;
            let per_device: [(&str, &str, Of); 4] = [
                ("cachevisor_cache_device_size_bytes", "Bytes of the device the cache uses", |d| d.size_bytes as f64),
                ("cachevisor_cache_device_cached_blocks", "Blocks cached on the device", |d| d.cached_blocks as f64),
                (
                    "cachevisor_cache_device_failed",
                    "1 once the device was dropped after errors past cache.error_threshold",
                    |d| f64::from(u8::from(d.failed)),
                ),
                (
                    "cachevisor_cache_device_removed",
                    "1 once the device was removed online (cachevisor cache remove), 0.5 while it empties",
                    |d| match d.removal.map(|r| r.state) {
                        Some(cachevisor_datapath::RemovalState::Removed) => 1.0,
                        Some(cachevisor_datapath::RemovalState::Removing) => 0.5,
                        None => 0.0,
                    },
                ),
            ];
            for (name, help, f) in per_device {
                let g0 = ConstGauge::new(0f64);
                let mut m = enc.encode_descriptor(name, help, None, g0.metric_type())?;
                for d in &self.0.devices {
                    ConstGauge::new(f(d)).encode(m.encode_family(&vec![("device".to_string(), d.path.clone())])?)?;
                }
            }
        }
        if let Some(c) = &self.0.congestion {
            // Congestion bypass (`congestion.rs`): the cache device's smoothed latency, and
            // whether each direction is congested now.
            let g0 = ConstGauge::new(0f64);
            let mut m = enc.encode_descriptor(
                "cachevisor_cache_latency_seconds",
                "The cache device's smoothed op latency (hand-out to completion), by operation",
                None,
                g0.metric_type(),
            )?;
            for (op, v) in [("read", c.read_latency_ns), ("write", c.write_latency_ns)] {
                ConstGauge::new(v / 1e9).encode(m.encode_family(&vec![("op".to_string(), op.to_string())])?)?;
            }
            let g1 = ConstGauge::new(0i64);
            let mut m = enc.encode_descriptor(
                "cachevisor_cache_congested",
                "1 while misses of this operation go around the congested cache device",
                None,
                g1.metric_type(),
            )?;
            for (op, v) in [("read", c.read_congested), ("write", c.write_congested)] {
                ConstGauge::new(v as i64).encode(m.encode_family(&vec![("op".to_string(), op.to_string())])?)?;
            }
            let c0 = ConstCounter::new(0u64);
            let mut m = enc.encode_descriptor(
                "cachevisor_congestion_bypassed_misses",
                "Misses sent around the cache because its device was congested, by vDisk and operation",
                None,
                c0.metric_type(),
            )?;
            for s in &self.0.vdisks {
                for (op, v) in ["read", "write"].into_iter().zip(s.entry.congestion_bypassed) {
                    ConstCounter::new(v).encode(m.encode_family(&vec![
                        ("vdisk".to_string(), s.name.clone()),
                        ("op".to_string(), op.to_string()),
                    ])?)?;
                }
            }
        }
        let [queued, loaded, skipped, dropped] = self.0.cache_hints;
        let by_outcome: [(&str, &str, Vec<Outcome>); 2] = [
            (
                "cachevisor_cache_hint_blocks",
                "Blocks NBD_CMD_CACHE asked for, by outcome (queued; loaded, skipped as cached or busy, dropped)",
                vec![("queued", queued), ("loaded", loaded), ("skipped", skipped), ("dropped", dropped)],
            ),
            (
                "cachevisor_cache_io_uring_calls",
                "Cache-file reads and writes made through io_uring (a coalesced run counting once), by outcome (ok; failed: an error or a short transfer)",
                vec![("ok", self.0.ring.calls_ok), ("failed", self.0.ring.calls_failed)],
            ),
        ];
        for (name, help, values) in by_outcome {
            let c0 = ConstCounter::new(0u64);
            let mut m = enc.encode_descriptor(name, help, None, c0.metric_type())?;
            for (outcome, v) in values {
                ConstCounter::new(v).encode(m.encode_family(&vec![("outcome".to_string(), outcome.to_string())])?)?;
            }
        }
        let gd = &self.0.guards;
        let guard_counters = [
            ("cachevisor_api_auth_failures", "API calls refused for a missing or wrong token", gd.api_auth_failures),
            ("cachevisor_api_lockouts", "API lockouts after repeated wrong tokens", gd.api_lockouts),
            (
                "cachevisor_connections_refused",
                "NBD or API connections refused at the connection limit",
                gd.connections_refused,
            ),
            (
                "cachevisor_handshake_timeouts",
                "NBD connections closed for not finishing the handshake in time",
                gd.handshake_timeouts,
            ),
            (
                "cachevisor_api_idle_closes",
                "API connections closed after moving no byte for api.idle_timeout",
                gd.api_idle_closes,
            ),
            (
                "cachevisor_handshakes_evicted",
                "Connections still in their handshake or first API request closed to make room for newer ones",
                gd.handshakes_evicted,
            ),
            (
                "cachevisor_commit_failures",
                "Metadata commits that failed and were retried (a full file system)",
                gd.commit_failures,
            ),
            (
                "cachevisor_checksum_mismatches",
                "Cache reads whose bytes failed the checksum they were written with (EIO to the client, never written back)",
                gd.checksum_mismatches,
            ),
            (
                "cachevisor_slot_waits",
                "Client requests that found no durable free cache slot and waited for a metadata commit (a journal disk too slow for the miss rate)",
                gd.slot_waits,
            ),
        ];
        for (name, help, v) in guard_counters {
            let c = ConstCounter::new(v);
            c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        Ok(())
    }
}
