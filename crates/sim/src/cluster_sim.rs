//! Cluster mode of the simulator (ELICA): one cache node per `[[node]]` — its
//! engine, its SSD, its link — with VMs placed on nodes (`[[vm]] node = …`), replayed
//! open loop in one virtual time. Every window each VM's stack distances give its hit
//! curve and ideal size (Eq. 1), and the allocation of Eq. 4 (`cluster::allocation`,
//! the fast solver by default) gives each VM local and remote cache, applied as engine
//! targets and remote shares. Open loop (trace times) or closed loop (`queue_depth`
//! requests in flight per VM), as `[replay]` says. A node's engine is built with a region lent by each other
//! node (as large as that node's cache: the per-lender shares, not the region, bound
//! what is used); a remote op crosses the borrower's link and queues on the lender's SSD, so a
//! lender's own VMs feel its borrowers' load. `mode = "local"` is the baseline ELICA
//! compares with (ECI-like: each node allocates only its own cache, Eq. 4 per node).
//! Every node runs in one virtual time, one instant at a time in global order.
//!
//! Each VM's remote share is set per lender, as Eq. 4's solution splits it, so a
//! lender's SSD holds what the allocation lent from it. When an allocation moves a VM's
//! cache between stores, its blocks migrate (§3.6, `cluster_migration.rs`: Gradual or
//! Instant, rate-limited; `[cluster.migration]`). Not yet: repeated passes.

use crate::cluster_migration::ClusterMigrations;
use crate::cluster_report::result;
pub use crate::cluster_report::{
    ClusterMigrationResult, ClusterNodeStats, ClusterResult, ClusterVm, ClusterWindow, DataCheckResult,
};
use crate::cluster_scenario::{plan, Plan};
pub use crate::cluster_scenario::{
    ClusterMode, ClusterSection, MigrationChoice, MigrationSection, NodeSection, RemoteWrites,
};
use crate::device::{Device, DeviceSpec, SharedDevice};
use crate::inputs::{open_inputs, SimError};
use crate::instant_copies::InstantCopies;
use crate::node::{DataCheck, Node};
use crate::scenario::{ReplayMode, Scenario};
use cachevisor_cluster::allocation::{Allocation, Problem, VmCurve};
use cachevisor_cluster::estimate::VmEstimator;
use cachevisor_cluster::load::{choose, Chunk};
use cachevisor_cluster::model::IdealForm;
use cachevisor_cluster::ssd_sharing::Holdings;
use cachevisor_engine::{EngineConfig, PartitionMode, StoreSpec};
use cachevisor_policy::controller;
use cachevisor_policy::Decision;
use cachevisor_trace::{Request, VmId};
use std::cell::RefCell;
use std::rc::Rc;

/// A VM of the run.
pub(crate) struct Vm {
    pub(crate) node: usize,
    pub(crate) local_id: VmId,
    /// Its window's demand (Eq. 1 and Eq. 4's curve; the daemon's nodes run the same).
    est: VmEstimator,
    /// Its last allocation: local and remote blocks.
    pub(crate) alloc: (u64, u64),
    /// Its last allocation in units: local, and remote by lender (the hysteresis' last).
    last: Option<(u64, Vec<(u16, u64)>)>,
}

/// A cluster run's state.
struct Cluster<'a> {
    sc: &'a Scenario,
    p: Plan,
    nodes: Vec<Node>,
    ssds: Vec<SharedDevice>,
    links: Vec<SharedDevice>,
    vms: Vec<Vm>,
    names: Vec<String>,
    total_units: u64,
    window_end: u64,
    allocations: u64,
    solve_s: f64,
    /// Sums over allocations of the blocks allocated and of those remote.
    allocated: (f64, f64),
    /// Per VM per window (`ClusterResult::windows`).
    windows: Vec<ClusterWindow>,
    /// Each node's SSD busy time at the last window's end (its load over a window is the
    /// busy time since, per channel: ELICA-Load's queue-depth signal).
    busy_last: Vec<u64>,
    /// Completions taken from the nodes: (global VM id, time).
    done: Vec<(u64, u64)>,
    /// Migration on reallocation (§3.6), unless off.
    migrations: Option<ClusterMigrations>,
    /// The next tick (every [`TICK_NS`]): migrations progress, SSD occupancy sampled.
    next_tick: u64,
    /// Per node: blocks held on its SSD beyond its size (its VMs' local blocks and its
    /// borrowers' blocks in the regions it lent) — the most at a tick, and integrated
    /// over time (block-seconds).
    overcommit: Vec<(u64, f64)>,
}

