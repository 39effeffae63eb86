//! SymFlex's second use case (§4.2): a Fatcache-like key-value cache whose slabs are the
//! vSSD's blocks ([`SlabTable`]), cooperating with the host through the same resize
//! protocol as the block cache ([`crate::balloon`]): an inflate adds free slabs, a deflate
//! gives free slabs first, then emptied ones, then the oldest full ones (their items are
//! dropped — it is a cache), a block the host took drops its items. Items are written
//! straight to their slot (Fatcache batches them in a memory slab first; here a set is on
//! the vSSD when it returns), each with a header — key and value lengths and a CRC-32 of
//! both — checked on every get, so a get never returns bytes that are not the value last
//! set: a slot whose bytes do not check is a miss.

use crate::balloon::{self, BlockUser, Channel};
use crate::block_cache::Lbn;
use crate::control::Control;
use crate::guest_cache::BlockDevice;
use crate::slab_table::{SlabTable, MIN_SLOT};
use std::io;
use std::time::Duration;

/// An item's header: magic, key length, value length, CRC-32 of key and value.
const HEADER: usize = 4 + 2 + 4 + 4;
const MAGIC: &[u8; 4] = b"CVKV";

/// Counters of the store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct KvStats {
    /// Sets stored.
    pub sets: u64,
    /// Sets not stored (too large for a slab, or no block held).
    pub not_stored: u64,
    /// Gets that found the value.
    pub hits: u64,
    /// Gets that did not.
    pub misses: u64,
    /// Items dropped to make room, in deflates, or with blocks the host took.
    pub dropped: u64,
    /// Blocks the host inflated.
    pub inflated: u64,
    /// Blocks given back in deflates.
    pub released: u64,
    /// Blocks the host took after a deadline.
    pub forced: u64,
}

/// The store over a vSSD.
pub struct SlabKv<V> {
    table: SlabTable,
    vssd: V,
    channel: Channel,
    block: u64,
    stats: KvStats,
}

/// An item's bytes: header, key, value, zero-padded to whole 512-byte sectors.
fn encode(key: &[u8], value: &[u8]) -> Vec<u8> {
    let len = HEADER + key.len() + value.len();
    let mut b = Vec::with_capacity(len.next_multiple_of(MIN_SLOT as usize));
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&(key.len() as u16).to_le_bytes());
    b.extend_from_slice(&(value.len() as u32).to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(key);
    crc.update(value);
    b.extend_from_slice(&crc.finalize().to_le_bytes());
    b.extend_from_slice(key);
    b.extend_from_slice(value);
    b.resize(len.next_multiple_of(MIN_SLOT as usize), 0);
    b
}

