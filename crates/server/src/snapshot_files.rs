//! Cache-state snapshots on disk (the `prewarm` crate's format): one file per snapshot,
//! `snapshot-<seq>.cvsnap` in a directory, the last `keep` kept.
//!
//! A snapshot is written crash-safe — to a temporary file, fsynced, renamed over its final
//! name, the directory fsynced — so a crash leaves the previous history whole and never a
//! torn file under a snapshot's name (CacheLib's users ask for periodic, crash-safe
//! dumps). It is streamed: the bitmaps go straight into the file. Reading a history takes
//! the newest `keep` files, oldest first; a corrupt or truncated one is refused with an
//! error naming the file.

use cachevisor_prewarm::Snapshot;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// File name suffix of snapshots.
const SUFFIX: &str = ".cvsnap";
/// File name prefix of snapshots.
const PREFIX: &str = "snapshot-";

/// The file name of snapshot `seq`.
pub fn file_name(seq: u64) -> String {
    format!("{PREFIX}{seq:012}{SUFFIX}")
}

/// The snapshots in `dir`, by ascending sequence number (other files are ignored; a
/// missing directory has none).
pub fn list(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for e in entries {
        let e = e?;
        let name = e.file_name();
        let Some(seq) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?.parse::<u64>().ok())
        else {
            continue;
        };
        out.push((seq, e.path()));
    }
    out.sort();
    Ok(out)
}

/// The sequence number the next snapshot in `dir` takes.
pub fn next_seq(dir: &Path) -> io::Result<u64> {
    Ok(list(dir)?.last().map_or(1, |(s, _)| s + 1))
}

/// Writes `snap` as snapshot `snap.seq` of `dir` (created 0700 if missing; its parent must
/// exist), crash-safe (a 0600 file), then
/// removes all but the newest `keep`. Returns its path.
pub fn write(dir: &Path, snap: &Snapshot, keep: usize) -> io::Result<PathBuf> {
    cachevisor_files::private_files::ensure_dir(dir)?;
    let path = dir.join(file_name(snap.seq));
    let tmp = dir.join(format!(".{}.tmp", file_name(snap.seq)));
    let f = cachevisor_files::private_files::create_temp(&tmp)?;
    let mut w = BufWriter::new(f);
    let written = snap.write_to(&mut w).and_then(|_| w.flush()).and_then(|_| w.get_ref().sync_all());
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    drop(w);
    std::fs::rename(&tmp, &path)?;
    std::fs::File::open(dir)?.sync_all()?;
    let all = list(dir)?;
    for (_, old) in all.iter().take(all.len().saturating_sub(keep.max(1))) {
        std::fs::remove_file(old)?;
    }
    Ok(path)
}

/// The newest `keep` snapshots of `dir`, oldest first. Any of them unreadable: an error
/// naming the file (the caller goes on cold rather than prewarm from a partial history).
pub fn read_history(dir: &Path, keep: usize) -> Result<Vec<Snapshot>, String> {
    read_history_clipped(dir, keep, &|_| Some(cachevisor_prewarm::roaring_clip::ALL), u64::MAX).map(|(h, _)| h)
}

/// [`read_history`] with each set's blocks cut at `end(set name)` while decoded (`None`:
/// a set kept empty, unread) and a set of more than `cap` blocks refused
/// (`Snapshot::read_clipped`: a hostile run container is never expanded past a vDisk's
/// end). Also returns how many blocks were cut.
pub fn read_history_clipped(
    dir: &Path,
    keep: usize,
    end: &dyn Fn(&str) -> Option<u64>,
    cap: u64,
) -> Result<(Vec<Snapshot>, u64), String> {
    let shown = crate::log_safe(&dir.display().to_string());
    let all = list(dir).map_err(|e| format!("{shown}: {e}"))?;
    if all.is_empty() {
        return Err(format!("{shown}: no snapshots (snapshot-*.cvsnap) there"));
    }
    let (mut out, mut clipped) = (Vec::new(), 0);
    for (_, p) in all.iter().skip(all.len().saturating_sub(keep.max(1))) {
        let f = cachevisor_files::bounded_read::open_regular(p)
            .map_err(|e| format!("{}: {e}", crate::log_safe(&p.display().to_string())))?;
        let (s, cut) = Snapshot::read_clipped(io::BufReader::new(f), end, cap)
            .map_err(|e| format!("{}: {e}", crate::log_safe(&p.display().to_string())))?;
        out.push(s);
        clipped += cut;
    }
    Ok((out, clipped))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(seq: u64, blocks: &[u64]) -> Snapshot {
        let mut s = Snapshot::new(seq, seq * 100, 4096);
        s.sets.insert("vm1".into(), blocks.iter().copied().collect());
        s
    }

    #[test]
    fn writes_keep_the_newest_and_a_history_reads_back_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("snaps");
        assert_eq!(next_seq(&d).unwrap(), 1, "a missing directory has none");
        for seq in 1..=5 {
            write(&d, &snap(seq, &[seq, 100]), 3).unwrap();
        }
        let names: Vec<u64> = list(&d).unwrap().into_iter().map(|(s, _)| s).collect();
        assert_eq!(names, [3, 4, 5]);
        assert_eq!(next_seq(&d).unwrap(), 6);
        let h = read_history(&d, 2).unwrap();
        assert_eq!(h.iter().map(|s| s.seq).collect::<Vec<_>>(), [4, 5]);
        assert!(h[1].sets["vm1"].contains(5));
        // No temporary file is left behind, and strangers in the directory are ignored.
        std::fs::write(d.join("notes.txt"), "x").unwrap();
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 4);
        assert_eq!(list(&d).unwrap().len(), 3);
    }

    #[test]
    fn a_nul_or_newline_in_a_path_is_escaped_in_the_message() {
        let e = read_history(Path::new("/nonexistent/a\nb\u{0}c"), 4).unwrap_err();
        assert!(!e.contains('\n') && !e.contains('\u{0}') && e.contains("a\\nb\\0c"), "{e}");
    }

    #[test]
    fn a_fifo_named_like_a_snapshot_is_refused_at_once() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(file_name(3));
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &p,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
            0,
        )
        .unwrap();
        let t = std::time::Instant::now();
        let e = read_history(d.path(), 4).unwrap_err();
        assert!(e.contains("not a regular file") && e.contains(&file_name(3)), "{e}");
        assert!(t.elapsed() < std::time::Duration::from_secs(2));
    }

    #[test]
    fn a_corrupt_or_truncated_snapshot_is_named_and_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(d, &snap(1, &[1, 2, 3]), 5).unwrap();
        let p = write(d, &snap(2, &[4]), 5).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 3]).unwrap();
        let e = read_history(d, 5).unwrap_err();
        assert!(e.contains("snapshot-000000000002.cvsnap") && e.contains("checksum"), "{e}");
        let mut flipped = bytes.clone();
        flipped[30] ^= 0xff;
        std::fs::write(&p, &flipped).unwrap();
        assert!(read_history(d, 5).unwrap_err().contains("snapshot-000000000002.cvsnap"));
        // Only the older one is asked for: it reads.
        std::fs::remove_file(&p).unwrap();
        assert_eq!(read_history(d, 5).unwrap().len(), 1);
        let empty = tempfile::tempdir().unwrap();
        assert!(read_history(empty.path(), 5).unwrap_err().contains("no snapshots"));
    }
}
