//! `cachevisor status`: asks a running daemon's HTTP API for its vDisks and prints them
//! (a table, or the API's JSON with `--json`); exits 5 when a vDisk runs in pass-through
//! (`exit_status.rs`).

use anyhow::Context;
use cachevisor_trace::units::format_size;
use clap::Args;

/// Arguments of `status`.
#[derive(Debug, Args)]
#[command(after_help = crate::exit_status::HELP)]
pub struct StatusArgs {
    #[command(flatten)]
    pub api: crate::api_target::ApiArgs,
    /// Print the raw JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs the command.
pub fn run(a: StatusArgs) -> anyhow::Result<()> {
    let api = a.api.client()?;
    let url = api.url("/vdisks");
    let body: serde_json::Value = api
        .get("/vdisks")
        .call()
        .map_err(|e| crate::exit_status::api_error(&url, e))?
        .into_json()
        .with_context(|| format!("{url}: an answer that is not JSON"))?;
    let degraded: Vec<&str> = body
        .as_array()
        .context("unexpected answer")?
        .iter()
        .filter(|v| v["stats"]["passthrough"].as_bool().unwrap_or(false))
        .map(|v| v["name"].as_str().unwrap_or("?"))
        .collect();
    let verdict = || match degraded.as_slice() {
        [] => Ok(()),
        names => Err(crate::exit_status::exit(
            crate::exit_status::DEGRADED,
            format!(
                "in pass-through (served without the cache: device errors, or the cache detached): {}",
                names.join(", ")
            ),
        )),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&body)?);
        return verdict();
    }
    println!(
        "{:<12} {:>10} {:>12} {:>10} {:>10} {:>10} {:>7} {:>10} {:>10} {:>7}",
        "vdisk", "size", "policy", "cached", "target", "dirty", "hit%", "reads", "writes", "errors"
    );
    // Sizes without a space, so each column is one word for scripts (`awk '{print $6}'`).
    let size = |b: u64| format_size(b).replace(' ', "");
    for v in body.as_array().context("unexpected answer")? {
        let n = |k: &str| v[k].as_u64().unwrap_or(0);
        let s = &v["stats"];
        let sn = |k: &str| s[k].as_u64().unwrap_or(0);
        let hit = if sn("blocks") > 0 { 100.0 * sn("hit_blocks") as f64 / sn("blocks") as f64 } else { 0.0 };
        let bs = n("block_size").max(1);
        let policy = if s["passthrough"].as_bool().unwrap_or(false) {
            "pass-through".to_string()
        } else {
            v["write_policy"].as_str().unwrap_or("?").to_string()
        };
        println!(
            "{:<12} {:>10} {:>12} {:>10} {:>10} {:>10} {:>7.1} {:>10} {:>10} {:>7}",
            v["name"].as_str().unwrap_or("?"),
            size(n("size")),
            policy,
            size(n("used_blocks") * bs),
            size(n("target_blocks") * bs),
            size(n("dirty_blocks") * bs),
            hit,
            sn("reads"),
            sn("writes"),
            sn("errors"),
        );
    }
    // What each vDisk with an admission policy let in (`block_admission.rs`).
    for v in body.as_array().context("unexpected answer")? {
        if let Some(line) = admission_line(v) {
            println!("{line}");
        }
        if let Some(line) = prefetch_line(v) {
            println!("{line}");
        }
        for line in class_lines(v) {
            println!("{line}");
        }
        if let Some(line) = budget_share_line(v) {
            println!("{line}");
        }
    }
    // The cache file, when it is not in (`cachevisor cache attach` brings it back).
    if let Ok(c) = api.get("/cache").call().map(|r| r.into_json::<serde_json::Value>()) {
        let c = c.unwrap_or_default();
        if let Some(line) = congestion_line(&c["congestion"]) {
            println!("{line}");
        }
        if let Some(line) = shared_budget_line(&c["write_budget"]) {
            println!("{line}");
        }
        if let Some(state) = c["state"].as_str().filter(|s| *s != "attached") {
            println!(
                "cache {}: {state}: every vDisk passes through to its backing store until `cachevisor cache attach`",
                c["path"].as_str().unwrap_or("?")
            );
        }
    }
    // The running (or last) prewarm, when there was one.
    if let Ok(p) =
        api.get("/prewarm").call().map_err(anyhow::Error::from).and_then(|r| Ok(r.into_json::<serde_json::Value>()?))
    {
        let n = |k: &str| p[k].as_u64().unwrap_or(0);
        if let Some(from) = p["from"].as_str().filter(|f| !f.is_empty()) {
            let state = match (p["running"].as_bool().unwrap_or(false), p["error"].as_str()) {
                (true, _) => "running".to_string(),
                (false, Some(e)) => format!("stopped: {e}"),
                (false, None) => "done".to_string(),
            };
            println!(
                "prewarm from {from}: {state}; {} of {} blocks loaded, {} already cached",
                n("loaded_blocks"),
                n("planned_blocks"),
                n("skipped_blocks")
            );
        }
    }
    verdict()
}

