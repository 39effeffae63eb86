//! NBD wire format (the protocol as the NBD project documents it, doc/proto.md): magic
//! numbers, option, reply, command and flag values, and pure decoders/encoders for the
//! fixed-size records. No I/O here, so the decoders can be fuzzed and unit tested.

/// "NBDMAGIC": first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": newstyle negotiation, and the start of every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply.
pub const REPLY_MAGIC_OPT: u64 = 0x0003_e889_0455_65a9;
/// Magic of a transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

/// Handshake flags (server).
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// No 124 zero bytes after NBD_OPT_EXPORT_NAME.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flags we understand.
pub const CLIENT_FLAGS_KNOWN: u32 = 0b11;
/// Client: fixed newstyle.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client: no zeroes.
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
/// Abort negotiation.
pub const OPT_ABORT: u32 = 2;
/// List exports.
pub const OPT_LIST: u32 = 3;
/// Start TLS.
pub const OPT_STARTTLS: u32 = 5;
/// Export information.
pub const OPT_INFO: u32 = 6;
/// Information, then transmission.
pub const OPT_GO: u32 = 7;
/// Structured replies.
pub const OPT_STRUCTURED_REPLY: u32 = 8;
/// List metadata contexts.
pub const OPT_LIST_META_CONTEXT: u32 = 9;
/// Select metadata contexts for BLOCK_STATUS.
pub const OPT_SET_META_CONTEXT: u32 = 10;
/// 64-bit headers (not offered: no client here speaks it yet).
pub const OPT_EXTENDED_HEADERS: u32 = 11;

/// Option replies.
pub const REP_ACK: u32 = 1;
/// One export of a LIST.
pub const REP_SERVER: u32 = 2;
/// An information item.
pub const REP_INFO: u32 = 3;
/// A metadata context (id and name).
pub const REP_META_CONTEXT: u32 = 4;
/// Error bit of option replies.
pub const REP_FLAG_ERROR: u32 = 1 << 31;
/// Unknown or unsupported option.
pub const REP_ERR_UNSUP: u32 = REP_FLAG_ERROR | 1;
/// Refused by policy.
pub const REP_ERR_POLICY: u32 = REP_FLAG_ERROR | 2;
/// Malformed option.
pub const REP_ERR_INVALID: u32 = REP_FLAG_ERROR | 3;
/// Unknown export.
pub const REP_ERR_UNKNOWN: u32 = REP_FLAG_ERROR | 6;
/// Option data too large.
pub const REP_ERR_TOO_BIG: u32 = REP_FLAG_ERROR | 9;
/// Error: the server requires TLS before this option.
pub const REP_ERR_TLS_REQD: u32 = REP_FLAG_ERROR | 5;

/// Info types.
pub const INFO_EXPORT: u16 = 0;
/// Block size constraints.
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flags.
pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
/// Read-only export.
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
/// FLUSH supported.
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
/// FUA supported.
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
/// TRIM supported.
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
/// WRITE_ZEROES supported.
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// READ's DF flag honoured (only with structured replies).
pub const TFLAG_SEND_DF: u16 = 1 << 7;
/// Several connections see one consistent view (flush on one covers writes on all).
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;
/// CACHE supported.
pub const TFLAG_SEND_CACHE: u16 = 1 << 10;

/// Commands.
pub const CMD_READ: u16 = 0;
/// Write.
pub const CMD_WRITE: u16 = 1;
/// Disconnect.
pub const CMD_DISC: u16 = 2;
/// Flush.
pub const CMD_FLUSH: u16 = 3;
/// Trim (discard).
pub const CMD_TRIM: u16 = 4;
/// Bring a range into the cache (a hint).
pub const CMD_CACHE: u16 = 5;
/// Write zeroes.
pub const CMD_WRITE_ZEROES: u16 = 6;
/// Block status of a range in the negotiated metadata contexts.
pub const CMD_BLOCK_STATUS: u16 = 7;

/// Command flag: force unit access.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
/// Command flag: do not punch holes (WRITE_ZEROES).
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// Command flag: one content chunk only (READ, structured replies).
pub const CMD_FLAG_DF: u16 = 1 << 2;
/// Command flag: one block status descriptor only.
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
/// Command flag: fail fast if zeroing is slow.
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// Errors (errno values the protocol carries).
pub const EPERM: u32 = 1;
/// I/O error.
pub const EIO: u32 = 5;
/// Invalid argument.
pub const EINVAL: u32 = 22;
/// No space.
pub const ENOSPC: u32 = 28;
/// Value too large (length over the limit).
pub const EOVERFLOW: u32 = 75;
/// Not supported.
pub const ENOTSUP: u32 = 95;
/// The export is going away (a removed vDisk).
pub const ESHUTDOWN: u32 = 108;

/// Largest option payload accepted (the spec caps strings at 4096 bytes).
pub const MAX_OPTION_LEN: u32 = 64 * 1024;
/// Largest READ/WRITE payload accepted (32 MiB, what qemu and nbdkit use).
pub const MAX_PAYLOAD: u32 = 32 << 20;

