//! The cache's write budget, shared across its vDisks by marginal hits per SSD write
//! (issue 57 point 5): one target for the whole SSD (its endurance rating, in bytes per
//! second or drive writes per day — ECI-Cache §I's concern), held by the controller of
//! `write_budget.rs` run on every vDisk's writes together, and the room it leaves for
//! admitted misses split among the vDisks by what an admitted block of each earns.
//!
//! Every vDisk's misses that its own admission lets in are governed here: a miss enters
//! with its vDisk's probability, its share of the room over its demand (its governed
//! misses per second × the block size). A block admitted this way is marked (one bit a
//! slot); each later hit on it counts for its vDisk. Admission is a random sample of the
//! vDisk's misses, so hits per admitted block estimate what admitting one more miss
//! would earn — the marginal value — where a vDisk's hit ratio would not (a VM whose hot
//! set is cached has many hits and misses that are never read again). At each period's
//! end the room goes first to every vDisk with misses, [`FLOOR`] of an equal part each
//! (so that a vDisk's value keeps being measured), then greedily by value
//! ([`split_room`], optimal for values that do not depend on the amount, checked against
//! brute force below). SSD writes the budget cannot refuse (write hits, prefetch,
//! write-back of dirty data) count against the target before the split.
//!
//! A vDisk's own `write-budget:RATE` still applies: its misses meet both. Written here:
//! the split is a sort and a loop on the engine's own counters, deterministic like the
//! rest of the engine (the same stream, the same decisions in the simulator and the
//! daemon).

use crate::block_admission::splitmix;
use crate::write_budget::{BudgetRate, WriteBudget};

/// The part of the room every vDisk with misses gets in equal shares before the rest
/// goes by value.
pub const FLOOR: f64 = 0.1;
/// Bounds of the correction a vDisk's probability carries (what its share asked for
/// over what the last period let in).
const MIN_CORRECTION: f64 = 0.5;
const MAX_CORRECTION: f64 = 4.0;
/// Weight of the newest period in a vDisk's smoothed hits and admissions (a value is
/// read over several periods: hits come after the admissions that earn them).
const VALUE_SMOOTHING: f64 = 0.25;

/// What the shared budget is doing (`Engine::write_budget`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SharedBudgetState {
    /// The target, bytes per second.
    pub target_bytes_per_sec: f64,
    /// SSD bytes every vDisk wrote since the budget was set.
    pub written_bytes: u64,
    /// Driver seconds from the first write or miss to the last.
    pub elapsed_s: f64,
    /// Whether the writes the budget cannot refuse alone exceeded the target in the
    /// last period.
    pub unreachable: bool,
    /// Budget left unspent in periods that let in every miss the vDisks' own admission
    /// did: a shortfall the streams caused (too few misses), not the controller.
    pub unspent_at_full_bytes: u64,
    /// Each vDisk's share, by vDisk id.
    pub vdisks: Vec<BudgetShare>,
}

/// One vDisk's part of the shared budget.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BudgetShare {
    /// The vDisk.
    pub vm: u32,
    /// The rate of admitted misses' writes it was given for this period, bytes per
    /// second (`None` before the first period ends: every miss enters).
    pub share_bytes_per_sec: Option<f64>,
    /// The probability one of its misses enters now.
    pub probability: f64,
    /// SSD bytes it wrote since the budget was set.
    pub written_bytes: u64,
    /// Misses the budget let in and kept out.
    pub admitted: u64,
    /// Misses it kept out.
    pub rejected: u64,
    /// Hits on blocks it let in.
    pub hits_on_admitted: u64,
    /// Smoothed hits per admitted block: the value the split ranks by (`None` before
    /// anything was admitted).
    pub value: Option<f64>,
}

