//! `cachevisor bench …`: speed and memory, measured side by side in one process with
//! interleaved repetitions and reported as medians (the machines here are noisy).
//!
//! - `bench sim`: a Zipf trace of single-block reads (10 M requests over 1 M blocks by
//!   default) in libCacheSim's oracleGeneral format, replayed end to end (read file +
//!   cache) by cachevisor's LRU and CLOCK and, given `--cachesim PATH`, by libCacheSim's
//!   `cachesim` (its C tool, built in Release from its source beside the project) on the
//!   same file; then the engine alone and the full simulator per replacement policy, and
//!   the bundled real traces through the full simulator (`sim.rs`).
//! - `bench parse`: requests per second of every reader.
//! - `bench analyze`: exact and SHARDS miss-ratio curves against libCacheSim's
//!   `cachesim` LRU run at several sizes on the same file (`--cachesim PATH`;
//!   `sim.rs`).
//! - `bench cluster`: ELICA's Eq. 4 allocation, exact and ILP solvers side by side
//!   (`cluster.rs`).
//! - `bench cluster-serve`: ELICA on three real daemons with etcd (`cluster_serve.rs`;
//!   replicated write-back in `cluster_replica.rs`).
//! - `bench devices`: the cache over 1, 2 and 4 devices and mirrored dirty data's cost
//!   (`devices.rs`).
//! - `bench memory`: fills an engine of the given cache size and reports metadata bytes
//!   per slot and peak RSS.

pub(crate) mod cluster;
pub(crate) mod cluster_nodes;
pub(crate) mod cluster_replica;
pub(crate) mod cluster_serve;
pub(crate) mod datapath;
pub(crate) mod devices;
pub(crate) mod serve;
pub(crate) mod sim;
pub(crate) mod sim_process;
pub(crate) mod vhost;
pub(crate) mod vssd;