/// A vDisk's admission in one line: its policies, the misses each let in and sent around
/// the cache, and its write budget's state (`None` for a vDisk admitting every miss).
fn admission_line(v: &serde_json::Value) -> Option<String> {
    let a = v.get("admission")?;
    let n = |k: &str| a[k].as_u64().unwrap_or(0);
    let side = |policy: &str, op: &str| {
        format!(
            "{op} {} ({} admitted, {} around the cache)",
            a[policy].as_str().unwrap_or("?"),
            n(&format!("{op}_admitted")),
            n(&format!("{op}_rejected"))
        )
    };
    let mut line = format!(
        "admission {}: {}; {}",
        v["name"].as_str().unwrap_or("?"),
        side("read", "read"),
        side("write", "write")
    );
    if let Some(a) = a.get("auto").filter(|x| x.is_object()) {
        line += &format!(
            "; auto: {} now (second-hit in {} of {} decisions)",
            if a["second_hit"].as_bool().unwrap_or(false) { "second-hit" } else { "every miss" },
            a["chose_second_hit"].as_u64().unwrap_or(0),
            a["decisions"].as_u64().unwrap_or(0)
        );
    }
    if let Some(b) = a.get("budget").filter(|b| b.is_object()) {
        let f = |k: &str| b[k].as_f64().unwrap_or(0.0);
        let size = |x: f64| format_size(x as u64).replace(' ', "");
        let rate = if f("elapsed_s") > 0.0 { f("written_bytes") / f("elapsed_s") } else { 0.0 };
        line += &format!(
            "; budget {}/s: {} written in {:.0} s ({}/s), admitting {:.0}% of misses",
            size(f("target_bytes_per_sec")),
            size(f("written_bytes")),
            f("elapsed_s"),
            size(rate),
            100.0 * f("probability")
        );
        if b["unreachable"].as_bool().unwrap_or(false) {
            line += " (write hits alone exceed it)";
        }
    }
    Some(line)
}

/// The cache's shared write budget in one line: its target and what was written at what
/// rate (`None` when there is none).
fn shared_budget_line(b: &serde_json::Value) -> Option<String> {
    if !b.is_object() {
        return None;
    }
    let f = |k: &str| b[k].as_f64().unwrap_or(0.0);
    let size = |x: f64| format_size(x as u64).replace(' ', "");
    let rate = if f("elapsed_s") > 0.0 { f("written_bytes") / f("elapsed_s") } else { 0.0 };
    let mut line = format!(
        "cache write budget {}/s, shared: {} written in {:.0} s ({}/s)",
        size(f("target_bytes_per_sec")),
        size(f("written_bytes")),
        f("elapsed_s"),
        size(rate)
    );
    if b["unreachable"].as_bool().unwrap_or(false) {
        line += " (write hits and write-back alone exceed it)";
    }
    Some(line)
}

