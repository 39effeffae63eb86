//! I/O classes per vDisk, Open-CAS's ioclass model at the block level: a request is
//! classified by its size, the byte range it falls in and its direction (the first class
//! that matches; none: unclassified), and each class may be
//! - **pinned**: its blocks are passed over as victims (as protected prewarmed blocks are,
//!   `slot_alloc.rs`: up to 64 looked at, then the first is taken after all) while the
//!   class holds no more than its cap;
//! - **capped** (`max_share` of the vDisk's partition, or of the cache in a shared pool):
//!   while it holds that many blocks its misses go around the cache;
//! - given its own **admission** policy (`block_admission.rs`), in place of the vDisk's;
//! - given an eviction **priority** (Open-CAS's: 0 to 255, lower stays longer; unset and
//!   unclassified: [`DEFAULT_PRIORITY`]): a block is passed over as a victim, as a pinned
//!   one is, while the vDisk holds blocks of a class of a higher number — those go
//!   first, each class in its policy's order.
//!
//! Each slot remembers the class of the request that inserted it (one byte a slot, only
//! once some vDisk has classes), so occupancy is counted per class, and hits and misses
//! per class of the request. Sans-IO state inside the engine.

use crate::block_admission::{Admission, AdmissionPolicy};
use cachevisor_trace::{Op, Request};

/// One class: what it matches and what it does.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct IoClass {
    /// Its name in reports.
    pub name: String,
    /// Request sizes it matches, bytes, inclusive.
    pub size: (u64, u64),
    /// Byte range of the vDisk it matches: a request starting in `[start, end)`.
    pub range: (u64, u64),
    /// Direction it matches (`None`: both).
    pub op: Option<Op>,
    /// Blocks passed over as victims while under the cap.
    pub pinned: bool,
    /// At most this share of the vDisk's partition (of the cache, shared), 0 < s ≤ 1.
    pub max_share: Option<f64>,
    /// Its misses' admission in place of the vDisk's.
    pub admission: Option<AdmissionPolicy>,
    /// Eviction priority, 0 to 255: lower stays longer.
    pub priority: u8,
    /// Matches only writes the client asked to be durable at once (NBD's FUA: `true`) or
    /// only the others (`false`); `None`: both.
    pub sync: Option<bool>,
}

/// The eviction priority of a class that sets none, and of unclassified blocks.
pub const DEFAULT_PRIORITY: u8 = 100;

impl IoClass {
    /// A class named `name` matching every request.
    pub fn named(name: &str) -> IoClass {
        IoClass {
            name: name.into(),
            size: (0, u64::MAX),
            range: (0, u64::MAX),
            op: None,
            pinned: false,
            max_share: None,
            admission: None,
            priority: DEFAULT_PRIORITY,
            sync: None,
        }
    }

    fn matches(&self, r: &Request, sync: bool) -> bool {
        let len = u64::from(r.len);
        (self.size.0..=self.size.1).contains(&len)
            && (self.range.0..self.range.1).contains(&r.offset)
            && self.op.is_none_or(|op| op == r.op)
            && self.sync.is_none_or(|s| s == sync)
    }
}

/// One class's figures (index 0 of a vDisk's: its unclassified requests).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ClassCounts {
    /// The class's name (`unclassified` for the rest).
    pub name: String,
    /// Blocks it holds now.
    pub cached_blocks: u64,
    /// Block hits of its requests.
    pub hits: u64,
    /// Block misses of its requests.
    pub misses: u64,
    /// Misses sent around the cache because it held its cap.
    pub rejected_at_cap: u64,
    /// Misses its own admission sent around the cache.
    pub rejected_by_admission: u64,
}

/// One vDisk's classes.
#[derive(Debug, Clone)]
struct VmClasses {
    classes: Vec<IoClass>,
    counts: Vec<ClassCounts>,
    admission: Vec<Option<Admission>>,
    /// Whether a class's priority differs from the default (else priorities are skipped).
    ranked: bool,
}

