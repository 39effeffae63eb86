//! The one registry of allocation policies: name → constructor, used by scenarios, the
//! CLI and tests. `shared` is not an allocator but a partition mode (one replacement over
//! the whole SSD, the "unmanaged" baseline); drivers handle it through the engine.

use crate::adaptive::Adaptive;
use crate::allocator::Allocator;
use crate::centaur::Centaur;
use crate::eci_cache::EciCache;
use crate::optimal::Optimal;
use crate::params::{ParamReader, Params};
use crate::scave::{Scave, ScaveParams};
use crate::scave_tracker::{Metric, ScaveTracker};
use crate::static_share::StaticShare;
use crate::symflex_proportional::SymflexProportional;
use crate::symflex_weighted::SymflexWeighted;

/// Names of every allocator.
pub const NAMES: [&str; 11] = [
    "static",
    "adaptive",
    "optimal",
    "symflex-weighted",
    "symflex-proportional",
    "s-cave",
    "s-cave-literal",
    "eci-cache",
    "centaur",
    "scave-recs",
    "scave-hitratio",
];

/// The replacement policy a configuration that names none gets with allocator `name`
/// (`Allocator::replacement`); LRU for a name the registry does not know (validation
/// reports that).
pub fn replacement_for(name: &str) -> cachevisor_engine::ReplacementKind {
    build(name).map_or(cachevisor_engine::ReplacementKind::Lru, |a| a.replacement())
}

/// Checks a cache's policy keys as the daemon's config, its API and the simulator's
/// scenario all do (one rule, one text per key): the allocator is known
/// (`cache.allocator`), its parameters are (`cache.params`), and an allocator with S-CAVE's
/// global cleaner runs on CLOCK (`cache.replacement`) — over static partitions; a shared
/// pool runs no allocator's cleaner.
pub fn check_cache_policy(
    name: &str,
    params: &Params,
    replacement: cachevisor_engine::ReplacementKind,
    partition: cachevisor_engine::PartitionMode,
) -> Result<(), String> {
    let alloc = build(name).map_err(|e| format!("cache.allocator: {e}"))?;
    build_with(name, params).map_err(|e| format!("cache.params: {e}"))?;
    if alloc.cleaner().is_some()
        && replacement != cachevisor_engine::ReplacementKind::Clock
        && partition == cachevisor_engine::PartitionMode::Static
    {
        return Err(format!("cache.replacement: `{name}` uses S-CAVE's global cleaner, which reads CLOCK counters, and this cache's replacement is `{}`: set replacement = \"clock\"", replacement.name()));
    }
    Ok(())
}

/// Builds an allocator by name with its seed's default parameters; the error lists the
/// names.
pub fn build(name: &str) -> Result<Box<dyn Allocator>, String> {
    build_with(name, &Params::new())
}

/// Builds an allocator by name with `params` over its defaults; unknown names, unknown
/// parameters and values out of range are errors that say which.
pub fn build_with(name: &str, params: &Params) -> Result<Box<dyn Allocator>, String> {
    let none = |policy: &'static str| ParamReader::new(policy, params).finish();
    Ok(match name {
        "static" => {
            none("static")?;
            Box::new(StaticShare)
        }
        "optimal" => {
            none("optimal")?;
            Box::new(Optimal)
        }
        "symflex-weighted" => {
            none("symflex-weighted")?;
            Box::new(SymflexWeighted)
        }
        "centaur" => {
            none("centaur")?;
            Box::new(Centaur)
        }
        "adaptive" => Box::new(Adaptive::from_params(params)?),
        "symflex-proportional" => Box::new(SymflexProportional::from_params(params)?),
        "s-cave" | "scave" => Box::new(Scave::new(ScaveParams::from_params(params)?)),
        "s-cave-literal" => Box::new(Scave::literal(ScaveParams::from_params(params)?)),
        "eci-cache" | "eci" => Box::new(EciCache::from_params(params)?),
        "scave-recs" => Box::new(ScaveTracker::with_params(Metric::Recs, ScaveParams::from_params(params)?)),
        "scave-hitratio" => Box::new(ScaveTracker::with_params(Metric::HitRatio, ScaveParams::from_params(params)?)),
        _ => return Err(format!("unknown allocation policy `{name}` (one of {})", NAMES.join(", "))),
    })
}