/// A vDisk's part of the cache's shared write budget in one line (`None` without one).
fn budget_share_line(v: &serde_json::Value) -> Option<String> {
    let s = v.get("budget_share").filter(|s| s.is_object())?;
    let f = |k: &str| s[k].as_f64().unwrap_or(0.0);
    let share = if s["share_bytes_per_sec"].is_number() {
        format!("{}/s", format_size(f("share_bytes_per_sec") as u64).replace(' ', ""))
    } else {
        "all it asks (first period)".to_string()
    };
    let value =
        s["value"].as_f64().map_or("not measured yet".to_string(), |v| format!("{v:.2} hits per admitted block"));
    Some(format!(
        "write budget share {}: {share}, admitting {:.0}% of its misses ({} in, {} around the cache), {value}",
        v["name"].as_str().unwrap_or("?"),
        100.0 * f("probability"),
        s["admitted"].as_u64().unwrap_or(0),
        s["rejected"].as_u64().unwrap_or(0),
    ))
}

/// Congestion bypass in one line: each direction's threshold and smoothed latency, and
/// which go around the cache now (`None` when it is off).
fn congestion_line(c: &serde_json::Value) -> Option<String> {
    if !c.is_object() {
        return None;
    }
    let ms = |k: &str| c[k].as_f64().map_or("off".to_string(), |ns| format!("{:.2} ms", ns / 1e6));
    let now = |k: &str| if c[k].as_bool().unwrap_or(false) { " (congested: misses go around the cache)" } else { "" };
    Some(format!(
        "cache device latency: reads {} (threshold {}){}, writes {} (threshold {}){}",
        ms("read_latency_ns"),
        ms("read_threshold_ns"),
        now("read_congested"),
        ms("write_latency_ns"),
        ms("write_threshold_ns"),
        now("write_congested")
    ))
}

/// A vDisk's I/O classes, one line each: blocks held, hit ratio of its requests, misses
/// sent around at its cap or by its admission.
fn class_lines(v: &serde_json::Value) -> Vec<String> {
    let Some(classes) = v.get("classes").and_then(|c| c.as_array()) else { return Vec::new() };
    classes
        .iter()
        .map(|c| {
            let n = |k: &str| c[k].as_u64().unwrap_or(0);
            let accesses = n("hits") + n("misses");
            let hit = if accesses > 0 { 100.0 * n("hits") as f64 / accesses as f64 } else { 0.0 };
            format!(
                "class {}/{}: {} blocks cached, {hit:.1}% of {accesses} block accesses hit; around the cache: {} at its cap, {} by its admission",
                v["name"].as_str().unwrap_or("?"),
                c["name"].as_str().unwrap_or("?"),
                n("cached_blocks"),
                n("rejected_at_cap"),
                n("rejected_by_admission")
            )
        })
        .collect()
}

