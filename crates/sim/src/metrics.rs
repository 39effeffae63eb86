//! Counters and latency histograms per VM, and the per-window time series.

use cachevisor_engine::{BlockOutcome, DeviceOp, Location, OpKind, WritePolicy};
use hdrhistogram::Histogram;
use serde::Serialize;

/// Latency histogram range: 1 ns .. 1 hour, 3 significant digits.
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds")
}

/// Everything counted for one VM.
#[derive(Debug, Clone)]
pub struct VmStats {
    /// Requests issued.
    pub requests: u64,
    /// Read requests.
    pub reads: u64,
    /// Blocks read.
    pub read_blocks: u64,
    /// Blocks read that hit.
    pub read_hits: u64,
    /// Blocks written.
    pub write_blocks: u64,
    /// Blocks written that were resident.
    pub write_hits: u64,
    /// Blocks that bypassed the cache.
    pub bypassed: u64,
    /// Blocks inserted.
    pub inserted: u64,
    /// This VM's blocks evicted.
    pub evictions: u64,
    /// Dirty extents of this VM written back (evictions, flushes, shrinks; one per block unless its dirty sectors are scattered).
    pub writebacks: u64,
    /// Bytes read from / written to the SSD for this VM.
    pub ssd_read_bytes: u64,
    /// See `ssd_read_bytes`.
    pub ssd_write_bytes: u64,
    /// Of the SSD bytes, those read from / written to caches other nodes lent (ELICA).
    pub remote_read_bytes: u64,
    /// See `remote_read_bytes`.
    pub remote_write_bytes: u64,
    /// Cache ops moving the client's own data (hits served, writes taken), and of those
    /// the ones on lent caches: the share of cache accesses served remotely.
    pub cache_client_ops: u64,
    /// See `cache_client_ops`.
    pub cache_client_ops_remote: u64,
    /// Reads served from the RAM tier (one per block), and bytes copied into it.
    pub ram_hits: u64,
    /// See `ram_hits`.
    pub ram_write_bytes: u64,
    /// Bytes read from / written to this VM's backing store.
    pub backing_read_bytes: u64,
    /// See `backing_read_bytes`.
    pub backing_write_bytes: u64,
    /// Request latency, all / reads / writes (ns).
    pub lat: Histogram<u64>,
    /// Read latency.
    pub read_lat: Histogram<u64>,
    /// Write latency.
    pub write_lat: Histogram<u64>,
}

impl Default for VmStats {
    fn default() -> Self {
        VmStats {
            requests: 0,
            reads: 0,
            read_blocks: 0,
            read_hits: 0,
            write_blocks: 0,
            write_hits: 0,
            bypassed: 0,
            inserted: 0,
            evictions: 0,
            writebacks: 0,
            ssd_read_bytes: 0,
            ssd_write_bytes: 0,
            remote_read_bytes: 0,
            remote_write_bytes: 0,
            cache_client_ops: 0,
            cache_client_ops_remote: 0,
            ram_hits: 0,
            ram_write_bytes: 0,
            backing_read_bytes: 0,
            backing_write_bytes: 0,
            lat: histogram(),
            read_lat: histogram(),
            write_lat: histogram(),
        }
    }
}

impl VmStats {
    /// Adds `other` into `self` (for the total).
    pub fn merge(&mut self, o: &VmStats) {
        self.requests += o.requests;
        self.reads += o.reads;
        self.read_blocks += o.read_blocks;
        self.read_hits += o.read_hits;
        self.write_blocks += o.write_blocks;
        self.write_hits += o.write_hits;
        self.bypassed += o.bypassed;
        self.inserted += o.inserted;
        self.evictions += o.evictions;
        self.writebacks += o.writebacks;
        self.ssd_read_bytes += o.ssd_read_bytes;
        self.ssd_write_bytes += o.ssd_write_bytes;
        self.remote_read_bytes += o.remote_read_bytes;
        self.remote_write_bytes += o.remote_write_bytes;
        self.cache_client_ops += o.cache_client_ops;
        self.cache_client_ops_remote += o.cache_client_ops_remote;
        self.ram_hits += o.ram_hits;
        self.ram_write_bytes += o.ram_write_bytes;
        self.backing_read_bytes += o.backing_read_bytes;
        self.backing_write_bytes += o.backing_write_bytes;
        self.lat.add(&o.lat).expect("same bounds");
        self.read_lat.add(&o.read_lat).expect("same bounds");
        self.write_lat.add(&o.write_lat).expect("same bounds");
    }
}

