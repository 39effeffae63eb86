//! `cachevisor check --metadata DIR --repair`: salvages what is consistent in
//! a cache's metadata that a start refuses, with no daemon running on it (the directory
//! is locked as an owner locks it), and writes it back as a new checkpoint that a start
//! replays. What it keeps and why:
//! - every whole record of the checkpoint up to the first damaged one (its frames carry
//!   CRCs), then the journal of the same generation up to its first torn record — each of
//!   those was durable, so vouching for it again is what the start would have done;
//! - records that do not fit the geometry are dropped (the slots they name hold nothing
//!   a start could place);
//! - a block found in two slots keeps the copy recorded last (the newer one).
//!
//! What the damaged part of a checkpoint described is gone: those slots are free after
//! the repair, and if some of their blocks were dirty, their data is lost (the report
//! says how many records were lost, never how many were dirty: that is not known). The
//! old files are kept in `DIR/salvaged-<unix seconds>/` beside the new ones. The new
//! checkpoint is written first (the next generation), then an empty journal of its
//! generation, each atomically: a crash between them leaves a journal of an older
//! generation, which a start ignores.

use cachevisor_store::journal::{
    read_records, write_file_atomically, Header, Record, CHECKPOINT_MAGIC, HEADER_LEN, JOURNAL_MAGIC,
};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

/// What a repair kept and dropped.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct RepairReport {
    /// Whole checkpoint records read.
    pub checkpoint_records: usize,
    /// Whether the checkpoint ended in a damaged record (what followed was lost).
    pub checkpoint_damaged: bool,
    /// Journal records applied after it.
    pub journal_records: usize,
    /// Records that did not fit the geometry, dropped.
    pub misfits: usize,
    /// Older copies of blocks found in two slots, dropped.
    pub duplicates: usize,
    /// Slots holding a block in the new checkpoint.
    pub slots_kept: usize,
    /// Where the old files are.
    pub backup: String,
    /// The new checkpoint's generation.
    pub generation: u64,
}

/// A file's header and its whole records (and whether it ended cleanly), if it exists.
fn read(path: &Path, magic: [u8; 8]) -> Result<Option<(Header, Vec<Record>, bool)>, String> {
    let mut f = match cachevisor_files::bounded_read::open_regular(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut h = [0u8; HEADER_LEN];
    if f.read_exact(&mut h).is_err() {
        return Ok(None);
    }
    let Ok(header) = Header::decode(&h, magic) else { return Ok(None) };
    let (records, clean) = read_records(&mut f).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Some((header, records, clean)))
}

