//! SymFlex's elastic vSSD in the daemon: the pure block manager (`cachevisor_vssd`)
//! driven against a region of the cache store ([`region`]), its records journaled in the
//! cache metadata's format ([`meta`]), and the thread that runs it ([`service`]).

pub mod meta;
pub mod region;
pub mod service;