use crate::bench::sim::{bench_analyze, bench_sim, Zipf};
use anyhow::Context;
use cachevisor_cli::trace_file::write_source;
use cachevisor_engine::{Engine, EngineConfig, Output};
use cachevisor_trace::units::{format_size, parse_size};
use cachevisor_trace::zipf::ZipfSource;
use cachevisor_trace::{open_trace, Format, Op, ReadOptions, Request, TraceSource, TraceWriter};
use clap::Subcommand;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Bench subcommands.
#[derive(Debug, Subcommand)]
pub enum BenchCmd {
    /// Simulator and engine speed against libCacheSim on a Zipf trace, and on the bundled traces.
    Sim {
        /// Requests in the Zipf trace.
        #[arg(long, default_value_t = 10_000_000)]
        requests: u64,
        /// Distinct blocks.
        #[arg(long, default_value_t = 1_000_000)]
        blocks: u64,
        /// Cache size in blocks.
        #[arg(long, default_value_t = 100_000)]
        cache_blocks: u64,
        /// Zipf skew.
        #[arg(long, default_value_t = 1.0)]
        alpha: f64,
        /// Interleaved repetitions.
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Directory for the generated trace (kept for reuse).
        #[arg(long, default_value = "out/bench")]
        dir: PathBuf,
        /// libCacheSim's `cachesim` binary (built in Release from its source) to compare with.
        #[arg(long)]
        cachesim: Option<PathBuf>,
        /// Skip the bundled real traces.
        #[arg(long)]
        no_bundled: bool,
    },
    /// Miss-ratio-curve speed and memory: exact vs SHARDS vs libCacheSim LRU at several sizes.
    Analyze {
        /// Requests in the Zipf trace.
        #[arg(long, default_value_t = 10_000_000)]
        requests: u64,
        /// Distinct blocks.
        #[arg(long, default_value_t = 1_000_000)]
        blocks: u64,
        /// Zipf skew.
        #[arg(long, default_value_t = 1.0)]
        alpha: f64,
        /// Interleaved repetitions.
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Directory for the generated trace.
        #[arg(long, default_value = "out/bench")]
        dir: PathBuf,
        /// libCacheSim's `cachesim` binary (built in Release from its source) to compare with.
        #[arg(long)]
        cachesim: Option<PathBuf>,
    },
    /// Parsing speed of every trace format.
    Parse {
        /// Requests per generated file.
        #[arg(long, default_value_t = 2_000_000)]
        requests: u64,
        /// Interleaved repetitions.
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Directory for the generated files.
        #[arg(long, default_value = "out/bench")]
        dir: PathBuf,
    },
    /// One allocator call per policy for many VMs (target: under 10 ms for 1,000 VMs).
    Policy {
        /// VMs.
        #[arg(long, default_value_t = 1000)]
        vms: usize,
        /// Points per hit curve (allocation units of the pool).
        #[arg(long, default_value_t = 256)]
        units: u64,
        /// Interleaved repetitions (median reported).
        #[arg(long, default_value_t = 7)]
        reps: usize,
    },
    /// ELICA's cluster allocation (Eq. 4): exact, ILP and fast solvers, 10 to 500 VMs on 3 to 16 nodes.
    Cluster {
        /// Units per VM curve (its ideal size).
        #[arg(long, default_value_t = 8)]
        levels: usize,
        /// Interleaved repetitions (median reported).
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Run the exact reference solver up to this many VMs (its tables grow fast).
        #[arg(long, default_value_t = 250)]
        exact_vms: usize,
        /// Run the ILP up to this many VMs.
        #[arg(long, default_value_t = 500)]
        ilp_vms: usize,
    },
    /// ELICA on real daemons: three nodes on loopback with etcd, a skewed placement with
    /// the cluster on vs each node alone (aggregate IOPS, p99), a remote hit's cost vs
    /// the loopback round trip, a lender's SIGKILL (stall, recovery), and replicated
    /// write-back against write-back on one node and the backing store.
    ClusterServe {
        /// The etcd binary (Debian's etcd-server).
        #[arg(long, default_value = "etcd")]
        etcd: std::path::PathBuf,
        /// Delay of each backing request, ms (nbdkit's delay filter).
        #[arg(long, default_value_t = 2)]
        delay_ms: u32,
        /// Seconds per measured run.
        #[arg(long, default_value_t = 10)]
        secs: u32,
        /// Interleaved rounds (medians reported).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Cache per node, MiB.
        #[arg(long, default_value_t = 32)]
        cache_mib: u64,
        /// Node a's working set, MiB (more than its cache, less than its cache and its loans).
        #[arg(long, default_value_t = 48)]
        set_mib: u64,
        /// What b and c each lend a, MiB.
        #[arg(long, default_value_t = 16)]
        lend_mib: u64,
        /// Which parts run: skew (cluster vs alone), hit (a remote hit's cost), loss (a lender
        /// killed), replica (replicated write-back's cost and IOPS).
        #[arg(long, value_delimiter = ',', default_value = "skew,hit,loss,replica")]
        parts: Vec<String>,
        /// Working directory.
        #[arg(long, default_value = "out/bench-cluster-serve")]
        dir: std::path::PathBuf,
    },
    /// ELICA's cluster simulator at scale: VMs on nodes replayed for simulated time, with
    /// wall time and peak memory (the scale run: 500 VMs, 16 nodes, one hour of simulated time).
    ClusterSim {
        /// VMs.
        #[arg(long, default_value_t = 500)]
        vms: usize,
        /// Nodes.
        #[arg(long, default_value_t = 16)]
        nodes: usize,
        /// Simulated time, seconds.
        #[arg(long, default_value_t = 3600)]
        secs: u64,
        /// Requests per second per VM.
        #[arg(long, default_value_t = 10.0)]
        iops: f64,
        /// Cache per node.
        #[arg(long, default_value = "64MiB")]
        cache: String,
        /// `elica` or `local`.
        #[arg(long, default_value = "elica")]
        mode: String,
        /// Migration on reallocation.
        #[arg(long, default_value = "auto", value_parser = ["auto", "gradual", "instant", "off"])]
        migration: String,
    },
    /// The daemon's hit path vs nbdkit's file plugin under fio (needs fio and nbdkit).
    Serve {
        /// Disk image size.
        #[arg(long, default_value = "256MiB", value_parser = parse_size)]
        disk_size: u64,
        /// Interleaved rounds per iodepth.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Seconds per fio run.
        #[arg(long, default_value_t = 5)]
        secs: u32,
        /// fio patterns, comma-separated: randread, randwrite, randrw (70% reads), read, write.
        #[arg(long, value_delimiter = ',', default_value = "randread", value_parser = ["randread", "randwrite", "randrw", "read", "write"])]
        rw: Vec<String>,
        /// Block size of the fio jobs (4k, 1M, …).
        #[arg(long, default_value = "4k")]
        bs: String,
        /// Queue depths, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,32")]
        iodepth: Vec<u32>,
        /// cachevisor's write policy for the export (the cache holds the whole image).
        #[arg(long, default_value = "wb", value_parser = ["wb", "wt", "wa", "ro"])]
        write_policy: String,
        /// fio flushes after every N writes (a guest that flushes; 0 = never).
        #[arg(long, default_value_t = 0)]
        fsync: u32,
        /// Which comparisons: `both`, `buffered` (vs nbdkit) or `direct` (O_DIRECT vs qemu-nbd).
        #[arg(long, default_value = "both", value_parser = ["both", "buffered", "direct"])]
        against: String,
        /// Over TLS with client certificates (made by the bench with openssl): cachevisor
        /// against qemu-nbd --tls-creds and nbdkit --tls=require, and its TLS cost
        /// against its own plaintext path.
        #[arg(long)]
        tls: bool,
        /// Working directory.
        #[arg(long, default_value = "out/bench/serve")]
        dir: PathBuf,
    },
    /// A real guest's two doors to a vDisk — QEMU's NBD client and vhost-user-blk — and
    /// qemu-storage-daemon's vhost-user-blk (cache.direct=on, aio=native), and a vSSD over
    /// vhost-user-blk (no engine in its path): dd 4 KiB
    /// O_DIRECT at queue depth 1 in the guest, interleaved rounds, medians.
    Vhost {
        /// The guest kernel's directory (scripts/guest-kernel unpacks one).
        #[arg(long, default_value = "target/guest-kernel")]
        kernel: PathBuf,
        /// qemu-storage-daemon.
        #[arg(long, default_value = "qemu-storage-daemon")]
        qsd: PathBuf,
        /// I/Os per run.
        #[arg(long, default_value_t = 20000)]
        ios: u64,
        /// Interleaved rounds.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Working directory.
        #[arg(long, default_value = "out/bench/vhost")]
        dir: PathBuf,
    },
    /// The cache over 1, 2 and 4 devices, mirrored dirty data's cost, and the RAM tier's
    /// hits against the SSD's (`devices.rs`).
    Devices {
        /// Disk image size, MiB (the cache holds it whole).
        #[arg(long, default_value_t = 128)]
        disk_mib: u64,
        /// Interleaved rounds.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Seconds per fio run.
        #[arg(long, default_value_t = 4)]
        secs: u32,
        /// Working directory.
        #[arg(long, default_value = "out/bench/devices")]
        dir: PathBuf,
    },
    /// A vSSD's data path (O_DIRECT) against qemu-nbd --cache=none --aio=native, and
    /// resize latency by size.
    Vssd {
        /// The vSSD's size, MiB (and the peer's raw file).
        #[arg(long, default_value_t = 256)]
        size_mib: u64,
        /// Interleaved rounds.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Seconds per fio run.
        #[arg(long, default_value_t = 5)]
        secs: u32,
        /// fio patterns, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "randread,randwrite", value_parser = ["randread", "randwrite", "randrw", "read", "write"])]
        rw: Vec<String>,
        /// Block size of the fio jobs.
        #[arg(long, default_value = "4k")]
        bs: String,
        /// Queue depths, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,32")]
        iodepth: Vec<u32>,
        /// Resize sizes in blocks, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
        resize_blocks: Vec<u32>,
        /// Working directory.
        #[arg(long, default_value = "out/bench/vssd")]
        dir: PathBuf,
    },
    /// A slow backing (nbdkit delay filter) alone and behind cachevisor, with the
    /// simulator's hit ratio for the recorded run.
    SlowBacking {
        /// Delay per backing request in ms (nbdkit takes whole milliseconds).
        #[arg(long, default_value_t = 5)]
        delay_ms: u32,
        /// Disk size in MiB.
        #[arg(long, default_value_t = 256)]
        disk_mib: u64,
        /// Cache size in MiB.
        #[arg(long, default_value_t = 32)]
        cache_mib: u64,
        /// Seconds per fio run.
        #[arg(long, default_value_t = 10)]
        secs: u32,
        /// Rounds per iodepth.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Share of reads in percent (below 100: fio randrw; 0: randwrite).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(0..=100))]
        read_percent: u32,
        /// fio iodepths, each run against both.
        #[arg(long, value_delimiter = ',', default_value = "1,16")]
        iodepth: Vec<u32>,
        /// cachevisor's write policy (`wb`: writes absorbed by the cache).
        #[arg(long, default_value = "wt", value_parser = ["wb", "wt", "wa", "ro"])]
        write_policy: String,
        /// cachevisor's background flusher rate (`0` = off).
        #[arg(long, default_value = "16MiB")]
        flush_rate: String,
        /// After each cached run, destage every dirty block through the API and report
        /// blocks/s against the backing's limit (16 connections / delay).
        #[arg(long)]
        destage: bool,
        /// Working directory.
        #[arg(long, default_value = "out/bench/slow")]
        dir: PathBuf,
    },
    /// The engine's new data path (persistent mode, no NBD) against a plain file, in process.
    Datapath {
        /// Disk size.
        #[arg(long, default_value = "256MiB", value_parser = parse_size)]
        disk_size: u64,
        /// Cache size.
        #[arg(long, default_value = "512MiB", value_parser = parse_size)]
        cache_size: u64,
        /// I/O size.
        #[arg(long, default_value = "4KiB", value_parser = parse_size)]
        bs: u64,
        /// Client threads, each run against both.
        #[arg(long, value_delimiter = ',', default_value = "1,32")]
        threads: Vec<usize>,
        /// Workloads: randwrite, randread.
        #[arg(long, value_delimiter = ',', default_value = "randwrite,randread", value_parser = ["randwrite", "randread"])]
        rw: Vec<String>,
        /// Seconds per timed run.
        #[arg(long, default_value_t = 2.0)]
        secs: f64,
        /// Interleaved rounds.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// O_DIRECT on both sides (the cache store; the plain file, as qemu-nbd --cache=none).
        #[arg(long)]
        direct: bool,
        /// The data path's device threads (client threads also run ops themselves; 0: one
        /// per CPU).
        #[arg(long, default_value_t = 0)]
        device_threads: usize,
        /// Through NBD with fio (iodepths = --threads) against qemu-nbd --cache=none
        /// --aio=native on the plain file (needs fio and qemu-utils; use with --direct).
        #[arg(long)]
        nbd: bool,
        /// Working directory.
        #[arg(long, default_value = "out/bench/datapath")]
        dir: PathBuf,
    },
    /// Metadata memory of a full cache of the given size.
    Memory {
        /// Cache size.
        #[arg(long, default_value = "1TiB", value_parser = parse_size)]
        cache_size: u64,
        /// Block size.
        #[arg(long, default_value = "4KiB", value_parser = cachevisor_trace::units::parse_block_size)]
        block_size: u64,
        /// Track last-access times (4 more bytes per slot).
        #[arg(long)]
        last_access: bool,
    },
}