#[derive(Debug, Clone)]
struct VmShare {
    p: f64,
    /// What the last period's probability was meant to let in over what it did (the
    /// demand falls as a vDisk's misses enter: its hot blocks stop missing), carried.
    correction: f64,
    share: f64,
    written: u64,
    period_asked: u64,
    period_admitted: u64,
    period_hits: u64,
    /// Governed misses per second in the last period alone (a demand that falls as
    /// blocks enter is overestimated by any average of older periods, and the budget
    /// underspent; measured on a Zipf reader).
    asked_rate: f64,
    hits: f64,
    admitted_smooth: f64,
    admitted: u64,
    rejected: u64,
    hits_total: u64,
}

impl Default for VmShare {
    fn default() -> Self {
        VmShare {
            p: 1.0,
            correction: 1.0,
            share: f64::INFINITY,
            written: 0,
            period_asked: 0,
            period_admitted: 0,
            period_hits: 0,
            asked_rate: 0.0,
            hits: 0.0,
            admitted_smooth: 0.0,
            admitted: 0,
            rejected: 0,
            hits_total: 0,
        }
    }
}

impl VmShare {
    fn value(&self) -> Option<f64> {
        (self.admitted_smooth > 0.0).then(|| self.hits / self.admitted_smooth)
    }
}

/// The shared budget (inside `Engine`); off until [`SharedBudget::set`].
#[derive(Debug, Clone, Default)]
pub(crate) struct SharedBudget {
    total: Option<WriteBudget>,
    block_bytes: u64,
    periods_seen: u64,
    vms: Vec<VmShare>,
    /// Per slot, one bit: the block in it entered through this budget.
    governed: Vec<u64>,
    /// The last miss asked about was let in: the allocation that follows is its.
    pending: bool,
    rng: u64,
}

impl SharedBudget {
    /// Sets the target (`None`: off) for a cache of `capacity_bytes` in blocks of
    /// `block_bytes`; everything measured starts afresh.
    pub(crate) fn set(&mut self, rate: Option<BudgetRate>, capacity_bytes: u64, block_bytes: u64) {
        *self = SharedBudget {
            total: rate.map(|r| WriteBudget::new(r.bytes_per_sec(capacity_bytes), block_bytes)),
            block_bytes,
            rng: 0x5ba4_ed00,
            ..Default::default()
        };
    }

    #[inline]
    pub(crate) fn on(&self) -> bool {
        self.total.is_some()
    }

    fn vm(&mut self, vm: u32) -> &mut VmShare {
        let v = vm as usize;
        if self.vms.len() <= v {
            self.vms.resize_with(v + 1, Default::default);
        }
        &mut self.vms[v]
    }

    /// Counts `bytes` `vm` wrote to the SSD at `now_ms`.
    #[inline]
    pub(crate) fn note_written(&mut self, vm: u32, now_ms: u32, bytes: u64) {
        let Some(t) = self.total.as_mut() else { return };
        t.note_written(now_ms, bytes); // ends the period when due
        let periods = t.periods();
        let s = self.vm(vm);
        s.written += bytes;
        self.split_if_ended(periods);
    }

    /// Whether a miss of `vm` that its own admission let in at `now_ms` enters.
    pub(crate) fn admit(&mut self, vm: u32, now_ms: u32) -> bool {
        let Some(t) = self.total.as_mut() else { return true };
        let periods = t.tick(now_ms);
        self.split_if_ended(periods);
        let draw = (splitmix(&mut self.rng) >> 11) as f64 / (1u64 << 53) as f64;
        let spent = self.total.as_ref().expect("on").first_period_spent();
        let s = self.vm(vm);
        let ok = draw < s.p && !spent;
        s.period_asked += 1;
        s.period_admitted += ok as u64;
        if ok {
            s.admitted += 1;
        } else {
            s.rejected += 1;
        }
        self.total.as_mut().expect("on").count_asked(ok);
        self.pending = ok;
        ok
    }

    /// Whether the last miss asked about was let in and not yet given a slot; cleared.
    /// The engine's `allocate` takes it first thing (an allocation follows its miss's
    /// admission at once), so a miss that finds no slot leaves nothing behind.
    #[inline]
    pub(crate) fn take_pending(&mut self) -> bool {
        std::mem::take(&mut self.pending)
    }

