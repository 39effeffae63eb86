//! The lookahead oracle's curves: each window's exact future hit curves per VM, which an
//! allocator fed them (`cache.lookahead`) uses as if it knew what comes next — the bound an
//! online allocator is measured against.
//!
//! Open loop, windows are trace time ÷ speedup, so one pre-pass cuts the merged stream
//! ([`window_curves`]). Closed loop, a window's requests depend on the allocation (a VM
//! served faster issues more), so the curves are cut while replaying
//! ([`ClosedLookahead`]): each VM's own request order is fixed, so every access's stack
//! distance over the VM's history is computed once up front, and at a window's end the
//! oracle reads each VM's next requests — as many as it issued in the window just ended
//! (its current pace), [`FIRST_WINDOW_REQUESTS`] before the first.

use crate::inputs::{open_inputs, SimError};
use crate::scenario::{Resolved, Scenario};
use cachevisor_analysis::{DistanceHistogram, ReuseMix, ReuseMixTracker, StackDistance};
use cachevisor_policy::controller::Estimates;
use cachevisor_trace::Request;

/// Requests per VM the closed-loop oracle looks ahead before any window has ended.
pub(crate) const FIRST_WINDOW_REQUESTS: u64 = 1_000;

/// Write flag of an encoded access (top bit); the rest is the distance.
const WRITE: u64 = 1 << 63;
/// Encoded distance of a first access.
const COLD: u64 = WRITE - 1;

/// Closed loop: every access's stack distance over its VM's history, by request.
pub(crate) struct ClosedLookahead {
    unit: u64,
    units: usize,
    /// Per VM, per block access in the VM's order: distance (or [`COLD`]) | [`WRITE`].
    access: Vec<Vec<u64>>,
    /// Per VM, index in `access` of each request's first block, then the end.
    starts: Vec<Vec<usize>>,
}

impl ClosedLookahead {
    /// Distances of every VM's requests (`per_vm`, each in issue order) at `block_size`;
    /// curves in steps of `unit` blocks, `units` points past 0.
    pub(crate) fn new(per_vm: &[Vec<Request>], block_size: u64, unit: u64, units: usize) -> Self {
        let shift = block_size.trailing_zeros();
        let mut access = Vec::with_capacity(per_vm.len());
        let mut starts = Vec::with_capacity(per_vm.len());
        for reqs in per_vm {
            let mut stack = StackDistance::new();
            let mut a = Vec::new();
            let mut s = Vec::with_capacity(reqs.len() + 1);
            for q in reqs {
                s.push(a.len());
                if q.len == 0 {
                    continue;
                }
                let w = if q.op.is_write() { WRITE } else { 0 };
                for b in q.offset >> shift..=(q.end() - 1) >> shift {
                    a.push(stack.access(b).map_or(COLD, |d| d.min(COLD - 1)) | w);
                }
            }
            s.push(a.len());
            access.push(a);
            starts.push(s);
        }
        ClosedLookahead { unit, units, access, starts }
    }

    /// Each VM's curves over its next `counts[vm]` requests from `cursors[vm]` (clipped at
    /// its end).
    pub(crate) fn curves(&self, cursors: &[usize], counts: &[u64]) -> Vec<Estimates> {
        (0..self.access.len())
            .map(|vm| {
                let s = &self.starts[vm];
                let first = cursors.get(vm).copied().unwrap_or(0).min(s.len() - 1);
                let last = (first + counts.get(vm).copied().unwrap_or(0) as usize).min(s.len() - 1);
                let mut all = DistanceHistogram::coarse(self.unit, self.units);
                let mut read = all.cleared();
                for &x in &self.access[vm][s[first]..s[last]] {
                    let d = x & !WRITE;
                    let d = (d != COLD).then_some(d);
                    all.add(d, 1.0);
                    if x & WRITE == 0 {
                        read.add(d, 1.0);
                    }
                }
                Estimates {
                    all: all.hits_curve(self.unit, self.units),
                    read: read.hits_curve(self.unit, self.units),
                    accesses: all.total(),
                    mix: ReuseMix::default(),
                }
            })
            .collect()
    }
}

/// Pre-pass for the lookahead oracle: each window's own exact curves per VM (distances
/// over the whole history, counts of that window only), windows by trace time ÷ speedup.
pub(crate) fn window_curves(
    sc: &Scenario,
    res: Resolved,
    unit: u64,
    limit: u64,
) -> Result<Vec<Vec<Estimates>>, SimError> {
    let mut trace = open_inputs(sc)?;
    let units = (res.slots / unit) as usize;
    let shift = res.cache.block_size.trailing_zeros();
    let mut stacks: Vec<StackDistance> = Vec::new();
    let mut mixes: Vec<ReuseMixTracker> = Vec::new();
    let mut cur: Vec<(DistanceHistogram, DistanceHistogram)> = Vec::new();
    let mut out: Vec<Vec<Estimates>> = Vec::new();
    let close = |cur: &mut Vec<(DistanceHistogram, DistanceHistogram)>,
                 mixes: &mut Vec<ReuseMixTracker>,
                 out: &mut Vec<Vec<Estimates>>| {
        out.push(
            cur.iter_mut()
                .zip(mixes.iter_mut())
                .map(|((a, r), m)| {
                    let w = Estimates {
                        all: a.hits_curve(unit, units),
                        read: r.hits_curve(unit, units),
                        accesses: a.total(),
                        mix: m.mix,
                    };
                    *a = a.cleared();
                    *r = r.cleared();
                    m.mix = ReuseMix::default();
                    w
                })
                .collect(),
        );
    };
    let mut n = 0;
    while n < limit {
        let Some(q) = trace.next_request()? else { break };
        n += 1;
        let w = ((q.time_ns as f64 / sc.replay.speedup) as u64 / res.window_ns) as usize;
        while out.len() < w {
            close(&mut cur, &mut mixes, &mut out);
        }
        let v = q.vm as usize;
        if stacks.len() <= v {
            stacks.resize_with(v + 1, StackDistance::new);
            mixes.resize_with(v + 1, Default::default);
            cur.resize_with(v + 1, || (DistanceHistogram::coarse(unit, units), DistanceHistogram::coarse(unit, units)));
        }
        if q.len == 0 {
            continue;
        }
        if q.op.is_write() {
            mixes[v].write_request();
        }
        for b in q.offset >> shift..=(q.end() - 1) >> shift {
            let d = stacks[v].access(b);
            cur[v].0.add(d, 1.0);
            if !q.op.is_write() {
                cur[v].1.add(d, 1.0);
            }
            mixes[v].access(b, q.op.is_write());
        }
    }
    close(&mut cur, &mut mixes, &mut out);
    Ok(out)
}
