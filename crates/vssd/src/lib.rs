//! SymFlex's elastic vSSD (../shared/seeds/symflex.md), pure: no clocks, threads, sockets
//! or files. A region of the cache SSD is carved into blocks (1 MiB by default, §2.2);
//! the [`manager::BlockManager`] hands them to vSSDs as they register (§2.4.1), inflates
//! and deflates them with the guest's cooperation (§2.4.3), translates their I/O
//! (§2.4.2), keeps persistent vSSDs' blocks across VM restarts (§5.3) and swaps out
//! inactive ones' when space is needed (§2.4.4). Its durable state ([`state::State`])
//! changes only by [`record::Record`]s a driver journals, so a crash at any point leaves
//! every vSSD mapping exactly the blocks its committed records give it.

pub mod budget;
pub mod geometry;
pub mod io;
pub mod lifecycle;
pub mod manager;
pub mod protocol;
pub mod record;
pub mod resize;
pub mod state;
mod tally;

pub use geometry::{Geometry, Lbn, Pbn};
pub use manager::{BlockManager, Config, Event, Op, OpKind};
pub use record::{Record, VssdId};
pub use state::State;
