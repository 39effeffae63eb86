//! Optimistic backing reads outside the core lock. A read that misses the cache reads its
//! blocks from the (possibly slow) backing store with the lock released, so other requests
//! — hits above all — go on meanwhile and several misses wait on the store at once. The
//! engine then runs under the lock as usual and its backing reads are served from those
//! bytes, but only if no backing write touched the blocks in between: every backing write
//! bumps a version stripe of each block it covers before and after (always under the lock
//! but for fenced write-throughs, which keep readers of their blocks waiting),
//! the prefetch notes the stripes' versions under the lock before reading, and its bytes
//! count only if the versions are unchanged once the lock is held again (no write can be
//! in flight then). A stale or failed prefetch is dropped and the engine's reads go to the
//! store under the lock. The engine never sees any of this: decisions, and so policies,
//! are exactly the simulator's.

use crate::executor::Devices;
use cachevisor_trace::VmId;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

/// Version stripes (a write to any block of a stripe invalidates prefetches of all of it).
const STRIPES: usize = 4096;

/// Reads longer than this are not prefetched (the buffer is held per request).
pub const MAX_PREFETCH: u64 = 1 << 20;

/// Write versions of backing blocks, striped.
pub struct Versions {
    v: Box<[AtomicU64]>,
    block_size: u64,
}

impl Versions {
    /// Versions for blocks of `block_size` bytes.
    pub fn new(block_size: u64) -> Self {
        Versions { v: (0..STRIPES).map(|_| AtomicU64::new(0)).collect(), block_size }
    }

    fn stripe(vm: VmId, block: u64) -> usize {
        ((block ^ (vm as u64).rotate_left(40)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as usize % STRIPES
    }

    fn blocks(&self, addr: u64, len: u64) -> Range<u64> {
        addr / self.block_size..(addr + len.max(1)).div_ceil(self.block_size)
    }

    /// Runs `write` (of `len` bytes at `addr` of `vm`'s store) between two bumps of each
    /// stripe it touches, so a reader that noted the versions with no write in flight can
    /// tell without the lock whether a write began since (seqlock style).
    pub fn around_write<R>(&self, vm: VmId, addr: u64, len: u64, write: impl FnOnce() -> R) -> R {
        let mut stripes: Vec<usize> = self.blocks(addr, len).map(|b| Self::stripe(vm, b)).collect();
        stripes.sort_unstable();
        stripes.dedup();
        for &s in &stripes {
            self.v[s].fetch_add(1, Ordering::SeqCst);
        }
        let r = write();
        for &s in &stripes {
            self.v[s].fetch_add(1, Ordering::SeqCst);
        }
        r
    }

    /// The versions of the blocks covering `len` bytes at `addr` of `vm`'s store.
    pub fn snapshot_range(&self, vm: VmId, addr: u64, len: u64) -> Vec<u64> {
        self.snapshot(vm, self.blocks(addr, len))
    }

    /// The versions of `blocks` of `vm`.
    pub fn snapshot(&self, vm: VmId, blocks: Range<u64>) -> Vec<u64> {
        blocks.map(|b| self.v[Self::stripe(vm, b)].load(Ordering::SeqCst)).collect()
    }
}

/// Bytes of `vm`'s backing store read ahead of the engine.
pub struct Prefetch {
    /// The vDisk.
    pub vm: VmId,
    /// Disk address of `data`.
    pub start: u64,
    /// The bytes.
    pub data: Vec<u8>,
}

impl Prefetch {
    /// A prefetch of whole `blocks` of `vm` (clamped to the disk's `size`) with the
    /// versions it must still match.
    pub fn plan(versions: &Versions, vm: VmId, blocks: Range<u64>, size: u64) -> (Prefetch, Vec<u64>) {
        let bs = versions.block_size;
        let start = blocks.start * bs;
        let end = (blocks.end * bs).min(size);
        (Prefetch { vm, start, data: vec![0; end.saturating_sub(start) as usize] }, versions.snapshot(vm, blocks))
    }

    /// Whether the bytes are still those of the store: no write bumped their versions.
    pub fn still_valid(&self, versions: &Versions, noted: &[u64]) -> bool {
        let blocks = versions.blocks(self.start, self.data.len() as u64);
        versions.snapshot(self.vm, blocks) == noted
    }
}

/// Devices that serve backing reads covered by a prefetch from its bytes.
pub struct WithPrefetch<'a> {
    /// The real devices.
    pub dev: &'a dyn Devices,
    /// The bytes read ahead.
    pub p: &'a Prefetch,
}

impl Devices for WithPrefetch<'_> {
    fn ssd(&self) -> &File {
        self.dev.ssd()
    }
    fn backing(&self, vm: VmId) -> &crate::backing::Backing {
        self.dev.backing(vm)
    }
    fn block_size(&self) -> u64 {
        self.dev.block_size()
    }
    fn fault(&self, op: &cachevisor_engine::DeviceOp) -> io::Result<()> {
        self.dev.fault(op)
    }
    fn ssd_read(&self, buf: &mut [u8], addr: u64) -> io::Result<()> {
        self.dev.ssd_read(buf, addr)
    }
    fn ssd_write(&self, data: &[u8], addr: u64) -> io::Result<()> {
        self.dev.ssd_write(data, addr)
    }
    fn backing_read(&self, vm: VmId, buf: &mut [u8], addr: u64) -> io::Result<()> {
        let p = self.p;
        if vm == p.vm && addr >= p.start && addr + buf.len() as u64 <= p.start + p.data.len() as u64 {
            let at = (addr - p.start) as usize;
            buf.copy_from_slice(&p.data[at..at + buf.len()]);
            return Ok(());
        }
        self.dev.backing_read(vm, buf, addr)
    }
    fn backing_write(&self, vm: VmId, data: &[u8], addr: u64) -> io::Result<()> {
        self.dev.backing_write(vm, data, addr)
    }
}