    /// Slot `s` now holds a newly inserted block; `governed`: one this budget let in.
    #[inline]
    pub(crate) fn inserted(&mut self, s: u32, governed: bool) {
        if self.on() {
            self.set_bit(s, governed);
        }
    }

    /// A hit of `vm` on slot `s`.
    #[inline]
    pub(crate) fn touched(&mut self, vm: u32, s: u32) {
        if self.bit(s) {
            let v = self.vm(vm);
            v.period_hits += 1;
            v.hits_total += 1;
        }
    }

    /// Slot `s` was emptied.
    #[inline]
    pub(crate) fn forgotten(&mut self, s: u32) {
        if self.on() {
            self.set_bit(s, false);
        }
    }

    /// Slot `s`'s block moved to slot `d`.
    pub(crate) fn moved(&mut self, s: u32, d: u32) {
        if self.on() {
            let b = self.bit(s);
            self.set_bit(s, false);
            self.set_bit(d, b);
        }
    }

    fn bit(&self, s: u32) -> bool {
        self.governed.get(s as usize / 64).is_some_and(|w| w >> (s % 64) & 1 == 1)
    }

    fn set_bit(&mut self, s: u32, on: bool) {
        let w = s as usize / 64;
        if self.governed.len() <= w {
            if !on {
                return;
            }
            self.governed.resize(w + 1, 0);
        }
        let m = 1u64 << (s % 64);
        if on {
            self.governed[w] |= m;
        } else {
            self.governed[w] &= !m;
        }
    }

    /// After the total's controller ended a period: each vDisk's rates and value, and the
    /// room split among them.
    fn split_if_ended(&mut self, periods: u64) {
        if periods == self.periods_seen {
            return;
        }
        self.periods_seen = periods;
        let (dt, room) = self.total.as_ref().expect("on").room();
        let block = self.block_bytes;
        for s in &mut self.vms {
            // A probability below 1 that let in less than its share: more next time (and
            // the reverse), within bounds; at 1 the demand itself was short.
            if s.share.is_finite() && s.p < 1.0 && s.period_admitted > 0 {
                let ratio = s.share * dt / (s.period_admitted * block) as f64;
                s.correction = (s.correction * ratio.sqrt()).clamp(MIN_CORRECTION, MAX_CORRECTION);
            }
            s.asked_rate = s.period_asked as f64 / dt;
            s.hits += VALUE_SMOOTHING * (s.period_hits as f64 - s.hits);
            s.admitted_smooth += VALUE_SMOOTHING * (s.period_admitted as f64 - s.admitted_smooth);
            s.period_asked = 0;
            s.period_admitted = 0;
            s.period_hits = 0;
        }
        let wants: Vec<(f64, f64)> =
            self.vms.iter().map(|s| (s.asked_rate * block as f64, s.value().unwrap_or(f64::INFINITY))).collect();
        let shares = split_room(room.max(0.0), &wants);
        for ((s, share), (demand, _)) in self.vms.iter_mut().zip(shares).zip(wants) {
            s.share = share;
            s.p = if demand > 0.0 { (share / demand * s.correction).min(1.0) } else { 1.0 };
        }
    }

    /// What the budget is doing (`None`: off).
    pub(crate) fn state(&self) -> Option<SharedBudgetState> {
        let t = self.total.as_ref()?.state();
        Some(SharedBudgetState {
            target_bytes_per_sec: t.target_bytes_per_sec,
            written_bytes: t.written_bytes,
            elapsed_s: t.elapsed_s,
            unreachable: t.unreachable,
            unspent_at_full_bytes: t.unspent_at_full_bytes,
            vdisks: (0..self.vms.len() as u32).filter_map(|v| self.share(v)).collect(),
        })
    }

