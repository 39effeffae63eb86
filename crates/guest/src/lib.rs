//! SymFlex's guest side (../shared/seeds/symflex.md §2.3, §4): what runs inside a VM to
//! use an elastic vSSD the host inflates and deflates. [`block_cache::BlockCache`] is
//! §4.1's dm-cache with its free, clean, dirty and invalid lists and per-application
//! shares (§5.4), pure; [`guest_cache::GuestCache`] drives it over the vSSD, an origin
//! device and the control channel ([`control::Control`], the messages of
//! `cachevisor_vssd::protocol`); [`warm_map`] saves its map at a clean stop and takes it
//! back, checked, at the next start (§5.3).

pub mod block_cache;
pub mod control;
pub mod guest_cache;
pub mod warm_map;

pub use block_cache::{Access, AppId, BlockCache, Release};
pub use control::Control;
pub use guest_cache::{BlockDevice, GuestCache, LostWrites, Stats, WriteMode};
