//! CloudPhysics VSCSI binary traces, both record versions (little-endian, no header):
//! - v1, 32 bytes: `sn u32, len u32, nSG u32, cmd u16, ver u16, lbn u64, ts u64`
//! - v2, 40 bytes: `cmd u16, ver u16, sn u32, len u32, nSG u32, lbn u64, ts u64, rt u64`
//!
//! The version is the high byte of `ver`, decided from the first record. `cmd` is the SCSI
//! opcode (READ 6/10/16 = 0x08/0x28/0x88, WRITE 6/10/16 = 0x0a/0x2a/0x8a; others are
//! ignored and counted). `lbn` is in 512-byte sectors, `len` in bytes, `ts` in µs.
//! The format has no VM field: one file is one VM.

use crate::error::FieldError;
use crate::request::{Op, Request};
use crate::source::RecordParser;
use crate::vm_table::VmTable;
use std::io::{self, Write};

/// VSCSI record layout version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VscsiVersion {
    /// 32-byte records.
    V1,
    /// 40-byte records with response time.
    V2,
}

impl VscsiVersion {
    /// Decides the version from the first bytes of a file (`None` if neither layout fits).
    pub fn detect(head: &[u8]) -> Option<Self> {
        let ver_at = |off: usize| head.get(off..off + 2).map(|b| u16::from_le_bytes([b[0], b[1]]) >> 8);
        if ver_at(14) == Some(1) {
            Some(VscsiVersion::V1)
        } else if ver_at(2) == Some(2) {
            Some(VscsiVersion::V2)
        } else {
            None
        }
    }
}

/// Parser of one VSCSI record.
pub struct VscsiParser {
    version: VscsiVersion,
}

impl VscsiParser {
    /// A parser for records of `version`.
    pub fn new(version: VscsiVersion) -> Self {
        VscsiParser { version }
    }
}

fn u16_at(r: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([r[o], r[o + 1]])
}
fn u32_at(r: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(r[o..o + 4].try_into().unwrap())
}
fn u64_at(r: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(r[o..o + 8].try_into().unwrap())
}

/// Read/write from a SCSI opcode; `None` for commands that move no data we model.
pub fn scsi_op(cmd: u16) -> Option<Op> {
    match cmd {
        0x08 | 0x28 | 0x88 => Some(Op::Read),
        0x0a | 0x2a | 0x8a => Some(Op::Write),
        _ => None,
    }
}

impl RecordParser for VscsiParser {
    fn record_len(&self) -> usize {
        match self.version {
            VscsiVersion::V1 => 32,
            VscsiVersion::V2 => 40,
        }
    }

    fn parse(&mut self, r: &[u8], vms: &mut VmTable) -> Result<Option<Request>, FieldError> {
        let (cmd, ver, len, lbn, ts) = match self.version {
            VscsiVersion::V1 => (u16_at(r, 12), u16_at(r, 14), u32_at(r, 4), u64_at(r, 16), u64_at(r, 24)),
            VscsiVersion::V2 => (u16_at(r, 0), u16_at(r, 2), u32_at(r, 8), u64_at(r, 16), u64_at(r, 24)),
        };
        let want = if self.version == VscsiVersion::V1 { 1 } else { 2 };
        if ver >> 8 != want {
            return Err(FieldError::new("ver", format!("record version {} in a version {want} trace", ver >> 8)));
        }
        let Some(op) = scsi_op(cmd) else { return Ok(None) };
        let offset =
            lbn.checked_mul(512).ok_or_else(|| FieldError::new("lbn", format!("{lbn} overflows a byte offset")))?;
        let time_ns = ts.checked_mul(1000).ok_or_else(|| FieldError::new("ts", format!("{ts} µs overflows")))?;
        Ok(Some(Request { time_ns, vm: vms.file_vm(), op, offset, len }))
    }
}

/// Writes one version-1 record (`sn` = `seq`, one scatter-gather entry, READ/WRITE 10).
/// Offsets are rounded down to sectors, times down to µs.
pub fn write_vscsi_v1(w: &mut dyn Write, req: &Request, seq: u64) -> io::Result<()> {
    let mut rec = [0u8; 32];
    rec[0..4].copy_from_slice(&(seq as u32).to_le_bytes());
    rec[4..8].copy_from_slice(&req.len.to_le_bytes());
    rec[8..12].copy_from_slice(&1u32.to_le_bytes());
    let cmd: u16 = if req.op.is_write() { 0x2a } else { 0x28 };
    rec[12..14].copy_from_slice(&cmd.to_le_bytes());
    rec[14..16].copy_from_slice(&0x0100u16.to_le_bytes());
    rec[16..24].copy_from_slice(&(req.offset / 512).to_le_bytes());
    rec[24..32].copy_from_slice(&(req.time_ns / 1000).to_le_bytes());
    w.write_all(&rec)
}
