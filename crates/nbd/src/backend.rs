//! What an export is served from, as the protocol sees it: a store that takes block
//! commands ([`Cmd`]) and answers each through a callback ([`Done`]) with the bytes read
//! ([`Bytes`]) or what the client is told ([`ClientError`]). NBD's transmission loop
//! (`transmission.rs`) and the daemon's vhost-user-blk front end drive any
//! [`ExportBackend`]; the daemon implements it for its vDisks (the cache's data path),
//! vSSDs, lent regions and replica logs. This crate knows nothing else of them.

use std::io;

/// A block command.
#[derive(Debug, Clone)]
pub enum Cmd {
    /// Read this many bytes.
    Read(u32),
    /// Write these bytes.
    Write(Vec<u8>),
    /// Make every acknowledged write durable.
    Flush,
    /// Discard (TRIM) this many bytes.
    Discard(u32),
}

/// Bytes read, with the disk address of their first byte (a read's reply may come in
/// several pieces, in any order).
pub type Bytes = (bytes::Bytes, u64);

/// A reply callback: the command's outcome and, for a read, the pieces of its data
/// (together they cover the request). Called on any thread, with no lock held.
pub type Done = Box<dyn FnOnce(Result<Vec<Bytes>, ClientError>) + Send>;

/// Why a command failed, as the client is told it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientError {
    /// The device is full (ENOSPC).
    NoSpace,
    /// An I/O error (EIO).
    Io,
    /// Bytes the store returned failed their checksum (EIO to the client).
    Corrupt,
    /// The export is no longer served (ESHUTDOWN).
    Shutdown,
    /// The command reaches past the export's end (EINVAL).
    OutOfRange,
}

impl ClientError {
    /// The NBD errno it is reported with.
    pub fn errno(self) -> u32 {
        use crate::proto::{EINVAL, EIO, ENOSPC, ESHUTDOWN};
        match self {
            ClientError::NoSpace => ENOSPC,
            ClientError::Io | ClientError::Corrupt => EIO,
            ClientError::Shutdown => ESHUTDOWN,
            ClientError::OutOfRange => EINVAL,
        }
    }
}

/// An export's store.
pub trait ExportBackend: Send + Sync + 'static {
    /// Whether device waits are real (O_DIRECT): a request is then handed off unless no
    /// other is buffered behind it.
    fn direct(&self) -> bool;
    /// Whether the export is still served (not removed or stopped).
    fn serves(&self) -> bool;
    /// Starts a command at `offset`; `done` gets its outcome, perhaps before this
    /// returns. `here`: the calling thread may run it.
    fn submit(&self, offset: u64, cmd: Cmd, here: bool, done: Done);
    /// Starts a write the client asked to be durable at once (FUA): a store that tells
    /// such writes apart (a vDisk's I/O classes may match them) overrides this; the
    /// durability itself is the flush the caller sends after it.
    fn submit_fua_write(&self, offset: u64, data: Vec<u8>, here: bool, done: Done) {
        self.submit(offset, Cmd::Write(data), here, done)
    }
    /// NBD_CMD_CACHE: a hint to load the range.
    fn hint_cache(&self, offset: u64, len: u64);
    /// `base:allocation` descriptors for the range: (length, NBD state flags) each.
    fn allocation(&self, offset: u64, len: u32, one: bool) -> io::Result<Vec<(u32, u32)>>;
    /// Writes and waits (WRITE_ZEROES' pieces).
    fn write_now(&self, offset: u64, data: &[u8]) -> Result<(), ClientError>;
    /// Flushes and waits.
    fn flush_now(&self) -> Result<(), ClientError>;
}

/// Copies the bytes of `parts` that fall in `offset..offset + buf.len()` into `buf`.
pub fn copy_range(parts: &[Bytes], offset: u64, buf: &mut [u8]) {
    let end = offset + buf.len() as u64;
    for (bytes, base) in parts {
        let (lo, hi) = ((*base).max(offset), (base + bytes.len() as u64).min(end));
        if lo < hi {
            buf[(lo - offset) as usize..(hi - offset) as usize]
                .copy_from_slice(&bytes[(lo - base) as usize..(hi - base) as usize]);
        }
    }
}

/// An export as the handshake offers it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportInfo {
    /// The id transmission is entered with (the daemon's VM id).
    pub id: u32,
    /// Export name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Client certificates that may open it (`tls_authz.rs`; empty: any client the
    /// listener's TLS policy lets in).
    pub allow: Vec<String>,
}
