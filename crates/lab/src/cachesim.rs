//! libCacheSim's `cachesim` (its C tool, built in Release from its source beside the
//! project; never fetched or built by us): run on an oracleGeneral trace, its hit ratio
//! read from what it prints. The benches and `experiment admission` compare against it.

use std::path::Path;
use std::process::Command;

/// The hit ratio in `cachesim`'s output ("… LRU cache size 400MiB, 10000000 req, miss
/// ratio 0.2213, throughput 2.10 MQPS"), or `None` when it printed none.
pub fn hit_ratio(text: &str) -> Option<f64> {
    let miss = text
        .split("miss ratio")
        .nth(1)
        .and_then(|t| t.trim_start().split(|c: char| c == ',' || c.is_whitespace()).next())
        .and_then(|v| v.parse::<f64>().ok())?;
    Some(1.0 - miss)
}

/// Runs `bin` (`cachesim`) on oracleGeneral `trace` with eviction `algo`, a cache of
/// `bytes` and `extra` arguments (`-a prob --admission-params=prob=0.5`), in the trace's
/// directory (where it leaves its result file); its hit ratio.
pub fn run(bin: &Path, trace: &Path, algo: &str, bytes: u64, extra: &[&str]) -> Result<f64, String> {
    let trace = trace.canonicalize().map_err(|e| format!("{}: {e}", trace.display()))?;
    let out = Command::new(bin)
        .current_dir(trace.parent().unwrap_or(Path::new("/")))
        .arg(&trace)
        .args(["oracleGeneral", algo, &bytes.to_string(), "--num-thread=1"])
        .args(extra)
        .output()
        .map_err(|e| format!("running {}: {e}", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("{} failed: {}", bin.display(), String::from_utf8_lossy(&out.stderr)));
    }
    hit_ratio(&text).ok_or_else(|| format!("no miss ratio in {}'s output: {text}", bin.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_hit_ratio_is_read_from_its_line() {
        let line =
            "mix.oracleGeneral LRU cache size    40MiB,          2000000 req, miss ratio 0.7584, throughput 6.32 MQPS";
        assert!((super::hit_ratio(line).unwrap() - 0.2416).abs() < 1e-9);
        assert_eq!(super::hit_ratio("nothing here"), None);
    }
}
