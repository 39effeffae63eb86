//! SymFlex's guest-side cache manager run for real, as the `cachevisor-guest` binary runs
//! it inside a VM (and the lab's `experiment symflex-vssd` runs it in-process for each
//! VM): the devices it opens (`manager`), the hot/cold workload it drives (`workload`),
//! the key-value use (`kv`) and the cache served as NBD exports (`nbd_apps`). The cache
//! itself is `cachevisor-guest`'s.

pub mod kv;
pub mod manager;
pub mod nbd_apps;
pub mod workload;
