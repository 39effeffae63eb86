//! Zipf-distributed single-block read traces, the speed benchmark's workload (and the
//! shape libCacheSim's own generators produce): request i reads block `rank - 1` where
//! rank ~ Zipf(blocks, alpha), at 1 µs spacing. Seeded, so byte-for-byte repeatable.

use crate::error::TraceError;
use crate::request::{Op, Request};
use crate::source::{SourceCounts, TraceSource};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Zipf};

/// A Zipf trace of one VM.
pub struct ZipfSource {
    rng: ChaCha8Rng,
    dist: Zipf<f64>,
    block: u32,
    left: u64,
    i: u64,
    names: Vec<String>,
}

impl ZipfSource {
    /// `requests` reads of `block`-byte blocks among `blocks`, skew `alpha`.
    pub fn new(requests: u64, blocks: u64, alpha: f64, block: u32, seed: u64) -> Result<Self, TraceError> {
        let dist = Zipf::new(blocks, alpha).map_err(|e| TraceError::Usage(format!("zipf: {e}")))?;
        Ok(ZipfSource {
            rng: ChaCha8Rng::seed_from_u64(seed),
            dist,
            block,
            left: requests,
            i: 0,
            names: vec![format!("zipf{alpha}")],
        })
    }
}

impl TraceSource for ZipfSource {
    fn next_request(&mut self) -> Result<Option<Request>, TraceError> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        let rank = self.dist.sample(&mut self.rng) as u64;
        let r = Request {
            time_ns: self.i * 1000,
            vm: 0,
            op: Op::Read,
            offset: (rank - 1) * self.block as u64,
            len: self.block,
        };
        self.i += 1;
        Ok(Some(r))
    }

    fn vm_names(&self) -> &[String] {
        &self.names
    }

    fn counts(&self) -> SourceCounts {
        SourceCounts { requests: self.i, ..SourceCounts::default() }
    }
}
