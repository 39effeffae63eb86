//! Held-out mixes for `policy-compare`: generated multi-VM mixes the adaptive allocator was
//! not tuned on (its defaults were chosen on the bundled mix), so "never below the
//! unmanaged cache or equal static shares" is checked beyond the one mix it was built
//! on. Each mix draws four VMs from the generator's templates with seeded random
//! working-set shapes, sizes, read shares, rates and lengths; the same seed gives the same
//! mixes on every run. The other experiments' mixes we ship (ECI-Cache's endurance mix,
//! SymFlex's four VMs) run the same policies ([`shipped`]).

use super::{pct, sim, workload, Options, Table};
use cachevisor_engine::{PartitionMode, ReplacementKind, WritePolicy};
use cachevisor_sim::report::SimResult;
use cachevisor_sim::scenario::{ReplayMode, Scenario, SyntheticSection};
use rand::{Rng, SeedableRng};

/// (label, allocator, partition, replacement, lookahead) of the policies run on each mix.
const POLICIES: [(&str, &str, PartitionMode, ReplacementKind, bool); 5] = [
    ("static", "static", PartitionMode::Static, ReplacementKind::Lru, false),
    ("shared-clock", "static", PartitionMode::Shared, ReplacementKind::Clock, false),
    ("lookahead-oracle", "optimal", PartitionMode::Static, ReplacementKind::Lru, true),
    ("adaptive-lru", "adaptive", PartitionMode::Static, ReplacementKind::Lru, false),
    ("adaptive", "adaptive", PartitionMode::Static, ReplacementKind::S3fifo, false),
];

/// Seed of the first mix (held out: never used while tuning).
const SEED: u64 = 0x6d69_7865_7332;

/// One run: mix, cache MiB, policy label, result.
pub struct Run {
    /// Mix name (its index for a generated one).
    pub mix: String,
    /// Cache size in MiB.
    pub mib: u64,
    /// Policy label.
    pub policy: &'static str,
    /// Its result.
    pub result: SimResult,
}

/// The scenario of mix `m`: four generated VMs, closed loop, write-back.
fn mix(opts: &Options, m: usize) -> Result<Scenario, String> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(SEED + m as u64);
    let mut sc = Scenario::default();
    sc.replay.mode = ReplayMode::Closed;
    sc.replay.queue_depth = 4;
    sc.cache.write_policy = WritePolicy::Wb;
    for v in 0..4 {
        let kind = ["strong", "weak", "hotcold", "mixed-rw"][rng.gen_range(0..4)];
        let hot = rng.gen_range(1..40);
        let share = rng.gen_range(50..99);
        let disk = [256, 512, 1024, 2048][rng.gen_range(0..4)];
        let read = rng.gen_range(5..=10) as f64 / 10.0;
        let iops = rng.gen_range(200..2000);
        let secs = opts.size.pick(rng.gen_range(10..20), rng.gen_range(30..90), rng.gen_range(60..300));
        let seed = rng.gen_range(1..1_000_000u32);
        let name = format!("m{m}v{v}-{kind}");
        let hotspots = if kind == "weak" { "[[100%, 100%]]".to_string() } else { format!("[[{hot}%, {share}%]]") };
        let set = [
            ("hotspots", hotspots.as_str()),
            ("disk_size", &format!("{disk}MiB")),
            ("read_ratio", &format!("{read}")),
            ("iops", &format!("{{randvar: normal, mean: {iops}, stddev: 0}}")),
            ("duration", &format!("{secs}s")),
            ("seed", &seed.to_string()),
        ];
        let config = workload(opts, kind, &name, &set)?;
        sc.synthetic.push(SyntheticSection { config, then: Vec::new() });
    }
    Ok(sc)
}

