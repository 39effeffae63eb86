//! The block manager's behaviours one at a time, as SymFlex describes them: registration
//! with ⟨M, C, P⟩ and a persistent restart (§2.4.1, §5.3), §2.4.2's split request, the
//! resize messages of Fig. 4 with a cooperating guest, one that misses its deadline, and
//! bad messages; a target the region cannot meet.

use cachevisor_vssd::io::IoError;
use cachevisor_vssd::manager::Event;
use cachevisor_vssd::{BlockManager, Config, Geometry, OpKind, State};

const MIB: u64 = 1 << 20;

fn manager(blocks: u32) -> BlockManager {
    let geometry = Geometry::new(MIB, blocks).unwrap();
    BlockManager::new(Config { geometry, deflate_grace: 5_000 }, State::new(geometry))
}

/// Runs every op (showing each to `seen`), journals every record (into `journal`) and
/// commits, until nothing is left; returns the events.
fn pump_with(
    m: &mut BlockManager,
    journal: &mut Vec<cachevisor_vssd::Record>,
    mut seen: impl FnMut(&OpKind),
) -> Vec<Event> {
    loop {
        let mut busy = false;
        while let Some(op) = m.poll_op() {
            busy = true;
            seen(&op.kind);
            m.op_done(op.id, Ok(()));
        }
        let mut last = None;
        while let Some((seq, r)) = m.poll_record() {
            journal.push(r);
            last = Some(seq);
        }
        if let Some(seq) = last {
            busy = true;
            m.committed(seq);
        }
        if !busy {
            break;
        }
    }
    std::iter::from_fn(|| m.poll_event()).collect()
}

fn pump(m: &mut BlockManager, journal: &mut Vec<cachevisor_vssd::Record>) -> Vec<Event> {
    pump_with(m, journal, |_| {})
}

#[test]
fn a_request_across_three_blocks_is_three_extents_and_an_invalid_block_fails_it_whole() {
    let mut m = manager(8);
    let mut j = Vec::new();
    // Another vSSD takes every other block first, so the three are not contiguous.
    let other = m.register("other", 8, 3, false, 0).unwrap();
    let id = m.register("vm", 4, 3, false, 0).unwrap();
    pump(&mut m, &mut j);
    assert_eq!(m.valid_lbns(other), [0, 1, 2]);
    assert_eq!(m.valid_lbns(id), [0, 1, 2]);
    let io = m.start_io(id, 256 << 10, 2 * MIB, 1).unwrap();
    let lens: Vec<u64> = io.extents.iter().map(|e| e.len).collect();
    let bufs: Vec<u64> = io.extents.iter().map(|e| e.buf_offset).collect();
    // Blocks 3, 4, 5 are physically contiguous: one extent; §2.4.2's three pieces when
    // they are not are tested by the geometry's split. Either way the pieces cover the
    // request in order.
    assert_eq!(lens.iter().sum::<u64>(), 2 * MIB);
    assert_eq!(bufs[0], 0);
    m.end_io(io);
    // Logical block 3 was never inflated: the request touching it fails whole.
    assert_eq!(m.start_io(id, 3 * MIB - 4096, 8192, 1).unwrap_err(), IoError::Invalid(3));
    assert!(matches!(m.start_io(id, 4 * MIB, 4096, 1).unwrap_err(), IoError::OutOfRange { .. }));
    assert!(matches!(m.start_io(id, u64::MAX - 10, 4096, 1).unwrap_err(), IoError::OutOfRange { .. }));
}

#[test]
fn physically_scattered_blocks_give_one_extent_each() {
    let mut m = manager(8);
    let mut j = Vec::new();
    let a = m.register("a", 8, 1, false, 0).unwrap();
    let b = m.register("b", 8, 1, false, 0).unwrap();
    pump(&mut m, &mut j);
    m.set_target(a, 2, 0).unwrap();
    m.set_target(b, 2, 0).unwrap();
    m.set_target(a, 3, 0).unwrap();
    pump(&mut m, &mut j);
    // a holds blocks 0, 2, 4: 2 MiB at 256 KiB is 768 KiB, 1 MiB, 256 KiB (§2.4.2).
    let io = m.start_io(a, 256 << 10, 2 * MIB, 0).unwrap();
    let pieces: Vec<(u64, u64, u64)> = io.extents.iter().map(|e| (e.region_offset, e.len, e.buf_offset)).collect();
    assert_eq!(pieces, [((256 << 10), 768 << 10, 0), (2 * MIB, MIB, 768 << 10), (4 * MIB, 256 << 10, 1792 << 10)]);
}

