//! Fuzzes the snapshot decoder and the prewarm planner: arbitrary bytes are
//! decoded as a snapshot, which must fail cleanly or give a snapshot that re-encodes and
//! decodes to itself; a decoded snapshot is ranked (every heuristic) and planned, and
//! every run must name blocks of the set it came from, within its `max_run`, with no
//! overflow past 2^64 — the planner's ids reach the engine, which range-checks them
//! (`disk_range.rs`), so a block id across the whole u64 range must not wrap here.
#![no_main]

use cachevisor_prewarm::plan::plan;
use cachevisor_prewarm::scores::{Heuristic, Ranking};
use cachevisor_prewarm::Snapshot;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&max_run, bytes)) = data.split_first() else { return };
    let Ok(s) = Snapshot::read_from(std::io::Cursor::new(bytes)) else { return };
    let mut again = Vec::new();
    s.write_to(&mut again).expect("a decoded snapshot encodes");
    let back = Snapshot::read_from(std::io::Cursor::new(&again)).expect("and decodes again");
    assert_eq!(back.sets, s.sets);
    if s.objects() > 1 << 16 {
        return; // planning is linear in the set; keep each case fast
    }
    for h in [Heuristic::Recent, Heuristic::Frequent] {
        let r = Ranking::new(&[&s], h);
        let set: Vec<_> = r.objects.iter().copied().collect();
        for run in plan(&set, max_run as u32) {
            assert!(run.len >= 1 && run.len <= (max_run as u32).max(1));
            let name = &r.sets[run.set as usize];
            let last = run.first.checked_add(run.len as u64 - 1).expect("a run does not wrap");
            assert!(s.sets[name].contains(run.first) && s.sets[name].contains(last));
        }
    }
});
