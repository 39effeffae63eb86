//! The one registry of allocation policies: name → constructor, used by scenarios, the
//! CLI and tests. `shared` is not an allocator but a partition mode (one replacement over
//! the whole SSD, the "unmanaged" baseline); drivers handle it through the engine.

use crate::allocator::Allocator;
use crate::centaur::Centaur;
use crate::eci_cache::EciCache;
use crate::optimal::Optimal;
use crate::scave::Scave;
use crate::scave_tracker::{Metric, ScaveTracker};
use crate::static_share::StaticShare;
use crate::symflex_proportional::SymflexProportional;
use crate::symflex_weighted::SymflexWeighted;

/// Names of every allocator.
pub const NAMES: [&str; 9] = ["static", "optimal", "symflex-weighted", "symflex-proportional", "s-cave", "eci-cache", "centaur", "scave-recs", "scave-hitratio"];

/// Builds an allocator by name with its seed's default parameters; the error lists the
/// names.
pub fn build(name: &str) -> Result<Box<dyn Allocator>, String> {
    match name {
        "static" => Ok(Box::new(StaticShare)),
        "optimal" => Ok(Box::new(Optimal)),
        "symflex-weighted" => Ok(Box::new(SymflexWeighted)),
        "symflex-proportional" => Ok(Box::new(SymflexProportional::default())),
        "s-cave" | "scave" => Ok(Box::new(Scave::default())),
        "eci-cache" | "eci" => Ok(Box::new(EciCache::default())),
        "centaur" => Ok(Box::new(Centaur)),
        "scave-recs" => Ok(Box::new(ScaveTracker::new(Metric::Recs))),
        "scave-hitratio" => Ok(Box::new(ScaveTracker::new(Metric::HitRatio))),
        _ => Err(format!("unknown allocation policy `{name}` (one of {})", NAMES.join(", "))),
    }
}
