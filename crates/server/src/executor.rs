//! Executes the engine's device operations with real bytes, following the device-operation
//! contract (docs/ARCHITECTURE.md; `cachevisor_engine::output`): ops run in list order (a
//! safe sequential order); a `staged` write writes what the last `staged` read of a range
//! containing it read (write-back: SSD → backing; fill: backing → SSD); any other write
//! writes the client's data; a read request's bytes are what the last read op covering
//! each sector returned.

use cachevisor_engine::{DeviceOp, OpKind};
use cachevisor_trace::VmId;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Where ops go: the cache store and each VM's backing store.
pub trait Devices {
    /// The SSD cache store.
    fn ssd(&self) -> &File;
    /// The backing store of `vm`.
    fn backing(&self, vm: VmId) -> &crate::backing::Backing;
    /// The cache's block size (cache-store offsets are slot × block size).
    fn block_size(&self) -> u64;
    /// Fault injection for tests: an error here fails `op` as if the device had.
    fn fault(&self, _op: &DeviceOp) -> io::Result<()> {
        Ok(())
    }
    /// Reads `buf.len()` bytes of the cache store at `addr`.
    fn ssd_read(&self, buf: &mut [u8], addr: u64) -> io::Result<()> {
        self.ssd().read_exact_at(buf, addr)
    }
    /// Writes `data` to the cache store at `addr`.
    fn ssd_write(&self, data: &[u8], addr: u64) -> io::Result<()> {
        self.ssd().write_all_at(data, addr)
    }
    /// Reads `buf.len()` bytes of `vm`'s backing store at `addr`.
    fn backing_read(&self, vm: VmId, buf: &mut [u8], addr: u64) -> io::Result<()> {
        self.backing(vm).read_at(buf, addr)
    }
    /// Writes `data` to `vm`'s backing store at `addr`.
    fn backing_write(&self, vm: VmId, data: &[u8], addr: u64) -> io::Result<()> {
        self.backing(vm).write_at(data, addr)
    }
}

/// The client side of a request: its VM, disk offset, and data (written by a WRITE, filled
/// by a READ).
pub enum Client<'a> {
    /// A read into this buffer.
    Read(VmId, u64, &'a mut [u8]),
    /// A write of these bytes.
    Write(VmId, u64, &'a [u8]),
    /// A command (flush, resize): no client data.
    None,
}

impl Client<'_> {
    /// A read request takes the part of `data` (read from `vm`'s disk at `disk_addr`) that
    /// overlaps its range; other clients take nothing.
    fn fill(&mut self, vm: VmId, disk_addr: u64, data: &[u8]) {
        if let Client::Read(rvm, start, out) = self {
            let (lo, hi) = (disk_addr.max(*start), (disk_addr + data.len() as u64).min(*start + out.len() as u64));
            if *rvm == vm && lo < hi {
                out[(lo - *start) as usize..(hi - *start) as usize]
                    .copy_from_slice(&data[(lo - disk_addr) as usize..(hi - disk_addr) as usize]);
            }
        }
    }

    /// The same client side, borrowed again (to execute a second list of ops).
    pub fn reborrow(&mut self) -> Client<'_> {
        match self {
            Client::Read(vm, at, buf) => Client::Read(*vm, *at, buf),
            Client::Write(vm, at, data) => Client::Write(*vm, *at, data),
            Client::None => Client::None,
        }
    }
}

/// A device error with the op that failed (or, outside an op list, the step: a flush of
/// a backing store, a metadata append).
#[derive(Debug)]
pub struct OpError {
    /// Device and direction.
    pub kind: OpKind,
    /// VM.
    pub vm: VmId,
    /// Disk address.
    pub disk_addr: u64,
    /// SSD address.
    pub ssd_addr: u64,
    /// Bytes.
    pub len: u32,
    /// The I/O error.
    pub source: io::Error,
    /// Index of the failed op in the list executed (`usize::MAX`: not an op of a list);
    /// the ops from here on did not complete.
    pub at: usize,
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (vm, e) = (self.vm, &self.source);
        if self.at == usize::MAX && self.len == 0 {
            let what = match self.kind {
                OpKind::SsdWrite => "cache metadata (journal, or syncing the cache store)",
                OpKind::BackingWrite => "backing store (write or flush)",
                OpKind::SsdRead | OpKind::BackingRead => "request",
            };
            return write!(f, "vDisk {vm}: {what}: {e}");
        }
        let (what, ssd) = match self.kind {
            OpKind::SsdRead => ("cache-store read", true),
            OpKind::SsdWrite => ("cache-store write", true),
            OpKind::BackingRead => ("backing-store read", false),
            OpKind::BackingWrite => ("backing-store write", false),
        };
        write!(f, "vDisk {vm}: {what} of {} bytes at disk offset {}", self.len, self.disk_addr)?;
        if ssd {
            write!(f, " (cache offset {})", self.ssd_addr)?;
        }
        write!(f, ": {e}")
    }
}

