//! The workload `cachevisor-guest` runs through the guest-side cache: random
//! block-aligned reads and writes where a fraction of the accesses falls in the first part
//! of each application's slice of the origin (SymFlex §5.2/§5.3's fio jobs: "80% of the
//! accesses are from the first 40GB", "the first 75% of the accesses are from first 30%
//! of the device"), and, with `verify`, a model of what was written so every read is
//! checked: each written unit holds bytes derived from its offset and its write count.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;

/// The shape of the accesses.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Origin bytes.
    pub origin: u64,
    /// Bytes per I/O (units are aligned to it).
    pub io: u64,
    /// Fraction of accesses in the hot part.
    pub hot_fraction: f64,
    /// The hot part: this fraction of each application's slice, from its start.
    pub hot_size: f64,
    /// Fraction of accesses that are writes.
    pub write_ratio: f64,
    /// Applications (each its own slice of the origin).
    pub apps: u16,
}

/// One access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// Which application.
    pub app: u16,
    /// Origin offset.
    pub offset: u64,
    /// A write (else a read).
    pub write: bool,
}

/// The generator.
#[derive(Debug)]
pub struct Workload {
    shape: Shape,
    rng: ChaCha8Rng,
    units_per_app: u64,
    next_app: u16,
}

impl Workload {
    /// A generator of `shape` from `seed`; errors name the setting that cannot work.
    pub fn new(shape: Shape, seed: u64) -> Result<Workload, String> {
        if shape.io == 0 || shape.apps == 0 {
            return Err("the I/O size and the number of applications must be above 0".into());
        }
        let units_per_app = shape.origin / shape.io / u64::from(shape.apps);
        if units_per_app == 0 {
            return Err(format!(
                "the origin ({} bytes) has no {}-byte unit for each of {} applications",
                shape.origin, shape.io, shape.apps
            ));
        }
        for (name, v) in
            [("hot fraction", shape.hot_fraction), ("hot size", shape.hot_size), ("write ratio", shape.write_ratio)]
        {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("the {name} must be between 0 and 1, not {v}"));
            }
        }
        Ok(Workload { shape, rng: ChaCha8Rng::seed_from_u64(seed), units_per_app, next_app: 0 })
    }

    /// Sets the hot part (a workload change mid-run, as Fig. 8's fourth window).
    pub fn set_hot(&mut self, hot_fraction: f64, hot_size: f64) {
        self.shape.hot_fraction = hot_fraction;
        self.shape.hot_size = hot_size;
    }

    /// The next access (applications in turn).
    pub fn next_access(&mut self) -> Access {
        let app = self.next_app;
        self.next_app = (self.next_app + 1) % self.shape.apps;
        let hot_units = ((self.units_per_app as f64 * self.shape.hot_size) as u64).clamp(1, self.units_per_app);
        let unit = if self.rng.gen_bool(self.shape.hot_fraction) || hot_units == self.units_per_app {
            self.rng.gen_range(0..hot_units)
        } else {
            self.rng.gen_range(hot_units..self.units_per_app)
        };
        let offset = (u64::from(app) * self.units_per_app + unit) * self.shape.io;
        Access { app, offset, write: self.rng.gen_bool(self.shape.write_ratio) }
    }
}

/// What each written unit must read back as.
#[derive(Debug, Default)]
pub struct Verifier {
    writes: HashMap<u64, u32>,
}

impl Verifier {
    /// The bytes of the `n`th write to the unit at `offset`.
    pub fn pattern(offset: u64, n: u32, len: usize) -> Vec<u8> {
        let mut x = offset.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(n).wrapping_mul(0xD1B5_4A32_D192_ED03);
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// The bytes of the next write to `offset`, counted.
    pub fn next_write(&mut self, offset: u64, len: usize) -> Vec<u8> {
        let n = self.writes.entry(offset).or_default();
        *n += 1;
        Self::pattern(offset, *n, len)
    }

    /// What a read of `offset` must return, when the unit was written (else the
    /// origin's own bytes are the truth).
    pub fn expected(&self, offset: u64, len: usize) -> Option<Vec<u8>> {
        self.writes.get(&offset).map(|&n| Self::pattern(offset, n, len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hot_part_takes_its_share_of_accesses_in_each_slice() {
        let shape =
            Shape { origin: 1 << 30, io: 1 << 16, hot_fraction: 0.8, hot_size: 0.4, write_ratio: 0.25, apps: 2 };
        let mut w = Workload::new(shape, 7).unwrap();
        let (mut hot, mut writes, n) = (0, 0, 20_000);
        let half = (1u64 << 30) / 2;
        for i in 0..n {
            let a = w.next_access();
            assert_eq!(a.app, (i % 2) as u16);
            let within = a.offset - u64::from(a.app) * half;
            assert!(within < half && a.offset.is_multiple_of(1 << 16));
            hot += usize::from((within as f64) < half as f64 * 0.4);
            writes += usize::from(a.write);
        }
        let (h, wr) = (hot as f64 / n as f64, writes as f64 / n as f64);
        assert!((h - 0.8).abs() < 0.02 && (wr - 0.25).abs() < 0.02, "{h} {wr}");
        assert!(Workload::new(Shape { hot_size: 1.5, ..shape }, 1).unwrap_err().contains("hot size"));
        assert!(Workload::new(Shape { origin: 1000, ..shape }, 1).unwrap_err().contains("no 65536-byte unit"));
    }

    #[test]
    fn each_write_of_a_unit_has_its_own_bytes() {
        let mut v = Verifier::default();
        assert_eq!(v.expected(0, 8), None);
        let a = v.next_write(4096, 64);
        let b = v.next_write(4096, 64);
        assert_ne!(a, b);
        assert_eq!(v.expected(4096, 64), Some(b));
        assert_ne!(Verifier::pattern(0, 1, 64), Verifier::pattern(8192, 1, 64));
    }
}
