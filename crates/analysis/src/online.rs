//! Online, per-interval estimates: the same exact estimators fed request by request,
//! reporting every interval (by request count or by time) so allocators can call them each
//! window. Stack distances keep the whole history (a block's reuse across an interval
//! boundary keeps its true distance); the histograms decay at each boundary: `Reset`
//! reports each interval's own curve, `Keep` the cumulative one, `Decay(f)` multiplies
//! past counts by f (exponential forgetting).

use crate::histogram::DistanceHistogram;
use crate::reuse_mix::{ReuseMix, ReuseMixTracker};
use crate::stack_distance::StackDistance;
use cachevisor_trace::Request;
use rustc_hash::FxHashSet;
use serde::Serialize;

/// When an interval ends.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Interval {
    /// Every N requests of the whole stream.
    Requests(u64),
    /// Every N nanoseconds of trace time.
    Time(u64),
}

/// What happens to past counts at an interval boundary.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Decay {
    /// Forget them: each interval's own curve.
    Reset,
    /// Keep them: the cumulative curve.
    Keep,
    /// Multiply them by this factor in (0, 1).
    Factor(f64),
}

/// One VM's figures for one interval.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IntervalRow {
    /// Interval index.
    pub interval: u64,
    /// End of the interval, seconds of trace time (requests mode: time of its last request).
    pub t_end_s: f64,
    /// VM id.
    pub vm: u32,
    /// Requests in the interval.
    pub requests: u64,
    /// Requests per second over the interval's time span (0 when it has none).
    pub iops: f64,
    /// Distinct blocks touched in the interval.
    pub wss_blocks: u64,
    /// LRU hit ratio at each configured size, from the (decayed) histogram.
    pub hit_ratio: Vec<f64>,
    /// Smallest cache serving `urd_fraction` of the (decayed) useful reuses, in blocks.
    pub urd_blocks: Option<u64>,
    /// AllocUnit (S-CAVE §V-A): block misses in the interval at the first configured size.
    pub alloc_unit_blocks: u64,
}

#[derive(Debug, Clone)]
struct VmState {
    stack: StackDistance,
    all: DistanceHistogram,
    read: DistanceHistogram,
    window: DistanceHistogram,
    touched: FxHashSet<u64>,
    requests: u64,
    mix: Option<ReuseMixTracker>,
}

/// Per-interval profiler of a multi-VM stream (exact distances).
#[derive(Debug, Clone)]
pub struct IntervalProfiler {
    shift: u32,
    interval: Interval,
    decay: Decay,
    sizes: Vec<u64>,
    urd_fraction: f64,
    vms: Vec<VmState>,
    index: u64,
    start_ns: Option<u64>,
    last_ns: u64,
    count: u64,
    /// Shape of the decayed histograms (exact unless [`Self::with_resolution`]).
    shape: DistanceHistogram,
    track_mix: bool,
}

impl IntervalProfiler {
    /// Reports every `interval` with hit ratios at `sizes` blocks (the first size also
    /// gives AllocUnit) and URD sizes covering `urd_fraction` of useful reuses.
    pub fn new(block_size: u64, interval: Interval, decay: Decay, sizes: Vec<u64>, urd_fraction: f64) -> Self {
        assert!(block_size.is_power_of_two());
        IntervalProfiler {
            shift: block_size.trailing_zeros(),
            interval,
            decay,
            sizes,
            urd_fraction,
            vms: Vec::new(),
            index: 0,
            start_ns: None,
            last_ns: 0,
            count: 0,
            shape: DistanceHistogram::exact(),
            track_mix: false,
        }
    }

    /// Keeps the decayed histograms at a fixed resolution: `buckets` buckets of `width`
    /// blocks (exact hit curves in steps of `width` up to `width · buckets`, constant work
    /// per interval however long the history).
    pub fn with_resolution(mut self, width: u64, buckets: usize) -> Self {
        self.shape = DistanceHistogram::coarse(width, buckets);
        self
    }

    /// Also counts reuses by read/write kind ([`Self::reuse_mix`]), decayed like the
    /// histograms.
    pub fn with_reuse_mix(mut self) -> Self {
        self.track_mix = true;
        self
    }

    /// Adds a request; returns the rows of an interval that this request closed.
    pub fn add(&mut self, r: &Request) -> Option<Vec<IntervalRow>> {
        let start = *self.start_ns.get_or_insert(r.time_ns);
        let mut closed = None;
        if let Interval::Time(ns) = self.interval {
            if ns > 0 && r.time_ns >= start + (self.index + 1) * ns {
                closed = Some(self.close());
                // Skip empty intervals without rows.
                self.index = (r.time_ns - start) / ns;
            }
        }
        self.record(r);
        if let Interval::Requests(n) = self.interval {
            if n > 0 && self.count.is_multiple_of(n) {
                closed = Some(self.close());
            }
        }
        closed
    }

    fn record(&mut self, r: &Request) {
        self.count += 1;
        self.last_ns = self.last_ns.max(r.time_ns);
        let v = r.vm as usize;
        if v >= self.vms.len() {
            let (shape, mix) = (&self.shape, self.track_mix);
            self.vms.resize_with(v + 1, || VmState {
                stack: StackDistance::new(),
                all: shape.cleared(),
                read: shape.cleared(),
                window: DistanceHistogram::exact(),
                touched: FxHashSet::default(),
                requests: 0,
                mix: mix.then(ReuseMixTracker::default),
            });
        }
        let s = &mut self.vms[v];
        s.requests += 1;
        if r.len == 0 {
            return;
        }
        if let Some(m) = s.mix.as_mut().filter(|_| r.op.is_write()) {
            m.write_request();
        }
        for b in r.offset >> self.shift..=(r.end() - 1) >> self.shift {
            let d = s.stack.access(b);
            s.all.add(d, 1.0);
            s.window.add(d, 1.0);
            if !r.op.is_write() {
                s.read.add(d, 1.0);
            }
            if let Some(m) = s.mix.as_mut() {
                m.access(b, r.op.is_write());
            }
            s.touched.insert(b);
        }
    }

