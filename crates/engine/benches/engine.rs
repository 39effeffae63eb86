//! Criterion bench: engine requests per second per replacement policy on a Zipf(1.0)
//! trace of single-block reads (1 M requests over 100 K blocks, 10 K-block cache), and a
//! mixed read/write multi-block workload under write-back; and the same Zipf reads on the
//! asynchronous face (submit, ops handed out, completions in issue order at queue depth 4),
//! whose cost over `access` alone is the in-flight bookkeeping every driver pays.

#![allow(missing_docs)]

use cachevisor_engine::{Engine, EngineConfig, Event, Output, ReplacementKind};
use cachevisor_trace::zipf::ZipfSource;
use cachevisor_trace::{Op, Request, TraceSource};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn zipf(n: u64) -> Vec<Request> {
    let mut z = ZipfSource::new(n, 100_000, 1.0, 4096, 1).unwrap();
    let mut v = Vec::with_capacity(n as usize);
    while let Some(r) = z.next_request().unwrap() {
        v.push(r);
    }
    v
}

fn engine(kind: ReplacementKind) -> Engine {
    let mut e = Engine::new(EngineConfig { replacement: kind, ..EngineConfig::with_slots(10_000) }).unwrap();
    e.set_target(0, 10_000, &mut Output::default());
    e
}

fn bench(c: &mut Criterion) {
    let reads = zipf(1_000_000);
    let mixed: Vec<Request> = reads
        .iter()
        .enumerate()
        .map(|(i, r)| Request {
            op: if i % 3 == 0 { Op::Write } else { Op::Read },
            len: if i % 5 == 0 { 16384 } else { 4096 },
            ..*r
        })
        .collect();
    let mut g = c.benchmark_group("engine");
    g.sample_size(10);
    g.throughput(Throughput::Elements(reads.len() as u64));
    for kind in ReplacementKind::ALL {
        g.bench_function(format!("zipf-reads/{kind}"), |b| {
            b.iter(|| {
                let mut e = engine(kind);
                let mut out = Output::default();
                let mut hits = 0u64;
                for r in &reads {
                    e.access(r.time_ns, r, &mut out);
                    hits += out.blocks[0].hit as u64;
                }
                hits
            })
        });
    }
    g.bench_function("mixed-wb/lru", |b| {
        b.iter(|| {
            let mut e = engine(ReplacementKind::Lru);
            let mut out = Output::default();
            for r in &mixed {
                e.access(r.time_ns, r, &mut out);
            }
            e.partition(0).dirty_blocks
        })
    });
    g.bench_function("zipf-reads-async/lru", |b| {
        b.iter(|| {
            let mut e = engine(ReplacementKind::Lru);
            let mut q = std::collections::VecDeque::new();
            let mut hits = 0u64;
            for (i, r) in reads.iter().enumerate() {
                e.submit(i as u64, r);
                loop {
                    while let Some(op) = e.poll_op() {
                        q.push_back(op.handle());
                    }
                    if q.len() <= 4 {
                        break;
                    }
                    let h = q.pop_front().expect("queued");
                    e.handle_completion(i as u64, h, Ok(()));
                }
                while let Some(ev) = e.poll_event() {
                    if let Event::Reply { blocks, .. } = ev {
                        hits += blocks[0].hit as u64;
                        e.recycle(blocks);
                    }
                }
            }
            hits
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
