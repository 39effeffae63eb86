//! The cache's devices at start (`[cache] path` and each `[[cache.device]]`, stores
//! 0.. of the engine's table, one allocation over all): each locked, checked against
//! what the metadata says was on it, opened, and labelled.
//!
//! What can go wrong while the daemon is down, and what a start does then:
//! - **the device list changed** (one added, removed, resized or moved): each recorded
//!   device is found by its label wherever it is now and its slots move with it
//!   (`device_relayout.rs`); dirty blocks only a device no longer there held refuse the
//!   start, naming the vDisks; its clean blocks are dropped and the start says so;
//! - **a device is not the one the metadata describes** (emptied, replaced, another
//!   cache's): each device carries the cache's label with its serial folded into the
//!   identity (`cache_label::Label::device_id`); a device taken by its place
//!   whose label does not match gets the verdict the first device gets
//!   (`cache_label::verdict`) on the blocks recorded *on it*: refused with dirty ones,
//!   its clean blocks dropped and the others served;
//! - **a device is missing** (its path names nothing: a drive that did not come up, a file
//!   system not mounted) while the metadata was written with it: the start runs without
//!   it — not created there, failed in the engine (`device_failure.rs`) so nothing is
//!   placed on it, its clean blocks dropped and its mirrored dirty blocks served from
//!   their copies — and says so; with dirty blocks only it held, the start is refused,
//!   naming their vDisks (the first device, which carries the cache's identity, is
//!   created again as before: its dirty blocks' verdict is the label's).

use super::StartError;
use cachevisor_engine::{Engine, StoreId};
use cachevisor_store::cache_label::{self, Expected, Label, Verdict};
use std::fs::File;
use std::path::Path;

/// The config's key for device `st` (`cache.path` for the first).
pub(super) fn key(st: StoreId) -> String {
    match st {
        0 => "cache.path".into(),
        i => format!("cache.device[{}].path", i - 1),
    }
}

/// `(vDisk, blocks, dirty blocks)` of each VM (`names` by VM id) on device `st`; the
/// dirty ones counted are those only it holds (a mirrored one has its copy on another:
/// `cache.mirror_dirty`).
pub(super) fn held_on(engine: &Engine, st: StoreId, names: &[String]) -> Vec<(String, u64, u64)> {
    let mut held: Vec<(String, u64, u64)> = names.iter().map(|n| (n.clone(), 0, 0)).collect();
    let (first, n) = engine.layout().range(st);
    for s in first..first + n {
        let Some((vm, _)) = engine.slot_block(s as u32) else { continue };
        if let Some(h) = held.get_mut(vm as usize) {
            h.1 += 1;
            h.2 += u64::from(engine.slot_dirty(s as u32) && !engine.slot_mirrored(s as u32));
        }
    }
    held
}

/// Device `st`'s bytes are not the metadata's (emptied, replaced): its dirty blocks with
/// a mirror on another device are served from there (and written back first), its
/// mirrors go, and the rest of its blocks are dropped (the caller refused the start if
/// dirty ones only it held were at stake, or the operator discarded them). Says what it
/// did in the log.
pub(super) fn empty_store(engine: &mut Engine, st: StoreId) {
    let loss = engine.empty_device(st);
    let mirrored: u64 = loss.mirrored_blocks.iter().map(|m| m.1).sum();
    if mirrored > 0 {
        tracing::warn!(device = %key(st), blocks = mirrored, "dirty blocks of a device that lost its contents are served from their mirrors on the others");
    }
}

/// The devices the metadata recorded and the config no longer has (`device_relayout.rs`,
/// after the replay and the mirrors' settling): dirty blocks only they held (not each
/// vDisk's discarded) refuse the start, naming the vDisks; otherwise a warning says what
/// went with them.
pub(super) fn check_gone(
    engine: &Engine,
    relayout: &super::device_relayout::Relayout,
    names: &[String],
    discard: &dyn Fn(&str) -> bool,
) -> Result<Option<String>, StartError> {
    let gone = relayout.gone_devices();
    if gone.is_empty() {
        return Ok(None);
    }
    let losses = relayout.losses(engine, names.len());
    let change = format!(
        "the cache's devices changed: the metadata was written for devices of [{}] blocks, and its device(s) {} are not in the config now (not found by their labels, or resized)",
        relayout.recorded_text(),
        gone.iter().map(|j| format!("#{j}")).collect::<Vec<_>>().join(", ")
    );
    let held: Vec<(String, u64, u64)> =
        names.iter().zip(&losses).map(|(n, l)| (n.clone(), l.0 + l.1 + l.2, l.2)).collect();
    if let Some((list, flags)) = cache_label::dirty_at_stake(&held, discard, engine.config().block_size) {
        return Err(StartError::Refused(format!(
            "cache.device: {change}. Dirty blocks only those devices held: {list}. Put the devices back in the config (any place in the list: each is found by its label) and start again (then flush, `cachevisor destage`, before removing one), or start with `{flags}` to drop them deliberately (what they held is lost). Nothing was changed."
        )));
    }
    let sum = |f: fn(&(u64, u64, u64)) -> u64| losses.iter().map(f).sum::<u64>();
    let (clean, mirrored, discarded) = (sum(|l| l.0), sum(|l| l.1), sum(|l| l.2));
    Ok(Some(format!(
        "{change}: their {clean} clean blocks were dropped, {mirrored} mirrored dirty blocks are served from their copies{}; the devices still configured keep their blocks",
        if discarded > 0 { format!(", {discarded} dirty blocks dropped by --discard-dirty") } else { String::new() }
    )))
}

