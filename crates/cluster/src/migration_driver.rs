//! Runs migrations on engines (ELICA §3.6, §3.6.3): after each allocation every VM that
//! holds blocks where it is now above its share (a store that could take them is below
//! it) asks the planner ([`crate::migration_plan`]) to migrate; the planner lets
//! migrations start at its rate, Gradual or Instant by the links' utilization (or as
//! configured). A started VM's engine gets the scheme (`Engine::set_migration`), an
//! Instant one its bulk copies (the host's). Every tick the engines' counters give each
//! migration's progress: blocks still misplaced (the reserved capacity at the sources)
//! and blocks copied (bytes moved: read at the source, sent, written at the
//! destination); a migration whose VM has nothing misplaced left ends and its scheme goes
//! back to off.
//!
//! One driver for both faces: the simulator's cluster (VMs on many simulated nodes, one
//! planner for the cluster) and a daemon node (its own VMs, its own planner) implement
//! [`MigrationHost`]; the decisions here are the same. Pure: time comes in (µs).

use crate::migration::Scheme;
use crate::migration_plan::{MigrationCost, MigrationPlanner, PlanSettings};
use cachevisor_engine::{MigrationScheme, MigrationStats};
use serde::Serialize;

/// The VMs a driver migrates, numbered `0..count()`, and their engines.
pub trait MigrationHost {
    /// How many VMs.
    fn count(&self) -> usize;
    /// VM `id`'s migration counters (`Engine::migration_stats`).
    fn stats(&self, id: usize) -> MigrationStats;
    /// VM `id`'s migration starts with `scheme` (Gradual or Instant), or ends (`Off`):
    /// the engine's scheme set, Instant's bulk copies started or stopped.
    fn set_scheme(&mut self, id: usize, scheme: MigrationScheme);
}

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
        scheme: MigrationScheme,
    },
}

/// What a driver shows (`GET /cluster`, reports).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct MigrationStatus {
    /// Migrations waiting for the planner.
    pub waiting: u64,
    /// Gradual migrations running.
    pub gradual: u64,
    /// Instant migrations running.
    pub instant: u64,
    /// Blocks copied between stores, in all.
    pub moved_blocks: u64,
}

/// The migrations of the VMs a host has.
pub struct MigrationDriver {
    planner: MigrationPlanner,
    state: Vec<State>,
    block: u64,
    /// Blocks copied between stores, in all.
    pub moved_blocks: u64,
}

impl MigrationDriver {
    /// A driver with the planner's `settings`, for blocks of `block` bytes.
    pub fn new(settings: PlanSettings, block: u64) -> Result<MigrationDriver, String> {
        Ok(MigrationDriver { planner: MigrationPlanner::new(settings)?, state: Vec::new(), block, moved_blocks: 0 })
    }

    /// After an allocation at `now_us`: every VM with misplaced blocks and no migration
    /// asks for one.
    pub fn after_allocation(&mut self, now_us: u64, host: &impl MigrationHost) {
        self.state.resize(host.count(), State::Idle);
        for (v, st) in self.state.iter_mut().enumerate() {
            if *st != State::Idle {
                continue;
            }
            let misplaced = host.stats(v).misplaced;
            if misplaced > 0 {
                self.planner.request(now_us, v as u64, misplaced);
                *st = State::Waiting;
            }
        }
    }

