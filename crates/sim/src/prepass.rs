//! Pre-passes over a scenario's inputs before the replay: whole-trace estimates for
//! allocators that decide once, and each window's exact curves for the lookahead oracle.

use crate::inputs::{open_inputs, SimError};
use crate::scenario::{Resolved, Scenario};
use cachevisor_analysis::{Kind, Method, Profiler, ReuseMix, ReuseMixTracker};
use cachevisor_policy::controller::Estimates;
use cachevisor_policy::Needs;

/// Pre-pass for allocators that need estimates once: exact whole-trace LRU hit curves per
/// VM (all accesses and reads, in steps of `unit` blocks up to the cache size), reuse
/// kinds, and every VM name in stream order.
pub(crate) fn whole_trace(
    sc: &Scenario,
    res: Resolved,
    unit: u64,
    limit: u64,
    needs: Needs,
) -> Result<(Vec<Estimates>, Vec<String>), SimError> {
    let mut trace = open_inputs(sc)?;
    let mut prof = Profiler::new(res.block_size, Method::Exact);
    if !needs.read_curves {
        prof = prof.all_only();
    }
    let mut mixes: Vec<ReuseMixTracker> = Vec::new();
    let shift = res.block_size.trailing_zeros();
    let mut n = 0;
    while n < limit {
        let Some(r) = trace.next_request()? else { break };
        prof.add(&r);
        if needs.reuse_mix && r.len > 0 {
            if mixes.len() <= r.vm as usize {
                mixes.resize_with(r.vm as usize + 1, Default::default);
            }
            for b in r.offset >> shift..=(r.end() - 1) >> shift {
                mixes[r.vm as usize].access(b, r.op.is_write());
            }
        }
        n += 1;
    }
    let units = (res.slots / unit) as usize;
    let whole = prof
        .vms()
        .iter()
        .enumerate()
        .map(|(i, v)| Estimates {
            all: v.histogram(Kind::All).hits_curve(unit, units),
            read: if needs.read_curves { v.histogram(Kind::Read).hits_curve(unit, units) } else { Vec::new() },
            accesses: v.accesses(Kind::All) as f64,
            mix: mixes.get(i).map(|m| m.mix).unwrap_or_default(),
        })
        .collect();
    Ok((whole, trace.vm_names().to_vec()))
}

/// Pre-pass for the lookahead oracle: each window's own exact curves per VM (distances
/// over the whole history, counts of that window only), windows by trace time ÷ speedup.
pub(crate) fn window_curves(
    sc: &Scenario,
    res: Resolved,
    unit: u64,
    limit: u64,
) -> Result<Vec<Vec<Estimates>>, SimError> {
    use cachevisor_analysis::{DistanceHistogram, StackDistance};
    let mut trace = open_inputs(sc)?;
    let units = (res.slots / unit) as usize;
    let shift = res.block_size.trailing_zeros();
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