/// The label the device of `serial` must carry, given the cache's (`expected`, device 0's).
fn expected_on(expected: Option<&Expected>, serial: u16) -> Option<Expected> {
    expected.map(|e| Expected { id: Label::device_id(&e.id, serial), ..*e })
}

/// Whether `path` names nothing (not a file, not a device node, not a dangling link).
pub(super) fn is_missing(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
}

/// Device `st` at `path` is missing (the metadata was written with it): refused when it
/// held dirty blocks with no copy elsewhere (not each vDisk's discarded); else failed in
/// the engine, with what that cost. Returns the warning the start logs.
fn run_without(
    engine: &mut Engine,
    st: StoreId,
    path: &Path,
    names: &[String],
    discard: &dyn Fn(&str) -> bool,
) -> Result<String, StartError> {
    let held = held_on(engine, st, names);
    if let Some((list, flags)) = cache_label::dirty_at_stake(&held, discard, engine.config().block_size) {
        return Err(StartError::Refused(format!(
            "{}: {} is missing, and the metadata records dirty blocks whose only copy was on it: {list}. Put the device back at that path and start again, or start with `{flags}` to drop them deliberately (what they held is lost; each backing store keeps what was written back before). Nothing was changed.",
            key(st),
            path.display(),
        )));
    }
    let loss = engine.empty_device(st);
    let mirrored: u64 = loss.mirrored_blocks.iter().map(|m| m.1).sum();
    let discarded: u64 = loss.dirty_blocks.iter().map(|m| m.1).sum();
    engine.fail_device(st);
    Ok(format!(
        "{}: {} is missing: the cache runs without it (FAILED in `cache status`); its {} clean blocks were dropped, {mirrored} mirrored dirty blocks are served from their copies on the other devices and written back first{}. Put a device back at that path (an empty one is taken) and restart to use it again",
        key(st),
        path.display(),
        loss.clean_blocks,
        if discarded > 0 { format!(", {discarded} dirty blocks dropped by --discard-dirty") } else { String::new() }
    ))
}

/// Checks the label of each device after the first that the metadata recorded
/// (`recorded`; each of `serials`) against the metadata's: a device whose label does not
/// match has its blocks dropped (clean, or discarded) or refuses the start (dirty); one
/// `missing` (see [`is_missing`]) is run without. A new device (not recorded) is taken
/// as it is (emptied: its label is written after the checkpoint). Returns a warning per
/// device dropped.
pub(super) fn check_labels(
    engine: &mut Engine,
    devices: &[&Path],
    (serials, recorded, missing): (&[u16], &[bool], &[bool]),
    expected: Option<&Expected>,
    names: &[String],
    discard: &dyn Fn(&str) -> bool,
    meta_dir: &Path,
) -> Result<Vec<String>, StartError> {
    let block_size = engine.config().block_size;
    let mut warnings = Vec::new();
    for (i, path) in devices.iter().enumerate() {
        let st = i as StoreId + 1;
        if missing[i] {
            warnings.push(run_without(engine, st, path, names, discard)?);
            continue;
        }
        if !recorded[i] {
            tracing::info!(device = %key(st), path = %path.display(), "a new device joins the cache");
            continue;
        }
        let found = cache_label::read(path);
        let held = held_on(engine, st, names);
        let want = expected_on(expected, serials[st as usize]);
        let verdict =
            cache_label::verdict(&found, want.as_ref(), block_size, &held, discard, (&key(st), path, meta_dir))
                .map_err(StartError::Refused)?;
        if let Verdict::Cold(Some(why)) = verdict {
            empty_store(engine, st);
            warnings.push(format!("cold start of {}: {why}", key(st)));
        }
    }
    Ok(warnings)
}

/// Opens each device after the first (`(path, slots, missing)`) for `block_size`-byte
/// blocks after its label; O_DIRECT as `direct` says, each device on its own; a missing
/// one is left alone (`None`: never created where a drive should be).
pub(super) fn open(
    devices: &[(&Path, u64, bool)],
    block_size: u64,
    direct: cachevisor_store::backing::DirectIo,
) -> Result<Vec<Option<(File, bool)>>, StartError> {
    devices
        .iter()
        .map(|&(path, slots, missing)| {
            if missing {
                return Ok(None);
            }
            cachevisor_store::backing::open_cache_store(path, cache_label::DATA_OFFSET + slots * block_size, direct)
                .map(Some)
                .map_err(|source| StartError::File { path: path.display().to_string(), error: source })
        })
        .collect()
}

/// Writes each device's label (device 0's is `label`, written by the caller): after the
/// checkpoint naming the generation, as for the first device.
pub(super) fn write_labels(
    devices: &[Option<(File, bool)>],
    paths: &[&Path],
    serials: &[u16],
    label: &Label,
) -> Result<(), StartError> {
    for (i, (d, path)) in devices.iter().zip(paths).enumerate() {
        let Some((f, _)) = d else { continue };
        let l = Label { id: Label::device_id(&label.id, serials[i + 1]), ..*label };
        cache_label::write(f, &l)
            .map_err(|source| StartError::File { path: path.display().to_string(), error: source })?;
    }
    Ok(())
}
