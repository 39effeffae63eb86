//! Criterion bench: parsing speed of each text and binary format on generated input.

#![allow(missing_docs)]

use cachevisor_trace::{open_trace, Format, Op, ReadOptions, Request, TraceWriter};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::io::BufWriter;

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let n = 200_000u64;
    let mut g = c.benchmark_group("parse");
    g.throughput(Throughput::Elements(n));
    for f in [Format::Msr, Format::Csv, Format::CloudphysicsCsv, Format::Mqsim, Format::Blkparse, Format::Vscsi] {
        let path = dir.path().join(format!("t.{}", f.name()));
        let out = Box::new(BufWriter::new(std::fs::File::create(&path).unwrap()));
        let mut w = TraceWriter::new(f, out, 4096).unwrap();
        for i in 0..n {
            let op = if i % 3 == 0 { Op::Write } else { Op::Read };
            let r = Request {
                time_ns: 1_000_000_000 + i * 1_000_000,
                vm: 0,
                op,
                offset: (i * 7919 % 100_000) * 4096,
                len: 4096,
            };
            w.write(&r, "hm_0").unwrap();
        }
        w.finish().unwrap();
        let opts = ReadOptions { format: Some(f), ..Default::default() };
        g.bench_function(f.name(), |b| {
            b.iter(|| {
                let mut s = open_trace(&path, &opts).unwrap();
                let mut k = 0u64;
                while let Some(r) = s.next_request().unwrap() {
                    k += r.len as u64;
                }
                k
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
