//! Per-VM miss-ratio profiling of a request stream: requests are split into cache blocks
//! exactly as the engine splits them, every block access feeds one estimator per VM, and
//! each access is also recorded by kind (all, read, write) so read-only and URD curves
//! come from the same pass.
//!
//! **URD (useful reuse distance, ECI-Cache)** as defined here: the stack distance of a
//! *read* access, measured over all accesses (reads and writes) since the previous access
//! to the same block. Read-after-read and read-after-write reuses count (the cache can
//! serve the read); write-after-read and write-after-write reuses do not (a write needs no
//! cached copy, so keeping a block only to absorb a later write buys nothing), and a block
//! that is written and never read again contributes no useful reuse at all. The URD
//! curve is the read miss ratio versus cache size; the URD size is the smallest cache
//! that serves a chosen fraction of useful reuses. The seed has only the abstract
//! (../shared/seeds/eci-cache-abstract.txt); docs/analysis.md states the rule with examples.

use crate::histogram::DistanceHistogram;
use crate::shards::{Correction, Shards};
use crate::stack_distance::StackDistance;
use cachevisor_trace::{Request, VmId};
use serde::Serialize;

/// How distances are estimated.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "method", rename_all = "kebab-case")]
pub enum Method {
    /// Every access, exact distances.
    Exact,
    /// SHARDS fixed-rate sampling.
    ShardsRate {
        /// Sampling rate R in (0, 1].
        rate: f64,
    },
    /// SHARDS fixed-size sampling.
    ShardsSize {
        /// Most blocks tracked.
        max_blocks: usize,
    },
}

impl Method {
    /// The method named `name` (`exact` or `shards`) with SHARDS' fixed rate or fixed
    /// size (fixed rate 0.01 when neither is given); the error names the option
    /// first (`rate`, `max-blocks`, `method`: the CLI prefixes `--`).
    pub fn choose(name: &str, rate: Option<f64>, max_blocks: Option<usize>) -> Result<Method, String> {
        match (name, rate, max_blocks) {
            ("exact", None, None) => Ok(Method::Exact),
            ("exact", _, _) => Err("method exact: rate and max-blocks apply to shards".into()),
            ("shards", Some(r), None) if r > 0.0 && r <= 1.0 => Ok(Method::ShardsRate { rate: r }),
            ("shards", Some(r), None) => Err(format!("rate {r}: the sampling rate must be in (0, 1]")),
            ("shards", None, Some(0)) => Err("max-blocks must be at least 1".into()),
            ("shards", None, Some(n)) => Ok(Method::ShardsSize { max_blocks: n }),
            ("shards", None, None) => Ok(Method::ShardsRate { rate: 0.01 }),
            ("shards", Some(_), Some(_)) => {
                Err("rate and max-blocks: give one (fixed-rate or fixed-size), not both".into())
            }
            (other, _, _) => Err(format!("method `{other}`: expected exact or shards")),
        }
    }
}

/// Which accesses a curve counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Reads and writes.
    All,
    /// Reads only (distances still count blocks written in between): the URD curve.
    Read,
    /// Writes only.
    Write,
}

/// One estimator per kind for one VM (one per VM, so the exact variant's size is fine).
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
enum Estimator {
    Exact { stack: StackDistance, all: DistanceHistogram, read: DistanceHistogram, write: DistanceHistogram },
    Sampled { all: Shards, read: Shards, write: Shards },
}

impl Estimator {
    fn new(m: Method, seed: u64, c: Correction) -> Self {
        let s = |m: Method| match m {
            Method::ShardsRate { rate } => Shards::fixed_rate(rate).with_seed(seed).with_correction(c),
            Method::ShardsSize { max_blocks } => Shards::fixed_size(max_blocks).with_seed(seed).with_correction(c),
            Method::Exact => unreachable!(),
        };
        match m {
            Method::Exact => Estimator::Exact {
                stack: StackDistance::new(),
                all: DistanceHistogram::exact(),
                read: DistanceHistogram::exact(),
                write: DistanceHistogram::exact(),
            },
            // One sketch counts the stream's blocks for the three (`Shards::histogram_for`).
            _ => Estimator::Sampled {
                all: s(m),
                read: s(m).without_distinct_count(),
                write: s(m).without_distinct_count(),
            },
        }
    }
}

/// Accumulated profile of one VM.
#[derive(Debug, Clone)]
pub struct VmCurves {
    est: Estimator,
    accesses: [u64; 3],
}

