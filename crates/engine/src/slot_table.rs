//! Per-slot metadata of the global pool, stored column-wise so each field costs only its
//! own bytes per slot: block key (owner VM in the top 16 bits, block number below),
//! intrusive list links for the replacement policies, one byte of policy state (CLOCK's
//! 4-bit reference counter, S3-FIFO's frequency, the pool bit), and an optional last
//! access time. Valid/dirty sector bitmaps live in [`crate::sector_bits`].

use cachevisor_trace::VmId;

/// Marks a free slot's key and an absent link.
pub const NIL: u32 = u32::MAX;
/// Key of a free slot.
pub const FREE_KEY: u64 = u64::MAX;
/// Bits of a key that hold the block number (the rest is the VM id).
pub const BLOCK_BITS: u32 = 48;

/// Packs (vm, block) into one 64-bit key.
#[inline]
pub fn pack_key(vm: VmId, block: u64) -> u64 {
    debug_assert!(block < 1 << BLOCK_BITS && vm < 1 << 16);
    ((vm as u64) << BLOCK_BITS) | block
}

/// The VM of a key.
#[inline]
pub fn key_vm(key: u64) -> VmId {
    (key >> BLOCK_BITS) as VmId
}

/// The block number of a key.
#[inline]
pub fn key_block(key: u64) -> u64 {
    key & ((1 << BLOCK_BITS) - 1)
}

/// The hot part of a slot's metadata, kept together so a lookup and a list update touch
/// one cache line: the block key and the list links.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct SlotMeta {
    /// Block key, [`FREE_KEY`] when free.
    pub key: u64,
    /// Previous slot in the list the slot is on.
    pub prev: u32,
    /// Next slot in the list the slot is on.
    pub next: u32,
}

/// Slot metadata: the hot record per slot, then one column per cold field.
#[derive(Debug, Clone)]
pub struct SlotTable {
    /// Key and links per slot.
    pub meta: Vec<SlotMeta>,
    /// Policy-owned state byte.
    pub aux: Vec<u8>,
    /// Last access per slot in milliseconds of the driver's clock (empty when not tracked).
    pub last_access_ms: Vec<u32>,
}

impl SlotTable {
    /// `n` free slots.
    pub fn new(n: usize, track_last_access: bool) -> Self {
        SlotTable {
            meta: vec![SlotMeta { key: FREE_KEY, prev: NIL, next: NIL }; n],
            aux: vec![0; n],
            last_access_ms: if track_last_access { vec![0; n] } else { Vec::new() },
        }
    }

    /// `n` slots: new ones free and on no list, those past `n` dropped (the caller made
    /// sure they are on no list).
    pub fn resize(&mut self, n: usize, track_last_access: bool) {
        self.meta.resize(n, SlotMeta { key: FREE_KEY, prev: NIL, next: NIL });
        self.aux.resize(n, 0);
        if track_last_access {
            self.last_access_ms.resize(n, 0);
        }
        if n < self.meta.capacity() / 2 {
            self.meta.shrink_to_fit();
            self.aux.shrink_to_fit();
            self.last_access_ms.shrink_to_fit();
        }
    }

    /// Number of slots.
    pub fn len(&self) -> usize {
        self.meta.len()
    }

    /// Whether there are no slots.
    pub fn is_empty(&self) -> bool {
        self.meta.is_empty()
    }

    /// The key of slot `s`.
    #[inline]
    pub fn key(&self, s: u32) -> u64 {
        self.meta[s as usize].key
    }

    /// Sets the key of slot `s`.
    #[inline]
    pub fn set_key(&mut self, s: u32, key: u64) {
        self.meta[s as usize].key = key;
    }

    /// Bytes of memory held.
    pub fn memory_bytes(&self) -> usize {
        self.meta.capacity() * std::mem::size_of::<SlotMeta>()
            + self.aux.capacity()
            + self.last_access_ms.capacity() * 4
    }
}

/// A doubly linked list threaded through the slot table's links; front = most recent.
#[derive(Debug, Clone, Copy)]
pub struct List {
    head: u32,
    tail: u32,
    len: u32,
}

impl Default for List {
    fn default() -> Self {
        List { head: NIL, tail: NIL, len: 0 }
    }
}

impl List {
    /// Entries.
    #[inline]
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The front (most recently inserted) slot.
    #[inline]
    pub fn front(&self) -> Option<u32> {
        (self.head != NIL).then_some(self.head)
    }

    /// The back (oldest) slot.
    #[inline]
    pub fn back(&self) -> Option<u32> {
        (self.tail != NIL).then_some(self.tail)
    }

    /// Inserts `s` at the front.
    #[inline]
    pub fn push_front(&mut self, t: &mut SlotTable, s: u32) {
        t.meta[s as usize].prev = NIL;
        t.meta[s as usize].next = self.head;
        if self.head != NIL {
            t.meta[self.head as usize].prev = s;
        } else {
            self.tail = s;
        }
        self.head = s;
        self.len += 1;
    }

    /// Inserts `s` at the back.
    #[inline]
    pub fn push_back(&mut self, t: &mut SlotTable, s: u32) {
        t.meta[s as usize].next = NIL;
        t.meta[s as usize].prev = self.tail;
        if self.tail != NIL {
            t.meta[self.tail as usize].next = s;
        } else {
            self.head = s;
        }
        self.tail = s;
        self.len += 1;
    }

    /// Removes `s`, which must be in this list.
    #[inline]
    pub fn unlink(&mut self, t: &mut SlotTable, s: u32) {
        let (p, n) = (t.meta[s as usize].prev, t.meta[s as usize].next);
        if p != NIL {
            t.meta[p as usize].next = n;
        } else {
            self.head = n;
        }
        if n != NIL {
            t.meta[n as usize].prev = p;
        } else {
            self.tail = p;
        }
        self.len -= 1;
    }

    /// Moves `s` (in this list) to the front.
    #[inline]
    pub fn move_to_front(&mut self, t: &mut SlotTable, s: u32) {
        if self.head != s {
            self.unlink(t, s);
            self.push_front(t, s);
        }
    }

    /// Puts `new` (on no list) where `old` (in this list) is, and takes `old` off: a block
    /// moved to another slot keeps its place in the order (migration, `migration.rs`).
    pub fn replace(&mut self, t: &mut SlotTable, old: u32, new: u32) {
        let (p, n) = (t.meta[old as usize].prev, t.meta[old as usize].next);
        t.meta[new as usize].prev = p;
        t.meta[new as usize].next = n;
        if p != NIL {
            t.meta[p as usize].next = new;
        } else {
            self.head = new;
        }
        if n != NIL {
            t.meta[n as usize].prev = new;
        } else {
            self.tail = new;
        }
    }

    /// Removes and returns the back slot.
    #[inline]
    pub fn pop_back(&mut self, t: &mut SlotTable) -> Option<u32> {
        let s = self.back()?;
        self.unlink(t, s);
        Some(s)
    }

    /// Slots from back (next victim) to front.
    pub fn iter_from_back<'a>(&self, t: &'a SlotTable) -> impl Iterator<Item = u32> + 'a {
        let mut cur = self.tail;
        std::iter::from_fn(move || {
            let s = cur;
            (s != NIL).then(|| {
                cur = t.meta[s as usize].prev;
                s
            })
        })
    }
}
