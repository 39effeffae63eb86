//! Faults on command, for tests: a device wrapped with a [`Faults`] fails its N-th write,
//! makes every read wait before it starts, or holds its next extent query — the failing
//! and slow disks the data path must survive, without a hook in the data path itself.
//! The wrapped devices are a vDisk's backing store ([`crate::backing::Backing::with_faults`])
//! and the data path's cache stores (`cachevisor_datapath`, which wraps each when started
//! with faults). A daemon started without faults has no such device anywhere.
//!
//! Written by hand: the point is the data path's own devices (an O_DIRECT cache file, an
//! NBD backing) failing where the code under test calls them; dm-flakey or a FUSE file
//! system would need root and kernel modules the tests cannot count on.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// What the devices wrapped with it do wrong from now on (nothing by default).
#[derive(Debug, Default)]
pub struct Faults {
    /// The write at which to fail, counting down (0: none).
    fail_write_in: AtomicU64,
    /// Microseconds each read waits before it starts (0: none).
    read_delay_us: AtomicU64,
    /// Microseconds the next extent query waits (0: none).
    extents_pause_us: AtomicU64,
    /// Microseconds each cache-store write waits before it starts (0: none).
    cache_write_delay_us: AtomicU64,
}

impl Faults {
    /// The `n`-th write from now to a cache store wrapped with these faults fails (0:
    /// none). Backing stores' writes never fail here: a failing cache is what is tested.
    pub fn fail_cache_write_in(&self, n: u64) {
        self.fail_write_in.store(n, Relaxed);
    }

    /// Every read of a wrapped device (cache store or backing store) waits `us`
    /// microseconds before it starts, so races with writes become likely (0: none).
    pub fn delay_reads(&self, us: u64) {
        self.read_delay_us.store(us, Relaxed);
    }

    /// Every write of a wrapped cache store waits `us` microseconds before it starts: a
    /// cache device slower than its backing store (congestion bypass's case; 0: none).
    pub fn delay_cache_writes(&self, us: u64) {
        self.cache_write_delay_us.store(us, Relaxed);
    }

    /// The next extent query of a wrapped backing store (what BLOCK_STATUS asks after it
    /// looked at the cache) waits `us` microseconds before it starts.
    pub fn pause_next_extents(&self, us: u64) {
        self.extents_pause_us.store(us, Relaxed);
    }

    /// Called by a wrapped device before a read.
    pub fn before_read(&self) {
        sleep_us(self.read_delay_us.load(Relaxed));
    }

    /// Called by a wrapped cache store before a write: the injected failure, if this is it.
    pub fn before_cache_write(&self) -> io::Result<()> {
        sleep_us(self.cache_write_delay_us.load(Relaxed));
        let n = self.fail_write_in.load(Relaxed);
        if n > 0 && self.fail_write_in.fetch_sub(1, Relaxed) == 1 {
            return Err(io::Error::other("injected cache-store write failure"));
        }
        Ok(())
    }

    /// Called by a wrapped backing store before an extent query.
    pub fn before_extents(&self) {
        sleep_us(self.extents_pause_us.swap(0, Relaxed));
    }
}

fn sleep_us(us: u64) {
    if us > 0 {
        std::thread::sleep(Duration::from_micros(us));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nth_write_fails_once_and_a_pause_is_taken_once() {
        let f = Faults::default();
        assert!(f.before_cache_write().is_ok(), "no fault by default");
        f.fail_cache_write_in(3);
        let failed: Vec<bool> = (0..6).map(|_| f.before_cache_write().is_err()).collect();
        assert_eq!(failed, [false, false, true, false, false, false]);
        f.pause_next_extents(30_000);
        let t = std::time::Instant::now();
        f.before_extents();
        assert!(t.elapsed() >= Duration::from_millis(30));
        let t = std::time::Instant::now();
        f.before_extents();
        assert!(t.elapsed() < Duration::from_millis(30), "taken once");
    }
}
