//! The vSSD block manager's durable changes, as records a driver journals (the daemon in
//! its metadata journal beside the engine's; tests in a `Vec`). Replaying a journal's
//! records in order rebuilds the durable state ([`crate::state::State`]): what every
//! vSSD maps after a crash is exactly what its committed records say.
//!
//! Encoding: a type byte, then the fields little-endian; a name is a `u16` length and
//! UTF-8 bytes. The journal frames and checksums each record; decoding here checks that
//! the bytes make one whole, well-formed record.

use crate::geometry::{Lbn, Pbn};

/// A vSSD's id, given by the manager at registration (stable across restarts).
pub type VssdId = u32;

/// No physical block (`Geometry` keeps block numbers below it).
const NO_PBN: u32 = u32::MAX;

/// One durable change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A vSSD registered (SymFlex §2.4.1: name, maximum size M in blocks, persist flag P).
    Register {
        /// Its id.
        id: VssdId,
        /// Its name (unique).
        name: String,
        /// M: logical blocks the device has.
        max_blocks: u32,
        /// P: whether its blocks and their data outlive the VM.
        persist: bool,
    },
    /// Physical block `pbn` holds logical block `lbn` of `id` (written after the block was
    /// zeroed or its swapped-out data copied back, so no other VM's bytes can show).
    Assign {
        /// The physical block.
        pbn: Pbn,
        /// Its owner.
        id: VssdId,
        /// The logical block it backs.
        lbn: Lbn,
    },
    /// Physical block `pbn` is free (its owner released it, or was removed).
    Free {
        /// The physical block.
        pbn: Pbn,
    },
    /// Logical block `lbn` of `id` has its data on secondary storage (§2.4.4, persistent
    /// blocks of an inactive VM); the physical block it was copied from, if any, is free.
    /// (A checkpoint writes swapped-out blocks with no `pbn`.)
    SwappedOut {
        /// The owner.
        id: VssdId,
        /// The logical block.
        lbn: Lbn,
        /// The physical block it left.
        pbn: Option<Pbn>,
    },
    /// A swapped-out logical block's copy is dropped (its vSSD removed, or data it held is
    /// no longer wanted).
    SwapDropped {
        /// The owner.
        id: VssdId,
        /// The logical block.
        lbn: Lbn,
    },
    /// The VM stopped: the vSSD is inactive; with P its blocks stay mapped.
    Deactivate {
        /// The vSSD.
        id: VssdId,
    },
    /// The VM registered again (§2.4.1's restart of a persistent vSSD).
    Activate {
        /// The vSSD.
        id: VssdId,
    },
    /// The vSSD's removal began (the operator removed it, or its VM stopped without P):
    /// it serves no more I/O and its blocks and swapped-out copies are being dropped. Its
    /// `Free` and `SwapDropped` records follow it, so a crash that kept any of them kept
    /// this too, and the removal resumes after the restart instead of bringing back a
    /// vSSD with holes where its data was.
    Removing {
        /// The vSSD.
        id: VssdId,
    },
    /// Physical block `pbn` joins the region, free (one SSD budget: the cache engine
    /// emptied it and its frees are durable; its bytes are the cache's old ones until it
    /// is zeroed for a vSSD).
    Grant {
        /// The block.
        pbn: Pbn,
    },
    /// Free block `pbn` leaves the region (back to the cache engine once this is durable).
    Yield {
        /// The block.
        pbn: Pbn,
    },
    /// The vSSD is gone (it holds no block and no swapped-out copy).
    Remove {
        /// The vSSD.
        id: VssdId,
    },
}

/// A record that does not decode.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("vSSD record: {0}")]
pub struct DecodeError(pub String);