/// The value in an item's bytes, if they hold `key`'s item and check.
fn decode(bytes: &[u8], key: &[u8]) -> Option<Vec<u8>> {
    if bytes.len() < HEADER || &bytes[..4] != MAGIC {
        return None;
    }
    let klen = u16::from_le_bytes(bytes[4..6].try_into().ok()?) as usize;
    let vlen = u32::from_le_bytes(bytes[6..10].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(bytes[10..14].try_into().ok()?);
    let (k, rest) = bytes.get(HEADER..)?.split_at_checked(klen)?;
    let v = rest.get(..vlen)?;
    let mut h = crc32fast::Hasher::new();
    h.update(k);
    h.update(v);
    (k == key && h.finalize() == crc).then(|| v.to_vec())
}

impl<V: BlockDevice> SlabKv<V> {
    /// Starts over a vSSD: hello, every valid block a free slab, any deflate answered.
    pub fn start(vssd: V, control: Control) -> io::Result<Self> {
        let (channel, hello) = Channel::hello(control)?;
        let mut kv = SlabKv {
            table: SlabTable::new(hello.block_size, &hello.valid),
            vssd,
            channel,
            block: hello.block_size,
            stats: KvStats::default(),
        };
        balloon::give_back(&mut kv)?;
        Ok(kv)
    }

    /// The counters.
    pub fn stats(&self) -> &KvStats {
        &self.stats
    }

    /// The slab table.
    pub fn table(&self) -> &SlabTable {
        &self.table
    }

    /// Bytes per slab.
    pub fn slab_size(&self) -> u64 {
        self.block
    }

    /// Stores `value` under `key`; false when it was not stored (larger than a slab, no
    /// block held, or its block taken meanwhile): a later get misses.
    pub fn set(&mut self, key: &[u8], value: &[u8]) -> io::Result<bool> {
        if key.len() > u16::MAX as usize || value.len() > u32::MAX as usize {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "key or value too long"));
        }
        let bytes = encode(key, value);
        let Some((at, evicted)) = self.table.put(key, bytes.len() as u64) else {
            self.table.delete(key);
            self.stats.not_stored += 1;
            return Ok(false);
        };
        self.stats.dropped += evicted.len() as u64;
        let off = self.table.offset(at);
        if let Err(e) = self.vssd.write_at(&bytes, off) {
            self.table.delete(key);
            self.vssd_failed(at.lbn, e)?;
            self.stats.not_stored += 1;
            return Ok(false);
        }
        self.stats.sets += 1;
        Ok(true)
    }

    /// The value last set under `key`, if the store still holds it.
    pub fn get(&mut self, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
        let Some(at) = self.table.get(key) else {
            self.stats.misses += 1;
            return Ok(None);
        };
        let mut bytes = vec![0u8; (at.len as usize).next_multiple_of(MIN_SLOT as usize)];
        let read = self.vssd.read_at(&mut bytes, self.table.offset(at));
        let value = match read {
            Ok(()) => decode(&bytes, key),
            Err(e) => {
                self.vssd_failed(at.lbn, e)?;
                None
            }
        };
        match value {
            Some(v) => {
                self.stats.hits += 1;
                Ok(Some(v))
            }
            None => {
                self.table.delete(key);
                self.stats.misses += 1;
                Ok(None)
            }
        }
    }

    /// Forgets `key`.
    pub fn delete(&mut self, key: &[u8]) -> bool {
        self.table.delete(key)
    }

    /// A vSSD I/O on slab `lbn` failed: the host may have taken it. Resyncs; an error
    /// when the host says the block is still ours.
    fn vssd_failed(&mut self, lbn: Lbn, e: io::Error) -> io::Result<()> {
        balloon::resync(self)?;
        if self.table.valid_lbns().binary_search(&lbn).is_ok() {
            return Err(io::Error::new(e.kind(), format!("vSSD slab {lbn}: {e}")));
        }
        Ok(())
    }

    /// Handles the host's notices that came; how many.
    pub fn service(&mut self) -> io::Result<usize> {
        balloon::service_for(self, Duration::ZERO)
    }
}

impl<V: BlockDevice> BlockUser for SlabKv<V> {
    fn channel(&mut self) -> &mut Channel {
        &mut self.channel
    }
    fn valid_lbns(&self) -> Vec<Lbn> {
        self.table.valid_lbns()
    }
    fn inflate(&mut self, lbns: &[Lbn], counted: bool) {
        if counted {
            self.stats.inflated += lbns.len() as u64;
        }
        self.table.inflate(lbns);
    }
    fn lost(&mut self, lbns: &[Lbn], forced: bool) {
        if forced {
            self.stats.forced += lbns.len() as u64;
        }
        self.stats.dropped += self.table.lost(lbns).len() as u64;
    }
    fn release(&mut self, n: u32) -> io::Result<Vec<Lbn>> {
        let (lbns, keys) = self.table.release(n);
        self.stats.dropped += keys.len() as u64;
        Ok(lbns)
    }
    fn released(&mut self, lbns: &[Lbn]) {
        self.stats.released += lbns.len() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_round_trip_and_other_bytes_do_not_check() {
        let b = encode(b"key", b"value");
        assert_eq!(b.len(), 512);
        assert_eq!(decode(&b, b"key"), Some(b"value".to_vec()));
        assert_eq!(decode(&b, b"kez"), None, "another key's slot");
        let mut bad = b.clone();
        bad[HEADER + 4] ^= 1;
        assert_eq!(decode(&bad, b"key"), None, "a flipped byte");
        assert_eq!(decode(&[0u8; 512], b"key"), None, "a zeroed (new) block");
        let mut short = b.clone();
        short[6..10].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode(&short, b"key"), None, "a length past the slot");
    }
}
