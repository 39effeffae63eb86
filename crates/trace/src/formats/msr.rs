//! MSR Cambridge CSV (SNIA IOTTA): `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`.
//!
//! `Timestamp` is a Windows FILETIME (100 ns ticks since 1601-01-01 UTC); it becomes Unix
//! nanoseconds. `Type` is `Read` or `Write`, offset and size are bytes. The device key is
//! `Hostname_DiskNumber` (`hm_0`), so in device mode each disk is one VM.

use crate::error::FieldError;
use crate::numparse::{parse_u64, split_fields};
use crate::request::{Op, Request};
use crate::source::LineParser;
use crate::vm_table::VmTable;
use std::io::{self, Write};

/// FILETIME ticks between 1601-01-01 and 1970-01-01.
pub const FILETIME_UNIX_EPOCH: u64 = 116_444_736_000_000_000;

/// Parser of one MSR line.
#[derive(Default)]
pub struct MsrParser {
    key: Vec<u8>,
}

impl LineParser for MsrParser {
    fn parse(&mut self, line: &[u8], vms: &mut VmTable) -> Result<Option<Request>, FieldError> {
        let mut f = split_fields(line, b',');
        let ts = f.next().ok_or_else(|| FieldError::missing("Timestamp"))?;
        let ticks = match parse_u64(ts) {
            Some(t) => t,
            None if ts.eq_ignore_ascii_case(b"Timestamp") => return Ok(None), // header
            None => return Err(FieldError::invalid("Timestamp", ts, "a FILETIME tick count")),
        };
        let unix_ticks = ticks
            .checked_sub(FILETIME_UNIX_EPOCH)
            .ok_or_else(|| FieldError::new("Timestamp", format!("{ticks} is before 1970")))?;
        let host = f.next().ok_or_else(|| FieldError::missing("Hostname"))?;
        let disk = f.next().ok_or_else(|| FieldError::missing("DiskNumber"))?;
        if parse_u64(disk).is_none() {
            return Err(FieldError::invalid("DiskNumber", disk, "a disk number"));
        }
        let ty = f.next().ok_or_else(|| FieldError::missing("Type"))?;
        let op = if ty.eq_ignore_ascii_case(b"read") {
            Op::Read
        } else if ty.eq_ignore_ascii_case(b"write") {
            Op::Write
        } else {
            return Err(FieldError::invalid("Type", ty, "`Read` or `Write`"));
        };
        let off = f.next().ok_or_else(|| FieldError::missing("Offset"))?;
        let offset = parse_u64(off).ok_or_else(|| FieldError::invalid("Offset", off, "a byte offset"))?;
        let sz = f.next().ok_or_else(|| FieldError::missing("Size"))?;
        let len = parse_u64(sz)
            .filter(|&v| v <= u32::MAX as u64)
            .ok_or_else(|| FieldError::invalid("Size", sz, "a byte count below 4 GiB"))?;
        self.key.clear();
        self.key.extend_from_slice(host);
        self.key.push(b'_');
        self.key.extend_from_slice(disk);
        let vm = vms.id(&self.key);
        Ok(Some(Request { time_ns: unix_ticks * 100, vm, op, offset, len: len as u32 }))
    }
}

/// Writes one MSR line. The VM name `host_N` gives Hostname and DiskNumber; other names
/// become `name,0`. Response time is written as 0 (the simulator reports its own).
pub fn write_msr(w: &mut dyn Write, req: &Request, vm_name: &str) -> io::Result<()> {
    let (host, disk) = match vm_name.rsplit_once('_') {
        Some((h, d)) if !h.is_empty() && d.bytes().all(|b| b.is_ascii_digit()) && !d.is_empty() => (h, d),
        _ => (vm_name, "0"),
    };
    let op = if req.op.is_write() { "Write" } else { "Read" };
    writeln!(w, "{},{host},{disk},{op},{},{},0", req.time_ns / 100 + FILETIME_UNIX_EPOCH, req.offset, req.len)
}
