//! The vSSD region's metadata on disk: the block manager's records
//! (`cachevisor_vssd::Record`) in the cache metadata's own format (`journal.rs`: a header
//! with geometry and generation, framed and checksummed records, a torn tail cut at the
//! first bad frame, checkpoints written atomically), in their own pair of files beside the
//! cache's (`vssd.checkpoint`, `vssd.journal`) with their own magics, so neither can be
//! read as the other. At open the state is replayed (a record that does not fit names the
//! file and its index), then written back as a fresh checkpoint of the next generation
//! with an empty journal.

use cachevisor_store::journal::{frame, read_frames, write_file_atomically, Header, HEADER_LEN};
use cachevisor_vssd::{Geometry, Record, State};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Magic of a vSSD checkpoint.
pub const CHECKPOINT_MAGIC: [u8; 8] = *b"CVVSCK01";
/// Magic of a vSSD journal.
pub const JOURNAL_MAGIC: [u8; 8] = *b"CVVSJR01";
/// Magic of a checkpoint of a region sharing the SSD with the cache (`vssd.budget =
/// "shared"`: its state starts with no block, `State::shared`).
pub const SHARED_CHECKPOINT_MAGIC: [u8; 8] = *b"CVVSCS01";
/// Magic of a shared region's journal.
pub const SHARED_JOURNAL_MAGIC: [u8; 8] = *b"CVVSJS01";

/// The checkpoint and journal magics of a region (`shared` or of its own).
fn magics(shared: bool) -> ([u8; 8], [u8; 8]) {
    if shared {
        (SHARED_CHECKPOINT_MAGIC, SHARED_JOURNAL_MAGIC)
    } else {
        (CHECKPOINT_MAGIC, JOURNAL_MAGIC)
    }
}

/// The empty state a region starts from.
fn start(geometry: Geometry, shared: bool) -> State {
    if shared {
        State::shared(geometry)
    } else {
        State::new(geometry)
    }
}

/// Whether the checkpoint at `path` is a shared region's (by its magic), or an error.
fn checkpoint_is_shared(path: &Path) -> Result<bool, String> {
    let mut h = [0u8; HEADER_LEN];
    File::open(path).and_then(|mut f| f.read_exact(&mut h)).map_err(|e| named(path, e))?;
    match &h[0..8] {
        m if m == SHARED_CHECKPOINT_MAGIC => Ok(true),
        m if m == CHECKPOINT_MAGIC => Ok(false),
        _ => Header::decode(&h, CHECKPOINT_MAGIC).map(|_| false).map_err(|e| named(path, e)),
    }
}

/// What opening found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// Journal records replayed after the checkpoint.
    pub journal_records: usize,
    /// The journal ended in a torn record (a crash while appending).
    pub torn_tail: bool,
}

/// The vSSD metadata files of one region.
pub struct VssdMeta {
    dir: PathBuf,
    shared: bool,
    journal: File,
    header: Header,
    buf: Vec<u8>,
}

fn named(path: &Path, e: impl std::fmt::Display) -> String {
    format!("{}: {e}", path.display())
}

/// The records of the file at `path` (after its header of `magic`, which must be of
/// `geometry`), its generation, and whether it ended cleanly.
fn read_file(path: &Path, magic: [u8; 8], geometry: Geometry) -> Result<(Vec<Record>, u64, bool), String> {
    let mut f = File::open(path).map_err(|e| named(path, e))?;
    let mut h = [0u8; HEADER_LEN];
    f.read_exact(&mut h).map_err(|e| named(path, format!("no header: {e}")))?;
    let header = Header::decode(&h, magic).map_err(|e| named(path, e))?;
    if header.block_size != geometry.block_bytes || header.slots != u64::from(geometry.blocks) {
        return Err(named(
            path,
            format!(
                "the vSSD region was written as {} blocks of {} bytes, the config asks for {} of {}; restore the old [vssd] settings (vSSD data lives in those blocks)",
                header.slots, header.block_size, geometry.blocks, geometry.block_bytes
            ),
        ));
    }
    let mut all = Vec::new();
    f.read_to_end(&mut all).map_err(|e| named(path, e))?;
    let (frames, mut clean) = read_frames(&all);
    let mut records = Vec::with_capacity(frames.len());
    for body in frames {
        match Record::decode(body) {
            Ok(r) => records.push(r),
            Err(_) => {
                clean = false;
                break;
            }
        }
    }
    Ok((records, header.generation, clean))
}

