//! A path the daemon is about to bind a unix socket at (`listen.unix`, each vhost-user
//! `NAME.sock`, a vSSD's `control`) may hold only nothing or a *stale socket*: one no
//! server answers, left by a run that died. Anything else — a disk image a typo named, a
//! directory, a socket another server listens on — is refused by name, in
//! `serve --check-config` too, and never replaced. [`bind_unix`]
//! removes the stale socket and renames the new one into place with `RENAME_NOREPLACE`,
//! so a file created between the check and the bind is refused as well.

use std::os::unix::fs::FileTypeExt;
use std::path::Path;

/// What is at a listen path now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AtPath {
    /// Nothing.
    Free,
    /// A socket no server answers (connection refused): safe to remove.
    StaleSocket,
    /// A socket a server listens on (this daemon itself, when the configuration is
    /// checked while it runs).
    LiveSocket,
}

/// Looks at `path` without changing it: what is there, or the reason it can never be
/// bound (not a socket), starting with `key` and the path.
pub(crate) fn inspect(path: &Path, key: &str) -> Result<AtPath, String> {
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(AtPath::Free),
        Err(e) => return Err(format!("{key}: {}: {e}", path.display())),
    };
    let t = m.file_type();
    if !t.is_socket() {
        let what = match t.is_file() {
            true => format!("a regular file of {} bytes", m.len()),
            false => cachevisor_files::bounded_read::kind(t).to_string(),
        };
        return Err(format!(
            "{key}: {} is {what}, not a socket: cachevisor replaces only a stale socket there (a typo naming a disk image would destroy it). Choose another path, or remove it yourself if it is yours to remove",
            path.display()
        ));
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Ok(AtPath::LiveSocket),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Ok(AtPath::StaleSocket),
        Err(e) => Err(format!("{key}: {}: a socket that cannot be checked: {e}", path.display())),
    }
}

/// Makes `path` free to bind: a stale socket is removed, anything else refused
/// ([`inspect`]; a live socket too).
pub(crate) fn clear(path: &Path, key: &str) -> Result<(), String> {
    let at = inspect(path, key)?;
    if at == AtPath::LiveSocket {
        return Err(format!(
            "{key}: {} is a socket a running server listens on (another cachevisor?): stop it or choose another path",
            path.display()
        ));
    }
    if at == AtPath::StaleSocket {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(format!("{key}: removing the stale socket {}: {e}", path.display()))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Moves the socket bound at `staged` to `path` unless something is there by now (the
/// kernel's `RENAME_NOREPLACE`: never over a file created after [`clear`]).
pub(crate) fn move_into_place(staged: &Path, path: &Path, key: &str) -> Result<(), String> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    renameat_with(CWD, staged, CWD, path, RenameFlags::NOREPLACE).map_err(|e| {
        if e == rustix::io::Errno::EXIST {
            format!(
                "{key}: {} appeared while the socket was bound: it is left as it is; choose another path",
                path.display()
            )
        } else {
            format!("{key}: {}: {e}", path.display())
        }
    })
}

/// Binds a unix socket at `path` with file mode `mode` (and group `(name, gid)`), never
/// reachable with another: bound inside a fresh 0700 directory beside it, given its mode
/// and group, then renamed into place (a chmod after binding at `path` would leave it
/// open to the umask's mode for a moment). Only nothing or a stale socket is replaced
/// (`listen_path`): never a file, a directory or a live socket. Errors start with `key`.
pub(crate) fn bind_unix(
    path: &std::path::Path,
    key: &str,
    mode: u32,
    group: Option<(&str, u32)>,
) -> Result<std::os::unix::net::UnixListener, String> {
    use std::os::unix::fs::PermissionsExt;
    let at = |e: std::io::Error| format!("{key}: {}: {e}", path.display());
    clear(path, key)?;
    let parent = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let private = parent.join(format!(".cv-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&private); // a crashed start's leftover
    cachevisor_files::private_files::create_dir(&private).map_err(at)?;
    let staged = private.join("s");
    let r = std::os::unix::net::UnixListener::bind(&staged).map_err(at).and_then(|l| {
        if let Some((name, gid)) = group {
            std::os::unix::fs::chown(&staged, None, Some(gid)).map_err(|e| {
                format!("listen.unix_group: cannot give {} to group `{name}`: {e} (the daemon's user must be in that group, or root)", path.display())
            })?;
        }
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(mode)).map_err(at)?;
        move_into_place(&staged, path, key)?;
        Ok(l)
    });
    let _ = std::fs::remove_dir_all(&private);
    r
}

/// The socket file of an export named `name` in `dir`, if the name can be a file name
/// (letters, digits, `.`, `_`, `-`; not starting with `.`).
pub(crate) fn socket_path(dir: &Path, name: &str) -> Option<std::path::PathBuf> {
    let ok = !name.is_empty()
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    ok.then(|| dir.join(format!("{name}.sock")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_nothing_or_a_stale_socket_may_be_bound_over() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x");
        assert_eq!(inspect(&p, "k").unwrap(), AtPath::Free);
        std::fs::write(&p, b"a VM's data").unwrap();
        let e = clear(&p, "listen.unix").unwrap_err();
        assert!(e.starts_with("listen.unix:") && e.contains("regular file of 11 bytes"), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"a VM's data", "nothing changed");
        std::fs::remove_file(&p).unwrap();
        std::fs::create_dir(&p).unwrap();
        assert!(clear(&p, "k").unwrap_err().contains("a directory"));
        std::fs::remove_dir(&p).unwrap();
        std::os::unix::fs::symlink(d.path().join("target"), &p).unwrap();
        assert!(clear(&p, "k").unwrap_err().contains("symbolic link"));
        std::fs::remove_file(&p).unwrap();
        // A live socket is refused; the same socket once its server is gone is stale.
        let l = std::os::unix::net::UnixListener::bind(&p).unwrap();
        assert_eq!(inspect(&p, "k").unwrap(), AtPath::LiveSocket);
        assert!(clear(&p, "k").unwrap_err().contains("running server"));
        drop(l);
        assert_eq!(inspect(&p, "k").unwrap(), AtPath::StaleSocket);
        clear(&p, "k").unwrap();
        assert!(!p.exists());
        // The rename never replaces what appeared meanwhile.
        let staged = d.path().join("s");
        let _l = std::os::unix::net::UnixListener::bind(&staged).unwrap();
        std::fs::write(&p, b"late").unwrap();
        assert!(move_into_place(&staged, &p, "k").unwrap_err().contains("appeared"));
        assert_eq!(std::fs::read(&p).unwrap(), b"late");
        std::fs::remove_file(&p).unwrap();
        move_into_place(&staged, &p, "k").unwrap();
        assert!(std::fs::symlink_metadata(&p).unwrap().file_type().is_socket());
    }
}
