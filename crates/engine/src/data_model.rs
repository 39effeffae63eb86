//! A versioned model of what the devices hold, for checking a driver and the engine
//! together: every sector carries (vm, disk sector, version of the client write that
//! produced it). A driver reports each request it submits, executes each device op on
//! the model when the op completes (in whatever order its devices complete them), and
//! passes every engine event. Checked: the cache stores never serve a sector of another
//! block (nor does the RAM tier); a staged write writes what its source read returned (a
//! fill, a write-back, a move between cache stores, a RAM copy); a read's reply holds, for each sector, the last
//! acknowledged write's version (or one of the failed writes after it, whose data is
//! undefined); after a final flush the backing stores hold every acknowledged write.
//!
//! Used by the engine's out-of-order property test and by the simulator's data check
//! (ELICA's coherency check across migrations, Table 5). Hand-written: the model is the
//! specification of the device-operation contract, not something a library provides.

use crate::config::EngineConfig;
use crate::inflight::{Event, ReqId};
use crate::output::{DeviceOp, Location, OpId};
use cachevisor_trace::{Op, Request, VmId};
use std::collections::{BTreeSet, HashMap};

/// One sector's data: (vm, disk sector, version).
pub type Tag = (VmId, u64, u64);

/// In an allowed set: any version (the sector was discarded; its contents are undefined).
pub const ANY: u64 = u64::MAX;

/// The model (see the top comment).
#[derive(Debug, Clone)]
pub struct DataModel {
    layout: crate::stores::StoreLayout,
    /// Cache sectors by store (local, or a lender's region) and sector there.
    ssd: HashMap<(Location, u64), Tag>,
    backing: HashMap<(VmId, u64), u64>,
    /// Per disk sector: the versions a read may return.
    allowed: HashMap<(VmId, u64), BTreeSet<u64>>,
    /// Bytes each read op returned, with its request, kept until that retires.
    bufs: HashMap<OpId, (ReqId, Vec<Tag>)>,
    /// The read ops of each request or job with a buffer in `bufs`.
    bufs_of: HashMap<ReqId, Vec<OpId>>,
    /// Request → (request, version for writes, per-sector data its client reads returned).
    reqs: HashMap<ReqId, (Request, u64, HashMap<u64, u64>)>,
    /// Discards in flight.
    discards: HashMap<ReqId, Request>,
    version: u64,
    /// Sectors of read replies checked so far.
    pub sectors_checked: u64,
    /// Local-store slots lent out of the engine (`Engine::withhold`): someone else's bytes
    /// now, which no engine op may touch.
    lent: BTreeSet<u32>,
    block_size: u64,
}

impl DataModel {
    /// An empty model of the devices of an engine built with `cfg` (every backing sector
    /// at version 0).
    pub fn new(cfg: EngineConfig) -> Self {
        DataModel {
            layout: cfg.layout(),
            ssd: HashMap::new(),
            backing: HashMap::new(),
            allowed: HashMap::new(),
            bufs: HashMap::new(),
            bufs_of: HashMap::new(),
            reqs: HashMap::new(),
            discards: HashMap::new(),
            version: 0,
            sectors_checked: 0,
            lent: BTreeSet::new(),
            block_size: cfg.block_size,
        }
    }

    /// Local-store slot `slot` is lent out (the engine said it is withheld and empty): its
    /// new user overwrites it with bytes of no VM's, and an engine op on it from now on is
    /// an error.
    pub fn lend(&mut self, slot: u32) {
        self.lent.insert(slot);
        let spb = self.block_size / 512;
        let (st, index) = self.layout.index_of(slot);
        for i in 0..spb {
            self.ssd.insert((Location::Cache(st), index * spb + i), (VmId::MAX, u64::from(slot), 0));
        }
    }

    /// The engine's store table grew (a cache device added: `Engine::add_device`): the
    /// model's devices are laid out as `layout` from now on (the new device holds bytes of
    /// no VM's).
    pub fn relayout(&mut self, layout: crate::stores::StoreLayout) {
        self.layout = layout;
    }

    /// Slot `slot` is the engine's again (its bytes stay the other user's).
    pub fn unlend(&mut self, slot: u32) {
        self.lent.remove(&slot);
    }

    /// The versions a read of `vm`'s disk sector may return.
    pub fn allowed(&self, vm: VmId, sector: u64) -> BTreeSet<u64> {
        self.allowed.get(&(vm, sector)).cloned().unwrap_or_else(|| [0].into())
    }

    /// Request `id` (`req`) was submitted; a write gets the next version.
    pub fn submitted(&mut self, id: ReqId, req: Request) {
        let v = if req.op == Op::Write {
            self.version += 1;
            self.version
        } else {
            0
        };
        self.reqs.insert(id, (req, v, HashMap::new()));
    }

    /// Discard `id` of `req`'s range was submitted.
    pub fn discard_submitted(&mut self, id: ReqId, req: Request) {
        self.discards.insert(id, req);
    }

