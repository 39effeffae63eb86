//! Which backing store a vDisk's cached blocks belong to. The metadata records, per vDisk,
//! the identity of the backing it was bound to (as bcache and Open-CAS bind a cache to its
//! backing device): for a file its device and inode numbers and size, for a block device
//! its device number and size, for an NBD backing its URI and export size. At start the
//! configured backing is compared with the recorded one *before anything is opened or
//! created*: a vDisk pointed at another image must never destage its dirty blocks into
//! it. The same identities show two vDisks configured on one backing store.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// A backing store's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A regular file: device, inode, size.
    File {
        /// `st_dev`.
        dev: u64,
        /// `st_ino`.
        ino: u64,
        /// Bytes.
        size: u64,
    },
    /// A block device: its device number and size.
    BlockDevice {
        /// `st_rdev`.
        rdev: u64,
        /// Bytes.
        size: u64,
    },
    /// An NBD export: its URI and size.
    Nbd {
        /// `nbd://HOST:PORT/EXPORT`.
        uri: String,
        /// Bytes.
        size: u64,
    },
}

impl Identity {
    /// The identity of the existing file or block device at `path`, or `None` when there
    /// is nothing there.
    pub fn of_path(path: &Path) -> std::io::Result<Option<Identity>> {
        let m = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if m.file_type().is_block_device() {
            let f = std::fs::File::open(path)?;
            let size = rustix::fs::seek(&f, rustix::fs::SeekFrom::End(0))?;
            return Ok(Some(Identity::BlockDevice { rdev: m.rdev(), size }));
        }
        Ok(Some(Identity::File { dev: m.dev(), ino: m.ino(), size: m.len() }))
    }

    /// Whether `self` and `other` are the same store, whatever their sizes.
    pub fn same_store(&self, other: &Identity) -> bool {
        match (self, other) {
            (Identity::File { dev: a, ino: b, .. }, Identity::File { dev: c, ino: d, .. }) => a == c && b == d,
            (Identity::BlockDevice { rdev: a, .. }, Identity::BlockDevice { rdev: b, .. }) => a == b,
            (Identity::Nbd { uri: a, .. }, Identity::Nbd { uri: b, .. }) => a == b,
            _ => false,
        }
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        match self {
            Identity::File { size, .. } | Identity::BlockDevice { size, .. } | Identity::Nbd { size, .. } => *size,
        }
    }

    /// How it differs from `recorded`, in words (`None`: the same store at the same size).
    pub fn differs_from(&self, recorded: &Identity) -> Option<String> {
        if !self.same_store(recorded) {
            return Some(format!("it is now {}, the cache was bound to {}", self.describe(), recorded.describe()));
        }
        (self.size() != recorded.size())
            .then(|| format!("its size changed from {} to {} bytes", recorded.size(), self.size()))
    }

    /// A short description for messages.
    pub fn describe(&self) -> String {
        match self {
            Identity::File { dev, ino, size } => format!("file inode {ino} on device {dev:#x} ({size} bytes)"),
            Identity::BlockDevice { rdev, size } => format!("block device {rdev:#x} ({size} bytes)"),
            Identity::Nbd { uri, size } => format!("{uri} ({size} bytes)"),
        }
    }

    /// Encodes as the payload of a metadata record.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let (tag, a, b, size, text): (u8, u64, u64, u64, &str) = match self {
            Identity::File { dev, ino, size } => (1, *dev, *ino, *size, ""),
            Identity::BlockDevice { rdev, size } => (2, *rdev, 0, *size, ""),
            Identity::Nbd { uri, size } => (3, 0, 0, *size, uri),
        };
        out.push(tag);
        for v in [a, b, size] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(text.as_bytes());
    }

    /// Decodes [`Self::encode`]'s bytes.
    pub fn decode(p: &[u8]) -> Option<Identity> {
        let (&tag, rest) = p.split_first()?;
        let u = |i: usize| rest.get(i * 8..i * 8 + 8).map(|b| u64::from_le_bytes(b.try_into().expect("8")));
        let (a, b, size) = (u(0)?, u(1)?, u(2)?);
        let text = rest.get(24..)?;
        Some(match tag {
            1 if text.is_empty() => Identity::File { dev: a, ino: b, size },
            2 if text.is_empty() => Identity::BlockDevice { rdev: a, size },
            3 => Identity::Nbd { uri: String::from_utf8(text.to_vec()).ok()?, size },
            _ => return None,
        })
    }
}

/// Where a backing spec points, for telling whether two vDisks share one: the identity of
/// an existing store, else the absolute path it would be created at (or the URI).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// An existing file or block device.
    Existing(Identity),
    /// A file still to be created.
    NewFile(PathBuf),
    /// An NBD URI.
    Uri(String),
}

impl Place {
    /// Where `spec` points.
    pub fn of(spec: &Path) -> std::io::Result<Place> {
        if crate::backing::is_uri(spec) {
            return Ok(Place::Uri(spec.to_string_lossy().into_owned()));
        }
        if let Some(id) = Identity::of_path(spec)? {
            return Ok(Place::Existing(id));
        }
        let abs = std::path::absolute(spec)?;
        let parent = abs.parent().map(|p| p.canonicalize().unwrap_or_else(|_| p.to_path_buf())).unwrap_or_default();
        Ok(Place::NewFile(parent.join(abs.file_name().unwrap_or_default())))
    }

    /// Whether two places are the same store.
    pub fn same(&self, other: &Place) -> bool {
        match (self, other) {
            (Place::Existing(a), Place::Existing(b)) => a.same_store(b),
            (a, b) => a == b,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_round_trip_and_tell_stores_apart() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.img"), dir.path().join("b.img"));
        std::fs::write(&a, [0u8; 4096]).unwrap();
        std::fs::write(&b, [0u8; 4096]).unwrap();
        let ia = Identity::of_path(&a).unwrap().unwrap();
        let ib = Identity::of_path(&b).unwrap().unwrap();
        assert!(ia.differs_from(&ia).is_none());
        assert!(ib.differs_from(&ia).unwrap().contains("bound to"));
        // A hard link is the same store; a copy is not.
        std::fs::hard_link(&a, dir.path().join("link.img")).unwrap();
        assert!(Place::of(&dir.path().join("link.img")).unwrap().same(&Place::of(&a).unwrap()));
        assert!(!Place::of(&b).unwrap().same(&Place::of(&a).unwrap()));
        assert!(Place::of(&dir.path().join("new.img"))
            .unwrap()
            .same(&Place::of(&dir.path().join(".").join("new.img")).unwrap()));
        std::fs::write(&a, [0u8; 8192]).unwrap();
        assert!(Identity::of_path(&a).unwrap().unwrap().differs_from(&ia).unwrap().contains("size changed"));
        assert_eq!(Identity::of_path(&dir.path().join("none")).unwrap(), None);
        for id in [
            ia,
            Identity::BlockDevice { rdev: 0x801, size: 1 << 30 },
            Identity::Nbd { uri: "nbd://127.0.0.1:1/x".into(), size: 5 },
        ] {
            let mut buf = Vec::new();
            id.encode(&mut buf);
            assert_eq!(Identity::decode(&buf), Some(id));
            assert_eq!(Identity::decode(&buf[..buf.len().min(20)]), None);
        }
    }
}
