//! The metadata's slots moved onto the cache's devices as the config lists them now: a
//! device added, removed, or moved in `[[cache.device]]` while the daemon was down keeps
//! the cache warm on every device still there.
//!
//! Slot ids run over the devices in order, so the metadata's slot ids name places in the
//! device list it was written with (`Record::CacheDevices`). Each device carries a label
//! whose identity folds in the device's *serial* (`cache_label::Label::device_id`), given
//! once when the device joins and recorded beside its slots, so a start finds each
//! recorded device among the configured ones by its label, wherever it is now:
//! - the first device (`[cache] path`, serial 0) stays first: its label is the cache's
//!   identity and gets its own verdict (`cache_label::verdict`); resized, every recorded
//!   device counts as gone;
//! - a configured device whose label names a recorded serial (same block size, a
//!   generation the metadata accepts, the same slots) is that device: its records move to
//!   its slots now;
//! - a configured device in the place of a recorded one of the same size whose label
//!   names no recorded device (emptied, replaced, missing) is taken as that one, and its
//!   label gets the verdict it gets today (`cache_devices.rs`: refused with dirty blocks
//!   only it held, run without when missing);
//! - any other configured device is new (a new serial, empty);
//! - a recorded device matched by none is *gone*: its clean blocks are dropped, a dirty
//!   block with a mirror on a device still there is served from it
//!   (`Engine::settle_restored_mirrors`), and dirty blocks only it held refuse the start,
//!   naming their vDisks, unless each is discarded (`--discard-dirty`).
//!
//! Hand-written: bookkeeping over the metadata's own records.

use cachevisor_engine::Engine;
use cachevisor_store::cache_label::{self, Expected, Label};
use cachevisor_store::journal::DeviceRow;
use cachevisor_trace::VmId;
use std::collections::HashMap;

/// Where each recorded device's slots are now.
pub(super) struct Relayout {
    /// Per recorded device: its first slot then, its slots, and its first slot now
    /// (`None`: gone).
    rows: Vec<(u64, u64, Option<u64>)>,
    /// The serial of each configured device.
    pub(super) serials: Vec<u16>,
    /// Blocks recorded in a gone device's slots, by recorded slot: VM, block, dirty.
    gone: HashMap<u32, (VmId, u64, bool)>,
}

/// Whether a recorded device with `serial` carries `found`, given the cache's label.
fn carries(found: &Result<Label, String>, expected: &Expected, serial: u16, block_size: u64) -> bool {
    let want = Expected { id: Label::device_id(&expected.id, serial), ..*expected };
    cache_label::check(found, &want, block_size).is_ok()
}

impl Relayout {
    /// Matches the `recorded` devices to the `configured` ones (slots each; `found`: the
    /// label each configured device after the first carries now), given the cache's label
    /// (`None`: none recorded — only an unchanged list keeps its places).
    pub(super) fn plan(
        recorded: &[DeviceRow],
        configured: &[u64],
        found: &[Result<Label, String>],
        expected: Option<&Expected>,
        block_size: u64,
    ) -> Relayout {
        let mut now: Vec<Option<usize>> = vec![None; recorded.len()];
        let mut taken = vec![false; configured.len()];
        if recorded[0].slots == configured[0] {
            (now[0], taken[0]) = (Some(0), true);
            // By label first (the device wherever it is now), then by place.
            if let Some(e) = expected {
                for (i, f) in found.iter().enumerate().map(|(i, f)| (i + 1, f)) {
                    let same = |j: usize| {
                        now[j].is_none()
                            && recorded[j].slots == configured[i]
                            && carries(f, e, recorded[j].serial, block_size)
                    };
                    if let Some(j) = (1..recorded.len()).find(|&j| same(j)) {
                        (now[j], taken[i]) = (Some(i), true);
                    }
                }
            }
            let unchanged = recorded.iter().map(|r| r.slots).eq(configured.iter().copied());
            for i in 1..configured.len().min(recorded.len()) {
                let labelled = expected.is_some_and(|e| {
                    (0..recorded.len()).any(|j| carries(&found[i - 1], e, recorded[j].serial, block_size))
                });
                let by_place = if expected.is_some() { !labelled } else { unchanged };
                if !taken[i] && now[i].is_none() && recorded[i].slots == configured[i] && by_place {
                    (now[i], taken[i]) = (Some(i), true);
                }
            }
        }
        let mut used: Vec<u16> = recorded.iter().map(|r| r.serial).collect();
        let serials = (0..configured.len())
            .map(|i| match now.iter().position(|&n| n == Some(i)) {
                Some(j) => recorded[j].serial,
                None if i == 0 => 0, // the cache's own identity
                None => {
                    // Fewer devices than serials (the store table holds < 2^16 rows).
                    let s = DeviceRow::next_serial(&used).expect("a free serial");
                    used.push(s);
                    s
                }
            })
            .collect();
        let starts = |slots: &mut dyn Iterator<Item = u64>| -> Vec<u64> {
            slots
                .scan(0u64, |at, n| {
                    let first = *at;
                    *at += n;
                    Some(first)
                })
                .collect()
        };
        let then = starts(&mut recorded.iter().map(|r| r.slots));
        let first_now = starts(&mut configured.iter().copied());
        let rows =
            recorded.iter().zip(&then).zip(&now).map(|((r, &t), n)| (t, r.slots, n.map(|i| first_now[i]))).collect();
        Relayout { rows, serials, gone: HashMap::new() }
    }

