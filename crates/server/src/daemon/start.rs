//! Starting the daemon without harming what is stored. The order is the point:
//! 1. the owner lock on the cache store and its metadata directory (`owner_lock`), before
//!    anything is read or written — a second daemon on the same cache stops here;
//! 2. the configuration (with the API's overlay) and each vDisk's backing: where it points,
//!    two vDisks on one store refused;
//! 3. the metadata replayed into the engine (read only), then each vDisk's recorded backing
//!    identity compared with the configured one (`backing_identity`): dirty blocks bound to
//!    another store refuse the start (unless `--discard-dirty NAME`), clean ones are dropped;
//! 4. only then are backing files created or opened (sizes checked), the cache store sized
//!    and preallocated, and the first checkpoint written.

use super::*;
use cachevisor_datapath::persist::{bits_to_bools, Persistence};
use cachevisor_store::backing::Backing;
use cachevisor_store::backing_identity::{Identity, Place};
use cachevisor_store::journal::Record;
use cachevisor_store::owner_lock::OwnerLock;
use cachevisor_trace::units::parse_size;
use std::path::Path;

/// Choices an operator makes when starting, beyond the config.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// vDisks whose dirty cached blocks may be dropped when they cannot be written back to
    /// the backing store they belong to (it changed, or the vDisk left the config).
    pub discard_dirty: Vec<String>,
    /// Prewarm the cache at start from this snapshot directory (over `prewarm.from`).
    pub prewarm_from: Option<std::path::PathBuf>,
    /// Where the configuration came from, for reloads (`None`: a reload is refused).
    pub source: Option<super::reload::ConfigSource>,
    /// Devices that fail on command (tests only: `cachevisor_store::faults`; every cache
    /// store and backing store is wrapped with them).
    pub faults: Option<Arc<cachevisor_store::faults::Faults>>,
}

/// Where each vDisk's backing points; two vDisks on one store are refused.
fn places(cfg: &Config) -> Result<Vec<Place>, StartError> {
    let mut out: Vec<Place> = Vec::new();
    for (i, v) in cfg.vdisk.iter().enumerate() {
        let at = format!("vdisk[{i}] ({}).backing", v.name);
        let p = Place::of(&v.backing).map_err(|e| StartError::Config(format!("{at}: {}: {e}", v.backing.display())))?;
        if let Some(j) = out.iter().position(|o| o.same(&p)) {
            return Err(StartError::Config(format!(
                "{at}: {} is also the backing of vdisk[{j}] ({}): two vDisks on one backing store would each cache their own copy and overwrite each other's data",
                v.backing.display(),
                cfg.vdisk[j].name
            )));
        }
        out.push(p);
    }
    Ok(out)
}

/// Drops every cached block of `vm`, dirty ones included, without device work.
fn forget_vm(engine: &mut Engine, vm: VmId) -> u64 {
    let slots = engine.dump_partition(vm);
    for &s in &slots {
        engine.release_slot(s);
    }
    slots.len() as u64
}

/// Drops `vm`'s cached blocks past its disk's end (metadata of a larger disk, or written
/// by hand); dirty ones refuse the start unless `discard`.
fn drop_past_end(engine: &mut Engine, vm: VmId, name: &str, discard: bool) -> Result<(), StartError> {
    let end = engine.disk_blocks(vm);
    let past: Vec<u32> = engine
        .dump_partition(vm)
        .into_iter()
        .filter(|&s| engine.slot_block(s).is_some_and(|(_, b)| b >= end))
        .collect();
    let dirty = past.iter().filter(|&&s| engine.slot_dirty(s)).count();
    if dirty > 0 && !discard {
        return Err(StartError::Refused(format!(
            "vdisk `{name}`: the metadata holds {dirty} dirty blocks past the end of its backing store ({end} blocks): it is smaller than the disk they were written to. Point `backing` at that disk, or start with `--discard-dirty {name}` to drop them deliberately (the data they hold is lost). Nothing was changed."
        )));
    }
    for &s in &past {
        engine.release_slot(s);
    }
    if !past.is_empty() {
        tracing::warn!(vdisk = %name, blocks = past.len(), dirty, "dropped cached blocks past the end of the vDisk");
    }
    Ok(())
}

impl Daemon {
    /// [`Self::start_with`] with no operator overrides.
    pub fn start(cfg: &Config) -> Result<Daemon, StartError> {
        Daemon::start_with(cfg, &StartOptions::default())
    }