impl std::error::Error for OpError {}

impl OpError {
    /// The errno to give an NBD client: ENOSPC (and EDQUOT) when a device is full, so a
    /// client such as QEMU with `werror=enospc` can pause the guest; EIO otherwise.
    pub fn nbd_errno(&self) -> u32 {
        match self.source.raw_os_error() {
            Some(e) if e == rustix::io::Errno::NOSPC.raw_os_error() || e == rustix::io::Errno::DQUOT.raw_os_error() => {
                crate::nbd::proto::ENOSPC
            }
            _ if self.source.kind() == io::ErrorKind::StorageFull => crate::nbd::proto::ENOSPC,
            _ => crate::nbd::proto::EIO,
        }
    }
}

/// Longest cache-store read run coalesced into one device read.
const MAX_COALESCED: u64 = 4 << 20;

/// The end (exclusive) of a run of at least two client cache-store reads starting at `at`
/// that are contiguous on the cache store and on the disk (same VM, not staged), within
/// [`MAX_COALESCED`] bytes; `None` when there is no such run.
fn coalesced_read_run(ops: &[DeviceOp], at: usize, bs: u64) -> Option<usize> {
    let first = &ops[at];
    if first.kind != OpKind::SsdRead || first.staged {
        return None;
    }
    let mut end = at + 1;
    let mut total = first.len as u64;
    while let Some(o) = ops.get(end) {
        let prev = &ops[end - 1];
        let contiguous = o.kind == OpKind::SsdRead
            && !o.staged
            && o.vm == first.vm
            && o.slot as u64 * bs + o.disk_addr % bs == prev.slot as u64 * bs + prev.disk_addr % bs + prev.len as u64
            && o.disk_addr == prev.disk_addr + prev.len as u64;
        if !contiguous || total + o.len as u64 > MAX_COALESCED {
            break;
        }
        total += o.len as u64;
        end += 1;
    }
    (end - at > 1).then_some(end)
}

/// Runs `ops` in order; `staging` is a reusable scratch list.
pub fn execute(
    ops: &[DeviceOp],
    client: Client<'_>,
    dev: &dyn Devices,
    staging: &mut Vec<(VmId, u64, Vec<u8>)>,
) -> Result<(), OpError> {
    execute_with(ops, client, dev, staging, &mut |_| Ok(()))
}

