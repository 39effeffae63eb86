//! libCacheSim `oracleGeneral` binary traces, so one file can be replayed by both tools.
//!
//! Layout (little-endian, packed, 24 bytes, no header), as in libCacheSim's
//! `traceReader/generalReader/oracleGeneral.h`:
//! `clock_time u32 (s), obj_id u64, obj_size u32, next_access_vtime i64 (-1 = never)`.
//!
//! The format knows objects, not disks: a block request becomes one record per cache
//! block, `obj_id = vm << 40 | block`, `obj_size = block size`, so VMs live in disjoint
//! 2^40-block regions of one object space. Reading maps a record back to
//! `offset = obj_id * obj_size` of one VM (the file).

use crate::error::FieldError;
use crate::request::{Op, Request};
use crate::source::RecordParser;
use crate::vm_table::VmTable;
use rustc_hash::FxHashMap;
use std::io::{self, Write};

/// Bytes per record.
pub const RECORD_LEN: usize = 24;
/// Bits of `obj_id` that hold the block number when writing.
pub const BLOCK_BITS: u32 = 40;

/// Whether the first bytes of a binary file read as oracleGeneral records (the format has
/// no magic): at least one whole record, every whole one with an object size of 1 byte to
/// 1 GiB, a next access of −1 or later, and clock times that never go back.
pub fn looks_like(head: &[u8]) -> bool {
    let records: Vec<&[u8]> = head.chunks_exact(RECORD_LEN).collect();
    let mut last_time = 0u32;
    !records.is_empty()
        && records.iter().all(|r| {
            let time = u32::from_le_bytes(r[0..4].try_into().expect("4"));
            let size = u32::from_le_bytes(r[12..16].try_into().expect("4"));
            let next = i64::from_le_bytes(r[16..24].try_into().expect("8"));
            let ok = (1..=1 << 30).contains(&size) && next >= -1 && time >= last_time;
            last_time = time;
            ok
        })
}

/// Parser of one oracleGeneral record (all requests are reads: the format has no op).
#[derive(Default)]
pub struct OracleGeneralParser;

impl RecordParser for OracleGeneralParser {
    fn record_len(&self) -> usize {
        RECORD_LEN
    }

    fn parse(&mut self, r: &[u8], vms: &mut VmTable) -> Result<Option<Request>, FieldError> {
        let time = u32::from_le_bytes(r[0..4].try_into().unwrap());
        let obj = u64::from_le_bytes(r[4..12].try_into().unwrap());
        let size = u32::from_le_bytes(r[12..16].try_into().unwrap());
        if size == 0 {
            return Ok(None);
        }
        let offset = obj
            .checked_mul(size as u64)
            .ok_or_else(|| FieldError::new("obj_id", format!("{obj} × obj_size {size} overflows a byte offset")))?;
        Ok(Some(Request { time_ns: time as u64 * 1_000_000_000, vm: vms.file_vm(), op: Op::Read, offset, len: size }))
    }
}

/// Writes oracleGeneral records. `next_access_vtime` needs the future, so records are
/// buffered (24 bytes each) and written with their next-access times by [`finish`](Self::finish).
pub struct OracleGeneralWriter {
    block: u64,
    records: Vec<(u32, u64)>,
}

impl OracleGeneralWriter {
    /// A writer splitting requests into `block`-byte objects.
    pub fn new(block: u64) -> Self {
        OracleGeneralWriter { block, records: Vec::new() }
    }

    /// Adds one request (one record per block it touches).
    pub fn push(&mut self, req: &Request) {
        let first = req.offset / self.block;
        let last = (req.end().max(req.offset + 1) - 1) / self.block;
        for b in first..=last {
            let obj = ((req.vm as u64) << BLOCK_BITS) | (b & ((1 << BLOCK_BITS) - 1));
            self.records.push(((req.time_ns / 1_000_000_000) as u32, obj));
        }
    }

    /// Computes next-access times (in record counts) and writes everything.
    pub fn finish(self, w: &mut dyn Write) -> io::Result<()> {
        let mut next = vec![-1i64; self.records.len()];
        let mut seen: FxHashMap<u64, usize> = FxHashMap::default();
        for (i, &(_, obj)) in self.records.iter().enumerate().rev() {
            if let Some(j) = seen.insert(obj, i) {
                next[i] = j as i64;
            }
        }
        let mut rec = [0u8; RECORD_LEN];
        for (i, &(t, obj)) in self.records.iter().enumerate() {
            rec[0..4].copy_from_slice(&t.to_le_bytes());
            rec[4..12].copy_from_slice(&obj.to_le_bytes());
            rec[12..16].copy_from_slice(&(self.block as u32).to_le_bytes());
            rec[16..24].copy_from_slice(&next[i].to_le_bytes());
            w.write_all(&rec)?;
        }
        Ok(())
    }
}
