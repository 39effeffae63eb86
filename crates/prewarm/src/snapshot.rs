//! A cache-state snapshot (Nutanix prewarming slides, "Cache mechanics: persisting"): one
//! bitmap per object set — a vDisk's cached blocks, or, in the metadata-object mode, the
//! HM1 objects of a vDisk and the HM3 objects — where a set bit means "cached when the
//! snapshot was taken", and its on-disk form.
//!
//! The bitmaps are roaring treemaps (the `roaring` crate; 64-bit ids, so a vDisk of any
//! size fits). The file format, version 2, little-endian:
//!
//! ```text
//! magic "CVPWSNAP" | version u32 | seq u64 | requests u64 | block_size u32 | sets u32
//! per set: name_len u16 | name (UTF-8) | objects u64 | bitmap_len u64 | bitmap (roaring's portable format)
//!          | requests u64 | accesses u64 | hits u64 | span_ns u64      (version 2 only)
//! crc32 (IEEE) of every byte before it, u32
//! ```
//!
//! Version 2 adds each set's [`Activity`] since the source's previous snapshot (all zero:
//! not known), what the online prewarm parameters are decided from (`online.rs`, the
//! slides' "Online Estimation of Parameters"). Version 1 files are still read (no
//! activity).
//!
//! Writing streams each bitmap straight into the writer (nothing is buffered whole, so no
//! allocation grows with the cache). Reading checks the checksum over the whole stream
//! first and only then parses (a corrupt length can make no large allocation), so a
//! truncated or corrupt file is rejected before anything is believed.

use roaring::RoaringTreemap;
use std::collections::BTreeMap;
use std::io::{self, Read, Seek, SeekFrom, Write};

/// First bytes of every snapshot file.
pub const MAGIC: &[u8; 8] = b"CVPWSNAP";
/// The format version this code writes (and the newest it reads).
pub const VERSION: u32 = 2;
/// The oldest format version this code reads.
pub const OLDEST_VERSION: u32 = 1;
/// Longest set name accepted.
const MAX_NAME: usize = 4096;
/// Most sets accepted in one snapshot.
const MAX_SETS: u32 = 1 << 20;

/// Why a snapshot could not be read. The caller adds the file's name.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Not a snapshot at all.
    #[error("not a cachevisor snapshot (bad magic)")]
    BadMagic,
    /// Written by another version of the format.
    #[error("snapshot format version {0}; this build reads versions {OLDEST_VERSION} to {VERSION}")]
    Version(u32),
    /// The stream ends early.
    #[error("truncated: the snapshot ends before its {0}")]
    Truncated(&'static str),
    /// The checksum does not match the content.
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x} (corrupt or partly written)")]
    Checksum {
        /// The trailer's value.
        stored: u32,
        /// What the bytes give.
        computed: u32,
    },
    /// A field holds an impossible value.
    #[error("corrupt at byte {at}: {what}")]
    Corrupt {
        /// Offset of the field in the stream.
        at: u64,
        /// What is wrong.
        what: String,
    },
    /// The underlying reader failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// One snapshot of a cache's state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Sequence number at its source (increasing; orders a history).
    pub seq: u64,
    /// Requests the source cache had served when it was taken.
    pub requests: u64,
    /// Bytes per object of the block sets (the source's cache block size).
    pub block_size: u32,
    /// Object set name → cached objects.
    pub sets: BTreeMap<String, RoaringTreemap>,
    /// Object set name → what its source saw since the previous snapshot (sets with none
    /// known are absent; only sets in `sets` are written).
    pub activity: BTreeMap<String, Activity>,
}

/// What the source saw of one object set (a vDisk) over `span_ns` before a snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Activity {
    /// Requests served.
    pub requests: u64,
    /// Block accesses of those requests.
    pub accesses: u64,
    /// Of the accesses, hits.
    pub hits: u64,
    /// How long, ns (0: nothing known).
    pub span_ns: u64,
}

impl Activity {
    /// The sum of two stretches of activity.
    pub fn plus(self, o: Activity) -> Activity {
        Activity {
            requests: self.requests.saturating_add(o.requests),
            accesses: self.accesses.saturating_add(o.accesses),
            hits: self.hits.saturating_add(o.hits),
            span_ns: self.span_ns.saturating_add(o.span_ns),
        }
    }
}

impl Snapshot {
    /// An empty snapshot.
    pub fn new(seq: u64, requests: u64, block_size: u32) -> Snapshot {
        Snapshot { seq, requests, block_size, sets: BTreeMap::new(), activity: BTreeMap::new() }
    }

    /// Objects cached, over every set.
    pub fn objects(&self) -> u64 {
        self.sets.values().map(|b| b.len()).sum()
    }

