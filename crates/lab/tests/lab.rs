//! The lab binary as a user runs it (`cachevisor-lab`, which `cachevisor bench` and
//! `cachevisor experiment` run): its errors, a bench against a stand-in peer, and the one
//! seed experiment that runs on real daemons and guests.

use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cachevisor-lab"))
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("binary runs")
}

#[test]
fn bad_options_are_explained() {
    let o = run(&["bench", "serve", "--rw", "randomly"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("randrw"), "names the choices");
    let o = run(&["bench", "cluster-sim", "--migration", "instantly"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("gradual"), "names the choices");
    let o = run(&["experiment", "no-such-figure"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("scave-corun"), "names the experiments");
}

#[test]
fn bench_sim_reads_cachesims_output_and_names_a_bad_peer() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let script = |name: &str, body: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p.display().to_string()
    };
    // A stand-in printing cachesim's result line: its miss ratio becomes the hit ratio shown.
    let fake = script("cachesim", "echo \"$1 $3 cache size 1MiB, 20000 req, miss ratio 0.2500, throughput 1.00 MQPS\"");
    let quick = ["bench", "sim", "--requests", "20000", "--blocks", "2000", "--cache-blocks", "200", "--reps", "1"];
    let args = |peer: &str| -> Vec<String> {
        quick
            .iter()
            .map(|s| s.to_string())
            .chain(["--no-bundled", "--dir", &d, "--cachesim", peer].map(String::from))
            .collect()
    };
    let run_args = |a: Vec<String>| bin().args(&a).output().unwrap();
    let o = run_args(args(&fake));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("hit ratio 0.7500       (cachesim"), "{out}");
    assert!(out.contains("ratio cachevisor / libCacheSim, CLOCK"), "{out}");
    assert!(!out.contains("bundled real traces"), "--no-bundled: {out}");
    // A peer that is not there, or prints no result, is named.
    let missing = dir.path().join("nowhere/cachesim").display().to_string();
    let o = run_args(args(&missing));
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("nowhere/cachesim"), "{}", String::from_utf8_lossy(&o.stderr));
    let mute = script("mute", "echo usage");
    let o = run_args(args(&mute));
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no miss ratio") && err.contains("mute"), "{err}");
}

/// `experiment symflex-vssd --quick`: four real guests on four vSSDs under the daemon's
/// proportional-throughput allocator through Fig. 8's four windows, then Fig. 9's restarts
/// of a guest on a persistent vSSD; the report is written and its claims checked in CI
/// hold (VM1 grows when its ratio rises, VM3 and VM4 shrink when theirs fall; with P the
/// restarted guest takes blocks back and hits more from its first seconds than cold).
#[test]
fn the_symflex_vssd_experiment_runs_figs_8_and_9_on_real_vssds() {
    let dir = tempfile::tempdir().unwrap();
    let o = run(&["experiment", "symflex-vssd", "--quick", "--out", dir.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let d = dir.path().join("symflex-vssd");
    let html = std::fs::read_to_string(d.join("report.html")).unwrap();
    assert!(html.contains("Fig. 8a") && html.contains("Fig. 9") && html.matches("<svg").count() == 3);
    assert_eq!(std::fs::read_to_string(d.join("windows.csv")).unwrap().lines().count(), 5);
    assert_eq!(std::fs::read_to_string(d.join("persistence.csv")).unwrap().lines().count(), 6);
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(d.join("report.json")).unwrap()).unwrap();
    for c in r["claims"].as_array().unwrap().iter().filter(|c| c["asserted"] == true) {
        assert!(c["holds"] == true, "{c}");
    }
}
