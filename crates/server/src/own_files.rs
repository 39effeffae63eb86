//! The daemon's own files, and the rule that no client-facing store may be one of them:
//! a vDisk backed by `METADATA/api-token` would serve the API token to
//! any NBD client, one backed by `METADATA/checkpoint` would let a client rewrite the
//! metadata, one backed by `/proc/self/mem` or `/dev/zero` is no disk at all. A backing
//! (config, API or reload), a vSSD swap directory and a snapshot directory are checked
//! here against the cache store, the metadata directory (every file in it, by inode, so a
//! hard link elsewhere is caught too), the snapshot directories, the TLS files and
//! directories, `/proc` and `/sys`, with every path resolved through symbolic links; a
//! backing must be a regular file or a block device (or not exist yet, to be created).
//! The errors name the key and what the path turned out to be.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Entries of the metadata directory compared by inode at most (a bound on the walk).
const MAX_WALK: usize = 100_000;

/// The places the daemon keeps for itself, by path (resolved when checked: the files in
/// them change while it runs).
#[derive(Debug, Clone, Default)]
pub struct OwnFiles {
    /// Directories nothing client-facing may be in.
    dirs: Vec<OwnDir>,
    /// Files nothing client-facing may be (by path or any hard link): (path, what).
    files: Vec<(PathBuf, String)>,
}

/// The metadata directory a config uses (`cache.metadata`, else `cache.path` + `.meta`).
pub fn metadata_dir(cfg: &crate::config::Config) -> PathBuf {
    cfg.cache.metadata.clone().unwrap_or_else(|| {
        let mut p = cfg.cache.path.clone().into_os_string();
        p.push(".meta");
        p.into()
    })
}

/// `path` with every symbolic link resolved; a path that does not exist yet resolves its
/// parent (its last component is what would be created).
fn resolved(path: &Path) -> PathBuf {
    if let Ok(p) = path.canonicalize() {
        return p;
    }
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    match (abs.parent(), abs.file_name()) {
        (Some(dir), Some(name)) => resolved(dir).join(name),
        _ => abs,
    }
}

/// One of the daemon's directories: its path, the key naming it (`/proc` and `/sys` for
/// those), and what it is in words.
#[derive(Debug, Clone)]
struct OwnDir {
    path: PathBuf,
    key: &'static str,
    what: String,
}

impl OwnDir {
    fn new(path: &Path, key: &'static str, what: &str) -> OwnDir {
        OwnDir { path: path.to_path_buf(), key, what: format!("{what} ({key})") }
    }
}

impl OwnFiles {
    /// The daemon's own places under `cfg`.
    pub fn of(cfg: &crate::config::Config) -> OwnFiles {
        let meta = metadata_dir(cfg);
        let mut dirs = vec![
            OwnDir::new(&meta, "cache.metadata", "the metadata directory"),
            OwnDir { path: "/proc".into(), key: "/proc", what: "/proc".into() },
            OwnDir { path: "/sys".into(), key: "/sys", what: "/sys".into() },
        ];
        let l = &cfg.listen;
        let cluster = cfg.cluster.as_ref();
        for (d, key, what) in [
            (l.tls_dir.as_ref(), "listen.tls_dir", "the TLS directory"),
            (cfg.prewarm.snapshot_dir.as_ref(), "prewarm.snapshot_dir", "the snapshot directory"),
            (cluster.and_then(|c| c.peer_tls_dir.as_ref()), "cluster.peer_tls_dir", "the peers' TLS directory"),
            (cluster.and_then(|c| c.snapshots.as_ref()), "cluster.snapshots", "the cluster's snapshot directory"),
        ] {
            dirs.extend(d.map(|d| OwnDir::new(d, key, what)));
        }
        let mut files = vec![(cfg.cache.path.clone(), "the cache store (cache.path)".to_string())];
        for (i, d) in cfg.cache.device.iter().enumerate() {
            files.push((d.path.clone(), format!("a cache device (cache.device[{i}].path)")));
        }
        for (p, key) in [(&l.tls_cert, "listen.tls_cert"), (&l.tls_key, "listen.tls_key"), (&l.tls_ca, "listen.tls_ca")]
        {
            if let Some(p) = p {
                files.push((p.clone(), format!("the TLS file {key}")));
            }
        }
        OwnFiles { dirs, files }
    }

    /// The protected place `path` (resolved) is in or is, in words.
    fn inside(&self, path: &Path) -> Option<String> {
        let r = resolved(path);
        for o in &self.dirs {
            let d = resolved(&o.path);
            if r.starts_with(&d) {
                return Some(format!("{} is in {} ({})", r.display(), o.what, d.display()));
            }
        }
        for (f, what) in &self.files {
            if resolved(f) == r {
                return Some(format!("{} is {what}", r.display()));
            }
        }
        None
    }

