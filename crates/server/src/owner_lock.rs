//! One owner per cache: before a daemon reads or writes anything of a cache, it takes an
//! exclusive `flock` on the cache store file and on its metadata directory, and keeps both
//! for as long as it runs. A second daemon on the same cache (the same config started
//! twice, or two configs that share a cache file or a metadata directory) fails at once,
//! naming the running owner's pid, and has touched nothing. The kernel drops the locks
//! when the owner dies (SIGKILL included), so a dead owner's leftovers never block a
//! restart; the `owner` file beside the metadata is only a note for the error message.
//!
//! `flock` (not `fcntl` locks) because its lock belongs to the open file description:
//! other descriptors of the same file in this process (the O_DIRECT cache store, a
//! backing opened twice) neither take nor drop it.

use rustix::fs::{flock, FlockOperation};
use std::fs::File;
use std::path::{Path, PathBuf};

/// The locks held by the running owner of a cache (released when dropped).
#[derive(Debug)]
pub struct OwnerLock {
    _cache: File,
    _meta: File,
}

/// The note naming the owner, in the metadata directory.
pub fn owner_file(meta_dir: &Path) -> PathBuf {
    meta_dir.join("owner")
}

/// Fails with a message naming `path` when its parent directory does not exist (a typo in
/// a path must not create directories), or when it names a missing device under /dev (a
/// regular file would be created in a RAM file system instead of using a disk).
pub fn parent_must_exist(path: &Path, what: &str) -> Result<(), String> {
    if path.starts_with("/dev") && !path.exists() {
        return Err(format!(
            "{what} {}: no such device (cachevisor creates files, never device nodes)",
            path.display()
        ));
    }
    let parent = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if parent.is_dir() {
        Ok(())
    } else {
        Err(format!(
            "{what} {}: directory {} does not exist (create it first; cachevisor does not create directories)",
            path.display(),
            parent.display()
        ))
    }
}

fn in_use(path: &Path, meta_dir: &Path) -> String {
    let owner = std::fs::read_to_string(owner_file(meta_dir)).ok().and_then(|t| t.lines().next().map(str::to_string));
    let who = match owner {
        Some(o) if !o.is_empty() => format!("another cachevisor ({o})"),
        _ => "another process".to_string(),
    };
    format!("{} is in use by {who}; stop it first, or give this daemon its own cache file and metadata directory. Nothing was changed.", path.display())
}

/// Takes `path` exclusively through `f`, or says who holds it.
fn lock(f: &File, path: &Path, meta_dir: &Path) -> Result<(), String> {
    match flock(f, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => Err(in_use(path, meta_dir)),
        Err(e) => Err(format!("{}: cannot lock: {e}", path.display())),
    }
}

impl OwnerLock {
    /// Locks the cache store at `cache` (created empty when missing; its contents and size
    /// are left alone) and the metadata directory `meta_dir` (created when missing), then
    /// notes this process as the owner. Both parents must exist.
    pub fn acquire(cache: &Path, meta_dir: &Path) -> Result<OwnerLock, String> {
        parent_must_exist(cache, "cache.path")?;
        parent_must_exist(meta_dir, "cache.metadata")?;
        let cache_file = crate::private_files::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(cache)
            .map_err(|e| format!("{}: {e}", cache.display()))?;
        lock(&cache_file, cache, meta_dir)?;
        crate::private_files::check_cache_mode(cache, "cache.path")?;
        crate::private_files::ensure_dir(meta_dir).map_err(|e| format!("{}: {e}", meta_dir.display()))?;
        let meta = File::open(meta_dir).map_err(|e| format!("{}: {e}", meta_dir.display()))?;
        lock(&meta, meta_dir, meta_dir)?;
        let note = format!("pid {} on {}, cache {}\n", std::process::id(), hostname(), cache.display());
        crate::private_files::create(&owner_file(meta_dir))
            .and_then(|mut f| std::io::Write::write_all(&mut f, note.as_bytes()))
            .map_err(|e| format!("{}: {e}", owner_file(meta_dir).display()))?;
        Ok(OwnerLock { _cache: cache_file, _meta: meta })
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "this host".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_owner_is_refused_and_a_dropped_lock_is_free_again() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, meta) = (dir.path().join("c.img"), dir.path().join("c.img.meta"));
        let first = OwnerLock::acquire(&cache, &meta).unwrap();
        let e = OwnerLock::acquire(&cache, &meta).unwrap_err();
        assert!(e.contains("in use") && e.contains(&format!("pid {}", std::process::id())), "{e}");
        // Another metadata directory on the same cache file: refused on the cache file.
        let e = OwnerLock::acquire(&cache, &dir.path().join("other.meta")).unwrap_err();
        assert!(e.contains("c.img is in use"), "{e}");
        // Another cache file with the same metadata directory: refused on the directory.
        let e = OwnerLock::acquire(&dir.path().join("d.img"), &meta).unwrap_err();
        assert!(e.contains("c.img.meta is in use"), "{e}");
        drop(first);
        OwnerLock::acquire(&cache, &meta).unwrap();
        let e = OwnerLock::acquire(Path::new("/dev/cachevisor-no-such-disk"), &meta).unwrap_err();
        assert!(e.contains("no such device"), "{e}");
        assert!(!Path::new("/dev/cachevisor-no-such-disk").exists());
        let e = OwnerLock::acquire(&dir.path().join("nope/c.img"), &meta).unwrap_err();
        assert!(e.contains("nope") && e.contains("does not exist"), "{e}");
        assert!(!dir.path().join("nope").exists());
    }
}
