//! blkparse default text output: `maj,min cpu seq time pid action rwbs sector + nsectors [proc]`.
//!
//! Only one action is kept (default `D`, issued to the device, as in the Nutanix study);
//! `rwbs` containing `R` is a read, `W` a write. Lines of other shapes (per-CPU summaries,
//! other actions, `+ 0` entries, events without a sector) carry no request and are counted
//! as ignored. A line of the kept action whose sector or length does not parse is malformed.
//! Sectors are 512 bytes. The device key is `maj,min`.

use crate::error::FieldError;
use crate::numparse::{parse_seconds_ns, parse_u64, split_ws};
use crate::request::{Op, Request};
use crate::source::LineParser;
use crate::vm_table::VmTable;
use std::io::{self, Write};

/// Parser of one blkparse line, keeping only `action`.
pub struct BlkparseParser {
    action: Vec<u8>,
}

impl BlkparseParser {
    /// Keeps events whose action column equals `action` (`D`, `Q`, `C`, ...).
    pub fn new(action: &str) -> Self {
        BlkparseParser { action: action.as_bytes().to_vec() }
    }
}

fn is_device(f: &[u8]) -> bool {
    match f.iter().position(|&b| b == b',') {
        Some(p) => parse_u64(&f[..p]).is_some() && parse_u64(&f[p + 1..]).is_some(),
        None => false,
    }
}

impl LineParser for BlkparseParser {
    fn parse(&mut self, line: &[u8], vms: &mut VmTable) -> Result<Option<Request>, FieldError> {
        let mut f = split_ws(line);
        let (Some(dev), Some(_cpu), Some(_seq), Some(time)) = (f.next(), f.next(), f.next(), f.next()) else {
            return Ok(None);
        };
        if !is_device(dev) {
            return Ok(None); // summary or other non-event line
        }
        let time_ns = parse_seconds_ns(time).ok_or_else(|| FieldError::invalid("time", time, "seconds"))?;
        let (Some(_pid), Some(action)) = (f.next(), f.next()) else {
            return Ok(None);
        };
        if action != self.action.as_slice() {
            return Ok(None);
        }
        let rwbs = f.next().ok_or_else(|| FieldError::missing("rwbs"))?;
        let op = if rwbs.contains(&b'W') {
            Op::Write
        } else if rwbs.contains(&b'R') {
            Op::Read
        } else {
            return Ok(None); // flush, discard or barrier without data
        };
        let Some(sector) = f.next() else {
            return Ok(None); // event without a sector
        };
        let sector = parse_u64(sector).ok_or_else(|| FieldError::invalid("sector", sector, "a sector number"))?;
        match f.next() {
            Some(b"+") => {}
            Some(other) => return Err(FieldError::invalid("+", other, "`+`")),
            None => return Err(FieldError::missing("nsectors")),
        }
        let n = f.next().ok_or_else(|| FieldError::missing("nsectors"))?;
        let n = parse_u64(n)
            .filter(|&v| v <= (u32::MAX / 512) as u64)
            .ok_or_else(|| FieldError::invalid("nsectors", n, "a sector count"))?;
        let offset = sector.checked_mul(512).ok_or_else(|| FieldError::new("sector", "offset overflows"))?;
        let vm = vms.id(dev);
        Ok(Some(Request { time_ns, vm, op, offset, len: (n * 512) as u32 }))
    }
}

/// Writes one `D` event. The device is `8,N` with N the VM id; offsets and lengths are
/// rounded out to whole sectors.
pub fn write_blkparse(w: &mut dyn Write, req: &Request, seq: u64) -> io::Result<()> {
    let first = req.offset / 512;
    let last = req.end().div_ceil(512);
    let rw = if req.op.is_write() { "W" } else { "R" };
    writeln!(
        w,
        "8,{:<4} 0 {:>8} {:>5}.{:09} 0  D {:>3} {} + {} [cachevisor]",
        req.vm,
        seq,
        req.time_ns / 1_000_000_000,
        req.time_ns % 1_000_000_000,
        rw,
        first,
        last - first
    )
}