/// Every vDisk's classes and each slot's class (inside `Engine`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Classes {
    vms: Vec<Option<VmClasses>>,
    /// Per slot: 1 + the index of the class that inserted it; 0: unclassified.
    slot_class: Vec<u8>,
    /// Whether any vDisk has classes (everything here is skipped otherwise).
    any: bool,
    /// Submitted sync writes not dispatched yet.
    sync_ids: rustc_hash::FxHashSet<crate::ReqId>,
}

/// The most classes a vDisk may have.
pub const MAX_CLASSES: usize = 32;

impl Classes {
    /// Sets `vm`'s classes (its counts start afresh; blocks cached stay, counted as
    /// unclassified). `window`, `seed`, `block`, `capacity`: for a class's admission.
    pub(crate) fn set(&mut self, vm: u32, classes: Vec<IoClass>, window: usize, seed: u64, block: u64, capacity: u64) {
        let v = vm as usize;
        if self.vms.len() <= v {
            self.vms.resize_with(v + 1, || None);
        }
        let mut counts = vec![ClassCounts { name: "unclassified".into(), ..Default::default() }];
        counts.extend(classes.iter().map(|c| ClassCounts { name: c.name.clone(), ..Default::default() }));
        let admission = classes
            .iter()
            .enumerate()
            .map(|(i, c)| {
                c.admission.map(|p| Admission::new(p, p, window, seed ^ ((i as u64 + 1) << 32), block, capacity))
            })
            .collect();
        let ranked = classes.iter().any(|c| c.priority != DEFAULT_PRIORITY);
        self.vms[v] = (!classes.is_empty()).then_some(VmClasses { classes, counts, admission, ranked });
        self.any = self.vms.iter().any(Option::is_some);
        // Slots keep their byte; one whose class index no longer exists reads as unclassified.
    }

    #[inline]
    pub(crate) fn any(&self) -> bool {
        self.any
    }

    /// Every class admission's window (`Admission::set_window`).
    pub(crate) fn set_windows(&mut self, window: usize) {
        for c in self.vms.iter_mut().flatten() {
            for a in c.admission.iter_mut().flatten() {
                a.set_window(window);
            }
        }
    }

    /// The class (1 + index; 0: none) of `r`, a write the client asked to be durable at
    /// once when `sync`.
    #[inline]
    pub(crate) fn classify(&self, r: &Request, sync: bool) -> u8 {
        if !self.any {
            return 0;
        }
        let Some(Some(c)) = self.vms.get(r.vm as usize) else { return 0 };
        c.classes.iter().position(|k| k.matches(r, sync)).map_or(0, |i| i as u8 + 1)
    }

    /// Submitted request `id` is a write the client asked to be durable at once (kept
    /// only while some vDisk has classes, until its dispatch).
    pub(crate) fn note_sync(&mut self, id: crate::ReqId) {
        if self.any {
            self.sync_ids.insert(id);
        }
    }

    /// Whether request `id` was noted sync; forgets it.
    #[inline]
    pub(crate) fn take_sync(&mut self, id: crate::ReqId) -> bool {
        !self.sync_ids.is_empty() && self.sync_ids.remove(&id)
    }

    /// Counts a request's block hits and misses for its class.
    pub(crate) fn count(&mut self, vm: u32, class: u8, hits: u64, misses: u64) {
        if let Some(Some(c)) = self.vms.get_mut(vm as usize) {
            let k = &mut c.counts[class as usize];
            k.hits += hits;
            k.misses += misses;
        }
    }

    /// Whether a miss of class `class` of `vm` (block `key`) may take a slot, when the
    /// cap is `cap_blocks` of `partition` blocks: `Some(verdict)` when the class decides,
    /// `None` for the vDisk's own admission.
    pub(crate) fn admit(
        &mut self,
        vm: u32,
        class: u8,
        key: u64,
        write: bool,
        now_ms: u32,
        partition: u64,
    ) -> Option<bool> {
        if class == 0 {
            return None;
        }
        let c = self.vms.get_mut(vm as usize)?.as_mut()?;
        let i = class as usize;
        let k = c.classes.get(i - 1)?;
        if k.max_share.is_some_and(|s| c.counts[i].cached_blocks as f64 >= s * partition as f64) {
            c.counts[i].rejected_at_cap += 1;
            return Some(false);
        }
        let a = c.admission[i - 1].as_mut()?;
        let ok = a.admit(key, write, now_ms);
        if !ok {
            c.counts[i].rejected_by_admission += 1;
        }
        Some(ok)
    }