    /// `vm`'s part (`None`: off, or a vDisk that neither wrote nor missed).
    pub(crate) fn share(&self, vm: u32) -> Option<BudgetShare> {
        self.total.as_ref()?;
        let s = self.vms.get(vm as usize)?;
        (s.written > 0 || s.admitted + s.rejected > 0).then(|| BudgetShare {
            vm,
            share_bytes_per_sec: s.share.is_finite().then_some(s.share),
            probability: s.p,
            written_bytes: s.written,
            admitted: s.admitted,
            rejected: s.rejected,
            hits_on_admitted: s.hits_total,
            value: s.value(),
        })
    }
}

/// Splits `room` (bytes per second of admitted misses' writes) among vDisks that each
/// want `demand` at `value` hits per byte: first [`FLOOR`] of the room in equal parts
/// among those with a demand (each at most its demand), then the rest greedily by
/// value, highest first (ties: lower index). Returns each one's share.
pub(crate) fn split_room(room: f64, wants: &[(f64, f64)]) -> Vec<f64> {
    let asking = wants.iter().filter(|w| w.0 > 0.0).count();
    if room.is_infinite() {
        return wants.iter().map(|_| f64::INFINITY).collect();
    }
    let part = if asking > 0 { FLOOR * room / asking as f64 } else { 0.0 };
    let mut shares: Vec<f64> = wants.iter().map(|&(d, _)| d.min(part)).collect();
    let mut left = room - shares.iter().sum::<f64>();
    let mut order: Vec<usize> = (0..wants.len()).collect();
    order.sort_by(|&a, &b| wants[b].1.total_cmp(&wants[a].1).then(a.cmp(&b)));
    for i in order {
        if left <= 0.0 {
            break;
        }
        let more = (wants[i].0 - shares[i]).min(left);
        shares[i] += more;
        left -= more;
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every allocation in whole units with each share between its floor and its demand
    /// and the total within the room: the best objective (Σ value × share).
    fn brute(room: u32, floors: &[u32], wants: &[(u32, u32)]) -> u64 {
        fn go(i: usize, left: u32, floors: &[u32], wants: &[(u32, u32)]) -> Option<u64> {
            if i == wants.len() {
                return Some(0);
            }
            (floors[i]..=wants[i].0.min(floors[i] + left))
                .filter_map(|a| {
                    let rest = go(i + 1, left - (a - floors[i]), floors, wants)?;
                    Some(rest + u64::from(a) * u64::from(wants[i].1))
                })
                .max()
        }
        go(0, room - floors.iter().sum::<u32>(), floors, wants).expect("the floors fit")
    }

    proptest! {
        /// The split never gives more than the room or a vDisk more than its demand, gives
        /// each vDisk with a demand its floor, and reaches the best objective the brute
        /// force finds over whole units.
        #[test]
        fn the_split_is_the_best_over_whole_units(
            wants in proptest::collection::vec((0u32..12, 0u32..6), 1..5),
            room10 in 0u32..6,
        ) {
            let asking = wants.iter().filter(|w| w.0 > 0).count() as u32;
            // A room whose floor part is whole units: 10 × asking × k.
            let room = 10 * asking.max(1) * room10;
            let f: Vec<(f64, f64)> = wants.iter().map(|&(d, v)| (f64::from(d), f64::from(v))).collect();
            let shares = split_room(f64::from(room), &f);
            let part = room / 10 / asking.max(1);
            let floors: Vec<u32> = wants.iter().map(|w| w.0.min(part)).collect();
            let total: f64 = shares.iter().sum();
            prop_assert!(total <= f64::from(room) + 1e-9);
            for (i, s) in shares.iter().enumerate() {
                prop_assert!(*s <= f64::from(wants[i].0) + 1e-9 && *s >= f64::from(floors[i]) - 1e-9);
            }
            let ours: f64 = shares.iter().zip(&wants).map(|(s, w)| s * f64::from(w.1)).sum();
            prop_assert!((ours - brute(room, &floors, &wants) as f64).abs() < 1e-6, "{shares:?}");
        }
    }

    fn engine(slots: u64, rate: &str) -> crate::Engine {
        let cfg =
            crate::EngineConfig { partition: crate::PartitionMode::Shared, ..crate::EngineConfig::with_slots(slots) };
        let mut e = crate::Engine::new(cfg).unwrap();
        e.set_write_budget(Some(BudgetRate::parse(rate).unwrap()));
        e
    }

    /// In the engine: two VMs miss at the same rate; VM 0 rereads what it missed (each
    /// block twice), VM 1 never rereads. With a budget of half their writes, VM 0 gets
    /// nearly all of it and VM 1 its floor; the total holds the target within 5%.
    #[test]
    fn the_vdisk_whose_admitted_blocks_are_reread_gets_the_budget() {
        use cachevisor_trace::{Op, Request};
        // 1,000 misses a second per VM, 4 KiB each: 8,000,000 B/s in all if admitted.
        let mut e = engine(1 << 16, "1953KiB/s");
        let mut out = crate::Output::default();
        let mut next = [0u64, 1 << 30];
        let secs = 60u64;
        for ms in 0..secs * 1000 {
            for vm in 0..2u32 {
                let b = next[vm as usize];
                next[vm as usize] += 1;
                let r = Request { time_ns: ms * 1_000_000, vm, op: Op::Read, offset: b * 4096, len: 4096 };
                e.access(ms * 1_000_000, &r, &mut out);
                if vm == 0 {
                    e.access(ms * 1_000_000, &r, &mut out);
                }
            }
        }
        let st = e.write_budget().unwrap();
        let want = 1953.0 * 1024.0 * secs as f64;
        let written = st.written_bytes as f64;
        assert!((written - want).abs() < 0.05 * want, "wrote {written}, want {want}");
        let (a, b) = (st.vdisks[0], st.vdisks[1]);
        assert!(a.value.unwrap() > 0.45 && b.value.unwrap() < 0.01, "{a:?} {b:?}");
        assert!(a.written_bytes > 5 * b.written_bytes, "{a:?} {b:?}");
        assert!(b.admitted > 0, "the floor keeps measuring the other VM");
        assert_eq!(e.entry_state(1).budget_share, Some(b));
    }
    /// A reader whose misses fall as its hot blocks enter (Zipf-like over 8,192 blocks,
    /// 20 a millisecond) beside a scan (8 new blocks a millisecond) under 2 MiB/s for
    /// 8 s: the run's writes hold the target within 5% although the reader's demand
    /// keeps falling (the per-vDisk correction), and the reader gets most of it.
    #[test]
    fn a_falling_demand_still_spends_the_budget() {
        use cachevisor_trace::{Op, Request};
        let mut e = engine(4096, "2MiB/s");
        let mut out = crate::Output::default();
        let (mut rng, mut scan) = (1u64, 0u64);
        for ms in 0..8000u64 {
            let mut read = |e: &mut crate::Engine, vm: u32, b: u64| {
                let r = Request { time_ns: ms * 1_000_000, vm, op: Op::Read, offset: b * 4096, len: 4096 };
                e.access(ms * 1_000_000, &r, &mut out);
            };
            for _ in 0..20 {
                let u = (splitmix(&mut rng) >> 11) as f64 / (1u64 << 53) as f64;
                read(&mut e, 0, (8192f64.powf(u) as u64).min(8191));
            }
            for _ in 0..8 {
                read(&mut e, 1, scan);
                scan += 1;
            }
        }
        let st = e.write_budget().unwrap();
        let want = 2.0 * 1048576.0 * 8.0;
        let written = st.written_bytes as f64;
        assert!((written - want).abs() < 0.05 * want, "wrote {written}, want {want}");
        let (a, b) = (st.vdisks[0], st.vdisks[1]);
        assert!(a.written_bytes > 5 * b.written_bytes && a.value > b.value, "{a:?} {b:?}");
    }
}
