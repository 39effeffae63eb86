//! A guest cache saved at a clean stop starts warm on a vSSD that kept its blocks, and
//! trusts no block whose bytes changed meanwhile (a vSSD without P gives zeroed blocks).

mod common;

use cachevisor_guest::{GuestCache, WriteMode};
use common::*;
use std::sync::{Arc, Mutex};

#[test]
fn a_saved_map_starts_the_next_guest_warm_and_a_changed_block_is_not_trusted() {
    let (host, control) = host(8);
    let size = ORIGIN_BLOCKS * BLOCK;
    let origin = Mem(Arc::new(Mutex::new((0..size).map(|i| (i % 253) as u8).collect())));
    let mut g = GuestCache::start(Vssd(host.clone()), origin.clone(), size, control, WriteMode::WriteBack).unwrap();
    let mut buf = vec![0u8; 100];
    for b in 0..6u64 {
        g.read(0, b * BLOCK + 7, &mut buf).unwrap();
    }
    g.write(0, 2 * BLOCK, &[0xee; 64]).unwrap(); // dirty: written back by the save
    let dir = tempfile::tempdir().unwrap();
    let map = dir.path().join("cache.map");
    assert_eq!(g.save_map(&map).unwrap(), 6);
    assert_eq!(origin.0.lock().unwrap()[2 * BLOCK as usize], 0xee);
    drop(g);
    // The host changes one kept block's bytes (as a vSSD without P would: zeros).
    let lbn_of_3 = {
        let text = std::fs::read_to_string(&map).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["entries"].as_array().unwrap().iter().find(|e| e[1] == 3).unwrap()[0].as_u64().unwrap() as u32
    };
    host.lock().unwrap().bytes.insert(lbn_of_3, vec![0; BLOCK as usize]);
    let mut g =
        GuestCache::start(Vssd(host.clone()), origin.clone(), size, reconnect(&host), WriteMode::WriteBack).unwrap();
    assert_eq!(g.restore_map(&map).unwrap(), 5, "every block but the changed one");
    assert!(!map.exists(), "a map is used once");
    for b in 0..6u64 {
        g.read(0, b * BLOCK + 7, &mut buf).unwrap();
        let want: Vec<u8> = origin.0.lock().unwrap()[(b * BLOCK + 7) as usize..(b * BLOCK + 107) as usize].to_vec();
        assert_eq!(buf, want, "block {b}");
    }
    let s = &g.stats().apps[&0];
    assert_eq!((s.hits, s.misses), (5, 1), "warm: only the changed block missed");
    assert_eq!(g.restore_map(&map).unwrap(), 0, "no map: cold");
    g.cache().check();
}
