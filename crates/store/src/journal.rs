//! The on-disk metadata format: records (vDisk names, slot states, frees, partition
//! targets) each framed as `[len u32][type u8][payload][crc32 u32]`, in two files behind
//! a header (the superblock: magic, version, geometry, generation):
//! - `checkpoint`: the whole state at one moment, written to a temporary file, fsynced
//!   and renamed over the old one;
//! - `journal`: records appended since the checkpoint of the same generation.
//!
//! Reading stops at the first record that is truncated or fails its checksum (a torn
//! tail after a crash); everything before it is intact. Zeros to the end are a clean end:
//! a journal is written ahead with zeros (`datapath/src/persist.rs`), so that appending a
//! record and syncing it changes no file size — on ext4 a size change makes every
//! `fdatasync` commit the file system's journal, which stalled every synced write on the
//! disk (measured with fio beside 4 `O_DSYNC` writers: 555 µs a write with an appending
//! journal, 301 µs with one written ahead). Integers are little-endian.

use std::io::{self, Read, Write};

/// Format version written (2 added backing bindings, 3 seal records with checksums;
/// older files are read too).
pub const VERSION: u32 = 3;
/// Magic of a checkpoint file.
pub const CHECKPOINT_MAGIC: [u8; 8] = *b"CVCKPT01";
/// Magic of a journal file.
pub const JOURNAL_MAGIC: [u8; 8] = *b"CVJRNL01";
/// Header bytes.
pub const HEADER_LEN: usize = 8 + 4 + 8 + 8 + 8 + 4;

/// Geometry and generation a metadata file belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Cache block size.
    pub block_size: u64,
    /// Slots in the cache store.
    pub slots: u64,
    /// Checkpoint generation (a journal continues the checkpoint of its generation).
    pub generation: u64,
}

impl Header {
    /// Encodes with `magic`.
    pub fn encode(&self, magic: [u8; 8]) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&magic);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..20].copy_from_slice(&self.block_size.to_le_bytes());
        b[20..28].copy_from_slice(&self.slots.to_le_bytes());
        b[28..36].copy_from_slice(&self.generation.to_le_bytes());
        let crc = crc32fast::hash(&b[..36]);
        b[36..40].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes, checking magic, version and checksum; the error says which failed.
    pub fn decode(b: &[u8; HEADER_LEN], magic: [u8; 8]) -> Result<Header, String> {
        if b[0..8] != magic {
            return Err(format!(
                "bad magic {:?} (expected {:?})",
                String::from_utf8_lossy(&b[0..8]),
                String::from_utf8_lossy(&magic)
            ));
        }
        if crc32fast::hash(&b[..36]) != u32::from_le_bytes(b[36..40].try_into().expect("4")) {
            return Err("header checksum mismatch".into());
        }
        let version = u32::from_le_bytes(b[8..12].try_into().expect("4"));
        if !(1..=VERSION).contains(&version) {
            return Err(format!("format version {version}, this build reads 1 to {VERSION}"));
        }
        let h = Header {
            block_size: u64::from_le_bytes(b[12..20].try_into().expect("8")),
            slots: u64::from_le_bytes(b[20..28].try_into().expect("8")),
            generation: u64::from_le_bytes(b[28..36].try_into().expect("8")),
        };
        // A geometry no cache has (slot ids are 32-bit; blocks a power of two, 512 B to
        // 1 GiB with a vSSD region's): the header is not one cachevisor wrote.
        if !h.block_size.is_power_of_two() || !(512..=1 << 30).contains(&h.block_size) {
            return Err(format!("block size {} is not a power of two from 512 B to 1 GiB", h.block_size));
        }
        if h.slots > u64::from(u32::MAX) {
            return Err(format!("{} slots: more than a cache has (slot ids are 32-bit)", h.slots));
        }
        Ok(h)
    }
}

