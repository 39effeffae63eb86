//! `cachevisor experiment symflex-vssd`: SymFlex's Fig. 8 on real parts — a daemon serving
//! four elastic vSSDs over NBD with its `symflex-proportional` allocator, four guest-side
//! cache managers (`cachevisor-guest`, each on its own thread with its own vSSD, control
//! socket and origin) reading their origins through their vSSDs, each origin a slow
//! NBD disk (nbdkit's memory plugin behind its delay filter). Four windows as in §5.2: the
//! throughput ratios 1:2:3:3, then 4:2:3:3, then 4:2:1:1, then the same ratios with VM3's
//! hot set shrunk and VM2's grown. The report plots each vSSD's throughput and size over
//! time (Fig. 8a, 8b) and tables the measured throughput shares against the targets.

use crate::bench::serve::{free_port, spawn_serve, Proc};
use anyhow::{bail, Context};
use cachevisor_guest_manager::manager::{run_guest, start_guest, Mode, RunSpec};
use cachevisor_guest_manager::workload::Shape;
use cachevisor_lab::seeds::{Claim, Report, Section, Size, Table};
use cachevisor_sim::plot::{line_chart_svg, Series};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const VMS: usize = 4;
/// Each origin's size and the region's (64 one-MiB blocks shared by four vSSDs).
const ORIGIN_MIB: u64 = 64;
const REGION_MIB: u64 = 64;
/// (ratios, VM2's and VM3's hot size) per window; the hot fraction is 0.8 throughout.
const WINDOWS: [([f64; VMS], f64, f64); 4] = [
    ([1.0, 2.0, 3.0, 3.0], 0.4, 0.4),
    ([4.0, 2.0, 3.0, 3.0], 0.4, 0.4),
    ([4.0, 2.0, 1.0, 1.0], 0.4, 0.4),
    ([4.0, 2.0, 1.0, 1.0], 0.5, 0.25),
];

