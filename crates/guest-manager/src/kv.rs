//! `cachevisor-guest --kv KEYS`: SymFlex's Fatcache use (§4.2) run for real — the
//! `cachevisor-guest` slab key-value store on a vSSD, driven as a cache-aside client
//! drives memcached: a get, and on a miss a set (the client fetched the value from its
//! database); a share of the operations are sets of new values. Keys follow `--hot`'s
//! hot/cold split, values are `--io-size` bytes, and with `--verify` every value a get
//! returns is checked against the last one set under its key. The hit ratio, operations
//! per second, slabs held and items every interval; the host's inflates and deflates are
//! handled between operations.

use crate::manager::{open_dev, parse_hot, GuestArgs};
use crate::workload::{Shape, Verifier, Workload};
use anyhow::{bail, Context};
use cachevisor_guest::slab_kv::SlabKv;
use cachevisor_guest::Control;
use cachevisor_trace::units::parse_size;
use std::time::Instant;

/// Runs the key-value workload over `keys` keys.
pub fn run(a: &GuestArgs, keys: u64) -> anyhow::Result<()> {
    let mut kv = SlabKv::start(open_dev(&a.vssd, "--vssd")?, Control::open(&a.control)?)
        .context("starting the slab key-value store")?;
    let value_len = parse_size(&a.io_size).map_err(|e| anyhow::anyhow!("--io-size: {e}"))?;
    if value_len == 0 || value_len + 64 > kv.slab_size() {
        bail!("--io-size: a value of {value_len} bytes does not fit a {}-byte slab", kv.slab_size());
    }
    if keys == 0 {
        bail!("--kv: give 1 key or more");
    }
    let (hot_fraction, hot_size) = parse_hot(&a.hot)?;
    let (duration, interval) = crate::manager::run_length(a)?;
    // Keys as units of the workload's address space: key k is the unit at k × value_len.
    let shape =
        Shape { origin: keys * value_len, io: value_len, hot_fraction, hot_size, write_ratio: a.write_ratio, apps: 1 };
    let mut w = Workload::new(shape, a.seed).map_err(anyhow::Error::msg)?;
    let mut v = Verifier::default();
    println!("{:>7} {:>7} {:>9} {:>7} {:>7}", "time", "hit", "ops/s", "slabs", "items");
    let start = Instant::now();
    let (mut ops, mut verified) = (0u64, 0u64);
    let mut last = (Instant::now(), *kv.stats(), 0u64);
    while duration.is_none_or(|d| start.elapsed() < d) && a.ops.is_none_or(|n| ops < n) {
        let acc = w.next_access();
        let key = acc.offset.to_le_bytes();
        if acc.write {
            let value = v.next_write(acc.offset, value_len as usize);
            kv.set(&key, &value)?;
        } else if let Some(got) = kv.get(&key)? {
            if a.verify {
                // A key never set through this client reads nothing; a value is the last set.
                match v.expected(acc.offset, value_len as usize) {
                    Some(want) if want == got => verified += 1,
                    _ => bail!("verify: key {} returned a value that is not the last one set", acc.offset / value_len),
                }
            }
        } else {
            // Cache-aside: the client fetched it elsewhere and sets it.
            let value = match v.expected(acc.offset, value_len as usize) {
                Some(known) => known,
                None => v.next_write(acc.offset, value_len as usize),
            };
            kv.set(&key, &value)?;
        }
        ops += 1;
        kv.service()?;
        if last.0.elapsed() >= interval {
            let s = *kv.stats();
            let (hits, misses) = (s.hits - last.1.hits, s.misses - last.1.misses);
            let hit = if hits + misses == 0 { 0.0 } else { hits as f64 / (hits + misses) as f64 };
            let rate = (ops - last.2) as f64 / last.0.elapsed().as_secs_f64();
            println!(
                "{:>6.1}s {:>7.3} {:>9.0} {:>7} {:>7}",
                start.elapsed().as_secs_f64(),
                hit,
                rate,
                kv.table().valid(),
                kv.table().items()
            );
            last = (Instant::now(), s, ops);
        }
    }
    let s = kv.stats();
    println!(
        "{ops} operations{}; {} sets ({} not stored), {} hits, {} misses, {} items dropped; inflated {} blocks, gave back {}, {} taken by the host",
        if a.verify { format!(", {verified} values verified") } else { String::new() },
        s.sets,
        s.not_stored,
        s.hits,
        s.misses,
        s.dropped,
        s.inflated,
        s.released,
        s.forced
    );
    Ok(())
}