    /// Writes the snapshot in the format above; returns the bytes written.
    pub fn write_to(&self, w: impl Write) -> io::Result<u64> {
        let mut w = Crc { inner: w, hasher: crc32fast::Hasher::new(), bytes: 0 };
        w.write_all(MAGIC)?;
        w.write_all(&VERSION.to_le_bytes())?;
        w.write_all(&self.seq.to_le_bytes())?;
        w.write_all(&self.requests.to_le_bytes())?;
        w.write_all(&self.block_size.to_le_bytes())?;
        let sets = u32::try_from(self.sets.len()).ok().filter(|&n| n <= MAX_SETS);
        let sets = sets.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "too many object sets"))?;
        w.write_all(&sets.to_le_bytes())?;
        for (name, bits) in &self.sets {
            if name.len() > MAX_NAME {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("set name longer than {MAX_NAME} bytes"),
                ));
            }
            w.write_all(&(name.len() as u16).to_le_bytes())?;
            w.write_all(name.as_bytes())?;
            w.write_all(&bits.len().to_le_bytes())?;
            w.write_all(&(bits.serialized_size() as u64).to_le_bytes())?;
            bits.serialize_into(&mut w)?;
            let a = self.activity.get(name).copied().unwrap_or_default();
            for v in [a.requests, a.accesses, a.hits, a.span_ns] {
                w.write_all(&v.to_le_bytes())?;
            }
        }
        let crc = w.hasher.clone().finalize();
        w.inner.write_all(&crc.to_le_bytes())?;
        w.inner.flush()?;
        Ok(w.bytes + 4)
    }

    /// Reads a snapshot: the checksum over the whole stream first, then the content.
    pub fn read_from(r: impl Read + Seek) -> Result<Snapshot, SnapshotError> {
        Snapshot::read_clipped(r, &|_| Some(crate::roaring_clip::ALL), u64::MAX).map(|(s, _)| s)
    }

    /// [`Self::read_from`], each set's ids cut at `end(name)` while they are decoded
    /// (`roaring_clip.rs`: run containers are never expanded past it; a set whose `end`
    /// is `None` is kept empty, its bitmap skipped unread), and a set holding more than
    /// `cap` ids below its end refused. Returns the snapshot and how many ids were cut.
    pub fn read_clipped(
        mut r: impl Read + Seek,
        end: &dyn Fn(&str) -> Option<u64>,
        cap: u64,
    ) -> Result<(Snapshot, u64), SnapshotError> {
        let len = r.seek(SeekFrom::End(0))?;
        if len < 4 {
            return Err(SnapshotError::Truncated("header"));
        }
        r.seek(SeekFrom::Start(0))?;
        let mut body = Crc { inner: (&mut r).take(len - 4), hasher: crc32fast::Hasher::new(), bytes: 0 };
        let mut magic = [0u8; 8];
        if body.read_exact(&mut magic).is_err() || &magic != MAGIC {
            return Err(SnapshotError::BadMagic);
        }
        io::copy(&mut body, &mut io::sink())?;
        let computed = body.hasher.finalize();
        let mut trailer = [0u8; 4];
        r.read_exact(&mut trailer)?;
        let stored = u32::from_le_bytes(trailer);
        if stored != computed {
            return Err(SnapshotError::Checksum { stored, computed });
        }
        r.seek(SeekFrom::Start(8))?;
        let mut p = Parser { r: (&mut r).take(len - 4 - 8), at: 8 };
        let version = p.u32("version")?;
        if !(OLDEST_VERSION..=VERSION).contains(&version) {
            return Err(SnapshotError::Version(version));
        }
        let mut s = Snapshot::new(p.u64("sequence number")?, p.u64("request count")?, p.u32("block size")?);
        let sets = p.u32("set count")?;
        let mut clipped = 0u64;
        if sets > MAX_SETS {
            return Err(p.corrupt(format!("{sets} object sets (at most {MAX_SETS})")));
        }
        for _ in 0..sets {
            let name_len = p.u16("set name length")? as usize;
            if name_len > MAX_NAME {
                return Err(p.corrupt(format!("set name of {name_len} bytes")));
            }
            let mut name = vec![0u8; name_len];
            p.bytes(&mut name, "set name")?;
            let name = String::from_utf8(name).map_err(|_| p.corrupt("set name is not UTF-8".into()))?;
            let objects = p.u64("object count")?;
            let bitmap_len = p.u64("bitmap length")?;
            let at = p.at;
            let mut limited = (&mut p.r).take(bitmap_len);
            let bits = match end(&name) {
                None => {
                    io::copy(&mut limited, &mut io::sink())?;
                    RoaringTreemap::new()
                }
                Some(end) => {
                    let c = crate::roaring_clip::decode(&mut limited, end)
                        .map_err(|e| SnapshotError::Corrupt { at, what: format!("bitmap of set `{name}`: {e}") })?;
                    if c.claimed != objects {
                        return Err(SnapshotError::Corrupt {
                            at,
                            what: format!("set `{name}` holds {} objects, its header says {objects}", c.claimed),
                        });
                    }
                    if c.bits.len() > cap {
                        return Err(SnapshotError::Corrupt {
                            at,
                            what: format!(
                                "set `{name}` holds {} blocks, more than a prewarm reads ({cap}): not a cache's snapshot",
                                c.bits.len()
                            ),
                        });
                    }
                    clipped += objects - c.bits.len();
                    c.bits
                }
            };
            if limited.limit() != 0 {
                return Err(SnapshotError::Corrupt {
                    at,
                    what: format!("bitmap of set `{name}` is shorter than its length"),
                });
            }
            p.at += bitmap_len;
            if version >= 2 {
                let a = Activity {
                    requests: p.u64("activity")?,
                    accesses: p.u64("activity")?,
                    hits: p.u64("activity")?,
                    span_ns: p.u64("activity")?,
                };
                if a.hits > a.accesses {
                    return Err(p.corrupt(format!("set `{name}` has {} hits of {} accesses", a.hits, a.accesses)));
                }
                if a.span_ns > 0 {
                    s.activity.insert(name.clone(), a);
                }
            }
            if s.sets.insert(name.clone(), bits).is_some() {
                return Err(p.corrupt(format!("set `{name}` appears twice")));
            }
        }
        if p.r.limit() != 0 {
            return Err(p.corrupt(format!("{} bytes after the last set", p.r.limit())));
        }
        Ok((s, clipped))
    }
}

