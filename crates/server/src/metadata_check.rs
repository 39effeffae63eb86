//! `cachevisor check --metadata DIR` (an fsck for the cache's metadata): reads
//! the checkpoint and the journal offline, through the very replay a start runs
//! (`persist::replay`), and reports what a start would recover — each vDisk's cached and
//! dirty blocks, the backing store they belong to, the journal's records and a torn tail —
//! or why a start would refuse, without writing anything (the files are opened read-only;
//! a running daemon's metadata may be checked: the figures are as of the read).
//!
//! Beyond the start's own checks it looks for what a start would take as it is: one block
//! of a vDisk in two slots (two copies, one of them stale), a slot naming a vDisk no
//! `Vdisk` record names, and dirty blocks of a vDisk with no backing binding (they could
//! not be written back anywhere). When the cache store's label matches, the dirty blocks
//! sealed with checksums (`block_sums.rs`) are read from it and checked: a block whose
//! bytes fail is named (a start serves EIO for it and never writes it back).

use cachevisor_store::journal::{Header, Record, CHECKPOINT_MAGIC, HEADER_LEN, JOURNAL_MAGIC};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// What the metadata holds and what a start would do with it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Report {
    /// The directory checked.
    pub dir: String,
    /// The geometry the metadata was written with.
    pub block_size: u64,
    /// Slots of the cache.
    pub slots: u64,
    /// The checkpoint's generation (0 without one).
    pub generation: u64,
    /// Whether a checkpoint exists.
    pub checkpoint: bool,
    /// Journal records a start would replay after the checkpoint.
    pub journal_records: usize,
    /// Whether the journal ends in a torn record (a crash while appending; a start cuts it).
    pub torn_tail: bool,
    /// The vDisks, by VM id.
    pub vdisks: Vec<VdiskReport>,
    /// The cache store the owner note names and what its label says against the metadata
    /// (`cache_label.rs`): "PATH: its label matches", or how it differs.
    pub cache_store: Option<String>,
    /// Why a start would refuse, or what it would take as it is and should not (empty:
    /// consistent).
    pub problems: Vec<String>,
}

/// One vDisk's blocks in the metadata.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct VdiskReport {
    /// VM id.
    pub vm: u16,
    /// Its name, when a record names it.
    pub name: Option<String>,
    /// The backing store its blocks belong to, when bound.
    pub backing: Option<String>,
    /// Cached blocks.
    pub blocks: u64,
    /// Of those, blocks with dirty sectors (not yet written back).
    pub dirty_blocks: u64,
    /// Of the dirty ones, blocks sealed with checksums (checked against the store).
    pub sealed_blocks: u64,
    /// Of the sealed ones, blocks whose bytes in the cache store fail their checksums.
    pub corrupt_blocks: u64,
}

