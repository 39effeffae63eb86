//! One virtio-blk request as the device sees it (virtio 1.2 §5.2.6): the driver's
//! descriptor chain is a run of bytes the device may read (a 16-byte header, then a
//! write's data) followed by bytes it may write (a read's data, then one status byte), in
//! any layout (VERSION_1 implies ANY_LAYOUT: a header may share a descriptor with data,
//! data may be split anywhere). Pure: guest addresses and lengths in, a checked request
//! out; `blk_backend.rs` moves the bytes. Written by hand: the rust-vmm crates give the
//! descriptors, not the virtio-blk request on them.

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};

/// virtio-blk's sector: offsets in requests count 512-byte units whatever the block size.
pub const SECTOR: u64 = 512;
/// The request header: type, reserved (ioprio), sector.
pub const HEADER_LEN: u64 = 16;
/// The largest read or write taken (larger ones fail with IOERR): 16 MiB, far above what
/// the segment limit we advertise lets a driver build.
pub const MAX_DATA: u64 = 16 << 20;
/// GET_ID's answer length (VIRTIO_BLK_ID_BYTES).
pub const ID_BYTES: usize = 20;

/// A piece of guest memory: its guest-physical address and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Guest-physical address.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
}

/// A chain split into its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Where the header's 16 bytes are.
    pub header: Vec<Segment>,
    /// The readable bytes after the header (a write's data).
    pub data_in: Vec<Segment>,
    /// The writable bytes before the status byte (a read's data, GET_ID's answer).
    pub data_out: Vec<Segment>,
    /// The status byte's address.
    pub status: u64,
}

/// A chain no request can be made of: answered with nothing written (a driver bug).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    /// Fewer than 16 readable bytes.
    #[error("the chain has {0} readable bytes, fewer than a request header's 16")]
    ShortHeader(u64),
    /// No writable byte for the status.
    #[error("the chain has no writable byte for the status")]
    NoStatus,
    /// A readable descriptor after a writable one.
    #[error("a readable descriptor follows a writable one")]
    ReadAfterWrite,
}