/// A writer or reader that checksums what passes through it.
struct Crc<T> {
    inner: T,
    hasher: crc32fast::Hasher,
    bytes: u64,
}

impl<W: Write> Write for Crc<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<R: Read> Read for Crc<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

/// Little-endian fields with the offset they were read at.
struct Parser<R> {
    r: io::Take<R>,
    at: u64,
}

impl<R: Read> Parser<R> {
    fn bytes(&mut self, buf: &mut [u8], what: &'static str) -> Result<(), SnapshotError> {
        self.r.read_exact(buf).map_err(|_| SnapshotError::Truncated(what))?;
        self.at += buf.len() as u64;
        Ok(())
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, SnapshotError> {
        let mut b = [0u8; 2];
        self.bytes(&mut b, what)?;
        Ok(u16::from_le_bytes(b))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, SnapshotError> {
        let mut b = [0u8; 4];
        self.bytes(&mut b, what)?;
        Ok(u32::from_le_bytes(b))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, SnapshotError> {
        let mut b = [0u8; 8];
        self.bytes(&mut b, what)?;
        Ok(u64::from_le_bytes(b))
    }
    fn corrupt(&self, what: String) -> SnapshotError {
        SnapshotError::Corrupt { at: self.at, what }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn sample() -> Snapshot {
        let mut s = Snapshot::new(7, 100_000, 4096);
        s.sets.insert("vm-a".into(), (0..1000u64).chain([1 << 40, u64::MAX]).collect());
        s.sets.insert("vm-b".into(), [3u64, 5, 8].into_iter().collect());
        s.sets.insert("empty".into(), RoaringTreemap::new());
        s.activity.insert("vm-a".into(), Activity { requests: 500, accesses: 800, hits: 600, span_ns: 60_000_000_000 });
        s
    }

    fn bytes(s: &Snapshot) -> Vec<u8> {
        let mut v = Vec::new();
        let n = s.write_to(&mut v).unwrap();
        assert_eq!(n, v.len() as u64);
        v
    }

    #[test]
    fn a_set_is_cut_at_its_end_and_refused_past_the_cap() {
        let mut s = Snapshot::new(1, 10, 4096);
        s.sets.insert("a".into(), (0..100u64).collect());
        s.sets.insert("b".into(), (0..10u64).collect());
        let mut bytes = Vec::new();
        s.write_to(&mut bytes).unwrap();
        let read = |end: Option<u64>, cap: u64| {
            Snapshot::read_clipped(std::io::Cursor::new(&bytes), &|n| if n == "a" { end } else { None }, cap)
        };
        // At the cap: kept; one past it: refused by name.
        let (got, cut) = read(Some(100), 100).unwrap();
        assert_eq!((got.sets["a"].len(), got.sets["b"].len(), cut), (100, 0, 0), "b names no vDisk: unread");
        let e = read(Some(100), 99).unwrap_err().to_string();
        assert!(e.contains("set `a`") && e.contains("more than a prewarm reads (99)"), "{e}");
        // Cut at the end: 0 keeps nothing, 50 half, past u64's blocks all.
        for (end, kept) in [(0, 0), (50, 50), (u64::MAX - 1, 100)] {
            let (got, cut) = read(Some(end), 100).unwrap();
            assert_eq!((got.sets["a"].len(), cut), (kept, 100 - kept), "end {end}");
        }
    }

    #[test]
    fn a_snapshot_reads_back_as_written() {
        let s = sample();
        assert_eq!(Snapshot::read_from(Cursor::new(bytes(&s))).unwrap(), s);
        assert_eq!(s.objects(), 1005);
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_rejected() {
        let v = bytes(&sample());
        for cut in 0..v.len() {
            let e = Snapshot::read_from(Cursor::new(&v[..cut])).unwrap_err();
            assert!(
                matches!(e, SnapshotError::Truncated(_) | SnapshotError::BadMagic | SnapshotError::Checksum { .. }),
                "cut at {cut}: {e}"
            );
        }
        for at in 0..v.len() {
            let mut w = v.clone();
            w[at] ^= 0x20;
            assert!(Snapshot::read_from(Cursor::new(&w)).is_err(), "flip at {at} accepted");
        }
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let v = bytes(&sample());
        let mut other = v.clone();
        other[0] = b'X';
        assert_eq!(
            Snapshot::read_from(Cursor::new(&other)).unwrap_err().to_string(),
            "not a cachevisor snapshot (bad magic)"
        );
        let mut flipped = v.clone();
        flipped[20] ^= 1;
        assert!(Snapshot::read_from(Cursor::new(&flipped)).unwrap_err().to_string().starts_with("checksum mismatch"));
        // A version this build does not know, with a valid checksum: named as such.
        let mut newer = v[..v.len() - 4].to_vec();
        newer[8..12].copy_from_slice(&3u32.to_le_bytes());
        let crc = crc32fast::hash(&newer);
        newer.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(
            Snapshot::read_from(Cursor::new(&newer)).unwrap_err().to_string(),
            "snapshot format version 3; this build reads versions 1 to 2"
        );
        // A header that claims more objects than its bitmap holds, checksummed.
        let mut lying = Vec::new();
        let mut one = Snapshot::new(1, 0, 4096);
        one.sets.insert("x".into(), [1u64].into_iter().collect());
        one.write_to(&mut lying).unwrap();
        lying.truncate(lying.len() - 4);
        let at = 8 + 4 + 8 + 8 + 4 + 4 + 2 + 1; // the object count
        lying[at..at + 8].copy_from_slice(&5u64.to_le_bytes());
        let crc = crc32fast::hash(&lying);
        lying.extend_from_slice(&crc.to_le_bytes());
        let e = Snapshot::read_from(Cursor::new(&lying)).unwrap_err().to_string();
        assert!(e.contains("set `x` holds 1 objects, its header says 5"), "{e}");
        // More hits than accesses, checksummed: refused, naming the set.
        let mut hits = Vec::new();
        one.activity.insert("x".into(), Activity { requests: 1, accesses: 2, hits: 3, span_ns: 1 });
        one.write_to(&mut hits).unwrap();
        assert!(Snapshot::read_from(Cursor::new(&hits))
            .unwrap_err()
            .to_string()
            .contains("set `x` has 3 hits of 2 accesses"));
    }

    /// Version 1, as the previous build wrote it: read with no activity.
    #[test]
    fn a_version_1_snapshot_reads_with_no_activity() {
        let mut s = sample();
        let mut v1 = Vec::new();
        v1.extend_from_slice(MAGIC);
        v1.extend_from_slice(&1u32.to_le_bytes());
        v1.extend_from_slice(&s.seq.to_le_bytes());
        v1.extend_from_slice(&s.requests.to_le_bytes());
        v1.extend_from_slice(&s.block_size.to_le_bytes());
        v1.extend_from_slice(&(s.sets.len() as u32).to_le_bytes());
        for (name, bits) in &s.sets {
            v1.extend_from_slice(&(name.len() as u16).to_le_bytes());
            v1.extend_from_slice(name.as_bytes());
            v1.extend_from_slice(&bits.len().to_le_bytes());
            v1.extend_from_slice(&(bits.serialized_size() as u64).to_le_bytes());
            bits.serialize_into(&mut v1).unwrap();
        }
        let crc = crc32fast::hash(&v1);
        v1.extend_from_slice(&crc.to_le_bytes());
        s.activity.clear();
        assert_eq!(Snapshot::read_from(Cursor::new(&v1)).unwrap(), s);
    }
}
