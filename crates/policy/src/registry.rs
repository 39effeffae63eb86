//! The one registry of allocation policies: name → constructor, used by scenarios, the
//! CLI and tests. `shared` is not an allocator but a partition mode (one replacement over
//! the whole SSD, the "unmanaged" baseline); drivers handle it through the engine.

use crate::allocator::Allocator;
use crate::optimal::Optimal;
use crate::static_share::StaticShare;
use crate::symflex_weighted::SymflexWeighted;

/// Names of every allocator.
pub const NAMES: [&str; 3] = ["static", "optimal", "symflex-weighted"];

/// Builds an allocator by name; the error lists the names.
pub fn build(name: &str) -> Result<Box<dyn Allocator>, String> {
    match name {
        "static" => Ok(Box::new(StaticShare)),
        "optimal" => Ok(Box::new(Optimal)),
        "symflex-weighted" => Ok(Box::new(SymflexWeighted)),
        _ => Err(format!("unknown allocation policy `{name}` (one of {})", NAMES.join(", "))),
    }
}
