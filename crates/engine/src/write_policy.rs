//! Per-VM write policies (the glossary's WB / WT / WA / RO; `wi` names RO).
//!
//! | policy | write hit | write miss | read miss |
//! |---|---|---|---|
//! | WB write-back | SSD, dirty | allocate, SSD, dirty | allocate, fill |
//! | WT write-through | SSD + backing | allocate, SSD + backing | allocate, fill |
//! | WA write-around (OCF) | SSD + backing | backing only | allocate, fill |
//! | RO read-only (ECI-Cache), = write-invalidate | backing, invalidate cached sectors | backing only | allocate, fill |
//!
//! Switching a VM away from WB flushes its dirty blocks first.

use std::fmt;
use std::str::FromStr;

/// How a VM's writes are handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WritePolicy {
    /// Write-back: acknowledged once in the SSD, destaged later.
    Wb,
    /// Write-through with write-allocate.
    Wt,
    /// Write-around: hits update both copies, misses bypass the cache.
    Wa,
    /// Read-only (ECI-Cache's RO) / write-invalidate: writes go to backing and invalidate.
    Ro,
}

impl WritePolicy {
    /// Every policy.
    pub const ALL: [WritePolicy; 4] = [WritePolicy::Wb, WritePolicy::Wt, WritePolicy::Wa, WritePolicy::Ro];

    /// Command-line name.
    pub fn name(self) -> &'static str {
        match self {
            WritePolicy::Wb => "wb",
            WritePolicy::Wt => "wt",
            WritePolicy::Wa => "wa",
            WritePolicy::Ro => "ro",
        }
    }
}

impl fmt::Display for WritePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WritePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "wb" | "write-back" => Ok(WritePolicy::Wb),
            "wt" | "write-through" => Ok(WritePolicy::Wt),
            "wa" | "write-around" => Ok(WritePolicy::Wa),
            "ro" | "read-only" | "wi" | "write-invalidate" => Ok(WritePolicy::Ro),
            _ => Err(format!("unknown write policy `{s}` (wb, wt, wa, ro; wi = ro)")),
        }
    }
}