/// How often migrations progress, lenders make room and SSD occupancy is sampled
/// (virtual time).
const TICK_NS: u64 = 100_000_000;
/// Blocks a lender gives back per tick at most (1 MiB at 4 KiB blocks: 10 MiB/s of its
/// own VMs' cache turned over for its borrowers).
const GIVE_BACK_PER_TICK: u64 = 256;
/// Of those, blocks written back first at most (the rest clean): 40 writes a second
/// spread over the lender's VMs' disks.
const GIVE_BACK_DIRTY_PER_TICK: u64 = 0;

impl<'a> Cluster<'a> {
    fn new(sc: &'a Scenario) -> Result<Self, SimError> {
        let p = plan(sc).map_err(SimError::Scenario)?;
        let n = sc.node.len();
        let total_units: u64 = p.slots.iter().map(|s| s / p.unit_blocks).sum();
        let mut ssds: Vec<SharedDevice> = Vec::new();
        let mut links: Vec<SharedDevice> = Vec::new();
        for node in &sc.node {
            let ssd = node.ssd.as_ref().unwrap_or(&sc.devices.ssd).resolve().map_err(SimError::Scenario)?;
            let link = match &node.link {
                Some(l) => l.resolve().map_err(SimError::Scenario)?,
                None => DeviceSpec::preset("remote").map_err(SimError::Scenario)?,
            };
            ssds.push(Rc::new(RefCell::new(Device::new(ssd))));
            links.push(Rc::new(RefCell::new(Device::new(link))));
        }
        let mut nodes = Vec::new();
        for i in 0..n {
            let remote = match p.cl.mode {
                ClusterMode::Elica | ClusterMode::ElicaLoad => {
                    (0..n).filter(|&k| k != i).map(|k| StoreSpec::lent(k as u16, p.slots[k])).collect()
                }
                ClusterMode::Local => Vec::new(),
            };
            let cfg = EngineConfig {
                partition: PartitionMode::Static,
                fill: sc.cache.fill,
                stores: remote,
                ..p.cache.engine_config(p.slots[i]).map_err(SimError::Scenario)?
            };
            let mut node = Node::new(cfg, &sc.devices, None, &p.cache.writeback)?;
            node.engine.set_traffic_aware(p.cl.mode != ClusterMode::ElicaLoad);
            node.engine.set_traffic_turnover(p.cl.traffic_turnover);
            node.engine.set_lent_write_through(p.cl.remote_writes == RemoteWrites::Through);
            crate::simulator::apply_cache_settings(&mut node.engine, &sc.cache)?;
            let peers: Vec<_> = (0..n).map(|k| (k != i).then(|| ssds[k].clone())).collect();
            node.attach(ssds[i].clone(), &peers, links[i].clone());
            node.copies = InstantCopies::new(p.cl.migration.batch);
            if p.cl.verify_data {
                node.data = Some(DataCheck::new(node.engine.config().clone()));
            }
            nodes.push(node);
        }
        let window_end = p.window_ns;
        let migrations = p.migration.map(|s| ClusterMigrations::new(s, p.block, n));
        Ok(Cluster {
            migrations,
            next_tick: TICK_NS,
            overcommit: vec![(0, 0.0); n],
            sc,
            p,
            nodes,
            ssds,
            links,
            vms: Vec::new(),
            names: Vec::new(),
            total_units,
            window_end,
            allocations: 0,
            solve_s: 0.0,
            allocated: (0.0, 0.0),
            windows: Vec::new(),
            busy_last: vec![0; n],
            done: Vec::new(),
        })
    }