/// Runs every policy on mix `name` (scenario `base`) with a cache of `mib` MiB.
fn run_policies(
    name: &str,
    base: &Scenario,
    mib: u64,
    scenarios: &mut Vec<(String, String)>,
    log: &mut dyn FnMut(&str),
    runs: &mut Vec<Run>,
) -> Result<(), String> {
    for (label, alloc, part, repl, lookahead) in POLICIES {
        let mut sc = base.clone();
        sc.cache.size = format!("{mib}MiB");
        sc.cache.allocator = alloc.into();
        sc.cache.partition = part;
        sc.cache.replacement = Some(repl);
        sc.cache.lookahead = lookahead;
        let result = sim(&format!("mix {name} {mib} MiB {label}"), &sc, scenarios, log)?;
        runs.push(Run { mix: name.to_string(), mib, policy: label, result });
    }
    Ok(())
}

/// Runs every policy on `mixes` generated mixes at each of `sizes` MiB.
pub fn run(
    opts: &Options,
    mixes: usize,
    sizes: &[u64],
    scenarios: &mut Vec<(String, String)>,
    log: &mut dyn FnMut(&str),
) -> Result<Vec<Run>, String> {
    let mut runs = Vec::new();
    for m in 0..mixes {
        let base = mix(opts, m)?;
        for &mib in sizes {
            run_policies(&m.to_string(), &base, mib, scenarios, log, &mut runs)?;
        }
    }
    Ok(runs)
}

/// Runs every policy on the mixes of the other experiments we ship, each at its own cache
/// size: `eci-endurance`'s (three bundled traces and two generated VMs, closed loop,
/// write-back) and `symflex-proportional`'s (four hot/cold VMs in open loop, working sets
/// changing).
pub fn shipped(
    opts: &Options,
    scenarios: &mut Vec<(String, String)>,
    log: &mut dyn FnMut(&str),
) -> Result<Vec<Run>, String> {
    let mut runs = Vec::new();
    let mixes =
        [("ECI-endurance", super::eci_endurance::mix(opts)?), ("SymFlex", super::symflex_proportional::mix(opts)?)];
    for (name, base) in mixes {
        let mib = cachevisor_trace::units::parse_size(&base.cache.size)? >> 20;
        run_policies(name, &base, mib, scenarios, log, &mut runs)?;
    }
    Ok(runs)
}

/// The run of `policy` on `mix` at `mib`.
pub fn find<'a>(runs: &'a [Run], mix: &str, mib: u64, policy: &str) -> Option<&'a SimResult> {
    runs.iter().find(|r| r.mix == mix && r.mib == mib && r.policy == policy).map(|r| &r.result)
}

/// Hit ratio of `policy` in the run of `mix` at `mib`.
pub fn hit(runs: &[Run], mix: &str, mib: u64, policy: &str) -> f64 {
    find(runs, mix, mib, policy).map_or(0.0, |r| r.total.hit_ratio)
}

/// The (mix, size) cases of `runs`, in order.
pub fn cases(runs: &[Run]) -> Vec<(String, u64)> {
    runs.iter().filter(|r| r.policy == POLICIES[0].0).map(|r| (r.mix.clone(), r.mib)).collect()
}

/// The runs as table `name`: one row per mix and size, hit % and p99.9 of each policy.
pub fn table(runs: &[Run], name: &str) -> Table {
    let mut columns = vec!["mix".to_string(), "cache".to_string(), "VMs".to_string()];
    for p in POLICIES {
        columns.push(format!("{} hit %", p.0));
        columns.push(format!("{} p99.9 ms", p.0));
    }
    let mut rows = Vec::new();
    for r in runs.iter().filter(|r| r.policy == POLICIES[0].0) {
        let mut row = vec![
            r.mix.clone(),
            format!("{} MiB", r.mib),
            r.result.vms.iter().map(|v| v.vm.clone()).collect::<Vec<_>>().join(" "),
        ];
        for p in POLICIES {
            let x = find(runs, &r.mix, r.mib, p.0).expect("every policy ran");
            row.push(pct(x.total.hit_ratio));
            row.push(format!("{:.0}", x.total.latency.p999_us / 1000.0));
        }
        rows.push(row);
    }
    Table { name: name.into(), columns, rows }
}
