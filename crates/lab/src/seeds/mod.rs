//! `cachevisor experiment NAME`: the seeds' experiments, reproduced on the simulator with
//! the bundled real traces and the generator configs in `crates/lab/workloads/`, each
//! writing a report a person can read ([`report_html`]). Every experiment states the
//! seed's findings as claims and checks them on its own measurements; the test suite runs
//! each at the quick size and asserts the claims marked `asserted`.

pub mod admission;
mod admission_shared;
mod admission_timing;
pub mod eci_endurance;
pub mod elica;
mod elica_setup;
mod elica_summary;
pub mod heldout_mixes;
pub mod policy_compare;
pub mod prewarm_failover;
mod prewarm_load;
mod prewarm_sets;
pub mod recs_tracking;
pub mod report_html;
pub mod scave_corun;
pub mod symflex_proportional;

use cachevisor_sim::report::SimResult;
use cachevisor_sim::scenario::Scenario;
use cachevisor_sim::simulate;
pub use report_html::{Claim, Report, Section, Table};
use std::path::PathBuf;

/// Every experiment.
pub const NAMES: [&str; 8] = [
    "scave-corun",
    "recs-tracking",
    "eci-endurance",
    "symflex-proportional",
    "policy-compare",
    "prewarm-failover",
    "elica",
    "admission",
];

/// How long an experiment runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Size {
    /// Seconds: what the test suite runs.
    Quick,
    /// Under 5 minutes on 2 cores.
    Default,
    /// Longer runs (`--full`).
    Full,
}

impl Size {
    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Size::Quick => "quick",
            Size::Default => "default",
            Size::Full => "full",
        }
    }

    /// Picks the value for this size.
    pub fn pick<T>(self, quick: T, default: T, full: T) -> T {
        match self {
            Size::Quick => quick,
            Size::Default => default,
            Size::Full => full,
        }
    }
}

/// Where an experiment reads and writes.
#[derive(Debug, Clone)]
pub struct Options {
    /// Run size.
    pub size: Size,
    /// Output directory (report, CSVs, generated workload files).
    pub out: PathBuf,
    /// The bundled real traces (`../shared/traces`).
    pub traces: PathBuf,
    /// libCacheSim's `cachesim` (built in Release from its source) to compare with, where
    /// an experiment has a comparison (`admission`).
    pub cachesim: Option<PathBuf>,
}

/// Runs experiment `name`; `log` gets one line per simulation.
pub fn run(name: &str, opts: &Options, log: &mut dyn FnMut(&str)) -> Result<Report, String> {
    std::fs::create_dir_all(opts.out.join("workloads")).map_err(|e| format!("{}: {e}", opts.out.display()))?;
    let report = match name {
        "scave-corun" => scave_corun::run(opts, log)?,
        "recs-tracking" => recs_tracking::run(opts, log)?,
        "eci-endurance" => eci_endurance::run(opts, log)?,
        "symflex-proportional" => symflex_proportional::run(opts, log)?,
        "policy-compare" => policy_compare::run(opts, log)?,
        "prewarm-failover" => prewarm_failover::run(opts, log)?,
        "elica" => elica::run(opts, log)?,
        "admission" => admission::run(opts, log)?,
        _ => return Err(format!("unknown experiment `{name}` (one of {})", NAMES.join(", "))),
    };
    report.write(&opts.out).map_err(|e| format!("{}: {e}", opts.out.display()))?;
    Ok(report)
}

/// The generator config templates, by file name.
const TEMPLATES: [(&str, &str); 5] = [
    ("strong", include_str!("../../workloads/strong.yaml")),
    ("weak", include_str!("../../workloads/weak.yaml")),
    ("hotcold", include_str!("../../workloads/hotcold.yaml")),
    ("mixed-rw", include_str!("../../workloads/mixed-rw.yaml")),
    ("nutanix-syn", include_str!("../../workloads/nutanix-syn.yaml")),
];

/// Writes a variant of template `kind` as `out/workloads/NAME.yaml`: `name` set and each
/// `(key, value)` replacing that top-level key's line (or block, for lists).
pub fn workload(opts: &Options, kind: &str, name: &str, set: &[(&str, &str)]) -> Result<PathBuf, String> {
    let text = TEMPLATES.iter().find(|t| t.0 == kind).ok_or(format!("no workload template `{kind}`"))?.1;
    let mut lines: Vec<String> = Vec::new();
    let mut skipping = false;
    for l in text.lines() {
        if skipping && (l.starts_with(' ') || l.starts_with('-')) {
            continue;
        }
        skipping = false;
        let key = l.split(':').next().unwrap_or("");
        if key == "name" {
            lines.push(format!("name: {name}"));
        } else if let Some((k, v)) = set.iter().find(|(k, _)| *k == key) {
            lines.push(format!("{k}: {v}"));
            skipping = true; // drop the old value's indented block
        } else {
            lines.push(l.to_string());
        }
    }
    let path = opts.out.join("workloads").join(format!("{name}.yaml"));
    std::fs::write(&path, lines.join("\n") + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// Runs one scenario, logging its label; the scenario's TOML is kept for the report.
pub fn sim(
    label: &str,
    sc: &Scenario,
    scenarios: &mut Vec<(String, String)>,
    log: &mut dyn FnMut(&str),
) -> Result<SimResult, String> {
    let t = std::time::Instant::now();
    let r = simulate(sc, &mut |_| {}).map_err(|e| format!("{label}: {e}"))?;
    log(&format!(
        "{label}: {} requests, {:.1} s virtual, {:.2} s wall",
        r.total.requests,
        r.virtual_time_s,
        t.elapsed().as_secs_f64()
    ));
    scenarios.push((label.to_string(), toml::to_string(sc).unwrap_or_default()));
    Ok(r)
}

/// A real bundled trace by file name.
pub fn real_trace(opts: &Options, file: &str) -> Result<PathBuf, String> {
    let p = opts.traces.join(file);
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!("bundled trace {} not found (set CACHEVISOR_TRACES to the shared/traces folder)", p.display()))
    }
}

/// Formats a ratio as a percentage with one decimal.
pub fn pct(x: f64) -> String {
    format!("{:.1}", x * 100.0)
}
