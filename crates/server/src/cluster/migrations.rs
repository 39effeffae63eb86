//! A daemon node's cache migrations (ELICA §3.6): when the leader's allocation moves a
//! vDisk's shares between this node's cache and its lenders' regions — or between two
//! lenders — the blocks it holds where it is now above its share move to where it is
//! below, over the peers' TLS NBD exports, instead of being dropped and missed again.
//! The decisions are the shared driver's (`cachevisor_cluster::migration_driver`, the
//! simulator runs the same: planner, rate limit, Gradual or Instant, progress, end); the
//! moves are the engine's (`migration.rs`: a staged SSD→SSD copy, the block held while it
//! is in flight so a write to it waits and lands at the destination — §3.7's update
//! safety —, its index flipped at the destination once the copy landed, a failed copy
//! undone). This thread ticks the driver every 100 ms and runs each Instant
//! migration's bulk copies, one job of `migration_batch` blocks per vDisk at a time.
//!
//! §3.6.3's congestion signal is the node's link to its lenders: the share of the last
//! tick some op on a peer was in flight (`peer_device.rs`'s `LinkBusy`; the simulator
//! reads its link models the same way); at or above `congested` (0.5) `auto` starts a
//! Gradual migration, else an Instant one.

use cachevisor_cluster::migration_driver::{MigrationDriver, MigrationHost, MigrationStatus};
use cachevisor_cluster::migration_plan::PlanSettings;
use cachevisor_engine::{Engine, MigrationScheme, MigrationStats};
use cachevisor_trace::VmId;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// What the migrations need of the node they run in (the daemon): whether it still
/// runs, its link's busy time, and its data path.
pub(crate) trait NodeOps: Send + Sync {
    /// Whether the node stopped (the thread ends).
    fn stopped(&self) -> bool;
    /// How long the link to the lenders was busy so far (ns).
    fn link_busy_ns(&self) -> u64;
    /// The node's data path (its engine, and the jobs that move blocks).
    fn datapath(&self) -> &Arc<cachevisor_datapath::DataPath>;
}

/// The node's migrations.
pub(crate) struct NodeMigrations {
    driver: Mutex<MigrationDriver>,
    /// vDisks whose Instant migration is running (their bulk copies are due).
    instant: Mutex<BTreeSet<VmId>>,
    /// An allocation was applied since the last tick.
    allocated: AtomicBool,
    batch: u64,
    start: Instant,
    /// The link's busy time and the time at the last tick (ns since `start`).
    last: Mutex<(u64, u64)>,
}

/// This node's engine as the driver sees it.
struct Host<'a> {
    engine: &'a mut Engine,
    instant: &'a mut BTreeSet<VmId>,
}

impl MigrationHost for Host<'_> {
    fn count(&self) -> usize {
        self.engine.vm_count()
    }
    fn stats(&self, id: usize) -> MigrationStats {
        self.engine.migration_stats(id as VmId)
    }
    fn set_scheme(&mut self, id: usize, scheme: MigrationScheme) {
        self.engine.set_migration(id as VmId, scheme);
        if scheme == MigrationScheme::Instant {
            self.instant.insert(id as VmId);
        } else {
            self.instant.remove(&(id as VmId));
        }
    }
}

/// How often the driver ticks.
const TICK: Duration = Duration::from_millis(100);

impl NodeMigrations {
    /// Migrations with the planner's `settings`, `batch` blocks per Instant copy job.
    pub(crate) fn new(settings: PlanSettings, block: u64, batch: u64) -> Result<NodeMigrations, String> {
        Ok(NodeMigrations {
            driver: Mutex::new(MigrationDriver::new(settings, block)?),
            instant: Default::default(),
            allocated: AtomicBool::new(false),
            batch,
            start: Instant::now(),
            last: Mutex::new((0, 0)),
        })
    }

    /// The leader's allocation was applied (shares may have moved).
    pub(crate) fn allocated(&self) {
        self.allocated.store(true, SeqCst);
    }

    /// Waiting and running migrations, blocks moved so far.
    pub(crate) fn status(&self) -> MigrationStatus {
        self.driver.lock().unwrap_or_else(|e| e.into_inner()).status()
    }

    /// The driver's thread, until the node is gone or stopped.
    pub(crate) fn run(self: Arc<Self>, node: Weak<dyn NodeOps>) {
        loop {
            std::thread::sleep(TICK);
            let Some(d) = node.upgrade() else { return };
            if d.stopped() {
                return;
            }
            let now_ns = self.start.elapsed().as_nanos() as u64;
            let now_us = now_ns / 1000;
            let utilization = {
                let busy = d.link_busy_ns();
                let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
                let u = busy.saturating_sub(last.0) as f64 / now_ns.saturating_sub(last.1).max(1) as f64;
                *last = (busy, now_ns);
                u.min(1.0)
            };
            let allocated = self.allocated.swap(false, SeqCst);
            d.datapath().with_engine_mut(|e| {
                let mut driver = self.driver.lock().unwrap_or_else(|p| p.into_inner());
                let mut instant = self.instant.lock().unwrap_or_else(|p| p.into_inner());
                let mut host = Host { engine: e, instant: &mut instant };
                if allocated {
                    driver.after_allocation(now_us, &host);
                }
                driver.tick(now_us, utilization, &mut host);
            });
            self.copy(d.as_ref());
        }
    }

    /// Instant Migration's bulk copies (§3.6.2): each running vDisk's next batches, one
    /// job at a time, until a tick's time is spent or nothing more moves now.
    fn copy(&self, d: &dyn NodeOps) {
        let until = Instant::now() + TICK;
        let vms: Vec<VmId> = self.instant.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().collect();
        for vm in vms {
            while Instant::now() < until {
                let mut moved = 0;
                let r = d.datapath().run_job(|e, out| moved = e.migrate_some(vm, self.batch, out));
                if moved == 0 || r.is_err() {
                    break; // nothing movable now (or a copy failed: the engine undid it)
                }
            }
        }
    }
}
