//! The vSSD region at the daemon's start: checks first (a cache store whose metadata
//! says vSSDs hold blocks is never opened without its `[vssd]`: resizing the file would
//! cut their data off), then the region opened after the cache's blocks, its metadata
//! replayed, the driver started, and the configured devices registered (a persistent
//! one whose VM was stopped gets its blocks back). Each vSSD is an NBD export whose id
//! carries [`VSSD_EXPORT`], with a control socket for its guest's manager (`control.rs`).

use super::meta::VssdMeta;
use super::region::VssdRegion;
use super::service::VssdService;
use crate::config::vssd_section::{region_base, Plan};
use crate::export::Export;
use cachevisor_vssd::lifecycle::LifecycleError;
use std::path::Path;
use std::sync::Arc;

/// The bit that marks a vSSD's export id (the rest is its vSSD id).
pub const VSSD_EXPORT: u32 = 1 << 31;

/// Refuses a start without `[vssd]` when the metadata in `meta_dir` says vSSDs hold
/// blocks or swapped-out data: the cache file's region is their data.
pub fn check_not_dropped(meta_dir: &Path) -> Result<(), String> {
    let Some(names) = VssdMeta::names_on_disk(meta_dir)? else { return Ok(()) };
    if names.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the cache store holds the data of vSSDs {} (metadata in {}), but the configuration has no [vssd] section: restore it (resizing the cache file would cut their data off), or remove the vSSDs first",
        names.join(", "),
        meta_dir.display()
    ))
}

/// The bytes the cache store file needs with `plan`'s region after `cache_bytes` (a
/// shared region lives in the cache's).
pub fn store_bytes(cache_bytes: u64, plan: &Plan) -> u64 {
    if plan.shared {
        return cache_bytes;
    }
    region_base(cache_bytes, plan.geometry.block_bytes) + plan.geometry.bytes()
}

/// Starts the region of `plan` in the cache store at `path` (its first `cache_bytes` are
/// the cache's, in `cache_block`-byte slots of `dp`'s engine) with metadata in
/// `meta_dir`; registers the configured devices. A shared region's blocks are withheld
/// from the engine first, and the budget loop started (`budget.rs`). Returns the service
/// and the devices' exports.
/// Guests' aligned I/O uses O_DIRECT when `direct` (the cache store's mode).
pub fn start(
    path: &Path,
    (cache_bytes, cache_block): (u64, u64),
    plan: &Plan,
    meta_dir: &Path,
    direct: bool,
    dp: &Arc<cachevisor_datapath::DataPath>,
) -> Result<(Arc<VssdService>, Vec<Export>), String> {
    let geometry = plan.region_geometry(cache_bytes, cache_block)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let swap = plan.swap_dir.clone().unwrap_or_else(|| meta_dir.join("vssd-swap"));
    let base = cachevisor_store::cache_label::DATA_OFFSET
        + if plan.shared { 0 } else { region_base(cache_bytes, plan.geometry.block_bytes) };
    let mut region = VssdRegion::new(Arc::new(file), base, geometry, swap.clone())
        .map_err(|e| format!("vssd.swap_dir: {}: {e}", swap.display()))?;
    if direct {
        region =
            region.with_direct(path).map_err(|e| format!("{} (O_DIRECT for the vSSD region): {e}", path.display()))?;
    }
    let (meta, state, opened) = VssdMeta::open(meta_dir, geometry, plan.shared)?;
    if opened.torn_tail {
        tracing::info!(
            records = opened.journal_records,
            "vSSD journal ended in a torn record (a crash while appending): cut there"
        );
    }
    let config = cachevisor_vssd::Config { geometry, deflate_grace: plan.grace_ns };
    let svc = VssdService::start(config, state, meta, region);
    if plan.shared {
        let runs = super::budget::Runs { slots_per_block: (geometry.block_bytes / cache_block) as u32 };
        let started = super::budget::withhold_at_start(&svc, dp, runs).and_then(|()| {
            let interval = std::time::Duration::from_nanos(plan.interval_ns);
            let sizes = (geometry.blocks, plan.geometry.blocks);
            super::budget::start(svc.clone(), dp.clone(), runs, sizes, interval, plan.allocator.is_some())
        });
        if let Err(e) = started {
            svc.halt();
            return Err(e);
        }
    }
    let mut exports = Vec::new();
    for d in &plan.devices {
        let id = match svc.register(&d.name, d.max_blocks, d.initial_blocks, d.persist) {
            Ok(id) => id,
            // The daemon restarted under a running VM: its vSSD is active still.
            Err(LifecycleError::State(m)) if m.contains("active already") => svc.id_of(&d.name).expect("registered"),
            Err(e) => {
                svc.halt();
                return Err(format!("vssd.device ({}): {e}", d.name));
            }
        };
        let control = d.control.clone().unwrap_or_else(|| meta_dir.join(format!("{}.vssd.sock", d.name)));
        if let Err(e) = super::control::listen(svc.clone(), id, &control, &format!("vssd.device ({}).control", d.name))
        {
            svc.halt();
            return Err(e);
        }
        let size = u64::from(d.max_blocks) * plan.geometry.block_bytes;
        // Its vhost-user access is set by the daemon's start (it knows the listener's TLS).
        exports.push(Export {
            id: VSSD_EXPORT | id,
            name: d.name.clone(),
            size,
            allow: d.allow.clone(),
            ..Default::default()
        });
    }
    if let Some(name) = &plan.allocator {
        let shares = plan.devices.iter().filter_map(|d| Some((svc.id_of(&d.name)?, d.share))).collect();
        if let Err(e) = svc.start_allocation(name, std::time::Duration::from_nanos(plan.interval_ns), shares) {
            svc.halt();
            return Err(e);
        }
    }
    Ok((svc, exports))
}
