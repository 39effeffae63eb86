//! One cache node of the simulator: the engine on its asynchronous face (the one the
//! daemon runs) and the device models its ops run on (the cache SSD, one backing device
//! per VM or one shared), with the metrics of what ran. The replay loop (`simulator.rs`)
//! submits requests and commands and moves virtual time forward through
//! [`Node::advance_to`]; a cluster simulator instantiates one node per host.
//!
//! Timing: an op handed out at time t starts on its device's queueing model at t and
//! completes when the model says; its completion goes back to the engine at that time,
//! which hands out the next phase, replies, or dispatches a request that waited for the
//! block (a read of a block being filled waits for the fill, as in the daemon). A
//! request completes at its reply. In persistent mode (the daemon's, `cache.persistent`)
//! the engine's commits are writes of their records to the cache SSD, so the durable
//! reserve of free slots, intent commits and slots in limbo shape the run as they do live.

use crate::device::{Device, SharedDevice};
use crate::inputs::SimError;
use crate::metrics::Metrics;
use crate::prewarming::Prewarming;
use crate::scenario::{BackingLayout, DevicesSection};
use cachevisor_engine::cache_settings::Writeback;
use cachevisor_engine::data_model::DataModel;
use cachevisor_engine::{DeviceOp, Engine, EngineConfig, Event, Location, OpHandle, Output, ReqId, Schedule};
use cachevisor_trace::{Request, VmId};
use rustc_hash::FxHashMap as HashMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Journal bytes per slot record in a modelled commit (slot, block, two sector bitmaps).
const RECORD_BYTES: u64 = 32;

/// What completes at a time in the node's queue: an op, or a commit of an epoch. At equal
/// times ops run first, in issue order (op ids grow as ops are handed out).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Completion {
    Op(OpHandle),
    Commit(u64),
}

/// A client request in flight.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    vm: VmId,
    write: bool,
    issued: u64,
    tag: u64,
}

/// A cache node: engine, devices, metrics, and what is in flight.
pub(crate) struct Node {
    pub(crate) engine: Engine,
    /// Its cache SSD (shared: in a cluster, borrowers' remote ops queue on it too): its
    /// first cache device, where commits go.
    pub(crate) ssd: SharedDevice,
    /// Its other cache devices (`devices.ssd_count`), store `i` on `more_ssds[i - 1]`.
    pub(crate) more_ssds: Vec<SharedDevice>,
    /// The RAM tier's model (`devices.ram`), when there is one.
    pub(crate) ram: Option<Device>,
    /// One device per row of the engine's store table (`store_devices.rs`): a cache
    /// op runs on its store's.
    stores: Vec<Box<dyn cachevisor_engine::Device>>,
    /// Backing devices: one per VM, or one shared (`BackingLayout`).
    pub(crate) backing: Vec<Device>,
    pub(crate) metrics: Metrics,
    layout: BackingLayout,
    backing_spec: crate::device::DeviceSpec,
    /// Ops and commits in flight by completion time, then [`Completion`] order.
    pending: BinaryHeap<Reverse<(u64, Completion)>>,
    requests: HashMap<ReqId, InFlight>,
    /// Requests completed since the replay loop last took them: (tag, time).
    done: Vec<(u64, u64)>,
    /// The node's clock: the latest time anything happened.
    now: u64,
    /// Client requests in flight per VM (a VM's disk is busy while it has some).
    vm_busy: Vec<u32>,
    /// Prewarming after a failover, if this node does it.
    pub(crate) prewarm: Option<Prewarming>,
    /// Latencies of client requests completed in a span of virtual time (after a
    /// failover: the first minute), when asked for.
    pub(crate) span_latency: Option<(u64, u64, hdrhistogram::Histogram<u64>)>,
    /// The latest completion of a client request.
    last_done: u64,
    /// Instant Migration's bulk copies (cluster mode).
    pub(crate) copies: crate::instant_copies::InstantCopies,
    /// The data check, when on: every op executed on a versioned model of the devices
    /// when it completes, every reply checked (`cachevisor_engine::data_model`).
    pub(crate) data: Option<DataCheck>,
    /// The cache model (`model_choice.rs`): requests and commands on the engine's
    /// synchronous face, their ops counted and never run on a device.
    cache_only: bool,
    /// The cache model's output, reused (a field of its own: moving an `Option<Output>`
    /// out and back per request cost 6% of a cache-model run in store-forwarding stalls).
    cache_out: Output,
    /// The engine's timers: the controller interval and the flusher.
    schedule: Schedule,
    /// The engine's interval events not yet handed to the replay loop
    /// ([`Self::take_ticks`]): sampling points and interval ends, in order.
    ticks: Vec<Event>,
}