    /// Runs every node up to `now` ([`advance`]) and every allocation due by then.
    fn advance_to(&mut self, now: u64) {
        while self.next_tick <= now {
            let t = self.next_tick;
            advance(&mut self.nodes, t, &mut self.done);
            if let Some(m) = self.migrations.as_mut() {
                m.tick(t, &mut self.nodes, &self.vms, &self.links);
            }
            self.share_lenders_ssds(t);
            self.sample_occupancy();
            self.next_tick += TICK_NS;
        }
        advance(&mut self.nodes, now, &mut self.done);
        while now >= self.window_end {
            let load: Vec<f64> = self
                .ssds
                .iter()
                .zip(self.busy_last.iter_mut())
                .map(|(d, last)| busy_fraction(d, last, self.p.window_ns))
                .collect();
            let t = std::time::Instant::now();
            allocate(&self.p, &mut self.nodes, &mut self.vms, self.window_end, self.total_units, &load);
            self.solve_s += t.elapsed().as_secs_f64();
            if let Some(m) = self.migrations.as_mut() {
                m.after_allocation(self.window_end, &mut self.nodes, &self.vms);
            }
            self.allocated.0 += self.vms.iter().map(|v| (v.alloc.0 + v.alloc.1) as f64).sum::<f64>();
            self.allocated.1 += self.vms.iter().map(|v| v.alloc.1 as f64).sum::<f64>();
            // Each node's window counters, as its engine counted them (the daemon's too).
            let counts: Vec<_> = self.nodes.iter_mut().map(|n| n.engine.take_window_counts(0)).collect();
            for (v, name) in self.vms.iter().zip(&self.names) {
                let c = counts[v.node].get(v.local_id as usize).copied().unwrap_or_default();
                let (accesses, hits) = (c.accesses, c.hits);
                self.windows.push(ClusterWindow {
                    t_end_s: self.window_end as f64 / 1e9,
                    vm: name.clone(),
                    node: self.sc.node[v.node].name.clone(),
                    accesses,
                    hit_ratio: if accesses > 0 { hits as f64 / accesses as f64 } else { 0.0 },
                    local_blocks: v.alloc.0,
                    remote_blocks: v.alloc.1,
                });
            }
            self.allocations += 1;
            self.window_end = self.window_end.saturating_add(self.p.window_ns);
        }
    }

    /// One SSD per node holds its own VMs' blocks and its borrowers' (ELICA §3.1): each
    /// tick `cluster::ssd_sharing` decides, per lender, what its own VMs above their
    /// (paced) targets give back (at most [`GIVE_BACK_PER_TICK`], clean ones), the cap on
    /// its own VMs' blocks (`Engine::set_local_limit`) and each borrower's in its region
    /// (`Engine::set_region_limit`). So the SSD holds no more than its size, but for what
    /// a tick lets through (`overcommit_*`).
    fn share_lenders_ssds(&mut self, now: u64) {
        let n = self.nodes.len();
        for k in 0..n {
            let lender = k as u16;
            let others: Vec<usize> = (0..n).filter(|&i| i != k).collect();
            let h = Holdings {
                capacity: self.p.slots[k],
                own: self.nodes[k].engine.used_local(),
                borrowers: others
                    .iter()
                    .map(|&i| {
                        (self.nodes[i].engine.used_in_region(lender), self.nodes[i].engine.region_shortfall(lender))
                    })
                    .collect(),
            };
            let back = h.wanted_back(GIVE_BACK_PER_TICK);
            if back > 0 {
                self.nodes[k].command(now, |e, out| {
                    e.give_back(back, GIVE_BACK_DIRTY_PER_TICK, out);
                });
            }
            let s = h.share(self.nodes[k].engine.used_local());
            self.nodes[k].engine.set_local_limit(s.local_limit);
            for (&i, &limit) in others.iter().zip(&s.region_limits) {
                self.nodes[i].engine.set_region_limit(lender, limit);
            }
        }
    }

