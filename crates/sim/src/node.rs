//! One cache node of the simulator: the engine and the device models its ops run on (the
//! cache SSD, one backing device per VM or one shared), with the metrics of what ran.
//! The replay loop (`simulator.rs`) drives it request by request and feeds it the
//! controller's decisions; a cluster simulator instantiates one per node.
//!
//! Timing: the engine's synchronous face — a request's ops run phase by phase from its
//! issue time, each on its device's queueing model; a request completes when its last
//! synchronous op does; background work (write-backs, resizes, cleaning) occupies the
//! devices from the time it is issued.

use crate::device::Device;
use crate::inputs::SimError;
use crate::metrics::Metrics;
use crate::scenario::{BackingLayout, DevicesSection};
use cachevisor_engine::{DeviceOp, Engine, EngineConfig, Output};
use cachevisor_trace::{Request, VmId};

/// A cache node: engine, devices, metrics.
pub(crate) struct Node {
    pub(crate) engine: Engine,
    pub(crate) ssd: Device,
    /// Backing devices: one per VM, or one shared (`BackingLayout`).
    pub(crate) backing: Vec<Device>,
    pub(crate) metrics: Metrics,
    layout: BackingLayout,
    backing_spec: crate::device::DeviceSpec,
    /// Reused output buffers (requests, commands).
    out: Output,
    cmd: Output,
}

impl Node {
    /// A node with an engine of `cfg` on the devices `devices` describes.
    pub(crate) fn new(cfg: EngineConfig, devices: &DevicesSection) -> Result<Node, SimError> {
        Ok(Node {
            engine: Engine::new(cfg).map_err(SimError::Scenario)?,
            ssd: Device::new(devices.ssd.resolve().map_err(SimError::Scenario)?),
            backing: Vec::new(),
            metrics: Metrics::default(),
            layout: devices.backing_layout,
            backing_spec: devices.backing.resolve().map_err(SimError::Scenario)?,
            out: Output::default(),
            cmd: Output::default(),
        })
    }

    /// Adds VM `vm` (the next id): its backing device (per-VM layout) and partition.
    pub(crate) fn add_vm(&mut self, vm: VmId) -> Result<(), SimError> {
        if self.layout == BackingLayout::PerVm || self.backing.is_empty() {
            self.backing.push(Device::new(self.backing_spec.clone()));
        }
        self.engine.ensure_vm(vm);
        Ok(())
    }

    /// Serves `req` issued at `now` and counts it; returns when it completes.
    pub(crate) fn access(&mut self, now: u64, req: &Request) -> u64 {
        let mut out = std::mem::take(&mut self.out);
        self.engine.access(now, req, &mut out);
        let done = self.execute(now, &out.ops);
        self.metrics.request(req.vm, req.op.is_write(), &out, done - now);
        self.out = out;
        done
    }

    /// Runs an engine command and executes its ops as background work at `now`.
    pub(crate) fn command(&mut self, now: u64, f: impl FnOnce(&mut Engine, &mut Output)) {
        let mut cmd = std::mem::take(&mut self.cmd);
        f(&mut self.engine, &mut cmd); // engine commands clear `cmd` first
        self.background(now, &cmd);
        self.cmd = cmd;
    }

    /// Executes a command's ops as background work and counts them.
    pub(crate) fn background(&mut self, now: u64, out: &Output) {
        self.execute(now, &out.ops);
        self.metrics.ops(out);
    }

    /// The device an op runs on, and its address there.
    fn device(&mut self, op: &DeviceOp) -> (&mut Device, u64) {
        if op.kind.is_ssd() {
            (&mut self.ssd, op.ssd_offset(self.engine.config().block_size))
        } else if self.layout == BackingLayout::PerVm {
            (&mut self.backing[op.vm as usize], op.disk_addr)
        } else {
            (&mut self.backing[0], op.disk_addr.wrapping_add((op.vm as u64) << 40))
        }
    }

    /// Runs ops phase by phase from `now`; returns when the last sync op completes.
    fn execute(&mut self, now: u64, ops: &[DeviceOp]) -> u64 {
        let max_phase = ops.iter().map(|o| o.phase).max().unwrap_or(0);
        let (mut start, mut done) = (now, now);
        for p in 0..=max_phase {
            let mut end = start;
            for op in ops.iter().filter(|o| o.phase == p) {
                let (dev, addr) = self.device(op);
                let c = dev.submit(start, op.kind.is_write(), addr, op.len);
                end = end.max(c);
                if op.sync {
                    done = done.max(c);
                }
            }
            start = end;
        }
        done
    }
}