/// An nbdkit memory disk behind a delay filter on a unix socket.
pub(crate) fn slow_origin(dir: &Path, i: usize, delay_ms: u32) -> anyhow::Result<(Proc, String)> {
    let sock = dir.join(format!("origin{i}.sock"));
    let _ = std::fs::remove_file(&sock);
    let c = Command::new("nbdkit")
        .args(["-f", "-U"])
        .arg(&sock)
        .args(["--filter=delay", "memory", &format!("{ORIGIN_MIB}M"), &format!("rdelay={delay_ms}ms")])
        .stderr(Stdio::null())
        .spawn()
        .context("starting nbdkit (apt-get install nbdkit)")?;
    let p = Proc(c);
    for _ in 0..200 {
        if sock.exists() {
            return Ok((p, format!("nbd+unix:///?socket={}", sock.display())));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    bail!("nbdkit did not create {}", sock.display())
}

pub(crate) fn api_post(api: &str, token: &str, path: &str, body: serde_json::Value) -> anyhow::Result<()> {
    ureq::post(&format!("http://{api}{path}"))
        .set("Authorization", &format!("Bearer {token}"))
        .send_json(body)
        .with_context(|| format!("POST {path}"))?;
    Ok(())
}

/// Per VM, a new hot part (fraction, size) for its guest to take at its next interval.
type HotChanges = Arc<Vec<Mutex<Option<(f64, f64)>>>>;

/// One sample of the vSSDs: (valid blocks, host-measured throughput) per VM.
type Sample = (f64, Vec<(f64, f64)>);

/// Runs the experiment into `out`: Fig. 8, then Fig. 9.
pub fn run(size: Size, out: &Path, log: &mut dyn FnMut(&str)) -> anyhow::Result<Report> {
    std::fs::create_dir_all(out)?;
    let dir = &std::fs::canonicalize(out)?;
    let mut r = fig8(size, &dir.join("fig8"), log)?;
    let (claims, sections, cfg) = crate::experiment::persist::fig9(size, &dir.join("fig9"), log)?;
    r.claims.extend(claims);
    r.sections.extend(sections);
    r.scenarios.push(("Fig. 9 daemon configuration".into(), cfg));
    Ok(r)
}

/// Fig. 8 in `dir`.
fn fig8(size: Size, dir: &Path, log: &mut dyn FnMut(&str)) -> anyhow::Result<Report> {
    std::fs::create_dir_all(dir)?;
    let window = Duration::from_secs(size.pick(8, 40, 120));
    let delay_ms = 2;
    let mut origins = Vec::new();
    for i in 0..VMS {
        origins.push(slow_origin(dir, i, delay_ms)?);
    }
    let (port, api) = (free_port()?, format!("127.0.0.1:{}", free_port()?));
    let _ = std::fs::remove_file(dir.join("cache.img"));
    let _ = std::fs::remove_dir_all(dir.join("cache.img.meta"));
    let mut cfg = format!(
        "[cache]\npath = \"cache.img\"\nsize = \"4MiB\"\n[listen]\ntcp = \"127.0.0.1:{port}\"\n[api]\nlisten = \"{api}\"\n\
         [vssd]\nsize = \"{REGION_MIB}MiB\"\ndeflate_grace = \"2s\"\nallocator = \"symflex-proportional\"\ninterval = \"1s\"\n"
    );
    for (i, r) in WINDOWS[0].0.iter().enumerate() {
        cfg += &format!(
            "[[vssd.device]]\nname = \"vm{}\"\nmax_size = \"{REGION_MIB}MiB\"\ninitial_size = \"{}MiB\"\nratio = {r}\n",
            i + 1,
            REGION_MIB / VMS as u64
        );
    }
    cfg += "[[vdisk]]\nname = \"d\"\nbacking = \"d.img\"\nsize = \"16MiB\"\n";
    std::fs::write(dir.join("vssd.toml"), &cfg)?;
    let _daemon = spawn_serve(&dir.join("vssd.toml"), None)?;
    let token = std::fs::read_to_string(dir.join("cache.img.meta/api-token"))?;
    // The guests: one thread each, the hot part changed by the main thread per window.
    let total = window * WINDOWS.len() as u32;
    let hot: HotChanges = Arc::new((0..VMS).map(|_| Mutex::new(None)).collect());
    let failed = Arc::new(AtomicBool::new(false));
    let mut guests = Vec::new();
    for (i, (_, origin)) in origins.iter().enumerate() {
        let vssd = format!("nbd://127.0.0.1:{port}/vm{}", i + 1);
        let control = dir.join(format!("cache.img.meta/vm{}.vssd.sock", i + 1));
        let mut g = start_guest(&vssd, &control, origin, Mode::WriteThrough)?;
        let (hot, failed) = (hot.clone(), failed.clone());
        let spec = RunSpec {
            shape: Shape {
                origin: ORIGIN_MIB << 20,
                io: 64 << 10,
                hot_fraction: 0.8,
                hot_size: 0.4,
                write_ratio: 0.0,
                apps: 1,
            },
            seed: i as u64 + 1,
            verify: false,
            interval: Duration::from_millis(500),
            ops: None,
            duration: Some(total),
        };
        guests.push(std::thread::spawn(move || {
            let r = run_guest(&mut g, &spec, &mut |_| {
                if failed.load(Ordering::Relaxed) {
                    bail!("another guest failed");
                }
                Ok(hot[i].lock().unwrap_or_else(|p| p.into_inner()).take())
            });
            if r.is_err() {
                failed.store(true, Ordering::Relaxed);
            }
            r
        }));
    }
    let start = Instant::now();
    let mut samples: Vec<Sample> = Vec::new();
    for (w, (ratios, hot2, hot3)) in WINDOWS.iter().enumerate() {
        log(&format!("window {}: ratios {ratios:?}, VM2 hot {hot2}, VM3 hot {hot3}", w + 1));
        for (i, r) in ratios.iter().enumerate() {
            api_post(&api, &token, &format!("/vssds/vm{}/share", i + 1), serde_json::json!({ "ratio": r }))?;
        }
        *hot[1].lock().unwrap_or_else(|p| p.into_inner()) = Some((0.8, *hot2));
        *hot[2].lock().unwrap_or_else(|p| p.into_inner()) = Some((0.8, *hot3));
        let end = window * (w as u32 + 1);
        while start.elapsed() < end && !failed.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(1000));
            let l: serde_json::Value = ureq::get(&format!("http://{api}/vssds")).call()?.into_json()?;
            let per: Vec<(f64, f64)> = (0..VMS)
                .map(|i| (l[i]["valid"].as_f64().unwrap_or(0.0), l[i]["throughput"].as_f64().unwrap_or(0.0)))
                .collect();
            samples.push((start.elapsed().as_secs_f64(), per));
        }
    }
    for g in guests {
        g.join().map_err(|_| anyhow::anyhow!("a guest thread panicked"))??;
    }
    report(size, window, delay_ms, &samples, &cfg)
}