/// One metadata record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// VM id `vm` is the vDisk named `name`.
    Vdisk {
        /// VM id.
        vm: u16,
        /// Export name.
        name: String,
    },
    /// Slot `slot` holds `vm`'s `block` with these sector bitmaps (bit i = sector i).
    Slot {
        /// Slot.
        slot: u32,
        /// VM id.
        vm: u16,
        /// Block number.
        block: u64,
        /// Valid sectors.
        valid: Vec<u64>,
        /// Dirty sectors.
        dirty: Vec<u64>,
        /// A seal (`engine/src/seals.rs`, type 7): the CRC32C of each dirty sector, in
        /// order, which a read of them is checked against (`block_sums.rs`).
        sums: Option<Vec<u32>>,
    },
    /// Slot `slot` is the mirror of `vm`'s `block` on another cache device (type 9,
    /// `engine/src/dirty_mirror.rs`): the second copy of these dirty sectors.
    Mirror {
        /// Slot.
        slot: u32,
        /// VM id.
        vm: u16,
        /// Block number.
        block: u64,
        /// The sectors it holds.
        sectors: Vec<u64>,
    },
    /// Slot `slot` holds nothing.
    Free {
        /// Slot.
        slot: u32,
    },
    /// VM id `vm`'s cached blocks belong to the backing store `identity`.
    Binding {
        /// VM id.
        vm: u16,
        /// The backing store.
        identity: crate::backing_identity::Identity,
    },
    /// The label the cache store must carry (`cache_label.rs`): first in every
    /// checkpoint written since labels exist.
    CacheLabel(crate::cache_label::Expected),
    /// The cache's devices in store order (`[cache] path` first, then each
    /// `[[cache.device]]`): each one's serial and slots, in every checkpoint of a cache over
    /// several devices (none: one device of the header's slots). Slot ids run over them
    /// in this order; a start whose devices differ finds each by the serial its label
    /// carries and moves its slots to where it is now (`cachevisor-server`'s
    /// `device_relayout.rs`). Written as type 10; type 8 (slots only, serial = index) is
    /// read as written before serials.
    CacheDevices(Vec<DeviceRow>),
    /// `vm`'s partition target in blocks.
    Target {
        /// VM id.
        vm: u16,
        /// Blocks.
        blocks: u64,
    },
}

/// A cache device as the metadata records it ([`Record::CacheDevices`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceRow {
    /// The number folded into the identity its label carries
    /// (`cache_label::Label::device_id`): given once, when the device joins the cache, and
    /// kept wherever it moves in the list (0: the first device).
    pub serial: u16,
    /// Its slots.
    pub slots: u64,
}

impl DeviceRow {
    /// A serial for a device joining a cache whose devices carry `used`: one past the
    /// highest, or (past u16's end, from metadata that says so) the lowest free one
    /// above 0; `None` when every serial is taken.
    pub fn next_serial(used: &[u16]) -> Option<u16> {
        let top = used.iter().copied().max().unwrap_or(0);
        top.checked_add(1).or_else(|| (1..=u16::MAX).find(|s| !used.contains(s)))
    }

    /// Rows of `slots` each, serials their indices (a cache whose devices never moved).
    pub fn in_order(slots: &[u64]) -> Vec<DeviceRow> {
        slots.iter().enumerate().map(|(i, &slots)| DeviceRow { serial: i as u16, slots }).collect()
    }
}