    /// Locks the cache, checks everything, then opens (creating where configured) the
    /// cache store and backing stores and sets up the engine: one partition per vDisk sized
    /// by the configured allocator, warm with the blocks the metadata holds.
    pub fn start_with(cfg: &Config, opts: &StartOptions) -> Result<Daemon, StartError> {
        let meta_dir = crate::own_files::metadata_dir(cfg);
        // What a reload compares with: the file as it is.
        let file_config = cfg.clone();
        // Cache devices removed online stay out (`device_removal.rs`): the overlay says so
        // until the file no longer lists them.
        let mut cfg_devices = cfg.clone();
        if meta_dir.is_dir() {
            let overlay = crate::vdisk_overlay::Overlay::load(&meta_dir).map_err(StartError::Config)?;
            for note in overlay.apply_devices(&mut cfg_devices) {
                tracing::warn!("{note}");
            }
        }
        let cfg = &cfg_devices;
        // Credentials first: a bad certificate refuses the start before anything is opened.
        let tls = match cfg.listen.tls_credentials().map_err(StartError::Config)? {
            Some(c) => {
                Some(Arc::new(cachevisor_nbd::tls::ServerTls::load(cfg.listen.tls, c).map_err(StartError::Config)?))
            }
            None => None,
        };
        // Every value and path checked before anything is created: a listen
        // path holding a file, a backing among the daemon's own files.
        cfg.resolve().map_err(StartError::Config)?;
        crate::own_files::check_paths(cfg).map_err(StartError::Config)?;
        let mut owner = OwnerLock::acquire(&cfg.cache.path, &meta_dir).map_err(StartError::Refused)?;
        // A device whose path names nothing is not created yet: the metadata may have been
        // written with it (then the start runs without it: `cache_devices.rs`).
        let absent: Vec<bool> = cfg.cache.device.iter().map(|d| super::cache_devices::is_missing(&d.path)).collect();
        for (i, d) in cfg.cache.device.iter().enumerate().filter(|(i, _)| !absent[*i]) {
            owner.lock_device(&d.path, &format!("cache.device[{i}].path"), &meta_dir).map_err(StartError::Refused)?;
        }
        let mut overlay = crate::vdisk_overlay::Overlay::load(&meta_dir).map_err(StartError::Config)?;
        let listed: Vec<std::path::PathBuf> = file_config.cache.device.iter().map(|d| d.path.clone()).collect();
        let on_list = |p: &std::path::Path| listed.iter().any(|l| crate::own_files::same_path(l, p));
        let caught_up = overlay.removed_devices.iter().any(|p| !on_list(p))
            || overlay.added_devices.iter().any(|d| on_list(&d.path));
        if caught_up {
            overlay.change(&meta_dir, |o| o.forget_devices_not_in(&listed)).map_err(StartError::Config)?;
        }
        let mut merged = cfg.clone();
        for note in overlay.apply(&mut merged) {
            tracing::info!("{note}");
        }
        let cluster = merged.cluster.as_ref().map(|c| c.check()).transpose().map_err(StartError::Config)?;
        // A cluster node's vDisks that moved away while it was down are not served here,
        // and their cached blocks are dropped below, unwritten (`start_check.rs`).
        // The others are claimed under a lease the membership agent adopts (`claims.rs`).
        let (moved, start_lease) = match &cluster {
            Some(c) => {
                let names: Vec<String> = merged.vdisk.iter().map(|v| v.name.clone()).collect();
                let wait = crate::cluster::start_check::wait(c);
                let (moved, lease) =
                    crate::cluster::start_check::moved_away_and_claim(c, &names, wait).map_err(StartError::Refused)?;
                (moved, Some(lease))
            }
            None => (Vec::new(), None),
        };
        merged.vdisk.retain(|v| !moved.iter().any(|(n, _)| *n == v.name));
        if merged.vdisk.is_empty() && !moved.is_empty() {
            let list: Vec<String> = moved.iter().map(|(v, n)| format!("`{v}` (on {n})")).collect();
            return Err(StartError::Refused(format!(
                "every vDisk this node serves moved to (or is claimed by) another node: {}. Its cached blocks of them are older than what those nodes wrote and must not be written back: add a vDisk this node serves, or start with `--discard-dirty NAME` for each after removing them from the config. Nothing was changed.",
                list.join(", ")
            )));
        }
        let cfg = &merged;
        let r: Resolved = cfg.resolve().map_err(StartError::Config)?;
        let own = crate::own_files::OwnFiles::of(cfg);
        // The file's vDisks were checked with its paths above; those the API's overlay
        // added (or changed) are checked here.
        let from_overlay = |v: &crate::config::VdiskConfig| {
            !file_config.vdisk.iter().any(|f| f.name == v.name && f.backing == v.backing)
        };
        for (i, v) in cfg.vdisk.iter().enumerate().filter(|(_, v)| from_overlay(v)) {
            own.check_backing(&v.backing, &format!("vdisk[{i}] ({}).backing", v.name)).map_err(StartError::Config)?;
        }
        let places = places(cfg)?;
        if cfg.vssd.is_none() {
            crate::vssd::startup::check_not_dropped(&meta_dir).map_err(StartError::Config)?;
        }
        let mut engine_cfg = engine_config(&r);
        // The metadata's geometry: every device's slots (or what `max_size` lays out).
        let meta_slots = r.engine_slots();
        // A cache store per peer this node borrows from, after the local one; blocks there
        // are never dirty.
        let peer_links = cluster.as_ref().filter(|c| !c.peers.is_empty()).map(|c| {
            let slots = c.borrow_bytes / r.cache.block_size;
            engine_cfg.stores =
                (0..c.peers.len()).map(|i| cachevisor_engine::StoreSpec::lent(i as u16 + 1, slots)).collect();
            Arc::new(crate::cluster::peer_device::PeerLinks {
                me: c.name.clone(),
                peers: c.peers.clone(),
                certs: c.peer_tls_dir.clone().expect("checked: borrowing needs peer_tls_dir"),
                borrow_slots: slots,
                op_timeout: std::time::Duration::from_millis(c.timing.lease_ttl_ms),
                cluster: Default::default(),
                restarted: Default::default(),
                down: Default::default(),
                busy: Default::default(),
            })
        });
        // Laid out for `cache.max_size`, its tables for `cache.size` (the engine's
        // `growable.rs`: a reload that grows the cache grows them).
        let mut engine =
            if r.max_slots > r.slots { Engine::new_growable(engine_cfg, r.slots) } else { Engine::new(engine_cfg) }
                .map_err(StartError::Config)?;
        engine.set_lent_write_through(true);
        if r.mirror_dirty {
            engine.set_mirror_dirty(true).map_err(|e| StartError::Config(format!("cache.mirror_dirty: {e}")))?;
        }
        engine.set_writeback_ahead(cfg.cache.writeback_ahead);
        check_ram_fits(r.ram_slots * r.cache.block_size).map_err(StartError::Config)?;
        engine.set_ram_tier(r.ram_slots, cfg.cache.ram_fill.unwrap_or_default());
        let (read, write) = cfg.cache.congestion_thresholds().map_err(StartError::Config)?;
        engine.set_congestion(read, write);
        engine.set_write_budget(cfg.cache.write_budget().map_err(StartError::Config)?);
        let ctl = first_controller(cfg, &r, &mut engine).map_err(StartError::Config)?;
        // Warm start: put every block the metadata knows back into its slot.
        let names: Vec<String> = cfg.vdisk.iter().map(|v| v.name.clone()).collect();
        // Metadata VM ids → engine VM ids; vDisks no longer configured get ids past the
        // configured ones, to be refused (dirty data) or dropped (clean) after the replay.
        let mut ids: std::collections::HashMap<u16, VmId> = Default::default();
        let mut orphans: Vec<String> = Vec::new();
        let mut bound: std::collections::HashMap<VmId, Identity> = Default::default();
        let mut expected_label = None;
        let mut seals = cachevisor_datapath::block_sums::Replayed::default();
        // The metadata's slots onto the devices as configured now (`device_relayout.rs`):
        // each recorded device found by its label wherever it is in the list.
        let recorded_slots = cachevisor_datapath::persist::recorded_slots(&meta_dir).map_err(StartError::Config)?;
        let found_labels: Vec<_> =
            cfg.cache.device.iter().map(|d| cachevisor_store::cache_label::read(&d.path)).collect();
        let mut relayout: Option<super::device_relayout::Relayout> = None;
        // One device is laid out for `max_size` (a resize withholds slots, `cache_resize.rs`).
        let layout_slots: Vec<u64> = if r.device_slots.len() > 1 { r.device_slots.clone() } else { vec![meta_slots] };
        let layout_for = |recorded: Option<&[cachevisor_store::journal::DeviceRow]>,
                          expected: Option<&cachevisor_store::cache_label::Expected>| {
            super::device_relayout::Relayout::for_replay(
                recorded,
                recorded_slots,
                &layout_slots,
                &found_labels,
                expected,
                (r.cache.block_size, &meta_dir),
            )
        };
        let (mut persist, rec) =
            Persistence::open(&meta_dir, r.cache.block_size, recorded_slots.unwrap_or(meta_slots), &mut |rep| {
                // A record naming a slot: the layout is the recorded one (a single device when
                // no `CacheDevices` came first).
                if matches!(rep, Record::Free { .. } | Record::Slot { .. } | Record::Mirror { .. })
                    && relayout.is_none()
                {
                    relayout = Some(layout_for(None, expected_label.as_ref())?);
                }
                let moved = |slot: u32, relayout: &Option<super::device_relayout::Relayout>| {
                    relayout.as_ref().expect("laid out above").slot(slot)
                };
                match rep {
                    Record::Vdisk { vm, name } => {
                        let id = names.iter().position(|n| *n == name).unwrap_or_else(|| {
                            orphans.push(name);
                            names.len() + orphans.len() - 1
                        });
                        ids.insert(vm, id as VmId);
                    }
                    Record::Binding { vm, identity } => {
                        let id =
                            *ids.get(&vm).ok_or(format!("backing binding of VM id {vm}, which has no vDisk name"))?;
                        bound.insert(id, identity);
                    }
                    Record::Free { slot } => match moved(slot, &relayout) {
                        Some(slot) => {
                            engine.release_slot(slot);
                            seals.free(slot);
                        }
                        None => relayout.as_mut().expect("laid out").gone_free(slot),
                    },
                    Record::Slot { slot, vm, block, valid, dirty, sums } => {
                        let id = *ids.get(&vm).ok_or(format!("slot {slot}: VM id {vm} has no vDisk name"))?;
                        let Some(slot) = moved(slot, &relayout) else {
                            let dirty = dirty.iter().any(|&w| w != 0);
                            if let Some(other) =
                                relayout.as_mut().expect("laid out").gone_block(&mut engine, slot, id, block, dirty)
                            {
                                seals.free(other);
                            }
                            return Ok(());
                        };
                        if let Some(r) = relayout.as_mut() {
                            r.forget_block(id, block);
                        }
                        engine.release_slot(slot);
                        if let Some(other) = engine.lookup(id, block) {
                            engine.release_slot(other); // the block moved; the later record wins
                            seals.free(other);
                        }
                        let spb = (r.cache.block_size / 512) as u32;
                        engine.restore_slot(
                            slot,
                            id,
                            block,
                            &bits_to_bools(&valid, spb),
                            &bits_to_bools(&dirty, spb),
                        )?;
                        seals.slot(slot, id, block, &dirty, sums);
                    }
                    Record::Mirror { slot, vm, block, sectors } => {
                        let id = *ids.get(&vm).ok_or(format!("slot {slot}: VM id {vm} has no vDisk name"))?;
                        // A mirror on a gone device: its block keeps one copy.
                        let Some(slot) = moved(slot, &relayout) else { return Ok(()) };
                        engine.release_slot(slot);
                        seals.free(slot);
                        let spb = (r.cache.block_size / 512) as u32;
                        engine.restore_mirror(slot, id, block, &bits_to_bools(&sectors, spb))?;
                    }
                    Record::CacheLabel(e) => expected_label = Some(e),
                    Record::CacheDevices(d) => relayout = Some(layout_for(Some(&d), expected_label.as_ref())?),
                    Record::Target { .. } => {}
                }
                Ok(())
            })
            .map_err(StartError::Config)?;
        // Mirror records paired with their blocks; a mirror whose block's record a cut
        // commit lost becomes the block (`dirty_mirror.rs`).
        let promoted = engine.settle_restored_mirrors();
        if promoted > 0 {
            tracing::info!(blocks = promoted, "dirty blocks recovered from their mirrors on another cache device");
        }
        let discard = |name: &str| opts.discard_dirty.iter().any(|n| n == name);
        let mut moved_away: Vec<crate::cluster::start_check::MovedAway> = moved
            .iter()
            .map(|(vdisk, node)| crate::cluster::start_check::MovedAway {
                vdisk: vdisk.clone(),
                node: node.clone(),
                dropped_blocks: 0,
                dropped_dirty: 0,
            })
            .collect();
        for (i, name) in orphans.iter().enumerate() {
            let id = (names.len() + i) as VmId;
            let dirty = engine.partition(id).dirty_blocks;
            if let Some(m) = moved_away.iter_mut().find(|m| m.vdisk == *name) {
                m.dropped_blocks = forget_vm(&mut engine, id);
                m.dropped_dirty = dirty;
                continue;
            }
            if dirty > 0 && !discard(name) {
                return Err(StartError::Refused(format!(
                    "{}: vDisk `{name}` has {dirty} dirty cached blocks but is not in the config. Add it back (same name and backing) so they are written back, or start with `--discard-dirty {name}` to drop them deliberately (the data they hold is lost). Nothing was changed.",
                    meta_dir.display()
                )));
            }
            let n = forget_vm(&mut engine, id);
            if dirty > 0 {
                tracing::warn!(vdisk = %name, blocks = n, dirty, "--discard-dirty: dropped the cached blocks of a vDisk that left the config, dirty ones included");
            }
        }
        // Each vDisk's backing as it is now, before anything is created: a missing file that
        // the cache was bound to is a mismatch too. NBD backings are connected to learn it.
        let mut nbd: Vec<Option<Backing>> = (0..cfg.vdisk.len()).map(|_| None).collect();
        for (i, v) in cfg.vdisk.iter().enumerate() {
            let current = match &places[i] {
                Place::Existing(id) => Some(id.clone()),
                Place::NewFile(_) => None,
                Place::Uri(uri) => {
                    let size = v.size.as_deref().map(parse_size).transpose().map_err(StartError::Config)?;
                    let b = Backing::open(&v.backing, size, v.grow, &format!("vdisk[{i}] ({})", v.name))
                        .map_err(StartError::Config)?;
                    let size = b.size().map_err(|source| StartError::File { path: uri.clone(), error: source })?;
                    nbd[i] = Some(b);
                    Some(Identity::Nbd { uri: uri.clone(), size })
                }
            };
            // The vDisk's size as the engine checks every block against (`disk_range.rs`):
            // one whose blocks do not fit a block key is refused here, before anything is
            // created; blocks the metadata holds past its end are dropped (clean) or refuse
            // the start (dirty). It is the size the store has once opened: the configured
            // `size` when given (an existing store must have it, or grow to it with
            // `grow = true`; opening refuses anything else), else the store's own.
            let configured = v.size.as_deref().map(parse_size).transpose().map_err(StartError::Config)?;
            let size = match (configured, &current) {
                (Some(s), _) => cachevisor_store::backing::vdisk_size(s),
                (None, Some(c)) => cachevisor_store::backing::vdisk_size(c.size()),
                (None, None) => 0, // refused when opened: a missing store needs `size`
            };
            engine
                .set_disk_size(i as VmId, size)
                .map_err(|e| StartError::Config(format!("vdisk[{i}] ({}): {}: {e}", v.name, v.backing.display())))?;
            drop_past_end(&mut engine, i as VmId, &v.name, discard(&v.name))?;
            let Some(recorded) = bound.get(&(i as VmId)) else { continue };
            let why = match &current {
                None => Some(format!(
                    "{} does not exist (the cache was bound to {})",
                    v.backing.display(),
                    recorded.describe()
                )),
                // The same store grown (e.g. `qemu-img resize` while stopped): still its blocks.
                Some(c) if c.same_store(recorded) && c.size() >= recorded.size() => None,
                Some(c) => c.differs_from(recorded),
            };
            let Some(why) = why else { continue };
            let p = engine.partition(i as VmId);
            if p.used == 0 {
                continue;
            }
            if p.dirty_blocks > 0 && !discard(&v.name) {
                return Err(StartError::Refused(format!(
                    "vdisk `{}`: {} dirty cached blocks belong to another backing store than `backing = \"{}\"`: {why}. Point `backing` back at the image they belong to and restart (they are then written back), or start with `--discard-dirty {}` to drop them deliberately (the data they hold is lost). Nothing was changed.",
                    v.name,
                    p.dirty_blocks,
                    v.backing.display(),
                    v.name
                )));
            }
            let n = forget_vm(&mut engine, i as VmId);
            if p.dirty_blocks > 0 {
                tracing::warn!(vdisk = %v.name, blocks = n, dirty = p.dirty_blocks, %why, "--discard-dirty: the backing store changed; dropped the vDisk's cached blocks, dirty ones included");
            } else {
                tracing::info!(vdisk = %v.name, blocks = n, %why, "the backing store changed; dropped the vDisk's clean cached blocks");
            }
        }
        for m in &moved_away {
            tracing::warn!(
                vdisk = %m.vdisk,
                node = %crate::log_safe(&m.node),
                dropped_blocks = m.dropped_blocks,
                dropped_dirty = m.dropped_dirty,
                "cluster: this vDisk moved to another node while this node was down: not served here; its cached blocks here are older than what that node wrote and were dropped, dirty ones unwritten (remove it from this node's config, or add it back through the API once it is to be served here)"
            );
        }
        for name in &opts.discard_dirty {
            if !names.contains(name) && !orphans.contains(name) {
                tracing::warn!(vdisk = %name, "--discard-dirty names a vDisk the cache does not know");
            }
        }
        // The devices must be those the metadata was written for, in that order
        // (`cache_devices.rs`): refused with dirty blocks, dropped when clean.
        let all_names: Vec<String> = names.iter().chain(&orphans).cloned().collect();
        // Devices the metadata recorded and the config no longer has (`device_relayout.rs`).
        let relayout = match relayout {
            Some(l) => l,
            None => layout_for(None, expected_label.as_ref()).map_err(StartError::Config)?,
        };
        let mut device_warnings: Vec<String> =
            super::cache_devices::check_gone(&engine, &relayout, &all_names, &discard)?.into_iter().collect();
        if !relayout.identity() {
            tracing::info!(
                "the cache's devices moved in the list: each was found by its label, and its blocks moved with it"
            );
        }
        // A device missing is run without only when the metadata was written with it.
        let recorded_here: Vec<bool> = (1..r.device_slots.len())
            .map(|i| recorded_slots.is_some() && expected_label.is_some() && relayout.recorded_here(i, &r.device_slots))
            .collect();
        // Each device must be the one the metadata describes (its label), or its blocks
        // are not served: refused with dirty ones, dropped when clean.
        let device_paths: Vec<&Path> = cfg.cache.device.iter().map(|d| d.path.as_path()).collect();
        let missing: Vec<bool> = absent.iter().zip(&recorded_here).map(|(&a, &here)| a && here).collect();
        // A new device (a new cache, or a changed list) is created now.
        for (i, d) in cfg.cache.device.iter().enumerate().filter(|(i, _)| absent[*i] && !missing[*i]) {
            owner.lock_device(&d.path, &format!("cache.device[{i}].path"), &meta_dir).map_err(StartError::Refused)?;
        }
        device_warnings.extend(super::cache_devices::check_labels(
            &mut engine,
            &device_paths,
            (&relayout.serials, &recorded_here, &missing),
            expected_label.as_ref(),
            &all_names,
            &discard,
            &meta_dir,
        )?);
        for w in &device_warnings {
            tracing::warn!("{w}");
        }
        let held = super::cache_devices::held_on(&engine, 0, &all_names);
        let found_label = cachevisor_store::cache_label::read(&cfg.cache.path);
        let verdict = cachevisor_store::cache_label::verdict(
            &found_label,
            expected_label.as_ref(),
            r.cache.block_size,
            &held,
            &discard,
            ("cache.path", &cfg.cache.path, &meta_dir),
        )
        .map_err(StartError::Refused)?;
        let mut cold_start = None;
        if let cachevisor_store::cache_label::Verdict::Cold(why) = &verdict {
            // vSSDs keep their guests' data in the same store: not served from another.
            let vssds = crate::vssd::meta::VssdMeta::names_on_disk(&meta_dir).map_err(StartError::Config)?;
            if let Some(names) = vssds.filter(|n| !n.is_empty()) {
                return Err(StartError::Refused(format!(
                    "cache.path: {} is not the cache store its metadata ({}) describes ({}), and vSSDs {} keep their data in it: put the store back and start again, or remove {}/vssd.checkpoint and vssd.journal to start those vSSDs empty (their data is lost). Nothing was changed.",
                    cfg.cache.path.display(),
                    meta_dir.display(),
                    why.as_deref().unwrap_or("it has no label"),
                    names.join(", "),
                    meta_dir.display()
                )));
            }
            super::cache_devices::empty_store(&mut engine, 0);
            if let Some(why) = why {
                tracing::warn!("cold start: the cache store is not the one its metadata describes: {why}");
                cold_start = Some(why.clone());
            }
        }
        let tls_required = cfg.listen.tls == cachevisor_nbd::tls::TlsMode::Require;
        // Every check passed: open and create what the config says.
        let mut backings = Vec::new();
        let mut exports = Vec::new();
        let mut identities = Vec::new();
        for (i, v) in cfg.vdisk.iter().enumerate() {
            let at = format!("vdisk[{i}] ({})", v.name);
            let b = match nbd[i].take() {
                Some(b) => b,
                None => {
                    let size = v.size.as_deref().map(parse_size).transpose().map_err(StartError::Config)?;
                    Backing::open(&v.backing, size, v.grow, &at).map_err(StartError::Config)?
                }
            };
            let err = |source| StartError::File { path: v.backing.display().to_string(), error: source };
            let size = b.size().map_err(err)?;
            debug_assert_eq!(size, engine.disk_size(i as VmId), "the size checked above is the store's");
            let identity = match &places[i] {
                Place::Uri(uri) => Identity::Nbd { uri: uri.clone(), size },
                _ => Identity::of_path(&v.backing).map_err(err)?.ok_or_else(|| {
                    StartError::Config(format!("{at}.backing: {} vanished while starting", v.backing.display()))
                })?,
            };
            identities.push(Some(identity.clone()));
            persist
                .record_binding(i as u16, &identity)
                .map_err(|source| StartError::File { path: meta_dir.display().to_string(), error: source })?;
            let vhost_user = crate::vhost_access::of(v.vhost_user.as_deref(), &v.allow, tls_required);
            exports.push(Some(Export {
                id: i as VmId,
                name: v.name.clone(),
                size,
                allow: v.allow.clone(),
                vhost_user,
            }));
            backings.push(std::sync::Arc::new(b));
        }
        let vssd_plan = cfg.vssd.as_ref().map(|v| v.resolve()).transpose().map_err(StartError::Config)?;
        // Past `cache.size` (a shrink a crash interrupted, or one made in the file while
        // stopped) the file keeps every slot the metadata still names, until the tail is
        // emptied below (the data path's `cache_resize.rs`).
        let named_slots =
            (r.slots..r.max_slots).rev().find(|&s| engine.slot_block(s as u32).is_some()).map_or(r.slots, |s| s + 1);
        let store_bytes = cachevisor_store::cache_label::DATA_OFFSET
            + match &vssd_plan {
                Some(p) => crate::vssd::startup::store_bytes(r.cache.cache_bytes, p),
                None => named_slots * r.cache.block_size,
            };
        let (ssd, direct) = cachevisor_store::backing::open_cache_store(&cfg.cache.path, store_bytes, cfg.cache.direct)
            .map_err(|source| StartError::File { path: cfg.cache.path.display().to_string(), error: source })?;
        let device_files: Vec<(&Path, u64, bool)> = device_paths
            .iter()
            .zip(&r.device_slots[1..])
            .zip(&missing)
            .map(|((&p, &slots), &gone)| (p, slots, gone))
            .collect();
        let devices = super::cache_devices::open(&device_files, r.cache.block_size, cfg.cache.direct)?;
        let mut recovery =
            Recovery { journal_records: rec.journal_records, torn_tail: rec.torn_tail, ..Recovery::default() };
        for vm in 0..names.len() {
            let p = engine.partition(vm as VmId);
            recovery.blocks += p.used;
            recovery.dirty_blocks += p.dirty_blocks;
        }
        let targets: Vec<u64> = (0..names.len()).map(|v| engine.partition(v as VmId).target).collect();
        // The checkpoint names the label first, then the label is written (a crash between
        // leaves the previous generation's label, which the checkpoint still accepts).
        let generation = persist.next_generation();
        let (label, previous) = match verdict {
            cachevisor_store::cache_label::Verdict::Warm { id, found } => {
                (cachevisor_store::cache_label::Label { id, generation, block_size: r.cache.block_size }, found)
            }
            // The cache's other devices keep their blocks and the cache its identity (their
            // labels derive from it); the first device's were dropped.
            cachevisor_store::cache_label::Verdict::Cold(_) if !devices.is_empty() && expected_label.is_some() => {
                let e = expected_label.expect("matched");
                (
                    cachevisor_store::cache_label::Label { id: e.id, generation, block_size: r.cache.block_size },
                    e.generation,
                )
            }
            cachevisor_store::cache_label::Verdict::Cold(_) => {
                (cachevisor_store::cache_label::Label::new(generation, r.cache.block_size), generation)
            }
        };
        persist.set_slots(meta_slots);
        persist.set_devices(&relayout.rows_now(&r.device_slots));
        persist.set_label(cachevisor_store::cache_label::Expected { id: label.id, generation, previous });
        // Blocks sealed before the stop keep their checksums (reads of them are checked).
        let sums = cachevisor_datapath::block_sums::BlockSums::new(r.cache.block_size);
        recovery.sealed_blocks = seals.apply(&mut engine, &sums) as u64;
        persist
            .checkpoint(&engine, &names, &targets, &ssd, &|r| sums.of_record(r))
            .map_err(|source| StartError::File { path: meta_dir.display().to_string(), error: source })?;
        cachevisor_store::cache_label::write(&ssd, &label)
            .map_err(|source| StartError::File { path: cfg.cache.path.display().to_string(), error: source })?;
        super::cache_devices::write_labels(&devices, &device_paths, &relayout.serials, &label)?;
        if !device_warnings.is_empty() {
            cold_start = Some(cold_start.into_iter().chain(device_warnings).collect::<Vec<_>>().join("; "));
        }
        recovery.cold_start = cold_start;
        if recovery.blocks > 0 {
            tracing::info!(
                blocks = recovery.blocks,
                dirty = recovery.dirty_blocks,
                sealed = recovery.sealed_blocks,
                journal_records = recovery.journal_records,
                torn_tail = recovery.torn_tail,
                "warm start"
            );
        }
        let schedule = cachevisor_engine::Schedule {
            interval_ns: r.interval_ns,
            samples: cachevisor_policy::controller::RECS_PERIODS,
            flusher: r.cache.writeback.flusher(r.cache.block_size),
            ..Default::default()
        };
        // Device threads mostly wait on devices (O_DIRECT cache reads and writes, misses on
        // slow backing stores); idle ones cost nothing (one is woken per queued op). Half
        // may run background write-backs: 16, an NBD backing's usual connection count.
        let threads = 32;
        let dp = Arc::new(DataPath::start(cachevisor_datapath::Setup {
            engine,
            persist,
            ssd,
            direct,
            devices,
            backings,
            names,
            threads,
            schedule,
            // Free slots kept durable ahead: writes that need a slot do not wait for a
            // commit; a small share of the cache (0.4%, at most 4 MiB of 4 KiB blocks).
            reserve: cachevisor_engine::durable_reserve(r.slots),
            error_threshold: cfg.cache.error_threshold,
            io_uring: cfg.cache.io_uring,
            peers: peer_links.clone().map(|l| {
                Arc::new(crate::cluster::peer_device::PeerStores(l))
                    as Arc<dyn cachevisor_datapath::injected::RemoteStores>
            }),
            sums,
            seal_after: std::time::Duration::from_nanos(r.seal_after_ns),
            faults: opts.faults.clone(),
        }));
        if r.max_slots > r.slots {
            let blocks = named_slots - r.slots;
            let moved = dp.shrink_cache(r.slots as u32, &mut |_, _| {}).map_err(|e| {
                StartError::Refused(format!(
                    "cache.size: emptying the slots past it ({blocks} of them hold blocks): {e}"
                ))
            })?;
            if blocks > 0 {
                tracing::info!(
                    blocks,
                    moved,
                    "cache.size: the blocks cached past it were moved into free slots, or written back and dropped"
                );
            }
        }
        let (vssd, vssd_exports) = match &vssd_plan {
            Some(p) => {
                let cache = (r.cache.cache_bytes, r.cache.block_size);
                let (svc, mut ex) = crate::vssd::startup::start(&cfg.cache.path, cache, p, &meta_dir, direct, &dp)
                    .map_err(StartError::Config)?;
                for e in &mut ex {
                    if let Some(d) = p.devices.iter().find(|d| d.name == e.name) {
                        e.vhost_user = crate::vhost_access::of(d.vhost_user.as_deref(), &d.allow, tls_required);
                    }
                }
                (Some(svc), ex)
            }
            None => (None, Vec::new()),
        };
        let policy = Arc::new(Mutex::new(policy::Policy::new(
            ctl,
            cfg.cache.partition == cachevisor_engine::PartitionMode::Static,
        )));
        let (observing, interval, sampling) = (policy.clone(), policy.clone(), policy.clone());
        if let Some(svc) = &vssd {
            // A shared budget splits by the vDisks' claim against the vSSDs'.
            let (claims, hits, block) = (policy.clone(), dp.clone(), r.cache.block_size);
            svc.set_cache_side(Box::new(move || {
                let (weight, ratio) = claims.lock().unwrap_or_else(|e| e.into_inner()).ctl.claim();
                crate::vssd::service::CacheSide { weight, ratio, hit_bytes: hits.hit_blocks_total() * block }
            }));
        }
        dp.set_hooks(
            Some(Box::new(move |req| {
                let mut p = observing.lock().unwrap_or_else(|e| e.into_inner());
                if p.ctl.observes() {
                    p.ctl.observe(req);
                }
                if let Some(c) = p.cluster_est.as_mut() {
                    c.observe(req);
                }
            })),
            Some(Box::new(move |engine| interval.lock().unwrap_or_else(|e| e.into_inner()).interval(engine))),
            Some(Box::new(move |engine, k, of| {
                sampling.lock().unwrap_or_else(|e| e.into_inner()).sample(engine, k, of)
            })),
        );
        // NBD_CMD_CACHE hints are paced as a prewarm is.
        let (_, pacing) = cfg.prewarm.resolve(r.cache.block_size).map_err(StartError::Config)?;
        dp.set_hint_pacing(pacing.pace, pacing.max_run);
        // A cluster that shares snapshots: this node's go to SNAPSHOTS/NAME.
        let mut prewarm_cfg = cfg.prewarm.clone();
        if let Some(c) = &cluster {
            check_shared_snapshots(c, &cfg.prewarm).map_err(StartError::Config)?;
            prewarm_cfg.snapshot_dir = c.snapshots_of(&c.name);
        }
        let snapshots = super::prewarming::Snapshots::new(&prewarm_cfg, &meta_dir)
            .map_err(|error| StartError::File { path: "prewarm.snapshot_dir".into(), error })?;
        Ok(Daemon {
            metrics: Default::default(),
            exports: RwLock::new(exports),
            overlay: Mutex::new(overlay),
            block_size: r.cache.block_size,
            resolved: r,
            dp,
            policy,
            identities: Mutex::new(identities),
            recovery,
            meta_dir,
            job: Default::default(),
            prewarm: Default::default(),
            snapshots: Mutex::new(snapshots),
            owner: Mutex::new(Some(owner)),
            guards: Default::default(),
            tls,
            vssd,
            vssd_exports,
            cluster: std::sync::OnceLock::new(),
            start_lease: Mutex::new(start_lease),
            peer_links,
            no_replica: Mutex::new(cfg.vdisk.iter().filter(|v| !v.replicates()).map(|v| v.name.clone()).collect()),
            replicator: std::sync::OnceLock::new(),
            moved_away,
            migrations: std::sync::OnceLock::new(),
            source: opts.source.clone(),
            file_config: Mutex::new(file_config),
            cache_devices: Mutex::new(
                std::iter::once(cfg.cache.path.clone())
                    .chain(cfg.cache.device.iter().map(|d| d.path.clone()))
                    .collect(),
            ),
            own,
            carried: Default::default(),
            swap: Default::default(),
        })
    }
}

