//! The `cachevisor` binary as a user runs it: real files, real output, real exit codes.

use std::path::PathBuf;
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cachevisor"))
}

fn shared(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces").join(name).display().to_string()
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("binary runs")
}

fn ok(args: &[&str]) -> String {
    let o = run(args);
    assert!(o.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn trace_info_profiles_each_vm_and_the_total() {
    let out = ok(&["trace", "info", &shared("websearch-small.mqsim.txt"), &shared("cloudPhysicsIO.vscsi")]);
    assert!(out.contains("websearch-small") && out.contains("cloudPhysicsIO") && out.contains("total"), "{out}");
    assert!(out.contains("24783") && out.contains("113872"), "{out}");
    let json = ok(&["trace", "info", "--json", "--vm-mode", "device", &shared("websearch-small.mqsim.txt")]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 7, "6 devices and the total");
}

#[test]
fn malformed_input_exits_1_naming_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("broken.csv");
    std::fs::write(
        &p,
        "128166372003061629,hm,0,Write,7014912,4096,26\n128166372003061629,hm,0,Write,7014912,4x96,26\n",
    )
    .unwrap();
    let o = run(&["trace", "info", "--format", "msr", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("broken.csv") && err.contains("line 2") && err.contains("`Size`"), "{err}");
    let o = run(&["trace", "info", "--format", "msr", "--skip-bad", p.to_str().unwrap()]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("skipped 1 malformed records, first at line 2"));
}

#[test]
fn convert_and_generate_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("cp.csv");
    ok(&["trace", "convert", &shared("cloudPhysicsIO.vscsi"), "--to", "csv", "-o", csv.to_str().unwrap()]);
    let a = ok(&["trace", "info", "--json", &shared("cloudPhysicsIO.vscsi")]);
    let b = ok(&["trace", "info", "--json", csv.to_str().unwrap()]);
    let (a, b): (serde_json::Value, serde_json::Value) =
        (serde_json::from_str(&a).unwrap(), serde_json::from_str(&b).unwrap());
    assert_eq!(a[0]["requests"], b[0]["requests"]);
    assert_eq!(a[0]["wss_blocks"], b[0]["wss_blocks"]);
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../trace/tests/fixtures/nutanix-example.yaml");
    let (g1, g2) = (dir.path().join("g1.csv"), dir.path().join("g2.csv"));
    for g in [&g1, &g2] {
        ok(&["trace", "generate", fixture.to_str().unwrap(), "--seed", "7", "-o", g.to_str().unwrap()]);
    }
    assert_eq!(std::fs::read(&g1).unwrap(), std::fs::read(&g2).unwrap(), "same seed, same bytes");
}

#[test]
fn simulate_compares_policies_and_writes_results() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sim");
    let text = ok(&[
        "simulate",
        "--trace",
        &shared("tpcc-small.mqsim.txt"),
        &shared("cloudPhysicsIO.vscsi"),
        "--cache-size",
        "32MiB",
        "--replacement",
        "lru,clock",
        "--partition",
        "static,shared",
        "--max-requests",
        "20000",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        text.contains("== comparison") && text.contains("shared-clock-wb") && text.contains("static-lru-wb"),
        "{text}"
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("static-clock-wb/result.json")).unwrap()).unwrap();
    assert_eq!(r["total"]["requests"], 20000);
    assert_eq!(r["scenario"]["cache"]["replacement"], "clock");
    assert!(out.join("comparison.csv").is_file() && out.join("static-lru-wb/windows.csv").is_file());
    let csv = std::fs::read_to_string(out.join("static-lru-wb/vms.csv")).unwrap();
    assert!(csv.starts_with("vm,requests,"), "plain CSV, one header row: {csv}");
    let scenario = std::fs::read_to_string(out.join("static-lru-wb/scenario.toml")).unwrap();
    assert!(scenario.contains("[cache]") && scenario.contains("replacement = \"lru\""), "{scenario}");
    // One run into the same directory: no stale comparison of the earlier runs beside it.
    ok(&[
        "simulate",
        "--trace",
        &shared("tpcc-small.mqsim.txt"),
        "--cache-size",
        "32MiB",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!out.join("comparison.csv").exists());
}

#[test]
fn simulate_runs_a_grid_of_policies_and_working_set_fractions_across_cores() {
    let dir = tempfile::tempdir().unwrap();
    let trace = shared("cloudPhysicsIO.vscsi");
    let info: serde_json::Value = serde_json::from_str(&ok(&["trace", "info", "--json", &trace])).unwrap();
    let ws_blocks = info[0]["wss_blocks"].as_u64().unwrap();
    let grid = |jobs: &str, out: &std::path::Path| {
        let args = ["simulate", "--trace", &trace, "--partition", "shared", "--replacement", "lru,fifo"];
        let o = bin()
            .args(args)
            .args(["--cache-size", "0.01,10%,1.0", "--jobs", jobs, "--out", out.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    let text = grid("2", &two);
    grid("1", &one);
    let mut lru = Vec::new();
    for policy in ["lru", "fifo"] {
        for (size, frac) in [("0.01", 0.01), ("10%", 0.1), ("1.0", 1.0)] {
            let label = format!("shared-{policy}-wb-{size}");
            assert!(text.contains(&label), "{label} in {text}");
            let read = |d: &std::path::Path| std::fs::read_to_string(d.join(&label).join("result.json")).unwrap();
            assert_eq!(read(&one), read(&two), "{label}: two at once gives what one at a time gives");
            let r: serde_json::Value = serde_json::from_str(&read(&two)).unwrap();
            let want = ((ws_blocks as f64 * frac) as u64).max(1) * 4096;
            assert_eq!(r["scenario"]["cache"]["size"], format!("{want}B"), "{label}");
            if policy == "lru" {
                lru.push(r["total"]["hit_ratio"].as_f64().unwrap());
            }
        }
    }
    assert!(lru[0] < lru[1] && lru[1] < lru[2], "LRU hits grow with the cache: {lru:?}");
    for jobs in ["0", "1025", "99999999999"] {
        let o = run(&["simulate", "--trace", &trace, "--jobs", jobs]);
        assert_eq!(o.status.code(), Some(2), "--jobs {jobs}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("--jobs"), "--jobs {jobs}");
    }
    let o = run(&["simulate", "--trace", &trace, "--cache-size", "0.01,1.5"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--cache-size") && err.contains("(0, 1]"), "{err}");
}

#[test]
fn bad_options_are_explained() {
    let o = run(&["simulate", "--trace", &shared("tpcc-small.mqsim.txt"), "--replacement", "mru"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("s3fifo"));
    let o = run(&["simulate", "--trace", &shared("tpcc-small.mqsim.txt"), "--cache-size", "12 parsecs"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cache.size"));
}

#[test]
fn demo_runs_on_the_bundled_traces() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo");
    let text = ok(&["demo", "--cache-size", "32MiB", "--out", out.to_str().unwrap()]);
    assert!(
        text.contains("== comparison")
            && text.contains("static-s3fifo")
            && text.contains("adaptive-s3fifo")
            && text.contains("shared-clock"),
        "{text}"
    );
    assert!(out.join("comparison.csv").is_file());
    // Every run's folder has a name a shell user types as is.
    let mut runs = 0;
    for e in std::fs::read_dir(&out).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            let name = e.file_name().into_string().unwrap();
            assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)), "run folder `{name}`");
            assert!(e.path().join("result.json").is_file(), "{name}");
            runs += 1;
        }
    }
    assert_eq!(runs, 8);
}

#[test]
fn analyze_mrc_writes_curves_summary_and_plot() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("an");
    let text = ok(&[
        "analyze",
        "mrc",
        &shared("cloudPhysicsIO.vscsi"),
        &shared("tpcc-small.mqsim.txt"),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(text.contains("cloudPhysicsIO") && text.contains("URD p95"), "{text}");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["vms"][0]["wss_bytes"], 269_210u64 * 4096);
    let csv = std::fs::read_to_string(out.join("mrc.csv")).unwrap();
    assert!(
        csv.starts_with("size_bytes,size_blocks,cloudPhysicsIO,tpcc-small\n0,0,1.000000,1.000000\n"),
        "{}",
        &csv[..80]
    );
    assert!(std::fs::read_to_string(out.join("mrc.svg")).unwrap().contains("miss ratio"));
    let sh = ok(&[
        "analyze",
        "mrc",
        &shared("cloudPhysicsIO.vscsi"),
        "--method",
        "shards",
        "--rate",
        "0.1",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(sh.contains("cloudPhysicsIO"));
}

#[test]
fn analyze_bad_input_is_explained() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.mqsim.txt");
    std::fs::write(&empty, "").unwrap();
    for (args, want, code) in [
        (vec!["--method", "shards", "--rate", "1.5"], "(0, 1]", 1),
        // A block size of 0 is refused as the argument is parsed (a bad argument, 2).
        (vec!["--block-size", "0"], "--block-size", 2),
        (vec!["--method", "shards", "--max-blocks", "0"], "--max-blocks", 1),
    ] {
        let trace = shared_static();
        let mut a = vec!["analyze", "mrc", trace.as_str()];
        a.extend(args.iter().copied());
        let o = run(&a);
        assert_eq!(o.status.code(), Some(code), "{a:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains(want), "{a:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let o = run(&["analyze", "mrc", "--format", "mqsim", empty.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no requests"));
}

fn shared_static() -> String {
    shared("tpcc-small.mqsim.txt")
}

#[test]
fn analyze_windows_writes_series_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("w");
    let text = ok(&[
        "analyze",
        "windows",
        &shared("cloudPhysicsIO.vscsi"),
        "--interval",
        "10min",
        "--sizes",
        "16MiB,1GiB",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(text.starts_with("13 intervals × 1 VMs"), "{text}");
    let csv = std::fs::read_to_string(out.join("windows.csv")).unwrap();
    assert!(csv.starts_with("interval,t_end_s,vm,requests,iops,wss_bytes,hit_ratio_16MiB,hit_ratio_1GiB,urd_bytes,alloc_unit_blocks\n0,600,cloudPhysicsIO,"), "{csv}");
    let total: u64 = csv.lines().skip(1).map(|l| l.split(',').nth(3).unwrap().parse::<u64>().unwrap()).sum();
    assert_eq!(total, 113_872, "every request lands in one interval");
    for f in ["iops.svg", "wss.svg", "hit_ratio.svg", "alloc_unit.svg"] {
        assert!(out.join(f).is_file(), "{f}");
    }
    let by_count = ok(&[
        "analyze",
        "windows",
        &shared("tpcc-small.mqsim.txt"),
        "--interval",
        "1000",
        "--decay",
        "0.5",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(by_count.starts_with("7 intervals"), "{by_count}");
    for (args, want) in
        [(vec!["--interval", "0"], "--interval"), (vec!["--decay", "2"], "--decay"), (vec!["--sizes", "1b"], "--sizes")]
    {
        let t = shared("tpcc-small.mqsim.txt");
        let mut a = vec!["analyze", "windows", t.as_str()];
        a.extend(args);
        let o = run(&a);
        assert_eq!(o.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&o.stderr).contains(want), "{}", String::from_utf8_lossy(&o.stderr));
    }
}

#[test]
fn version_completions_and_manual_pages_come_from_the_clap_definitions() {
    assert!(ok(&["--version"]).starts_with(&format!("cachevisor {}", env!("CARGO_PKG_VERSION"))));
    for shell in ["bash", "zsh", "fish"] {
        let script = ok(&["completions", shell]);
        assert!(
            script.contains("cachevisor") && script.contains("serve") && script.contains("discard-dirty"),
            "{shell}"
        );
    }
    assert!(!run(&["completions", "tcsh"]).status.success());
    let page = ok(&["man"]);
    assert!(page.contains(".TH cachevisor 1") && page.contains("serve"), "{page}");
    let dir = tempfile::tempdir().unwrap();
    ok(&["man", "--out", dir.path().to_str().unwrap()]);
    let serve = std::fs::read_to_string(dir.path().join("cachevisor-serve.1")).unwrap();
    assert!(serve.contains("discard\\-dirty"), "{serve}");
}

#[test]
fn new_users_are_told_what_is_going_on() {
    // A trace shorter than a second keeps its own rate (6,999 requests in 0.136 s).
    let info = ok(&["trace", "info", "--json", &shared("tpcc-small.mqsim.txt")]);
    let v: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert!(v[0]["avg_iops"].as_f64().unwrap() > 50_000.0, "{info}");
    // Open-loop replay faster than the disks serve: a warning names the bottleneck.
    let dir = tempfile::tempdir().unwrap();
    let out = ok(&[
        "simulate",
        "--trace",
        &shared("cloudPhysicsIO.vscsi"),
        "--cache-size",
        "64MiB",
        "--mode",
        "open",
        "--speedup",
        "10",
        "--max-requests",
        "20000",
        "--out",
        dir.path().join("sat").to_str().unwrap(),
    ]);
    let warnings: Vec<&str> = out.lines().filter(|l| l.starts_with("warning:")).collect();
    assert!(
        warnings.len() == 1 && warnings[0].contains("backing hdd-7200") && warnings[0].contains("--speedup"),
        "{out}"
    );
    // A headerless file mapped with --csv-columns loses no record (header=auto); a header
    // row is still skipped.
    let tsv = dir.path().join("t.tsv");
    let requests = |text: &str| {
        std::fs::write(&tsv, text).unwrap();
        let map = "time=0:us,vm=1,op=2,offset=3:sector,len=4,sep=tab";
        let info = ok(&["trace", "info", "--json", "--csv-columns", map, tsv.to_str().unwrap()]);
        serde_json::from_str::<serde_json::Value>(&info).unwrap()[0]["requests"].as_u64().unwrap()
    };
    assert_eq!(requests("0\tvmA\tR\t8\t4096\n1000\tvmA\tW\t16\t4096\n"), 2);
    assert_eq!(requests("time\tvm\top\toffset\tlen\n0\tvmA\tR\t8\t4096\n"), 1);
}

/// the `[cache]` keys the daemon's config and the simulator's scenario share
/// have one default and one error text: the same bad value gives the same message in
/// both, and an unset key the same setting.
#[test]
fn the_daemon_and_the_simulator_read_shared_cache_keys_alike() {
    let dir = tempfile::tempdir().unwrap();
    // `cache` lines in `[cache]`; `vdisk` lines in the daemon's one vDisk, `vm` ones
    // after the scenario's trace (a `[[vm]]` table).
    let daemon_with = |cache: &str, vdisk: &str| -> Result<cachevisor_server::config::Resolved, String> {
        let text = format!("[cache]\npath = \"c.img\"\nsize = \"64MiB\"\n{cache}\n[listen]\ntcp = \"127.0.0.1:0\"\n[[vdisk]]\nname = \"a\"\nbacking = \"a.img\"\nsize = \"1GiB\"\n{vdisk}");
        cachevisor_server::Config::parse(&text, "daemon", dir.path())?.resolve()
    };
    let sim_with = |cache: &str, vm: &str| -> Result<cachevisor_sim::scenario::Resolved, String> {
        let p = dir.path().join("s.toml");
        let trace = shared("websearch-small.mqsim.txt");
        std::fs::write(&p, format!("[cache]\nsize = \"64MiB\"\n{cache}\n[trace]\nfiles = [\"{trace}\"]\n{vm}"))
            .unwrap();
        cachevisor_sim::scenario::Scenario::load(&p)?.resolve()
    };
    let daemon = |extra: &str| daemon_with(extra, "");
    let sim = |extra: &str| sim_with(extra, "");
    for bad in [
        "flush_rate = \"fast\"",
        "writeback_percent = 150",
        "writeback_percent = -1",
        "writeback_ahead = 100000",
        "allocator = \"nope\"",
        "allocator = \"s-cave\"\nreplacement = \"lru\"",
        "allocator = \"static\"\nparams = { m = 5.0 }",
        "replacement = \"nope\"",
        "write_policy = \"nope\"",
        "partition = \"nope\"",
        "block_size = \"3000\"",
        "block_size = \"huge\"",
    ] {
        // A key serde refuses has TOML's error (file, line and the value marked), whose
        // last line is the key's own text; a key checked after parsing, that text alone.
        let text = |e: String| match e.contains("TOML parse error") {
            true => e.trim_end().rsplit('\n').next().unwrap().to_string(),
            false => e,
        };
        let (d, s) = (daemon(bad).map(|_| ()), sim(bad).map(|_| ()));
        let (d, s) = (text(d.unwrap_err()), text(s.unwrap_err()));
        assert_eq!(d, s, "`{bad}`: the daemon says `{d}`, the simulator `{s}`");
    }
    // A VM's weight and ratio: one range, (0, 1e6], in both (two at f64::MAX would sum to
    // infinity in an allocator).
    let vm_sim = |w: &str| sim_with("", &format!("[[vm]]\nname = \"a\"\nweight = {w}\n"));
    let vm_daemon = |w: &str| daemon_with("", &format!("weight = {w}\n"));
    for bad in ["0.0", "-1.0", "1000000.5", "1e308"] {
        let (d, s) = (vm_daemon(bad).unwrap_err(), vm_sim(bad).unwrap_err());
        assert!(d.contains(".weight: ") && d.contains("outside (0, 1000000]"), "{d}");
        assert_eq!(d.rsplit(").").next(), s.rsplit(").").next(), "`{bad}`: `{d}` vs `{s}`");
    }
    vm_daemon("1000000.0").unwrap();
    vm_sim("1000000.0").unwrap();
    // S-CAVE over LRU is fine on a shared pool (no cleaner runs there), in both.
    daemon("allocator = \"s-cave\"\nreplacement = \"lru\"\npartition = \"shared\"").unwrap();
    sim("allocator = \"s-cave\"\nreplacement = \"lru\"\npartition = \"shared\"").unwrap();
    // Unset, every shared key is the same setting — but the default write policy: the
    // daemon's is write-through (a client's data reaches its backing store before the
    // reply), the simulator's write-back (the seeds' setting, which its experiments
    // assume).
    let d = daemon("").unwrap().cache;
    let s = cachevisor_policy::cache_settings::CacheSettings::check(
        &cachevisor_sim::scenario::Scenario::default().cache.keys(),
    )
    .unwrap();
    use cachevisor_engine::WritePolicy;
    assert_eq!((d.write_policy, s.write_policy), (WritePolicy::Wt, WritePolicy::Wb));
    // (`size` has no default in the daemon: the cache file's size is the operator's.)
    let cachevisor_policy::cache_settings::CacheSettings {
        cache_bytes: _,
        block_size,
        replacement,
        write_policy: _,
        partition,
        allocator,
        params,
        writeback,
    } = d;
    assert_eq!((block_size, replacement, partition), (s.block_size, s.replacement, s.partition));
    assert_eq!((allocator, params, writeback), (s.allocator, s.params, s.writeback));
}

/// `cachevisor bench …` and `cachevisor experiment …` run the lab binary with the same
/// arguments (its exit status and messages pass through); without a lab binary beside it
/// or on PATH the command says where it looked and how to build one.
#[test]
fn bench_and_experiment_run_the_lab_binary_or_say_how_to_get_it() {
    let o = run(&["bench", "serve", "--rw", "randomly"]);
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("randrw"), "the lab's clap names the choices");
    let help = ok(&["experiment", "--help"]);
    assert!(help.contains("cachevisor-lab experiment") && help.contains("--quick"), "{help}");
    // The operator binary alone, as a package without the lab installs it.
    let dir = tempfile::tempdir().unwrap();
    let alone = dir.path().join("cachevisor");
    std::fs::copy(env!("CARGO_BIN_EXE_cachevisor"), &alone).unwrap();
    // A copy just written may be "busy" for a moment: another test's fork may hold the
    // write descriptor until it execs (ETXTBSY); tried again after a pause.
    let o = (0..50)
        .find_map(|_| match Command::new(&alone).args(["bench", "sim"]).env("PATH", dir.path()).output() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                std::thread::sleep(std::time::Duration::from_millis(100));
                None
            }
            r => Some(r.unwrap()),
        })
        .expect("the copied binary runs within 5 s");
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cachevisor-lab") && err.contains("cargo build --release -p cachevisor-lab"), "{err}");
}
