//! MQSim ASCII traces: `arrival_time_ns device_number start_sector size_in_sectors type`,
//! space separated, type `1` = read and `0` = write, 512-byte sectors. Each device number
//! is one vDisk (VM) in device mode.

use crate::error::FieldError;
use crate::numparse::{parse_u64, split_ws};
use crate::request::{Op, Request};
use crate::source::LineParser;
use crate::vm_table::VmTable;
use std::io::{self, Write};

/// Parser of one MQSim line.
#[derive(Default)]
pub struct MqsimParser;

impl LineParser for MqsimParser {
    fn parse(&mut self, line: &[u8], vms: &mut VmTable) -> Result<Option<Request>, FieldError> {
        let mut f = split_ws(line);
        let t = f.next().ok_or_else(|| FieldError::missing("arrival_time"))?;
        let time_ns = parse_u64(t).ok_or_else(|| FieldError::invalid("arrival_time", t, "nanoseconds"))?;
        let dev = f.next().ok_or_else(|| FieldError::missing("device_number"))?;
        parse_u64(dev).ok_or_else(|| FieldError::invalid("device_number", dev, "a device number"))?;
        let s = f.next().ok_or_else(|| FieldError::missing("start_sector"))?;
        let sector = parse_u64(s).ok_or_else(|| FieldError::invalid("start_sector", s, "a sector number"))?;
        let n = f.next().ok_or_else(|| FieldError::missing("size_in_sectors"))?;
        let n = parse_u64(n)
            .filter(|&v| v <= (u32::MAX / 512) as u64)
            .ok_or_else(|| FieldError::invalid("size_in_sectors", n, "a sector count"))?;
        let ty = f.next().ok_or_else(|| FieldError::missing("type"))?;
        let op = match ty {
            b"1" => Op::Read,
            b"0" => Op::Write,
            _ => return Err(FieldError::invalid("type", ty, "1 (read) or 0 (write)")),
        };
        if f.next().is_some() {
            return Err(FieldError::new("type", "extra fields after type"));
        }
        let offset = sector.checked_mul(512).ok_or_else(|| FieldError::new("start_sector", "offset overflows"))?;
        Ok(Some(Request { time_ns, vm: vms.id(dev), op, offset, len: (n * 512) as u32 }))
    }
}

/// Writes one line; the device number is the VM id, ranges are rounded out to sectors.
pub fn write_mqsim(w: &mut dyn Write, req: &Request) -> io::Result<()> {
    let first = req.offset / 512;
    let last = req.end().div_ceil(512);
    writeln!(w, "{} {} {} {} {}", req.time_ns, req.vm, first, last - first, if req.op.is_write() { 0 } else { 1 })
}