    /// The layout a replay reads the metadata in `meta_dir` with: `recorded` (its
    /// `Record::CacheDevices`; `None`: one device of `recorded_slots`) onto `configured`.
    /// One device then and now, of another size, is the geometry error it always was (a
    /// changed `cache.size`/`max_size` is a resize, not a new device).
    pub(super) fn for_replay(
        recorded: Option<&[DeviceRow]>,
        recorded_slots: Option<u64>,
        configured: &[u64],
        found: &[Result<Label, String>],
        expected: Option<&Expected>,
        (block_size, meta_dir): (u64, &std::path::Path),
    ) -> Result<Relayout, String> {
        // No metadata (a new cache): the devices as configured, nothing to move.
        let Some(recorded_slots) = recorded_slots else {
            return Ok(Relayout::plan(&DeviceRow::in_order(configured), configured, found, expected, block_size));
        };
        let one = [DeviceRow { serial: 0, slots: recorded_slots }];
        let recorded = recorded.unwrap_or(&one);
        if recorded.len() == 1 && configured.len() == 1 && recorded_slots != configured[0] {
            return Err(format!(
                "{}: the cache was written with {recorded_slots} slots of {block_size} bytes, the config asks for {} of {block_size}; restore the old cache settings, or delete {} to start cold (cached dirty data would be lost)",
                meta_dir.join("checkpoint").display(),
                configured[0],
                meta_dir.display()
            ));
        }
        Ok(Relayout::plan(recorded, configured, found, expected, block_size))
    }

    /// Whether every recorded slot keeps its id (the list as it was).
    pub(super) fn identity(&self) -> bool {
        self.rows.iter().all(|&(then, _, now)| now == Some(then))
    }

    /// The recorded devices no configured one is (their index in the record).
    pub(super) fn gone_devices(&self) -> Vec<usize> {
        (0..self.rows.len()).filter(|&j| self.rows[j].2.is_none()).collect()
    }

    /// Whether configured device `i` is one the metadata recorded.
    pub(super) fn recorded_here(&self, i: usize, configured: &[u64]) -> bool {
        let first: u64 = configured[..i].iter().sum();
        self.rows.iter().any(|r| r.2 == Some(first) && r.1 == configured[i])
    }

    /// The devices as the metadata records them from now on.
    pub(super) fn rows_now(&self, configured: &[u64]) -> Vec<DeviceRow> {
        self.serials.iter().zip(configured).map(|(&serial, &slots)| DeviceRow { serial, slots }).collect()
    }

    /// The recorded devices as text ("8192, 4096" slots), for messages.
    pub(super) fn recorded_text(&self) -> String {
        self.rows.iter().map(|r| r.1.to_string()).collect::<Vec<_>>().join(", ")
    }

    /// Recorded slot `slot`'s id now; `None` when its device is gone.
    pub(super) fn slot(&self, slot: u32) -> Option<u32> {
        let s = u64::from(slot);
        let &(then, _, now) = self.rows.iter().find(|&&(then, n, _)| (then..then + n).contains(&s))?;
        now.map(|first| (first + s - then) as u32)
    }

    /// A record put `vm`'s `block` in gone slot `slot` (`dirty`: with dirty sectors): the
    /// later record wins, so its place in `engine` (an earlier record's) is dropped:
    /// returned.
    pub(super) fn gone_block(
        &mut self,
        engine: &mut Engine,
        slot: u32,
        vm: VmId,
        block: u64,
        dirty: bool,
    ) -> Option<u32> {
        let other = engine.lookup(vm, block);
        if let Some(other) = other {
            engine.release_slot(other);
        }
        self.forget_block(vm, block);
        self.gone.insert(slot, (vm, block, dirty));
        other
    }

    /// A later record put `vm`'s `block` elsewhere: what a gone slot held of it is stale.
    pub(super) fn forget_block(&mut self, vm: VmId, block: u64) {
        self.gone.retain(|_, g| (g.0, g.1) != (vm, block));
    }