    /// Slot `s` now holds a block of `vm` that a request of `class` inserted.
    #[inline]
    pub(crate) fn inserted(&mut self, s: u32, vm: u32, class: u8) {
        if !self.any {
            return;
        }
        let i = s as usize;
        if self.slot_class.len() <= i {
            self.slot_class.resize(i + 1, 0);
        }
        self.slot_class[i] = class;
        if let Some(Some(c)) = self.vms.get_mut(vm as usize) {
            if let Some(k) = c.counts.get_mut(class as usize) {
                k.cached_blocks += 1;
            }
        }
    }

    /// Slot `s` of `vm` was emptied.
    #[inline]
    pub(crate) fn forgotten(&mut self, s: u32, vm: u32) {
        let Some(class) = self.slot_class.get_mut(s as usize) else { return };
        let class = std::mem::take(class);
        if let Some(Some(c)) = self.vms.get_mut(vm as usize) {
            if let Some(k) = c.counts.get_mut(class as usize) {
                k.cached_blocks = k.cached_blocks.saturating_sub(1);
            }
        }
    }

    /// Slot `s`'s block moved to slot `d`.
    pub(crate) fn moved(&mut self, s: u32, d: u32) {
        if let Some(c) = self.slot_class.get_mut(s as usize).map(std::mem::take) {
            let i = d as usize;
            if self.slot_class.len() <= i {
                self.slot_class.resize(i + 1, 0);
            }
            self.slot_class[i] = c;
        }
    }

    /// Whether slot `s` of `vm` is passed over as a victim: its class is pinned and holds
    /// no more than its cap of `partition` blocks, or `vm` holds blocks of a class of a
    /// higher priority number (evicted first).
    #[inline]
    pub(crate) fn pins(&self, s: u32, vm: u32, partition: u64) -> bool {
        let class = self.slot_class.get(s as usize).copied().unwrap_or(0) as usize;
        let Some(Some(c)) = self.vms.get(vm as usize) else { return false };
        // A class index that no longer exists reads as unclassified.
        let k = class.checked_sub(1).and_then(|i| c.classes.get(i));
        let class = if k.is_some() { class } else { 0 };
        let pinned = k.is_some_and(|k| {
            k.pinned && k.max_share.is_none_or(|sh| c.counts[class].cached_blocks as f64 <= sh * partition as f64)
        });
        if pinned || !c.ranked {
            return pinned;
        }
        let priority = |i: usize| if i == 0 { DEFAULT_PRIORITY } else { c.classes[i - 1].priority };
        let mine = priority(class);
        (0..c.counts.len()).any(|i| priority(i) > mine && c.counts[i].cached_blocks > 0)
    }

    /// `vm`'s classes' figures (its unclassified requests first).
    pub(crate) fn counts(&self, vm: u32) -> Option<Vec<ClassCounts>> {
        Some(self.vms.get(vm as usize)?.as_ref()?.counts.clone())
    }
}

/// A class as configured (`[[vdisk.class]]` in the daemon, `[[vm.class]]` in the
/// simulator): ranges and shares as text, checked by [`IoClassSection::resolve`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IoClassSection {
    /// Its name.
    pub name: String,
    /// Request sizes, `A-B` inclusive (`64KiB-`, `-4KiB`); unset: every size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    /// Byte range of the disk a request starts in, `A-B` (`0-1GiB`); unset: all of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<String>,
    /// `read` or `write`; unset: both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    /// Its blocks are passed over as victims while it holds no more than its cap.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pinned: bool,
    /// At most this share of the partition (`"20%"`); at it, its misses go around.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_occupancy: Option<String>,
    /// Its misses' admission in place of the vDisk's (`block_admission.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionPolicy>,
    /// Eviction priority, 0 to 255 (Open-CAS's): lower stays longer; unset: 100, as
    /// unclassified blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// `true`: only writes the client asked to be durable at once (NBD FUA); `false`:
    /// only the others; unset: both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<bool>,
}

