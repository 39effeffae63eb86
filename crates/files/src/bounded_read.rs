//! Reading a small file the daemon or the CLI is given (the configuration, TLS
//! certificates and keys, the API token, the overlay, state notes, metadata files) only
//! if it is a regular file and only up to a cap: a path replaced by a
//! symbolic link to `/dev/zero` grew the daemon by ~350 MB/s at each reload until it died,
//! and a FIFO there hung a reload or `cachevisor check` forever. The file is opened
//! non-blocking (a FIFO's open returns at once), its type checked on the open descriptor
//! (no race with a rename), and at most `cap` + 1 bytes are read.

use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Cap on a configuration file.
pub const CONFIG_CAP: u64 = 16 << 20;
/// Cap on a PEM file (a certificate chain, a key, a CA bundle).
pub const PEM_CAP: u64 = 16 << 20;
/// Cap on a small state file (tokens, notes, JSON state).
pub const STATE_CAP: u64 = 64 << 20;

/// Opens `path` for reading if it is a regular file (after following links), without
/// blocking on a FIFO; the error says what it is instead.
pub fn open_regular(path: &Path) -> io::Result<std::fs::File> {
    let f =
        std::fs::OpenOptions::new().read(true).custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32).open(path)?;
    let t = f.metadata()?.file_type();
    if !t.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{}, not a regular file", kind(t))));
    }
    Ok(f)
}

/// A file type in words ("a FIFO", "a character device", …), for messages.
pub fn kind(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Reads regular file `path` whole if it holds at most `cap` bytes.
pub fn read(path: &Path, cap: u64) -> io::Result<Vec<u8>> {
    let f = open_regular(path)?;
    let mut out = Vec::new();
    f.take(cap + 1).read_to_end(&mut out)?;
    if out.len() as u64 > cap {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("larger than {} bytes", cap)));
    }
    Ok(out)
}

/// [`read`] as UTF-8 text.
pub fn read_to_string(path: &Path, cap: u64) -> io::Result<String> {
    String::from_utf8(read(path, cap)?).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_within_the_cap_are_read() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"12345").unwrap();
        assert_eq!(read(&p, 5).unwrap(), b"12345");
        assert!(read(&p, 4).unwrap_err().to_string().contains("larger than 4"));
        let e = read(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        std::os::unix::fs::symlink("/dev/zero", d.path().join("z")).unwrap();
        assert!(read(&d.path().join("z"), 1 << 20).is_err());
        assert!(read(d.path(), 1).unwrap_err().to_string().contains("directory"));
        // A FIFO is refused at once, not waited on.
        let fifo = d.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
            0,
        )
        .unwrap();
        assert!(read(&fifo, 10).unwrap_err().to_string().contains("FIFO"));
        std::fs::write(&p, [0xff, 0xfe]).unwrap();
        assert!(read_to_string(&p, 10).is_err());
    }
}
