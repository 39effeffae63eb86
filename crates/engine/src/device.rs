//! The one interface a driver runs a cache store's ops through: the
//! simulator's device models and the daemon's cache file implement it, a driver keeps
//! one per row of the store table (`stores.rs`) and runs an op by looking its store up
//! — so a new store kind (a vSSD region, another node's SSD over NBD, a replica) is a
//! row kind and one `Device` implementation per driver, not a new match arm in each.
//!
//! Sans-IO like the rest of the engine: the trait only names what a driver does with a
//! device. A model moves no data (`Io::Model`) and answers with the time the op
//! completes; a real device moves the bytes (`Io::Read` / `Io::Write`) and has
//! completed the op when `submit` returns.

/// What an op moves.
#[derive(Debug)]
pub enum Io<'a> {
    /// A model's op: `len` bytes read or written, no data.
    Model {
        /// A write (else a read).
        write: bool,
        /// Bytes.
        len: u32,
    },
    /// Read into the buffer (its length is the op's).
    Read(&'a mut [u8]),
    /// Write these bytes.
    Write(&'a [u8]),
}

impl Io<'_> {
    /// Whether the op writes.
    pub fn is_write(&self) -> bool {
        matches!(self, Io::Model { write: true, .. } | Io::Write(_))
    }

    /// The op's length in bytes.
    pub fn len(&self) -> u32 {
        match self {
            Io::Model { len, .. } => *len,
            Io::Read(b) => b.len() as u32,
            Io::Write(d) => d.len() as u32,
        }
    }

    /// Whether the op moves no byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A store's device as a driver runs it.
pub trait Device {
    /// Runs `io` at byte `at` of the device, started at driver time `now_ns`. Returns
    /// when it completes in the driver's time — a model's completion time, a real
    /// device's `now_ns` (done when this returns) — or the device's error.
    fn submit(&self, now_ns: u64, at: u64, io: Io<'_>) -> std::io::Result<u64>;

    /// Makes the writes completed so far durable (a file's fsync; nothing for a model).
    fn sync(&self) -> std::io::Result<()> {
        Ok(())
    }

    /// Ops it serves at once (a model's servers; a file's, as its driver's threads
    /// reach it).
    fn queue_depth(&self) -> u32;

    /// Its size in bytes.
    fn size(&self) -> u64;

    /// What it is, for errors and logs (`cache file /var/…`, `ssd model nvme`).
    fn describe(&self) -> String;
}

/// The device of a store no driver serves yet (a region another node lends, before
/// the daemon has the cluster's NBD client): every op fails, naming the store.
#[derive(Debug, Clone)]
pub struct Unserved {
    /// What the store is, for the error (`a region node 2 lends`).
    pub what: String,
    /// Its size in bytes.
    pub size: u64,
}

impl Device for Unserved {
    fn submit(&self, _now_ns: u64, at: u64, io: Io<'_>) -> std::io::Result<u64> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            format!("{} is not served by this driver ({} bytes at {at})", self.what, io.len()),
        ))
    }

    fn queue_depth(&self) -> u32 {
        0
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn describe(&self) -> String {
        self.what.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unserved_store_fails_every_op_naming_itself() {
        let d = Unserved { what: "a region node 2 lends".into(), size: 1 << 20 };
        let mut buf = [0u8; 512];
        let e = d.submit(5, 4096, Io::Read(&mut buf)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::Unsupported);
        assert!(e.to_string().contains("node 2") && e.to_string().contains("512 bytes at 4096"), "{e}");
        assert!(d.submit(5, 0, Io::Model { write: true, len: 8 }).is_err());
        assert_eq!((d.size(), d.queue_depth()), (1 << 20, 0));
        assert!(Io::Write(&buf).is_write() && !Io::Read(&mut buf).is_write());
    }
}