    /// Gone slot `slot` was freed.
    pub(super) fn gone_free(&mut self, slot: u32) {
        self.gone.remove(&slot);
    }

    /// After the replay (and the mirrors' settling): per VM id, the clean blocks dropped
    /// with the gone devices, the dirty ones served from a mirror, and the dirty ones lost.
    pub(super) fn losses(&self, engine: &Engine, vms: usize) -> Vec<(u64, u64, u64)> {
        let mut per = vec![(0u64, 0u64, 0u64); vms];
        for &(vm, block, dirty) in self.gone.values() {
            let Some(p) = per.get_mut(vm as usize) else { continue };
            match (dirty, engine.lookup(vm, block).is_some()) {
                (false, _) => p.0 += 1,
                (true, true) => p.1 += 1,
                (true, false) => p.2 += 1,
            }
        }
        per
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(v: &[(u16, u64)]) -> Vec<DeviceRow> {
        v.iter().map(|&(serial, slots)| DeviceRow { serial, slots }).collect()
    }

    fn label(e: &Expected, serial: u16) -> Result<Label, String> {
        Ok(Label { id: Label::device_id(&e.id, serial), generation: e.generation, block_size: 4096 })
    }

    #[test]
    fn devices_are_found_by_their_serials_wherever_they_are_now() {
        let e = Expected { id: [7; 16], generation: 5, previous: 4 };
        let rec = rows(&[(0, 10), (1, 20), (2, 30)]);
        // The same list: every slot keeps its id.
        let r = Relayout::plan(&rec, &[10, 20, 30], &[label(&e, 1), label(&e, 2)], Some(&e), 4096);
        assert!(r.identity());
        assert_eq!(r.serials, vec![0, 1, 2]);
        // The second and third swapped: slots move with their devices.
        let r = Relayout::plan(&rec, &[10, 30, 20], &[label(&e, 2), label(&e, 1)], Some(&e), 4096);
        assert_eq!(
            (r.slot(5), r.slot(10), r.slot(29), r.slot(30), r.slot(59)),
            (Some(5), Some(40), Some(59), Some(10), Some(39))
        );
        assert_eq!(r.serials, vec![0, 2, 1]);
        // The second removed, a new one appended: its slots gone, the third's moved down,
        // the new one a new serial.
        let r = Relayout::plan(&rec, &[10, 30, 8], &[label(&e, 2), Err("empty".into())], Some(&e), 4096);
        assert_eq!((r.slot(10), r.slot(30), r.slot(31)), (None, Some(10), Some(11)));
        assert_eq!((r.gone_devices(), r.serials.clone()), (vec![1], vec![0, 2, 3]));
        // The second emptied (no label) in its place: taken as itself (its label's verdict
        // comes after); the first resized: everything gone.
        let r = Relayout::plan(&rec, &[10, 20, 30], &[Err("zeros".into()), label(&e, 2)], Some(&e), 4096);
        assert!(r.identity());
        let r = Relayout::plan(&rec, &[12, 20, 30], &[label(&e, 1), label(&e, 2)], Some(&e), 4096);
        assert_eq!(r.gone_devices(), vec![0, 1, 2]);
        assert_eq!(r.serials, vec![0, 3, 4]);
        // A stale device (a generation the metadata does not accept) is not the one.
        // Recorded serials at u16's end (metadata that says so): a new one still fits.
        let top = rows(&[(0, 4), (u16::MAX, 4)]);
        let r = Relayout::plan(&top, &[4, 4, 4], &[label(&e, u16::MAX), Err("new".into())], Some(&e), 4096);
        assert_eq!(r.serials, vec![0, u16::MAX, 1]);
        let old = Expected { generation: 2, previous: 1, ..e };
        let r = Relayout::plan(&rec, &[10, 30], &[label(&old, 2)], Some(&e), 4096);
        assert_eq!(r.gone_devices(), vec![1, 2]);
    }

    #[test]
    fn slots_map_one_to_one_onto_the_devices_kept() {
        let e = Expected { id: [3; 16], generation: 9, previous: 8 };
        let rec = rows(&[(0, 4), (5, 3), (2, 6)]);
        let r = Relayout::plan(&rec, &[4, 6, 2], &[label(&e, 2), Err("new".into())], Some(&e), 4096);
        let mapped: Vec<Option<u32>> = (0..13).map(|s| r.slot(s)).collect();
        let kept: Vec<u32> = mapped.iter().flatten().copied().collect();
        let mut sorted = kept.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), kept.len(), "one to one: {mapped:?}");
        assert!(kept.iter().all(|&s| s < 12), "inside the new layout: {mapped:?}");
        assert_eq!(mapped.iter().filter(|m| m.is_none()).count(), 3, "the 3 slots of serial 5 are gone");
    }
}
