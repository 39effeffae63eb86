//! Block I/O traces for cachevisor: the one [`Request`] model, streaming readers for every
//! supported format (one file each under [`formats`]), writers, time-ordered merging of
//! several traces into one multi-VM stream, the Nutanix-schema synthetic generator, a Zipf
//! generator, and workload characterization.
//!
//! Readers hold constant memory and report malformed records with file, line or byte
//! offset, and field ([`TraceError::Malformed`]); with `skip_bad` they count them instead.

pub mod chain;
pub mod characterize;
pub mod error;
pub mod format;
pub mod formats;
pub mod generator;
pub mod input;
pub mod merge;
pub mod numparse;
pub mod request;
pub mod source;
pub mod units;
pub mod vm_table;
pub mod write_file;
pub mod zipf;

pub use error::{Location, TraceError};
pub use format::{open_trace, Format, ReadOptions, TraceWriter};
pub use merge::{MergeOptions, MergedTrace};
pub use request::{Op, Request, VmId};
pub use source::{SourceCounts, TraceSource};
pub use vm_table::VmMode;
