//! The controller's interval, owned here for every driver: its length (driver time, or a
//! number of requests run), its sampling points (S-CAVE samples rECS in periods spread
//! over each window, §IV-B footnote 3: the k-th of n at k/n of it) and each VM's window
//! counters (requests, block accesses, block hits), counted as requests run. The engine
//! emits [`Event::Sample`] at each sampling point and [`Event::Interval`] at each end; a
//! driver hands both to the policy controller, which takes the counters
//! ([`Engine::take_window_counts`]). So the simulator and the daemon see the same windows
//! cut at the same points, and neither counts on its own.

use crate::engine::Engine;
use crate::inflight::{Event, Flight};
use crate::output::BlockOutcome;
use cachevisor_trace::VmId;

/// One VM's counters over a window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct WindowCounts {
    /// Requests run.
    pub requests: u64,
    /// Block accesses.
    pub accesses: u64,
    /// Of them, hits.
    pub hits: u64,
}

/// The interval's clock and counters (inside [`Engine`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct IntervalClock {
    /// Length in driver time (ns) or, when `by_requests`, in requests run; 0: none.
    length: u64,
    by_requests: bool,
    /// Sampling points per interval (the last is the interval's end).
    samples: u32,
    /// Where the current interval started (ns, or requests run), and intervals ended.
    start: u64,
    index: u64,
    /// Sampling points of the current interval passed.
    taken: u32,
    /// Requests run so far (request-length intervals).
    requests: u64,
    /// The next point (a sample or the end), computed when the clock moves: a request
    /// asks for it every time, and it takes a 128-bit division.
    next: Option<u64>,
    counts: Vec<WindowCounts>,
}

impl IntervalClock {
    /// Sets the interval (`length` ns or, `by_requests`, requests; 0: none) with
    /// `samples` sampling points, the first interval starting at `start`.
    pub(crate) fn set(&mut self, length: u64, by_requests: bool, samples: u32, now_ns: u64) {
        self.length = length;
        self.by_requests = by_requests;
        self.samples = samples;
        self.start = if by_requests { self.requests } else { now_ns };
        self.taken = 0;
        self.next = self.compute_next();
    }

    /// When the next point (a sample or the end) is due, in the interval's unit.
    #[inline]
    fn next_point(&self) -> Option<u64> {
        self.next
    }

    /// [`Self::next_point`] from the clock's state.
    fn compute_next(&self) -> Option<u64> {
        if self.length == 0 {
            return None;
        }
        let n = u64::from(self.samples.max(1));
        let k = u64::from(self.taken) + 1;
        let offset = if k < n { (u128::from(self.length) * u128::from(k) / u128::from(n)) as u64 } else { self.length };
        Some(self.start.saturating_add(offset))
    }

    /// The next time a time-length interval needs the driver.
    pub(crate) fn next_due_ns(&self) -> Option<u64> {
        if self.by_requests {
            None
        } else {
            self.next_point()
        }
    }

    /// Emits every point due by `now` (ns, or requests run) in order: samples, then the
    /// end, for as many intervals as ended.
    fn emit_due(&mut self, now: u64, now_ns: u64, flight: &mut Flight) {
        while let Some(at) = self.next_point().filter(|&at| at <= now) {
            let at_ns = if self.by_requests { now_ns } else { at };
            let n = self.samples.max(1);
            if self.taken + 1 < n {
                self.taken += 1;
                flight.push_event(Event::Sample { at_ns, index: self.index, k: self.taken, of: n });
            } else {
                flight.push_event(Event::Interval { at_ns, index: self.index });
                self.index += 1;
                self.start = at;
                self.taken = 0;
            }
            self.next = self.compute_next();
        }
    }

