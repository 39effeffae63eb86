//! Every writable format reads back what it wrote (within the format's resolution).

mod common;
use cachevisor_trace::*;
use common::read_all;
use proptest::prelude::*;

fn requests(multi_vm: bool, time_unit: u64) -> impl Strategy<Value = Vec<Request>> {
    let one = (0u64..1 << 20, if multi_vm { 0u32..3 } else { 0u32..1 }, any::<bool>(), 0u64..1 << 30, 1u32..256);
    prop::collection::vec(one, 1..60).prop_map(move |v| {
        let mut t = 0;
        v.into_iter()
            .map(|(dt, vm, w, sector, n)| {
                t += dt * time_unit;
                Request { time_ns: t, vm, op: if w { Op::Write } else { Op::Read }, offset: sector * 512, len: n * 512 }
            })
            .collect()
    })
}

fn roundtrip(format: Format, reqs: &[Request], names: &[&str]) -> Vec<Request> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(format!("t.{}", format.name()));
    let mut w = TraceWriter::new(format, Box::new(std::fs::File::create(&p).unwrap()), 4096).unwrap();
    for r in reqs {
        w.write(r, names[r.vm as usize]).unwrap();
    }
    w.finish().unwrap();
    let mut s = open_trace(&p, &ReadOptions { format: Some(format), ..Default::default() }).unwrap();
    let got = read_all(&mut *s).unwrap();
    // Map the reader's VM ids back to the writer's through the names.
    let mapped: Vec<Request> = got
        .iter()
        .map(|r| {
            let name = &s.vm_names()[r.vm as usize];
            let vm = names.iter().position(|n| name.ends_with(n)).unwrap_or(0) as u32;
            Request { vm, ..*r }
        })
        .collect();
    mapped
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn lossless_formats(reqs in requests(true, 1)) {
        prop_assert_eq!(&roundtrip(Format::Csv, &reqs, &["a", "b", "c"]), &reqs);
        prop_assert_eq!(&roundtrip(Format::Mqsim, &reqs, &[":0", ":1", ":2"]), &reqs);
        let blk: Vec<Request> = reqs.iter().map(|r| Request { vm: 0, ..*r }).collect();
        prop_assert_eq!(&roundtrip(Format::Blkparse, &blk, &["8,0"]), &blk);
    }

    #[test]
    fn msr_at_100ns(reqs in requests(true, 100)) {
        let t0 = 1_200_000_000_000_000_000u64; // a 2008 date, as in the MSR traces
        let reqs: Vec<Request> = reqs.into_iter().map(|r| Request { time_ns: r.time_ns + t0, ..r }).collect();
        prop_assert_eq!(roundtrip(Format::Msr, &reqs, &["hm_0", "hm_1", "web_2"]), reqs);
    }

    #[test]
    fn vscsi_at_us(reqs in requests(false, 1000)) {
        prop_assert_eq!(roundtrip(Format::Vscsi, &reqs, &["t"]), reqs);
    }

    #[test]
    fn cloudphysics_at_s(reqs in requests(false, 1_000_000_000)) {
        prop_assert_eq!(roundtrip(Format::CloudphysicsCsv, &reqs, &["t"]), reqs);
    }

    #[test]
    fn oracle_general_blocks(blocks in prop::collection::vec(0u64..1000, 1..80)) {
        let reqs: Vec<Request> = blocks.iter().enumerate().map(|(i, &b)| Request {
            time_ns: i as u64 * 1_000_000_000, vm: 0, op: Op::Read, offset: b * 4096, len: 4096 }).collect();
        prop_assert_eq!(roundtrip(Format::OracleGeneral, &reqs, &["t"]), reqs);
    }
}
