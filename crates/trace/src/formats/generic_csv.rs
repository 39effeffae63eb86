//! Generic delimited text with a column mapping given on the command line, and the
//! project's own canonical CSV (`time_ns,vm,op,offset,len`, the default mapping).
//!
//! Mapping syntax (`--csv-columns`), comma-separated `key=value` items:
//! `time=COL[:ns|us|ms|s]`, `vm=COL`, `op=COL`, `offset=COL[:byte|sector|KiB]`,
//! `len=COL[:byte|sector|KiB]`, `header=yes|no|auto`, `sep=comma|tab|space|semicolon`,
//! `read=TOKEN`, `write=TOKEN`. Columns are 0-based. Without `read`/`write`, an op field
//! starting with `r`/`R` is a read and one starting with `w`/`W` a write.
//! Example: `time=0:us,vm=1,op=2,offset=3:sector,len=4,header=no`. With `header=auto` (the
//! default) the first line is skipped only when it does not parse as a record, so a file
//! without a header loses no request.

use crate::error::FieldError;
use crate::numparse::{parse_u64, split_fields, split_ws};
use crate::request::{Op, Request};
use crate::source::LineParser;
use crate::vm_table::VmTable;
use std::io::{self, Write};
use std::str::FromStr;

/// Header of the canonical CSV.
pub const CANONICAL_HEADER: &str = "time_ns,vm,op,offset,len";

/// Column mapping of a generic CSV.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CsvColumns {
    /// Column of the timestamp, and nanoseconds per unit.
    pub time: Option<(usize, u64)>,
    /// Column of the VM / device key (absent: one VM per file).
    pub vm: Option<usize>,
    /// Column of the operation.
    pub op: usize,
    /// Column of the offset, and bytes per unit.
    pub offset: (usize, u64),
    /// Column of the length, and bytes per unit.
    pub len: (usize, u64),
    /// Whether the first line is a header to skip (`None`: only when it is not a record).
    pub header: Option<bool>,
    /// Field separator (`None`: runs of whitespace).
    pub sep: Option<u8>,
    /// Exact read token, if set.
    pub read: Option<String>,
    /// Exact write token, if set.
    pub write: Option<String>,
}

impl Default for CsvColumns {
    fn default() -> Self {
        CsvColumns {
            time: Some((0, 1)),
            vm: Some(1),
            op: 2,
            offset: (3, 1),
            len: (4, 1),
            header: None,
            sep: Some(b','),
            read: None,
            write: None,
        }
    }
}

fn col_unit(v: &str, units: &[(&str, u64)], key: &str) -> Result<(usize, u64), String> {
    let (c, u) = v.split_once(':').unwrap_or((v, units[0].0));
    let col = c.parse().map_err(|_| format!("`{key}={v}`: column `{c}` is not a 0-based number"))?;
    let unit = units.iter().find(|(n, _)| *n == u).map(|(_, m)| *m).ok_or_else(|| {
        let names: Vec<_> = units.iter().map(|(n, _)| *n).collect();
        format!("`{key}={v}`: unit `{u}` is not one of {}", names.join(", "))
    })?;
    Ok((col, unit))
}

impl FromStr for CsvColumns {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        const TIME: &[(&str, u64)] = &[("ns", 1), ("us", 1_000), ("ms", 1_000_000), ("s", 1_000_000_000)];
        const SIZE: &[(&str, u64)] = &[("byte", 1), ("sector", 512), ("KiB", 1024)];
        let mut c = CsvColumns { time: None, vm: None, ..CsvColumns::default() };
        let (mut op, mut off, mut len) = (false, false, false);
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (k, v) = item.split_once('=').ok_or_else(|| format!("`{item}` is not key=value"))?;
            match k {
                "time" => c.time = Some(col_unit(v, TIME, k)?),
                "vm" => c.vm = Some(v.parse().map_err(|_| format!("`vm={v}`: not a column number"))?),
                "op" => {
                    c.op = v.parse().map_err(|_| format!("`op={v}`: not a column number"))?;
                    op = true
                }
                "offset" => {
                    c.offset = col_unit(v, SIZE, k)?;
                    off = true
                }
                "len" => {
                    c.len = col_unit(v, SIZE, k)?;
                    len = true
                }
                "header" => {
                    c.header = match v {
                        "yes" | "true" | "1" => Some(true),
                        "no" | "false" | "0" => Some(false),
                        "auto" => None,
                        _ => return Err(format!("header: `{v}` (yes, no or auto)")),
                    }
                }
                "sep" => {
                    c.sep = match v {
                        "comma" => Some(b','),
                        "tab" => Some(b'\t'),
                        "semicolon" => Some(b';'),
                        "space" => None,
                        _ => return Err(format!("`sep={v}`: use comma, tab, semicolon or space")),
                    }
                }
                "read" => c.read = Some(v.to_string()),
                "write" => c.write = Some(v.to_string()),
                _ => return Err(format!("unknown key `{k}` (time, vm, op, offset, len, header, sep, read, write)")),
            }
        }
        for (set, name) in [(op, "op"), (off, "offset"), (len, "len")] {
            if !set {
                return Err(format!("column mapping lacks `{name}=COL`"));
            }
        }
        Ok(c)
    }
}