/// Repairs the metadata in `dir` (see the top comment).
pub fn repair(dir: &Path) -> Result<RepairReport, String> {
    let _lock = cachevisor_store::owner_lock::MetadataLock::acquire(dir)?;
    let ckpt = read(&dir.join("checkpoint"), CHECKPOINT_MAGIC)?;
    let journal = read(&dir.join("journal"), JOURNAL_MAGIC)?;
    let geometry = match (&ckpt, &journal) {
        (Some((h, ..)), _) | (None, Some((h, ..))) => *h,
        (None, None) => {
            return Err(format!(
                "{}: no readable checkpoint or journal header: nothing to salvage (start cold by moving the directory away)",
                dir.display()
            ))
        }
    };
    let words = (geometry.block_size / 512).div_ceil(64) as usize;
    let mut report = RepairReport::default();
    // The state, each slot with the order its record came in.
    let mut slots: BTreeMap<u32, (u64, Record)> = BTreeMap::new();
    let mut names: BTreeMap<u16, String> = BTreeMap::new();
    let mut bindings: BTreeMap<u16, cachevisor_store::backing_identity::Identity> = BTreeMap::new();
    let mut seq = 0u64;
    let mut label = None;
    let mut devices = None;
    let mut apply = |r: Record, report: &mut RepairReport| {
        seq += 1;
        match r {
            Record::CacheLabel(e) => label = Some(e),
            Record::CacheDevices(d) => devices = Some(d),
            Record::Vdisk { vm, name } => {
                names.insert(vm, name);
            }
            Record::Binding { vm, identity } => {
                bindings.insert(vm, identity);
            }
            Record::Slot { slot, ref valid, ref dirty, .. }
                if u64::from(slot) < geometry.slots && valid.len() == words && dirty.len() == words =>
            {
                slots.insert(slot, (seq, r));
            }
            Record::Mirror { slot, ref sectors, .. } if u64::from(slot) < geometry.slots && sectors.len() == words => {
                slots.insert(slot, (seq, r));
            }
            Record::Free { slot } if u64::from(slot) < geometry.slots => {
                slots.remove(&slot);
            }
            Record::Target { .. } => {}
            _ => report.misfits += 1,
        }
    };
    let mut generation = 0;
    if let Some((h, records, clean)) = ckpt.clone() {
        report.checkpoint_records = records.len();
        report.checkpoint_damaged = !clean;
        generation = h.generation;
        for r in records {
            apply(r, &mut report);
        }
    }
    if let Some((h, records, _)) = journal.clone() {
        let fits = h.block_size == geometry.block_size && h.slots == geometry.slots;
        if fits && (ckpt.is_none() || h.generation == generation) {
            generation = h.generation;
            report.journal_records = records.len();
            for r in records {
                apply(r, &mut report);
            }
        }
    }
    // A block in two slots (or with two mirrors): the copy recorded last is the newer.
    let mut newest: BTreeMap<(bool, u16, u64), (u64, u32)> = BTreeMap::new();
    let mut older = Vec::new();
    for (&slot, (seq, r)) in &slots {
        let (mirror, vm, block) = match r {
            Record::Slot { vm, block, .. } => (false, vm, block),
            Record::Mirror { vm, block, .. } => (true, vm, block),
            _ => unreachable!("slots hold slot and mirror records"),
        };
        match newest.insert((mirror, *vm, *block), (*seq, slot)) {
            Some((s, other)) if s > *seq => {
                newest.insert((mirror, *vm, *block), (s, other));
                older.push(slot);
            }
            Some((_, other)) => older.push(other),
            None => {}
        }
    }
    report.duplicates = older.len();
    for s in older {
        slots.remove(&s);
    }
    report.slots_kept = slots.len();
    // The old files kept, then the new checkpoint and an empty journal.
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let backup = dir.join(format!("salvaged-{stamp}"));
    cachevisor_files::private_files::ensure_dir(&backup).map_err(|e| format!("{}: {e}", backup.display()))?;
    for f in ["checkpoint", "journal"] {
        if dir.join(f).exists() {
            std::fs::copy(dir.join(f), backup.join(f)).map_err(|e| format!("{}: {e}", backup.join(f).display()))?;
        }
    }
    report.backup = backup.display().to_string();
    let header = Header { generation: generation + 1, ..geometry };
    report.generation = header.generation;
    write_file_atomically(&dir.join("checkpoint"), CHECKPOINT_MAGIC, &header, &mut |w| {
        let mut b = Vec::new();
        if let Some(l) = label {
            Record::CacheLabel(l).encode(&mut b); // the store it describes is the same one
        }
        if let Some(d) = devices.take() {
            Record::CacheDevices(d).encode(&mut b); // so are its devices
        }
        for (&vm, name) in &names {
            Record::Vdisk { vm, name: name.clone() }.encode(&mut b);
        }
        for (&vm, identity) in &bindings {
            Record::Binding { vm, identity: identity.clone() }.encode(&mut b);
        }
        for (_, r) in slots.values() {
            r.encode(&mut b);
        }
        w.write_all(&b)
    })
    .map_err(|e| format!("{}: {e}", dir.join("checkpoint").display()))?;
    write_file_atomically(&dir.join("journal"), JOURNAL_MAGIC, &header, &mut |_| Ok(()))
        .map_err(|e| format!("{}: {e}", dir.join("journal").display()))?;
    Ok(report)
}

