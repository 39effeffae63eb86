//! The cache store's label: its first 4 KiB say which cache it is — a
//! random identity made when the store is first used, and the generation of the start
//! that last wrote it — and the metadata names both (`Record::CacheLabel`). Slots and the
//! vSSD region start after it ([`DATA_OFFSET`]). As bcache and dm-cache keep a superblock
//! with the cache's identity on the cache device itself: a cache file emptied, truncated,
//! replaced or restored from an older copy while the daemon was down no longer matches its
//! metadata, and its bytes are never served as the VMs' data or written back over their
//! disks. What a start does then (`daemon/start.rs`, [`Verdict`]): with dirty blocks
//! recorded it refuses, naming the vDisks and how much is at stake; with only clean blocks
//! it starts cold and says so.
//!
//! Crash safety of the generation: a start writes its checkpoint (naming the new
//! generation and the one before) and then the label, so a crash between the two leaves a
//! label of the previous generation, which the metadata still accepts.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// Bytes the label takes at the start of the cache store; slot 0 starts here.
pub const DATA_OFFSET: u64 = 4096;
/// The label's magic.
const MAGIC: [u8; 8] = *b"CVCACHE1";
/// Bytes of the label that are checked (magic, version, id, generation, block size, crc).
const USED: usize = 8 + 4 + 16 + 8 + 8 + 4;

/// What the label of a cache store says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Label {
    /// The store's identity (random, made once).
    pub id: [u8; 16],
    /// The generation of the start that wrote it.
    pub generation: u64,
    /// The cache block size it was written for.
    pub block_size: u64,
}

/// What the metadata says the label must be: its identity and the generations a label
/// may carry (the last start's, and the one before for a crash between checkpoint and
/// label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    /// Identity.
    pub id: [u8; 16],
    /// The generation the last start wrote.
    pub generation: u64,
    /// The generation before it (accepted too).
    pub previous: u64,
}

impl Label {
    /// A new identity for a store used for the first time.
    pub fn new(generation: u64, block_size: u64) -> Label {
        Label { id: rand::random(), generation, block_size }
    }