/// Runs a bench.
pub fn run(c: BenchCmd) -> anyhow::Result<()> {
    match c {
        BenchCmd::Sim { requests, blocks, cache_blocks, alpha, reps, dir, cachesim, no_bundled } => {
            let zipf = Zipf { requests, blocks, alpha };
            bench_sim(zipf, cache_blocks, reps, &dir, cachesim.as_deref(), !no_bundled)
        }
        BenchCmd::Parse { requests, reps, dir } => bench_parse(requests, reps, &dir),
        BenchCmd::Analyze { requests, blocks, alpha, reps, dir, cachesim } => {
            bench_analyze(requests, blocks, alpha, reps, &dir, cachesim.as_deref())
        }
        BenchCmd::Memory { cache_size, block_size, last_access } => bench_memory(cache_size, block_size, last_access),
        BenchCmd::Datapath {
            disk_size,
            cache_size,
            bs,
            threads,
            rw,
            secs,
            rounds,
            direct,
            device_threads,
            nbd,
            dir,
        } => crate::bench::datapath::run(
            disk_size,
            cache_size,
            bs,
            &threads,
            &rw,
            secs,
            rounds,
            direct,
            device_threads,
            nbd,
            &dir,
        ),
        BenchCmd::Policy { vms, units, reps } => bench_policy(vms, units, reps),
        BenchCmd::Cluster { levels, reps, exact_vms, ilp_vms } => {
            crate::bench::cluster::run(levels, reps, exact_vms, ilp_vms)
        }
        BenchCmd::ClusterServe { etcd, delay_ms, secs, rounds, cache_mib, set_mib, lend_mib, parts, dir } => {
            crate::bench::cluster_serve::run(&crate::bench::cluster_serve::Opts {
                etcd,
                delay_ms,
                secs,
                rounds,
                cache_mib,
                set_mib,
                lend_mib,
                parts,
                dir,
            })
        }
        BenchCmd::ClusterSim { vms, nodes, secs, iops, cache, mode, migration } => {
            crate::bench::cluster::run_sim(vms, nodes, secs, iops, &cache, &mode, &migration)
        }
        BenchCmd::Serve { disk_size, rounds, secs, rw, bs, iodepth, write_policy, fsync, against, tls, dir } => {
            let job = crate::bench::serve::Job { rw, bs, iodepth, write_policy, fsync, against, tls };
            crate::bench::serve::run(disk_size, rounds, secs, &job, &dir)
        }
        BenchCmd::Vhost { kernel, qsd, ios, rounds, dir } => {
            crate::bench::vhost::run(&crate::bench::vhost::Job { kernel, qsd, ios, rounds }, &dir)
        }
        BenchCmd::Devices { disk_mib, rounds, secs, dir } => {
            crate::bench::devices::run(&crate::bench::devices::Job { disk_mib, rounds, secs }, &dir)
        }
        BenchCmd::Vssd { size_mib, rounds, secs, rw, bs, iodepth, resize_blocks, dir } => {
            let job = crate::bench::vssd::Job { size_mib, rw, bs, iodepth, secs, rounds, resize_blocks };
            crate::bench::vssd::run(&job, &dir)
        }
        BenchCmd::SlowBacking {
            delay_ms,
            disk_mib,
            cache_mib,
            secs,
            rounds,
            iodepth,
            read_percent,
            write_policy,
            flush_rate,
            destage,
            dir,
        } => {
            let cache = crate::bench::serve::SlowCache { mib: cache_mib, write_policy, flush_rate, destage };
            crate::bench::serve::slow_backing(delay_ms, disk_mib, &cache, secs, rounds, &iodepth, read_percent, &dir)
        }
    }
}

