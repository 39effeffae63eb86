//! Fuzzes the clipped snapshot decoder structure-aware: the input's
//! bytes become the *bitmaps* of a snapshot whose header, set counts and CRC are valid, so
//! every case reaches the roaring decoder (`roaring_clip.rs`) — run containers claiming
//! 2^32 ids included — instead of failing at the magic or the checksum. A decoded set
//! holds only ids below its vDisk's end and never more than the cap: what a hostile
//! snapshot can make a prewarm hold is bounded.
#![no_main]

use cachevisor_prewarm::roaring_clip;
use cachevisor_prewarm::Snapshot;
use libfuzzer_sys::fuzz_target;

/// Most ids a set may hold here.
const CAP: u64 = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let Some((&e, mut rest)) = data.split_first() else { return };
    let end = 1u64 << (e % 40);
    // Up to four sets, each a length byte (× 16) and that many bitmap bytes.
    let mut bitmaps = Vec::new();
    while let Some((&n, tail)) = rest.split_first() {
        let n = (usize::from(n) * 16).min(tail.len());
        bitmaps.push(&tail[..n]);
        rest = &tail[n..];
        if bitmaps.len() == 4 {
            break;
        }
    }
    let mut s = cachevisor_prewarm::snapshot::MAGIC.to_vec();
    s.extend(2u32.to_le_bytes());
    s.extend(1u64.to_le_bytes());
    s.extend(100u64.to_le_bytes());
    s.extend(4096u32.to_le_bytes());
    s.extend((bitmaps.len() as u32).to_le_bytes());
    for (i, b) in bitmaps.iter().enumerate() {
        // The count the bytes claim (end 0: every container skipped unexpanded), so
        // the set's header agrees and the decode goes all the way.
        let claimed = roaring_clip::decode(&mut &b[..], 0).map_or(0, |c| c.claimed);
        let name = format!("v{i}");
        s.extend((name.len() as u16).to_le_bytes());
        s.extend(name.as_bytes());
        s.extend(claimed.to_le_bytes());
        s.extend((b.len() as u64).to_le_bytes());
        s.extend_from_slice(b);
        s.extend([0u8; 32]);
    }
    let crc = crc32fast::hash(&s);
    s.extend(crc.to_le_bytes());
    if let Ok((snap, _cut)) = Snapshot::read_clipped(std::io::Cursor::new(&s), &|_| Some(end), CAP) {
        for bits in snap.sets.values() {
            assert!(bits.len() <= CAP, "a set past the cap was believed");
            assert!(bits.max().is_none_or(|m| m < end), "an id past the vDisk's end was kept");
        }
    }
});