    /// Each SSD's occupancy now: the node's own VMs' local blocks and its borrowers'
    /// blocks in the regions it lent them, beyond its size (the allocation keeps its own
    /// VMs' local targets plus what it lends within it, but a paced shrink gives blocks
    /// up only as others need them, so for a while both can hold the same space).
    fn sample_occupancy(&mut self) {
        for k in 0..self.nodes.len() {
            let own = self.nodes[k].engine.used_local();
            let lent: u64 =
                (0..self.nodes.len()).filter(|&i| i != k).map(|i| self.nodes[i].engine.used_in_region(k as u16)).sum();
            let over = (own + lent).saturating_sub(self.p.slots[k]);
            let o = &mut self.overcommit[k];
            o.0 = o.0.max(over);
            o.1 += over as f64 * TICK_NS as f64 / 1e9;
        }
    }

    /// Places the VMs up to `names.len()` on their nodes (the `[[vm]]` entries say where).
    fn admit(&mut self, names: &[String], now: u64) -> Result<(), SimError> {
        while self.vms.len() < names.len() {
            let name = names[self.vms.len()].clone();
            let sc = self.sc;
            let home = sc
                .vm
                .iter()
                .find(|v| v.name == name)
                .and_then(|v| v.node.as_ref())
                .and_then(|m| sc.node.iter().position(|x| x.name == *m))
                .ok_or_else(|| SimError::Scenario(format!("vm {name}: no [[vm]] entry places it on a node")))?;
            let local_id = self.nodes[home].engine.vm_count() as VmId;
            self.nodes[home].add_vm(local_id)?;
            let conf = sc.vm.iter().find(|v| v.name == name);
            crate::simulator::apply_vm_settings(&mut self.nodes[home], now, &sc.cache, conf, local_id)?;
            self.vms.push(Vm {
                node: home,
                local_id,
                est: VmEstimator::new(self.p.unit_blocks, self.total_units),
                alloc: (0, 0),
                last: None,
            });
            self.names.push(name);
            split_evenly(&mut self.nodes[home], now);
        }
        Ok(())
    }

    /// Issues `req` (global VM id) at `now` on its VM's node; its completion comes back
    /// tagged with the global id.
    /// A request outside what the cache addresses is an error naming it (`index`: its
    /// 1-based position in the trace).
    fn issue(&mut self, now: u64, req: &Request, index: u64) -> Result<(), SimError> {
        let v = &mut self.vms[req.vm as usize];
        if let Err(why) = self.nodes[v.node].engine.check_range(v.local_id, req.offset, req.len as u64) {
            let vm = self.names.get(req.vm as usize).cloned().unwrap_or_else(|| req.vm.to_string());
            return Err(SimError::OutOfRange { index, vm, why });
        }
        let block = self.p.block;
        let (first, last) = (req.offset / block, (req.end().max(req.offset + 1) - 1) / block);
        for b in first..=last {
            v.est.access(b);
        }
        let local = Request { vm: v.local_id, ..*req };
        self.nodes[v.node].submit(now, &local, req.vm as u64);
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.nodes.iter().map(|n| n.requests_in_flight()).sum()
    }

    fn next_time(&self) -> Option<u64> {
        self.nodes.iter().filter_map(|n| n.next_time()).min()
    }
}

