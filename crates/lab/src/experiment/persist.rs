//! Fig. 9 of SymFlex (§5.3) for `experiment symflex-vssd`: a guest reads its slow origin
//! through a persistent vSSD for a fixed number of requests (75% of them in the first 30%
//! of the origin); in later runs its VM restarts after increasing times — the guest saves
//! its cache's map and stops, the vSSD is stopped and started through the API (P keeps
//! its blocks and bytes), and a new guest takes the map back, checked block by block
//! against the vSSD, and replays the same requests from the start. Without P the restarted
//! guest starts cold. Hit ratio over time after the restart, and time to finish.

use crate::bench::serve::{free_port, spawn_serve};
use crate::experiment::vssd::{api_post, slow_origin};
use cachevisor_guest_manager::manager::{run_guest, start_guest, Mode, RunReport, RunSpec};
use cachevisor_guest_manager::workload::Shape;
use cachevisor_lab::seeds::{Claim, Section, Size, Table};
use cachevisor_sim::plot::{line_chart_svg, Series};
use std::path::Path;
use std::time::{Duration, Instant};

const ORIGIN_MIB: u64 = 64;
const VSSD_MIB: u64 = 24;

/// One guest session of `ops` requests (none: until `duration`); the map saved at its end
/// when `save`, taken back at its start when `restore`.
struct Session<'a> {
    vssd: &'a str,
    control: &'a Path,
    origin: &'a str,
    map: &'a Path,
}

impl Session<'_> {
    fn run(&self, spec: &RunSpec, restore: bool, save: bool) -> anyhow::Result<(RunReport, usize, f64)> {
        let mut g = start_guest(self.vssd, self.control, self.origin, Mode::WriteThrough)?;
        let taken = if restore { g.restore_map(self.map)? } else { 0 };
        let t = Instant::now();
        let r = run_guest(&mut g, spec, &mut |_| Ok(None))?;
        let secs = t.elapsed().as_secs_f64();
        if save {
            g.save_map(self.map)?;
        }
        Ok((r, taken, secs))
    }
}

