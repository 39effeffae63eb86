//! Prewarming a cold cache from another cache's state (the Nutanix prewarming study,
//! `../shared/seeds/nutanix-cache-prewarming-slides.txt`), as pure code: no clocks,
//! threads, sockets or files — time is passed in, reads go out, outcomes come back.
//!
//! - [`capture`]: a snapshot of a live engine;
//! - [`snapshot`]: a cache-state snapshot (a bitmap per vDisk or metadata-object set) and
//!   its checksummed, versioned file format;
//! - [`scores`]: k-Recent / k-Frequent / k-Frerecent (LNR, QDR) over a history of
//!   snapshots, and the prewarm set under a size limit;
//! - [`plan`]: the set turned into reads, most important first, neighbours coalesced;
//! - [`settings`]: the operator's limit, rate, busy rate and read size, checked;
//! - [`online`]: whether, how much and how fast to prewarm each vDisk, from what the
//!   source saw (hit ratio, IOPS, working set);
//! - [`pacer`]: the prewarm rate, with a guaranteed minimum while the disk is busy;
//! - [`loader`]: the reads handed out in order, paced, yielding to client I/O, with
//!   progress.

pub mod capture;
pub mod loader;
pub mod online;
pub mod pacer;
pub mod plan;
pub mod roaring_clip;
pub mod scores;
pub mod settings;
pub mod snapshot;

pub use capture::{capture, Capture};
pub use loader::{Loader, LoaderConfig, Progress, ReadOutcome};
pub use pacer::{PaceConfig, Pacer};
pub use plan::{plan, Run};
pub use roaring::RoaringTreemap;
pub use scores::{Heuristic, ObjectId, Ranking};
pub use settings::Pacing;
pub use snapshot::{Activity, Snapshot, SnapshotError};
