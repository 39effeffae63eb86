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

/// `OpenOptions` whose `create` makes a 0600 file, for a path the operator names (the
/// cache store, a backing image): a symbolic link there is followed (`/dev/disk/by-id/…`
/// names a device that way).
pub fn options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(FILE_MODE);
    o
}

/// `OpenOptions` for a file the daemon names itself in one of its directories (journal,
/// checkpoint, owner note, token, snapshots, swap files): 0600 when created, and a
/// symbolic link in its place is refused (`O_NOFOLLOW`), never written through.
pub fn own_options() -> OpenOptions {
    let mut o = options();
    o.custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32);
    o
}

/// Creates (truncating) a 0600 file of the daemon's own for writing; a symbolic link at
/// `path` is refused.
pub fn create(path: &Path) -> io::Result<std::fs::File> {
    own_options().write(true).create(true).truncate(true).open(path)
}

/// Creates a temporary file of the daemon's own, new (`O_EXCL`): whatever a crash or
/// anyone else left at `path` is unlinked first (a symbolic link itself, never its
/// target), and if something appears again before the create it is refused.
pub fn create_temp(path: &Path) -> io::Result<std::fs::File> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    own_options().write(true).create_new(true).open(path)
}

/// Replaces `path` with `bytes` whole or not at all (a 0600 temporary file, synced,
/// renamed over it, the directory synced): small state files a crash must not tear.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = create_temp(&tmp)?;
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
/// (a mistyped path is refused, never built). An existing directory others may write
/// into is refused, naming the `chmod` (whoever can write there can plant a link where
/// the daemon writes its own files, or remove them).
pub fn ensure_dir(path: &Path) -> io::Result<()> {
    match create_dir(path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => {
            let mode = std::fs::metadata(path)?.permissions().mode() & 0o7777;
            if mode & 0o022 != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "the directory has mode {mode:04o}: other users can write into it (and plant links where the daemon writes). Run `chmod go-w {}`",
                        path.display()
                    ),
                ));
            }
            Ok(())
        }
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
    fn the_daemons_own_files_are_never_written_through_a_planted_link() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let planted = d.path().join("checkpoint.tmp");
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        assert!(create(&planted).is_err(), "O_NOFOLLOW");
        write_atomic(&d.path().join("checkpoint"), b"new").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::read(d.path().join("checkpoint")).unwrap(), b"new");
        assert!(std::fs::symlink_metadata(d.path().join("checkpoint")).unwrap().is_file());
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        drop(create_temp(&planted).unwrap());
        assert!(std::fs::symlink_metadata(&planted).unwrap().is_file());
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    }

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
        std::fs::set_permissions(d.path().join("m"), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = ensure_dir(&d.path().join("m")).unwrap_err().to_string();
        assert!(e.contains("0777") && e.contains("chmod go-w"), "{e}");
        check_cache_mode(&f, "cache.path").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = check_cache_mode(&f, "cache.path").unwrap_err();
        assert!(e.contains("0644") && e.contains("chmod 600"), "{e}");
    }
}