    /// Runs `op` on the model devices; a failed op does nothing, or, for a write, writes
    /// its first `torn` sectors. An error names what the engine got wrong.
    pub fn execute(&mut self, op: &DeviceOp, fail: bool, torn: u64) -> Result<(), String> {
        let n = op.len.div_ceil(512) as u64;
        let d0 = op.disk_addr / 512;
        if op.kind.is_ssd() && op.loc != Location::Cache(self.layout.store_of(op.slot)) {
            return Err(format!("{op:?}: slot {} is in store {}", op.slot, self.layout.store_of(op.slot)));
        }
        if op.kind.is_ram() != (op.loc == Location::Ram) {
            return Err(format!("{op:?}: a RAM-tier op is one on the RAM tier"));
        }
        // Cache sectors: a store's, or the RAM tier's (a copy of a store's).
        let cached = op.kind.is_ssd() || op.kind.is_ram();
        let s0 = if op.kind.is_ssd() {
            self.layout.offset(op) / 512
        } else if op.kind.is_ram() {
            op.ram_offset(self.block_size) / 512
        } else {
            0
        };
        if op.kind.is_ssd() && self.lent.contains(&op.slot) {
            return Err(format!("{op:?}: slot {} is lent out of the cache", op.slot));
        }
        let req = op.req;
        if !op.kind.is_write() {
            if fail {
                return Ok(());
            }
            let mut got = Vec::new();
            for i in 0..n {
                let key = (op.vm, d0 + i);
                let tag = if cached {
                    let t = *self
                        .ssd
                        .get(&(op.loc, s0 + i))
                        .ok_or_else(|| format!("{op:?} reads a never-written cache sector"))?;
                    if (t.0, t.1) != key {
                        return Err(format!("{op:?}: cache sector holds vm {} sector {}, not {key:?}", t.0, t.1));
                    }
                    t
                } else {
                    (op.vm, d0 + i, self.backing.get(&key).copied().unwrap_or(0))
                };
                got.push(tag);
            }
            if op.client {
                let (r, _, data) =
                    self.reqs.get_mut(&req).ok_or_else(|| format!("{op:?}: client data for no request"))?;
                for t in &got {
                    if t.0 == r.vm && (r.offset / 512..r.end().div_ceil(512)).contains(&t.1) {
                        data.insert(t.1, t.2);
                    }
                }
            }
            self.bufs.insert(op.id, (op.req, got));
            self.bufs_of.entry(op.req).or_default().push(op.id);
            return Ok(());
        }
        let count = if fail { torn.min(n) } else { n };
        for i in 0..count {
            let key = (op.vm, d0 + i);
            let v = if op.staged {
                let src = op.source_id().ok_or_else(|| format!("{op:?}: a staged write without a source"))?;
                let buf = self.bufs.get(&src).ok_or_else(|| format!("{op:?}: source {src} never read (or failed)"))?;
                let t =
                    buf.1.iter().find(|t| (t.0, t.1) == key).ok_or_else(|| format!("{op:?}: source lacks {key:?}"))?;
                t.2
            } else {
                let (r, v, _) = self.reqs.get(&req).ok_or_else(|| format!("{op:?}: client data for no request"))?;
                if !op.client || r.vm != op.vm || !(r.offset / 512..r.end().div_ceil(512)).contains(&key.1) {
                    return Err(format!("{op:?} writes sector {key:?} with no data source"));
                }
                *v
            };
            if cached {
                self.ssd.insert((op.loc, s0 + i), (op.vm, key.1, v));
            } else {
                self.backing.insert(key, v);
            }
        }
        Ok(())
    }

    /// An engine event: a reply is checked (a read's data) or recorded (a write's
    /// version becomes what reads may return); a retirement frees its buffers.
    pub fn event(&mut self, ev: &Event) -> Result<(), String> {
        match ev {
            Event::Reply { req, result, .. } if self.discards.contains_key(req) => {
                let r = self.discards.remove(req).expect("a discard");
                if result.is_ok() {
                    for s in r.offset / 512..r.end() / 512 {
                        self.allowed.insert((r.vm, s), [ANY].into());
                    }
                }
            }
            Event::Reply { req, result, .. } => {
                let Some((r, v, data)) = self.reqs.get(req) else { return Ok(()) };
                let (lo, hi) = (r.offset / 512, r.end().div_ceil(512));
                if r.op == Op::Write {
                    for s in lo..hi {
                        let set = self.allowed.entry((r.vm, s)).or_insert_with(|| [0].into());
                        if result.is_ok() {
                            *set = [*v].into();
                        } else {
                            set.insert(*v);
                        }
                    }
                } else if result.is_ok() {
                    for s in lo..hi {
                        let allowed = self.allowed(r.vm, s);
                        match data.get(&s) {
                            Some(got) if allowed.contains(got) || allowed.contains(&ANY) => {}
                            Some(got) => {
                                return Err(format!("req {req}: sector {s} read version {got}, allowed {allowed:?}"))
                            }
                            None => return Err(format!("req {req}: sector {s} was not read by any op")),
                        }
                    }
                    self.sectors_checked += hi - lo;
                }
            }
            Event::Interval { .. } | Event::Sample { .. } => {}
            Event::Retired { req, .. } => {
                self.reqs.remove(req);
                for id in self.bufs_of.remove(req).unwrap_or_default() {
                    self.bufs.remove(&id);
                }
            }
        }
        Ok(())
    }

    /// Disk sectors written so far (what [`Self::check_backing`] checks).
    pub fn sectors_written(&self) -> u64 {
        self.allowed.len() as u64
    }

    /// After a final flush with nothing in flight: every backing sector holds a version a
    /// read may return (so every acknowledged write reached the backing store).
    pub fn check_backing(&self) -> Result<(), String> {
        self.check_backing_except(&|_, _| false)
    }

    /// [`Self::check_backing`] but for the sectors `lost(vm, sector)` names (dirty ones a
    /// dropped cache device held: `device_failure.rs`).
    pub fn check_backing_except(&self, lost: &dyn Fn(u32, u64) -> bool) -> Result<(), String> {
        for (&(vm, s), allowed) in &self.allowed {
            if lost(vm, s) {
                continue;
            }
            let got = self.backing.get(&(vm, s)).copied().unwrap_or(0);
            if !allowed.contains(&got) && !allowed.contains(&ANY) {
                return Err(format!(
                    "backing of vm {vm} sector {s} holds version {got} after the flush, allowed {allowed:?}"
                ));
            }
        }
        Ok(())
    }
}
