//! cachevisor's test kit: what the tests of several crates share, as a dev-dependency
//! (never a dependency of the operator binary). The daemon run as a real process
//! (`process`), a cluster of daemons in network namespaces with a real etcd (`netns`,
//! `cluster`), the daemon's configuration built key by key (`config`), a test PKI made
//! with openssl (`certs`), a real Linux guest under QEMU
//! (`guest_vm`), and where the workspace's binaries are (`bins`).

#![allow(missing_docs)] // test helpers; each item says what it is where it matters

pub mod bins;
pub mod certs;
pub mod cluster;
pub mod config;
pub mod fio;
pub mod guest_vm;
pub mod netns;
pub mod process;

pub use config::{s, strings, ServeConfig};
pub use fio::fio_verified;
pub use process::*;
