//! Synthetic workloads in the configuration schema of the Nutanix prewarming study
//! (../shared/seeds/nutanix-cache-prewarming-slides.txt, "Workload: synthetic"):
//! `iops` Normal(mean, stddev) requests per second, `sector.size`, `cluster.size` and
//! `cluster.stride` Uniform(min, max), `hotspots` as `[% disk space, % I/O]`, `iosizes` as
//! `[%, bytes]`; plus `disk_size`, `duration`, `read_ratio`, `seed` and `name`, which the
//! slides leave implicit.
//!
//! Interpretation where the slides are silent (stated here so results can be judged):
//! - Hotspots partition the disk in the order listed, each taking its % of the space.
//!   If the I/O shares sum to less than 100%, the rest of the I/O goes uniformly over the
//!   whole disk (the slides' example sums to 33%); above 100% they are normalized.
//! - A cluster is a run of `cluster.size` requests; the first starts at a uniform sector
//!   of a chosen region, each next one `cluster.stride` sectors after the previous.
//! - Each second draws its request count from the normal law (rounded, at least 0) and
//!   places the requests at uniform times within the second.
//!
//! Same config and seed give the same trace, byte for byte (ChaCha8, a stable stream).

use crate::error::TraceError;
use crate::request::{Op, Request};
use crate::source::{SourceCounts, TraceSource};
use crate::units::{parse_duration_ns, parse_percent, parse_size};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use serde::Deserialize;

/// A number or a string with a unit, as written in the YAML.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Scalar {
    /// Plain number.
    Num(f64),
    /// Text such as `4096b`, `10%`, `600s`.
    Text(String),
}

impl Scalar {
    fn size(&self, key: &str) -> Result<u64, String> {
        match self {
            Scalar::Num(v) if *v >= 0.0 && v.fract() == 0.0 => Ok(*v as u64),
            Scalar::Num(v) => Err(format!("{key}: {v} is not a byte count")),
            Scalar::Text(s) => parse_size(s).map_err(|e| format!("{key}: {e}")),
        }
    }
    fn percent(&self, key: &str) -> Result<f64, String> {
        match self {
            Scalar::Num(v) => parse_percent(&v.to_string()),
            Scalar::Text(s) => parse_percent(s),
        }
        .map_err(|e| format!("{key}: {e}"))
    }
}

/// `iops:` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IopsConfig {
    /// Only `normal` is defined by the slides.
    #[serde(default = "normal")]
    pub randvar: String,
    /// Mean requests per second.
    pub mean: f64,
    /// Standard deviation of requests per second.
    #[serde(default)]
    pub stddev: f64,
}

fn normal() -> String {
    "normal".into()
}

/// `min`/`max` pair.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Range {
    /// Smallest value.
    pub min: u64,
    /// Largest value (inclusive).
    pub max: u64,
}

/// `cluster:` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Requests per cluster.
    pub size: Range,
    /// Sectors between consecutive requests of a cluster.
    pub stride: Range,
}

/// `sector:` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SectorConfig {
    /// Sector size (`512b`).
    pub size: Scalar,
}

/// The whole YAML workload configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadConfig {
    /// VM name of the generated requests.
    #[serde(default = "default_name")]
    pub name: String,
    /// Requests per second.
    pub iops: IopsConfig,
    /// Sector size.
    pub sector: SectorConfig,
    /// Sequential clusters.
    pub cluster: ClusterConfig,
    /// `[% disk space, % I/O]` regions.
    pub hotspots: Vec<(Scalar, Scalar)>,
    /// `[%, bytes]` request size mix.
    pub iosizes: Vec<(Scalar, Scalar)>,
    /// Virtual disk size (`10GiB`).
    pub disk_size: Scalar,
    /// Trace length (`600s`).
    pub duration: Scalar,
    /// Fraction of reads (0..1).
    #[serde(default = "default_read_ratio")]
    pub read_ratio: f64,
    /// Random seed.
    #[serde(default)]
    pub seed: u64,
}

fn default_name() -> String {
    "synthetic".into()
}
fn default_read_ratio() -> f64 {
    0.7
}