/// Per-VM, per-run accounting.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// By VM id.
    pub vms: Vec<VmStats>,
    /// The node's own cache devices are stores `0..local_stores` (0 counts as 1); a cache
    /// op on a later store is remote (a region another node lends).
    pub local_stores: u16,
}

/// One row of the time series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowRow {
    /// Window index.
    pub window: u64,
    /// End of the window, seconds of virtual time.
    pub t_end_s: f64,
    /// VM name.
    pub vm: String,
    /// Requests issued in the window.
    pub requests: u64,
    /// Block accesses in the window.
    pub accesses: u64,
    /// Block hit ratio in the window (0 when idle).
    pub hit_ratio: f64,
    /// Blocks served from the cache per second (SymFlex's vSSD throughput).
    pub hit_throughput: f64,
    /// Slots held at the window's end.
    pub used_blocks: u64,
    /// Target at the window's end.
    pub target_blocks: u64,
    /// Dirty blocks at the window's end.
    pub dirty_blocks: u64,
    /// Block misses in the window: what reached the backing store (S-CAVE's AllocUnit).
    pub miss_blocks: u64,
    /// Smoothed rECS at the window's end (S-CAVE §IV-B sampled scan), if the VM held blocks.
    pub recs: Option<f64>,
    /// Write policy at the window's end.
    pub write_policy: WritePolicy,
}

impl Metrics {
    fn vm(&mut self, vm: u32) -> &mut VmStats {
        let v = vm as usize;
        if self.vms.len() <= v {
            self.vms.resize_with(v + 1, VmStats::default);
        }
        &mut self.vms[v]
    }

    /// Counts a request's outcome and latency (the full model).
    pub fn request(&mut self, vm: u32, write: bool, blocks: &[BlockOutcome], latency_ns: u64) {
        let s = self.outcome(vm, write, blocks);
        let lat = latency_ns.max(1);
        s.lat.saturating_record(lat);
        if write {
            s.write_lat.saturating_record(lat);
        } else {
            s.read_lat.saturating_record(lat);
        }
    }

    /// Counts a request's outcome, no latency (the cache model: `model_choice.rs`).
    pub fn outcome(&mut self, vm: u32, write: bool, blocks: &[BlockOutcome]) -> &mut VmStats {
        let s = self.vm(vm);
        s.requests += 1;
        let mut hits = 0;
        for b in blocks {
            hits += b.hit as u64;
            s.bypassed += b.bypassed as u64;
            s.inserted += b.inserted as u64;
        }
        let n = blocks.len() as u64;
        if write {
            s.write_blocks += n;
            s.write_hits += hits;
        } else {
            s.reads += 1;
            s.read_blocks += n;
            s.read_hits += hits;
        }
        for b in blocks {
            if let Some(e) = b.evicted {
                self.vm(e.vm).evictions += 1;
            }
        }
        &mut self.vms[vm as usize]
    }

    /// A request of `vm` issued (its VM exists from then on, in the results).
    pub fn issued(&mut self, vm: u32) {
        self.vm(vm);
    }

    /// Counts a device op's bytes (and write-backs), a request's or a background job's.
    pub fn op(&mut self, op: &DeviceOp) {
        let remote = matches!(op.loc, Location::Cache(st) if st >= self.local_stores.max(1));
        let s = self.vm(op.vm);
        let bytes = op.len as u64;
        if op.kind.is_ssd() {
            if remote {
                *(if op.kind.is_write() { &mut s.remote_write_bytes } else { &mut s.remote_read_bytes }) += bytes;
            }
            if op.client {
                s.cache_client_ops += 1;
                s.cache_client_ops_remote += remote as u64;
            }
        }
        match op.kind {
            OpKind::SsdRead => s.ssd_read_bytes += bytes,
            OpKind::SsdWrite => s.ssd_write_bytes += bytes,
            OpKind::RamRead => s.ram_hits += op.client as u64,
            OpKind::RamWrite => s.ram_write_bytes += bytes,
            OpKind::BackingRead => s.backing_read_bytes += bytes,
            OpKind::BackingWrite => {
                s.backing_write_bytes += bytes;
                // A staged backing write is the second half of a write-back.
                if op.staged {
                    s.writebacks += 1;
                }
            }
        }
    }
}
