//! Cluster mode of the simulator (ELICA, issue 15): one cache node per `[[node]]` — its
//! engine, its SSD, its link — with VMs placed on nodes (`[[vm]] node = …`), replayed
//! open loop in one virtual time. Every window each VM's stack distances give its hit
//! curve and ideal size (Eq. 1), and the allocation of Eq. 4 (`cluster::allocation`,
//! the fast solver by default) gives each VM local and remote cache, applied as engine
//! targets and remote shares. Open loop (trace times) or closed loop (`queue_depth`
//! requests in flight per VM), as `[replay]` says. A node's engine is built with a region lent by each other
//! node (as large as that node's cache: the allocation, not the region, bounds what is
//! used); a remote op crosses the borrower's link and queues on the lender's SSD, so a
//! lender's own VMs feel its borrowers' load. `mode = "local"` is the baseline ELICA
//! compares with (ECI-like: each node allocates only its own cache, Eq. 4 per node).
//! Every node runs in one virtual time, one instant at a time in global order.
//!
//! Not yet (docs/cluster.md): regions lent and taken back at run time with GM/IM
//! migration, ELICA-Load's exchanges, repeated passes, per-lender accounting of lent
//! slots in use.

use crate::device::{Device, DeviceSpec, SharedDevice};
use crate::inputs::{open_inputs, SimError};
use crate::metrics::VmStats;
use crate::node::Node;
use crate::scenario::{DeviceChoice, ReplayMode, Scenario};
use cachevisor_analysis::{DistanceHistogram, StackDistance};
use cachevisor_cluster::allocation::{Problem, Solver, VmCurve};
use cachevisor_cluster::model::{ideal_blocks, IdealForm, Latencies};
use cachevisor_engine::{EngineConfig, PartitionMode, RemoteRegion};
use cachevisor_policy::controller;
use cachevisor_policy::Decision;
use cachevisor_trace::units::{parse_duration_ns, parse_size};
use cachevisor_trace::{Request, VmId};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::rc::Rc;

/// One node of a cluster scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSection {
    /// Its name (VMs name it in `node = …`).
    pub name: String,
    /// Its SSD cache (`256MiB`).
    pub cache: String,
    /// Its SSD model (default: `[devices] ssd`).
    #[serde(default)]
    pub ssd: Option<DeviceChoice>,
    /// Its network link (default: the `remote` preset, 10 GbE: 150 µs round trip,
    /// 1,250 MB/s).
    #[serde(default)]
    pub link: Option<DeviceChoice>,
}

/// How a cluster shares cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ClusterMode {
    /// ELICA: Eq. 4 across the nodes, remote cache where a node is short.
    #[default]
    Elica,
    /// Each node its own cache only (the ECI-like baseline of ELICA §4).
    Local,
}

/// `[cluster]`: the allocation's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSection {
    /// ELICA or local-only.
    pub mode: ClusterMode,
    /// Which Eq. 4 solver.
    pub solver: Solver,
    /// Allocation unit (`1MiB`), a multiple of the block size.
    pub unit: String,
    /// Eq. 1's ideal size: the distance covering this fraction of a window's reuses
    /// (1 = the maximum distance, Eq. 1 as written).
    pub ideal: f64,
}

impl Default for ClusterSection {
    fn default() -> Self {
        ClusterSection { mode: ClusterMode::Elica, solver: Solver::Fast, unit: "1MiB".into(), ideal: 0.99 }
    }
}

/// A VM's figures at the end of a cluster run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterVm {
    /// Its name.
    pub name: String,
    /// Its node.
    pub node: String,
    /// Requests completed.
    pub requests: u64,
    /// Block hit ratio.
    pub hit_ratio: f64,
    /// Share of its cache accesses served by lent caches.
    pub remote_share: f64,
    /// Mean and 99.9th-percentile request latency, µs.
    pub mean_us: f64,
    /// See `mean_us`.
    pub p999_us: f64,
    /// Its last allocation: local and remote blocks.
    pub local_blocks: u64,
    /// See `local_blocks`.
    pub remote_blocks: u64,
}

/// A node's figures at the end of a cluster run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterNodeStats {
    /// Its name.
    pub name: String,
    /// Its cache, blocks.
    pub cache_blocks: u64,
    /// Bytes written to its SSD (its VMs' and its borrowers': wear, ELICA Fig. 16/17).
    pub ssd_written_bytes: u64,
    /// Bytes its link carried for remote ops.
    pub link_bytes: u64,
}

