//! What the operator binary (`cachevisor`) shares with the lab binary (`cachevisor-lab`):
//! progress bars, where the bundled traces are, writing trace files, and where the other
//! binary is. Everything else
//! of the command line is the binary's own.

pub mod bundled;
pub mod progress;
pub mod sibling_binary;
pub mod trace_file;
