//! Files and directories that hold VM data or describe it — the cache store (every VM's
//! dirty blocks), its metadata directory, journals and checkpoints, snapshots, backing
//! images cachevisor creates, recorded traces — are created readable by the daemon's user
//! only (0600 files, 0700 directories), whatever the umask; and a cache store file other
//! users can read refuses the start, naming the `chmod` that fixes it. The standard
//! library's `OpenOptionsExt::mode` and `DirBuilderExt::mode` do the work; this file is
//! only the one place that says which mode.

use std::fs::{DirBuilder, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of a file cachevisor creates.
pub const FILE_MODE: u32 = 0o600;
/// Mode of a directory cachevisor creates.
pub const DIR_MODE: u32 = 0o700;

/// `OpenOptions` whose `create` makes a 0600 file.
pub fn options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(FILE_MODE);
    o
}

/// Creates (truncating) a 0600 file for writing.
pub fn create(path: &Path) -> io::Result<std::fs::File> {
    options().write(true).create(true).truncate(true).open(path)
}

/// Replaces `path` with `bytes` whole or not at all (a 0600 temporary file, synced,
/// renamed over it, the directory synced): small state files a crash must not tear.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(path.parent().unwrap_or(Path::new(".")))?.sync_all()
}

/// Creates directory `path` (0700); its parent must exist.
pub fn create_dir(path: &Path) -> io::Result<()> {
    DirBuilder::new().mode(DIR_MODE).create(path)
}

/// Creates directory `path` (0700) unless it is one already; its parent must exist
/// (a mistyped path is refused, never built).
pub fn ensure_dir(path: &Path) -> io::Result<()> {
    match create_dir(path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
        r => r,
    }
}

/// Refuses a cache store that is a regular file other users may read or write (a block
/// device's access is the system's udev rules' business). `at` names the config key.
pub fn check_cache_mode(path: &Path, at: &str) -> Result<(), String> {
    check_private_file(path, at, "the cached data of every vDisk (dirty blocks included)")
}

/// Refuses a regular file other users may read or write that holds `what` (a block
/// device's access is the system's udev rules' business), naming the `chmod` that fixes
/// it; `at` names the config key or file. A missing file is fine (it is created 0600).
pub fn check_private_file(path: &Path, at: &str, what: &str) -> Result<(), String> {
    check_file_mode(path, at, what, 0o077, "users", 600)
}

/// Refuses a regular file whose mode has any of `forbidden` bits (`who` names them:
/// "users" for group and others, "users outside its group" for others), naming `chmod
/// fix`. A missing file is fine.
pub fn check_file_mode(path: &Path, at: &str, what: &str, forbidden: u32, who: &str, fix: u32) -> Result<(), String> {
    let m = match std::fs::metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        r => r.map_err(|e| format!("{at}: {}: {e}", path.display()))?,
    };
    let mode = m.permissions().mode() & 0o777;
    if m.is_file() && mode & forbidden != 0 {
        return Err(format!(
            "{at}: {} has mode {mode:04o}: other {who} can read {what}. Run `chmod {fix} {}` and start again",
            path.display(),
            path.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_and_directories_are_private_whatever_the_umask() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        drop(create(&f).unwrap());
        assert_eq!(std::fs::metadata(&f).unwrap().permissions().mode() & 0o777, 0o600);
        ensure_dir(&d.path().join("m")).unwrap();
        ensure_dir(&d.path().join("m")).unwrap();
        assert_eq!(std::fs::metadata(d.path().join("m")).unwrap().permissions().mode() & 0o777, 0o700);
        assert!(ensure_dir(&d.path().join("no/such")).is_err(), "missing parents are not created");
        check_cache_mode(&f, "cache.path").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = check_cache_mode(&f, "cache.path").unwrap_err();
        assert!(e.contains("0644") && e.contains("chmod 600"), "{e}");
    }
}