/// The geometry in `path`'s header, if the file exists and has one.
fn header(path: &Path, magic: [u8; 8]) -> Result<Option<Header>, String> {
    let mut f = match cachevisor_files::bounded_read::open_regular(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut h = [0u8; HEADER_LEN];
    match f.read_exact(&mut h) {
        Ok(()) => Header::decode(&h, magic).map(Some).map_err(|e| format!("{}: {e}", path.display())),
        // A journal created and never written (a crash right after): nothing in it.
        Err(_) => Ok(None),
    }
}

/// Checks the metadata in `dir` (see the top comment). `Err` only when there is nothing
/// to check (no metadata there, or a file that cannot be read at all).
pub fn check(dir: &Path) -> Result<Report, String> {
    if !dir.is_dir() {
        return Err(format!("{}: no such directory", dir.display()));
    }
    let ckpt = header(&dir.join("checkpoint"), CHECKPOINT_MAGIC);
    let journal = header(&dir.join("journal"), JOURNAL_MAGIC);
    let mut report = Report { dir: dir.display().to_string(), ..Report::default() };
    let geometry = match (&ckpt, &journal) {
        (Ok(Some(h)), _) | (Ok(None), Ok(Some(h))) => (h.block_size, h.slots),
        (Err(e), _) | (_, Err(e)) => {
            report.problems.push(e.clone());
            return Ok(report);
        }
        (Ok(None), Ok(None)) => {
            return Err(format!("{}: no checkpoint or journal: not a cache's metadata directory", dir.display()))
        }
    };
    (report.block_size, report.slots) = geometry;
    report.checkpoint = matches!(ckpt, Ok(Some(_)));
    // The start's replay, into a model of the slot table.
    let mut slots: BTreeMap<u32, (u16, u64, bool)> = BTreeMap::new();
    // Sealed slots: their dirty sectors and checksums.
    let mut seals: BTreeMap<u32, (Vec<u64>, Vec<u32>)> = BTreeMap::new();
    let mut names: BTreeMap<u16, String> = BTreeMap::new();
    let mut bindings: BTreeMap<u16, String> = BTreeMap::new();
    let mut label = None;
    let mut apply = |r: Record| -> Result<(), String> {
        match r {
            Record::Vdisk { vm, name } => {
                names.insert(vm, name);
            }
            Record::Binding { vm, identity } => {
                bindings.insert(vm, identity.describe());
            }
            Record::Slot { slot, vm, block, dirty, sums, .. } => {
                slots.insert(slot, (vm, block, dirty.iter().any(|w| *w != 0)));
                match sums {
                    Some(s) => seals.insert(slot, (dirty, s)),
                    None => seals.remove(&slot),
                };
            }
            Record::Free { slot } => {
                slots.remove(&slot);
                seals.remove(&slot);
            }
            // A dirty block's copy on another device: no block of its own.
            Record::Mirror { slot, .. } => {
                slots.remove(&slot);
                seals.remove(&slot);
            }
            Record::CacheLabel(e) => label = Some(e),
            Record::Target { .. } | Record::CacheDevices(_) => {}
        }
        Ok(())
    };
    match cachevisor_datapath::persist::replay(dir, geometry.0, geometry.1, &mut apply) {
        Ok((rec, generation)) => {
            report.journal_records = rec.journal_records;
            report.torn_tail = rec.torn_tail;
            report.generation = generation;
        }
        Err(e) => report.problems.push(format!("a start would refuse: {e}")),
    }
    let mut per_vm: BTreeMap<u16, VdiskReport> = BTreeMap::new();
    let mut owner: BTreeMap<(u16, u64), u32> = BTreeMap::new();
    for (&slot, &(vm, block, dirty)) in &slots {
        let v = per_vm.entry(vm).or_insert_with(|| VdiskReport { vm, ..VdiskReport::default() });
        v.blocks += 1;
        v.dirty_blocks += u64::from(dirty);
        if let Some(other) = owner.insert((vm, block), slot) {
            report
                .problems
                .push(format!("block {block} of VM {vm} is in slots {other} and {slot}: two copies, one stale"));
        }
    }
    for (&vm, name) in &names {
        per_vm.entry(vm).or_insert_with(|| VdiskReport { vm, ..VdiskReport::default() }).name = Some(name.clone());
    }
    for v in per_vm.values_mut() {
        v.backing = bindings.get(&v.vm).cloned();
        if v.name.is_none() && v.blocks > 0 {
            report.problems.push(format!("{} blocks of VM {} belong to no named vDisk", v.blocks, v.vm));
        }
        if v.backing.is_none() && v.dirty_blocks > 0 {
            report.problems.push(format!(
                "{} dirty blocks of {} have no backing store bound: they cannot be written back",
                v.dirty_blocks,
                v.name.as_deref().unwrap_or("an unnamed VM")
            ));
        }
    }
    report.vdisks = per_vm.into_values().collect();
    if let Some(store) = check_store(dir, label.as_ref(), &mut report) {
        check_sums(&store, &slots, &seals, &mut report);
    }
    Ok(report)
}

/// Reads each sealed slot's dirty sectors from the cache store `store` and checks them
/// against their checksums, counting per vDisk; a vDisk with blocks that fail is a problem.
fn check_sums(
    store: &Path,
    slots: &BTreeMap<u32, (u16, u64, bool)>,
    seals: &BTreeMap<u32, (Vec<u64>, Vec<u32>)>,
    report: &mut Report,
) {
    use std::os::unix::fs::FileExt;
    let Ok(f) = cachevisor_files::bounded_read::open_regular(store) else { return };
    let bs = report.block_size;
    let mut sector = [0u8; 512];
    for (&slot, (dirty, sums)) in seals {
        let Some(&(vm, _, _)) = slots.get(&slot) else { continue };
        let mut sums = sums.iter();
        let mut bad = false;
        for i in 0..bs / 512 {
            if dirty.get((i / 64) as usize).is_none_or(|w| w >> (i % 64) & 1 == 0) {
                continue;
            }
            let Some(&want) = sums.next() else { break };
            let at = cachevisor_store::cache_label::DATA_OFFSET + u64::from(slot) * bs + i * 512;
            bad |= f.read_exact_at(&mut sector, at).is_err()
                || cachevisor_datapath::block_sums::sector_sum(&sector) != want;
        }
        if let Some(v) = report.vdisks.iter_mut().find(|v| v.vm == vm) {
            v.sealed_blocks += 1;
            v.corrupt_blocks += u64::from(bad);
        }
    }
    for v in &report.vdisks {
        if v.corrupt_blocks > 0 {
            report.problems.push(format!(
                "{} dirty blocks of {} fail their checksums in the cache store: their data is lost (a start serves EIO for them and never writes them back; a client's write of them heals them)",
                v.corrupt_blocks,
                v.name.as_deref().unwrap_or("an unnamed VM")
            ));
        }
    }
}

/// Compares the label of the cache store the owner note names with the one the metadata
/// names, as a start does: a store that is not this metadata's, with dirty blocks
/// recorded, is a problem (a start refuses); with clean ones only a start comes up cold.
/// Returns the store's path when its label matches (its bytes are the metadata's).
fn check_store(
    dir: &Path,
    expected: Option<&cachevisor_store::cache_label::Expected>,
    report: &mut Report,
) -> Option<PathBuf> {
    let note = cachevisor_files::bounded_read::read_to_string(&cachevisor_store::owner_lock::owner_file(dir), 1 << 16)
        .unwrap_or_default();
    let path = note.lines().next().and_then(|l| l.split_once(", cache ")).map(|(_, p)| PathBuf::from(p))?;
    let held: Vec<(String, u64, u64)> = report
        .vdisks
        .iter()
        .map(|v| (v.name.clone().unwrap_or_else(|| format!("VM {}", v.vm)), v.blocks, v.dirty_blocks))
        .collect();
    let found = cachevisor_store::cache_label::read(&path);
    let verdict = cachevisor_store::cache_label::verdict(
        &found,
        expected,
        report.block_size,
        &held,
        &|_| false,
        ("cache.path", &path, dir),
    );
    let warm = matches!(verdict, Ok(cachevisor_store::cache_label::Verdict::Warm { .. }));
    report.cache_store = Some(match verdict {
        Ok(cachevisor_store::cache_label::Verdict::Warm { .. }) => {
            format!("{}: its label matches the metadata", path.display())
        }
        Ok(cachevisor_store::cache_label::Verdict::Cold(None)) => {
            format!("{}: a new cache (no label yet)", path.display())
        }
        Ok(cachevisor_store::cache_label::Verdict::Cold(Some(why))) => format!("a start comes up cold: {why}"),
        Err(e) => {
            report.problems.push(format!("a start would refuse: {e}"));
            format!("{}: not the store this metadata describes", path.display())
        }
    });
    warm.then_some(path)
}

impl Report {
    /// The report for a reader: one line per vDisk, then the verdict.
    pub fn text(&self) -> String {
        let mut s = format!(
            "{}: {} slots of {} bytes, generation {}, {}checkpoint, {} journal records{}\n",
            self.dir,
            self.slots,
            self.block_size,
            self.generation,
            if self.checkpoint { "" } else { "no " },
            self.journal_records,
            if self.torn_tail { " (a torn last record: a start cuts it)" } else { "" }
        );
        for v in &self.vdisks {
            s += &format!(
                "  {:<16} VM {:>3}: {:>10} blocks cached, {:>10} dirty ({} sealed, {} failing their checksums); backing {}\n",
                v.name.as_deref().unwrap_or("(unnamed)"),
                v.vm,
                v.blocks,
                v.dirty_blocks,
                v.sealed_blocks,
                v.corrupt_blocks,
                v.backing.as_deref().unwrap_or("(none)")
            );
        }
        if let Some(c) = &self.cache_store {
            s += &format!("cache store: {c}\n");
        }
        if self.problems.is_empty() {
            s += "consistent: a start recovers the blocks above\n";
        } else {
            for p in &self.problems {
                s += &format!("problem: {p}\n");
            }
        }
        s
    }
}