/// What a well-formed request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Read into `data_out`.
    Read {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// Write `data_in`'s bytes.
    Write {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// Make every completed write durable.
    Flush,
    /// Write the device's id string into `data_out`.
    GetId,
}

/// A descriptor: guest address, length, device-writable.
pub type Descriptor = (u64, u32, bool);

/// Splits a chain's descriptors, in chain order.
pub fn split(descriptors: &[Descriptor]) -> Result<Layout, Malformed> {
    let mut readable = Vec::new();
    let mut writable = Vec::new();
    for &(addr, len, w) in descriptors {
        if len == 0 {
            continue;
        }
        let seg = Segment { addr, len: len as u64 };
        if w {
            writable.push(seg);
        } else if writable.is_empty() {
            readable.push(seg);
        } else {
            return Err(Malformed::ReadAfterWrite);
        }
    }
    let in_len: u64 = readable.iter().map(|s| s.len).sum();
    if in_len < HEADER_LEN {
        return Err(Malformed::ShortHeader(in_len));
    }
    let out_len: u64 = writable.iter().map(|s| s.len).sum();
    if out_len == 0 {
        return Err(Malformed::NoStatus);
    }
    let (header, data_in) = cut(&readable, HEADER_LEN);
    let (data_out, status) = cut(&writable, out_len - 1);
    Ok(Layout { header, data_in, data_out, status: status[0].addr })
}

/// `segs` cut after `at` bytes: the pieces before and after.
fn cut(segs: &[Segment], at: u64) -> (Vec<Segment>, Vec<Segment>) {
    let (mut before, mut after) = (Vec::new(), Vec::new());
    let mut pos = 0;
    for s in segs {
        let (start, end) = (pos, pos + s.len);
        pos = end;
        if end <= at {
            before.push(*s);
        } else if start >= at {
            after.push(*s);
        } else {
            let head = at - start;
            before.push(Segment { addr: s.addr, len: head });
            after.push(Segment { addr: s.addr + head, len: s.len - head });
        }
    }
    (before, after)
}

/// Total bytes of `segs`.
pub fn total(segs: &[Segment]) -> u64 {
    segs.iter().map(|s| s.len).sum()
}

/// The request a header asks for, checked against the layout and the device's
/// `capacity` in bytes; a refusal is the status byte to answer with (UNSUPP for a type
/// we do not offer, IOERR for a range past the end, not whole sectors, or too large).
pub fn request(header: &[u8; HEADER_LEN as usize], layout: &Layout, capacity: u64) -> Result<Op, u8> {
    let kind = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
    let sector = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
    let ranged = |len: u64| -> Result<u64, u8> {
        let offset = sector.checked_mul(SECTOR).ok_or(VIRTIO_BLK_S_IOERR as u8)?;
        let fits = offset.checked_add(len).is_some_and(|end| end <= capacity);
        if !len.is_multiple_of(SECTOR) || len > MAX_DATA || !fits {
            return Err(VIRTIO_BLK_S_IOERR as u8);
        }
        Ok(offset)
    };
    match kind {
        VIRTIO_BLK_T_IN => {
            let len = total(&layout.data_out);
            Ok(Op::Read { offset: ranged(len)?, len })
        }
        VIRTIO_BLK_T_OUT => {
            let len = total(&layout.data_in);
            Ok(Op::Write { offset: ranged(len)?, len })
        }
        VIRTIO_BLK_T_FLUSH => Ok(Op::Flush),
        VIRTIO_BLK_T_GET_ID => Ok(Op::GetId),
        _ => Err(VIRTIO_BLK_S_UNSUPP as u8),
    }
}

/// GET_ID's answer for an export named `name`: its first 20 bytes, NUL-padded (no NUL
/// when it fills all 20, as the spec allows).
pub fn id_bytes(name: &str) -> [u8; ID_BYTES] {
    let mut id = [0u8; ID_BYTES];
    let n = name.len().min(ID_BYTES);
    id[..n].copy_from_slice(&name.as_bytes()[..n]);
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: u32, sector: u64) -> [u8; 16] {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&kind.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        h
    }

    #[test]
    fn the_usual_layout_splits_into_header_data_and_status() {
        // Linux: header alone, two data pages, status alone.
        let l = split(&[(0x1000, 16, false), (0x2000, 4096, true), (0x4000, 4096, true), (0x9000, 1, true)]).unwrap();
        assert_eq!(l.header, vec![Segment { addr: 0x1000, len: 16 }]);
        assert!(l.data_in.is_empty());
        assert_eq!(total(&l.data_out), 8192);
        assert_eq!(l.status, 0x9000);
        assert_eq!(request(&header(VIRTIO_BLK_T_IN, 8), &l, 1 << 20), Ok(Op::Read { offset: 4096, len: 8192 }));
    }

    #[test]
    fn any_layout_header_with_data_and_status_with_data() {
        // One readable descriptor holding the header and 1 KiB of write data, then one
        // writable byte; and a read whose status shares the last data descriptor.
        let w = split(&[(0x1000, 16 + 1024, false), (0x8000, 1, true)]).unwrap();
        assert_eq!(w.header, vec![Segment { addr: 0x1000, len: 16 }]);
        assert_eq!(w.data_in, vec![Segment { addr: 0x1010, len: 1024 }]);
        assert_eq!(request(&header(VIRTIO_BLK_T_OUT, 2), &w, 1 << 20), Ok(Op::Write { offset: 1024, len: 1024 }));
        let r = split(&[(0x1000, 8, false), (0x1008, 8, false), (0x2000, 513, true)]).unwrap();
        assert_eq!(r.header.len(), 2);
        assert_eq!(r.data_out, vec![Segment { addr: 0x2000, len: 512 }]);
        assert_eq!(r.status, 0x2200);
    }

    #[test]
    fn malformed_chains_are_named() {
        assert_eq!(split(&[(0, 8, false), (8, 1, true)]), Err(Malformed::ShortHeader(8)));
        assert_eq!(split(&[(0, 16, false)]), Err(Malformed::NoStatus));
        assert_eq!(split(&[(0, 16, false), (16, 1, true), (32, 8, false)]), Err(Malformed::ReadAfterWrite));
    }

    #[test]
    fn ranges_past_the_end_partial_sectors_and_unknown_types_are_refused() {
        let l = split(&[(0, 16, false), (0x2000, 4096, true), (0x9000, 1, true)]).unwrap();
        let cap = 64 * 1024;
        // Exactly at the end: fine; one sector further: IOERR.
        assert!(request(&header(VIRTIO_BLK_T_IN, (cap - 4096) / 512), &l, cap).is_ok());
        assert_eq!(request(&header(VIRTIO_BLK_T_IN, (cap - 4096) / 512 + 1), &l, cap), Err(VIRTIO_BLK_S_IOERR as u8));
        // A sector number whose byte offset overflows.
        assert_eq!(request(&header(VIRTIO_BLK_T_IN, u64::MAX / 256), &l, cap), Err(VIRTIO_BLK_S_IOERR as u8));
        // Not whole sectors.
        let odd = split(&[(0, 16, false), (0x2000, 100, true), (0x9000, 1, true)]).unwrap();
        assert_eq!(request(&header(VIRTIO_BLK_T_IN, 0), &odd, cap), Err(VIRTIO_BLK_S_IOERR as u8));
        // Discard is not offered.
        assert_eq!(request(&header(11, 0), &l, cap), Err(VIRTIO_BLK_S_UNSUPP as u8));
        assert_eq!(request(&header(VIRTIO_BLK_T_FLUSH, 0), &l, cap), Ok(Op::Flush));
    }

    #[test]
    fn ids_are_cut_and_padded() {
        assert_eq!(&id_bytes("vm1")[..4], b"vm1\0");
        assert_eq!(&id_bytes("a-name-longer-than-twenty")[..], b"a-name-longer-than-t");
    }
}
