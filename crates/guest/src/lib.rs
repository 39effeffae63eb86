//! SymFlex's guest side (../shared/seeds/symflex.md §2.3, §4): what runs inside a VM to
//! use an elastic vSSD the host inflates and deflates. [`block_cache::BlockCache`] is
//! §4.1's dm-cache with its free, clean, dirty and invalid lists and per-application
//! shares (§5.4), pure; [`guest_cache::GuestCache`] drives it over the vSSD, an origin
//! device and the control channel ([`control::Control`], the messages of
//! `cachevisor_vssd::protocol`; [`balloon`] the resize protocol for any user of the blocks); [`warm_map`] saves its map at a clean stop and takes it
//! back, checked, at the next start (§5.3); [`slab_kv::SlabKv`] is §4.2's Fatcache use, a
//! key-value cache whose slabs ([`slab_table::SlabTable`]) are the vSSD's blocks.

pub mod balloon;
pub mod block_cache;
pub mod control;
pub mod guest_cache;
pub mod slab_kv;
pub mod slab_table;
pub mod warm_map;

pub use block_cache::{Access, AppId, BlockCache, Release};
pub use control::Control;
pub use guest_cache::{BlockDevice, GuestCache, LostWrites, Stats, WriteMode};
