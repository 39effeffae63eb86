//! The bytes of a replica log ("durability beyond ELICA"): what a node writes
//! into the region a peer keeps for it, so that a write-back block is on two nodes before
//! it is acknowledged, and what a surviving node reads back after the owner died.
//!
//! Layout of a log of `size` bytes for blocks of `block` bytes: two superblock copies in
//! sectors 0 and 1 (the newer valid one counts: a torn superblock write leaves the other),
//! then from byte 4096 a ring of `slots` records of [`HEADER`] + `block` bytes each. The
//! record with sequence number `seq` lives in slot `seq % slots`; a record is valid when
//! its header checksum, its slot and — for data — its data checksum hold, and live when
//! also `seq >= tail` (the superblock's: every record below it is void, its data on the
//! backing store).
//!
//! A record is **data** (a client write's bytes, at a disk byte offset of a vDisk) or a
//! **tombstone** (a client write went to the backing store itself: no older record may be
//! replayed over those sectors). Hand-written: a fixed little-endian layout with CRC-32
//! checksums is the whole format; a serialisation library would add framing we would
//! then have to pin down byte for byte anyway.

use thiserror::Error;

/// Bytes of a record header (one sector).
pub const HEADER: u64 = 512;
/// Where the ring starts.
pub const RING_START: u64 = 4096;
/// Sector size: records cover whole sectors.
pub const SECTOR: u64 = 512;
/// The longest vDisk name a record carries.
pub const MAX_NAME: usize = 400;

const RECORD_MAGIC: &[u8; 4] = b"CVRR";
const SUPER_MAGIC: &[u8; 8] = b"CVRLOG01";

/// What a record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The bytes of a write, cached dirty at the owner.
    Data,
    /// A write that went to the backing store: older records of these sectors are void.
    Tombstone,
}

/// A record's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The log this record belongs to (a new one at every resynchronisation: records of
    /// another are void).
    pub log_id: u64,
    /// Sequence number (its slot is `seq % slots`).
    pub seq: u64,
    /// Data or tombstone.
    pub kind: Kind,
    /// The vDisk.
    pub vdisk: String,
    /// Disk byte offset (a multiple of [`SECTOR`]).
    pub offset: u64,
    /// Bytes covered (a multiple of [`SECTOR`]; a data record's at most the block size).
    pub len: u32,
    /// CRC-32C of the data (data records).
    pub data_crc: u32,
}

/// Why bytes are not a valid record or superblock.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FormatError {
    /// Not a record (an empty or never-written slot).
    #[error("no record magic")]
    NoMagic,
    /// The header's checksum does not match (a torn write).
    #[error("header checksum mismatch")]
    HeaderChecksum,
    /// A field out of range.
    #[error("{0}")]
    Invalid(&'static str),
}

/// A data record's shape before it is written: refused when the log could not read it
/// back.
pub fn check(vdisk: &str, offset: u64, len: u32, block: u64) -> Result<(), &'static str> {
    if vdisk.is_empty() || vdisk.len() > MAX_NAME {
        return Err("a replicated vDisk's name must be 1 to 400 bytes");
    }
    if !offset.is_multiple_of(SECTOR) || !u64::from(len).is_multiple_of(SECTOR) || len == 0 || u64::from(len) > block {
        return Err("a replica record covers whole sectors, at most one block");
    }
    offset.checked_add(u64::from(len)).map(drop).ok_or("a replica record's range passes 2^64")
}

/// The whole sectors a tombstone covers for a write of `len` bytes at `offset` (any
/// alignment: a write around the cache may be byte-granular): rounded outward, so no
/// older record is replayed over any byte it wrote.
pub fn tombstone_range(offset: u64, len: u32) -> (u64, u32) {
    let lo = offset / SECTOR * SECTOR;
    let hi = (offset + u64::from(len)).div_ceil(SECTOR) * SECTOR;
    (lo, (hi - lo) as u32)
}

