//! A byte buffer whose start is aligned to 4 KiB, for O_DIRECT I/O on the cache store, and
//! a pool of such buffers whose reads become replies without a copy. Written by hand
//! because the workspace forbids `unsafe` and aligned-allocation crates allocate with it:
//! this one over-allocates a `Vec` by the alignment and uses the window that starts on an
//! aligned address (the address is only inspected, never dereferenced).

/// Alignment of the buffer's start (O_DIRECT needs the device's logical block size; 4 KiB
/// covers every common device).
pub const ALIGN: usize = 4096;

/// A growable buffer with an aligned start.
#[derive(Debug, Default)]
pub struct AlignedBuf {
    v: Vec<u8>,
}

impl AlignedBuf {
    /// An aligned slice of `len` bytes (contents unspecified), growing the buffer if needed.
    pub fn slice(&mut self, len: usize) -> &mut [u8] {
        if self.v.len() < len + ALIGN {
            self.v = vec![0u8; (len + ALIGN).next_power_of_two()];
        }
        let off = (ALIGN - self.v.as_ptr() as usize % ALIGN) % ALIGN;
        &mut self.v[off..off + len]
    }
}

/// Opens `path` for reading and writing with O_DIRECT (its I/O goes through
/// [`read_at`] / [`write_at`]).
pub fn open_direct(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).write(true).custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32).open(path)
}

/// Reads `buf.len()` bytes of `f` at `addr` through the aligned `bounce` (O_DIRECT).
pub fn read_at(f: &std::fs::File, bounce: &mut AlignedBuf, buf: &mut [u8], addr: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let aligned = bounce.slice(buf.len());
    f.read_exact_at(aligned, addr)?;
    buf.copy_from_slice(aligned);
    Ok(())
}

/// Writes `data` to `f` at `addr` through the aligned `bounce` (O_DIRECT).
pub fn write_at(f: &std::fs::File, bounce: &mut AlignedBuf, data: &[u8], addr: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let aligned = bounce.slice(data.len());
    aligned.copy_from_slice(data);
    f.write_all_at(aligned, addr)
}

/// The start of the aligned window of `v` (at most [`ALIGN`] − 1 bytes in).
pub fn aligned_offset(v: &[u8]) -> usize {
    (ALIGN - v.as_ptr() as usize % ALIGN) % ALIGN
}

/// I/O buffers for reuse: a read's buffer goes out as the reply's bytes
/// ([`IoPool::freeze`]) and comes back here when the last reference to them is dropped,
/// so large reads neither allocate (and fault in) fresh memory nor copy their data again.
#[derive(Debug, Default)]
pub struct IoPool {
    free: std::sync::Mutex<Vec<Vec<u8>>>,
}

/// Buffers kept, and the largest kept (a 1 MiB run and its alignment slack).
const POOL_BUFFERS: usize = 64;
const POOL_MAX: usize = (1 << 20) + ALIGN;

impl IoPool {
    /// A buffer of at least `len` + [`ALIGN`] bytes (contents unspecified).
    pub fn take(&self, len: usize) -> Vec<u8> {
        let want = len + ALIGN;
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        match free.iter().position(|v| v.len() >= want) {
            Some(i) => free.swap_remove(i),
            None => {
                drop(free);
                vec![0u8; want]
            }
        }
    }

    /// Gives `v` back (kept if the pool has room and it is not oversized).
    pub fn give(&self, v: Vec<u8>) {
        if v.len() <= POOL_MAX {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            if free.len() < POOL_BUFFERS {
                free.push(v);
            }
        }
    }

    /// `v[off..off + len]` as shared bytes, `v` back in the pool once they are dropped.
    pub fn freeze(self: &std::sync::Arc<Self>, v: Vec<u8>, off: usize, len: usize) -> bytes::Bytes {
        bytes::Bytes::from_owner(Pooled { v, off, len, pool: self.clone() })
    }
}

/// A pooled buffer lent out as bytes (see [`IoPool::freeze`]).
struct Pooled {
    v: Vec<u8>,
    off: usize,
    len: usize,
    pool: std::sync::Arc<IoPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.v[self.off..self.off + self.len]
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give(std::mem::take(&mut self.v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_start_aligned_at_every_size() {
        let mut b = AlignedBuf::default();
        for len in [0, 1, 512, 4096, 5000, 1 << 20, 512] {
            let s = b.slice(len);
            assert_eq!(s.len(), len);
            assert_eq!(s.as_ptr() as usize % ALIGN, 0);
        }
    }

    #[test]
    fn frozen_bytes_are_the_window_and_their_buffer_comes_back() {
        let pool = std::sync::Arc::new(IoPool::default());
        let mut v = pool.take(8192);
        let off = aligned_offset(&v);
        v[off..off + 8192].fill(7);
        v[off + 8192] = 9; // outside the window
        let ptr = v.as_ptr();
        let b = pool.freeze(v, off, 8192);
        assert_eq!(b.len(), 8192);
        assert!(b.iter().all(|&x| x == 7));
        assert_eq!(b.as_ptr() as usize % ALIGN, 0);
        let piece = b.slice(4096..);
        drop(b);
        assert_eq!(pool.free.lock().unwrap().len(), 0, "a slice still holds it");
        drop(piece);
        let again = pool.take(100);
        assert_eq!(again.as_ptr(), ptr, "reused");
    }
}