/// A node's data check: the model, the ops in flight by id, the first error found.
#[derive(Debug, Clone)]
pub(crate) struct DataCheck {
    pub(crate) model: DataModel,
    ops: HashMap<u64, DeviceOp>,
    pub(crate) error: Option<String>,
}

impl DataCheck {
    pub(crate) fn new(cfg: EngineConfig) -> Self {
        DataCheck { model: DataModel::new(cfg), ops: HashMap::default(), error: None }
    }

    fn fail(&mut self, r: Result<(), String>) {
        if let (Err(e), None) = (r, &self.error) {
            self.error = Some(e);
        }
    }
}

impl Node {
    /// A node with an engine of `cfg` on the devices `devices` describes; `persistent`:
    /// the daemon's crash-consistent mode with `reserve` durable free slots;
    /// `writeback`: write-back ahead of eviction and the background flusher, as the
    /// daemon runs them (the engine's timers, from virtual time 0).
    pub(crate) fn new(
        cfg: EngineConfig,
        devices: &DevicesSection,
        persistent: Option<u64>,
        writeback: &Writeback,
    ) -> Result<Node, SimError> {
        let block_size = cfg.block_size;
        let n = devices.ssd_count.max(1);
        let cfg = if n > 1 {
            if !cfg.stores.is_empty() {
                return Err(SimError::Scenario(
                    "devices.ssd_count: several cache devices on a cluster node are not modelled yet".into(),
                ));
            }
            let split = EngineConfig::equal_split(cfg.slots, u64::from(n));
            cfg.over_devices(&split)
        } else {
            cfg
        };
        let local_stores = 1 + cfg.stores.iter().filter(|s| s.kind.is_local()).count() as u16;
        let mut engine = Engine::new(cfg).map_err(SimError::Scenario)?;
        engine.set_writeback_ahead(writeback.writeback_ahead);
        let schedule = Schedule { flusher: writeback.flusher(block_size), ..Default::default() };
        engine.set_schedule(0, schedule);
        if let Some(reserve) = persistent {
            engine.set_persistent(reserve);
        }
        if devices.mirrors().map_err(SimError::Scenario)? {
            engine.set_mirror_dirty(true).map_err(|e| SimError::Scenario(format!("devices.mirror_dirty: {e}")))?;
        }
        let ram_blocks = devices.ram_blocks(block_size, engine.layout().total()).map_err(SimError::Scenario)?;
        engine.set_ram_tier(ram_blocks, devices.ram_fill);
        let ram = if ram_blocks > 0 {
            let spec =
                devices.ram_device.resolve().map_err(|e| SimError::Scenario(format!("devices.ram_device: {e}")))?;
            Some(Device::new(spec))
        } else {
            None
        };
        let spec = devices.ssd.resolve().map_err(SimError::Scenario)?;
        let ssds: Vec<SharedDevice> =
            (0..n).map(|_| std::rc::Rc::new(std::cell::RefCell::new(Device::new(spec.clone())))).collect();
        Ok(Node {
            stores: crate::store_devices::store_devices(engine.layout(), block_size, &ssds, &[], None),
            engine,
            ssd: ssds[0].clone(),
            more_ssds: ssds[1..].to_vec(),
            ram,
            backing: Vec::new(),
            metrics: Metrics { local_stores, ..Default::default() },
            layout: devices.backing_layout,
            backing_spec: devices.backing.resolve().map_err(SimError::Scenario)?,
            pending: BinaryHeap::new(),
            requests: HashMap::default(),
            done: Vec::new(),
            now: 0,
            last_done: 0,
            copies: Default::default(),
            data: None,
            vm_busy: Vec::new(),
            prewarm: None,
            span_latency: None,
            cache_only: false,
            cache_out: Output::default(),
            schedule,
            ticks: Vec::new(),
        })
    }