impl Record {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER as usize] {
        let mut h = [0u8; HEADER as usize];
        h[0..4].copy_from_slice(RECORD_MAGIC);
        h[4] = match self.kind {
            Kind::Data => 1,
            Kind::Tombstone => 2,
        };
        h[6..8].copy_from_slice(&(self.vdisk.len() as u16).to_le_bytes());
        h[8..16].copy_from_slice(&self.seq.to_le_bytes());
        h[16..24].copy_from_slice(&self.offset.to_le_bytes());
        h[24..28].copy_from_slice(&self.len.to_le_bytes());
        h[28..32].copy_from_slice(&self.data_crc.to_le_bytes());
        h[32..40].copy_from_slice(&self.log_id.to_le_bytes());
        h[48..48 + self.vdisk.len()].copy_from_slice(self.vdisk.as_bytes());
        let crc = crc(&h[..508]);
        h[508..512].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// A header read back.
    pub fn decode(h: &[u8]) -> Result<Record, FormatError> {
        if h.len() < HEADER as usize || &h[0..4] != RECORD_MAGIC {
            return Err(FormatError::NoMagic);
        }
        if crc(&h[..508]) != u32::from_le_bytes(h[508..512].try_into().expect("4 bytes")) {
            return Err(FormatError::HeaderChecksum);
        }
        let kind = match h[4] {
            1 => Kind::Data,
            2 => Kind::Tombstone,
            _ => return Err(FormatError::Invalid("unknown record kind")),
        };
        let n = u16::from_le_bytes([h[6], h[7]]) as usize;
        if n == 0 || n > MAX_NAME {
            return Err(FormatError::Invalid("vDisk name length out of range"));
        }
        let vdisk = std::str::from_utf8(&h[48..48 + n]).map_err(|_| FormatError::Invalid("vDisk name not UTF-8"))?;
        let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
        Ok(Record {
            log_id: u64_at(32),
            seq: u64_at(8),
            kind,
            vdisk: vdisk.to_string(),
            offset: u64_at(16),
            len: u32_at(24),
            data_crc: u32_at(28),
        })
    }
}

/// CRC-32 (IEEE, `crc32fast`: hardware-accelerated where the CPU has it).
pub fn crc(b: &[u8]) -> u32 {
    crc32fast::hash(b)
}

/// The ring's geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes of data a record holds (the owner's block size).
    pub block: u64,
    /// Records in the ring.
    pub slots: u64,
}

impl Geometry {
    /// The ring a log of `size` bytes holds for blocks of `block` bytes; `None` when it
    /// holds fewer than 16 records.
    pub fn new(size: u64, block: u64) -> Option<Geometry> {
        let slots = size.checked_sub(RING_START)? / (HEADER + block);
        (block >= SECTOR && block.is_multiple_of(SECTOR) && slots >= 16).then_some(Geometry { block, slots })
    }

    /// Bytes of one record in the ring.
    pub fn record_bytes(&self) -> u64 {
        HEADER + self.block
    }

    /// The byte offset of the record `seq`.
    pub fn offset_of(&self, seq: u64) -> u64 {
        RING_START + (seq % self.slots) * self.record_bytes()
    }
}

/// The superblock: the live log's id, and its records below `tail` are void.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    /// Written with every trim, one higher each time: the newer of the two copies counts.
    pub generation: u64,
    /// The live log (records of another are void).
    pub log_id: u64,
    /// The first live sequence number.
    pub tail: u64,
    /// The geometry's block size, so a reader needs nothing but the log.
    pub block: u64,
}

impl Superblock {
    /// The sector of copy `generation % 2`, and its bytes.
    pub fn encode(&self) -> (u64, [u8; SECTOR as usize]) {
        let mut s = [0u8; SECTOR as usize];
        s[0..8].copy_from_slice(SUPER_MAGIC);
        s[8..16].copy_from_slice(&self.generation.to_le_bytes());
        s[16..24].copy_from_slice(&self.tail.to_le_bytes());
        s[24..32].copy_from_slice(&self.block.to_le_bytes());
        s[32..40].copy_from_slice(&self.log_id.to_le_bytes());
        let c = crc(&s[..508]);
        s[508..512].copy_from_slice(&c.to_le_bytes());
        ((self.generation % 2) * SECTOR, s)
    }

