//! The vSSD region's geometry and the split of a request into per-block pieces
//! (SymFlex §2.4.2: "a request to read 2 MB of data from an offset of 256 KB will be
//! divided into 3 sub requests": 768 KB at 256 KB, 1 MB at 1 MB, 256 KB at 2 MB).

use serde::{Deserialize, Serialize};

/// A physical block number: the block's index in the vSSD region.
pub type Pbn = u32;
/// A logical block number: the block's index in one vSSD.
pub type Lbn = u32;

/// Default vSSD block: 1 MiB (SymFlex §2.2: "the default block size used in our
/// implementation is 1 MB (2048 sectors of 512 bytes each)").
pub const DEFAULT_BLOCK_BYTES: u64 = 1 << 20;

/// The region's shape: how many blocks of how many bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Geometry {
    /// Bytes per block: a power of two from 4 KiB to 1 GiB.
    pub block_bytes: u64,
    /// Physical blocks in the region.
    pub blocks: u32,
}

/// A piece of a request that lies in one logical block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The logical block.
    pub lbn: Lbn,
    /// Byte offset within the block.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// Where the piece's bytes are in the request's buffer.
    pub buf_offset: u64,
}

impl Geometry {
    /// A geometry, checked (the error names what is wrong).
    pub fn new(block_bytes: u64, blocks: u32) -> Result<Geometry, String> {
        if !block_bytes.is_power_of_two() || !(4096..=1 << 30).contains(&block_bytes) {
            return Err(format!("vSSD block size {block_bytes} is not a power of two from 4 KiB to 1 GiB"));
        }
        if blocks == u32::MAX {
            return Err(format!("{blocks} vSSD blocks: at most {}", u32::MAX - 1));
        }
        Ok(Geometry { block_bytes, blocks })
    }

    /// The region's bytes.
    pub fn bytes(&self) -> u64 {
        self.block_bytes * u64::from(self.blocks)
    }

    /// The byte offset of physical block `pbn` in the region.
    pub fn offset_of(&self, pbn: Pbn) -> u64 {
        u64::from(pbn) * self.block_bytes
    }

    /// `len` bytes at `offset` of a vSSD split at block boundaries, in order (§2.4.2).
    pub fn split(&self, offset: u64, len: u64) -> impl Iterator<Item = Piece> + '_ {
        let bs = self.block_bytes;
        let mut at = offset;
        let end = offset.saturating_add(len);
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let within = at % bs;
            let n = (bs - within).min(end - at);
            let p = Piece { lbn: (at / bs) as Lbn, offset: within, len: n, buf_offset: at - offset };
            at += n;
            Some(p)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SymFlex §2.4.2's example.
    #[test]
    fn two_mebibytes_at_256_kib_are_three_pieces() {
        let g = Geometry::new(1 << 20, 8).unwrap();
        let p: Vec<Piece> = g.split(256 << 10, 2 << 20).collect();
        assert_eq!(
            p,
            [
                Piece { lbn: 0, offset: 256 << 10, len: 768 << 10, buf_offset: 0 },
                Piece { lbn: 1, offset: 0, len: 1 << 20, buf_offset: 768 << 10 },
                Piece { lbn: 2, offset: 0, len: 256 << 10, buf_offset: (768 + 1024) << 10 },
            ]
        );
    }

    #[test]
    fn bad_block_sizes_are_refused() {
        assert!(Geometry::new(3 << 20, 1).unwrap_err().contains("power of two"));
        assert!(Geometry::new(2048, 1).is_err() && Geometry::new(2 << 30, 1).is_err());
        assert_eq!(Geometry::new(4096, 0).unwrap().split(0, 0).count(), 0);
    }
}