/// Runs Fig. 9 in `dir`: claims, sections and the daemon's configuration.
pub fn fig9(size: Size, dir: &Path, log: &mut dyn FnMut(&str)) -> anyhow::Result<(Vec<Claim>, Vec<Section>, String)> {
    std::fs::create_dir_all(dir)?;
    let dir = &std::fs::canonicalize(dir)?;
    let ops = size.pick(3000u64, 8000, 20000);
    let (_nbdkit, origin) = slow_origin(dir, 0, 2)?;
    let (port, api) = (free_port()?, format!("127.0.0.1:{}", free_port()?));
    let _ = std::fs::remove_file(dir.join("cache.img"));
    let _ = std::fs::remove_dir_all(dir.join("cache.img.meta"));
    let cfg = format!(
        "[cache]\npath = \"cache.img\"\nsize = \"4MiB\"\n[listen]\ntcp = \"127.0.0.1:{port}\"\n[api]\nlisten = \"{api}\"\n\
         [vssd]\nsize = \"{VSSD_MIB}MiB\"\nblock_size = \"64KiB\"\n[[vssd.device]]\nname = \"p\"\nmax_size = \"{VSSD_MIB}MiB\"\ninitial_size = \"{VSSD_MIB}MiB\"\npersist = true\n\
         [[vdisk]]\nname = \"d\"\nbacking = \"d.img\"\nsize = \"16MiB\"\n"
    );
    std::fs::write(dir.join("vssd.toml"), &cfg)?;
    let _daemon = spawn_serve(&dir.join("vssd.toml"), None)?;
    let token = std::fs::read_to_string(dir.join("cache.img.meta/api-token"))?;
    let vssd = format!("nbd://127.0.0.1:{port}/p");
    let control = dir.join("cache.img.meta/p.vssd.sock");
    let map = dir.join("guest.map");
    let s = Session { vssd: &vssd, control: &control, origin: &origin, map: &map };
    let spec = |ops: Option<u64>, duration: Option<Duration>| RunSpec {
        shape: Shape {
            origin: ORIGIN_MIB << 20,
            io: 64 << 10,
            hot_fraction: 0.75,
            hot_size: 0.3,
            write_ratio: 0.0,
            apps: 1,
        },
        seed: 9,
        verify: false,
        interval: Duration::from_millis(250),
        ops,
        duration,
    };
    // The VM restarts: its guest has stopped; the vSSD is stopped and started.
    let restart = || -> anyhow::Result<()> {
        api_post(&api, &token, "/vssds/p/stop", serde_json::json!({}))?;
        api_post(&api, &token, "/vssds/p/start", serde_json::json!({ "initial_blocks": VSSD_MIB * 16 }))?;
        Ok(())
    };
    log("Fig. 9: the cold run");
    let _ = std::fs::remove_file(&map);
    let (cold, _, cold_secs) = s.run(&spec(Some(ops), None), false, false)?;
    let mut runs: Vec<(String, RunReport, usize, f64, bool)> = vec![("cold start".into(), cold, 0, cold_secs, false)];
    for frac in [0.1, 0.25, 0.5] {
        let before = Duration::from_secs_f64(cold_secs * frac);
        log(&format!("Fig. 9: restart after {:.1} s, with P", before.as_secs_f64()));
        let _ = std::fs::remove_file(&map);
        // A fresh start for the first session: what the cold run left is not its.
        restart()?;
        s.run(&spec(None, Some(before)), false, true)?;
        restart()?;
        let (r, taken, secs) = s.run(&spec(Some(ops), None), true, false)?;
        runs.push((format!("restart after {:.1} s (P)", before.as_secs_f64()), r, taken, secs, true));
    }
    let before = Duration::from_secs_f64(cold_secs * 0.5);
    log(&format!("Fig. 9: restart after {:.1} s, without P (cold guest)", before.as_secs_f64()));
    restart()?;
    s.run(&spec(None, Some(before)), false, false)?;
    restart()?;
    let (r, _, secs) = s.run(&spec(Some(ops), None), false, false)?;
    runs.push((format!("restart after {:.1} s (no P)", before.as_secs_f64()), r, 0, secs, false));

    let series: Vec<Series> = runs
        .iter()
        .map(|(name, r, ..)| Series::new(name.clone(), r.intervals.iter().map(|i| (i.t_s, i.hit_ratio)).collect()))
        .collect();
    let fig = line_chart_svg(
        "Fig. 9: hit ratio after the VM's restart",
        "time since the (re)start (s)",
        "hit ratio",
        &series,
        Some((0.0, 1.0)),
    )
    .map_err(anyhow::Error::msg)?;
    let mut table = Table::new(
        "persistence",
        &["run", "blocks taken back", "time to finish (s)", "hit ratio", "first 2 s hit ratio"],
    );
    let early = |r: &RunReport| {
        let iv: Vec<f64> = r.intervals.iter().filter(|i| i.t_s <= 2.0).map(|i| i.hit_ratio).collect();
        iv.iter().sum::<f64>() / iv.len().max(1) as f64
    };
    let overall = |r: &RunReport| {
        let a = r.stats.apps.get(&0).copied().unwrap_or_default();
        a.hits as f64 / (a.hits + a.misses + a.bypassed).max(1) as f64
    };
    for (name, r, taken, secs, _) in &runs {
        table.rows.push(vec![
            name.clone(),
            taken.to_string(),
            format!("{secs:.1}"),
            format!("{:.3}", overall(r)),
            format!("{:.3}", early(r)),
        ]);
    }
    let cold_t = runs[0].3;
    let p_runs: Vec<&(String, RunReport, usize, f64, bool)> = runs.iter().filter(|r| r.4).collect();
    let no_p = runs.last().expect("runs");
    let cold_early = early(&runs[0].1);
    let claims = vec![
        Claim {
            text: "With P, the restarted guest takes its cache back and hits more from its first seconds than a cold start (Fig. 9: the hit ratio saturates earlier)".into(),
            holds: p_runs.iter().all(|r| r.2 > 0 && early(&r.1) > cold_early),
            evidence: p_runs.iter().map(|r| format!("{}: {} blocks back, {:.3}", r.0, r.2, early(&r.1))).collect::<Vec<_>>().join("; ")
                + &format!(" — cold {cold_early:.3} (hit ratio of the first 2 s)"),
            asserted: true,
        },
        Claim {
            text: "With P, the same requests finish sooner than from a cold start (Fig. 9: 300 s vs 360 s after a restart at 40 s)".into(),
            holds: p_runs.iter().all(|r| r.3 < cold_t),
            evidence: p_runs.iter().map(|r| format!("{:.1} s", r.3)).collect::<Vec<_>>().join(", ") + &format!(" vs cold {cold_t:.1} s"),
            asserted: false,
        },
        Claim {
            text: "The later the restart, the warmer the cache it comes back to (more blocks taken back)".into(),
            holds: p_runs.windows(2).all(|w| w[1].2 >= w[0].2),
            evidence: p_runs.iter().map(|r| r.2.to_string()).collect::<Vec<_>>().join(" ≤ ") + " blocks",
            asserted: false,
        },
        Claim {
            text: "Without P the restarted guest is as cold as a first start".into(),
            holds: early(&no_p.1) < early(&p_runs[p_runs.len() - 1].1),
            evidence: format!(
                "first-2-s hit ratio {:.3} without P vs {:.3} with P (same restart time), cold {:.3}",
                early(&no_p.1),
                early(&p_runs[p_runs.len() - 1].1),
                early(&runs[0].1)
            ),
            asserted: false,
        },
    ];
    let sections = vec![Section {
        heading: "Persistence across VM restarts (Fig. 9)".into(),
        text: format!(
            "One guest reads a {ORIGIN_MIB} MiB slow origin (2 ms per read) through a {VSSD_MIB} MiB persistent vSSD of 64 KiB blocks (so a cold cache fills one request at a time, as dm-cache's does, not a whole 1 MiB block per miss), {ops} requests of 64 KiB, 75% of them in the first 30% of the origin (the seed: 25 GB of I/O on a 30 GB origin with a 10 GB vSSD). The cold run starts with an empty cache. In each later run the VM restarts after a fraction of the cold run's time: the guest saves its map (every entry with the CRC-32 of its block) and stops, the vSSD is stopped and started through the API (its blocks and bytes kept, SymFlex §5.3), and a new guest takes back the entries whose bytes check and replays the same requests from the start. \"No P\" restarts the same way but the new guest starts cold — what a vSSD without P gives (a non-persistent vSSD's blocks come back zeroed, so a saved map would fail its checks)."
        ),
        figure: Some(fig),
        table: Some(table),
    }];
    Ok((claims, sections, cfg))
}