#[test]
fn inflate_zeroes_records_then_announces_and_deflate_asks_the_guest() {
    let mut m = manager(16);
    let mut j = Vec::new();
    let id = m.register("vm", 8, 2, false, 0).unwrap();
    // Zero before record: the first output is two zero ops and no Assign yet.
    let ops: Vec<_> = std::iter::from_fn(|| m.poll_op()).collect();
    assert!(ops.iter().all(|o| matches!(o.kind, OpKind::Zero { .. })) && ops.len() == 2);
    let (_, r) = m.poll_record().unwrap();
    assert!(matches!(r, cachevisor_vssd::Record::Register { .. }));
    assert!(m.poll_record().is_none(), "an Assign before its block was zeroed");
    for o in ops {
        m.op_done(o.id, Ok(()));
    }
    assert!(m.valid_lbns(id).is_empty(), "valid before its record was committed");
    let ev = pump(&mut m, &mut j);
    assert!(ev.contains(&Event::Inflated { id, lbns: vec![0, 1] }), "{ev:?}");
    m.set_target(id, 5, 10).unwrap();
    let ev = pump(&mut m, &mut j);
    assert!(ev.contains(&Event::Inflated { id, lbns: vec![2, 3, 4] }), "{ev:?}");
    // Deflate by 3: the guest is asked, gives back two now and one later.
    m.set_target(id, 2, 100).unwrap();
    let ev = pump(&mut m, &mut j);
    assert_eq!(ev, [Event::DeflateRequested { id, blocks: 3, deadline: 5_100 }]);
    m.release(id, &[4, 0]).unwrap();
    assert_eq!(m.resize_status(id).unwrap().asked, 1);
    m.release(id, &[3]).unwrap();
    let ev = pump(&mut m, &mut j);
    assert!(ev.contains(&Event::Released { id, lbns: vec![0, 4], forced: false }), "{ev:?}");
    assert_eq!(m.valid_lbns(id), [1, 2]);
    assert_eq!(m.poll_timeout(), None);
    assert_eq!(m.free_blocks(), 14);
    assert_eq!(m.counters().released, 3);
}

#[test]
fn a_guest_that_misses_its_deadline_loses_its_least_recently_used_blocks() {
    let mut m = manager(8);
    let mut j = Vec::new();
    let id = m.register("vm", 8, 4, false, 0).unwrap();
    pump(&mut m, &mut j);
    for (lbn, t) in [(0u64, 40), (1, 10), (2, 30), (3, 20)] {
        let io = m.start_io(id, lbn * MIB, 4096, t).unwrap();
        m.end_io(io);
    }
    m.set_target(id, 2, 100).unwrap();
    assert_eq!(m.poll_timeout(), Some(5_100));
    m.handle_timeout(5_100);
    let ev = pump(&mut m, &mut j);
    assert!(ev.contains(&Event::Released { id, lbns: vec![1, 3], forced: true }), "{ev:?}");
    assert_eq!(m.valid_lbns(id), [0, 2]);
    assert_eq!((m.counters().forced, m.counters().deadlines_missed), (2, 1));
    // A late answer names blocks that are gone: refused.
    let e = m.release(id, &[1]).unwrap_err();
    assert!(e.reason.contains("1 blocks given back, 0 asked for"), "{e}");
    // Growing again before the guest's hello: the taken blocks stay invalid (a guest
    // that has not heard of the take must get EIO there, not zeros as its data).
    m.set_target(id, 4, 6_000).unwrap();
    let ev = pump(&mut m, &mut j);
    assert!(ev.contains(&Event::Inflated { id, lbns: vec![4, 5] }), "{ev:?}");
    assert!(m.start_io(id, MIB, 4096, 6_000).is_err(), "a fenced block serves nothing");
    m.hello(id);
    pump(&mut m, &mut j);
    m.set_target(id, 6, 7_000).unwrap();
    let ev = pump(&mut m, &mut j);
    assert!(ev.contains(&Event::Inflated { id, lbns: vec![1, 3] }), "{ev:?}");
}

