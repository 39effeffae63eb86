//! What the operator binary (`cachevisor`) shares with the lab binary (`cachevisor-lab`):
//! progress bars, where the bundled traces are, and writing trace files. Everything else
//! of the command line is the binary's own.

pub mod bundled;
pub mod progress;
pub mod trace_file;