impl RepairReport {
    /// The report for a reader.
    pub fn text(&self) -> String {
        let mut s = format!(
            "salvaged: {} checkpoint records{}, {} journal records; {} slots hold blocks in the new checkpoint (generation {})\n",
            self.checkpoint_records,
            if self.checkpoint_damaged { " (then a damaged record: what the checkpoint said after it is lost)" } else { "" },
            self.journal_records,
            self.slots_kept,
            self.generation
        );
        if self.misfits > 0 {
            s += &format!("dropped: {} records that do not fit the cache's geometry\n", self.misfits);
        }
        if self.duplicates > 0 {
            s += &format!("dropped: {} older copies of blocks recorded in two slots\n", self.duplicates);
        }
        if self.checkpoint_damaged {
            s += "the slots the lost part described are free now; if some of their blocks were dirty, that data is lost\n";
        }
        s += &format!("the old files are in {}\n", self.backup);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(slot: u32, block: u64, dirty: bool) -> Record {
        Record::Slot {
            slot,
            vm: 0,
            block,
            valid: vec![u64::MAX],
            dirty: vec![if dirty { 0xff } else { 0 }],
            sums: None,
        }
    }

    fn write(dir: &Path, name: &str, magic: [u8; 8], h: Header, recs: &[Record]) {
        write_file_atomically(&dir.join(name), magic, &h, &mut |w| {
            let mut b = Vec::new();
            recs.iter().for_each(|r| r.encode(&mut b));
            w.write_all(&b)
        })
        .unwrap();
    }

    #[test]
    fn a_repair_keeps_the_whole_records_and_the_newer_copy_and_a_check_then_passes() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let h = Header { block_size: 4096, slots: 8, generation: 4 };
        let name = Record::Vdisk { vm: 0, name: "vm1".into() };
        let bind = Record::Binding {
            vm: 0,
            identity: cachevisor_store::backing_identity::Identity::File { dev: 1, ino: 2, size: 1 << 20 },
        };
        write(
            d,
            "checkpoint",
            CHECKPOINT_MAGIC,
            h,
            &[name, bind, slot(0, 5, true), slot(1, 6, false), slot(2, 7, true)],
        );
        // The journal moves block 5 to slot 3 without freeing slot 0 (two copies), and
        // names a slot past the cache (a misfit).
        write(d, "journal", JOURNAL_MAGIC, h, &[slot(3, 5, true), slot(9, 1, false)]);
        // The checkpoint's last record damaged.
        let ck = d.join("checkpoint");
        let mut b = std::fs::read(&ck).unwrap();
        let n = b.len();
        b[n - 3] ^= 0x40;
        std::fs::write(&ck, &b).unwrap();
        let before = crate::metadata_check::check(d).unwrap();
        assert!(before.problems.iter().any(|p| p.contains("damaged")), "{:?}", before.problems);
        let r = repair(d).unwrap();
        assert_eq!((r.checkpoint_records, r.checkpoint_damaged, r.journal_records), (4, true, 2));
        assert_eq!((r.misfits, r.duplicates, r.slots_kept, r.generation), (1, 1, 2, 5), "{r:?}");
        let after = crate::metadata_check::check(d).unwrap();
        assert!(after.problems.is_empty(), "{:?}", after.problems);
        let vm1 = &after.vdisks[0];
        assert_eq!((vm1.name.as_deref(), vm1.blocks, vm1.dirty_blocks), (Some("vm1"), 2, 1));
        // The replay a start runs reads the slots kept: block 5 in slot 3, block 6 in slot 1.
        let mut seen = Vec::new();
        cachevisor_datapath::persist::replay(d, 4096, 8, &mut |r| {
            if let Record::Slot { slot, block, .. } = r {
                seen.push((slot, block));
            }
            Ok(())
        })
        .unwrap();
        seen.sort_unstable();
        assert_eq!(seen, [(1, 6), (3, 5)]);
        assert!(Path::new(&r.backup).join("checkpoint").exists() && Path::new(&r.backup).join("journal").exists());
        // Nothing readable: refused, nothing written.
        let empty = tempfile::tempdir().unwrap();
        assert!(repair(empty.path()).unwrap_err().contains("nothing to salvage"));
    }
}