impl VssdMeta {
    /// The names of the vSSDs the metadata in `dir` describes, read without writing
    /// anything (`None`: no vSSD metadata there).
    pub fn names_on_disk(dir: &Path) -> Result<Option<Vec<String>>, String> {
        let (ckpt, jpath) = (dir.join("vssd.checkpoint"), dir.join("vssd.journal"));
        if !ckpt.exists() {
            return Ok(None);
        }
        let shared = checkpoint_is_shared(&ckpt)?;
        let (ckpt_magic, journal_magic) = magics(shared);
        let mut h = [0u8; HEADER_LEN];
        File::open(&ckpt).and_then(|mut f| f.read_exact(&mut h)).map_err(|e| named(&ckpt, e))?;
        let header = Header::decode(&h, ckpt_magic).map_err(|e| named(&ckpt, e))?;
        let geometry = Geometry::new(header.block_size, header.slots as u32).map_err(|e| named(&ckpt, e))?;
        let (records, g, _) = read_file(&ckpt, ckpt_magic, geometry)?;
        let mut state = State::replay_onto(start(geometry, shared), &records)
            .map_err(|(i, e)| named(&ckpt, format!("record {i}: {e}")))?;
        if jpath.exists() {
            if let Ok((records, jg, _)) = read_file(&jpath, journal_magic, geometry) {
                if jg == g {
                    for r in &records {
                        state.apply(r).map_err(|e| named(&jpath, e))?;
                    }
                }
            }
        }
        Ok(Some(
            state
                .vssds()
                .values()
                .filter(|v| !v.map.is_empty() || !v.swapped.is_empty())
                .map(|v| v.name.clone())
                .collect(),
        ))
    }

    /// Opens (or creates) the metadata in `dir` for a region of `geometry` (`shared`: one
    /// sharing the SSD with the cache, which must be what it was): the durable state, the
    /// files ready for appends, and what was found.
    pub fn open(dir: &Path, geometry: Geometry, shared: bool) -> Result<(VssdMeta, State, Opened), String> {
        cachevisor_files::private_files::ensure_dir(dir).map_err(|e| named(dir, e))?;
        let (ckpt, jpath) = (dir.join("vssd.checkpoint"), dir.join("vssd.journal"));
        let (ckpt_magic, journal_magic) = magics(shared);
        if ckpt.exists() && checkpoint_is_shared(&ckpt)? != shared {
            let (was, asked) = if shared { ("\"own\"", "\"shared\"") } else { ("\"shared\"", "\"own\"") };
            return Err(named(
                &ckpt,
                format!("the vSSD region was kept with vssd.budget = {was}, the config asks for {asked}: restore it (vSSD data lives in its blocks), or remove the vSSDs first"),
            ));
        }
        let mut state = start(geometry, shared);
        let mut generation = 0;
        let mut opened = Opened::default();
        let apply = |state: &mut State, records: &[Record], path: &Path| -> Result<(), String> {
            for (i, r) in records.iter().enumerate() {
                state.apply(r).map_err(|e| named(path, format!("record {i}: {e}")))?;
            }
            Ok(())
        };
        if ckpt.exists() {
            let (records, g, clean) = read_file(&ckpt, ckpt_magic, geometry)?;
            if !clean {
                return Err(named(
                    &ckpt,
                    "the checkpoint is damaged (it is written atomically, so the file was altered)",
                ));
            }
            apply(&mut state, &records, &ckpt)?;
            generation = g;
        }
        if jpath.exists() && std::fs::metadata(&jpath).map_err(|e| named(&jpath, e))?.len() >= HEADER_LEN as u64 {
            let (records, g, clean) = read_file(&jpath, journal_magic, geometry)?;
            // A journal of another generation was folded into the checkpoint already.
            if g == generation {
                apply(&mut state, &records, &jpath)?;
                opened = Opened { journal_records: records.len(), torn_tail: !clean };
            }
        }
        let header = Header { block_size: geometry.block_bytes, slots: u64::from(geometry.blocks), generation };
        let journal = cachevisor_files::private_files::own_options()
            .create(true)
            .append(true)
            .open(&jpath)
            .map_err(|e| named(&jpath, e))?;
        let mut m = VssdMeta { dir: dir.to_path_buf(), shared, journal, header, buf: Vec::new() };
        m.checkpoint(&state).map_err(|e| named(&ckpt, e))?;
        Ok((m, state, opened))
    }

    /// Appends `records` to the journal and makes them durable.
    pub fn append(&mut self, records: &[Record]) -> std::io::Result<()> {
        self.buf.clear();
        for r in records {
            frame(&mut self.buf, |out| out.extend_from_slice(&r.encode()));
        }
        self.journal.write_all(&self.buf)?;
        self.journal.sync_data()
    }

