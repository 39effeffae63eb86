//! The vSSD region's bytes: a range of the cache store file carved into blocks, and the
//! secondary storage inactive persistent vSSDs' blocks are swapped out to (SymFlex
//! §2.4.4: one sparse file per vSSD in the swap directory, a logical block at
//! `lbn × block`). Runs the block manager's ops and guests' reads and writes at the
//! offsets the manager gives; durability is the caller's order (`sync` before a commit).
//! When the cache store runs with O_DIRECT, guests' 4 KiB-aligned reads and writes go
//! through a second, O_DIRECT handle (bounce buffers from `aligned_buf`); the rest, and
//! the manager's ops, through the buffered one (Linux keeps the two coherent: a direct
//! write drops the range from the page cache, a direct read writes dirty pages first).

use cachevisor_vssd::io::Extent;
use cachevisor_vssd::{Geometry, OpKind, VssdId};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

thread_local! {
    /// Each I/O thread's aligned bounce buffer for O_DIRECT.
    static BOUNCE: std::cell::RefCell<cachevisor_files::aligned_buf::AlignedBuf> = Default::default();
}

/// The region and its swap directory.
pub struct VssdRegion {
    file: Arc<File>,
    /// The same file opened with O_DIRECT, for aligned guest I/O.
    direct: Option<File>,
    /// Where block 0 starts in the file.
    base: u64,
    geometry: Geometry,
    swap_dir: PathBuf,
}

impl VssdRegion {
    /// The region of `geometry` at `base` in `file`, swapping out to `swap_dir` (created
    /// 0700 if missing; its parent must exist).
    pub fn new(file: Arc<File>, base: u64, geometry: Geometry, swap_dir: PathBuf) -> io::Result<VssdRegion> {
        cachevisor_files::private_files::ensure_dir(&swap_dir)?;
        Ok(VssdRegion { file, direct: None, base, geometry, swap_dir })
    }

    /// Guests' aligned I/O through `path` opened with O_DIRECT (the store's file).
    pub fn with_direct(mut self, path: &std::path::Path) -> io::Result<VssdRegion> {
        self.direct = Some(cachevisor_files::aligned_buf::open_direct(path)?);
        Ok(self)
    }

    /// Whether aligned guest I/O bypasses the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// The O_DIRECT handle, when `at` and `len` are 4 KiB-aligned.
    fn direct_for(&self, at: u64, len: u64) -> Option<&File> {
        let a = cachevisor_files::aligned_buf::ALIGN as u64;
        self.direct.as_ref().filter(|_| at.is_multiple_of(a) && len.is_multiple_of(a))
    }

    fn swap_path(&self, id: VssdId) -> PathBuf {
        self.swap_dir.join(format!("vssd-{id}.swap"))
    }

    fn at(&self, pbn: u32) -> u64 {
        self.base + self.geometry.offset_of(pbn)
    }

    /// Runs one of the block manager's ops. A swap-out is durable when this returns (its
    /// record may be committed at once); a zero or a swap-in becomes durable with the
    /// next [`Self::sync`].
    pub fn run(&self, op: &OpKind) -> io::Result<()> {
        let bs = self.geometry.block_bytes;
        match *op {
            OpKind::Zero { pbn } => {
                let at = self.at(pbn);
                match rustix::fs::fallocate(&*self.file, rustix::fs::FallocateFlags::ZERO_RANGE, at, bs) {
                    Ok(()) => Ok(()),
                    // No ZERO_RANGE here (tmpfs, some file systems, block devices): write them.
                    Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS | rustix::io::Errno::INVAL) => {
                        let zeros = vec![0u8; bs as usize];
                        self.file.write_all_at(&zeros, at)
                    }
                    Err(e) => Err(e.into()),
                }
            }
            OpKind::SwapOut { id, lbn, pbn } => {
                let mut buf = vec![0u8; bs as usize];
                self.file.read_exact_at(&mut buf, self.at(pbn))?;
                let f =
                    cachevisor_files::private_files::own_options().create(true).write(true).open(self.swap_path(id))?;
                f.write_all_at(&buf, u64::from(lbn) * bs)?;
                f.sync_data()
            }
            OpKind::SwapIn { id, lbn, pbn } => {
                let mut buf = vec![0u8; bs as usize];
                File::open(self.swap_path(id))?.read_exact_at(&mut buf, u64::from(lbn) * bs)?;
                self.file.write_all_at(&buf, self.at(pbn))
            }
        }
    }

    /// Drops vSSD `id`'s swapped-out copies (it was removed).
    pub fn drop_swap(&self, id: VssdId) -> io::Result<()> {
        match std::fs::remove_file(self.swap_path(id)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }

    /// Reads a request's extents into `buf`.
    pub fn read(&self, extents: &[Extent], buf: &mut [u8]) -> io::Result<()> {
        for e in extents {
            let b = &mut buf[e.buf_offset as usize..(e.buf_offset + e.len) as usize];
            let at = self.base + e.region_offset;
            match self.direct_for(at, e.len) {
                Some(f) => BOUNCE.with_borrow_mut(|bounce| cachevisor_files::aligned_buf::read_at(f, bounce, b, at))?,
                None => self.file.read_exact_at(b, at)?,
            }
        }
        Ok(())
    }

    /// Writes `data` to a request's extents.
    pub fn write(&self, extents: &[Extent], data: &[u8]) -> io::Result<()> {
        for e in extents {
            let b = &data[e.buf_offset as usize..(e.buf_offset + e.len) as usize];
            let at = self.base + e.region_offset;
            match self.direct_for(at, e.len) {
                Some(f) => {
                    BOUNCE.with_borrow_mut(|bounce| cachevisor_files::aligned_buf::write_at(f, bounce, b, at))?
                }
                None => self.file.write_all_at(b, at)?,
            }
        }
        Ok(())
    }

    /// Makes every write and zeroing so far durable.
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}