/// The cache store alone, for reads of cached blocks run with the core lock released
/// (O_DIRECT hits); any backing access is an error.
pub struct UnlockedSsd<'a> {
    /// The cache store.
    pub ssd: &'a File,
    /// The cache's block size.
    pub bs: u64,
    /// O_DIRECT: reads go through an aligned buffer.
    pub bounce: std::cell::RefCell<crate::aligned_buf::AlignedBuf>,
}

/// What [`UnlockedSsd`] offers as a backing store.
static NO_BACKING: crate::backing::Backing = crate::backing::Backing::Removed;

impl Devices for UnlockedSsd<'_> {
    fn ssd(&self) -> &File {
        self.ssd
    }
    fn backing(&self, _vm: VmId) -> &crate::backing::Backing {
        &NO_BACKING
    }
    fn block_size(&self) -> u64 {
        self.bs
    }
    fn ssd_read(&self, buf: &mut [u8], addr: u64) -> io::Result<()> {
        crate::aligned_buf::read_at(self.ssd, &mut self.bounce.borrow_mut(), buf, addr)
    }
    fn ssd_write(&self, _data: &[u8], _addr: u64) -> io::Result<()> {
        Err(io::Error::other("cache-store write without the core lock"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_to_any_prefetched_block_invalidates_the_prefetch() {
        let v = Versions::new(4096);
        let (p, noted) = Prefetch::plan(&v, 3, 10..14, 1 << 20);
        assert_eq!((p.start, p.data.len()), (40960, 4 * 4096));
        assert!(p.still_valid(&v, &noted));
        v.around_write(3, 100 * 4096, 4096, || ()); // elsewhere (a stripe collision would only be pessimistic)
        v.around_write(2, 11 * 4096, 4096, || ()); // another vDisk
        let collides = Versions::stripe(3, 100) == Versions::stripe(3, 10)
            || (10..14).any(|b| Versions::stripe(2, 11) == Versions::stripe(3, b));
        assert_eq!(p.still_valid(&v, &noted), !collides);
        v.around_write(3, 13 * 4096 + 512, 512, || ());
        assert!(!p.still_valid(&v, &noted));
        // The disk's end clamps the buffer.
        let (p, _) = Prefetch::plan(&v, 0, 0..2, 5000);
        assert_eq!(p.data.len(), 5000);
    }
}

#[cfg(test)]
mod seqlock_tests {
    use super::*;

    #[test]
    fn a_write_in_flight_leaves_the_stripes_odd_and_any_write_changes_them() {
        let v = Versions::new(4096);
        let before = v.snapshot_range(0, 0, 3 * 4096);
        let during = v.around_write(0, 0, 3 * 4096, || v.snapshot_range(0, 0, 3 * 4096));
        assert!(during.iter().all(|x| x % 2 == 1), "{during:?}");
        let after = v.snapshot_range(0, 0, 3 * 4096);
        assert!(after.iter().zip(&before).all(|(a, b)| a == &(b + 2)));
    }
}