/// A vDisk's prefetch in one line (`None` for one that does not prefetch).
fn prefetch_line(v: &serde_json::Value) -> Option<String> {
    let p = v.get("prefetch")?;
    let n = |k: &str| p[k].as_u64().unwrap_or(0);
    let mut line = format!(
        "prefetch {}: {} (degree {}, trigger {}): {} blocks loaded, {} read, {} evicted unread; {} reads waited on a load",
        v["name"].as_str().unwrap_or("?"),
        p["policy"].as_str().unwrap_or("?"),
        n("degree"),
        n("trigger"),
        n("loaded"),
        n("used"),
        n("wasted"),
        n("late")
    );
    if p["paused"].as_bool().unwrap_or(false) {
        line += " (paused: its loads went unread)";
    }
    Some(line)
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_admission_line_names_the_policies_counts_and_budget() {
        let v = serde_json::json!({"name": "db", "admission": {
            "read": "write-budget:1MiB/s", "write": "all", "read_admitted": 3, "read_rejected": 4,
            "write_admitted": 5, "write_rejected": 0, "memory_bytes": 0,
            "budget": {"target_bytes_per_sec": 1048576.0, "probability": 0.25, "written_bytes": 10485760,
                       "elapsed_s": 10.0, "unreachable": true}}});
        assert_eq!(
            super::admission_line(&v).unwrap(),
            "admission db: read write-budget:1MiB/s (3 admitted, 4 around the cache); write all (5 admitted, 0 around the \
             cache); budget 1.00MiB/s: 10.00MiB written in 10 s (1.00MiB/s), admitting 25% of misses (write hits alone \
             exceed it)"
        );
        assert!(super::admission_line(&serde_json::json!({"name": "x"})).is_none());
        let v = serde_json::json!({"name": "bk", "admission": {"read": "auto", "write": "auto", "read_admitted": 1,
            "read_rejected": 2, "write_admitted": 0, "write_rejected": 0, "memory_bytes": 9,
            "auto": {"second_hit": true, "decisions": 5, "chose_second_hit": 4, "shadow_hits": [1, 2]}}});
        assert!(super::admission_line(&v)
            .unwrap()
            .ends_with("; auto: second-hit now (second-hit in 4 of 5 decisions)"));
        let v = serde_json::json!({"name": "seq", "prefetch": {"policy": "amp", "loaded": 9, "used": 7, "wasted": 1,
            "late": 2, "degree": 5, "trigger": 3}});
        assert_eq!(
            super::prefetch_line(&v).unwrap(),
            "prefetch seq: amp (degree 5, trigger 3): 9 blocks loaded, 7 read, 1 evicted unread; 2 reads waited on a load"
        );
        assert!(super::prefetch_line(&serde_json::json!({"name": "x"})).is_none());
        let c = serde_json::json!({"read_threshold_ns": 2000000, "write_threshold_ns": null, "read_latency_ns": 3500000.0,
            "write_latency_ns": 120000.0, "read_congested": true, "write_congested": false});
        assert_eq!(
            super::congestion_line(&c).unwrap(),
            "cache device latency: reads 3.50 ms (threshold 2.00 ms) (congested: misses go around the cache), writes 0.12 ms \
             (threshold off)"
        );
        assert!(super::congestion_line(&serde_json::Value::Null).is_none());
    }

    #[test]
    fn budget_lines_name_the_target_the_rate_and_each_share() {
        let c = serde_json::json!({"target_bytes_per_sec": 3145728.0, "written_bytes": 125829120, "elapsed_s": 40.0,
            "unreachable": false, "vdisks": []});
        assert_eq!(
            super::shared_budget_line(&c).unwrap(),
            "cache write budget 3.00MiB/s, shared: 120.00MiB written in 40 s (3.00MiB/s)"
        );
        assert!(super::shared_budget_line(&serde_json::Value::Null).is_none());
        let v = serde_json::json!({"name": "db", "budget_share": {"vm": 0, "share_bytes_per_sec": 2621440.0,
            "probability": 0.31, "written_bytes": 1, "admitted": 1200, "rejected": 2600, "hits_on_admitted": 700,
            "value": 0.5712}});
        assert_eq!(
            super::budget_share_line(&v).unwrap(),
            "write budget share db: 2.50MiB/s, admitting 31% of its misses (1200 in, 2600 around the cache), 0.57 hits per \
             admitted block"
        );
        assert!(super::budget_share_line(&serde_json::json!({"name": "x"})).is_none());
        let v = serde_json::json!({"name": "db", "classes": [{"name": "unclassified", "cached_blocks": 1, "hits": 0,
            "misses": 0, "rejected_at_cap": 0, "rejected_by_admission": 0}, {"name": "wal", "cached_blocks": 64, "hits": 3,
            "misses": 1, "rejected_at_cap": 5, "rejected_by_admission": 2}]});
        assert_eq!(
            super::class_lines(&v),
            [
                "class db/unclassified: 1 blocks cached, 0.0% of 0 block accesses hit; around the cache: 0 at its cap, 0 by \
                 its admission",
                "class db/wal: 64 blocks cached, 75.0% of 4 block accesses hit; around the cache: 5 at its cap, 2 by its \
                 admission"
            ]
        );
        assert!(super::class_lines(&serde_json::json!({"name": "x"})).is_empty());
    }
}