/// Peak resident set size of this process, from /proc.
pub fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Median of the measurements (upper middle for an even count).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

pub(crate) fn zipf_file(dir: &Path, requests: u64, blocks: u64, alpha: f64) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("zipf-{alpha}-{requests}-{blocks}.oracleGeneral"));
    if !path.exists() {
        eprintln!("generating {} …", path.display());
        let mut src = ZipfSource::new(requests, blocks, alpha, 4096, 1)?;
        let tmp = path.with_extension("partial");
        write_source(&mut src, Format::OracleGeneral, &tmp, 4096)?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(path)
}

fn bench_parse(requests: u64, reps: usize, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let formats = [
        Format::Msr,
        Format::Csv,
        Format::CloudphysicsCsv,
        Format::Mqsim,
        Format::Blkparse,
        Format::Vscsi,
        Format::OracleGeneral,
    ];
    let mut files = Vec::new();
    for f in formats {
        let path = dir.join(format!("parse-{requests}.{}", f.name()));
        if !path.exists() {
            let out = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
            let mut w = TraceWriter::new(f, Box::new(std::io::BufWriter::with_capacity(1 << 20, out)), 4096)?;
            let mut z = ZipfSource::new(requests, 1_000_000, 0.9, 4096, 7)?;
            let mut i = 0u64;
            while let Some(mut r) = z.next_request()? {
                r.time_ns = 1_300_000_000_000_000_000 + i * 1_000_000_000;
                r.op = if i.is_multiple_of(3) { Op::Write } else { Op::Read };
                w.write(&r, "hm_0")?;
                i += 1;
            }
            w.finish()?;
        }
        files.push((f, path));
    }
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); files.len()];
    for _ in 0..reps {
        for (i, (f, path)) in files.iter().enumerate() {
            let t = Instant::now();
            let mut s = open_trace(path, &ReadOptions { format: Some(*f), ..Default::default() })?;
            let (mut n, mut batch) = (0u64, Vec::with_capacity(4096));
            loop {
                batch.clear();
                let k = s.next_batch(&mut batch, 4096)? as u64;
                if k == 0 {
                    break;
                }
                n += k;
            }
            rates[i].push(n as f64 / t.elapsed().as_secs_f64() / 1e6);
        }
    }
    println!("parsing speed, {requests} requests per file, median of {reps}, M requests/s:");
    for ((f, _), r) in files.iter().zip(rates) {
        println!("  {:<18} {:>7.2}", f.name(), median(r));
    }
    Ok(())
}