/// A validated configuration in sectors and fractions.
#[derive(Debug, Clone)]
pub struct Workload {
    /// VM name.
    pub name: String,
    /// Mean and stddev of requests per second.
    pub iops: (f64, f64),
    /// Bytes per sector.
    pub sector: u64,
    /// Disk size in sectors.
    pub disk_sectors: u64,
    /// Cluster length range.
    pub cluster_size: Range,
    /// Stride range in sectors.
    pub stride: Range,
    /// Regions: (first sector, sectors, share of I/O including the uniform remainder).
    pub regions: Vec<(u64, u64, f64)>,
    /// Size mix: (cumulative probability, bytes).
    pub sizes: Vec<(f64, u64)>,
    /// Duration in whole seconds.
    pub seconds: u64,
    /// Read probability.
    pub read_ratio: f64,
    /// Seed.
    pub seed: u64,
}

impl WorkloadConfig {
    /// Parses YAML text (`origin` names it in errors).
    pub fn from_yaml(text: &str, origin: &str) -> Result<Self, TraceError> {
        serde_yaml::from_str(text).map_err(|e| TraceError::Usage(format!("{origin}: {e}")))
    }

    /// Checks every value and resolves units and shares.
    pub fn validate(&self) -> Result<Workload, String> {
        if self.iops.randvar != "normal" {
            return Err(format!("iops.randvar: `{}` is not supported (only `normal`)", self.iops.randvar));
        }
        if !(self.iops.mean > 0.0 && self.iops.stddev >= 0.0) {
            return Err("iops: mean must be > 0 and stddev ≥ 0".into());
        }
        let sector = self.sector.size.size("sector.size")?;
        if sector == 0 || !sector.is_power_of_two() {
            return Err(format!("sector.size: {sector} is not a power of two"));
        }
        let disk = self.disk_size.size("disk_size")?;
        let disk_sectors = disk / sector;
        if disk_sectors == 0 {
            return Err("disk_size: smaller than one sector".into());
        }
        for (r, k) in [(self.cluster.size, "cluster.size"), (self.cluster.stride, "cluster.stride")] {
            if r.min == 0 || r.min > r.max {
                return Err(format!("{k}: need 1 ≤ min ≤ max, got min {} max {}", r.min, r.max));
            }
        }
        let duration = match &self.duration {
            Scalar::Num(v) => (*v * 1e9) as u64,
            Scalar::Text(s) => parse_duration_ns(s).map_err(|e| format!("duration: {e}"))?,
        };
        let seconds = duration / 1_000_000_000;
        if seconds == 0 {
            return Err("duration: must be at least 1s".into());
        }
        if !(0.0..=1.0).contains(&self.read_ratio) {
            return Err(format!("read_ratio: {} is outside 0..1", self.read_ratio));
        }
        let mut spaces = Vec::new();
        let mut ios = Vec::new();
        for (i, (space, io)) in self.hotspots.iter().enumerate() {
            spaces.push(space.percent(&format!("hotspots[{i}] space"))?);
            ios.push(io.percent(&format!("hotspots[{i}] I/O"))?);
        }
        let space_sum: f64 = spaces.iter().sum();
        if space_sum > 1.0 + 1e-9 {
            return Err(format!("hotspots: disk space shares sum to {:.1}% > 100%", space_sum * 100.0));
        }
        let io_sum: f64 = ios.iter().sum();
        let (scale, rest) = if io_sum > 1.0 { (1.0 / io_sum, 0.0) } else { (1.0, 1.0 - io_sum) };
        let mut regions = Vec::new();
        let mut start = 0u64;
        for (s, io) in spaces.iter().zip(&ios) {
            let len = ((s * disk_sectors as f64) as u64).max(1);
            regions.push((start, len.min(disk_sectors - start.min(disk_sectors - 1)), io * scale));
            start = (start + len).min(disk_sectors - 1);
        }
        if rest > 0.0 || regions.is_empty() {
            regions.push((0, disk_sectors, rest.max(if regions.is_empty() { 1.0 } else { 0.0 })));
        }
        let mut sizes = Vec::new();
        let mut cum = 0.0;
        for (i, (p, b)) in self.iosizes.iter().enumerate() {
            cum += p.percent(&format!("iosizes[{i}] share"))?;
            let bytes = b.size(&format!("iosizes[{i}] bytes"))?;
            if bytes == 0 || bytes > u32::MAX as u64 {
                return Err(format!("iosizes[{i}]: {bytes} bytes is not a request size"));
            }
            sizes.push((cum, bytes));
        }
        if sizes.is_empty() || (cum - 1.0).abs() > 1e-6 {
            return Err(format!("iosizes: shares must sum to 100%, got {:.1}%", cum * 100.0));
        }
        Ok(Workload {
            name: self.name.clone(),
            iops: (self.iops.mean, self.iops.stddev),
            sector,
            disk_sectors,
            cluster_size: self.cluster.size,
            stride: self.cluster.stride,
            regions,
            sizes,
            seconds,
            read_ratio: self.read_ratio,
            seed: self.seed,
        })
    }
}