impl IoClassSection {
    /// The engine's class; an error names the key.
    pub fn resolve(&self) -> Result<IoClass, String> {
        let name = &self.name;
        if name.is_empty() || name.len() > 64 || name == "unclassified" {
            return Err(format!("class `{name}`.name: 1 to 64 bytes, not `unclassified` (the rest's name)"));
        }
        let range = |v: &Option<String>, key: &str| {
            v.as_deref().map_or(Ok((0, u64::MAX)), |s| parse_range(s, &format!("class `{name}`.{key}")))
        };
        let size = range(&self.size, "size")?; // `A-B`: sizes from A to B, both included
        let op = match self.op.as_deref() {
            None => None,
            Some("read") => Some(Op::Read),
            Some("write") => Some(Op::Write),
            Some(o) => return Err(format!("class `{name}`.op: `{o}` is not read or write")),
        };
        let max_share = match self.max_occupancy.as_deref() {
            None => None,
            Some(t) => match cachevisor_trace::units::parse_percent(t) {
                Ok(v) if v > 0.0 => Some(v),
                Ok(_) => return Err(format!("class `{name}`.max_occupancy: `{t}` must be above 0%")),
                Err(e) => return Err(format!("class `{name}`.max_occupancy: {e}")),
            },
        };
        let priority = match self.priority {
            None => DEFAULT_PRIORITY,
            Some(p) => u8::try_from(p).map_err(|_| format!("class `{name}`.priority: {p} is outside 0 to 255"))?,
        };
        Ok(IoClass {
            name: name.clone(),
            size,
            range: range(&self.range, "range")?,
            op,
            pinned: self.pinned,
            max_share,
            admission: self.admission,
            priority,
            sync: self.sync,
        })
    }

    /// Resolves a vDisk's classes, checking their number and that names differ.
    pub fn resolve_all(sections: &[IoClassSection]) -> Result<Vec<IoClass>, String> {
        if sections.len() > MAX_CLASSES {
            return Err(format!("{} classes: at most {MAX_CLASSES}", sections.len()));
        }
        let mut out: Vec<IoClass> = Vec::new();
        for c in sections {
            let k = c.resolve()?;
            if out.iter().any(|o| o.name == k.name) {
                return Err(format!("class `{}`: named twice", k.name));
            }
            out.push(k);
        }
        Ok(out)
    }
}

