//! The miss-ratio-curve report of a profiled trace: per VM its curve at evenly spaced
//! sizes (one size axis for all VMs), working set, wss80, ELICA's ideal sizes (ELICA §3.2,
//! Eq. 1) and ECI-Cache's URD size (ECI-Cache §4.1). `cachevisor analyze mrc` writes it as
//! CSV, JSON and SVG; the Python package returns it as DataFrames — one computation, so
//! both give the same numbers.

use crate::{elica_ideal_bytes, CurvePoint, Kind, Method, Profiler};
use serde::Serialize;

/// Most points a curve is reported at.
pub const MAX_POINTS: usize = 1_000_000;

/// Which curve to report and how finely.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MrcOptions {
    /// Accesses the curve counts (`Kind::Read` is the URD curve).
    pub kind: Kind,
    /// The name of that choice in reports (`all`, `read`, `write`, `urd`).
    pub kind_name: &'static str,
    /// Share of reuses ELICA's percentile size and the URD size cover, in [0, 1].
    pub percentile: f64,
    /// Points per curve (plus size 0).
    pub points: usize,
}

impl MrcOptions {
    /// Options from a kind's name (`all`, `read`, `write`, `urd`); `Err` names the value.
    pub fn new(kind: &str, percentile: f64, points: usize) -> Result<MrcOptions, String> {
        let (kind, kind_name) = match kind {
            "all" => (Kind::All, "all"),
            "read" => (Kind::Read, "read"),
            "urd" => (Kind::Read, "urd"),
            "write" => (Kind::Write, "write"),
            other => return Err(format!("kind `{other}`: expected all, read, write or urd")),
        };
        if !(0.0..=1.0).contains(&percentile) {
            return Err(format!("percentile {percentile}: must be in [0, 1]"));
        }
        if points == 0 || points > MAX_POINTS {
            return Err(format!("points {points}: expected 1 to {MAX_POINTS}"));
        }
        Ok(MrcOptions { kind, kind_name, percentile, points })
    }
}

/// Summary of one VM.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VmSummary {
    /// Its name.
    pub vm: String,
    /// Block accesses (a request touches one per block it covers).
    pub block_accesses: u64,
    /// Block reads.
    pub read_accesses: u64,
    /// Distinct blocks × block size.
    pub wss_bytes: u64,
    /// The size whose LRU hit ratio reaches 80% of accesses, if any does.
    pub wss80_bytes: Option<u64>,
    /// LRU hit ratio with the whole working set cached.
    pub hit_ratio_at_wss: f64,
    /// Largest stack distance seen.
    pub max_stack_distance: Option<u64>,
    /// ELICA's ideal size from the largest distance (Eq. 1).
    pub elica_ideal_max_bytes: Option<u64>,
    /// ELICA's ideal size from the percentile's distance.
    pub elica_ideal_percentile_bytes: Option<u64>,
    /// ECI-Cache's size covering the percentile of useful (read) reuses.
    pub urd_size_bytes: Option<u64>,
    /// Memory the estimator held.
    pub estimator_memory_bytes: u64,
}

/// The report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MrcReport {
    /// Cache block size.
    pub block_size: u64,
    /// How distances were estimated.
    pub method: Method,
    /// Which accesses the curves count.
    pub kind: &'static str,
    /// Percentile of the percentile sizes.
    pub percentile: f64,
    /// One summary per VM, in VM order.
    pub vms: Vec<VmSummary>,
    /// One curve per VM at the same sizes (the largest working set split evenly).
    #[serde(skip)]
    pub curves: Vec<Vec<CurvePoint>>,
}

