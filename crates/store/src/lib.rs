//! What the daemon keeps on the host, below the engine: a vDisk's backing store — a file,
//! a block device or an NBD server ([`backing`]) — and what proves it is the same one
//! across restarts ([`backing_identity`]); the cache store's open (O_DIRECT where it can)
//! and its label ([`cache_label`]: a replaced or emptied store is never served as data);
//! the metadata's on-disk format ([`journal`]: framed records, checkpoint and journal);
//! and one owner per cache ([`owner_lock`]); and devices that fail on command for tests
//! ([`faults`]). It knows no engine, data path or daemon:
//! the data path turns the engine's commits into journal records (`cachevisor_datapath::persist`).

#![warn(unreachable_pub)]

pub mod backing;
pub mod backing_identity;
pub mod cache_label;
pub mod faults;
pub mod journal;
pub mod owner_lock;