    /// Runs the node as the cache model: every request and command completes when it is
    /// submitted, on the engine's synchronous face; no device, no latency, and of the
    /// engine's timers only the controller's interval.
    pub(crate) fn set_cache_only(&mut self) {
        self.cache_only = true;
        self.apply_schedule(self.now);
    }

    /// The cache model's request: its outcome and its ops' bytes counted, done at `now`.
    /// No completion is handed back ([`Self::take_done`]): the cache model replays in
    /// trace order and nothing waits for one (`replay_in_order`).
    #[inline]
    fn access(&mut self, now: u64, req: &Request) {
        let out = &mut self.cache_out;
        self.engine.access(now, req, out);
        for op in &out.ops {
            self.metrics.op(op);
        }
        self.metrics.outcome(req.vm, req.op.is_write(), &out.blocks);
        self.last_done = self.last_done.max(now);
        // A request-length interval's points (no other event comes from an access).
        while let Some(ev) = self.engine.poll_event() {
            self.ticks.push(ev);
        }
    }

    /// Sets the controller's interval from `start` (virtual time): `length_ns` long, or
    /// `requests` requests long when given, with `samples` sampling points; the engine
    /// emits its events ([`Self::take_ticks`]). The cache model runs no flusher.
    pub(crate) fn set_interval(&mut self, start: u64, length_ns: u64, requests: Option<u64>, samples: u32) {
        self.schedule.interval_ns = if requests.is_some() { 0 } else { length_ns };
        self.schedule.interval_requests = requests.unwrap_or(0);
        self.schedule.samples = samples;
        self.apply_schedule(start);
    }

    fn apply_schedule(&mut self, start: u64) {
        let mut s = self.schedule;
        if self.cache_only {
            s.flusher = None;
        }
        self.engine.set_schedule(start, s);
    }

