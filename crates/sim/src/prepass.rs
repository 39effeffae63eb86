//! The pre-pass over a scenario's inputs before the replay for allocators that decide
//! once: whole-trace estimates (the lookahead oracle's curves are in `lookahead.rs`).

use crate::inputs::{open_inputs, SimError};
use crate::scenario::{Resolved, Scenario};
use cachevisor_analysis::{Kind, Method, Profiler, ReuseMixTracker};
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
    let mut prof = Profiler::new(res.cache.block_size, Method::Exact);
    if !needs.read_curves {
        prof = prof.all_only();
    }
    let mut mixes: Vec<ReuseMixTracker> = Vec::new();
    let shift = res.cache.block_size.trailing_zeros();
    let mut n = 0;
    while n < limit {
        let Some(r) = trace.next_request()? else { break };
        prof.add(&r);
        if needs.reuse_mix && r.len > 0 {
            if mixes.len() <= r.vm as usize {
                mixes.resize_with(r.vm as usize + 1, Default::default);
            }
            let m = &mut mixes[r.vm as usize];
            if r.op.is_write() {
                m.write_request();
            }
            for b in r.offset >> shift..=(r.end() - 1) >> shift {
                m.access(b, r.op.is_write());
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
