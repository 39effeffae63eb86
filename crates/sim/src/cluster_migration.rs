//! Migration in the cluster simulator (ELICA §3.6, §3.6.3). After each allocation every VM
//! that holds blocks where it is now above its share (a store that could take them is
//! below it) asks the planner (`cluster::migration_plan`) to migrate; the planner lets
//! migrations start at its rate, Gradual or Instant by the links' utilization (or as the
//! scenario forces). A started VM's engine gets the scheme (`Engine::set_migration`), an
//! Instant one its node's bulk copies (`instant_copies.rs`). Every tick the engines'
//! counters give each migration's progress: blocks still misplaced (the reserved capacity
//! at the sources) and blocks copied (bytes moved: read at the source, over the network,
//! written at the destination); a migration whose VM has nothing misplaced left ends and
//! its scheme goes back to off. The decisions are the planner's and the engine's; this
//! only runs them in virtual time.

use crate::cluster_sim::{busy_fraction, Vm};
use crate::device::SharedDevice;
use crate::node::Node;
use cachevisor_cluster::migration::Scheme;
use cachevisor_cluster::migration_plan::{MigrationCost, MigrationPlanner, PlanSettings};
use cachevisor_engine::MigrationScheme;

/// A VM's migration.
#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Idle,
    Waiting,
    /// Started: blocks the planner still counts at the sources, and the engine's moved
    /// counter when last read.
    Active {
        held: u64,
        moved: u64,
    },
}

/// The cluster's migrations.
pub(crate) struct ClusterMigrations {
    planner: MigrationPlanner,
    state: Vec<State>,
    block: u64,
    /// Each link's busy time at the last tick (its utilization since is the congestion
    /// signal).
    link_busy: Vec<u64>,
    last_tick: u64,
    /// Blocks copied between stores, in all.
    pub(crate) moved_blocks: u64,
}

impl ClusterMigrations {
    pub(crate) fn new(settings: PlanSettings, block: u64, links: usize) -> Self {
        ClusterMigrations {
            planner: MigrationPlanner::new(settings).expect("settings checked with the scenario"),
            state: Vec::new(),
            block,
            link_busy: vec![0; links],
            last_tick: 0,
            moved_blocks: 0,
        }
    }

    /// After an allocation at `now`: every VM with misplaced blocks and no migration
    /// asks for one.
    pub(crate) fn after_allocation(&mut self, now: u64, nodes: &[Node], vms: &[Vm]) {
        self.state.resize(vms.len(), State::Idle);
        for (v, vm) in vms.iter().enumerate() {
            if self.state[v] != State::Idle {
                continue;
            }
            let misplaced = nodes[vm.node].engine.migration_stats(vm.local_id).misplaced;
            if misplaced > 0 {
                self.planner.request(now / 1000, v as u64, misplaced);
                self.state[v] = State::Waiting;
            }
        }
    }

    /// The tick at `now` (every node has run up to it): migrations allowed to start
    /// start, progress is read, finished ones end.
    pub(crate) fn tick(&mut self, now: u64, nodes: &mut [Node], vms: &[Vm], links: &[SharedDevice]) {
        self.state.resize(vms.len(), State::Idle);
        let dt = now.saturating_sub(self.last_tick).max(1);
        let utilization = links
            .iter()
            .zip(self.link_busy.iter_mut())
            .map(|(l, last)| busy_fraction(l, last, dt))
            .fold(0.0f64, f64::max);
        self.last_tick = now;
        let us = now / 1000;
        while let Some(start) = self.planner.poll(us, utilization) {
            let v = start.id as usize;
            let vm = &vms[v];
            let node = &mut nodes[vm.node];
            let scheme = match start.scheme {
                Scheme::Gradual => MigrationScheme::Gradual,
                Scheme::Instant => MigrationScheme::Instant,
            };
            node.engine.set_migration(vm.local_id, scheme);
            if scheme == MigrationScheme::Instant {
                node.copies.start(vm.local_id);
            }
            let stats = node.engine.migration_stats(vm.local_id);
            self.state[v] = State::Active { held: stats.misplaced, moved: stats.moved };
        }
        for (v, vm) in vms.iter().enumerate() {
            let State::Active { held, moved } = self.state[v] else { continue };
            let node = &mut nodes[vm.node];
            let now_stats = node.engine.migration_stats(vm.local_id);
            let copied = now_stats.moved.saturating_sub(moved);
            self.moved_blocks += copied;
            // (At the end everything the planner still counts is gone: it counted the
            // blocks misplaced when the VM asked, which can differ from when it started.)
            let gone = if now_stats.misplaced == 0 { u64::MAX } else { held.saturating_sub(now_stats.misplaced) };
            self.planner.moved(us, v as u64, gone, copied * self.block);
            if now_stats.misplaced == 0 {
                node.engine.set_migration(vm.local_id, MigrationScheme::Off);
                node.copies.stop(vm.local_id);
                self.state[v] = State::Idle;
            } else {
                self.state[v] = State::Active { held: held - gone.min(held), moved: now_stats.moved };
            }
        }
        for node in nodes.iter_mut() {
            node.copies.rearm();
            node.kick(now);
        }
    }

    /// What migrations cost up to `now`.
    pub(crate) fn cost(&mut self, now: u64) -> MigrationCost {
        self.planner.cost(now / 1000)
    }
}