/// Runs a cluster scenario (`[[node]]` given), open or closed loop as `[replay]` says;
/// `progress` gets requests done.
pub fn simulate_cluster(sc: &Scenario, progress: &mut dyn FnMut(u64)) -> Result<ClusterResult, SimError> {
    let mut c = Cluster::new(sc)?;
    let mut trace = open_inputs(sc)?;
    let limit = if sc.replay.max_requests == 0 { u64::MAX } else { sc.replay.max_requests };
    let mut count = 0u64;
    match sc.replay.mode {
        ReplayMode::Open => {
            while count < limit {
                let Some(req) = trace.next_request()? else { break };
                let now = (req.time_ns as f64 / sc.replay.speedup) as u64;
                c.advance_to(now);
                c.done.clear();
                c.admit(trace.vm_names(), now)?;
                c.issue(now, &req, count + 1)?;
                count += 1;
                if count.is_multiple_of(65_536) {
                    progress(count);
                }
            }
        }
        ReplayMode::Closed => {
            // Each VM's requests in order, `queue_depth` of them in flight at a time.
            let mut per_vm: Vec<std::collections::VecDeque<Request>> = Vec::new();
            while count < limit {
                let Some(req) = trace.next_request()? else { break };
                if per_vm.len() <= req.vm as usize {
                    per_vm.resize_with(req.vm as usize + 1, Default::default);
                }
                per_vm[req.vm as usize].push_back(req);
                count += 1;
            }
            c.admit(trace.vm_names(), 0)?;
            let mut ready = std::collections::BinaryHeap::new();
            for vm in 0..per_vm.len() {
                for _ in 0..sc.replay.queue_depth {
                    ready.push(std::cmp::Reverse((0u64, vm)));
                }
            }
            let mut issued = 0u64;
            loop {
                let next_ready = ready.peek().map(|r| r.0 .0);
                if let Some(t) = c.next_time().filter(|&t| next_ready.is_none_or(|r| t <= r)) {
                    if next_ready.is_none() && c.in_flight() == 0 {
                        break;
                    }
                    c.advance_to(t);
                    ready.extend(c.done.drain(..).map(|(vm, at)| std::cmp::Reverse((at, vm as usize))));
                    continue;
                }
                let Some(std::cmp::Reverse((now, vm))) = ready.pop() else { break };
                let Some(req) = per_vm[vm].pop_front() else { continue };
                c.advance_to(now);
                ready.extend(c.done.drain(..).map(|(v, at)| std::cmp::Reverse((at, v as usize))));
                c.issue(now, &req, issued + 1)?;
                issued += 1;
                if issued.is_multiple_of(65_536) {
                    progress(issued);
                }
            }
        }
    }
    for node in c.nodes.iter_mut() {
        node.drain();
    }
    let lent_dirty: u64 = c.nodes.iter().map(|n| lent_dirty_blocks(&n.engine)).sum();
    let ram_hits: Vec<u64> = c.nodes.iter().map(|n| n.engine.ram_stats().hits).collect();
    let data_check = c.p.cl.verify_data.then(|| verify_after_flush(&mut c.nodes));
    let mut r = result(sc, &c.p, &c.nodes, &c.vms, &c.names, &c.ssds, &c.links, c.allocations, c.solve_s);
    let n = c.allocations.max(1) as f64;
    (r.mean_allocated_blocks, r.mean_remote_blocks) = (c.allocated.0 / n, c.allocated.1 / n);
    r.windows = c.windows;
    for ((n, &(peak, block_s)), &hits) in r.nodes.iter_mut().zip(&c.overcommit).zip(&ram_hits) {
        (n.overcommit_peak_blocks, n.overcommit_block_s, n.ram_hits) = (peak, block_s, hits);
    }
    r.data_check = data_check;
    r.lent_dirty_blocks = lent_dirty;
    if let Some(m) = c.migrations.as_mut() {
        let end = c.nodes.iter().map(|n| n.last_done()).max().unwrap_or(0);
        r.migration = Some(ClusterMigrationResult { cost: m.cost(end), moved_blocks: m.moved_blocks() });
    }
    Ok(r)
}

/// Dirty blocks `engine` holds in the caches other nodes lent it (what a lender's loss
/// would lose).
fn lent_dirty_blocks(engine: &cachevisor_engine::Engine) -> u64 {
    let l = engine.layout();
    (1..l.len() as cachevisor_engine::StoreId)
        .flat_map(|st| {
            let (first, n) = l.range(st);
            first as u32..(first + n) as u32
        })
        .filter(|&slot| engine.slot_dirty(slot))
        .count() as u64
}

/// The data check's end (`cluster.verify_data`): each node's cache flushed (a few rounds,
/// with nothing in flight between), its engine's invariants checked, and its backing
/// stores compared with the last acknowledged writes.
fn verify_after_flush(nodes: &mut [Node]) -> DataCheckResult {
    let mut out = DataCheckResult { sectors_checked: 0, sectors_flushed: 0, errors: Vec::new() };
    for (i, node) in nodes.iter_mut().enumerate() {
        let end = node.last_done();
        for _ in 0..4 {
            let vms = node.engine.vm_count() as VmId;
            if (0..vms).all(|vm| node.engine.partition(vm).dirty_blocks == 0) {
                break;
            }
            node.command(end, |e, out| e.flush(None, out));
            node.drain();
        }
        let d = node.data.as_ref().expect("the data check is on");
        let checks = [
            d.error.clone().map_or(Ok(()), Err),
            node.engine.check_invariants(),
            d.model.check_backing(),
            if (0..node.engine.vm_count() as VmId).all(|vm| node.engine.partition(vm).dirty_blocks == 0) {
                Ok(())
            } else {
                Err("dirty blocks left after flushing".into())
            },
        ];
        if let Some(Err(e)) = checks.into_iter().find(|c| c.is_err()) {
            out.errors.push(format!("node {i}: {e}"));
        }
        out.sectors_checked += d.model.sectors_checked;
        out.sectors_flushed += d.model.sectors_written();
    }
    out
}