impl Record {
    /// Appends the framed record to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        frame(out, |out| self.encode_body(out));
    }

    fn encode_body(&self, out: &mut Vec<u8>) {
        match self {
            Record::Vdisk { vm, name } => {
                out.push(1);
                out.extend_from_slice(&vm.to_le_bytes());
                out.extend_from_slice(name.as_bytes());
            }
            Record::Slot { slot, vm, block, valid, dirty, sums } => {
                out.push(if sums.is_some() { 7 } else { 2 });
                out.extend_from_slice(&slot.to_le_bytes());
                out.extend_from_slice(&vm.to_le_bytes());
                out.extend_from_slice(&block.to_le_bytes());
                out.extend_from_slice(&(valid.len() as u16).to_le_bytes());
                for w in valid.iter().chain(dirty) {
                    out.extend_from_slice(&w.to_le_bytes());
                }
                for c in sums.iter().flatten() {
                    out.extend_from_slice(&c.to_le_bytes());
                }
            }
            Record::Mirror { slot, vm, block, sectors } => {
                out.push(9);
                out.extend_from_slice(&slot.to_le_bytes());
                out.extend_from_slice(&vm.to_le_bytes());
                out.extend_from_slice(&block.to_le_bytes());
                out.extend_from_slice(&(sectors.len() as u16).to_le_bytes());
                for w in sectors {
                    out.extend_from_slice(&w.to_le_bytes());
                }
            }
            Record::Free { slot } => {
                out.push(3);
                out.extend_from_slice(&slot.to_le_bytes());
            }
            Record::Binding { vm, identity } => {
                out.push(5);
                out.extend_from_slice(&vm.to_le_bytes());
                identity.encode(out);
            }
            Record::CacheLabel(e) => {
                out.push(6);
                out.extend_from_slice(&e.id);
                out.extend_from_slice(&e.generation.to_le_bytes());
                out.extend_from_slice(&e.previous.to_le_bytes());
            }
            Record::CacheDevices(rows) => {
                out.push(10);
                for r in rows {
                    out.extend_from_slice(&r.serial.to_le_bytes());
                    out.extend_from_slice(&r.slots.to_le_bytes());
                }
            }
            Record::Target { vm, blocks } => {
                out.push(4);
                out.extend_from_slice(&vm.to_le_bytes());
                out.extend_from_slice(&blocks.to_le_bytes());
            }
        }
    }

    fn decode(body: &[u8]) -> Option<Record> {
        let (&t, p) = body.split_first()?;
        let u16_at = |i: usize| p.get(i..i + 2).map(|b| u16::from_le_bytes(b.try_into().expect("2")));
        let u32_at = |i: usize| p.get(i..i + 4).map(|b| u32::from_le_bytes(b.try_into().expect("4")));
        let u64_at = |i: usize| p.get(i..i + 8).map(|b| u64::from_le_bytes(b.try_into().expect("8")));
        Some(match t {
            1 => Record::Vdisk { vm: u16_at(0)?, name: String::from_utf8(p.get(2..)?.to_vec()).ok()? },
            2 | 7 => {
                let words = u16_at(14)? as usize;
                let w = |i: usize| u64_at(16 + 8 * i);
                let dirty: Vec<u64> = (words..2 * words).map(w).collect::<Option<_>>()?;
                // A seal: one checksum per dirty sector.
                let n = if t == 7 { dirty.iter().map(|d| d.count_ones() as usize).sum() } else { 0 };
                let end = 16 + 16 * words;
                if p.len() != end + 4 * n {
                    return None;
                }
                Record::Slot {
                    slot: u32_at(0)?,
                    vm: u16_at(4)?,
                    block: u64_at(6)?,
                    valid: (0..words).map(w).collect::<Option<_>>()?,
                    dirty,
                    sums: (t == 7).then(|| (0..n).map(|i| u32_at(end + 4 * i)).collect::<Option<_>>()).flatten(),
                }
            }
            9 => {
                let words = u16_at(14)? as usize;
                if p.len() != 16 + 8 * words {
                    return None;
                }
                Record::Mirror {
                    slot: u32_at(0)?,
                    vm: u16_at(4)?,
                    block: u64_at(6)?,
                    sectors: (0..words).map(|i| u64_at(16 + 8 * i)).collect::<Option<_>>()?,
                }
            }
            3 if p.len() == 4 => Record::Free { slot: u32_at(0)? },
            4 if p.len() == 10 => Record::Target { vm: u16_at(0)?, blocks: u64_at(2)? },
            6 if p.len() == 32 => Record::CacheLabel(crate::cache_label::Expected {
                id: p[0..16].try_into().expect("16"),
                generation: u64_at(16)?,
                previous: u64_at(24)?,
            }),
            8 if !p.is_empty() && p.len().is_multiple_of(8) => Record::CacheDevices(DeviceRow::in_order(
                &(0..p.len() / 8).map(|i| u64_at(8 * i)).collect::<Option<Vec<_>>>()?,
            )),
            10 if !p.is_empty() && p.len().is_multiple_of(10) => Record::CacheDevices(
                (0..p.len() / 10)
                    .map(|i| Some(DeviceRow { serial: u16_at(10 * i)?, slots: u64_at(10 * i + 2)? }))
                    .collect::<Option<_>>()?,
            ),
            5 => Record::Binding { vm: u16_at(0)?, identity: crate::backing_identity::Identity::decode(p.get(2..)?)? },
            _ => return None,
        })
    }
}