/// What a cluster run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterResult {
    /// ELICA or local-only.
    pub mode: ClusterMode,
    /// Per VM.
    pub vms: Vec<ClusterVm>,
    /// Per node.
    pub nodes: Vec<ClusterNodeStats>,
    /// All VMs: block hit ratio, share served remotely, mean and p99.9 latency (µs).
    pub hit_ratio: f64,
    /// See `hit_ratio`.
    pub remote_share: f64,
    /// See `hit_ratio`.
    pub mean_us: f64,
    /// See `hit_ratio`.
    pub p999_us: f64,
    /// Cache allocated to the VMs, averaged over the allocations (blocks; ELICA Fig. 9),
    /// and of it the blocks on lent caches (Fig. 11's remote share).
    pub mean_allocated_blocks: f64,
    /// See `mean_allocated_blocks`.
    pub mean_remote_blocks: f64,
    /// Allocations run, and the solver's total time (s).
    pub allocations: u64,
    /// See `allocations`.
    pub solve_s: f64,
}

impl ClusterResult {
    /// The per-VM and per-node tables, as `cachevisor simulate` prints them.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<16} {:<8} {:>9} {:>7} {:>8} {:>10} {:>11} {:>11} {:>11}",
            "vm", "node", "requests", "hit%", "remote%", "mean µs", "p99.9 µs", "local blks", "remote blks"
        );
        for v in &self.vms {
            let _ = writeln!(
                s,
                "{:<16} {:<8} {:>9} {:>7.2} {:>8.1} {:>10.1} {:>11.1} {:>11} {:>11}",
                v.name,
                v.node,
                v.requests,
                v.hit_ratio * 100.0,
                v.remote_share * 100.0,
                v.mean_us,
                v.p999_us,
                v.local_blocks,
                v.remote_blocks
            );
        }
        let _ = writeln!(
            s,
            "{:<16} {:<8} {:>9} {:>7.2} {:>8.1} {:>10.1} {:>11.1}",
            "all",
            "",
            self.vms.iter().map(|v| v.requests).sum::<u64>(),
            self.hit_ratio * 100.0,
            self.remote_share * 100.0,
            self.mean_us,
            self.p999_us
        );
        let _ = writeln!(s, "\n{:<16} {:>12} {:>14} {:>14}", "node", "cache blks", "SSD written", "link bytes");
        for n in &self.nodes {
            let _ = writeln!(
                s,
                "{:<16} {:>12} {:>14} {:>14}",
                n.name,
                n.cache_blocks,
                cachevisor_trace::units::format_size(n.ssd_written_bytes),
                cachevisor_trace::units::format_size(n.link_bytes)
            );
        }
        let _ = write!(s, "\n{} allocations ({:?}), solver time {:.3} s", self.allocations, self.mode, self.solve_s);
        s
    }
}

/// A cluster scenario's settings, checked.
struct Plan {
    cl: ClusterSection,
    block: u64,
    unit_blocks: u64,
    window_ns: u64,
    slots: Vec<u64>,
    lat: Latencies,
}

fn plan(sc: &Scenario) -> Result<Plan, String> {
    let res = sc.resolve()?;
    let cl = sc.cluster.clone().unwrap_or_default();
    if sc.node.is_empty() {
        return Err("node: a cluster needs at least one [[node]]".into());
    }
    if sc.cache.partition != PartitionMode::Static || sc.cache.persistent || sc.failover.is_some() {
        return Err("cache: cluster mode needs static partitions, no persistent mode and no [failover]".into());
    }
    if sc.replay.repeat_for.is_some() {
        return Err("replay.repeat_for: cluster mode replays each trace once".into());
    }
    if res.window_requests.is_some() {
        return Err("replay.window: cluster mode windows by time (`60s`)".into());
    }
    let block = res.block_size;
    let unit = parse_size(&cl.unit).map_err(|e| format!("cluster.unit: {e}"))?;
    if unit == 0 || unit % block != 0 {
        return Err(format!("cluster.unit: {} is not a multiple of the block size ({block} B)", cl.unit));
    }
    if !(cl.ideal > 0.0 && cl.ideal <= 1.0) {
        return Err(format!("cluster.ideal: {} is not a fraction of reuses in (0, 1]", cl.ideal));
    }
    let mut slots = Vec::new();
    for (i, n) in sc.node.iter().enumerate() {
        if sc.node[..i].iter().any(|m| m.name == n.name) {
            return Err(format!("node[{i}]: the name `{}` is taken", n.name));
        }
        let bytes = parse_size(&n.cache).map_err(|e| format!("node[{i}] ({}).cache: {e}", n.name))?;
        if bytes < block {
            return Err(format!("node[{i}] ({}).cache: {} holds no block", n.name, n.cache));
        }
        slots.push(bytes / block);
        for d in [&n.ssd, &n.link].into_iter().flatten() {
            d.resolve().map_err(|e| format!("node[{i}] ({}): {e}", n.name))?;
        }
    }
    for v in &sc.vm {
        match &v.node {
            Some(n) if sc.node.iter().any(|m| m.name == *n) => {}
            Some(n) => return Err(format!("vm {}: no [[node]] is named `{n}`", v.name)),
            None => return Err(format!("vm {}: cluster mode needs its node (node = \"…\")", v.name)),
        }
    }
    let ssd = sc.devices.ssd.resolve()?;
    let link = DeviceSpec::preset("remote")?;
    let hdd = sc.devices.backing.resolve()?;
    let us = |spec: &DeviceSpec| Device::nominal_ns(spec, false, block as u32) as f64 / 1e3;
    let lat = Latencies { ssd_local_us: us(&ssd), ssd_remote_us: us(&ssd), network_us: us(&link), hdd_us: us(&hdd) };
    let window_ns = parse_duration_ns(&sc.replay.window)?;
    Ok(Plan { unit_blocks: unit / block, cl, block, window_ns, slots, lat })
}

