//! One file per trace format: a record parser and a writer each.

pub mod blkparse;
pub mod cloudphysics_csv;
pub mod generic_csv;
pub mod mqsim;
pub mod msr;
pub mod oracle_general;
pub mod vscsi;
