//! A byte buffer whose start is aligned to 4 KiB, for O_DIRECT I/O on the cache store.
//! Written by hand because the workspace forbids `unsafe` and aligned-allocation crates
//! allocate with it: this one over-allocates a `Vec` by the alignment and uses the window
//! that starts on an aligned address (the address is only inspected, never dereferenced).

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
}