    /// Writes `state` as the checkpoint of the next generation, then an empty journal of
    /// it (a crash in between leaves the old journal, of the old generation: skipped).
    pub fn checkpoint(&mut self, state: &State) -> std::io::Result<()> {
        self.header.generation += 1;
        let records = state.checkpoint();
        let (ckpt_magic, journal_magic) = magics(self.shared);
        write_file_atomically(&self.dir.join("vssd.checkpoint"), ckpt_magic, &self.header, &mut |w| {
            let mut buf = Vec::new();
            for r in &records {
                frame(&mut buf, |out| out.extend_from_slice(&r.encode()));
            }
            w.write_all(&buf)
        })?;
        let jpath = self.dir.join("vssd.journal");
        write_file_atomically(&jpath, journal_magic, &self.header, &mut |_| Ok(()))?;
        self.journal = cachevisor_files::private_files::own_options().append(true).open(&jpath)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g() -> Geometry {
        Geometry::new(1 << 20, 8).unwrap()
    }

    #[test]
    fn records_survive_a_reopen_and_a_torn_tail_keeps_the_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let (mut m, s, o) = VssdMeta::open(dir.path(), g(), false).unwrap();
        assert_eq!((s, o), (State::new(g()), Opened::default()));
        let rs = [
            Record::Register { id: 0, name: "a".into(), max_blocks: 4, persist: true },
            Record::Assign { pbn: 5, id: 0, lbn: 2 },
            Record::Assign { pbn: 6, id: 0, lbn: 3 },
        ];
        m.append(&rs).unwrap();
        drop(m);
        // A torn last record: cut the journal short.
        let j = dir.path().join("vssd.journal");
        let len = std::fs::metadata(&j).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&j).unwrap().set_len(len - 3).unwrap();
        let (_, s, o) = VssdMeta::open(dir.path(), g(), false).unwrap();
        assert_eq!(o, Opened { journal_records: 2, torn_tail: true });
        assert_eq!(s.vssd(0).unwrap().map.len(), 1);
        // Reopened again: the checkpoint written at the last open holds it.
        let (_, s2, o) = VssdMeta::open(dir.path(), g(), false).unwrap();
        assert_eq!((s2, o.journal_records), (s, 0));
    }

    #[test]
    fn a_shared_region_reopens_with_its_grants_and_not_as_a_region_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let (mut m, s, _) = VssdMeta::open(dir.path(), g(), true).unwrap();
        assert_eq!(s, State::shared(g()));
        m.append(&[Record::Grant { pbn: 7 }, Record::Grant { pbn: 6 }, Record::Yield { pbn: 7 }]).unwrap();
        drop(m);
        let (_, s, o) = VssdMeta::open(dir.path(), g(), true).unwrap();
        assert_eq!(o.journal_records, 3);
        assert_eq!(s.free_blocks().collect::<Vec<_>>(), [6]);
        // From its checkpoint too, and named by `names_on_disk`'s replay.
        let (_, s2, _) = VssdMeta::open(dir.path(), g(), true).unwrap();
        assert_eq!(s2, s);
        assert_eq!(VssdMeta::names_on_disk(dir.path()).unwrap(), Some(Vec::new()));
        let e = VssdMeta::open(dir.path(), g(), false).err().unwrap();
        assert!(e.contains("vssd.budget = \"shared\", the config asks for \"own\""), "{e}");
    }

    #[test]
    fn a_different_geometry_or_a_misfit_record_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let (mut m, _, _) = VssdMeta::open(dir.path(), g(), false).unwrap();
        m.append(&[Record::Assign { pbn: 1, id: 9, lbn: 0 }]).unwrap();
        let e = VssdMeta::open(dir.path(), g(), false).err().unwrap();
        assert!(e.contains("vssd.journal: record 0") && e.contains("no vSSD 9"), "{e}");
        let other = Geometry::new(1 << 20, 16).unwrap();
        let e = VssdMeta::open(dir.path(), other, false).err().unwrap();
        assert!(e.contains("written as 8 blocks of 1048576 bytes"), "{e}");
        // The cache's own journal is not a vSSD journal.
        std::fs::copy(dir.path().join("vssd.journal"), dir.path().join("x")).unwrap();
        let h = cachevisor_store::journal::Header { block_size: 1 << 20, slots: 8, generation: 1 };
        std::fs::write(dir.path().join("vssd.journal"), h.encode(cachevisor_store::journal::JOURNAL_MAGIC)).unwrap();
        assert!(VssdMeta::open(dir.path(), g(), false).err().unwrap().contains("bad magic"));
    }
}