/// A transmission request header (28 bytes on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Command flags.
    pub flags: u16,
    /// Command type.
    pub kind: u16,
    /// Opaque handle echoed in the reply.
    pub cookie: u64,
    /// Byte offset.
    pub offset: u64,
    /// Byte length.
    pub length: u32,
}

/// Size of a request header.
pub const REQUEST_LEN: usize = 28;

/// Why a request header is not acceptable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Wrong magic: the stream is out of sync; the connection must close.
    #[error("bad request magic {0:#010x}")]
    Magic(u32),
}

/// Decodes a request header.
pub fn decode_request(b: &[u8; REQUEST_LEN]) -> Result<Request, HeaderError> {
    let magic = u32::from_be_bytes(b[0..4].try_into().expect("4 bytes"));
    if magic != REQUEST_MAGIC {
        return Err(HeaderError::Magic(magic));
    }
    Ok(Request {
        flags: u16::from_be_bytes([b[4], b[5]]),
        kind: u16::from_be_bytes([b[6], b[7]]),
        cookie: u64::from_be_bytes(b[8..16].try_into().expect("8 bytes")),
        offset: u64::from_be_bytes(b[16..24].try_into().expect("8 bytes")),
        length: u32::from_be_bytes(b[24..28].try_into().expect("4 bytes")),
    })
}

/// Encodes a request header (for tests and clients).
pub fn encode_request(r: &Request) -> [u8; REQUEST_LEN] {
    let mut b = [0u8; REQUEST_LEN];
    b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&r.flags.to_be_bytes());
    b[6..8].copy_from_slice(&r.kind.to_be_bytes());
    b[8..16].copy_from_slice(&r.cookie.to_be_bytes());
    b[16..24].copy_from_slice(&r.offset.to_be_bytes());
    b[24..28].copy_from_slice(&r.length.to_be_bytes());
    b
}

/// A simple reply header.
pub fn simple_reply(error: u32, cookie: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// An option reply header followed by its data.
pub fn option_reply(option: u32, kind: u32, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&REPLY_MAGIC_OPT.to_be_bytes());
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// The export name and info requests of an INFO/GO option's data.
pub fn decode_info_request(data: &[u8]) -> Option<(String, Vec<u16>)> {
    let len = u32::from_be_bytes(data.get(0..4)?.try_into().ok()?) as usize;
    let name = std::str::from_utf8(data.get(4..4 + len)?).ok()?.to_string();
    let rest = data.get(4 + len..)?;
    let n = u16::from_be_bytes(rest.get(0..2)?.try_into().ok()?) as usize;
    let reqs = rest.get(2..2 + 2 * n)?;
    if rest.len() != 2 + 2 * n {
        return None;
    }
    Some((name, reqs.chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect()))
}

/// What a command may do to an export of `size` bytes: `Err(errno)` if not allowed.
pub fn check_range(r: &Request, size: u64) -> Result<(), u32> {
    match r.kind {
        CMD_READ | CMD_WRITE if r.length > MAX_PAYLOAD => Err(EOVERFLOW),
        CMD_BLOCK_STATUS if r.length == 0 => Err(EINVAL),
        CMD_READ | CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES | CMD_CACHE | CMD_BLOCK_STATUS => {
            if r.offset.checked_add(r.length as u64).is_none_or(|end| end > size) {
                Err(EINVAL)
            } else {
                Ok(())
            }
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn request_headers_round_trip(flags: u16, kind: u16, cookie: u64, offset: u64, length: u32) {
            let r = Request { flags, kind, cookie, offset, length };
            prop_assert_eq!(decode_request(&encode_request(&r)), Ok(r));
        }

        #[test]
        fn decoders_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_info_request(&bytes);
            if bytes.len() >= REQUEST_LEN {
                let _ = decode_request(bytes[..REQUEST_LEN].try_into().unwrap());
            }
        }
    }

    #[test]
    fn ranges_past_the_end_are_invalid() {
        let r = |kind, offset, length| Request { flags: 0, kind, cookie: 1, offset, length };
        assert_eq!(check_range(&r(CMD_READ, 0, 4096), 4096), Ok(()));
        assert_eq!(check_range(&r(CMD_READ, 1, 4096), 4096), Err(EINVAL));
        assert_eq!(check_range(&r(CMD_WRITE, u64::MAX, 2), 4096), Err(EINVAL));
        assert_eq!(check_range(&r(CMD_READ, 0, MAX_PAYLOAD + 1), u64::MAX), Err(EOVERFLOW));
        assert_eq!(check_range(&r(CMD_FLUSH, 99, 99), 0), Ok(()));
    }

    #[test]
    fn info_requests_decode() {
        let mut d = Vec::new();
        d.extend_from_slice(&3u32.to_be_bytes());
        d.extend_from_slice(b"vm1");
        d.extend_from_slice(&1u16.to_be_bytes());
        d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        assert_eq!(decode_info_request(&d), Some(("vm1".into(), vec![INFO_BLOCK_SIZE])));
        d.push(0);
        assert_eq!(decode_info_request(&d), None, "trailing bytes");
    }
}