impl VmCurves {
    /// Histogram of one kind.
    pub fn histogram(&self, kind: Kind) -> DistanceHistogram {
        match (&self.est, kind) {
            (Estimator::Exact { all, .. }, Kind::All) => all.clone(),
            (Estimator::Exact { read, .. }, Kind::Read) => read.clone(),
            (Estimator::Exact { write, .. }, Kind::Write) => write.clone(),
            (Estimator::Sampled { all, .. }, Kind::All) => all.histogram(),
            (Estimator::Sampled { all, read, .. }, Kind::Read) => read.histogram_for(all.counted_distinct()),
            (Estimator::Sampled { all, write, .. }, Kind::Write) => write.histogram_for(all.counted_distinct()),
        }
    }

    /// Block accesses of a kind.
    pub fn accesses(&self, kind: Kind) -> u64 {
        self.accesses[kind as usize]
    }

    /// Distinct blocks (working-set size): exact, or estimated by sampling.
    pub fn distinct_blocks(&self) -> u64 {
        match &self.est {
            Estimator::Exact { stack, .. } => stack.distinct() as u64,
            Estimator::Sampled { all, .. } => all.estimated_distinct().round() as u64,
        }
    }

    /// Bytes of estimator memory.
    pub fn memory_bytes(&self) -> usize {
        match &self.est {
            Estimator::Exact { stack, all, read, write } => {
                stack.memory_bytes() + all.memory_bytes() + read.memory_bytes() + write.memory_bytes()
            }
            Estimator::Sampled { all, read, write } => all.memory_bytes() + read.memory_bytes() + write.memory_bytes(),
        }
    }
}

/// Profiles a multi-VM stream.
#[derive(Debug, Clone)]
pub struct Profiler {
    block_size: u64,
    method: Method,
    per_kind: bool,
    seed: u64,
    correction: Correction,
    vms: Vec<VmCurves>,
}

impl Profiler {
    /// Profiles at `block_size` bytes (a power of two) with `method`.
    pub fn new(block_size: u64, method: Method) -> Self {
        assert!(block_size.is_power_of_two(), "block size must be a power of two");
        Profiler { block_size, method, per_kind: true, seed: 0, correction: Correction::default(), vms: Vec::new() }
    }

    /// SHARDS' hash seed (0 by default): another seed samples another, equally likely,
    /// set of blocks, so the spread over seeds shows a sampled curve's error.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// SHARDS' count correction ([`Correction`]; size-biased by default).
    pub fn with_correction(mut self, c: Correction) -> Self {
        self.correction = c;
        self
    }

    /// Only the all-accesses curve (read and write curves stay empty): the cheapest pass.
    pub fn all_only(mut self) -> Self {
        self.per_kind = false;
        self
    }

    /// Block size in bytes.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Adds one request (split into blocks).
    #[inline]
    pub fn add(&mut self, r: &Request) {
        if r.len == 0 {
            return;
        }
        let v = r.vm as usize;
        if v >= self.vms.len() {
            let (m, seed, c) = (self.method, self.seed, self.correction);
            self.vms.resize_with(v + 1, || VmCurves { est: Estimator::new(m, seed, c), accesses: [0; 3] });
        }
        let write = r.op.is_write();
        let per_kind = self.per_kind;
        let shift = self.block_size.trailing_zeros();
        let vm = &mut self.vms[v];
        for b in r.offset >> shift..=(r.end() - 1) >> shift {
            vm.accesses[Kind::All as usize] += 1;
            vm.accesses[if write { Kind::Write } else { Kind::Read } as usize] += 1;
            match &mut vm.est {
                Estimator::Exact { stack, all, read, write: wr } => {
                    let d = stack.access(b);
                    all.add(d, 1.0);
                    if !per_kind {
                    } else if write {
                        wr.add(d, 1.0);
                    } else {
                        read.add(d, 1.0);
                    }
                }
                Estimator::Sampled { all, read, write: wr } => {
                    all.access(b);
                    // Per-kind samplers see the whole stream (distances count every
                    // block) but record only their kind.
                    if per_kind {
                        read.access_as(b, !write);
                        wr.access_as(b, write);
                    }
                }
            }
        }
    }

    /// Curves of each VM seen, by VM id.
    pub fn vms(&self) -> &[VmCurves] {
        &self.vms
    }

    /// Curves of one VM.
    pub fn vm(&self, vm: VmId) -> Option<&VmCurves> {
        self.vms.get(vm as usize)
    }
}
