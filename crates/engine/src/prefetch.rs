//! A hint to the CPU to start loading a cache line the engine will read a few requests
//! from now. A replay knows its next requests; their lookups are the cache model's cost
//! (each a miss to the block index and one to the slot table, `block_index.rs`), and a
//! lookup whose lines were asked for some requests earlier finds them in the CPU cache
//! instead of waiting for memory (group prefetching, as hash joins do).
//!
//! `core::arch::x86_64::_mm_prefetch` is an `unsafe` intrinsic and the workspace forbids
//! `unsafe`; `safe_arch` wraps it safely (a prefetch never faults and changes no state).
//! On other architectures the hint is nothing.

/// Hints that the cache line holding `x` will be read soon.
#[inline(always)]
pub(crate) fn hint<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    safe_arch::prefetch_t0(x);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}