#[test]
fn bad_release_messages_are_refused_whole_with_the_reason() {
    let mut m = manager(8);
    let mut j = Vec::new();
    let a = m.register("a", 4, 3, false, 0).unwrap();
    let b = m.register("b", 4, 2, false, 0).unwrap();
    pump(&mut m, &mut j);
    m.set_target(a, 1, 0).unwrap();
    pump(&mut m, &mut j);
    let before = (m.state().clone(), m.valid_lbns(a), m.resize_status(a));
    for (lbns, why) in [
        (vec![9], "past the device's 4 blocks"),
        (vec![3], "logical block 3 is not a valid block"),
        (vec![1, 1], "given twice"),
        (vec![0, 1, 2], "3 blocks given back, 2 asked for"),
        (vec![0, 3], "logical block 3 is not a valid block"),
    ] {
        let e = m.release(a, &lbns).unwrap_err();
        assert!(e.to_string().contains(why), "{lbns:?}: {e}");
        assert_eq!((m.state().clone(), m.valid_lbns(a), m.resize_status(a)), before);
    }
    // b was asked for nothing: its blocks are its own to keep.
    assert!(m.release(b, &[0]).unwrap_err().reason.contains("0 asked for"));
    assert!(m.release(77, &[0]).is_err());
    // A double release across messages: the second names a block already gone.
    m.release(a, &[2]).unwrap();
    assert!(m.release(a, &[2]).unwrap_err().reason.contains("not a valid block"));
}

#[test]
fn a_persistent_vssd_gets_its_blocks_back_after_its_vm_restarts_and_a_crash() {
    let mut m = manager(6);
    let mut j = Vec::new();
    let id = m.register("db", 4, 3, true, 0).unwrap();
    let tmp = m.register("tmp", 4, 2, false, 0).unwrap();
    pump(&mut m, &mut j);
    let mapping = m.state().vssd(id).unwrap().map.clone();
    m.stop(id, 10).unwrap();
    m.stop(tmp, 10).unwrap();
    let ev = pump(&mut m, &mut j);
    assert!(ev.contains(&Event::Removed { id: tmp }));
    assert_eq!(m.free_blocks(), 3);
    // The daemon crashes; the journal is what it has.
    let g = m.config().geometry;
    let mut m = BlockManager::new(m.config(), State::replay(g, &j).unwrap());
    assert!(m.state().id_of("tmp").is_none());
    assert!(m.register("db", 4, 0, false, 20).unwrap_err().to_string().contains("M = 4 blocks and P = true"));
    assert_eq!(m.register("db", 4, 1, true, 20).unwrap(), id);
    let ev = pump(&mut m, &mut j);
    assert!(ev.contains(&Event::Inflated { id, lbns: vec![0, 1, 2] }), "{ev:?}");
    assert_eq!(m.state().vssd(id).unwrap().map, mapping, "the same ⟨lbn, pbn⟩ mapping");
    assert!(m.register("db", 4, 1, true, 20).unwrap_err().to_string().contains("active already"));
}

#[test]
fn space_an_inactive_persistent_vssd_holds_is_swapped_out_when_needed_and_back_in_later() {
    let mut m = manager(4);
    let mut j = Vec::new();
    let db = m.register("db", 4, 3, true, 0).unwrap();
    pump(&mut m, &mut j);
    m.stop(db, 1).unwrap();
    let web = m.register("web", 4, 3, false, 2).unwrap();
    // One block is free; two come from db, copied out first.
    let mut swapped_out = 0;
    pump_with(&mut m, &mut j, |k| swapped_out += u32::from(matches!(k, OpKind::SwapOut { id, .. } if *id == db)));
    assert_eq!(swapped_out, 2);
    assert_eq!(m.valid_lbns(web).len(), 3);
    assert_eq!(m.state().vssd(db).unwrap().swapped.len(), 2);
    // web stops; db restarts: its swapped-out blocks are copied back in.
    m.stop(web, 3).unwrap();
    pump(&mut m, &mut j);
    m.register("db", 4, 0, true, 4).unwrap();
    let mut swapped_in = 0;
    pump_with(&mut m, &mut j, |k| swapped_in += u32::from(matches!(k, OpKind::SwapIn { .. })));
    assert_eq!(swapped_in, 2);
    assert_eq!(m.valid_lbns(db), [0, 1, 2]);
    assert_eq!(m.counters().swapped_in, 2);
}