    /// The tick at `now_us` with the links' `utilization` (0..=1) since the last:
    /// migrations allowed to start start, progress is read, finished ones end.
    pub fn tick(&mut self, now_us: u64, utilization: f64, host: &mut impl MigrationHost) {
        self.state.resize(host.count(), State::Idle);
        while let Some(start) = self.planner.poll(now_us, utilization) {
            let v = start.id as usize;
            let scheme = match start.scheme {
                Scheme::Gradual => MigrationScheme::Gradual,
                Scheme::Instant => MigrationScheme::Instant,
            };
            if v >= self.state.len() {
                continue; // a VM the host no longer has
            }
            host.set_scheme(v, scheme);
            let stats = host.stats(v);
            self.state[v] = State::Active { held: stats.misplaced, moved: stats.moved, scheme };
        }
        for v in 0..self.state.len() {
            let State::Active { held, moved, scheme } = self.state[v] else { continue };
            let now = host.stats(v);
            let copied = now.moved.saturating_sub(moved);
            self.moved_blocks += copied;
            // (At the end everything the planner still counts is gone: it counted the
            // blocks misplaced when the VM asked, which can differ from when it started.)
            let gone = if now.misplaced == 0 { u64::MAX } else { held.saturating_sub(now.misplaced) };
            self.planner.moved(now_us, v as u64, gone, copied * self.block);
            if now.misplaced == 0 {
                host.set_scheme(v, MigrationScheme::Off);
                self.state[v] = State::Idle;
            } else {
                self.state[v] = State::Active { held: held - gone.min(held), moved: now.moved, scheme };
            }
        }
    }

    /// What migrations cost up to `now_us`.
    pub fn cost(&mut self, now_us: u64) -> MigrationCost {
        self.planner.cost(now_us)
    }

    /// Migrations waiting and running, and blocks moved.
    pub fn status(&self) -> MigrationStatus {
        let mut s = MigrationStatus { moved_blocks: self.moved_blocks, ..Default::default() };
        for st in &self.state {
            match st {
                State::Waiting => s.waiting += 1,
                State::Active { scheme: MigrationScheme::Gradual, .. } => s.gradual += 1,
                State::Active { .. } => s.instant += 1,
                State::Idle => {}
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// VMs whose misplaced blocks go down by what a started migration moves each tick.
    struct Fake {
        misplaced: Vec<u64>,
        moved: Vec<u64>,
        scheme: Vec<MigrationScheme>,
        per_tick: u64,
    }

    impl MigrationHost for Fake {
        fn count(&self) -> usize {
            self.misplaced.len()
        }
        fn stats(&self, id: usize) -> MigrationStats {
            MigrationStats { moved: self.moved[id], misplaced: self.misplaced[id] }
        }
        fn set_scheme(&mut self, id: usize, scheme: MigrationScheme) {
            self.scheme[id] = scheme;
        }
    }

    impl Fake {
        fn run(&mut self) {
            for v in 0..self.misplaced.len() {
                if self.scheme[v] != MigrationScheme::Off {
                    let n = self.per_tick.min(self.misplaced[v]);
                    self.misplaced[v] -= n;
                    self.moved[v] += n;
                }
            }
        }
    }

    #[test]
    fn migrations_start_at_the_planners_rate_move_everything_and_end() {
        let settings = PlanSettings { rate: 1.0, burst: 1, ..PlanSettings::default() };
        let mut d = MigrationDriver::new(settings, 4096).unwrap();
        let mut h =
            Fake { misplaced: vec![10, 0, 7], moved: vec![0; 3], scheme: vec![MigrationScheme::Off; 3], per_tick: 4 };
        d.after_allocation(0, &h);
        assert_eq!(d.status(), MigrationStatus { waiting: 2, ..Default::default() });
        let mut t = 0;
        while h.misplaced.iter().any(|&m| m > 0) || d.status().instant > 0 {
            d.tick(t, 0.0, &mut h);
            h.run();
            t += 250_000;
            assert!(t < 20_000_000, "stuck: {:?}", d.status());
        }
        d.tick(t, 0.0, &mut h);
        assert_eq!(d.moved_blocks, 17, "every misplaced block counted once");
        assert!(h.scheme.iter().all(|&s| s == MigrationScheme::Off), "every migration ended");
        let c = d.cost(t);
        assert_eq!((c.started_instant, c.started_gradual, c.finished), (2, 0, 2));
        assert_eq!(c.bytes_moved, 17 * 4096);
        // Congested links: the next one is Gradual.
        h.misplaced[1] = 3;
        d.after_allocation(t, &h);
        d.tick(t + 2_000_000, 0.9, &mut h);
        assert_eq!(h.scheme[1], MigrationScheme::Gradual);
        assert_eq!(d.status().gradual, 1);
    }
}
