//! Per-slot sector bitmaps (valid, dirty), packed: a slot of S sectors uses S bits, so a
//! 4 KiB block of 512-byte sectors costs one byte per bitmap. Blocks of up to 64 sectors
//! (32 KiB) share 64-bit words; larger blocks use whole words.

/// A packed bitmap of `sectors` bits per slot.
#[derive(Debug, Clone)]
pub struct SectorBits {
    words: Vec<u64>,
    sectors: u32,
    words_per_slot: usize,
}

/// A sector range `[lo, hi)` within a block.
pub type SectorRange = (u32, u32);

#[inline]
fn pos(sectors: u32, words_per_slot: usize, slot: u32, s: u32) -> (usize, u32) {
    if sectors >= 64 {
        (slot as usize * words_per_slot + (s / 64) as usize, s % 64)
    } else {
        let bit = slot as u64 * sectors as u64 + s as u64;
        ((bit / 64) as usize, (bit % 64) as u32)
    }
}

impl SectorBits {
    /// Zeroed bitmaps for `slots` slots of `sectors` sectors (a power of two).
    pub fn new(slots: usize, sectors: u32) -> Self {
        assert!(sectors.is_power_of_two());
        let words_per_slot = (sectors as usize).div_ceil(64);
        let words = if sectors >= 64 { slots * words_per_slot } else { (slots * sectors as usize).div_ceil(64) };
        SectorBits { words: vec![0; words], sectors, words_per_slot }
    }

    /// Bitmaps for `slots` slots: new ones zeroed, those past it dropped.
    pub fn resize(&mut self, slots: usize) {
        let words = if self.sectors >= 64 {
            slots * self.words_per_slot
        } else {
            // Slots sharing a word: the bits past `slots` in its last word are cleared
            // (a slot cut there and grown back must come back empty).
            let bits = slots * self.sectors as usize;
            if !bits.is_multiple_of(64) && bits / 64 < self.words.len() {
                self.words[bits / 64] &= (1u64 << (bits % 64)) - 1;
            }
            bits.div_ceil(64)
        };
        if words < self.words.len() {
            self.words.truncate(words);
            self.words.shrink_to_fit();
        } else {
            self.words.resize(words, 0);
        }
    }

    /// (word index, bit shift) of sector `s` of `slot`.
    #[inline]
    fn pos(&self, slot: u32, s: u32) -> (usize, u32) {
        pos(self.sectors, self.words_per_slot, slot, s)
    }

    /// The (word, mask) pieces covering sectors `[lo, hi)` of `slot`; borrows nothing.
    #[inline]
    fn pieces(&self, slot: u32, (lo, hi): SectorRange) -> impl Iterator<Item = (usize, u64)> {
        let (sectors, wps) = (self.sectors, self.words_per_slot);
        let mut s = lo;
        std::iter::from_fn(move || {
            if s >= hi {
                return None;
            }
            let (w, sh) = pos(sectors, wps, slot, s);
            let n = (hi - s).min(64 - sh);
            let mask = if n == 64 { u64::MAX } else { ((1u64 << n) - 1) << sh };
            s += n;
            Some((w, mask))
        })
    }

    /// (word, mask) of sectors `[lo, hi)` of `slot` when a slot fits in one word.
    #[inline]
    fn single(&self, slot: u32, (lo, hi): SectorRange) -> (usize, u64) {
        let (w, sh) = self.pos(slot, lo);
        let n = hi - lo;
        let mask = if n >= 64 { u64::MAX } else { ((1u64 << n) - 1) << sh };
        (w, mask)
    }

    /// Sets sectors `r` of `slot`.
    #[inline]
    pub fn set(&mut self, slot: u32, r: SectorRange) {
        if self.sectors <= 64 {
            let (w, m) = self.single(slot, r);
            self.words[w] |= m;
            return;
        }
        for (w, m) in self.pieces(slot, r) {
            self.words[w] |= m;
        }
    }

    /// Clears sectors `r` of `slot`.
    #[inline]
    pub fn clear(&mut self, slot: u32, r: SectorRange) {
        if self.sectors <= 64 {
            let (w, m) = self.single(slot, r);
            self.words[w] &= !m;
            return;
        }
        for (w, m) in self.pieces(slot, r) {
            self.words[w] &= !m;
        }
    }

    /// Clears every sector of `slot`.
    #[inline]
    pub fn clear_all(&mut self, slot: u32) {
        self.clear(slot, (0, self.sectors));
    }

    /// Whether every sector of `r` is set.
    #[inline]
    pub fn all(&self, slot: u32, r: SectorRange) -> bool {
        if self.sectors <= 64 {
            let (w, m) = self.single(slot, r);
            return self.words[w] & m == m;
        }
        self.pieces(slot, r).all(|(w, m)| self.words[w] & m == m)
    }

    /// Whether any sector of `r` is set.
    #[inline]
    pub fn any(&self, slot: u32, r: SectorRange) -> bool {
        if self.sectors <= 64 {
            let (w, m) = self.single(slot, r);
            return self.words[w] & m != 0;
        }
        self.pieces(slot, r).any(|(w, m)| self.words[w] & m != 0)
    }

