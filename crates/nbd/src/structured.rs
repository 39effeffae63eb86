//! Structured replies (NBD proto.md "Structured reply chunk message"): the chunk header,
//! the chunk types cachevisor sends — one `OFFSET_DATA` chunk per READ (so `NBD_CMD_FLAG_DF`
//! always holds), `BLOCK_STATUS` for `base:allocation`, `ERROR` for a failed command — and
//! `base:allocation`'s status bits. Pure encoders, no I/O.

/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
/// The last chunk of a reply.
pub const REPLY_FLAG_DONE: u16 = 1;
/// Data at an offset.
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// Block status descriptors of one metadata context.
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
/// An error (errno and message).
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;

/// The one metadata context served: holes and zeroes of the export.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// Its context id (any non-zero id the server picks).
pub const BASE_ALLOCATION_ID: u32 = 1;
/// `base:allocation`: the range is not allocated (reads as zeroes here).
pub const STATE_HOLE: u32 = 1;
/// `base:allocation`: the range reads as zeroes.
pub const STATE_ZERO: u32 = 2;

/// Size of a chunk header.
pub const CHUNK_HEADER_LEN: usize = 20;

/// A chunk header: `flags`, `kind`, the request's `cookie` and the payload's length.
pub fn chunk_header(flags: u16, kind: u16, cookie: u64, len: u32) -> [u8; CHUNK_HEADER_LEN] {
    let mut b = [0u8; CHUNK_HEADER_LEN];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
    b
}

/// The header and offset of the one, final `OFFSET_DATA` chunk of a READ of `len` bytes at
/// `offset` (the data follows).
pub fn read_data_header(cookie: u64, offset: u64, len: u32) -> [u8; CHUNK_HEADER_LEN + 8] {
    let mut b = [0u8; CHUNK_HEADER_LEN + 8];
    b[..CHUNK_HEADER_LEN].copy_from_slice(&chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, cookie, len + 8));
    b[CHUNK_HEADER_LEN..].copy_from_slice(&offset.to_be_bytes());
    b
}

/// A final `ERROR` chunk with `errno` and a message.
pub fn error_chunk(cookie: u64, errno: u32, message: &str) -> Vec<u8> {
    let msg = &message.as_bytes()[..message.len().min(4096)];
    let mut b = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_ERROR, cookie, 6 + msg.len() as u32).to_vec();
    b.extend_from_slice(&errno.to_be_bytes());
    b.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    b.extend_from_slice(msg);
    b
}

/// A final `BLOCK_STATUS` chunk for context `id`: `(length, status)` descriptors.
pub fn block_status_chunk(cookie: u64, id: u32, extents: &[(u32, u32)]) -> Vec<u8> {
    let mut b = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, cookie, 4 + 8 * extents.len() as u32).to_vec();
    b.extend_from_slice(&id.to_be_bytes());
    for (len, flags) in extents {
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(&flags.to_be_bytes());
    }
    b
}

/// The queries of a LIST/SET_META_CONTEXT option's data: the export name and the
/// context names asked for; None if malformed.
pub fn decode_meta_request(data: &[u8]) -> Option<(String, Vec<String>)> {
    let take = |at: usize| -> Option<(String, usize)> {
        let len = u32::from_be_bytes(data.get(at..at + 4)?.try_into().ok()?) as usize;
        let s = std::str::from_utf8(data.get(at + 4..at.checked_add(4 + len)?)?).ok()?;
        Some((s.to_owned(), at + 4 + len))
    };
    let (export, mut at) = take(0)?;
    let n = u32::from_be_bytes(data.get(at..at + 4)?.try_into().ok()?);
    at += 4;
    let mut queries = Vec::new();
    for _ in 0..n {
        let (q, next) = take(at)?;
        queries.push(q);
        at = next;
    }
    (at == data.len()).then_some((export, queries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_carry_the_lengths_the_spec_asks() {
        let h = read_data_header(7, 4096, 512);
        assert_eq!(u32::from_be_bytes(h[16..20].try_into().unwrap()), 520);
        assert_eq!(u64::from_be_bytes(h[20..28].try_into().unwrap()), 4096);
        let e = error_chunk(7, 5, "boom");
        assert_eq!(e.len(), 20 + 6 + 4);
        assert_eq!(u16::from_be_bytes(e[6..8].try_into().unwrap()), REPLY_TYPE_ERROR);
        let b = block_status_chunk(9, 1, &[(4096, 3), (512, 0)]);
        assert_eq!(u32::from_be_bytes(b[16..20].try_into().unwrap()), 4 + 16);
        assert_eq!(b.len(), 20 + 20);
    }

    #[test]
    fn meta_requests_decode_and_malformed_ones_do_not() {
        let mut d = 2u32.to_be_bytes().to_vec();
        d.extend(b"vm");
        d.extend(2u32.to_be_bytes());
        for q in ["base:allocation", "qemu:dirty-bitmap:x"] {
            d.extend((q.len() as u32).to_be_bytes());
            d.extend(q.as_bytes());
        }
        let (e, q) = decode_meta_request(&d).unwrap();
        assert_eq!((e.as_str(), q.len(), q[0].as_str()), ("vm", 2, "base:allocation"));
        assert!(decode_meta_request(&d[..d.len() - 1]).is_none());
        let mut extra = d.clone();
        extra.push(0);
        assert!(decode_meta_request(&extra).is_none());
        assert!(decode_meta_request(&[0, 0, 0, 9]).is_none());
        assert!(decode_meta_request(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]).is_none());
    }
}
