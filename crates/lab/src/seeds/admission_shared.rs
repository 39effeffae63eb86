//! `admission`'s section on one write budget for the whole cache (the engine's
//! `shared_budget.rs`, issue 57 point 5): the bundled traces under one cache-wide budget
//! split by hits per admitted block, beside the same total split by hand — equal parts,
//! and each VM's own half (the per-VM budgets of the section before). The question: at
//! the same SSD write rate, does the split by marginal value keep more hits?

use super::{pct, sim, Claim, Section, Table};
use cachevisor_engine::{AdmissionPolicy, BudgetRate};
use cachevisor_sim::report::SimResult;
use cachevisor_sim::scenario::{Scenario, VmSection};
use cachevisor_trace::units::format_size;

const GIB: f64 = (1u64 << 30) as f64;

/// One run's totals: its hit ratio and SSD bytes written.
fn totals(r: &SimResult) -> (f64, f64) {
    (r.total.hit_ratio, r.total.ssd_write_bytes as f64)
}

/// The section and its claims. `traces` is the bundled-traces scenario, `targets` each
/// VM's half rate (B/s) by `names`, `per_vm` the run with those as per-VM budgets.
pub(super) fn shared_budget(
    traces: &Scenario,
    names: &[String],
    targets: &[u64],
    per_vm: &SimResult,
    scenarios: &mut Vec<(String, String)>,
    log: &mut dyn FnMut(&str),
) -> Result<(Section, Vec<Claim>), String> {
    let total: u64 = targets.iter().sum();
    let mut shared = traces.clone();
    shared.cache.write_budget = Some(format!("{total}B/s"));
    let shared = sim("traces, one shared budget of the same total", &shared, scenarios, log)?;
    let mut equal = traces.clone();
    for name in names {
        let rate = BudgetRate::BytesPerSec((total / names.len() as u64).max(1));
        equal.vm.push(VmSection { admission: Some(AdmissionPolicy::WriteBudget { rate }), ..VmSection::named(name) });
    }
    let equal = sim("traces, the same total in equal per-VM budgets", &equal, scenarios, log)?;
    let st = shared.engine.write_budget.clone().ok_or("the shared run reports no budget")?;
    let rate = st.written_bytes as f64 / st.elapsed_s.max(1e-9);
    let by_stream = st.unspent_at_full_bytes as f64 / (total as f64 * st.elapsed_s).max(1.0);
    let mut t = Table::new(
        "shared_budget",
        &["split", "VM", "hit %", "SSD writes", "hits per admitted block", "share at the end (B/s)"],
    );
    for (split, r) in
        [("shared, by hits per admitted block", &shared), ("equal parts", &equal), ("each VM's own half", per_vm)]
    {
        for (i, v) in r.vms.iter().enumerate() {
            let share = v.entry.budget_share;
            t.rows.push(vec![
                if i == 0 { split.to_string() } else { String::new() },
                v.vm.clone(),
                pct(v.hit_ratio),
                format_size(v.ssd_write_bytes),
                share.and_then(|s| s.value).map_or("–".into(), |x| format!("{x:.2}")),
                share.and_then(|s| s.share_bytes_per_sec).map_or("–".into(), |x| format!("{x:.0}")),
            ]);
        }
        let (h, w) = totals(r);
        t.rows.push(vec![String::new(), "all VMs".into(), pct(h), format_size(w as u64), "–".into(), "–".into()]);
    }
    let (hs, ws) = totals(&shared);
    let (he, we) = totals(&equal);
    let (hp, wp) = totals(per_vm);
    let claims = vec![
        Claim {
            text: "One shared write budget holds the cache's SSD write rate within 5% of its target over the run, or falls short only by what it left unspent while letting in every miss (the VMs' streams had too few).".into(),
            holds: rate <= 1.05 * total as f64 && (1.0 - rate / total as f64 - by_stream) <= 0.05,
            evidence: format!(
                "{rate:.0} B/s against {total} B/s ({:+.1}%; {:.1}% of the target unspent at probability 1)",
                100.0 * (rate / total as f64 - 1.0),
                100.0 * by_stream
            ),
            asserted: true,
        },
        Claim {
            text: "Under the same total target, the shared budget split by hits per admitted block keeps at least the hits of the same total split by hand (equal parts, or each VM's own half), and at least as many hits per SSD byte.".into(),
            holds: hs + 0.0005 >= he.max(hp) && hs / ws >= (he / we).max(hp / wp),
            evidence: format!(
                "shared {}% with {} ({:.2} points per GiB); equal parts {}% with {} ({:.2}); each VM's half {}% with {} ({:.2}) — a hand split leaves unspent what one VM cannot use",
                pct(hs),
                format_size(ws as u64),
                100.0 * hs / ws * GIB,
                pct(he),
                format_size(we as u64),
                100.0 * he / we * GIB,
                pct(hp),
                format_size(wp as u64),
                100.0 * hp / wp * GIB
            ),
            asserted: false,
        },
    ];
    let section = Section {
        heading: "One write budget for the cache".into(),
        text: format!(
            "The same traces under one cache-wide budget of {total} B/s (the sum of the per-VM targets above, as [cache] write_budget), split every second — a tenth in equal parts, the rest by each VM's hits per admitted block — beside the same total as equal per-VM budgets and as each VM's own half. Hits per admitted block: hits on blocks the budget let in over the blocks it let in (smoothed); share at the end: the rate of admitted misses' writes the VM was given in the last period (0 for a VM whose trace had ended: no misses to admit)."
        ),
        figure: None,
        table: Some(t),
    };
    Ok((section, claims))
}
