//! The guest cache manager against a versioned model of the origin's bytes: random reads
//! and writes by two applications, interleaved with the host's inflates, deflates and
//! forced takes (blocks taken after a deadline, their bytes gone, EIO until the guest
//! hears of it). Every read returns the last write, except — in write-back mode only —
//! blocks the manager itself reports lost; at the end the guest's valid blocks are the
//! host's. The host is a fake speaking the real protocol over a socket pair.

mod common;

use cachevisor_guest::{GuestCache, WriteMode};
use cachevisor_vssd::protocol::{HostLine, Notice};
use common::*;
use proptest::prelude::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone)]
enum Op {
    Read {
        app: u16,
        block: u64,
        within: u64,
        len: u64,
    },
    Write {
        app: u16,
        block: u64,
        within: u64,
        len: u64,
        tag: u8,
    },
    Inflate(u32),
    Deflate(u32),
    Force(u32),
    Shares(f64),
    Flush,
    /// The guest handles the notices that came (between requests, as a user of the
    /// library does).
    Service,
}

fn op() -> impl Strategy<Value = Op> {
    // A hot set of 8 origin blocks takes most accesses.
    let block = prop_oneof![3 => 0..8u64, 1 => 0..ORIGIN_BLOCKS];
    let io = (0..2u16, block, 0..BLOCK, 1..2 * BLOCK);
    prop_oneof![
        6 => io.clone().prop_map(|(app, block, within, len)| Op::Read { app, block, within, len }),
        6 => (io, any::<u8>()).prop_map(|((app, block, within, len), tag)| Op::Write { app, block, within, len, tag }),
        1 => (1..6u32).prop_map(Op::Inflate),
        1 => (1..6u32).prop_map(Op::Deflate),
        1 => (1..3u32).prop_map(Op::Force),
        1 => (0.0..4.0f64).prop_map(Op::Shares),
        1 => Just(Op::Flush),
        2 => Just(Op::Service),
    ]
}

type Guest = GuestCache<Vssd, Mem>;

/// Writes the manager says it lost (write-back only) are the origin's bytes in the model.
fn take_losses(g: &Guest, model: &mut [u8], seen: &mut usize) {
    let lost = &g.stats().lost_origin_blocks;
    for &b in &lost[*seen..] {
        let (from, to) = ((b * BLOCK) as usize, (((b + 1) * BLOCK) as usize).min(model.len()));
        model[from..to].copy_from_slice(&g.origin().0.lock().unwrap()[from..to]);
    }
    *seen = lost.len();
}

fn run(mode: WriteMode, initial: u32, ops: Vec<Op>) {
    let (host, control) = host(initial);
    let size = ORIGIN_BLOCKS * BLOCK - 100; // a short last block
    let origin = Mem(Arc::new(Mutex::new((0..size).map(|i| (i % 251) as u8).collect())));
    let mut model = origin.0.lock().unwrap().clone();
    let mut g = GuestCache::start(Vssd(host.clone()), origin.clone(), size, control, mode).unwrap();
    let notice = |n: Notice| host.lock().unwrap().send(&HostLine::Notice(n));
    let mut lost_seen = 0;
    let mut handled = 0;
    for op in ops {
        match op {
            Op::Read { app, block, within, len } => {
                let off = (block * BLOCK + within).min(size - 1);
                let len = len.min(size - off) as usize;
                let mut buf = vec![0; len];
                if let Err(e) = g.read(app, off, &mut buf) {
                    // Write-back: a block the host took with writes in it is an error, once.
                    assert!(mode == WriteMode::WriteBack && lost_seen < g.stats().lost_origin_blocks.len(), "{e}");
                    take_losses(&g, &mut model, &mut lost_seen);
                    g.read(app, off, &mut buf).unwrap();
                }
                assert!(buf == model[off as usize..off as usize + len], "read {len} at {off}");
            }
            Op::Write { app, block, within, len, tag } => {
                let off = (block * BLOCK + within).min(size - 1);
                let len = len.min(size - off) as usize;
                let data: Vec<u8> = (0..len).map(|i| tag.wrapping_add(i as u8)).collect();
                if let Err(e) = g.write(app, off, &data) {
                    assert!(mode == WriteMode::WriteBack && lost_seen < g.stats().lost_origin_blocks.len(), "{e}");
                    take_losses(&g, &mut model, &mut lost_seen);
                    g.write(app, off, &data).unwrap();
                }
                model[off as usize..off as usize + len].copy_from_slice(&data);
            }
            Op::Inflate(k) => {
                let mut h = host.lock().unwrap();
                let new: Vec<u32> =
                    (0..MAX).filter(|l| !h.valid.contains(l) && !h.fenced.contains(l)).take(k as usize).collect();
                h.valid.extend(&new);
                drop(h);
                if !new.is_empty() {
                    notice(Notice::Inflated { lbns: new });
                }
            }
            Op::Deflate(k) => {
                let mut h = host.lock().unwrap();
                h.asked = k.min(h.valid.len() as u32);
                let blocks = h.asked;
                drop(h);
                notice(Notice::Deflate { blocks, deadline_in_ms: 1000 });
            }
            Op::Force(k) => force(&host, k),
            Op::Shares(w) => g.set_shares(&[(0, 1.0), (1, w)]),
            Op::Service => handled += g.service().unwrap(),
            Op::Flush => {
                if let Err(e) = g.flush() {
                    assert!(mode == WriteMode::WriteBack && lost_seen < g.stats().lost_origin_blocks.len(), "{e}");
                    take_losses(&g, &mut model, &mut lost_seen);
                    g.flush().unwrap();
                }
            }
        }
        let lost = &g.stats().lost_origin_blocks;
        assert!(mode == WriteMode::WriteBack || lost.is_empty(), "write-through lost {lost:?}");
        take_losses(&g, &mut model, &mut lost_seen);
        g.cache().check();
    }
    // Every notice sent is handled (the reader thread may still hold some).
    while handled < host.lock().unwrap().notices {
        handled += g.service_for(Duration::from_secs(5)).unwrap();
    }
    take_losses(&g, &mut model, &mut lost_seen);
    let hv: Vec<u32> = host.lock().unwrap().valid.iter().copied().collect();
    assert_eq!(g.cache().valid_lbns(), hv, "the guest's valid blocks are the host's");
    // After a flush the origin alone holds every write.
    g.flush().unwrap();
    if mode == WriteMode::WriteThrough {
        assert_eq!(g.stats().lost_dirty, 0);
    }
    assert!(*origin.0.lock().unwrap() == model, "the origin after a flush");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn write_through_never_loses_a_write(initial in 0..MAX, ops in prop::collection::vec(op(), 1..60)) {
        run(WriteMode::WriteThrough, initial, ops);
    }

    #[test]
    fn write_back_loses_only_what_it_reports(initial in 0..MAX, ops in prop::collection::vec(op(), 1..60)) {
        run(WriteMode::WriteBack, initial, ops);
    }
}