    /// The (decayed) histogram of all accesses of `vm` so far this interval.
    pub fn histogram(&self, vm: u32) -> Option<&DistanceHistogram> {
        self.vms.get(vm as usize).map(|s| &s.all)
    }

    /// The (decayed) histogram of the reads of `vm`: its useful reuses (URD).
    pub fn read_histogram(&self, vm: u32) -> Option<&DistanceHistogram> {
        self.vms.get(vm as usize).map(|s| &s.read)
    }

    /// The (decayed) reuse kinds of `vm`, when tracked.
    pub fn reuse_mix(&self, vm: u32) -> Option<ReuseMix> {
        self.vms.get(vm as usize).and_then(|s| s.mix.as_ref()).map(|m| m.mix)
    }

    /// Ends the current interval: rows for every VM, then decay and counters reset.
    pub fn close(&mut self) -> Vec<IntervalRow> {
        let start = self.start_ns.unwrap_or(0);
        let (t_end, span_s) = match self.interval {
            Interval::Time(ns) => ((start + (self.index + 1) * ns) as f64 / 1e9, ns as f64 / 1e9),
            Interval::Requests(_) => (self.last_ns as f64 / 1e9, 0.0),
        };
        let mut rows = Vec::new();
        for (vm, s) in self.vms.iter_mut().enumerate() {
            let first = self.sizes.first().copied().unwrap_or(0);
            rows.push(IntervalRow {
                interval: self.index,
                t_end_s: t_end,
                vm: vm as u32,
                requests: s.requests,
                iops: if span_s > 0.0 { s.requests as f64 / span_s } else { 0.0 },
                wss_blocks: s.touched.len() as u64,
                hit_ratio: self.sizes.iter().map(|&c| 1.0 - s.all.miss_ratio_at(c)).collect(),
                urd_blocks: s.read.size_covering_reuses(self.urd_fraction),
                alloc_unit_blocks: (s.window.total() - s.window.hits_at(first)).round() as u64,
            });
            match self.decay {
                Decay::Reset => {
                    s.all = s.all.cleared();
                    s.read = s.read.cleared();
                    if let Some(m) = s.mix.as_mut() {
                        m.mix = ReuseMix::default();
                    }
                }
                Decay::Keep => {}
                Decay::Factor(f) => {
                    s.all.scale(f);
                    s.read.scale(f);
                    if let Some(m) = s.mix.as_mut() {
                        m.mix.scale(f);
                    }
                }
            }
            s.window = DistanceHistogram::exact();
            s.touched.clear();
            s.requests = 0;
        }
        self.index += 1;
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachevisor_trace::Op;

    fn req(t: u64, b: u64) -> Request {
        Request { time_ns: t, vm: 0, op: Op::Read, offset: b * 4096, len: 4096 }
    }

    #[test]
    fn intervals_by_requests_with_reset_and_keep() {
        // Interval 0: blocks 1 2 1 2 (2 hits at size 2); interval 1: 3 3 3 1.
        let seq = [1, 2, 1, 2, 3, 3, 3, 1];
        for (decay, want1) in [(Decay::Reset, 2.0 / 4.0), (Decay::Keep, 4.0 / 8.0)] {
            let mut p = IntervalProfiler::new(4096, Interval::Requests(4), decay, vec![2], 1.0);
            let rows: Vec<_> =
                seq.iter().enumerate().filter_map(|(i, &b)| p.add(&req(i as u64, b))).flatten().collect();
            assert_eq!(rows.len(), 2);
            assert_eq!((rows[0].wss_blocks, rows[0].hit_ratio[0]), (2, 0.5));
            // Interval 1 at size 2: 3 3 hit, 3 hits, 1 misses (distance 2: blocks 2, 3).
            assert_eq!(rows[1].hit_ratio[0], want1, "{decay:?}");
            assert_eq!(rows[1].alloc_unit_blocks, 2, "misses at size 2 in interval 1: first 3 and 1");
            assert_eq!(rows[1].wss_blocks, 2);
        }
    }

    #[test]
    fn coarse_resolution_gives_the_same_curve_at_its_steps() {
        let mut exact = IntervalProfiler::new(4096, Interval::Requests(u64::MAX), Decay::Keep, vec![], 1.0);
        let mut coarse =
            IntervalProfiler::new(4096, Interval::Requests(u64::MAX), Decay::Keep, vec![], 1.0).with_resolution(4, 8);
        for i in 0..2000u64 {
            let r = req(i, (i * 7919) % 97 + (i % 5));
            exact.add(&r);
            coarse.add(&r);
        }
        let (e, c) = (exact.histogram(0).unwrap(), coarse.histogram(0).unwrap());
        assert_eq!(e.hits_curve(4, 8), c.hits_curve(4, 8));
        assert_eq!(e.total(), c.total());
    }

    #[test]
    fn intervals_by_time_report_iops() {
        let mut p = IntervalProfiler::new(4096, Interval::Time(1_000_000_000), Decay::Reset, vec![1], 0.95);
        let mut rows = Vec::new();
        for i in 0..30u64 {
            rows.extend(p.add(&req(i * 100_000_000, i % 3)).into_iter().flatten());
        }
        rows.extend(p.close());
        assert_eq!(rows.len(), 3);
        assert!(rows.iter().all(|r| r.requests == 10 && (r.iops - 10.0).abs() < 1e-9));
    }
}