#[test]
fn a_target_the_region_cannot_meet_waits_without_a_timer() {
    let mut m = manager(4);
    let mut j = Vec::new();
    let a = m.register("a", 8, 3, false, 0).unwrap();
    let b = m.register("b", 8, 0, false, 0).unwrap();
    pump(&mut m, &mut j);
    m.set_target(b, 5, 1).unwrap();
    pump(&mut m, &mut j);
    assert_eq!(m.resize_status(b).unwrap().valid, 1);
    assert_eq!(m.poll_timeout(), None, "nothing to wake up for");
    assert!(m.poll_op().is_none());
    // a gives two back: b gets them.
    m.set_target(a, 1, 2).unwrap();
    m.release(a, &[0, 1]).unwrap();
    pump(&mut m, &mut j);
    assert_eq!(m.resize_status(b).unwrap().valid, 3);
    assert!(m.set_target(a, 9, 3).unwrap_err().contains("more than its maximum 8"));
}

/// A region the budget shrinks below what a stopped persistent vSSD holds: free blocks
/// count first, then the stopped vSSD's blocks are swapped out — only as many as the cap
/// needs — and yielded once free; its data comes back when it restarts.
#[test]
fn a_lowered_cap_swaps_out_a_stopped_persistent_vssd_only_as_far_as_needed() {
    let geometry = Geometry::new(MIB, 8).unwrap();
    let mut m = BlockManager::new(Config { geometry, deflate_grace: 5_000 }, State::shared(geometry));
    let mut j = Vec::new();
    for pbn in 0..6 {
        m.grant(pbn).unwrap();
    }
    pump(&mut m, &mut j);
    let db = m.register("db", 8, 4, true, 0).unwrap();
    pump(&mut m, &mut j);
    m.stop(db, 1).unwrap();
    pump(&mut m, &mut j);
    assert_eq!((m.region_blocks(), m.free_blocks()), (6, 2));
    // Down to 5: a free block will do, nothing swapped.
    assert_eq!(m.shed_inactive(5), 0);
    // Down to 1: two free blocks and three of db's.
    assert_eq!(m.shed_inactive(1), 3);
    let mut swapped = 0;
    pump_with(&mut m, &mut j, |k| swapped += u32::from(matches!(k, OpKind::SwapOut { id, .. } if *id == db)));
    assert_eq!(swapped, 3);
    assert_eq!(m.shed_inactive(1), 0, "the swap-outs done left 5 free blocks: enough");
    assert_eq!(m.yield_free(5), 5);
    pump(&mut m, &mut j);
    assert_eq!(m.region_blocks(), 1);
    assert_eq!(m.state().vssd(db).unwrap().swapped.len(), 3);
    // db restarts: its three swapped-out blocks need blocks of the cache's to come back
    // into (the budget's shortfall), and once granted it has all four.
    m.register("db", 8, 0, true, 2).unwrap();
    pump(&mut m, &mut j);
    assert_eq!(m.shortfall(), 3);
    for pbn in m.outside_blocks().into_iter().take(3) {
        m.grant(pbn).unwrap();
    }
    pump(&mut m, &mut j);
    assert_eq!(m.shortfall(), 0);
    assert_eq!(m.valid_lbns(db), [0, 1, 2, 3]);
}

/// `end_io` says when it left the driver work: only the last I/O on a released block
/// (its `Free` to write), not an ordinary request's end — so a driver need not wake per
/// request.
#[test]
fn only_the_last_io_on_a_released_block_leaves_the_driver_work() {
    let mut m = manager(4);
    let mut j = Vec::new();
    let id = m.register("vm", 4, 2, false, 0).unwrap();
    pump(&mut m, &mut j);
    let plain = m.start_io(id, 0, 4096, 1).unwrap();
    assert!(!m.end_io(plain), "an ordinary end leaves nothing to do");
    let (a, b) = (m.start_io(id, MIB, 4096, 2).unwrap(), m.start_io(id, MIB, 4096, 3).unwrap());
    m.set_target(id, 1, 4).unwrap();
    pump(&mut m, &mut j);
    m.release(id, &[1]).unwrap();
    pump(&mut m, &mut j);
    assert!(m.poll_record().is_none());
    assert!(!m.end_io(a), "one more I/O still on the block");
    assert!(m.end_io(b), "the last one: the block's Free is to be written");
    assert!(matches!(m.poll_record(), Some((_, cachevisor_vssd::Record::Free { .. }))));
}