/// Parses an inclusive size range `A-B` (`64KiB-`, `-4KiB`, `4KiB-1MiB`) or a byte range
/// of the disk `A-B` (`0-1GiB`: `[A, B)`), sizes as `cachevisor_trace::units`.
pub fn parse_range(s: &str, what: &str) -> Result<(u64, u64), String> {
    let Some((a, b)) = s.split_once('-') else {
        return Err(format!("{what} `{s}`: expected A-B, A- or -B (like 64KiB-1MiB)"));
    };
    let parse = |x: &str, none: u64| {
        let x = x.trim();
        if x.is_empty() {
            Ok(none)
        } else {
            cachevisor_trace::units::parse_size(x).map_err(|e| format!("{what} `{s}`: {e}"))
        }
    };
    let (lo, hi) = (parse(a, 0)?, parse(b, u64::MAX)?);
    if lo >= hi {
        return Err(format!("{what} `{s}`: the end must be above the start"));
    }
    Ok((lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(op: Op, offset: u64, len: u32) -> Request {
        Request { time_ns: 0, vm: 0, op, offset, len }
    }

    #[test]
    fn requests_take_the_first_class_they_match() {
        let mut c = Classes::default();
        let wal = IoClass { range: (0, 1 << 20), ..IoClass::named("wal") };
        let big = IoClass { size: (64 << 10, u64::MAX), op: Some(Op::Read), ..IoClass::named("big reads") };
        c.set(0, vec![wal, big], 16, 1, 4096, 1 << 20);
        assert_eq!(c.classify(&req(Op::Write, 4096, 4096), false), 1);
        assert_eq!(c.classify(&req(Op::Read, 4096, 128 << 10), false), 1, "first match wins");
        assert_eq!(c.classify(&req(Op::Read, 2 << 20, 128 << 10), false), 2);
        assert_eq!(c.classify(&req(Op::Write, 2 << 20, 128 << 10), false), 0);
        assert_eq!(c.classify(&Request { vm: 1, ..req(Op::Read, 0, 4096) }, false), 0, "another vDisk");
        let mut f = Classes::default();
        f.set(0, vec![IoClass { sync: Some(true), ..IoClass::named("fua") }], 16, 1, 4096, 1 << 20);
        assert_eq!((f.classify(&req(Op::Write, 0, 4096), true), f.classify(&req(Op::Write, 0, 4096), false)), (1, 0));
        f.note_sync(7);
        assert!(f.take_sync(7) && !f.take_sync(7) && !f.take_sync(8), "taken once");
        assert_eq!(parse_range("64KiB-", "size").unwrap(), (64 << 10, u64::MAX));
        assert_eq!(parse_range("-4KiB", "size").unwrap(), (0, 4096));
        assert_eq!(parse_range("0-1GiB", "range").unwrap(), (0, 1 << 30));
        for bad in ["4KiB", "8KiB-4KiB", "x-", "4KiB-4KiB"] {
            assert!(parse_range(bad, "size").unwrap_err().contains(bad), "{bad}");
        }
    }

    #[test]
    fn a_capped_class_goes_around_at_its_cap_and_a_pinned_one_is_pinned_under_it() {
        let mut c = Classes::default();
        let hot = IoClass { range: (0, 1 << 20), pinned: true, max_share: Some(0.5), ..IoClass::named("hot") };
        c.set(0, vec![hot], 16, 1, 4096, 1 << 20);
        for s in 0..4 {
            assert_eq!(c.admit(0, 1, s, false, 0, 10), None, "under the cap: the vDisk's admission decides");
            c.inserted(s as u32, 0, 1);
        }
        assert!(c.pins(0, 0, 10), "4 of a cap of 5");
        c.inserted(4, 0, 1);
        assert_eq!(c.admit(0, 1, 9, false, 0, 10), Some(false), "at 5 of 5");
        assert!(c.pins(0, 0, 10));
        c.inserted(5, 0, 1);
        assert!(!c.pins(0, 0, 10), "over its cap (a shrunk partition): not pinned");
        c.forgotten(5, 0);
        c.moved(4, 9);
        assert!(c.pins(9, 0, 10) && !c.pins(4, 0, 10));
        let k = &c.counts(0).unwrap()[1];
        assert_eq!((k.cached_blocks, k.rejected_at_cap), (5, 1));
    }

    /// In the engine: a shared LRU pool of 64 slots; VM 0 reads a 16-block hot set from
    /// its first 64 KiB (class `hot`); VM 1 scans 10,000 blocks once, ten times 1,000
    /// between hot passes. Unpinned and uncapped, the scan pushes the hot set out (next
    /// to no hot hit); with `hot` pinned, every hot read after the first pass hits; with
    /// the scan's class capped at 1/8 of the pool, it holds 8 blocks and the hot set stays
    /// too.
    #[test]
    fn a_pinned_class_keeps_its_hot_set_under_another_vms_scan() {
        for (pinned, capped) in [(false, false), (true, false), (false, true)] {
            let cfg =
                crate::EngineConfig { partition: crate::PartitionMode::Shared, ..crate::EngineConfig::with_slots(64) };
            let mut e = crate::Engine::new(cfg).unwrap();
            let hot = IoClass { range: (0, 64 << 10), pinned, ..IoClass::named("hot") };
            e.set_io_classes(0, vec![hot]).unwrap();
            let scan = IoClass { max_share: capped.then_some(0.125), ..IoClass::named("scan") };
            e.set_io_classes(1, vec![scan]).unwrap();
            let mut out = crate::Output::default();
            let mut read = |e: &mut crate::Engine, vm: u32, b: u64| {
                e.access(0, &Request { time_ns: 0, vm, op: Op::Read, offset: b * 4096, len: 4096 }, &mut out);
                out.blocks[0].hit
            };
            for b in 0..16 {
                read(&mut e, 0, b);
            }
            let mut hits = 0;
            for round in 0..10u64 {
                for b in 0..1000u64 {
                    read(&mut e, 1, round * 1000 + b);
                }
                hits += (0..16).filter(|&b| read(&mut e, 0, b)).count();
            }
            let hot = &e.io_classes(0).unwrap()[1];
            let scan = &e.io_classes(1).unwrap()[1];
            match (pinned, capped) {
                (false, false) => assert_eq!((hits, scan.rejected_at_cap), (0, 0), "the scan flushes the hot set"),
                (true, false) => assert_eq!((hits, hot.hits, hot.cached_blocks), (160, 160, 16), "{hot:?}"),
                _ => {
                    assert_eq!(hits, 160);
                    assert!(scan.cached_blocks == 8 && scan.rejected_at_cap > 9000, "{scan:?}");
                }
            }
            e.check_invariants().unwrap();
        }
    }

    /// In the engine: one VM's 64-slot partition; a `db` class (its first 1 MiB, priority
    /// 10) and a `logs` class (the rest, priority 200). After 32 db blocks and 32 log
    /// blocks fill it, every new log block evicts a log block, never a db block, so the
    /// db blocks all hit; with equal priorities (LRU) the newer log blocks push the older
    /// db blocks out. A priority out of 0 to 255 is refused naming it.
    #[test]
    fn a_class_of_a_higher_priority_number_is_evicted_first() {
        for ranked in [true, false] {
            let mut e = crate::Engine::new(crate::EngineConfig::with_slots(64)).unwrap();
            e.set_target(0, 64, &mut crate::Output::default());
            let (db, logs) = if ranked { (10, 200) } else { (DEFAULT_PRIORITY, DEFAULT_PRIORITY) };
            let classes = vec![
                IoClass { range: (0, 1 << 20), priority: db, ..IoClass::named("db") },
                IoClass { range: (1 << 20, u64::MAX), priority: logs, ..IoClass::named("logs") },
            ];
            e.set_io_classes(0, classes).unwrap();
            let mut out = crate::Output::default();
            let mut read = |e: &mut crate::Engine, b: u64| {
                e.access(0, &Request { time_ns: 0, vm: 0, op: Op::Read, offset: b * 4096, len: 4096 }, &mut out);
                out.blocks[0].hit
            };
            for b in 0..32 {
                read(&mut e, b);
            }
            for b in 256..512 {
                read(&mut e, b);
            }
            let hits = (0..32).filter(|&b| read(&mut e, b)).count();
            let c = e.io_classes(0).unwrap();
            if ranked {
                assert_eq!((hits, c[1].cached_blocks, c[2].cached_blocks), (32, 32, 32), "{c:?}");
            } else {
                assert_eq!(hits, 0, "LRU: the log blocks pushed the db blocks out");
            }
            e.check_invariants().unwrap();
        }
        let bad = IoClassSection { priority: Some(256), ..section("x") };
        assert!(bad.resolve().unwrap_err().contains("class `x`.priority: 256 is outside 0 to 255"));
        assert_eq!(IoClassSection { priority: Some(0), ..section("x") }.resolve().unwrap().priority, 0);
    }

    fn section(name: &str) -> IoClassSection {
        IoClassSection {
            name: name.into(),
            size: None,
            range: None,
            op: None,
            pinned: false,
            max_occupancy: None,
            admission: None,
            priority: None,
            sync: None,
        }
    }
}