impl Record {
    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(16);
        let u32s = |b: &mut Vec<u8>, t: u8, xs: &[u32]| {
            b.push(t);
            for x in xs {
                b.extend_from_slice(&x.to_le_bytes());
            }
        };
        match self {
            Record::Register { id, name, max_blocks, persist } => {
                u32s(&mut b, 1, &[*id, *max_blocks]);
                b.push(u8::from(*persist));
                let n = name.as_bytes();
                b.extend_from_slice(&(n.len().min(u16::MAX as usize) as u16).to_le_bytes());
                b.extend_from_slice(&n[..n.len().min(u16::MAX as usize)]);
            }
            Record::Assign { pbn, id, lbn } => u32s(&mut b, 2, &[*pbn, *id, *lbn]),
            Record::Free { pbn } => u32s(&mut b, 3, &[*pbn]),
            Record::SwappedOut { id, lbn, pbn } => u32s(&mut b, 4, &[*id, *lbn, pbn.unwrap_or(NO_PBN)]),
            Record::SwapDropped { id, lbn } => u32s(&mut b, 5, &[*id, *lbn]),
            Record::Deactivate { id } => u32s(&mut b, 6, &[*id]),
            Record::Activate { id } => u32s(&mut b, 7, &[*id]),
            Record::Remove { id } => u32s(&mut b, 8, &[*id]),
            Record::Removing { id } => u32s(&mut b, 9, &[*id]),
            Record::Grant { pbn } => u32s(&mut b, 10, &[*pbn]),
            Record::Yield { pbn } => u32s(&mut b, 11, &[*pbn]),
        }
        b
    }

    /// Decodes one whole record from `b`.
    pub fn decode(b: &[u8]) -> Result<Record, DecodeError> {
        let bad = |m: &str| DecodeError(m.to_string());
        let (&t, rest) = b.split_first().ok_or_else(|| bad("empty"))?;
        let u32_at = |i: usize| -> Result<u32, DecodeError> {
            rest.get(i * 4..i * 4 + 4)
                .map(|x| u32::from_le_bytes(x.try_into().expect("4")))
                .ok_or_else(|| bad("truncated"))
        };
        let exact = |n: usize, r: Record| if rest.len() == n * 4 { Ok(r) } else { Err(bad("wrong length")) };
        match t {
            1 => {
                let (id, max_blocks) = (u32_at(0)?, u32_at(1)?);
                let persist = match rest.get(8) {
                    Some(0) => false,
                    Some(1) => true,
                    _ => return Err(bad("bad persist flag")),
                };
                let n = rest
                    .get(9..11)
                    .map(|x| u16::from_le_bytes([x[0], x[1]]) as usize)
                    .ok_or_else(|| bad("truncated"))?;
                let name = rest.get(11..).filter(|s| s.len() == n).ok_or_else(|| bad("wrong name length"))?;
                let name = String::from_utf8(name.to_vec()).map_err(|_| bad("name is not UTF-8"))?;
                Ok(Record::Register { id, name, max_blocks, persist })
            }
            2 => exact(3, Record::Assign { pbn: u32_at(0)?, id: u32_at(1)?, lbn: u32_at(2)? }),
            3 => exact(1, Record::Free { pbn: u32_at(0)? }),
            4 => exact(
                3,
                Record::SwappedOut { id: u32_at(0)?, lbn: u32_at(1)?, pbn: Some(u32_at(2)?).filter(|&p| p != NO_PBN) },
            ),
            5 => exact(2, Record::SwapDropped { id: u32_at(0)?, lbn: u32_at(1)? }),
            6 => exact(1, Record::Deactivate { id: u32_at(0)? }),
            7 => exact(1, Record::Activate { id: u32_at(0)? }),
            8 => exact(1, Record::Remove { id: u32_at(0)? }),
            9 => exact(1, Record::Removing { id: u32_at(0)? }),
            10 => exact(1, Record::Grant { pbn: u32_at(0)? }),
            11 => exact(1, Record::Yield { pbn: u32_at(0)? }),
            t => Err(DecodeError(format!("unknown record type {t}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_record() -> impl Strategy<Value = Record> {
        prop_oneof![
            (any::<u32>(), "[a-z0-9-]{0,20}", any::<u32>(), any::<bool>())
                .prop_map(|(id, name, max_blocks, persist)| Record::Register { id, name, max_blocks, persist }),
            (any::<u32>(), any::<u32>(), any::<u32>()).prop_map(|(pbn, id, lbn)| Record::Assign { pbn, id, lbn }),
            any::<u32>().prop_map(|pbn| Record::Free { pbn }),
            (any::<u32>(), any::<u32>(), proptest::option::of(0..u32::MAX))
                .prop_map(|(id, lbn, pbn)| Record::SwappedOut { id, lbn, pbn }),
            (any::<u32>(), any::<u32>()).prop_map(|(id, lbn)| Record::SwapDropped { id, lbn }),
            any::<u32>().prop_map(|id| Record::Deactivate { id }),
            any::<u32>().prop_map(|id| Record::Activate { id }),
            any::<u32>().prop_map(|id| Record::Remove { id }),
            any::<u32>().prop_map(|id| Record::Removing { id }),
            any::<u32>().prop_map(|pbn| Record::Grant { pbn }),
            any::<u32>().prop_map(|pbn| Record::Yield { pbn }),
        ]
    }

    proptest! {
        #[test]
        fn records_round_trip(r in any_record()) {
            prop_assert_eq!(Record::decode(&r.encode()), Ok(r));
        }

        /// No byte string panics the decoder; a cut or lengthened record is refused.
        #[test]
        fn garbage_is_refused_not_panicked_on(b in proptest::collection::vec(any::<u8>(), 0..40), r in any_record()) {
            let _ = Record::decode(&b);
            let e = r.encode();
            prop_assert!(Record::decode(&e[..e.len() - 1]).is_err());
            let mut longer = e.clone();
            longer.push(0);
            prop_assert!(Record::decode(&longer).is_err());
        }
    }
}