/// Appends one frame to `out`: `[len u32][body][crc32 u32]`, the body what `body` writes
/// (the format of every metadata file: the cache's, and the vSSD region's).
pub fn frame(out: &mut Vec<u8>, body: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0u8; 4]);
    body(out);
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    let crc = crc32fast::hash(&out[start + 4..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// The bodies of the frames in `all`, up to the end (or zeros to the end: space written
/// ahead) or the first torn or corrupt frame, and whether the input ended cleanly.
pub fn read_frames(all: &[u8]) -> (Vec<&[u8]>, bool) {
    let (frames, clean, _) = scan_frames(all);
    (frames, clean)
}

/// [`read_frames`], with the bytes the whole frames take.
fn scan_frames(all: &[u8]) -> (Vec<&[u8]>, bool, usize) {
    let mut out = Vec::new();
    let mut at = 0;
    while at < all.len() {
        let Some(len) = all.get(at..at + 4).map(|b| u32::from_le_bytes(b.try_into().expect("4")) as usize) else {
            return (out, all[at..].iter().all(|&b| b == 0), at);
        };
        if len == 0 {
            // No frame is empty (a record has its type byte): the records end here —
            // cleanly when only zeros follow (space written ahead), else torn.
            return (out, all[at..].iter().all(|&b| b == 0), at);
        }
        let Some(body) = all.get(at + 4..at + 4 + len) else { return (out, false, at) };
        let Some(crc) = all.get(at + 4 + len..at + 8 + len).map(|b| u32::from_le_bytes(b.try_into().expect("4")))
        else {
            return (out, false, at);
        };
        if crc32fast::hash(body) != crc {
            return (out, false, at);
        }
        out.push(body);
        at += 8 + len;
    }
    (out, true, at)
}

/// Reads records until the end or the first torn or corrupt one; returns them and
/// whether the input ended cleanly.
pub fn read_records(r: &mut impl Read) -> io::Result<(Vec<Record>, bool)> {
    read_records_to(r).map(|(records, clean, _)| (records, clean))
}

/// [`read_records`], with the bytes the records read take (where the next one goes).
pub fn read_records_to(r: &mut impl Read) -> io::Result<(Vec<Record>, bool, u64)> {
    let mut all = Vec::new();
    r.read_to_end(&mut all)?;
    let (frames, mut clean, mut end) = scan_frames(&all);
    let mut out = Vec::with_capacity(frames.len());
    let mut used = 0;
    for body in frames {
        match Record::decode(body) {
            Some(rec) => {
                out.push(rec);
                used += body.len() + 8;
            }
            None => {
                clean = false;
                end = used;
                break;
            }
        }
    }
    Ok((out, clean, end as u64))
}

/// Writes `header` and what `records` writes as a complete file at `path` (see
/// [`replace_file`]).
pub fn write_file_atomically(
    path: &std::path::Path,
    magic: [u8; 8],
    header: &Header,
    records: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    replace_file(path, &mut |w| {
        w.write_all(&header.encode(magic))?;
        records(w)
    })
}

/// Replaces `path` with what `contents` writes, all or nothing: a temporary file, fsynced,
/// renamed over `path`, directory fsynced.
pub fn replace_file(
    path: &std::path::Path,
    contents: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = io::BufWriter::new(cachevisor_files::private_files::create_temp(&tmp)?);
        contents(&mut f)?;
        f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record() -> impl Strategy<Value = Record> {
        prop_oneof![
            (any::<u16>(), "[a-z0-9]{0,12}").prop_map(|(vm, name)| Record::Vdisk { vm, name }),
            (
                any::<u32>(),
                any::<u16>(),
                any::<u64>(),
                prop::collection::vec(any::<u64>(), 1..4),
                any::<u32>(),
                any::<bool>()
            )
                .prop_map(|(slot, vm, block, v, crc, sealed)| {
                    let dirty: Vec<u64> = v.iter().map(|x| x & 0xff).collect();
                    // A seal: one checksum per dirty sector.
                    let n: u32 = dirty.iter().map(|d| d.count_ones()).sum();
                    let sums = sealed.then(|| (0..n).map(|i| crc.wrapping_add(i)).collect());
                    Record::Slot { slot, vm, block, dirty, valid: v, sums }
                }),
            any::<u32>().prop_map(|slot| Record::Free { slot }),
            (any::<u32>(), any::<u16>(), any::<u64>(), prop::collection::vec(any::<u64>(), 1..4))
                .prop_map(|(slot, vm, block, sectors)| Record::Mirror { slot, vm, block, sectors }),
            (any::<u16>(), any::<u64>()).prop_map(|(vm, blocks)| Record::Target { vm, blocks }),
            prop::collection::vec((any::<u16>(), any::<u64>()), 1..9).prop_map(|v| Record::CacheDevices(
                v.into_iter().map(|(serial, slots)| DeviceRow { serial, slots }).collect()
            )),
            (any::<[u8; 16]>(), any::<u64>(), any::<u64>()).prop_map(|(id, generation, previous)| {
                Record::CacheLabel(crate::cache_label::Expected { id, generation, previous })
            }),
            (any::<u16>(), any::<u64>(), any::<u64>(), "[a-z0-9:/.]{0,20}").prop_map(|(vm, a, b, uri)| {
                Record::Binding {
                    vm,
                    identity: match a % 3 {
                        0 => crate::backing_identity::Identity::File { dev: a, ino: b, size: a ^ b },
                        1 => crate::backing_identity::Identity::BlockDevice { rdev: b, size: a },
                        _ => crate::backing_identity::Identity::Nbd { uri, size: b },
                    },
                }
            }),
        ]
    }

    proptest! {
        #[test]
        fn records_round_trip_and_a_torn_tail_keeps_the_prefix(recs in prop::collection::vec(record(), 0..20), cut in any::<prop::sample::Index>(), flip in any::<prop::sample::Index>()) {
            let mut buf = Vec::new();
            let mut ends = vec![0];
            for r in &recs {
                r.encode(&mut buf);
                ends.push(buf.len());
            }
            let (got, clean) = read_records(&mut &buf[..]).unwrap();
            prop_assert!(clean);
            prop_assert_eq!(&got, &recs);
            // Written ahead with zeros: the same records, a clean end where they end.
            let mut ahead = buf.clone();
            ahead.resize(buf.len() + 1 + cut.index(9000), 0);
            let (got, clean, end) = read_records_to(&mut &ahead[..]).unwrap();
            prop_assert!(clean);
            prop_assert_eq!(&got, &recs);
            prop_assert_eq!(end, buf.len() as u64);
            if !buf.is_empty() {
                // Truncation anywhere: exactly the records that end before the cut survive,
                // and the next goes where the last whole one ends — so too when the cut
                // part is zeros (a record torn in space written ahead).
                let c = cut.index(buf.len());
                let (got, _) = read_records(&mut &buf[..c]).unwrap();
                let whole = ends.iter().filter(|&&e| e <= c).count() - 1;
                prop_assert_eq!(&got[..], &recs[..whole]);
                let mut torn = buf[..c].to_vec();
                torn.resize(buf.len() + 64, 0);
                let (got, _, end) = read_records_to(&mut &torn[..]).unwrap();
                // Unless the bytes cut off were zeros: then the record is whole again.
                let restored = whole < recs.len() && buf[c..ends[whole + 1]].iter().all(|&b| b == 0);
                let kept = whole + usize::from(restored);
                prop_assert_eq!(&got[..], &recs[..kept]);
                prop_assert_eq!(end, ends[kept] as u64);
                // A flipped byte: everything before the damaged record survives, nothing after.
                let mut bad = buf.clone();
                let i = flip.index(bad.len());
                bad[i] ^= 0x5a;
                let (got, _) = read_records(&mut &bad[..]).unwrap();
                let damaged = ends.iter().position(|&e| e > i).unwrap() - 1;
                prop_assert_eq!(&got[..damaged.min(got.len())], &recs[..damaged.min(got.len())]);
                prop_assert!(got.len() <= damaged || got[..damaged] == recs[..damaged]);
            }
        }
    }

    #[test]
    fn a_new_serial_is_past_the_highest_and_never_overflows() {
        assert_eq!(DeviceRow::next_serial(&[]), Some(1));
        assert_eq!(DeviceRow::next_serial(&[0, 3, 1]), Some(4));
        assert_eq!(DeviceRow::next_serial(&[0, u16::MAX - 1]), Some(u16::MAX));
        assert_eq!(DeviceRow::next_serial(&[0, 1, u16::MAX]), Some(2), "past the end: the lowest free");
        let all: Vec<u16> = (0..=u16::MAX).collect();
        assert_eq!(DeviceRow::next_serial(&all), None);
    }

    #[test]
    fn a_device_list_written_before_serials_reads_with_serials_in_order() {
        let mut buf = Vec::new();
        frame(&mut buf, |out| {
            out.push(8);
            for n in [2048u64, 1024] {
                out.extend_from_slice(&n.to_le_bytes());
            }
        });
        let (recs, clean) = read_records(&mut &buf[..]).unwrap();
        assert!(clean);
        assert_eq!(recs, vec![Record::CacheDevices(DeviceRow::in_order(&[2048, 1024]))]);
        let rows = vec![DeviceRow { serial: 0, slots: 9 }, DeviceRow { serial: 7, slots: 3 }];
        let mut b = Vec::new();
        Record::CacheDevices(rows.clone()).encode(&mut b);
        assert_eq!(read_records(&mut &b[..]).unwrap().0, vec![Record::CacheDevices(rows)]);
    }

    #[test]
    fn headers_check_magic_version_and_checksum() {
        let h = Header { block_size: 4096, slots: 100, generation: 7 };
        let b = h.encode(JOURNAL_MAGIC);
        assert_eq!(Header::decode(&b, JOURNAL_MAGIC), Ok(h));
        assert!(Header::decode(&b, CHECKPOINT_MAGIC).unwrap_err().contains("magic"));
        let mut c = b;
        c[21] ^= 1;
        assert!(Header::decode(&c, JOURNAL_MAGIC).unwrap_err().contains("checksum"));
        // Geometries no cache has: refused (`check` called them consistent).
        for (block_size, slots) in [(512, 0), (1 << 30, u64::from(u32::MAX))] {
            let b = Header { block_size, slots, generation: 1 }.encode(JOURNAL_MAGIC);
            Header::decode(&b, JOURNAL_MAGIC).unwrap_or_else(|e| panic!("{block_size} {slots}: {e}"));
        }
        for (block_size, slots, why) in [
            (4097, 100, "power of two"),
            (256, 100, "512 B"),
            (2 << 30, 100, "1 GiB"),
            (4096, u64::from(u32::MAX) + 1, "32-bit"),
            (4096, 1 << 62, "32-bit"),
        ] {
            let b = Header { block_size, slots, generation: 1 }.encode(JOURNAL_MAGIC);
            assert!(Header::decode(&b, JOURNAL_MAGIC).unwrap_err().contains(why), "{block_size} {slots}");
        }
    }
}
