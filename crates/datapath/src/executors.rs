//! Who runs the engine's device ops: the device threads (`devices.rs`: any op), and the
//! io_uring thread (`ring.rs`: ops on the cache devices it serves — the cache file and the
//! O_DIRECT `[[cache.device]]`s, `Shared::local_only` —, when io_uring is available and no
//! fault-injecting device wraps the cache; "on the file" below means those). The choice and its
//! bookkeeping live here alone: whether the ring is on, which queued ops the device
//! threads may take, how many of the queued ops are theirs, and whom to wake when ops are
//! queued. One type rather than a trait over two executors: both run at once (the ring
//! takes the cache file's ops, the threads the rest), and the ring turns off at run time
//! (a cache detach, an io_uring failure) with ops still queued, which the threads then
//! take.

use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::Condvar;

/// The two executors' shared state (inside the data path's `Shared`).
pub(super) struct Executors {
    /// Device threads.
    threads: usize,
    /// Cache-file ops run on the io_uring thread, not the device threads.
    ring_on: AtomicBool,
    /// Wakes the io_uring thread (cache-file ops queued, or room for more in flight).
    ring_notify: tokio::sync::Notify,
    /// Ops queued that are not on the cache file — backing stores' and other cache
    /// stores' (with the ring on, the only ones device threads take: a wakeup for a
    /// cache-file op would find nothing to do and sleep again).
    not_on_file: AtomicUsize,
    /// Device calls the io_uring thread made, and those whose I/O failed.
    ring_calls: [AtomicU64; 2],
}

/// What the io_uring thread did since start (`/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingCounts {
    /// Whether it runs the cache file's ops now.
    pub on: bool,
    /// Device calls (a coalesced run of ops counting once) whose I/O succeeded.
    pub calls_ok: u64,
    /// Device calls whose I/O failed (an error or a short transfer from the kernel).
    pub calls_failed: u64,
}

impl Executors {
    /// `threads` device threads (at least one), the ring off.
    pub(super) fn new(threads: usize) -> Executors {
        Executors {
            threads: threads.max(1),
            ring_on: AtomicBool::new(false),
            ring_notify: tokio::sync::Notify::new(),
            not_on_file: AtomicUsize::new(0),
            ring_calls: Default::default(),
        }
    }

    /// Device threads.
    pub(super) fn threads(&self) -> usize {
        self.threads
    }

    /// Whether the io_uring thread runs the cache file's ops.
    pub(super) fn ring_on(&self) -> bool {
        self.ring_on.load(SeqCst)
    }

    /// The io_uring thread starts (`true`) or stops taking the cache file's ops.
    pub(super) fn set_ring(&self, on: bool) {
        self.ring_on.store(on, SeqCst);
    }

    /// The io_uring thread finished a device call (`ok`: its I/O succeeded).
    pub(super) fn ring_call_done(&self, ok: bool) {
        self.ring_calls[usize::from(!ok)].fetch_add(1, Relaxed);
    }

    /// What the io_uring thread did so far.
    pub(super) fn ring_counts(&self) -> RingCounts {
        RingCounts {
            on: self.ring_on(),
            calls_ok: self.ring_calls[0].load(Relaxed),
            calls_failed: self.ring_calls[1].load(Relaxed),
        }
    }

    /// What the io_uring thread waits on.
    pub(super) fn ring_notify(&self) -> &tokio::sync::Notify {
        &self.ring_notify
    }

    /// Whether the device threads may take an op (`on_file`: it is on the cache file
    /// only, `Shared::local_only`): all but the ring's.
    #[inline]
    pub(super) fn threads_take(&self, on_file: bool) -> bool {
        !(on_file && self.ring_on.load(Relaxed))
    }

    /// An op was queued (`on_file`: on the cache file only).
    #[inline]
    pub(super) fn queued(&self, on_file: bool) {
        if !on_file {
            self.not_on_file.fetch_add(1, Relaxed);
        }
    }

    /// The queued ops left to the device threads are `n` (the ring's stores changed).
    pub(super) fn recount(&self, n: usize) {
        self.not_on_file.store(n, Relaxed);
    }

    /// A queued op was taken to run.
    #[inline]
    pub(super) fn taken(&self, on_file: bool) {
        if !on_file {
            self.not_on_file.fetch_sub(1, Relaxed);
        }
    }

    /// Wakes whoever runs the `queued` ops just queued (`on_file` of them on the cache
    /// file), `left` ops being in the queues now: the io_uring thread for cache-file ops
    /// when it runs them, and one device thread per op left to the device threads (at
    /// most as many as are still queued for them, at most every thread). `wake` is the
    /// device threads' condition.
    pub(super) fn wake(&self, wake: &Condvar, on_file: usize, queued: usize, left: usize) {
        let ring = self.ring_on.load(Relaxed);
        if ring && on_file > 0 {
            self.ring_notify.notify_one();
        }
        let (mine, theirs) = if ring { (queued - on_file, self.not_on_file.load(Relaxed)) } else { (queued, left) };
        for _ in 0..mine.min(theirs).min(self.threads) {
            wake.notify_one();
        }
    }

    /// Wakes the device threads for what is left after a client thread ran its own ops
    /// (`left` ops in the queues).
    pub(super) fn wake_for_left(&self, wake: &Condvar, left: usize) {
        let theirs = self.not_on_file.load(Relaxed).min(left);
        self.wake(wake, left - theirs, left, left);
    }
}