/// Mean over the second half of window `w` of `f(sample, vm)`.
fn settled(samples: &[Sample], window: f64, w: usize, f: impl Fn(&(f64, f64)) -> f64) -> Vec<f64> {
    let (from, to) = (window * (w as f64 + 0.5), window * (w as f64 + 1.0));
    let inside: Vec<&Sample> = samples.iter().filter(|s| s.0 > from && s.0 <= to + 0.5).collect();
    (0..VMS).map(|i| inside.iter().map(|s| f(&s.1[i])).sum::<f64>() / inside.len().max(1) as f64).collect()
}

fn report(size: Size, window: Duration, delay_ms: u32, samples: &[Sample], cfg: &str) -> anyhow::Result<Report> {
    let wsecs = window.as_secs_f64();
    let series = |f: &dyn Fn(&(f64, f64)) -> f64| -> Vec<Series> {
        (0..VMS)
            .map(|i| Series::new(format!("VM{}", i + 1), samples.iter().map(|s| (s.0, f(&s.1[i]))).collect()))
            .collect()
    };
    let fig_a =
        line_chart_svg("Fig. 8a: vSSD throughput", "time (s)", "vSSD requests per second", &series(&|p| p.1), None)
            .map_err(anyhow::Error::msg)?;
    let fig_b = line_chart_svg("Fig. 8b: vSSD size", "time (s)", "blocks (1 MiB)", &series(&|p| p.0), None)
        .map_err(anyhow::Error::msg)?;
    let mut table = Table::new(
        "windows",
        &["window", "target ratios", "target shares", "measured shares", "sizes (blocks)", "worst share error"],
    );
    let (mut errors, mut sizes) = (Vec::new(), Vec::new());
    for (w, (ratios, _, _)) in WINDOWS.iter().enumerate() {
        let thr = settled(samples, wsecs, w, |p| p.1);
        let sz = settled(samples, wsecs, w, |p| p.0);
        let (rs, ts): (f64, f64) = (ratios.iter().sum(), thr.iter().sum::<f64>().max(1e-9));
        let target: Vec<f64> = ratios.iter().map(|r| r / rs).collect();
        let got: Vec<f64> = thr.iter().map(|t| t / ts).collect();
        let err = target.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        let pct = |v: &[f64]| v.iter().map(|x| format!("{:.0}%", x * 100.0)).collect::<Vec<_>>().join(" : ");
        table.rows.push(vec![
            format!("{}", w + 1),
            ratios.iter().map(|r| format!("{r}")).collect::<Vec<_>>().join(":"),
            pct(&target),
            pct(&got),
            sz.iter().map(|s| format!("{s:.0}")).collect::<Vec<_>>().join(" : "),
            format!("{:.1} pts", err * 100.0),
        ]);
        errors.push(err);
        sizes.push(sz);
    }
    let claims = vec![
        Claim {
            text: "Raising VM1's ratio from 1 to 4 (window 2) grows VM1's vSSD".into(),
            holds: sizes[1][0] > sizes[0][0],
            evidence: format!("VM1 {:.0} → {:.0} blocks", sizes[0][0], sizes[1][0]),
            asserted: true,
        },
        Claim {
            text: "Lowering VM3's and VM4's ratios from 3 to 1 (window 3) shrinks their vSSDs".into(),
            holds: sizes[2][2] < sizes[1][2] && sizes[2][3] < sizes[1][3],
            evidence: format!(
                "VM3 {:.0} → {:.0}, VM4 {:.0} → {:.0} blocks",
                sizes[1][2], sizes[2][2], sizes[1][3], sizes[2][3]
            ),
            asserted: true,
        },
        Claim {
            text: "After VM2's working set grows and VM3's shrinks (window 4), VM2 gets more blocks and VM3 no more (whole blocks) for the same ratios".into(),
            holds: sizes[3][1].round() > sizes[2][1].round() && sizes[3][2].round() <= sizes[2][2].round(),
            evidence: format!(
                "VM2 {:.0} → {:.0}, VM3 {:.0} → {:.0} blocks",
                sizes[2][1], sizes[3][1], sizes[2][2], sizes[3][2]
            ),
            asserted: false,
        },
        Claim {
            text: "The measured throughput shares settle within 10 points of the targets in every window".into(),
            holds: errors.iter().all(|&e| e <= 0.10),
            evidence: errors.iter().map(|e| format!("{:.1}", e * 100.0)).collect::<Vec<_>>().join(", ") + " pts worst per window",
            asserted: false,
        },
    ];
    Ok(Report {
        name: "symflex-vssd".into(),
        title: "SymFlex Fig. 8 and Fig. 9 on real vSSDs: proportional-throughput provisioning and persistence".into(),
        intro: format!(
            "Four guest-side cache managers (the cachevisor-guest crate, SymFlex §4.1's dm-cache) each read a {ORIGIN_MIB} MiB origin — an NBD disk with {delay_ms} ms per read (nbdkit's delay filter) — through its own elastic vSSD, served over NBD by one cachevisor daemon from a {REGION_MIB} MiB region of 1 MiB blocks. 80% of each VM's 64 KiB reads fall in the first 40% of its origin. The daemon's symflex-proportional allocator (the policy crate's code, as in the simulator's symflex-proportional experiment) sizes the vSSDs every second so that their throughputs — requests each vSSD served per second, counted by the host — follow the ratios; deflates are answered by the guests (free blocks first, then least recently used). Windows of {:.0} s as in the seed's §5.2: ratios 1:2:3:3, then 4:2:3:3, then 4:2:1:1, then VM3's hot set shrunk to 25% and VM2's grown to 50%.\n\nThe seed (Fig. 8, 100 GB over four VMs, hours per window) reports the throughputs following the ratios in each window and VM2's and VM3's sizes moving with their working sets. Here everything is scaled down to minutes and megabytes on one machine with two cores; the table gives the shares measured over the second half of each window.",
            wsecs
        ),
        size: size.name().into(),
        claims,
        sections: vec![
            Section {
                heading: "Throughput per vSSD (Fig. 8a)".into(),
                text: "Requests per second each vSSD served, as the host's allocator measured them each second.".into(),
                figure: Some(fig_a),
                table: None,
            },
            Section {
                heading: "vSSD sizes (Fig. 8b)".into(),
                text: "Valid blocks of each vSSD, from GET /vssds each second.".into(),
                figure: Some(fig_b),
                table: Some(table),
            },
        ],
        scenarios: vec![("Fig. 8 daemon configuration".into(), cfg.to_string())],
    })
}
