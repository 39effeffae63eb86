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
//! backing opened twice) neither take nor drop it. The same property means a child this
//! process forks (a `Command` between its fork and its exec) shares the description for
//! a moment: a lock this process has just dropped can still be held by such a child. So
//! a refusal whose note names this very process, on a path no live [`OwnerLock`] of it
//! holds, is retried for up to [`FORKED_CHILD_GRACE`] (the child's exec closes it).

use rustix::fs::{flock, FlockOperation};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a lock that only a forked, not yet exec'd child of this process can hold is
/// waited for.
pub const FORKED_CHILD_GRACE: Duration = Duration::from_secs(5);

/// The paths the live [`OwnerLock`]s of this process hold.
static HELD: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// The locks held by the running owner of a cache (released when dropped).
#[derive(Debug)]
pub struct OwnerLock {
    /// The cache store's lock (`None` while the cache is detached: `cache_swap.rs`).
    cache: Option<(File, PathBuf)>,
    /// The metadata directory's lock (`None` while it left with a detached cache).
    meta: Option<(File, PathBuf)>,
    /// The cache's other devices' locks (`[[cache.device]]`).
    devices: Vec<(File, PathBuf)>,
}

impl Drop for OwnerLock {
    fn drop(&mut self) {
        let held: Vec<PathBuf> =
            [&self.cache, &self.meta].into_iter().flatten().chain(&self.devices).map(|(_, p)| p.clone()).collect();
        HELD.lock().unwrap_or_else(|e| e.into_inner()).retain(|p| !held.contains(p));
    }
}

fn held_here(path: &Path) -> bool {
    HELD.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|p| p == path)
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
    let owner = cachevisor_files::bounded_read::read_to_string(
        &owner_file(meta_dir),
        cachevisor_files::bounded_read::STATE_CAP,
    )
    .ok()
    .and_then(|t| t.lines().next().map(str::to_string));
    let who = match owner {
        Some(o) if !o.is_empty() => format!("another cachevisor ({o})"),
        _ => "another process".to_string(),
    };
    format!("{} is in use by {who}; stop it first, or give this daemon its own cache file and metadata directory. Nothing was changed.", path.display())
}

/// Whether the owner note names this process.
fn noted_as_this_process(meta_dir: &Path) -> bool {
    let note = cachevisor_files::bounded_read::read_to_string(
        &owner_file(meta_dir),
        cachevisor_files::bounded_read::STATE_CAP,
    )
    .unwrap_or_default();
    note.starts_with(&format!("pid {} ", std::process::id()))
}