    /// A request of `vm` ran with these block outcomes.
    #[inline]
    fn count(&mut self, vm: VmId, blocks: &[BlockOutcome]) {
        let v = vm as usize;
        if self.counts.len() <= v {
            self.counts.resize(v + 1, WindowCounts::default());
        }
        let c = &mut self.counts[v];
        c.requests += 1;
        c.accesses += blocks.len() as u64;
        c.hits += blocks.iter().filter(|b| b.hit).count() as u64;
        self.requests += 1;
    }
}

impl Engine {
    /// Each VM's counters since the last call (by VM id, `vms` long at least), reset.
    pub fn take_window_counts(&mut self, vms: usize) -> Vec<WindowCounts> {
        let mut c = std::mem::take(&mut self.interval.counts);
        c.resize(c.len().max(vms), WindowCounts::default());
        c
    }

    /// Counts a request `access` ran (`blocks`: its outcomes) at driver time `now_ns`;
    /// a request-length interval's points it reaches are emitted.
    #[inline]
    pub(crate) fn count_request(&mut self, vm: VmId, blocks: &[BlockOutcome], now_ns: u64) {
        let i = &mut self.interval;
        i.count(vm, blocks);
        if i.by_requests && i.length > 0 {
            let now = i.requests;
            i.emit_due(now, now_ns, &mut self.flight);
        }
    }

    /// Emits a time-length interval's points due by `now_ns` ([`Self::handle_timeout`]).
    pub(crate) fn interval_due(&mut self, now_ns: u64) {
        if !self.interval.by_requests {
            self.interval.emit_due(now_ns, now_ns, &mut self.flight);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Engine, EngineConfig, Event, Output, Schedule};
    use cachevisor_trace::{Op, Request};

    fn read(e: &mut Engine, now: u64, b: u64) {
        let mut out = Output::default();
        e.access(now, &Request { time_ns: now, vm: 0, op: Op::Read, offset: b * 4096, len: 4096 }, &mut out);
    }

    fn events(e: &mut Engine) -> Vec<Event> {
        std::iter::from_fn(|| e.poll_event()).collect()
    }

    #[test]
    fn samples_fall_at_k_of_n_of_each_interval_and_a_late_driver_gets_them_all_in_order() {
        let mut e = Engine::new(EngineConfig::with_slots(8)).unwrap();
        e.set_schedule(100, Schedule { interval_ns: 1000, samples: 4, ..Default::default() });
        assert_eq!(e.poll_timeout(), Some(350));
        e.handle_timeout(700);
        let s = |at_ns, index, k| Event::Sample { at_ns, index, k, of: 4 };
        assert_eq!(events(&mut e), [s(350, 0, 1), s(600, 0, 2)]);
        e.handle_timeout(1400);
        assert_eq!(events(&mut e), [s(850, 0, 3), Event::Interval { at_ns: 1100, index: 0 }, s(1350, 1, 1)]);
        assert_eq!(e.poll_timeout(), Some(1600));
    }

    #[test]
    fn a_request_length_interval_ends_after_its_requests_with_their_counts() {
        let cfg = EngineConfig { partition: crate::PartitionMode::Shared, ..EngineConfig::with_slots(8) };
        let mut e = Engine::new(cfg).unwrap();
        e.set_schedule(0, Schedule { interval_requests: 4, samples: 2, ..Default::default() });
        assert_eq!(e.poll_timeout(), None, "no timer: requests drive it");
        for (i, b) in [1, 1, 2, 1].into_iter().enumerate() {
            read(&mut e, 10 * i as u64, b);
        }
        assert_eq!(
            events(&mut e),
            [Event::Sample { at_ns: 10, index: 0, k: 1, of: 2 }, Event::Interval { at_ns: 30, index: 0 }]
        );
        let c = e.take_window_counts(2);
        assert_eq!(c[0], super::WindowCounts { requests: 4, accesses: 4, hits: 2 });
        assert_eq!(c[1], super::WindowCounts::default(), "a VM with nothing yet");
        assert_eq!(e.take_window_counts(1)[0], super::WindowCounts::default(), "taken: reset");
    }
}