/// The generator, a [`TraceSource`] of one VM.
pub struct Generator {
    w: Workload,
    rng: ChaCha8Rng,
    iops: Normal<f64>,
    names: Vec<String>,
    sec: u64,
    times: Vec<u64>,
    next_time: usize,
    cluster_left: u64,
    cursor: u64,
    region_cum: Vec<f64>,
    emitted: u64,
}

impl Generator {
    /// A generator of `w`.
    pub fn new(w: Workload) -> Self {
        let mut cum = 0.0;
        let region_cum = w.regions.iter().map(|r| {
            cum += r.2;
            cum
        });
        let region_cum: Vec<f64> = region_cum.collect();
        Generator {
            rng: ChaCha8Rng::seed_from_u64(w.seed),
            iops: Normal::new(w.iops.0, w.iops.1).expect("validated normal"),
            names: vec![w.name.clone()],
            sec: 0,
            times: Vec::new(),
            next_time: 0,
            cluster_left: 0,
            cursor: 0,
            region_cum,
            emitted: 0,
            w,
        }
    }

    fn refill_second(&mut self) -> bool {
        while self.next_time >= self.times.len() {
            if self.sec >= self.w.seconds {
                return false;
            }
            let n = self.iops.sample(&mut self.rng).round().max(0.0) as usize;
            let base = self.sec * 1_000_000_000;
            self.times.clear();
            self.times.extend((0..n).map(|_| base + self.rng.gen_range(0..1_000_000_000)));
            self.times.sort_unstable();
            self.next_time = 0;
            self.sec += 1;
        }
        true
    }

    /// Index of the region a new cluster starts in.
    pub fn pick_region(&mut self) -> usize {
        let total = *self.region_cum.last().unwrap_or(&1.0);
        let x = self.rng.gen::<f64>() * total;
        self.region_cum.iter().position(|&c| x < c).unwrap_or(self.region_cum.len() - 1)
    }
}

impl TraceSource for Generator {
    fn next_request(&mut self) -> Result<Option<Request>, TraceError> {
        if !self.refill_second() {
            return Ok(None);
        }
        let time_ns = self.times[self.next_time];
        self.next_time += 1;
        if self.cluster_left == 0 {
            let region = self.pick_region();
            let (start, len, _) = self.w.regions[region];
            self.cursor = start + self.rng.gen_range(0..len);
            self.cluster_left = self.rng.gen_range(self.w.cluster_size.min..=self.w.cluster_size.max);
        } else {
            self.cursor += self.rng.gen_range(self.w.stride.min..=self.w.stride.max);
        }
        self.cluster_left -= 1;
        let x: f64 = self.rng.gen();
        let len = self.w.sizes.iter().find(|s| x < s.0).unwrap_or(self.w.sizes.last().unwrap()).1;
        let op = if self.rng.gen::<f64>() < self.w.read_ratio { Op::Read } else { Op::Write };
        let len_sectors = len.div_ceil(self.w.sector);
        if self.cursor + len_sectors > self.w.disk_sectors {
            self.cursor %= self.w.disk_sectors.saturating_sub(len_sectors).max(1);
        }
        self.emitted += 1;
        Ok(Some(Request { time_ns, vm: 0, op, offset: self.cursor * self.w.sector, len: len as u32 }))
    }

    fn vm_names(&self) -> &[String] {
        &self.names
    }

    fn counts(&self) -> SourceCounts {
        SourceCounts { requests: self.emitted, ..SourceCounts::default() }
    }
}
