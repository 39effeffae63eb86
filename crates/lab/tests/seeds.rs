//! Every experiment at the quick size: it runs, writes its report, and the claims it marks
//! `asserted` hold on its own measurements.

use cachevisor_lab::seeds::{run, Options, Size, NAMES};
use std::path::PathBuf;

fn traces() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces")
}

fn check(name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options { size: Size::Quick, out: dir.path().to_path_buf(), traces: traces(), cachesim: None };
    let report = run(name, &opts, &mut |_| {}).unwrap_or_else(|e| panic!("{name}: {e}"));
    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    assert!(
        html.contains("<svg") && html.contains("<table") && html.contains("Scenarios"),
        "{name}: report lacks a figure, table or scenarios"
    );
    assert!(dir.path().join("report.json").is_file());
    assert!(report.claims.iter().any(|c| c.asserted), "{name}: no claim is checked");
    for c in report.claims.iter().filter(|c| c.asserted) {
        assert!(c.holds, "{name}: claim does not hold: {} ({})", c.text, c.evidence);
    }
}

#[test]
fn every_experiment_is_registered() {
    assert_eq!(NAMES.len(), 8);
}

#[test]
fn scave_corun() {
    check("scave-corun");
}

#[test]
fn recs_tracking() {
    check("recs-tracking");
}

#[test]
fn eci_endurance() {
    check("eci-endurance");
}

#[test]
fn symflex_proportional() {
    check("symflex-proportional");
}

#[test]
fn policy_compare() {
    check("policy-compare");
}

#[test]
fn prewarm_failover() {
    check("prewarm-failover");
}

#[test]
fn elica() {
    check("elica");
}

#[test]
fn admission() {
    check("admission");
}
