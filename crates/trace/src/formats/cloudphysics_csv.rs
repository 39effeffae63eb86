//! CloudPhysics CSV, as shipped with libCacheSim: header `version,time,op,size,lbn`.
//!
//! `op` is the SCSI opcode in hex (`28` read, `2a` write; other commands are ignored and
//! counted), `size` is bytes, `lbn` is 512-byte sectors. `time` is whole **seconds**: the
//! traces README says µs, but record by record it equals the VSCSI copy's µs timestamp
//! divided by 10^6 (checked on `cloudPhysicsIO.{csv,vscsi}` in this crate's tests).
//! One file is one VM.

use crate::error::FieldError;
use crate::formats::vscsi::scsi_op;
use crate::numparse::{parse_hex_u64, parse_u64, split_fields};
use crate::request::Request;
use crate::source::LineParser;
use crate::vm_table::VmTable;
use std::io::{self, Write};

/// The header line this format starts with.
pub const HEADER: &str = "version,time,op,size,lbn";

/// Parser of one CloudPhysics CSV line.
#[derive(Default)]
pub struct CloudPhysicsParser;

impl LineParser for CloudPhysicsParser {
    fn parse(&mut self, line: &[u8], vms: &mut VmTable) -> Result<Option<Request>, FieldError> {
        if line == HEADER.as_bytes() {
            return Ok(None);
        }
        let mut f = split_fields(line, b',');
        let v = f.next().ok_or_else(|| FieldError::missing("version"))?;
        parse_u64(v).ok_or_else(|| FieldError::invalid("version", v, "a version number"))?;
        let t = f.next().ok_or_else(|| FieldError::missing("time"))?;
        let secs = parse_u64(t).ok_or_else(|| FieldError::invalid("time", t, "whole seconds"))?;
        let o = f.next().ok_or_else(|| FieldError::missing("op"))?;
        let cmd = parse_hex_u64(o).ok_or_else(|| FieldError::invalid("op", o, "a hex SCSI opcode"))?;
        let s = f.next().ok_or_else(|| FieldError::missing("size"))?;
        let len = parse_u64(s)
            .filter(|&v| v <= u32::MAX as u64)
            .ok_or_else(|| FieldError::invalid("size", s, "a byte count"))?;
        let l = f.next().ok_or_else(|| FieldError::missing("lbn"))?;
        let lbn = parse_u64(l).ok_or_else(|| FieldError::invalid("lbn", l, "a sector number"))?;
        if f.next().is_some() {
            return Err(FieldError::new("lbn", "extra fields after lbn"));
        }
        let Some(op) = u16::try_from(cmd).ok().and_then(scsi_op) else { return Ok(None) };
        let offset = lbn.checked_mul(512).ok_or_else(|| FieldError::new("lbn", "offset overflows"))?;
        let time_ns = secs.checked_mul(1_000_000_000).ok_or_else(|| FieldError::new("time", "overflows"))?;
        Ok(Some(Request { time_ns, vm: vms.file_vm(), op, offset, len: len as u32 }))
    }
}

/// Writes one line (times rounded down to seconds, offsets to sectors).
pub fn write_cloudphysics(w: &mut dyn Write, req: &Request) -> io::Result<()> {
    let op = if req.op.is_write() { "2a" } else { "28" };
    writeln!(w, "1,{},{op},{},{}", req.time_ns / 1_000_000_000, req.len, req.offset / 512)
}