    /// The engine's interval events since the last call (sampling points, interval ends),
    /// in order.
    pub(crate) fn take_ticks(&mut self) -> std::vec::Drain<'_, Event> {
        self.ticks.drain(..)
    }

    /// Whether interval events wait for the replay loop.
    pub(crate) fn has_ticks(&self) -> bool {
        !self.ticks.is_empty()
    }

    /// Adds VM `vm` (the next id): its backing device (per-VM layout) and partition.
    pub(crate) fn add_vm(&mut self, vm: VmId) -> Result<(), SimError> {
        if self.layout == BackingLayout::PerVm || self.backing.is_empty() {
            self.backing.push(Device::new(self.backing_spec.clone()));
        }
        self.engine.ensure_vm(vm);
        Ok(())
    }

    /// Submits `req` at `now` (after everything due before it ran: [`Self::advance_to`]);
    /// its completion comes back from [`Self::take_done`] with `tag`.
    pub(crate) fn submit(&mut self, now: u64, req: &Request, tag: u64) {
        self.now = self.now.max(now);
        self.metrics.issued(req.vm);
        if self.cache_only {
            self.access(self.now, req);
            return;
        }
        if self.vm_busy.len() <= req.vm as usize {
            self.vm_busy.resize(req.vm as usize + 1, 0);
        }
        self.vm_busy[req.vm as usize] += 1;
        let id = self.engine.submit(self.now, req);
        if let Some(d) = self.data.as_mut() {
            d.model.submitted(id, *req);
        }
        self.requests.insert(id, InFlight { vm: req.vm, write: req.op.is_write(), issued: self.now, tag });
        self.pump();
    }

    /// Runs an engine command at `now` as a background job (its ops queue on the devices
    /// like the daemon's; slots with ops in flight are skipped by every command).
    pub(crate) fn command(&mut self, now: u64, f: impl FnOnce(&mut Engine, &mut Output)) {
        self.now = self.now.max(now);
        if self.cache_only {
            let out = &mut self.cache_out;
            out.clear();
            self.engine.set_clock(self.now);
            f(&mut self.engine, out);
            for op in &out.ops {
                self.metrics.op(op);
            }
            return;
        }
        self.engine.submit_job(f);
        self.pump();
    }

    /// Hands out at `now` what the engine has ready (background work a driver just
    /// allowed, such as the next bulk copies of a migration).
    pub(crate) fn kick(&mut self, now: u64) {
        self.now = self.now.max(now);
        self.pump();
    }

    /// When the next thing in flight completes or an engine timer fires, if anything is
    /// pending.
    pub(crate) fn next_time(&self) -> Option<u64> {
        if self.cache_only {
            return self.engine.poll_timeout(); // nothing in flight: the interval alone
        }
        let op = self.pending.peek().map(|Reverse((t, _))| *t);
        earliest(op, self.timer_due())
    }

    /// The next engine timer or prewarm read due, if any. (Called for every event the
    /// replay runs: plain matches, no iterator; the array-iterator form cost 5% of a
    /// simulation once the flusher's timer was always set.)
    fn timer_due(&self) -> Option<u64> {
        let engine = self.engine.poll_timeout();
        match &self.prewarm {
            None => engine,
            Some(p) => earliest(engine, p.due(self.now, &self.vm_busy)),
        }
    }

    /// Runs every completion and timer due at or before `t`, in time order; stops early
    /// once the engine emitted interval events, for the replay loop to take first
    /// ([`Self::has_ticks`]).
    pub(crate) fn advance_to(&mut self, t: u64) {
        while let Some(next) = self.next_time() {
            if next > t || self.has_ticks() {
                break;
            }
            self.step();
        }
    }

    /// Runs every op and commit still in flight to its end (the end of a replay); engine
    /// timers are not run here, so a periodic one (a flusher) cannot keep it going.
    pub(crate) fn drain(&mut self) {
        while let Some(Reverse((t, c))) = self.pending.pop() {
            self.complete(t, c);
        }
    }

    /// The next completion or timer.
    fn step(&mut self) {
        let op = self.pending.peek().map(|Reverse((t, _))| *t);
        let timer = self.timer_due();
        match (op, timer) {
            (Some(a), Some(b)) if b < a => self.timer(b),
            (None, Some(b)) => self.timer(b),
            _ => {
                let Reverse((t, c)) = self.pending.pop().expect("a completion is pending");
                self.complete(t, c);
            }
        }
    }

    fn timer(&mut self, t: u64) {
        self.now = self.now.max(t);
        self.engine.handle_timeout(self.now);
        self.pump(); // prewarm reads due go out at its end
    }

    fn complete(&mut self, t: u64, c: Completion) {
        self.now = self.now.max(t);
        match c {
            Completion::Op(h) => {
                if let Some(d) = self.data.as_mut() {
                    let op = d.ops.remove(&h.id).expect("an op in flight");
                    let r = d.model.execute(&op, false, 0);
                    d.fail(r);
                }
                self.engine.handle_completion(self.now, h, Ok(()))
            }
            Completion::Commit(epoch) => self.engine.handle_commit(self.now, epoch, Ok(())),
        }
        self.pump();
    }

    /// Moves the requests completed since the last call, (tag, completion time), to `into`.
    pub(crate) fn take_done(&mut self, into: &mut Vec<(u64, u64)>) {
        into.append(&mut self.done);
    }

    /// Takes over the completions `old` (a failed node, drained) has not handed out, with
    /// times no earlier than `now` (a request in flight at a failover ends there).
    pub(crate) fn take_done_from(&mut self, old: &mut Node, now: u64) {
        self.done.extend(old.done.drain(..).map(|(tag, t)| (tag, t.max(now))));
        self.now = self.now.max(now);
    }

    /// Client requests submitted and not yet completed.
    pub(crate) fn requests_in_flight(&self) -> usize {
        self.requests.len()
    }

    /// The latest completion of a client request so far.
    pub(crate) fn last_done(&self) -> u64 {
        self.last_done
    }

    /// Hands the engine's ops to the devices, its commits to the SSD, and takes its events.
    fn pump(&mut self) {
        loop {
            let mut progressed = false;
            while let Some(op) = self.engine.poll_op() {
                progressed = true;
                self.metrics.op(&op);
                if let Some(d) = self.data.as_mut() {
                    d.ops.insert(op.id, op);
                }
                let at = self.run_op(&op);
                self.pending.push(Reverse((at, Completion::Op(op.handle()))));
            }
            if let Some(c) = self.engine.poll_commit() {
                progressed = true;
                let bytes = (c.records.len() as u64 * RECORD_BYTES).max(4096);
                let at = self.ssd.borrow_mut().submit(self.now, true, 0, bytes as u32);
                self.pending.push(Reverse((at, Completion::Commit(c.epoch))));
            }
            while let Some(ev) = self.engine.poll_event() {
                if let Some(d) = self.data.as_mut() {
                    let r = d.model.event(&ev);
                    d.fail(r);
                }
                match ev {
                    Event::Reply { req, blocks, .. } => {
                        let Some(r) = self.requests.remove(&req) else { continue };
                        self.vm_busy[r.vm as usize] -= 1;
                        self.metrics.request(r.vm, r.write, &blocks, self.now - r.issued);
                        if let Some((from, to, h)) = self.span_latency.as_mut() {
                            if (*from..*to).contains(&self.now) {
                                h.saturating_record((self.now - r.issued).max(1));
                            }
                        }
                        self.engine.recycle(blocks);
                        self.done.push((r.tag, self.now));
                        self.last_done = self.last_done.max(self.now);
                    }
                    Event::Retired { req, failed } => {
                        if let Some(p) = self.prewarm.as_mut() {
                            p.retired(self.now, req, failed);
                        }
                        self.copies.retired(req);
                    }
                    tick @ (Event::Interval { .. } | Event::Sample { .. }) => self.ticks.push(tick),
                }
            }
            if !progressed {
                // Prewarm reads pacing allows now (their ops go round the loop).
                let issued = match self.prewarm.as_mut() {
                    Some(p) => p.issue(self.now, &mut self.engine, &self.vm_busy),
                    None => false,
                } | self.copies.issue(&mut self.engine);
                if !issued {
                    return;
                }
            }
        }
    }

    /// Puts the node on its cluster's devices: its SSD `ssd`, the other nodes' SSDs by
    /// node id (its lenders) and its network link, which every op on a lent region
    /// crosses before the lender's SSD serves it.
    pub(crate) fn attach(&mut self, ssd: SharedDevice, peers: &[Option<SharedDevice>], nic: SharedDevice) {
        let block = self.engine.config().block_size;
        self.stores = crate::store_devices::store_devices(
            self.engine.layout(),
            block,
            std::slice::from_ref(&ssd),
            peers,
            Some(&nic),
        );
        self.ssd = ssd;
    }

    /// Starts `op` on its device now; returns its completion time. A cache op runs on
    /// its store's device (`store_devices.rs`).
    fn run_op(&mut self, op: &DeviceOp) -> u64 {
        let (now, write) = (self.now, op.kind.is_write());
        match op.loc {
            Location::Cache(st) => {
                let at = self.engine.layout().offset(op);
                let io = cachevisor_engine::Io::Model { write, len: op.len };
                match self.stores[st as usize].submit(now, at, io) {
                    Ok(done) => done,
                    Err(e) => panic!("the simulation's store {st}: {e}"),
                }
            }
            Location::Ram => {
                let ram = self.ram.as_mut().expect("a RAM op with a RAM tier");
                ram.submit(now, write, op.ram_offset(self.engine.config().block_size), op.len)
            }
            Location::Backing(_) => {
                let dev = if self.layout == BackingLayout::PerVm {
                    &mut self.backing[op.vm as usize]
                } else {
                    &mut self.backing[0]
                };
                let addr = if self.layout == BackingLayout::PerVm {
                    op.disk_addr
                } else {
                    op.disk_addr.wrapping_add((op.vm as u64) << 40)
                };
                dev.submit(now, write, addr, op.len)
            }
        }
    }
}

/// The earlier of two optional times.
#[inline]
fn earliest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
