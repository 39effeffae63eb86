//! The lab's library half: the seeds' experiments on the simulator (`seeds`), which the
//! `cachevisor-lab` binary runs (`experiment NAME`) and the lab's tests check at the quick
//! size. The benches and the command line are the binary's (`main.rs`).

pub mod cachesim;
pub mod seeds;
