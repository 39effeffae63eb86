//! URD on hand-made traces whose answers are worked out by hand (rule in profile.rs).

use cachevisor_analysis::{Kind, Method, Profiler};
use cachevisor_trace::{Op, Request};

fn run(ops: &[(char, u64)]) -> Profiler {
    let mut p = Profiler::new(4096, Method::Exact);
    for (i, &(op, b)) in ops.iter().enumerate() {
        let op = if op == 'R' { Op::Read } else { Op::Write };
        p.add(&Request { time_ns: i as u64, vm: 0, op, offset: b * 4096, len: 4096 });
    }
    p
}

#[test]
fn read_after_read_and_read_after_write_are_useful() {
    // W1 R2 R1: R1 is a read-after-write reuse at distance 1 (block 2 in between).
    // R2 again: read-after-read at distance 1.
    let p = run(&[('W', 1), ('R', 2), ('R', 1), ('R', 2)]);
    let urd = p.vm(0).unwrap().histogram(Kind::Read);
    assert_eq!(urd.reuses(), 2.0);
    assert_eq!(urd.max_distance(), Some(1));
    assert_eq!(urd.size_covering_reuses(1.0), Some(2), "two blocks serve every useful reuse");
}

#[test]
fn write_after_read_and_write_after_write_are_not_useful() {
    // R1 W1 W1 R2 W2: only writes re-touch blocks; no useful reuse at all.
    let p = run(&[('R', 1), ('W', 1), ('W', 1), ('R', 2), ('W', 2)]);
    let vm = p.vm(0).unwrap();
    assert_eq!(vm.histogram(Kind::Read).reuses(), 0.0);
    assert_eq!(vm.histogram(Kind::Read).size_covering_reuses(1.0), None);
    // The plain reuse distance does see them (that is the Centaur-style baseline).
    assert_eq!(vm.histogram(Kind::All).reuses(), 3.0);
}

#[test]
fn write_only_blocks_inflate_distance_but_need_no_space() {
    // R1, then 5 write-only blocks, then R1: one useful reuse at distance 5; the all-kind
    // maximum also includes the write-only blocks' own reuses (none here).
    let mut ops = vec![('R', 1)];
    ops.extend((10..15).map(|b| ('W', b)));
    ops.push(('R', 1));
    let p = run(&ops);
    let urd = p.vm(0).unwrap().histogram(Kind::Read);
    assert_eq!(urd.max_distance(), Some(5));
    assert_eq!(urd.cold(), 1.0);
    assert_eq!(p.vm(0).unwrap().histogram(Kind::Write).reuses(), 0.0);
}
