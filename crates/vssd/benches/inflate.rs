//! The block manager's own cost of a resize on a large region (SymFlex Fig. 6 measures
//! the whole resize; this is the bookkeeping part, devices taken as instant): inflating a
//! vSSD by 1,024 blocks and deflating it back, on regions of 16 Ki and 256 Ki blocks
//! (16 GiB and 256 GiB at 1 MiB), with three other vSSDs holding blocks. A cost that
//! grows with the region's size per block moved shows here as the two sizes' ratio.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use cachevisor_vssd::{BlockManager, Config, Geometry, State};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

/// Runs every op and commits everything, until nothing is left.
fn pump(m: &mut BlockManager) {
    loop {
        let mut any = false;
        while let Some(op) = m.poll_op() {
            m.op_done(op.id, Ok(()));
            any = true;
        }
        let mut last = None;
        while let Some((seq, _)) = m.poll_record() {
            last = Some(seq);
        }
        if let Some(seq) = last {
            m.committed(seq);
            any = true;
        }
        while m.poll_event().is_some() {}
        if !any {
            return;
        }
    }
}

fn setup(blocks: u32) -> (BlockManager, u32) {
    let geometry = Geometry::new(1 << 20, blocks).unwrap();
    let mut m = BlockManager::new(Config { geometry, deflate_grace: 1 }, State::new(geometry));
    for i in 0..3 {
        m.register(&format!("other{i}"), 4096, 512, true, 0).unwrap();
    }
    let id = m.register("vm", 4096, 0, false, 0).unwrap();
    pump(&mut m);
    (m, id)
}

fn inflate_deflate(c: &mut Criterion) {
    let mut g = c.benchmark_group("vssd_resize_1024_blocks");
    g.sample_size(10);
    for blocks in [16u32 << 10, 256 << 10] {
        let (mut m, id) = setup(blocks);
        let mut now = 0;
        g.bench_with_input(BenchmarkId::from_parameter(blocks), &blocks, |b, _| {
            b.iter(|| {
                m.set_target(id, 1024, now).unwrap();
                pump(&mut m);
                let lbns = m.valid_lbns(id);
                m.set_target(id, 0, now).unwrap();
                m.release(id, &lbns).unwrap();
                pump(&mut m);
                now += 1;
            })
        });
    }
    g.finish();
}

criterion_group!(benches, inflate_deflate);
criterion_main!(benches);