/// `cluster.snapshots` names an existing directory (on storage every node reads; a
/// mistyped path is refused, never built), and this node's snapshots go there only.
fn check_shared_snapshots(
    c: &crate::config::cluster_section::ClusterSettings,
    prewarm: &crate::config::PrewarmConfig,
) -> Result<(), String> {
    let Some(d) = &c.snapshots else { return Ok(()) };
    if prewarm.snapshot_dir.is_some() {
        return Err("cluster.snapshots: this node's snapshots go to SNAPSHOTS/NAME where every node can read them; remove prewarm.snapshot_dir".into());
    }
    if !d.is_dir() {
        return Err(format!(
            "cluster.snapshots: `{}` is not a directory (it must exist, on storage every node reads)",
            crate::log_safe(&d.display().to_string())
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_shared_snapshots;

    #[test]
    fn shared_snapshots_must_exist_and_are_the_only_snapshot_directory() {
        let dir = tempfile::tempdir().unwrap();
        let c = |snapshots: &str| {
            let text = format!(
                "name = \"a\"\naddress = \"10.0.0.1:1\"\netcd = [\"http://h:1\"]\nsnapshots = \"{}\"",
                dir.path().join(snapshots).display()
            );
            toml::from_str::<crate::config::cluster_section::ClusterConfig>(&text).unwrap().check().unwrap()
        };
        let mut prewarm = crate::config::PrewarmConfig::default();
        check_shared_snapshots(&c("."), &prewarm).unwrap();
        assert_eq!(c(".").snapshots_of("a"), Some(dir.path().join(".").join("a")));
        let e = check_shared_snapshots(&c("missing"), &prewarm).unwrap_err();
        assert!(e.contains("cluster.snapshots") && e.contains("missing"), "{e}");
        prewarm.snapshot_dir = Some(dir.path().to_path_buf());
        let e = check_shared_snapshots(&c("."), &prewarm).unwrap_err();
        assert!(e.contains("cluster.snapshots") && e.contains("prewarm.snapshot_dir"), "{e}");
    }
}

/// `cache.ram` of `bytes` against this host's memory (`/proc/meminfo`'s MemTotal): a
/// tier larger than the host is an operator's typo ("4TiB" for "4GiB"), refused by name
/// before anything is allocated (unknown memory: no check).
fn check_ram_fits(bytes: u64) -> Result<(), String> {
    if bytes == 0 {
        return Ok(());
    }
    let Some(total) = host_memory_bytes() else { return Ok(()) };
    if bytes >= total {
        return Err(format!(
            "cache.ram: {} is more than this host's memory ({}): the RAM tier must fit in memory beside everything else",
            cachevisor_trace::units::format_size(bytes),
            cachevisor_trace::units::format_size(total)
        ));
    }
    Ok(())
}

/// This host's memory in bytes (`MemTotal` of `/proc/meminfo`).
fn host_memory_bytes() -> Option<u64> {
    let text = cachevisor_files::bounded_read::read_to_string(std::path::Path::new("/proc/meminfo"), 64 << 10).ok()?;
    let kib: u64 =
        text.lines().find_map(|l| l.strip_prefix("MemTotal:"))?.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod ram_tests {
    #[test]
    fn a_ram_tier_past_the_host_s_memory_is_refused_by_name() {
        assert!(super::check_ram_fits(0).is_ok() && super::check_ram_fits(4096).is_ok());
        let total = super::host_memory_bytes().expect("/proc/meminfo");
        let e = super::check_ram_fits(total).unwrap_err();
        assert!(e.contains("cache.ram") && e.contains("more than this host's memory"), "{e}");
        assert!(super::check_ram_fits(u64::MAX).is_err());
    }
}