/// Takes `path` exclusively through `f`, or says who holds it (after waiting out a forked
/// child of this process that still shares a dropped lock, see the top comment).
fn lock(f: &File, path: &Path, meta_dir: &Path) -> Result<(), String> {
    let start = Instant::now();
    loop {
        match flock(f, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(()),
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                let forked_child = !held_here(path) && noted_as_this_process(meta_dir);
                if !forked_child || start.elapsed() >= FORKED_CHILD_GRACE {
                    return Err(in_use(path, meta_dir));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(format!("{}: cannot lock: {e}", path.display())),
        }
    }
}

/// Opens (creating empty when missing, its parent must exist) and locks the cache store
/// or device at `path` (`key` names it), checks its mode, and notes it held here.
fn open_locked(path: &Path, key: &str, meta_dir: &Path) -> Result<File, String> {
    parent_must_exist(path, key)?;
    let f = cachevisor_files::private_files::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    lock(&f, path, meta_dir)?;
    cachevisor_files::private_files::check_cache_mode(path, key)?;
    HELD.lock().unwrap_or_else(|e| e.into_inner()).push(path.to_path_buf());
    Ok(f)
}

impl OwnerLock {
    /// Locks the cache store at `cache` (created empty when missing; its contents and size
    /// are left alone) and the metadata directory `meta_dir` (created when missing), then
    /// notes this process as the owner. Both parents must exist.
    pub fn acquire(cache: &Path, meta_dir: &Path) -> Result<OwnerLock, String> {
        parent_must_exist(cache, "cache.path")?;
        parent_must_exist(meta_dir, "cache.metadata")?;
        let mut owner = OwnerLock { cache: None, meta: None, devices: Vec::new() };
        owner.lock_cache(cache, meta_dir)?;
        owner.lock_meta(cache, meta_dir)?;
        Ok(owner)
    }

    /// Locks the cache store at `cache` (created empty when missing), its parent must
    /// exist: at start, and when a detached cache is attached again.
    pub fn lock_cache(&mut self, cache: &Path, meta_dir: &Path) -> Result<(), String> {
        let f = open_locked(cache, "cache.path", meta_dir)?;
        self.cache = Some((f, cache.to_path_buf()));
        Ok(())
    }

    /// Locks the cache's device at `path` (`key` names it in errors: `cache.device[i].path`;
    /// created empty when missing, its parent must exist), as [`Self::lock_cache`] does the
    /// first: another process using it as a cache store is refused, and so is this one
    /// while another holds it.
    pub fn lock_device(&mut self, path: &Path, key: &str, meta_dir: &Path) -> Result<(), String> {
        // Every refusal names the key (`parent_must_exist`'s does already).
        let f =
            open_locked(path, key, meta_dir).map_err(|e| if e.starts_with(key) { e } else { format!("{key}: {e}") })?;
        self.devices.push((f, path.to_path_buf()));
        Ok(())
    }

    /// Locks the metadata directory `meta_dir` (created when missing) and notes this
    /// process as the owner of `cache`.
    pub fn lock_meta(&mut self, cache: &Path, meta_dir: &Path) -> Result<(), String> {
        cachevisor_files::private_files::ensure_dir(meta_dir).map_err(|e| format!("{}: {e}", meta_dir.display()))?;
        let meta = File::open(meta_dir).map_err(|e| format!("{}: {e}", meta_dir.display()))?;
        lock(&meta, meta_dir, meta_dir)?;
        HELD.lock().unwrap_or_else(|e| e.into_inner()).push(meta_dir.to_path_buf());
        self.meta = Some((meta, meta_dir.to_path_buf()));
        // The cache store's absolute path: `check --metadata` finds the store by it.
        let cache = std::path::absolute(cache).unwrap_or_else(|_| cache.to_path_buf());
        let note = format!("pid {} on {}, cache {}\n", std::process::id(), hostname(), cache.display());
        cachevisor_files::private_files::create(&owner_file(meta_dir))
            .and_then(|mut f| std::io::Write::write_all(&mut f, note.as_bytes()))
            .map_err(|e| format!("{}: {e}", owner_file(meta_dir).display()))
    }

    /// Lets go of the cache's device at `path` (its lock's descriptor closed: a device
    /// removed online, `cachevisor cache remove`).
    pub fn release_device(&mut self, path: &Path) {
        self.devices.retain(|(_, p)| p != path);
        HELD.lock().unwrap_or_else(|e| e.into_inner()).retain(|h| h != path);
    }

    /// Lets go of the cache store (its descriptor closed: the device can be removed).
    pub fn release_cache(&mut self) {
        if let Some((_, p)) = self.cache.take() {
            HELD.lock().unwrap_or_else(|e| e.into_inner()).retain(|h| *h != p);
        }
    }

    /// Lets go of the metadata directory (its descriptor closed).
    pub fn release_meta(&mut self) {
        if let Some((_, p)) = self.meta.take() {
            HELD.lock().unwrap_or_else(|e| e.into_inner()).retain(|h| *h != p);
        }
    }
}

/// The metadata directory alone locked, as an owner would lock it: what an offline tool
/// that rewrites the metadata (`cachevisor check --repair`) holds, so that no daemon
/// runs on it meanwhile (and none starts).
pub struct MetadataLock {
    _meta: File,
}

impl MetadataLock {
    /// Locks `meta_dir` (which must exist); refused naming the running owner.
    pub fn acquire(meta_dir: &Path) -> Result<MetadataLock, String> {
        let meta = File::open(meta_dir).map_err(|e| format!("{}: {e}", meta_dir.display()))?;
        lock(&meta, meta_dir, meta_dir)?;
        Ok(MetadataLock { _meta: meta })
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

    /// A child forked while the lock was held keeps a share of it until its exec; the
    /// lock dropped meanwhile is taken again once the child lets go (seen in CI: a
    /// parallel test's `qemu-img` made a daemon restarted in the same process fail to
    /// start). The child here holds the share on its stdin for 0.4 s, a slow exec.
    #[test]
    fn a_lock_a_forked_child_still_shares_is_taken_once_the_child_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, meta) = (dir.path().join("c.img"), dir.path().join("c.img.meta"));
        let first = OwnerLock::acquire(&cache, &meta).unwrap();
        let share = first.meta.as_ref().unwrap().0.try_clone().unwrap();
        let mut child = std::process::Command::new("sleep").arg("0.4").stdin(share).spawn().unwrap();
        drop(first);
        let t = Instant::now();
        let again = OwnerLock::acquire(&cache, &meta);
        child.wait().unwrap();
        assert!(again.is_ok(), "{again:?}");
        assert!(t.elapsed() >= Duration::from_millis(100), "the child held it: {:?}", t.elapsed());
        // The lock held by a live OwnerLock of this process is still refused at once.
        let t = Instant::now();
        assert!(OwnerLock::acquire(&cache, &meta).is_err());
        assert!(t.elapsed() < FORKED_CHILD_GRACE);
    }
}
