//! `cachevisor demo`: the README's first command. Simulates the bundled real traces
//! (WebSearch, TPC-C, CloudPhysics; one VM each) on a shared SATA SSD cache in front of
//! 7.2K HDDs with several policies, prints the comparison and writes results under ./out.

use crate::bundled::demo_traces;
use crate::simulate_cmd::{comparison_table, run_all, write_comparison};
use cachevisor_engine::{PartitionMode, ReplacementKind};
use cachevisor_sim::scenario::ReplayMode;
use cachevisor_sim::Scenario;
use clap::Args;
use std::path::PathBuf;

/// Options of `demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Total cache size.
    #[arg(long, default_value = "512MiB")]
    pub cache_size: String,
    /// Output directory.
    #[arg(long, default_value = "out/demo")]
    pub out: PathBuf,
}

/// Runs the demo.
pub fn run(a: DemoArgs) -> anyhow::Result<()> {
    let mut base = Scenario::default();
    base.trace.files = demo_traces()?;
    base.cache.size = a.cache_size.clone();
    base.replay.mode = ReplayMode::Closed;
    base.replay.queue_depth = 4;
    let mut runs = Vec::new();
    for r in ReplacementKind::ALL {
        let mut s = base.clone();
        s.cache.replacement = Some(r);
        runs.push((format!("static-{r}"), s));
    }
    let mut s = base.clone();
    s.cache.allocator = "optimal".into();
    runs.push(("static-lru-optimal".into(), s));
    // Ours: the allocator every window on recent curves, over its own S3-FIFO partitions.
    let mut s = base.clone();
    s.cache.allocator = "adaptive".into();
    runs.push(("adaptive-s3fifo".into(), s));
    let mut s = base.clone();
    s.cache.partition = PartitionMode::Shared;
    s.cache.replacement = Some(ReplacementKind::Clock);
    runs.push(("shared-clock".into(), s));
    println!(
        "cachevisor demo: {} VMs from the bundled traces, {} SSD cache (860 EVO model) in front of 7.2K HDDs,\n\
         write-back, closed loop with 4 outstanding requests per VM; equal static partitions, the\n\
         best static split from whole-trace LRU curves (optimal), ours (adaptive: the split every\n\
         window from recent curves, write-back or write-through per VM), or one shared pool.\n",
        base.trace.files.len(),
        a.cache_size
    );
    let results = run_all(&runs, &a.out, None)?;
    if let Some((label, r)) = results.first() {
        println!("== {label}\n{}", r.table());
    }
    println!("== comparison\n{}", comparison_table(&results));
    write_comparison(&results, &a.out)?;
    println!(
        "results: {}/<run>/result.json, vms.csv, windows.csv and {}/comparison.csv",
        a.out.display(),
        a.out.display()
    );
    Ok(())
}