impl MrcReport {
    /// The report of `prof` whose VMs are named `names` (in VM order).
    pub fn build(prof: &Profiler, names: &[String], method: Method, o: MrcOptions) -> MrcReport {
        let bs = prof.block_size();
        let max_blocks = prof.vms().iter().map(|v| v.distinct_blocks()).max().unwrap_or(1).max(1);
        let mut vms = Vec::new();
        let mut curves = Vec::new();
        for (i, v) in prof.vms().iter().enumerate() {
            let all = v.histogram(Kind::All);
            let urd = v.histogram(Kind::Read);
            let wss = v.distinct_blocks();
            let max_sd = all.max_distance();
            vms.push(VmSummary {
                vm: names.get(i).cloned().unwrap_or_else(|| format!("vm{i}")),
                block_accesses: v.accesses(Kind::All),
                read_accesses: v.accesses(Kind::Read),
                wss_bytes: wss * bs,
                wss80_bytes: all.size_for_hit_ratio(0.8).map(|b| b * bs),
                hit_ratio_at_wss: 1.0 - all.miss_ratio_at(wss),
                max_stack_distance: max_sd,
                elica_ideal_max_bytes: max_sd.map(|sd| elica_ideal_bytes(sd, bs)),
                elica_ideal_percentile_bytes: all
                    .size_covering_reuses(o.percentile)
                    .map(|c| elica_ideal_bytes(c - 1, bs)),
                urd_size_bytes: urd.size_covering_reuses(o.percentile).map(|c| c * bs),
                estimator_memory_bytes: v.memory_bytes() as u64,
            });
            curves.push(v.histogram(o.kind).curve(max_blocks, o.points));
        }
        MrcReport { block_size: bs, method, kind: o.kind_name, percentile: o.percentile, vms, curves }
    }

    /// The curves as CSV: `size_bytes,size_blocks` and one miss-ratio column per VM
    /// (commas in names become `_`).
    pub fn curves_csv(&self) -> String {
        use std::fmt::Write as _;
        let mut csv = String::from("size_bytes,size_blocks");
        for v in &self.vms {
            let _ = write!(csv, ",{}", v.vm.replace(',', "_"));
        }
        csv.push('\n');
        for j in 0..self.curves.first().map_or(0, Vec::len) {
            let blocks = self.curves[0][j].blocks;
            let _ = write!(csv, "{},{}", blocks * self.block_size, blocks);
            for c in &self.curves {
                let _ = write!(csv, ",{:.6}", c[j].miss_ratio);
            }
            csv.push('\n');
        }
        csv
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachevisor_trace::{Op, Request};

    fn req(vm: u32, block: u64, op: Op) -> Request {
        Request { time_ns: 0, vm, op, offset: block * 4096, len: 4096 }
    }

    #[test]
    fn one_size_axis_for_all_vms_and_the_csv_matches_the_curves() {
        let mut p = Profiler::new(4096, Method::Exact);
        // VM 0 cycles over 4 blocks twice (hits at size ≥ 4); VM 1 rereads one block.
        for b in (0..4).chain(0..4) {
            p.add(&req(0, b, Op::Read));
        }
        for _ in 0..3 {
            p.add(&req(1, 9, Op::Write));
        }
        let names = vec!["a".to_string(), "b,c".to_string()];
        let r = MrcReport::build(&p, &names, Method::Exact, MrcOptions::new("all", 0.95, 4).unwrap());
        assert_eq!(r.curves[0].len(), r.curves[1].len());
        assert_eq!(r.curves[0].last().unwrap().blocks, 4);
        assert_eq!(r.curves[0].last().unwrap().miss_ratio, 0.5);
        assert_eq!(r.curves[0][3].miss_ratio, 1.0, "3 blocks of an LRU cycle of 4 never hit");
        assert!((r.curves[1][1].miss_ratio - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(r.vms[0].wss_bytes, 4 * 4096);
        assert_eq!(r.vms[1].read_accesses, 0);
        assert_eq!(r.vms[1].urd_size_bytes, None, "no read reuse, no URD size");
        let csv = r.curves_csv();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], "size_bytes,size_blocks,a,b_c");
        assert_eq!(lines.len(), 1 + r.curves[0].len());
        assert_eq!(lines.last().unwrap(), &"16384,4,0.500000,0.333333");
    }

    #[test]
    fn options_name_the_bad_value() {
        assert!(MrcOptions::new("reads", 0.9, 10).unwrap_err().contains("reads"));
        assert!(MrcOptions::new("all", 1.5, 10).unwrap_err().contains("1.5"));
        assert!(MrcOptions::new("all", 0.5, 0).is_err());
        assert!(MrcOptions::new("all", 0.5, MAX_POINTS).is_ok());
        assert!(MrcOptions::new("all", 0.5, MAX_POINTS + 1).unwrap_err().contains("1000001"));
        assert_eq!(MrcOptions::new("urd", 0.5, 1).unwrap().kind, Kind::Read);
    }
}