    /// The 4 KiB on disk.
    pub fn encode(&self) -> [u8; DATA_OFFSET as usize] {
        let mut b = [0u8; DATA_OFFSET as usize];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        b[12..28].copy_from_slice(&self.id);
        b[28..36].copy_from_slice(&self.generation.to_le_bytes());
        b[36..44].copy_from_slice(&self.block_size.to_le_bytes());
        let crc = crc32fast::hash(&b[..USED - 4]);
        b[USED - 4..USED].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes a label; the error says what is there instead (zeros, another magic, a
    /// damaged label).
    pub fn decode(b: &[u8]) -> Result<Label, String> {
        if b.len() < USED {
            return Err(format!("the store is {} bytes long: no label", b.len()));
        }
        if b[..USED].iter().all(|&x| x == 0) {
            return Err("its label is all zeros (emptied, or never written)".into());
        }
        if b[0..8] != MAGIC {
            return Err("it has no cachevisor label (another file, or overwritten)".into());
        }
        let crc = u32::from_le_bytes(b[USED - 4..USED].try_into().expect("4"));
        if crc32fast::hash(&b[..USED - 4]) != crc {
            return Err("its label is damaged (checksum mismatch)".into());
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8"));
        Ok(Label { id: b[12..28].try_into().expect("16"), generation: u64_at(28), block_size: u64_at(36) })
    }

    /// The identity the device of `serial` of a cache over several devices carries: the
    /// cache's own for serial 0 (`[cache] path`), for each other device the cache's with
    /// its serial (given once when it joins: `journal::DeviceRow`) folded into the last
    /// two bytes — so a start finds each device wherever it is in the list, and another
    /// cache's device never passes as this one's.
    pub fn device_id(id: &[u8; 16], serial: u16) -> [u8; 16] {
        let mut d = *id;
        let [a, b] = serial.to_le_bytes();
        d[14] ^= a;
        d[15] ^= b;
        d
    }

    /// The identity as text (for messages and `check`).
    pub fn id_text(id: &[u8; 16]) -> String {
        id.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Reads the label of the store at `path` (opened for reading only): `Err` says why there
/// is none.
pub fn read(path: &std::path::Path) -> Result<Label, String> {
    let f = File::open(path).map_err(|e| e.to_string())?;
    let mut b = vec![0u8; USED];
    match f.read_exact_at(&mut b, 0) {
        Ok(()) => Label::decode(&b),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Err(format!("the store is {} bytes long: no label", f.metadata().map_or(0, |m| m.len())))
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Writes `label` into store `f` (O_DIRECT or not: through an aligned buffer) and syncs it.
pub fn write(f: &File, label: &Label) -> std::io::Result<()> {
    let mut bounce = cachevisor_files::aligned_buf::AlignedBuf::default();
    cachevisor_files::aligned_buf::write_at(f, &mut bounce, &label.encode(), 0)?;
    f.sync_data()
}

/// Whether the store's label (`found`) is the one the metadata names (`expected`), for a
/// cache of `block_size`; `Err` says how it differs.
pub fn check(found: &Result<Label, String>, expected: &Expected, block_size: u64) -> Result<(), String> {
    let l = found.as_ref().map_err(|e| e.clone())?;
    if l.id != expected.id {
        return Err(format!(
            "it is another cache store (identity {}, the metadata names {})",
            Label::id_text(&l.id),
            Label::id_text(&expected.id)
        ));
    }
    if l.generation != expected.generation && l.generation != expected.previous {
        return Err(format!(
            "it is an older or newer copy of this cache (generation {}, the metadata names {})",
            l.generation, expected.generation
        ));
    }
    if l.block_size != block_size {
        return Err(format!("it was written with {}-byte blocks, not {block_size}", l.block_size));
    }
    Ok(())
}

/// What a start does with the cache store it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The store is the one the metadata names: its blocks are served (the label keeps
    /// its identity; `found` is the generation on disk now).
    Warm {
        /// Identity.
        id: [u8; 16],
        /// Generation on disk now.
        found: u64,
    },
    /// The store is not (or the metadata names no label): every cached block is dropped
    /// (none dirty, or the dirty ones deliberately discarded) and the store gets a new
    /// identity. `None` when there was nothing to drop (a new cache).
    Cold(Option<String>),
}

/// The dirty blocks a start would lose, of `held` (`(vDisk, blocks, dirty blocks)` each)
/// not in `discard`: `None` when none; else the list a refusal names ("`vm1` 12 blocks
/// (48.00 KiB), …") and the flags that drop them deliberately ("--discard-dirty vm1 …").
pub fn dirty_at_stake(
    held: &[(String, u64, u64)],
    discard: &dyn Fn(&str) -> bool,
    block_size: u64,
) -> Option<(String, String)> {
    let at_stake: Vec<&(String, u64, u64)> = held.iter().filter(|h| h.2 > 0 && !discard(&h.0)).collect();
    if at_stake.is_empty() {
        return None;
    }
    let list: Vec<String> = at_stake
        .iter()
        .map(|(n, _, d)| format!("`{n}` {d} blocks ({})", cachevisor_trace::units::format_size(d * block_size)))
        .collect();
    let flags: Vec<String> = at_stake.iter().map(|h| format!("--discard-dirty {}", h.0)).collect();
    Some((list.join(", "), flags.join(" ")))
}

/// Decides what a start does with the store at `path` (the config's `key` for it,
/// `cache.path` or `cache.device[i].path`) given its label (`found`), what the
/// metadata in `meta_dir` names (`expected`: `None` for a new cache, or metadata written
/// before stores carried labels), and the blocks it records, `(vDisk, blocks, dirty
/// blocks)` each. Dirty blocks on a store that is not theirs refuse the start — naming
/// the vDisks, how much, and the ways out — unless each such vDisk is in `discard`.
pub fn verdict(
    found: &Result<Label, String>,
    expected: Option<&Expected>,
    block_size: u64,
    held: &[(String, u64, u64)],
    discard: &dyn Fn(&str) -> bool,
    (key, path, meta_dir): (&str, &std::path::Path, &std::path::Path),
) -> Result<Verdict, String> {
    let why = match expected {
        Some(e) => match check(found, e, block_size) {
            Ok(()) => return Ok(Verdict::Warm { id: e.id, found: found.as_ref().map_or(0, |l| l.generation) }),
            Err(why) => why,
        },
        None => "its metadata was written before cache stores carried a label (an earlier cachevisor), so its blocks cannot be told to be the store's".to_string(),
    };
    let blocks: u64 = held.iter().map(|h| h.1).sum();
    if blocks == 0 {
        return Ok(Verdict::Cold(expected.map(|_| format!("{}: {why}", path.display()))));
    }
    if let Some((list, flags)) = dirty_at_stake(held, discard, block_size) {
        return Err(format!(
            "{key}: {} is not the cache store its metadata ({}) describes: {why}. The metadata records dirty blocks that were only in that store: {}. Serving them would give clients whatever is there now as their data, and write it back over their disks. Put the cache store the metadata belongs to back at {key} (or point cache.metadata at this store's own metadata) and start again, or start with `{}` to drop them deliberately (what they held is lost; each backing store keeps what was written back before). Nothing was changed.",
            path.display(),
            meta_dir.display(),
            list,
            flags
        ));
    }
    Ok(Verdict::Cold(Some(format!(
        "{}: {why}: its {blocks} cached blocks were dropped{}",
        path.display(),
        if held.iter().any(|h| h.2 > 0) { " (dirty ones discarded by --discard-dirty)" } else { " (all clean)" }
    ))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_is_recognized_only_as_itself() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c");
        std::fs::write(&p, b"").unwrap();
        assert!(read(&p).unwrap_err().contains("0 bytes long"));
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
        f.set_len(1 << 20).unwrap();
        assert!(read(&p).unwrap_err().contains("all zeros"));
        let l = Label::new(7, 4096);
        write(&f, &l).unwrap();
        assert_eq!(read(&p).unwrap(), l);
        let want = Expected { id: l.id, generation: 7, previous: 6 };
        check(&read(&p), &want, 4096).unwrap();
        check(&read(&p), &Expected { generation: 8, previous: 7, ..want }, 4096).unwrap();
        assert!(check(&read(&p), &Expected { generation: 9, previous: 8, ..want }, 4096).unwrap_err().contains("copy"));
        assert!(check(&read(&p), &want, 8192).unwrap_err().contains("4096-byte blocks"));
        let other = Label::new(7, 4096);
        assert!(check(&Ok(other), &want, 4096).unwrap_err().contains("another cache store"));
        let mut b = l.encode();
        b[30] ^= 1;
        assert!(Label::decode(&b).unwrap_err().contains("damaged"));
        b[0] = b'X';
        assert!(Label::decode(&b).unwrap_err().contains("no cachevisor label"));
        // Truncated to nothing and re-extended (the held-out case): zeros, not the label.
        f.set_len(0).unwrap();
        f.set_len(1 << 20).unwrap();
        assert!(check(&read(&p), &want, 4096).unwrap_err().contains("zeros"));
    }

    #[test]
    fn a_foreign_store_with_dirty_blocks_refuses_and_clean_ones_start_cold() {
        let l = Label::new(3, 4096);
        let want = Expected { id: l.id, generation: 3, previous: 2 };
        let paths = ("cache.path", std::path::Path::new("/c.img"), std::path::Path::new("/c.img.meta"));
        let none = |_: &str| false;
        let held = vec![("vm1".to_string(), 10, 4), ("vm2".to_string(), 5, 0)];
        assert_eq!(verdict(&Ok(l), Some(&want), 4096, &held, &none, paths), Ok(Verdict::Warm { id: l.id, found: 3 }));
        let zeros: Result<Label, String> = Err("its label is all zeros".into());
        let e = verdict(&zeros, Some(&want), 4096, &held, &none, paths).unwrap_err();
        assert!(
            e.contains("`vm1` 4 blocks (16.00 KiB)") && e.contains("--discard-dirty vm1") && !e.contains("vm2"),
            "{e}"
        );
        assert!(e.contains("all zeros") && e.contains("Nothing was changed"), "{e}");
        let discard = |n: &str| n == "vm1";
        let v = verdict(&zeros, Some(&want), 4096, &held, &discard, paths).unwrap();
        assert!(
            matches!(&v, Verdict::Cold(Some(w)) if w.contains("15 cached blocks") && w.contains("discarded")),
            "{v:?}"
        );
        let clean = vec![("vm2".to_string(), 5, 0)];
        let v = verdict(&zeros, Some(&want), 4096, &clean, &none, paths).unwrap();
        assert!(matches!(&v, Verdict::Cold(Some(w)) if w.contains("all clean")), "{v:?}");
        // A new cache: nothing recorded, no label yet.
        assert_eq!(verdict(&zeros, None, 4096, &[], &none, paths), Ok(Verdict::Cold(None)));
        // Metadata from before labels, with dirty blocks: refused too.
        let e = verdict(&zeros, None, 4096, &held, &none, paths).unwrap_err();
        assert!(e.contains("before cache stores carried a label"), "{e}");
    }
}
