//! Errors of trace input: every malformed record names its file, where it is, and which field.

use std::fmt;

/// Where in an input a bad record sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Location {
    /// 1-based line number of a text format.
    Line(u64),
    /// Byte offset of a binary record (and its 0-based record index).
    Record {
        /// Offset of the record's first byte in the decompressed stream.
        offset: u64,
        /// 0-based record number.
        index: u64,
    },
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Line(n) => write!(f, "line {n}"),
            Location::Record { offset, index } => write!(f, "byte offset {offset} (record {index})"),
        }
    }
}

/// Any failure reading, parsing or writing a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// A record could not be parsed.
    #[error("{file}: {at}: field `{field}`: {msg}")]
    Malformed {
        /// Input file as given by the user.
        file: String,
        /// Line or byte offset of the record.
        at: Location,
        /// Name of the offending field.
        field: &'static str,
        /// What is wrong with it.
        msg: String,
    },
    /// The file could not be opened or read.
    #[error("{file}: {source}")]
    Io {
        /// Input file as given by the user.
        file: String,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The trace format or an option is not usable.
    #[error("{0}")]
    Usage(String),
}

/// A field-level parse failure, before the reader adds file and location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Name of the offending field.
    pub field: &'static str,
    /// What is wrong with it.
    pub msg: String,
}

impl FieldError {
    /// Builds a field error.
    pub fn new(field: &'static str, msg: impl Into<String>) -> Self {
        FieldError { field, msg: msg.into() }
    }

    /// The field is absent from the record.
    pub fn missing(field: &'static str) -> Self {
        FieldError::new(field, "missing")
    }

    /// The field holds text that is not what the format allows.
    pub fn invalid(field: &'static str, raw: &[u8], expected: &str) -> Self {
        let shown = String::from_utf8_lossy(&raw[..raw.len().min(40)]).into_owned();
        FieldError::new(field, format!("`{shown}` is not {expected}"))
    }
}
