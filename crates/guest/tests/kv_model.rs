//! The slab key-value store (SymFlex §4.2) against a model map, with the host's inflates,
//! deflates and forced takes interleaved (the same fake host as `model.rs`): a get
//! returns the value last set under its key or nothing — never another key's bytes, an
//! older value, or zeros from a block the host took — and, with no resize or eviction in
//! between, a value just set is found. At the end the store holds exactly the host's
//! valid blocks, and a deflate gave back free slabs before any holding items.

mod common;

use cachevisor_guest::slab_kv::SlabKv;
use cachevisor_vssd::protocol::{HostLine, Notice};
use common::*;
use proptest::prelude::*;
use std::collections::HashMap;
use std::time::Duration;

#[derive(Debug, Clone)]
enum Op {
    Set { key: u8, len: usize, tag: u8 },
    Get(u8),
    Delete(u8),
    Inflate(u32),
    Deflate(u32),
    Force(u32),
    Service,
}

fn op() -> impl Strategy<Value = Op> {
    // Values from a few bytes to a whole 4 KiB slab (with the header, one too large).
    let len = prop_oneof![3 => 1..600usize, 1 => 600..4100usize];
    prop_oneof![
        6 => (0..24u8, len, any::<u8>()).prop_map(|(key, len, tag)| Op::Set { key, len, tag }),
        6 => (0..24u8).prop_map(Op::Get),
        1 => (0..24u8).prop_map(Op::Delete),
        1 => (1..6u32).prop_map(Op::Inflate),
        1 => (1..6u32).prop_map(Op::Deflate),
        1 => (1..3u32).prop_map(Op::Force),
        2 => Just(Op::Service),
    ]
}

fn value(len: usize, tag: u8) -> Vec<u8> {
    (0..len).map(|i| tag.wrapping_add(i as u8)).collect()
}

fn run(initial: u32, ops: Vec<Op>) {
    let (host, control) = host(initial);
    let mut kv = SlabKv::start(Vssd(host.clone()), control).unwrap();
    let notice = |n: Notice| host.lock().unwrap().send(&HostLine::Notice(n));
    let mut model: HashMap<u8, Vec<u8>> = HashMap::new();
    let mut handled = 0;
    for op in ops {
        match op {
            Op::Set { key, len, tag } => {
                let v = value(len, tag);
                let dropped = kv.stats().dropped;
                let stored = kv.set(&[key], &v).unwrap();
                model.insert(key, v.clone());
                if stored {
                    // Found at once unless the set itself evicted this key's slab.
                    let found = kv.get(&[key]).unwrap();
                    assert!(found.as_ref() == Some(&v) || kv.stats().dropped > dropped, "set {key} then get");
                } else {
                    assert_eq!(kv.get(&[key]).unwrap(), None, "a set not stored leaves no older value");
                }
            }
            Op::Get(key) => {
                if let Some(v) = kv.get(&[key]).unwrap() {
                    assert_eq!(Some(&v), model.get(&key), "get {key}: not the value last set");
                }
            }
            Op::Delete(key) => {
                kv.delete(&[key]);
                model.remove(&key);
            }
            Op::Inflate(k) => {
                let mut h = host.lock().unwrap();
                let new: Vec<u32> =
                    (0..MAX).filter(|l| !h.valid.contains(l) && !h.fenced.contains(l)).take(k as usize).collect();
                h.valid.extend(&new);
                for l in &new {
                    h.bytes.insert(*l, vec![0; BLOCK as usize]);
                }
                drop(h);
                if !new.is_empty() {
                    notice(Notice::Inflated { lbns: new });
                }
            }
            Op::Deflate(k) => {
                // Earlier notices first (a forced take drops items by itself).
                while handled < host.lock().unwrap().notices {
                    handled += kv.service_wait(Duration::from_secs(5)).unwrap();
                }
                let mut h = host.lock().unwrap();
                h.asked = k.min(h.valid.len() as u32);
                let blocks = h.asked;
                drop(h);
                // Free slabs go first: items are dropped only when there are too few.
                let (free_before, items_before) = (kv.table().valid() - slabs_in_use(&kv), kv.table().items());
                notice(Notice::Deflate { blocks, deadline_in_ms: 1000 });
                handled += kv.service_for_test();
                if blocks as usize <= free_before && host.lock().unwrap().asked == 0 {
                    assert_eq!(kv.table().items(), items_before, "a deflate dropped items while free slabs were left");
                }
            }
            Op::Force(k) => force(&host, k),
            Op::Service => handled += kv.service().unwrap(),
        }
    }
    while handled < host.lock().unwrap().notices {
        handled += kv.service_wait(Duration::from_secs(5)).unwrap();
    }
    let hv: Vec<u32> = host.lock().unwrap().valid.iter().copied().collect();
    assert_eq!(kv.table().valid_lbns(), hv, "the store's valid blocks are the host's");
    for (k, v) in &model {
        if let Some(got) = kv.get(&[*k]).unwrap() {
            assert_eq!(&got, v, "key {k} at the end");
        }
    }
}

/// Slabs holding items or being filled.
fn slabs_in_use(kv: &SlabKv<Vssd>) -> usize {
    kv.table().valid() - kv.table().free_slabs()
}

trait Wait {
    fn service_wait(&mut self, d: Duration) -> std::io::Result<usize>;
    fn service_for_test(&mut self) -> usize;
}

impl Wait for SlabKv<Vssd> {
    fn service_wait(&mut self, d: Duration) -> std::io::Result<usize> {
        cachevisor_guest::balloon::service_for(self, d)
    }
    /// Waits for the deflate notice just sent and answers it.
    fn service_for_test(&mut self) -> usize {
        self.service_wait(Duration::from_secs(5)).unwrap()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn a_get_returns_the_last_value_set_or_nothing(initial in 0..MAX, ops in prop::collection::vec(op(), 1..80)) {
        run(initial, ops);
    }
}