/// Like [`execute`], calling `before(op)` ahead of each op (a driver's ordering barriers:
/// metadata that must be durable before the cache store is overwritten).
pub fn execute_with(
    ops: &[DeviceOp],
    mut client: Client<'_>,
    dev: &dyn Devices,
    staging: &mut Vec<(VmId, u64, Vec<u8>)>,
    before: &mut dyn FnMut(&DeviceOp) -> io::Result<()>,
) -> Result<(), OpError> {
    staging.clear();
    let bs = dev.block_size();
    let mut skip_until = 0;
    for (at, op) in ops.iter().enumerate() {
        if at < skip_until {
            continue; // read as part of a coalesced run
        }
        // A run of client reads from consecutive cache-store addresses holding consecutive
        // disk addresses (a large read of blocks in consecutive slots) is one device read.
        if let Some(end) = coalesced_read_run(ops, at, bs) {
            let first = &ops[at];
            let total: usize = ops[at..end].iter().map(|o| o.len as usize).sum();
            for (i, o) in ops[at..end].iter().enumerate() {
                let e = |source| OpError {
                    kind: o.kind,
                    vm: o.vm,
                    disk_addr: o.disk_addr,
                    ssd_addr: o.ssd_offset(bs),
                    len: o.len,
                    source,
                    at: at + i,
                };
                before(o).map_err(e)?;
                dev.fault(o).map_err(e)?;
            }
            let mut buf = vec![0u8; total];
            dev.ssd_read(&mut buf, first.ssd_offset(bs)).map_err(|source| OpError {
                kind: first.kind,
                vm: first.vm,
                disk_addr: first.disk_addr,
                ssd_addr: first.ssd_offset(bs),
                len: total as u32,
                source,
                at,
            })?;
            client.fill(first.vm, first.disk_addr, &buf);
            skip_until = end;
            continue;
        }
        let err = |source| OpError {
            kind: op.kind,
            vm: op.vm,
            disk_addr: op.disk_addr,
            ssd_addr: op.ssd_offset(bs),
            len: op.len,
            source,
            at,
        };
        before(op).map_err(err)?;
        dev.fault(op).map_err(err)?;
        let write = |data: &[u8]| {
            if op.kind.is_ssd() {
                dev.ssd_write(data, op.ssd_offset(bs))
            } else {
                dev.backing_write(op.vm, data, op.disk_addr)
            }
        };
        let read = |buf: &mut [u8]| {
            if op.kind.is_ssd() {
                dev.ssd_read(buf, op.ssd_offset(bs))
            } else {
                dev.backing_read(op.vm, buf, op.disk_addr)
            }
        };
        let len = op.len as usize;
        if op.kind.is_write() {
            let data: &[u8] = if op.staged {
                let (_, start, buf) = staging
                    .iter()
                    .rev()
                    .find(|(vm, start, buf)| {
                        *vm == op.vm
                            && *start <= op.disk_addr
                            && op.disk_addr + op.len as u64 <= *start + buf.len() as u64
                    })
                    .ok_or_else(|| {
                        err(io::Error::other("staged write without a staged read (engine contract broken)"))
                    })?;
                let from = (op.disk_addr - start) as usize;
                &buf[from..from + len]
            } else {
                match &client {
                    Client::Write(vm, start, data) if *vm == op.vm && *start <= op.disk_addr => {
                        let from = (op.disk_addr - start) as usize;
                        data.get(from..from + len)
                            .ok_or_else(|| err(io::Error::other("client write op outside the request")))?
                    }
                    _ => {
                        return Err(err(io::Error::other(
                            "client write op without client data (engine contract broken)",
                        )))
                    }
                }
            };
            write(data).map_err(err)?;
        } else {
            let mut buf = vec![0u8; len];
            read(&mut buf).map_err(err)?;
            client.fill(op.vm, op.disk_addr, &buf);
            if op.staged {
                staging.push((op.vm, op.disk_addr, buf));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    struct Files(File, crate::backing::Backing);

    impl Devices for Files {
        fn ssd(&self) -> &File {
            &self.0
        }
        fn backing(&self, _: VmId) -> &crate::backing::Backing {
            &self.1
        }
        fn block_size(&self) -> u64 {
            4096
        }
    }

    fn read(disk_addr: u64, slot: u64) -> DeviceOp {
        DeviceOp {
            id: 0,
            req: 0,
            kind: OpKind::SsdRead,
            loc: cachevisor_engine::Location::Ssd(0),
            vm: 0,
            disk_addr,
            slot: slot as u32,
            len: 4096,
            phase: 0,
            sync: true,
            staged: false,
            client: true,
            source: None,
        }
    }

    #[test]
    fn contiguous_cache_reads_are_one_device_read_and_land_where_they_belong() {
        let mut ssd = tempfile::tempfile().unwrap();
        for slot in 0..8u8 {
            ssd.write_all(&[slot; 4096]).unwrap();
        }
        let dev = Files(ssd, crate::backing::Backing::File(tempfile::tempfile().unwrap()));
        // Blocks 0..4 in slots 5, 6, 2, 3: two runs of two.
        let ops = [read(0, 5), read(4096, 6), read(8192, 2), read(12288, 3)];
        assert_eq!(
            (coalesced_read_run(&ops, 0, 4096), coalesced_read_run(&ops, 2, 4096), coalesced_read_run(&ops, 1, 4096)),
            (Some(2), Some(4), None)
        );
        let mut buf = vec![0u8; 16384];
        execute(&ops, Client::Read(0, 0, &mut buf), &dev, &mut Vec::new()).unwrap();
        for (i, slot) in [5u8, 6, 2, 3].into_iter().enumerate() {
            assert!(
                buf[i * 4096..(i + 1) * 4096].iter().all(|&b| b == slot),
                "block {i} should hold slot {slot}'s bytes"
            );
        }
        // Consecutive slots holding blocks that are not consecutive on the disk: two reads.
        let ops = [read(0, 1), read(8192, 2)];
        assert_eq!(coalesced_read_run(&ops, 0, 4096), None);
        let mut buf = vec![9u8; 12288];
        execute(&ops, Client::Read(0, 0, &mut buf), &dev, &mut Vec::new()).unwrap();
        assert!(
            buf[..4096].iter().all(|&b| b == 1)
                && buf[4096..8192].iter().all(|&b| b == 9)
                && buf[8192..].iter().all(|&b| b == 2)
        );
        // A request starting inside the run gets only its part.
        let ops = [read(0, 5), read(4096, 6)];
        let mut buf = vec![0u8; 4096];
        execute(&ops, Client::Read(0, 2048, &mut buf), &dev, &mut Vec::new()).unwrap();
        assert!(buf[..2048].iter().all(|&b| b == 5) && buf[2048..].iter().all(|&b| b == 6));
    }
}