/// The share of the last `span_ns` a device was busy, per channel, from its busy time now
/// and at the last look (`last`, updated).
pub(crate) fn busy_fraction(d: &SharedDevice, last: &mut u64, span_ns: u64) -> f64 {
    let d = d.borrow();
    let busy = d.busy_ns() - std::mem::replace(last, d.busy_ns());
    busy as f64 / (span_ns as f64 * d.servers() as f64)
}

/// Runs every node's completions and timers up to `now`, one instant at a time in
/// global time order, adding the requests completed to `done` (a remote op queues on another node's SSD, so no node may run
/// ahead of the others).
fn advance(nodes: &mut [Node], now: u64, done: &mut Vec<(u64, u64)>) {
    loop {
        let next = nodes.iter().enumerate().filter_map(|(i, n)| n.next_time().map(|t| (t, i))).min();
        match next {
            Some((t, i)) if t <= now => {
                nodes[i].advance_to(t);
                nodes[i].take_done(done);
            }
            _ => return,
        }
    }
}

/// ELICA-Load (§3.5, `cluster::load`): the allocation's units as chunks — each drawing its
/// VM's accesses of the window spread evenly over its units — and one exchange of
/// `load_chunks` of them between the busiest VM of the node whose SSD was busiest and
/// the idlest VM of the least busy node, applied to the VMs' local and per-lender parts
/// (each VM's capacity, and each node's, unchanged).
fn balance_load(p: &Plan, vms: &[Vm], node_load: &[f64], local: &mut [u64], lent: &mut [Vec<(u16, u64)>]) {
    let mut chunks = Vec::new();
    for (v, vm) in vms.iter().enumerate() {
        let units = local[v] + lent[v].iter().map(|r| r.1).sum::<u64>();
        if units == 0 {
            continue;
        }
        let load = vm.est.accesses() / units as f64;
        let at = std::iter::repeat_n(vm.node as u16, local[v] as usize)
            .chain(lent[v].iter().flat_map(|&(k, u)| std::iter::repeat_n(k, u as usize)));
        chunks.extend(at.map(|node| Chunk { vm: v as VmId, node, load }));
    }
    let Some(x) = choose(node_load, &chunks, p.cl.load_chunks as usize) else { return };
    let mut shift = |v: usize, from: u16, to: u16| {
        for (node, delta) in [(from, -1i64), (to, 1)] {
            if node as usize == vms[v].node {
                local[v] = local[v].wrapping_add_signed(delta);
            } else if let Some(r) = lent[v].iter_mut().find(|r| r.0 == node) {
                r.1 = r.1.wrapping_add_signed(delta);
            } else {
                lent[v].push((node, 1));
            }
        }
        lent[v].retain(|r| r.1 > 0);
    };
    for &i in &x.to_idle {
        shift(chunks[i].vm as usize, x.busy, x.idle);
    }
    for &i in &x.to_busy {
        shift(chunks[i].vm as usize, x.idle, x.busy);
    }
}

/// Before the first allocation: a node's cache split evenly among its VMs, all local.
fn split_evenly(node: &mut Node, now: u64) {
    let k = node.engine.vm_count() as u64;
    let slots = node.engine.config().slots;
    let d = Decision::targets((0..k).map(|_| slots / k.max(1)).collect());
    node.command(now, |e, out| *out = controller::apply(e, &d));
}