    /// The valid newer copy of the log's first 1,024 bytes; `None` for a log never
    /// written (every record then is void unless a superblock says otherwise: tail 0).
    pub fn decode(first: &[u8]) -> Option<Superblock> {
        let one = |s: &[u8]| -> Option<Superblock> {
            if s.len() < SECTOR as usize || &s[0..8] != SUPER_MAGIC {
                return None;
            }
            if crc(&s[..508]) != u32::from_le_bytes(s[508..512].try_into().ok()?) {
                return None;
            }
            let at = |i: usize| u64::from_le_bytes(s[i..i + 8].try_into().expect("8 bytes"));
            Some(Superblock { generation: at(8), tail: at(16), block: at(24), log_id: at(32) })
        };
        let a = first.get(..SECTOR as usize).and_then(one);
        let b = first.get(SECTOR as usize..2 * SECTOR as usize).and_then(one);
        match (a, b) {
            (Some(x), Some(y)) => Some(if x.generation >= y.generation { x } else { y }),
            (x, y) => x.or(y),
        }
    }
}

/// A record in the ring, checked: the header and where it was found; `data` its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The header.
    pub record: Record,
    /// Its data (empty for a tombstone).
    pub data: Vec<u8>,
}

/// Every valid record of the log `sb` names in a ring's bytes (`ring` from
/// [`RING_START`] on) at or above its tail; a slot whose record is torn, void or
/// misplaced is skipped (never acknowledged: the owner acknowledges a write only once its
/// record is written whole).
pub fn scan(geometry: Geometry, sb: &Superblock, ring: &[u8]) -> Vec<Found> {
    scan_part(geometry, sb, 0, ring, |_| true)
}

