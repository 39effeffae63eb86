//! Migration in the cluster simulator (ELICA §3.6, §3.6.3): the shared driver
//! (`cachevisor_cluster::migration_driver`, which a daemon node runs too) over the
//! simulated nodes' engines, with one planner for the cluster and the links' measured
//! utilization as its congestion signal; an Instant migration's bulk copies are its
//! node's (`instant_copies.rs`). This only runs the driver in virtual time.

use crate::cluster_sim::{busy_fraction, Vm};
use crate::device::SharedDevice;
use crate::node::Node;
use cachevisor_cluster::migration_driver::{MigrationDriver, MigrationHost};
use cachevisor_cluster::migration_plan::{MigrationCost, PlanSettings};
use cachevisor_engine::{MigrationScheme, MigrationStats};

/// The simulated cluster's VMs, as the driver sees them.
struct Host<'a> {
    nodes: &'a mut [Node],
    vms: &'a [Vm],
}

impl MigrationHost for Host<'_> {
    fn count(&self) -> usize {
        self.vms.len()
    }
    fn stats(&self, id: usize) -> MigrationStats {
        let vm = &self.vms[id];
        self.nodes[vm.node].engine.migration_stats(vm.local_id)
    }
    fn set_scheme(&mut self, id: usize, scheme: MigrationScheme) {
        let vm = &self.vms[id];
        let node = &mut self.nodes[vm.node];
        node.engine.set_migration(vm.local_id, scheme);
        match scheme {
            MigrationScheme::Instant => node.copies.start(vm.local_id),
            _ => node.copies.stop(vm.local_id),
        }
    }
}

/// The cluster's migrations.
pub(crate) struct ClusterMigrations {
    driver: MigrationDriver,
    /// Each link's busy time at the last tick (its utilization since is the congestion
    /// signal).
    link_busy: Vec<u64>,
    last_tick: u64,
}

impl ClusterMigrations {
    pub(crate) fn new(settings: PlanSettings, block: u64, links: usize) -> Self {
        ClusterMigrations {
            driver: MigrationDriver::new(settings, block).expect("settings checked with the scenario"),
            link_busy: vec![0; links],
            last_tick: 0,
        }
    }

    /// Blocks copied between stores, in all.
    pub(crate) fn moved_blocks(&self) -> u64 {
        self.driver.moved_blocks
    }

    /// After an allocation at `now`: every VM with misplaced blocks and no migration
    /// asks for one.
    pub(crate) fn after_allocation(&mut self, now: u64, nodes: &mut [Node], vms: &[Vm]) {
        self.driver.after_allocation(now / 1000, &Host { nodes, vms });
    }

    /// The tick at `now` (every node has run up to it): migrations allowed to start
    /// start, progress is read, finished ones end.
    pub(crate) fn tick(&mut self, now: u64, nodes: &mut [Node], vms: &[Vm], links: &[SharedDevice]) {
        let dt = now.saturating_sub(self.last_tick).max(1);
        let utilization = links
            .iter()
            .zip(self.link_busy.iter_mut())
            .map(|(l, last)| busy_fraction(l, last, dt))
            .fold(0.0f64, f64::max);
        self.last_tick = now;
        self.driver.tick(now / 1000, utilization, &mut Host { nodes, vms });
        for node in nodes.iter_mut() {
            node.copies.rearm();
            node.kick(now);
        }
    }

    /// What migrations cost up to `now`.
    pub(crate) fn cost(&mut self, now: u64) -> MigrationCost {
        self.driver.cost(now / 1000)
    }
}