    /// The protected file with the inode of `m` (a hard link of it), in words.
    fn same_inode(&self, m: &std::fs::Metadata) -> Option<String> {
        let same = |p: &Path| std::fs::metadata(p).is_ok_and(|o| o.dev() == m.dev() && o.ino() == m.ino());
        if let Some((f, what)) = self.files.iter().find(|(f, _)| same(f)) {
            return Some(format!("it is a hard link of {what} ({})", f.display()));
        }
        let mut seen = 0;
        for o in self.dirs.iter().filter(|o| !matches!(o.key, "/proc" | "/sys")) {
            let (d, what) = (&o.path, &o.what);
            let mut stack = vec![d.clone()];
            while let Some(dir) = stack.pop() {
                let Ok(entries) = std::fs::read_dir(&dir) else { continue };
                for e in entries.flatten() {
                    seen += 1;
                    if seen > MAX_WALK {
                        return None;
                    }
                    let Ok(t) = e.file_type() else { continue };
                    if t.is_dir() {
                        stack.push(e.path());
                    } else if t.is_file() && e.metadata().is_ok_and(|o| o.dev() == m.dev() && o.ino() == m.ino()) {
                        return Some(format!("it is a hard link of {} in {what}", e.path().display()));
                    }
                }
            }
        }
        None
    }

    /// Refuses a backing (`key` names it) that is one of the daemon's own files, inside
    /// one of its directories, or neither a regular file nor a block device. A URI is
    /// another server's business; a missing file is checked where it would be created.
    pub fn check_backing(&self, path: &Path, key: &str) -> Result<(), String> {
        if cachevisor_store::backing::is_uri(path) {
            return Ok(());
        }
        let refuse = |why: String| {
            Err(format!(
                "{key}: {}: {why}: a vDisk may not be backed by the daemon's own files (its clients could read or overwrite them)",
                path.display()
            ))
        };
        if let Some(why) = self.inside(path) {
            return refuse(why);
        }
        match std::fs::metadata(path) {
            Ok(m) => {
                let t = m.file_type();
                if !t.is_file() && !t.is_block_device() {
                    return Err(format!(
                        "{key}: {} is {}: a backing is a regular file or a block device",
                        path.display(),
                        cachevisor_files::bounded_read::kind(t)
                    ));
                }
                if let Some(why) = self.same_inode(&m) {
                    return refuse(why);
                }
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("{key}: {}: {e}", path.display())),
        }
    }

    /// Refuses a directory the daemon writes into for clients (`key`: a vSSD swap
    /// directory, a snapshot directory) that is the metadata directory itself or inside
    /// another of its own directories (TLS, the other snapshot directory, `/proc`, `/sys`).
    /// A subdirectory of the metadata directory is its own (the defaults
    /// `METADATA/vssd-swap`, `METADATA/snapshots`).
    pub fn check_dir(&self, path: &Path, key: &str) -> Result<(), String> {
        let r = resolved(path);
        for o in self.dirs.iter().filter(|o| o.key != key) {
            let d = resolved(&o.path);
            if r == d || (o.key != "cache.metadata" && r.starts_with(&d)) {
                return Err(format!(
                    "{key}: {} is in {} ({}): choose a directory of its own",
                    r.display(),
                    o.what,
                    d.display()
                ));
            }
        }
        Ok(())
    }
}

/// Checks every path of `cfg` that nothing may already occupy or that may not point into
/// the daemon's own files, reading the file system only (`serve --check-config` and the
/// start, before anything is created): listen sockets (a stale or live socket is fine,
/// anything else refused) and backings; errors name the key.
pub fn check_paths(cfg: &crate::config::Config) -> Result<(), String> {
    use crate::listen_path::inspect;
    if let Some(p) = &cfg.listen.unix {
        inspect(p, "listen.unix")?;
    }
    let own = OwnFiles::of(cfg);
    for (i, v) in cfg.vdisk.iter().enumerate() {
        own.check_backing(&v.backing, &format!("vdisk[{i}] ({}).backing", v.name))?;
    }
    if let Some(d) = &cfg.prewarm.snapshot_dir {
        own.check_dir(d, "prewarm.snapshot_dir")?;
    }
    if let Some(d) = cfg.cluster.as_ref().and_then(|c| c.snapshots.as_ref()) {
        own.check_dir(d, "cluster.snapshots")?;
    }
    let vssd_names: Vec<&str> =
        cfg.vssd.iter().flat_map(|v| v.device.iter().map(|d| d.name.as_str())).collect::<Vec<_>>();
    if let Some(dir) = &cfg.listen.vhost_user {
        for name in cfg.vdisk.iter().map(|v| v.name.as_str()).chain(vssd_names.iter().copied()) {
            if let Some(p) = crate::listen_path::socket_path(dir, name) {
                inspect(&p, &format!("listen.vhost_user ({name})"))?;
            }
        }
    }
    if let Some(v) = &cfg.vssd {
        if let Some(d) = &v.swap_dir {
            own.check_dir(d, "vssd.swap_dir")?;
        }
        for d in &v.device {
            if let Some(p) = &d.control {
                inspect(p, &format!("vssd.device ({}).control", d.name))?;
            }
        }
    }
    Ok(())
}