    /// Whether sector `s` of `slot` is set.
    #[inline]
    pub fn get(&self, slot: u32, s: u32) -> bool {
        let (w, sh) = self.pos(slot, s);
        self.words[w] >> sh & 1 == 1
    }

    /// Maximal runs within `r` whose bits equal `value`, in order.
    pub fn runs(&self, slot: u32, (lo, hi): SectorRange, value: bool, out: &mut Vec<SectorRange>) {
        out.clear();
        if self.sectors <= 64 {
            // One word holds the whole slot: find runs with bit tricks.
            let (w, sh) = self.pos(slot, 0);
            let all = if self.sectors == 64 { u64::MAX } else { (1u64 << self.sectors) - 1 };
            let mut bits = (self.words[w] >> sh) & all;
            if !value {
                bits = !bits & all;
            }
            let range = if hi - lo == 64 { u64::MAX } else { ((1u64 << (hi - lo)) - 1) << lo };
            let mut m = bits & range;
            while m != 0 {
                let start = m.trailing_zeros();
                let len = (!(m >> start)).trailing_zeros();
                out.push((start, start + len));
                m &= if start + len >= 64 { 0 } else { u64::MAX << (start + len) };
            }
            return;
        }
        let mut s = lo;
        while s < hi {
            while s < hi && self.get(slot, s) != value {
                s += 1;
            }
            let start = s;
            while s < hi && self.get(slot, s) == value {
                s += 1;
            }
            if s > start {
                out.push((start, s));
            }
        }
    }

    /// The first slot at or after `from` (below `slots`) with any sector set, skipping
    /// all-zero words (a slot of 8 sectors: 8 slots per word looked at).
    pub fn next_set_slot(&self, from: u32, slots: u32) -> Option<u32> {
        if from >= slots {
            return None;
        }
        if self.sectors >= 64 {
            return (from..slots).find(|&s| {
                self.words[s as usize * self.words_per_slot..(s as usize + 1) * self.words_per_slot]
                    .iter()
                    .any(|&w| w != 0)
            });
        }
        let start = from as u64 * self.sectors as u64;
        let mut w = (start / 64) as usize;
        let mut word = self.words.get(w)? & (u64::MAX << (start % 64));
        loop {
            if word != 0 {
                let slot = ((w as u64 * 64 + word.trailing_zeros() as u64) / self.sectors as u64) as u32;
                return (slot < slots).then_some(slot);
            }
            w += 1;
            word = *self.words.get(w)?;
        }
    }

    /// Bytes of memory held.
    pub fn memory_bytes(&self) -> usize {
        self.words.capacity() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cut inside a shared word clears the cut slots' bits: grown back, they are empty;
    /// the slots before the cut keep theirs (and whole-word blocks alike).
    #[test]
    fn resizing_keeps_the_slots_below_and_empties_the_ones_cut() {
        for sectors in [8, 128] {
            let mut b = SectorBits::new(16, sectors);
            for slot in 0..16 {
                b.set(slot, (0, sectors));
            }
            b.resize(13);
            b.resize(20);
            for slot in 0..20 {
                assert_eq!(b.all(slot, (0, sectors)), slot < 13, "{sectors} sectors, slot {slot}");
                assert_eq!(b.any(slot, (0, sectors)), slot < 13, "{sectors} sectors, slot {slot}");
            }
        }
    }
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn matches_a_bool_vector(sectors_log in 0u32..9, ops in prop::collection::vec((0u32..6, any::<bool>(), 0u32..256, 0u32..256), 1..60)) {
            let sectors = 1u32 << sectors_log;
            let slots = 6;
            let mut bits = SectorBits::new(slots, sectors);
            let mut model = vec![vec![false; sectors as usize]; slots];
            let mut runs = Vec::new();
            for (slot, set, a, b) in ops {
                let (lo, hi) = ((a % sectors).min(b % sectors), (a % sectors).max(b % sectors) + 1);
                if set { bits.set(slot, (lo, hi)) } else { bits.clear(slot, (lo, hi)) }
                for s in lo..hi { model[slot as usize][s as usize] = set; }
                for (i, m) in model.iter().enumerate() {
                    for s in 0..sectors { prop_assert_eq!(bits.get(i as u32, s), m[s as usize]); }
                    prop_assert_eq!(bits.all(i as u32, (0, sectors)), m.iter().all(|&x| x));
                    prop_assert_eq!(bits.any(i as u32, (0, sectors)), m.iter().any(|&x| x));
                }
                for from in 0..=slots as u32 {
                    let naive = (from..slots as u32).find(|&i| model[i as usize].iter().any(|&x| x));
                    prop_assert_eq!(bits.next_set_slot(from, slots as u32), naive);
                }
                bits.runs(slot, (0, sectors), true, &mut runs);
                let covered: usize = runs.iter().map(|(l, h)| (h - l) as usize).sum();
                prop_assert_eq!(covered, model[slot as usize].iter().filter(|&&x| x).count());
            }
        }
    }
}