fn bench_memory(cache: u64, block: u64, last_access: bool) -> anyhow::Result<()> {
    let slots = cache / block;
    let cfg = EngineConfig { block_size: block, track_last_access: last_access, ..EngineConfig::with_slots(slots) };
    let t = Instant::now();
    let mut e = Engine::new(cfg).map_err(anyhow::Error::msg)?;
    let mut out = Output::default();
    e.set_target(0, slots, &mut out);
    let mut progress = cachevisor_cli::progress::Progress::new("filling the cache");
    for b in 0..slots {
        let r = Request { time_ns: b, vm: 0, op: Op::Read, offset: b * block, len: block as u32 };
        e.access(b, &r, &mut out);
        if b % (1 << 16) == 0 {
            progress.update(b, Some(slots));
        }
    }
    progress.finish();
    let md = e.metadata_bytes() as f64;
    println!(
        "{} cache in {} blocks: {slots} slots filled in {:.1} s; metadata {} = {:.2} bytes/slot{}; peak RSS {}",
        format_size(cache),
        format_size(block),
        t.elapsed().as_secs_f64(),
        format_size(md as u64),
        md / slots as f64,
        if last_access { " (with last-access times)" } else { "" },
        format_size(peak_rss_bytes())
    );
    Ok(())
}

/// Demands of `n` VMs with curves of `units` points: concave ones that saturate at their
/// working set, and stepped (non-concave) ones, seeded so every run sees the same input.
fn policy_demands(n: usize, units: u64, unit: u64) -> Vec<cachevisor_policy::VmDemand> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    (0..n)
        .map(|i| {
            let total = rng.gen_range(1_000.0..100_000.0);
            let wss = rng.gen_range(1..=units) as f64;
            let curve: Vec<f64> = (0..=units)
                .map(|k| {
                    let k = k as f64;
                    if i % 2 == 0 {
                        total * (1.0 - (-3.0 * k / wss).exp()) * if k >= wss { 1.0 } else { 0.95 }
                    } else if k >= wss {
                        total * 0.8
                    } else {
                        total * 0.2 * k / wss
                    }
                })
                .collect();
            let curve: Vec<f64> = curve
                .iter()
                .scan(0.0f64, |m, &h| {
                    *m = m.max(h);
                    Some(*m)
                })
                .collect();
            cachevisor_policy::VmDemand {
                weight: rng.gen_range(0.5..4.0),
                min_blocks: 0,
                target_blocks: unit * units / n as u64,
                used_blocks: unit * units / n as u64,
                dirty_blocks: rng.gen_range(0..=unit * units / n as u64),
                write_policy: Some(cachevisor_engine::WritePolicy::Wb),
                backing_busy: Some(rng.gen_range(0.0..1.0)),
                window_requests: rng.gen_range(1..10_000),
                read_curve: curve.iter().map(|h| h * 0.7).collect(),
                hit_curve: curve,
                accesses: total * 1.2,
                recs: Some(rng.gen_range(0.0..1.0)),
                hit_ratio: Some(rng.gen_range(0.0..1.0)),
                alloc_unit: rng.gen_range(1..1000),
                reuse_mix: cachevisor_policy::ReuseMix {
                    read_after_read: rng.gen_range(0.0..100.0),
                    read_after_write: rng.gen_range(0.0..30.0),
                    write_after_write: rng.gen_range(0.0..50.0),
                    writes: rng.gen_range(50.0..200.0),
                    write_requests: rng.gen_range(10.0..100.0),
                    ..Default::default()
                },
                hit_throughput: rng.gen_range(0.0..5_000.0),
                throughput_ratio: rng.gen_range(1.0..4.0),
            }
        })
        .collect()
}

fn bench_policy(vms: usize, units: u64, reps: usize) -> anyhow::Result<()> {
    use cachevisor_policy::{registry, Pool};
    let unit = 65_536; // 256 units × 64 Ki blocks = a 64 GiB pool of 4 KiB blocks
    let pool = Pool { capacity: unit * units, unit, free_blocks: 0 };
    let demands = policy_demands(vms, units, unit);
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); registry::NAMES.len()];
    let mut allocators: Vec<_> = registry::NAMES.iter().map(|n| registry::build(n).expect("registered")).collect();
    for _ in 0..reps.max(1) {
        for (i, a) in allocators.iter_mut().enumerate() {
            let t = Instant::now();
            let d = a.allocate(&pool, &demands);
            times[i].push(t.elapsed().as_secs_f64() * 1e3);
            std::hint::black_box(d);
        }
    }
    println!("allocator call, {vms} VMs, {units}-point curves, median of {reps} (interleaved)");
    println!("{:<22} {:>10} {:>8}", "policy", "ms/call", "< 10 ms");
    for (n, t) in registry::NAMES.iter().zip(times) {
        let m = median(t);
        println!("{n:<22} {m:>10.3} {:>8}", if m < 10.0 { "yes" } else { "NO" });
    }
    Ok(())
}