/// Eq. 4 on the last window's curves, applied as targets and remote shares with paced
/// shrinks (a VM above its new target gives blocks up as other VMs' misses need them:
/// eager shrinks wrote a window's evicted dirty blocks back at once and, on the `elica`
/// experiment, doubled the mean latency and took p99.9 from 29 ms to 2–4 s); the
/// windows' histograms start again.
fn allocate(p: &Plan, nodes: &mut [Node], vms: &mut [Vm], now: u64, total_units: u64, node_load: &[f64]) {
    if vms.is_empty() {
        return;
    }
    let form = if p.cl.ideal >= 1.0 { IdealForm::Max } else { IdealForm::Percentile(p.cl.ideal) };
    let curves: Vec<VmCurve> =
        vms.iter().map(|v| VmCurve { home: v.node as u16, hit_ratio: v.est.curve(form, total_units) }).collect();
    let capacity: Vec<u64> = p.slots.iter().map(|s| s / p.unit_blocks).collect();
    let mut local = vec![0u64; vms.len()];
    // Units each VM borrows, by lending node (Eq. 4's split, enforced per region).
    let mut lent: Vec<Vec<(u16, u64)>> = vec![Vec::new(); vms.len()];
    let mut solve = |prob: &Problem, ids: &[usize]| {
        let next = p.cl.solver.solve(prob).unwrap_or_else(|_| cachevisor_cluster::fast::solve_fast(prob));
        let last: Option<Vec<_>> = ids.iter().map(|&v| vms[v].last.clone()).collect();
        let last = last.map(|l| Allocation {
            local: l.iter().map(|x| x.0).collect(),
            remote: l.into_iter().map(|x| x.1).collect(),
            total_avl: 0.0,
        });
        let a = cachevisor_cluster::hysteresis::keep_or_take(prob, last.as_ref(), next, p.cl.hysteresis);
        for (j, &v) in ids.iter().enumerate() {
            local[v] = a.local[j];
            lent[v] = a.remote[j].clone();
        }
    };
    match p.cl.mode {
        ClusterMode::Elica | ClusterMode::ElicaLoad => {
            let ids: Vec<usize> = (0..vms.len()).collect();
            solve(&Problem { lat: p.lat, capacity, vms: curves }, &ids);
        }
        ClusterMode::Local => {
            for (i, &cap) in capacity.iter().enumerate() {
                let ids: Vec<usize> = (0..vms.len()).filter(|&v| vms[v].node == i).collect();
                let own = ids.iter().map(|&v| VmCurve { home: 0, hit_ratio: curves[v].hit_ratio.clone() }).collect();
                solve(&Problem { lat: p.lat, capacity: vec![cap], vms: own }, &ids);
            }
        }
    }
    // What Eq. 4 decided (before ELICA-Load's exchange) is the next window's last.
    for (v, vm) in vms.iter_mut().enumerate() {
        vm.last = Some((local[v], lent[v].clone()));
    }
    if p.cl.mode == ClusterMode::ElicaLoad {
        balance_load(p, vms, node_load, &mut local, &mut lent);
    }
    for (i, node) in nodes.iter_mut().enumerate() {
        let mine: Vec<usize> = (0..vms.len()).filter(|&v| vms[v].node == i).collect();
        let mut targets = vec![0u64; node.engine.vm_count()];
        let mut shares = Vec::new();
        for &v in &mine {
            let lid = vms[v].local_id as usize;
            let remote: u64 = lent[v].iter().map(|r| r.1).sum();
            targets[lid] = (local[v] + remote) * p.unit_blocks;
            let by_lender: Vec<(u16, u64)> = lent[v].iter().map(|&(k, u)| (k, u * p.unit_blocks)).collect();
            shares.push((vms[v].local_id, by_lender));
            vms[v].alloc = (local[v] * p.unit_blocks, remote * p.unit_blocks);
        }
        let d = Decision { paced_shrinks: true, ..Decision::targets(targets) };
        node.command(now, |e, out| {
            for (vm, by_lender) in &shares {
                e.set_remote_shares(*vm, by_lender).expect("every other node lends this engine a region");
            }
            *out = controller::apply(e, &d);
        });
    }
    for v in vms.iter_mut() {
        v.est.next_window();
    }
}