/// [`scan`] over part of a ring: `part` holds whole records from slot `first_slot` on;
/// only records `keep` accepts (one vDisk's, for a replay that reads a large log piece by
/// piece) are returned.
pub fn scan_part(
    geometry: Geometry,
    sb: &Superblock,
    first_slot: u64,
    part: &[u8],
    keep: impl Fn(&Record) -> bool,
) -> Vec<Found> {
    let rb = geometry.record_bytes() as usize;
    let mut found = Vec::new();
    for (i, chunk) in part.chunks_exact(rb).enumerate() {
        let slot = first_slot + i as u64;
        if slot >= geometry.slots {
            break;
        }
        let Ok(record) = Record::decode(&chunk[..HEADER as usize]) else { continue };
        if record.log_id != sb.log_id
            || record.seq < sb.tail
            || record.seq % geometry.slots != slot
            || (record.kind == Kind::Data && u64::from(record.len) > geometry.block)
            || !record.offset.is_multiple_of(SECTOR)
            || !u64::from(record.len).is_multiple_of(SECTOR)
            || record.offset.checked_add(u64::from(record.len)).is_none()
            || !keep(&record)
        {
            continue;
        }
        let data = match record.kind {
            Kind::Tombstone => Vec::new(),
            Kind::Data => {
                let d = &chunk[HEADER as usize..HEADER as usize + record.len as usize];
                if crc(d) != record.data_crc {
                    continue;
                }
                d.to_vec()
            }
        };
        found.push(Found { record, data });
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: u64, kind: Kind) -> Record {
        Record { log_id: 5, seq, kind, vdisk: "vm-0".into(), offset: 8192, len: 4096, data_crc: crc(&[7u8; 4096]) }
    }

    #[test]
    fn a_header_round_trips_and_a_flipped_bit_is_caught() {
        let r = rec(42, Kind::Data);
        let h = r.encode();
        assert_eq!(Record::decode(&h), Ok(r));
        for i in [0usize, 5, 9, 40, 509] {
            let mut bad = h;
            bad[i] ^= 1;
            assert!(Record::decode(&bad).is_err(), "byte {i}");
        }
        assert_eq!(Record::decode(&[0u8; 512]), Err(FormatError::NoMagic));
    }

    #[test]
    fn the_newer_valid_superblock_counts() {
        let a = Superblock { generation: 4, log_id: 9, tail: 100, block: 4096 };
        let b = Superblock { generation: 5, log_id: 9, tail: 180, block: 4096 };
        let mut first = [0u8; 1024];
        for s in [a, b] {
            let (at, bytes) = s.encode();
            first[at as usize..at as usize + 512].copy_from_slice(&bytes);
        }
        assert_eq!(Superblock::decode(&first), Some(b));
        first[600] ^= 1; // generation 5's copy (sector 1) torn
        assert_eq!(Superblock::decode(&first), Some(a));
        assert_eq!(Superblock::decode(&[0u8; 1024]), None);
    }

    #[test]
    fn a_scan_keeps_whole_live_records_in_their_slots() {
        let g = Geometry::new(RING_START + 16 * (512 + 4096), 4096).unwrap();
        let mut ring = vec![0u8; (16 * g.record_bytes()) as usize];
        let mut put = |r: &Record, data: &[u8]| {
            let at = (g.offset_of(r.seq) - RING_START) as usize;
            ring[at..at + 512].copy_from_slice(&r.encode());
            ring[at + 512..at + 512 + data.len()].copy_from_slice(data);
        };
        put(&rec(17, Kind::Data), &[7u8; 4096]); // slot 1
        put(&rec(18, Kind::Data), &[8u8; 4096]); // torn: data checksum
        put(&rec(3, Kind::Tombstone), &[]); // below the tail
        let mut misplaced = rec(20, Kind::Tombstone);
        misplaced.seq = 21;
        let at = (g.offset_of(20) - RING_START) as usize;
        ring[at..at + 512].copy_from_slice(&misplaced.encode());
        let mut other = rec(22, Kind::Tombstone);
        other.log_id = 6; // another log's
        let at = (g.offset_of(22) - RING_START) as usize;
        ring[at..at + 512].copy_from_slice(&other.encode());
        let sb = Superblock { generation: 1, log_id: 5, tail: 10, block: 4096 };
        let found = scan(g, &sb, &ring);
        assert_eq!(found.len(), 1);
        // Piece by piece (3 records each), and one vDisk's only, the same.
        let rb = g.record_bytes() as usize;
        let mut pieces = Vec::new();
        for (i, p) in ring.chunks(3 * rb).enumerate() {
            pieces.extend(scan_part(g, &sb, 3 * i as u64, p, |r| r.vdisk == "vm-0"));
        }
        assert_eq!(pieces, found);
        assert!(scan_part(g, &sb, 0, &ring, |r| r.vdisk == "vm-1").is_empty());
        assert_eq!(found[0].record.seq, 17);
        assert_eq!(found[0].data, vec![7u8; 4096]);
    }

    #[test]
    fn a_tombstone_covers_every_sector_an_unaligned_write_touched() {
        assert_eq!(tombstone_range(100_000, 1000), (99_840, 1536));
        assert_eq!(tombstone_range(512, 512), (512, 512));
        assert_eq!(tombstone_range(100, 4096), (0, 4608));
    }

    #[test]
    fn shapes_a_log_cannot_hold_are_refused() {
        assert!(check("v", 0, 4096, 4096).is_ok());
        assert!(check("v", 100, 4096, 4096).is_err());
        assert!(check("v", 0, 8192, 4096).is_err());
        assert!(check("", 0, 512, 4096).is_err());
        assert!(check(&"x".repeat(401), 0, 512, 4096).is_err());
        assert!(Geometry::new(4096 + 15 * 4608, 4096).is_none());
    }
}
