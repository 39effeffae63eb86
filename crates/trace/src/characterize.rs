//! Workload characterization for `cachevisor trace info`: per VM and in total, request
//! counts, duration, average and peak IOPS, read/write mix, request size histogram,
//! working-set size at a block size, sequential fraction and reuse ratio.

use crate::request::{Request, VmId};
use rustc_hash::FxHashSet;
use serde::Serialize;

/// Running statistics of one VM (or of the total).
#[derive(Debug, Clone, Default)]
struct Acc {
    requests: u64,
    reads: u64,
    read_bytes: u64,
    write_bytes: u64,
    first_ns: Option<u64>,
    last_ns: u64,
    sec: u64,
    in_sec: u64,
    peak: u64,
    size_hist: Vec<u64>,
    blocks: FxHashSet<(VmId, u64)>,
    block_accesses: u64,
    next_offset: Option<u64>,
    sequential: u64,
}

impl Acc {
    fn add(&mut self, r: &Request, block: u64) {
        self.requests += 1;
        if r.op.is_write() {
            self.write_bytes += r.len as u64;
        } else {
            self.reads += 1;
            self.read_bytes += r.len as u64;
        }
        let first = *self.first_ns.get_or_insert(r.time_ns);
        self.last_ns = self.last_ns.max(r.time_ns);
        let sec = r.time_ns.saturating_sub(first) / 1_000_000_000;
        if sec != self.sec {
            self.sec = sec;
            self.in_sec = 0;
        }
        self.in_sec += 1;
        self.peak = self.peak.max(self.in_sec);
        let bucket = (r.len.max(1) as u64).next_power_of_two().trailing_zeros() as usize;
        if self.size_hist.len() <= bucket {
            self.size_hist.resize(bucket + 1, 0);
        }
        self.size_hist[bucket] += 1;
        for b in r.offset / block..=(r.end() - 1) / block {
            self.blocks.insert((r.vm, b));
            self.block_accesses += 1;
        }
        if self.next_offset == Some(r.offset) {
            self.sequential += 1;
        }
        self.next_offset = Some(r.end());
    }

    fn report(&self, name: &str, block: u64) -> VmProfile {
        let duration_ns = self.last_ns - self.first_ns.unwrap_or(0);
        // The rate over the trace's own span, however short (a 0.136 s trace of 6,999
        // requests runs at 51 k IOPS, not 6,999); a trace with one timestamp has no rate
        // of its own and counts as one second.
        let secs = if duration_ns > 0 { duration_ns as f64 / 1e9 } else { 1.0 };
        let unique = self.blocks.len() as u64;
        VmProfile {
            vm: name.to_string(),
            requests: self.requests,
            duration_s: duration_ns as f64 / 1e9,
            avg_iops: self.requests as f64 / secs,
            peak_iops: self.peak,
            read_fraction: self.reads as f64 / self.requests.max(1) as f64,
            read_bytes: self.read_bytes,
            write_bytes: self.write_bytes,
            size_histogram: self
                .size_hist
                .iter()
                .enumerate()
                .filter(|(_, &n)| n > 0)
                .map(|(b, &n)| SizeBucket { up_to_bytes: 1 << b, requests: n })
                .collect(),
            wss_blocks: unique,
            wss_bytes: unique * block,
            sequential_fraction: self.sequential as f64 / self.requests.max(1) as f64,
            reuse_ratio: 1.0 - unique as f64 / self.block_accesses.max(1) as f64,
        }
    }
}

/// One row of the request size histogram (sizes rounded up to a power of two).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SizeBucket {
    /// Upper bound of the bucket in bytes.
    pub up_to_bytes: u64,
    /// Requests in the bucket.
    pub requests: u64,
}

/// The profile of one VM or of the whole trace.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct VmProfile {
    /// VM name (`total` for the aggregate).
    pub vm: String,
    /// Requests.
    pub requests: u64,
    /// First to last request, seconds.
    pub duration_s: f64,
    /// Requests per second over the duration (at least 1 s).
    pub avg_iops: f64,
    /// Most requests in one second since the first request.
    pub peak_iops: u64,
    /// Fraction of requests that are reads.
    pub read_fraction: f64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Request sizes.
    pub size_histogram: Vec<SizeBucket>,
    /// Distinct blocks touched (working-set size) at the profile's block size.
    pub wss_blocks: u64,
    /// `wss_blocks` × block size.
    pub wss_bytes: u64,
    /// Fraction of requests starting where the VM's previous request ended.
    pub sequential_fraction: f64,
    /// 1 − distinct blocks / block accesses: how much of the traffic re-touches blocks.
    pub reuse_ratio: f64,
}

/// Streaming characterization of a multi-VM trace.
pub struct Characterizer {
    block: u64,
    per_vm: Vec<Acc>,
    total: Acc,
}

impl Characterizer {
    /// Counts working sets in `block`-byte blocks.
    pub fn new(block: u64) -> Self {
        Characterizer { block, per_vm: Vec::new(), total: Acc::default() }
    }

    /// Adds one request.
    pub fn add(&mut self, r: &Request) {
        let v = r.vm as usize;
        if self.per_vm.len() <= v {
            self.per_vm.resize_with(v + 1, Acc::default);
        }
        self.per_vm[v].add(r, self.block);
        // The total's sequential detection follows the interleaved stream, as a device sees it.
        self.total.add(r, self.block);
    }

    /// Profiles per VM (named by `names`) followed by the total.
    pub fn finish(&self, names: &[String]) -> Vec<VmProfile> {
        let mut out: Vec<VmProfile> = self
            .per_vm
            .iter()
            .enumerate()
            .filter(|(_, a)| a.requests > 0)
            .map(|(i, a)| a.report(names.get(i).map(String::as_str).unwrap_or("?"), self.block))
            .collect();
        out.push(self.total.report("total", self.block));
        out
    }
}