/// A VM of the run.
struct Vm {
    node: usize,
    local_id: VmId,
    sd: StackDistance,
    hist: DistanceHistogram,
    alloc: (u64, u64),
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
    /// Completions taken from the nodes: (global VM id, time).
    done: Vec<(u64, u64)>,
}

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
                ClusterMode::Elica => {
                    (0..n).filter(|&k| k != i).map(|k| RemoteRegion { node: k as u16, slots: p.slots[k] }).collect()
                }
                ClusterMode::Local => Vec::new(),
            };
            let cfg = EngineConfig {
                block_size: p.block,
                slots: p.slots[i],
                partition: PartitionMode::Static,
                replacement: sc.cache.replacement,
                write_policy: sc.cache.write_policy,
                fill: sc.cache.fill,
                track_last_access: false,
                remote,
            };
            let mut node = Node::new(cfg, &sc.devices, None)?;
            node.ssd = ssds[i].clone();
            node.peers = (0..n).map(|k| (k != i).then(|| ssds[k].clone())).collect();
            node.nic = Some(links[i].clone());
            nodes.push(node);
        }
        let window_end = p.window_ns;
        Ok(Cluster {
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
            done: Vec::new(),
        })
    }

    /// Runs every node up to `now` ([`advance`]) and every allocation due by then.
    fn advance_to(&mut self, now: u64) {
        advance(&mut self.nodes, now, &mut self.done);
        while now >= self.window_end {
            let t = std::time::Instant::now();
            allocate(&self.p, &mut self.nodes, &mut self.vms, self.window_end, self.total_units);
            self.solve_s += t.elapsed().as_secs_f64();
            self.allocated.0 += self.vms.iter().map(|v| (v.alloc.0 + v.alloc.1) as f64).sum::<f64>();
            self.allocated.1 += self.vms.iter().map(|v| v.alloc.1 as f64).sum::<f64>();
            self.allocations += 1;
            self.window_end = self.window_end.saturating_add(self.p.window_ns);
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
            self.vms.push(Vm {
                node: home,
                local_id,
                sd: StackDistance::new(),
                hist: DistanceHistogram::coarse(self.p.unit_blocks, self.total_units as usize + 1),
                alloc: (0, 0),
            });
            self.names.push(name);
            split_evenly(&mut self.nodes[home], now);
        }
        Ok(())
    }

    /// Issues `req` (global VM id) at `now` on its VM's node; its completion comes back
    /// tagged with the global id.
    fn issue(&mut self, now: u64, req: &Request) {
        let v = &mut self.vms[req.vm as usize];
        let block = self.p.block;
        let (first, last) = (req.offset / block, (req.end().max(req.offset + 1) - 1) / block);
        for b in first..=last {
            let d = v.sd.access(b);
            v.hist.add(d, 1.0);
        }
        let local = Request { vm: v.local_id, ..*req };
        self.nodes[v.node].submit(now, &local, req.vm as u64);
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
                c.issue(now, &req);
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
                c.issue(now, &req);
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
    let mut r = result(sc, &c.p, &c.nodes, &c.vms, &c.names, &c.ssds, &c.links, c.allocations, c.solve_s);
    let n = c.allocations.max(1) as f64;
    (r.mean_allocated_blocks, r.mean_remote_blocks) = (c.allocated.0 / n, c.allocated.1 / n);
    Ok(r)
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
fn allocate(p: &Plan, nodes: &mut [Node], vms: &mut [Vm], now: u64, total_units: u64) {
    if vms.is_empty() {
        return;
    }
    let form = if p.cl.ideal >= 1.0 { IdealForm::Max } else { IdealForm::Percentile(p.cl.ideal) };
    let curves: Vec<VmCurve> = vms
        .iter()
        .map(|v| {
            let total = v.hist.total();
            let ideal = ideal_blocks(&v.hist, form).div_ceil(p.unit_blocks).min(total_units);
            let hit_ratio = if total > 0.0 {
                v.hist.hits_curve(p.unit_blocks, ideal as usize).into_iter().map(|h| h / total).collect()
            } else {
                vec![0.0]
            };
            VmCurve { home: v.node as u16, hit_ratio }
        })
        .collect();
    let capacity: Vec<u64> = p.slots.iter().map(|s| s / p.unit_blocks).collect();
    let mut local = vec![0u64; vms.len()];
    let mut remote = vec![0u64; vms.len()];
    let mut solve = |prob: &Problem, ids: &[usize]| {
        let a = p.cl.solver.solve(prob).unwrap_or_else(|_| cachevisor_cluster::fast::solve_fast(prob));
        for (j, &v) in ids.iter().enumerate() {
            local[v] = a.local[j];
            remote[v] = a.remote[j].iter().map(|r| r.1).sum();
        }
    };
    match p.cl.mode {
        ClusterMode::Elica => {
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
    for (i, node) in nodes.iter_mut().enumerate() {
        let mine: Vec<usize> = (0..vms.len()).filter(|&v| vms[v].node == i).collect();
        let mut targets = vec![0u64; node.engine.vm_count()];
        let mut shares = Vec::new();
        for &v in &mine {
            let lid = vms[v].local_id as usize;
            targets[lid] = (local[v] + remote[v]) * p.unit_blocks;
            shares.push((vms[v].local_id, remote[v] * p.unit_blocks));
            vms[v].alloc = (local[v] * p.unit_blocks, remote[v] * p.unit_blocks);
        }
        let d = Decision { paced_shrinks: true, ..Decision::targets(targets) };
        node.command(now, |e, out| {
            for &(vm, r) in &shares {
                e.set_remote_target(vm, r);
            }
            *out = controller::apply(e, &d);
        });
    }
    for v in vms.iter_mut() {
        v.hist = v.hist.cleared();
    }
}

#[allow(clippy::too_many_arguments)]
fn result(
    sc: &Scenario,
    p: &Plan,
    nodes: &[Node],
    vms: &[Vm],
    names: &[String],
    ssds: &[SharedDevice],
    links: &[SharedDevice],
    allocations: u64,
    solve_s: f64,
) -> ClusterResult {
    let mut all = VmStats::default();
    let empty = VmStats::default();
    let figures = |s: &VmStats| {
        let blocks = s.read_blocks + s.write_blocks;
        let hits = s.read_hits + s.write_hits;
        let hr = if blocks > 0 { hits as f64 / blocks as f64 } else { 0.0 };
        let rs =
            if s.cache_client_ops > 0 { s.cache_client_ops_remote as f64 / s.cache_client_ops as f64 } else { 0.0 };
        (hr, rs, s.lat.mean() / 1e3, s.lat.value_at_quantile(0.999) as f64 / 1e3)
    };
    let out_vms = vms
        .iter()
        .zip(names)
        .map(|(v, name)| {
            let s = nodes[v.node].metrics.vms.get(v.local_id as usize).unwrap_or(&empty);
            all.merge(s);
            let (hit_ratio, remote_share, mean_us, p999_us) = figures(s);
            ClusterVm {
                name: name.clone(),
                node: sc.node[v.node].name.clone(),
                requests: s.requests,
                hit_ratio,
                remote_share,
                mean_us,
                p999_us,
                local_blocks: v.alloc.0,
                remote_blocks: v.alloc.1,
            }
        })
        .collect();
    let out_nodes = sc
        .node
        .iter()
        .enumerate()
        .map(|(i, n)| ClusterNodeStats {
            name: n.name.clone(),
            cache_blocks: p.slots[i],
            ssd_written_bytes: ssds[i].borrow().bytes_written(),
            link_bytes: links[i].borrow().bytes_written() + links[i].borrow().bytes_read(),
        })
        .collect();
    let (hit_ratio, remote_share, mean_us, p999_us) = figures(&all);
    ClusterResult {
        mode: p.cl.mode,
        vms: out_vms,
        nodes: out_nodes,
        hit_ratio,
        remote_share,
        mean_us,
        p999_us,
        mean_allocated_blocks: 0.0,
        mean_remote_blocks: 0.0,
        allocations,
        solve_s,
    }
}
