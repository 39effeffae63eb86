//! SymFlex's elastic vSSD in the daemon: the pure block manager (`cachevisor_vssd`)
//! driven against a region of the cache store ([`region`]), its records journaled in the
//! cache metadata's format ([`meta`]), the thread that runs it ([`service`]), the threads
//! that run guests' I/O ([`io_pool`]), and its configuration ([`settings`]).

pub mod allocation;
pub mod budget;
pub mod control;
pub mod export;
pub mod io_pool;
pub mod meta;
pub mod region;
pub mod service;
pub mod split;
pub mod startup;