/// Parser of one mapped line.
pub struct GenericCsvParser {
    cols: CsvColumns,
    first: bool,
    fields: Vec<(usize, usize)>,
}

impl GenericCsvParser {
    /// A parser for `cols`.
    pub fn new(cols: CsvColumns) -> Self {
        GenericCsvParser { cols, first: true, fields: Vec::with_capacity(8) }
    }
}

impl LineParser for GenericCsvParser {
    fn parse(&mut self, line: &[u8], vms: &mut VmTable) -> Result<Option<Request>, FieldError> {
        if std::mem::take(&mut self.first) {
            match self.cols.header {
                Some(true) => return Ok(None),
                Some(false) => {}
                // A first line that is not a record is a header; one that is, is data.
                None => return Ok(self.record(line, vms).ok().flatten()),
            }
        }
        self.record(line, vms)
    }
}

impl GenericCsvParser {
    fn record(&mut self, line: &[u8], vms: &mut VmTable) -> Result<Option<Request>, FieldError> {
        self.fields.clear();
        let base = line.as_ptr() as usize;
        let mut push = |f: &[u8]| self.fields.push((f.as_ptr() as usize - base, f.len()));
        match self.cols.sep {
            Some(sep) => split_fields(line, sep).for_each(&mut push),
            None => split_ws(line).for_each(&mut push),
        }
        let get = |col: usize, name: &'static str| {
            self.fields
                .get(col)
                .map(|&(o, l)| &line[o..o + l])
                .ok_or_else(|| FieldError::new(name, format!("column {col} missing (line has {})", self.fields.len())))
        };
        let time_ns = match self.cols.time {
            Some((c, mul)) => {
                let t = get(c, "time")?;
                parse_u64(t).and_then(|v| v.checked_mul(mul)).ok_or_else(|| FieldError::invalid("time", t, "a time"))?
            }
            None => 0,
        };
        let o = get(self.cols.op, "op")?;
        let op = match (&self.cols.read, &self.cols.write) {
            (Some(r), _) if o.eq_ignore_ascii_case(r.as_bytes()) => Op::Read,
            (_, Some(w)) if o.eq_ignore_ascii_case(w.as_bytes()) => Op::Write,
            (None, None) if matches!(o.first(), Some(b'r' | b'R')) => Op::Read,
            (None, None) if matches!(o.first(), Some(b'w' | b'W')) => Op::Write,
            _ => return Err(FieldError::invalid("op", o, "a read or write token")),
        };
        let f = get(self.cols.offset.0, "offset")?;
        let offset = parse_u64(f)
            .and_then(|v| v.checked_mul(self.cols.offset.1))
            .ok_or_else(|| FieldError::invalid("offset", f, "an offset"))?;
        let f = get(self.cols.len.0, "len")?;
        let len = parse_u64(f)
            .and_then(|v| v.checked_mul(self.cols.len.1))
            .filter(|&v| v <= u32::MAX as u64)
            .ok_or_else(|| FieldError::invalid("len", f, "a length below 4 GiB"))?;
        let vm = match self.cols.vm {
            Some(c) => {
                let key = get(c, "vm")?;
                vms.id(key)
            }
            None => vms.file_vm(),
        };
        Ok(Some(Request { time_ns, vm, op, offset, len: len as u32 }))
    }
}

/// Writes one canonical line (`,` in VM names becomes `_`).
pub fn write_canonical(w: &mut dyn Write, req: &Request, vm_name: &str) -> io::Result<()> {
    let op = if req.op.is_write() { "W" } else { "R" };
    if vm_name.contains(',') {
        writeln!(w, "{},{},{op},{},{}", req.time_ns, vm_name.replace(',', "_"), req.offset, req.len)
    } else {
        writeln!(w, "{},{vm_name},{op},{},{}", req.time_ns, req.offset, req.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_parses_and_explains() {
        let c: CsvColumns = "time=0:us,vm=1,op=2,offset=3:sector,len=4,header=no,sep=tab".parse().unwrap();
        assert_eq!(c.time, Some((0, 1000)));
        assert_eq!(c.offset, (3, 512));
        assert_eq!(c.sep, Some(b'\t'));
        assert_eq!(c.header, Some(false));
        assert_eq!(CsvColumns::default().header, None);
        assert!("op=1,offset=2,len=3,header=maybe".parse::<CsvColumns>().unwrap_err().contains("auto"));
        assert!("op=1,offset=2".parse::<CsvColumns>().unwrap_err().contains("len"));
        assert!("op=1,offset=2:parsec,len=3".parse::<CsvColumns>().unwrap_err().contains("parsec"));
        assert!("bogus=1".parse::<CsvColumns>().unwrap_err().contains("unknown key"));
    }
}