/// Whether `a` and `b` name the same file: equal, or equal once resolved (links and
/// `..` followed where the file exists, else made absolute against the working
/// directory) — a device path as the configuration, the overlay and the CLI spell it.
pub(crate) fn same_path(a: &Path, b: &Path) -> bool {
    let resolved = |p: &Path| {
        std::fs::canonicalize(p).unwrap_or_else(|_| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()))
    };
    a == b || resolved(a) == resolved(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path) -> crate::config::Config {
        let text = "[cache]\npath = \"c.img\"\nsize = \"1MiB\"\n[listen]\nunix = \"nbd.sock\"\n[[vdisk]]\nname = \"a\"\nbacking = \"a.img\"\nsize = \"1MiB\"\n";
        crate::config::Config::parse(text, "t", dir).unwrap()
    }

    #[test]
    fn backings_in_the_daemons_own_files_are_refused_by_path_link_and_type() {
        let d = tempfile::tempdir().unwrap();
        let cfg = config(d.path());
        let own = OwnFiles::of(&cfg);
        let meta = d.path().join("c.img.meta");
        std::fs::create_dir(&meta).unwrap();
        std::fs::write(meta.join("api-token"), b"secret").unwrap();
        std::fs::write(d.path().join("c.img"), b"").unwrap();
        own.check_backing(&d.path().join("a.img"), "k").unwrap();
        own.check_backing(&d.path().join("new.img"), "k").unwrap();
        own.check_backing(Path::new("nbd://127.0.0.1:1/x"), "k").unwrap();
        let bad = |p: &Path, want: &str| {
            let e = own.check_backing(p, "vdisk[0] (a).backing").unwrap_err();
            assert!(e.starts_with("vdisk[0] (a).backing") && e.contains(want), "{}: {e}", p.display());
        };
        bad(&meta.join("api-token"), "metadata directory");
        bad(&meta.join("checkpoint"), "metadata directory"); // not there yet: would be created
        bad(&d.path().join("c.img"), "cache store");
        // Through a symbolic link and a hard link.
        std::os::unix::fs::symlink(meta.join("api-token"), d.path().join("sym.img")).unwrap();
        bad(&d.path().join("sym.img"), "metadata directory");
        std::fs::hard_link(meta.join("api-token"), d.path().join("hard.img")).unwrap();
        bad(&d.path().join("hard.img"), "hard link");
        std::os::unix::fs::symlink(d.path(), d.path().join("up")).unwrap();
        bad(&d.path().join("up/c.img.meta/journal"), "metadata directory");
        for (p, want) in [("/proc/self/mem", "/proc"), ("/proc/self/environ", "/proc"), ("/sys/kernel/notes", "/sys")] {
            bad(Path::new(p), want);
        }
        let e = own.check_backing(Path::new("/dev/zero"), "k").unwrap_err();
        assert!(e.contains("character device"), "{e}");
        let e = own.check_backing(d.path(), "k").unwrap_err();
        assert!(e.contains("a directory"), "{e}");
        // A swap directory that is the metadata directory, or in /proc.
        assert!(own.check_dir(&meta, "vssd.swap_dir").unwrap_err().contains("metadata directory"));
        assert!(own.check_dir(Path::new("/proc/self"), "vssd.swap_dir").unwrap_err().contains("/proc"));
        own.check_dir(&meta.join("vssd-swap"), "vssd.swap_dir").unwrap();
        own.check_dir(&d.path().join("swap"), "vssd.swap_dir").unwrap();
        // A snapshot directory: not the metadata directory nor a TLS one, its own is fine.
        let mut cfg = config(d.path());
        cfg.prewarm.snapshot_dir = Some(meta.clone());
        assert!(check_paths(&cfg).unwrap_err().starts_with("prewarm.snapshot_dir"));
        cfg.prewarm.snapshot_dir = Some(Path::new("/proc/self/fd").to_path_buf());
        assert!(check_paths(&cfg).unwrap_err().contains("/proc"));
        cfg.prewarm.snapshot_dir = Some(meta.join("snapshots"));
        check_paths(&cfg).unwrap();
        cfg.prewarm.snapshot_dir = Some(d.path().join("snaps"));
        check_paths(&cfg).unwrap();
    }

    #[test]
    fn check_paths_names_the_key_of_a_socket_path_that_holds_a_file() {
        let d = tempfile::tempdir().unwrap();
        let mut cfg = config(d.path());
        check_paths(&cfg).unwrap();
        std::fs::write(d.path().join("a.img"), [1u8; 512]).unwrap();
        cfg.listen.unix = Some(d.path().join("a.img"));
        let e = check_paths(&cfg).unwrap_err();
        assert!(e.starts_with("listen.unix:") && e.contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(d.path().join("a.img")).unwrap(), [1u8; 512]);
        cfg.listen.unix = None;
        cfg.listen.vhost_user = Some(d.path().to_path_buf());
        std::fs::write(d.path().join("a.sock"), b"x").unwrap();
        let e = check_paths(&cfg).unwrap_err();
        assert!(e.starts_with("listen.vhost_user (a):"), "{e}");
    }
}
