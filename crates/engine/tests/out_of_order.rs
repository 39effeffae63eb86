//! The engine's asynchronous face checked against a versioned model of the devices, with
//! requests concurrent, device ops completed in random order, and random failures (torn
//! writes included). Every sector carries the version of the client write that produced
//! it. Checked: a read's reply holds, for each sector, the last acknowledged write's
//! version (or one of the failed writes after it, whose data is undefined); the cache
//! store never serves a sector of another block; a staged write writes what its source
//! read returned; after everything retires and the cache is flushed, the backing stores
//! hold every acknowledged write; structural invariants hold after every step.
//!
//! Isolation (`disk_range.rs`): VM 0's disk is 64 sectors, VM 1's ends inside its last
//! block, VM 2's has no size (the block key's range); `Wild` steps draw block ids across
//! the whole u64 range (2^48 + a small block would alias another VM's block in a key),
//! and requests, discards and prewarm loads with them are refused or clipped — a read of
//! one VM never returns a sector another VM wrote (the model checks every cache read).

use cachevisor_engine::data_model::DataModel;
use cachevisor_engine::*;
use cachevisor_trace::{Op, Request};
use proptest::prelude::*;

mod lending;
mod model_harness;
use lending::{Lends, RUN};
use model_harness::{cases, trace};

const SECTORS_PER_DISK: u64 = 64;

#[derive(Debug, Clone)]
enum Step {
    /// A client request.
    Io { vm: u32, write: bool, sector: u64, count: u64 },
    /// Complete the `pick`-th op in flight (modulo), failing it when `fail`, tearing a
    /// failed write after `torn` sectors.
    Complete { pick: usize, fail: bool, torn: u64 },
    /// A background job.
    Job(JobKind),
    /// A discard (TRIM) of whole sectors.
    Discard { vm: u32, sector: u64, count: u64 },
    /// A request, discard or prewarm at a block drawn across the u64 range.
    Wild { vm: u32, what: u8, block: u64, sector: u64, count: u64 },
    /// Local-store slots `2 * run`, `2 * run + 1` withheld (lent out of the cache, as to a
    /// vSSD region; with several devices, runs 4 and 5 are the second and third device
    /// whole, removed online); once the engine says they are empty, the model overwrites them with
    /// someone else's bytes and fails any engine op on them; with `moving`, the run's
    /// clean blocks move to free slots outside it first (a shrink).
    Lend { run: u32, moving: bool },
    /// A lent run (the `run`-th, modulo) given back.
    Return { run: usize },
    /// Cases with several cache devices: the last one fails every op from now on (it
    /// is dropped at the error threshold: `device_failure.rs`).
    DeviceDown,
    /// Cases with several cache devices: one more device of 2 slots joins (at most two
    /// more: `Engine::add_device`, its slots returned at once, as the daemon does once the
    /// new layout is durable).
    AddDevice,
}

/// Block ids across the u64 range: those that alias small blocks in a 48-bit key, the key
/// range's edge, the top of u64, and anything.
fn wild_block() -> impl Strategy<Value = u64> {
    prop_oneof![
        (0u64..8).prop_map(|b| (1 << 48) + b),
        (0u64..8).prop_map(|b| (1 << 48) - 1 - b),
        (0u64..8).prop_map(|b| (u64::MAX >> 12) - b),
        (0u64..8).prop_map(|b| u64::MAX - b),
        any::<u64>(),
    ]
}

#[derive(Debug, Clone, Copy)]
enum JobKind {
    Target {
        vm: u32,
        slots: u64,
    },
    /// A paced shrink or grow (`set_target_paced`): other VMs' misses take its blocks.
    PacedTarget {
        vm: u32,
        slots: u64,
    },
    /// A lazy write-policy change (`set_write_policy_lazy`): dirty blocks stay dirty.
    LazyPolicy {
        vm: u32,
        policy: WritePolicy,
    },
    Flush {
        vm: Option<u32>,
    },
    Destage {
        vm: u32,
        block: u64,
    },
    Clean {
        free: u64,
    },
    /// A prewarm load (`prewarm_load`) of `len` blocks from `block`.
    Prewarm {
        vm: u32,
        block: u64,
        len: u32,
    },
    /// Lent-region cases: `vm`'s remote shares become `shares[pick]` and its migration
    /// scheme `scheme` (ELICA §3.6: blocks at a store above its share move).
    Shares {
        vm: u32,
        pick: usize,
        scheme: MigrationScheme,
    },
    /// Lent-region cases: Instant Migration's bulk copy of up to `max` blocks.
    Migrate {
        vm: u32,
        max: u64,
    },
}

/// Remote shares a `Shares` step picks from (of a VM's 3 slots; lenders 1 and 3).
const SHARES: [&[(u16, u64)]; 5] = [&[], &[(1, 2)], &[(3, 1)], &[(1, 1), (3, 1)], &[(1, 2), (3, 1)]];

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u32..3, any::<bool>(), 0..SECTORS_PER_DISK, 1u64..12).prop_map(|(vm, write, sector, count)| {
            Step::Io { vm, write, sector, count: count.min(SECTORS_PER_DISK - sector) }
        }),
        10 => (any::<usize>(), prop::bool::weighted(0.08), 0u64..9)
            .prop_map(|(pick, fail, torn)| Step::Complete { pick, fail, torn }),
        1 => (0u32..3, 0u64..6).prop_map(|(vm, slots)| Step::Job(JobKind::Target { vm, slots })),
        1 => (0u32..3, 0u64..6).prop_map(|(vm, slots)| Step::Job(JobKind::PacedTarget { vm, slots })),
        1 => (0u32..3, prop::sample::select(WritePolicy::ALL.to_vec()))
            .prop_map(|(vm, policy)| Step::Job(JobKind::LazyPolicy { vm, policy })),
        1 => prop::option::of(0u32..3).prop_map(|vm| Step::Job(JobKind::Flush { vm })),
        1 => (0u32..3, 0..SECTORS_PER_DISK / 8).prop_map(|(vm, block)| Step::Job(JobKind::Destage { vm, block })),
        1 => (0u64..9).prop_map(|free| Step::Job(JobKind::Clean { free })),
        2 => (0u32..3, 0..SECTORS_PER_DISK / 8, 1u32..5)
            .prop_map(|(vm, block, len)| Step::Job(JobKind::Prewarm { vm, block, len })),
        1 => (0u32..3, 0..SHARES.len(), prop::sample::select(vec![MigrationScheme::Off, MigrationScheme::Gradual, MigrationScheme::Instant]))
            .prop_map(|(vm, pick, scheme)| Step::Job(JobKind::Shares { vm, pick, scheme })),
        2 => (0u32..3, 1u64..4).prop_map(|(vm, max)| Step::Job(JobKind::Migrate { vm, max })),
        1 => (0u32..3, 0..SECTORS_PER_DISK, 1u64..12).prop_map(|(vm, sector, count)| {
            Step::Discard { vm, sector, count: count.min(SECTORS_PER_DISK - sector) }
        }),
        2 => (0u32..3, 0u8..4, wild_block(), 0u64..8, 1u64..12)
            .prop_map(|(vm, what, block, sector, count)| Step::Wild { vm, what, block, sector, count }),
        1 => (0u32..6, any::<bool>()).prop_map(|(run, moving)| Step::Lend { run, moving }),
        1 => any::<usize>().prop_map(|run| Step::Return { run }),
        1 => Just(Step::DeviceDown),
        1 => Just(Step::AddDevice),
    ]
}

struct Driver {
    e: Engine,
    w: DataModel,
    flying: Vec<DeviceOp>,
    /// Runs withheld (first slot), and whether the model lent them out yet.
    lending: lending::Lending,
    /// A cache device that fails every op (`Step::DeviceDown`).
    down: Option<u16>,
}

lending::impl_lends!(Driver, w);

impl Driver {
    /// Takes the engine's new ops and handles its events.
    fn pump(&mut self) -> Result<(), String> {
        while let Some(op) = self.e.poll_op() {
            trace(|| format!("issue {op:?}"));
            self.flying.push(op);
        }
        while let Some(ev) = self.e.poll_event() {
            trace(|| format!("event {ev:?}"));
            self.w.event(&ev)?;
        }
        Ok(())
    }

    fn submit(&mut self, now: u64, req: Request) -> ReqId {
        let id = self.e.submit(now, &req);
        trace(|| format!("submit {id} {req:?}"));
        self.w.submitted(id, req);
        id
    }

    /// Submits `req` (a discard when `discard`) through the model, or — outside its vDisk
    /// — checks that the engine refuses it at once, touching nothing.
    fn submit_checked(&mut self, now: u64, req: Request, discard: bool) -> Result<(), String> {
        if self.e.check_range(req.vm, req.offset, req.len as u64).is_ok() {
            if discard {
                let id = self.e.submit_discard(now, req.vm, req.offset, req.len);
                self.w.discard_submitted(id, req);
            } else {
                self.submit(now, req);
            }
            return Ok(());
        }
        self.pump()?;
        let before = self.flying.len();
        let id =
            if discard { self.e.submit_discard(now, req.vm, req.offset, req.len) } else { self.e.submit(now, &req) };
        let refused = self.e.poll_event();
        let retired = self.e.poll_event();
        let want = Some(Event::Reply { req: id, result: Err(Failure::OutOfRange), blocks: Vec::new() });
        if refused != want || retired != Some(Event::Retired { req: id, failed: false }) {
            return Err(format!("{req:?} outside its vDisk: {refused:?}, {retired:?}"));
        }
        self.pump()?;
        if self.flying.len() != before {
            return Err(format!("{req:?} outside its vDisk started device ops"));
        }
        Ok(())
    }

    fn complete(&mut self, now: u64, i: usize, fail: bool, torn: u64) -> Result<(), String> {
        let op = self.flying.swap_remove(i);
        let fail = fail || self.down.is_some_and(|st| op.loc == Location::Cache(st));
        trace(|| format!("complete {op:?} fail={fail}"));
        self.w.execute(&op, fail, torn)?;
        self.e.handle_completion(now, op.handle(), if fail { Err(Failure::Io) } else { Ok(()) });
        Ok(())
    }
}

/// One case's engine settings.
#[derive(Debug, Clone, Copy)]
struct Setup {
    partition: PartitionMode,
    fill: FillMode,
    kind: ReplacementKind,
    timers: bool,
    protect: bool,
    remote: bool,
    /// Without `remote`: two more cache devices of the host beside the 8 local slots
    /// (2 slots each, one allocation, `device_placement.rs`; a lent run is on the first
    /// device, as vSSD regions are, or one of the others whole, as a device removed
    /// online is).
    devices: bool,
    /// An error threshold of 2 (`set_error_threshold`): VMs pass through after device
    /// errors (with several devices, the device is dropped instead).
    errors: bool,
    /// With `devices`: dirty data mirrored on two devices (`set_mirror_dirty`): the failing
    /// device loses nothing.
    mirror: bool,
    /// Write-back ahead of eviction's window (0: off).
    ahead: u32,
    /// ELICA-Traffic's choice at a full partition too (lent-region cases).
    turnover: bool,
    /// The RAM tier: 0 off, else its slots (filled on every SSD hit, or with
    /// `ram_second`, on the second).
    ram: u64,
    ram_second: bool,
}

fn run(steps: &[Step], setup: Setup) -> Result<(), String> {
    let Setup {
        partition,
        fill,
        kind,
        timers,
        protect,
        remote,
        devices,
        errors,
        mirror,
        ahead,
        turnover,
        ram,
        ram_second,
    } = setup;
    // With `remote`, half the 8 slots are lent by two other nodes of a cluster (ELICA).
    let (slots, lent) = if remote { (4, vec![StoreSpec::lent(1, 2), StoreSpec::lent(3, 2)]) } else { (8, Vec::new()) };
    let cfg = EngineConfig { partition, fill, replacement: kind, stores: lent, ..EngineConfig::with_slots(slots) };
    let cfg = if devices && !remote { cfg.over_devices(&[8, 2, 2]) } else { cfg };
    let w = DataModel::new(cfg.clone());
    let mut d = Driver { e: Engine::new(cfg).unwrap(), w, flying: Vec::new(), lending: Default::default(), down: None };
    if errors || (devices && !remote) {
        // A VM passes through after 2 device errors; with several cache devices, a
        // failing device is dropped after 2 instead.
        d.e.set_error_threshold(2);
    }
    let mirror = mirror && devices && !remote;
    if mirror {
        d.e.set_mirror_dirty(true).unwrap();
    }
    // Write-back ahead of eviction: its jobs start as backing stores go idle, among the
    // random completions and failures.
    d.e.set_writeback_ahead(ahead);
    d.e.set_traffic_turnover(turnover);
    // Clean copies of hot blocks in RAM, dropped as their slots change, its ops among the
    // random completions and failures.
    d.e.set_ram_tier(ram, if ram_second { RamFill::SecondHit } else { RamFill::EveryHit });
    // Prewarmed blocks protected from eviction for 50 steps (or until touched).
    d.e.set_prewarm_protection(protect.then_some(50));
    let mut out = Output::default();
    d.e.set_disk_size(0, SECTORS_PER_DISK * 512).unwrap();
    d.e.set_disk_size(1, SECTORS_PER_DISK * 512 - 700).unwrap();
    for vm in 0..3 {
        d.e.set_target(vm, 3, &mut out);
        if remote {
            // VM v has v of its 3 slots lent (ELICA's remote share): VM 1 by node 3 only,
            // VM 2 one slot by each lender.
            let shares: &[(u16, u64)] = match vm {
                0 => &[],
                1 => &[(3, 1)],
                _ => &[(1, 1), (3, 1)],
            };
            d.e.set_remote_shares(vm, shares).unwrap();
        }
    }
    if timers {
        // The flusher and the cleaner run as background jobs among the requests (a dirty
        // target of 0: at its full rate under load, not the PI controller's trickle).
        let flusher = Flusher { period_ns: 3000, blocks_per_period: 2, dirty_target: 0.0 };
        d.e.set_schedule(0, Schedule { interval_ns: 5000, flusher: Some(flusher), ..Default::default() });
        d.e.set_cleaner(Some((1, 3)));
    }
    for (i, st) in steps.iter().enumerate() {
        let now = i as u64 * 1000;
        let ctx = |m: String| format!("step {i} {st:?}: {m}");
        d.e.handle_timeout(now);
        match *st {
            Step::Io { vm, write, sector, count } => {
                let op = if write { Op::Write } else { Op::Read };
                let req = Request { time_ns: now, vm, op, offset: sector * 512, len: (count * 512) as u32 };
                d.submit_checked(now, req, false).map_err(ctx)?;
            }
            Step::Discard { vm, sector, count } => {
                let req = Request { time_ns: now, vm, op: Op::Write, offset: sector * 512, len: (count * 512) as u32 };
                d.submit_checked(now, req, true).map_err(ctx)?;
            }
            Step::Wild { vm, what, block, sector, count } => {
                let offset = block.wrapping_mul(4096).wrapping_add(sector * 512);
                let op = if what == 1 { Op::Write } else { Op::Read };
                let req = Request { time_ns: now, vm, op, offset, len: (count * 512) as u32 };
                match what {
                    0 | 1 => d.submit_checked(now, req, false).map_err(ctx)?,
                    2 => d.submit_checked(now, req, true).map_err(ctx)?,
                    _ => {
                        let (blocks, len) = (d.e.disk_blocks(vm), count as u32);
                        let mut o = PrewarmOutcome::default();
                        d.e.submit_job(|e, out| o = e.prewarm_load(vm, block, len, out));
                        let past = block.saturating_add(len as u64).saturating_sub(blocks.max(block));
                        if o.out_of_range as u64 != past.min(len as u64) {
                            return Err(ctx(format!("{o:?}: {past} blocks past the end of {blocks}")));
                        }
                    }
                }
            }
            Step::Lend { run, moving } => {
                // With several devices, runs 4 and 5 are devices 1 and 2 whole: a device
                // removed online (`cache remove`), its bytes then someone else's.
                let devices_too = if devices && !remote { 4 } else { 0 };
                if (run + 1) * RUN <= slots as u32 + devices_too {
                    lending::lend(&mut d.e, &mut d.lending, run * RUN, moving).map_err(ctx)?;
                }
            }
            Step::Return { run } => {
                for s in lending::give_back(&mut d.e, &mut d.lending, run) {
                    d.w.unlend(s);
                }
            }
            Step::DeviceDown => {
                if devices && !remote {
                    d.down = Some(2);
                }
            }
            Step::AddDevice => {
                if devices && !remote && d.e.layout().len() < 5 {
                    let (_, first) = d.e.add_device(2).map_err(ctx)?;
                    d.w.relayout(d.e.layout().clone());
                    d.e.return_slots(first, 2);
                }
            }
            Step::Complete { pick, fail, torn } => {
                if !d.flying.is_empty() {
                    let n = d.flying.len();
                    d.complete(now, pick % n, fail, torn).map_err(ctx)?;
                }
            }
            Step::Job(JobKind::Shares { .. } | JobKind::Migrate { .. })
                if !remote || partition != PartitionMode::Static => {}
            Step::Job(j) => {
                d.e.submit_job(|e, out| match j {
                    JobKind::Shares { vm, pick, scheme } => {
                        e.set_remote_shares(vm, SHARES[pick]).unwrap();
                        e.set_migration(vm, scheme);
                    }
                    JobKind::Migrate { vm, max } => {
                        e.migrate_some(vm, max, out);
                    }
                    JobKind::Target { vm, slots } => e.set_target(vm, slots, out),
                    JobKind::PacedTarget { vm, slots } => e.set_target_paced(vm, slots),
                    JobKind::LazyPolicy { vm, policy } => {
                        e.set_write_policy_lazy(vm, policy);
                    }
                    JobKind::Flush { vm } => e.flush(vm, out),
                    JobKind::Destage { vm, block } => {
                        e.destage_block(vm, block, out);
                    }
                    JobKind::Clean { free } => {
                        e.clean(free, out);
                    }
                    JobKind::Prewarm { vm, block, len } => {
                        e.prewarm_load(vm, block, len, out);
                    }
                });
            }
        }
        d.pump().map_err(ctx)?;
        d.lend_ready().map_err(ctx)?;
        d.e.check_invariants().map_err(ctx)?;
    }
    // A run lent out is no more than the engine's slots: what is withheld and not emptied
    // yet is emptied once nothing is in flight (checked below, after the drain).
    let withheld: u64 = d.lending.len() as u64 * u64::from(RUN);
    if d.e.withheld_slots() != withheld {
        return Err(format!("{} slots withheld, {withheld} asked", d.e.withheld_slots()));
    }
    // Everything completes (in a scrambled order), then the cache is flushed.
    let mut k = 0usize;
    for round in 0.. {
        while !d.flying.is_empty() {
            k = k.wrapping_mul(31).wrapping_add(7);
            let n = d.flying.len();
            d.complete(u64::MAX / 2, k % n, false, 0)?;
            d.pump()?;
        }
        if d.e.in_flight() != 0 {
            return Err(format!("{} requests or jobs still in flight with no op running", d.e.in_flight()));
        }
        // Dirty blocks left: only those a dropped device held (kept, unreadable, never
        // written back: `device_failure.rs`).
        let dirty: u64 = (0..3).map(|vm| d.e.partition(vm).dirty_blocks).sum();
        let lost: std::collections::BTreeSet<(u32, u64)> =
            lost_blocks(&d.e, d.down).into_iter().map(|(vm, sector)| (vm, sector / 8)).collect();
        if dirty == lost.len() as u64 {
            break;
        }
        if round > 3 {
            return Err("dirty blocks left after flushing with nothing in flight".into());
        }
        d.e.submit_job(|e, out| e.flush(None, out));
        d.pump()?;
    }
    d.lend_ready()?;
    for n in 0.. {
        if d.flying.is_empty() {
            break;
        }
        if n > 100_000 {
            return Err("ops keep coming with nothing submitted: no rest".into());
        }
        d.complete(u64::MAX / 2, 0, false, 0)?;
        d.pump()?;
        d.lend_ready()?;
    }
    // A run holding an unreadable block (dirty on the dropped device, its only copy) is
    // never emptied: a removal of a device that failed gives up.
    let stuck = |first: u32| (first..first + RUN).any(|s| d.e.slot_unreadable(s));
    if let Some((first, _)) = d.lending.iter().find(|(&first, &lent)| !lent && !stuck(first)) {
        return Err(format!("withheld run at slot {first} never emptied with nothing in flight"));
    }
    d.e.check_invariants()?;
    let lost = lost_blocks(&d.e, d.down);
    // Random op failures may drop a device too: with two gone, a block and its copy may be.
    let gone = (0..d.e.layout().len() as u16).filter(|&st| d.e.device_failed(st) || d.down == Some(st)).count();
    if mirror && gone < 2 && !lost.is_empty() {
        return Err(format!("mirrored, yet dirty sectors (vm, sector) were lost with the device: {lost:?}"));
    }
    d.w.check_backing_except(&|vm, sector| lost.contains(&(vm, sector)))?;
    // A lost block is never served: a read of it fails (its device fails every op).
    for &(vm, sector) in &lost {
        let req = Request { time_ns: 0, vm, op: Op::Read, offset: sector * 512, len: 512 };
        let id = d.e.submit(u64::MAX / 2, &req);
        d.w.submitted(id, req);
        d.pump()?;
        while !d.flying.is_empty() {
            d.complete(u64::MAX / 2, 0, false, 0)?;
            d.pump()?;
        }
    }
    Ok(())
}

/// The dirty sectors (vm, sector) held on dropped cache devices, or on the device that
/// fails every op (`down`: the last one working is not dropped, its vDisks pass through,
/// and nothing can read those sectors back).
fn lost_blocks(e: &Engine, down: Option<u16>) -> Vec<(u32, u64)> {
    let mut lost = Vec::new();
    for st in 0..e.layout().len() as u16 {
        if !e.device_failed(st) && down != Some(st) {
            continue;
        }
        let (first, n) = e.layout().range(st);
        for slot in first as u32..(first + n) as u32 {
            let Some((vm, block)) = e.slot_block(slot) else { continue };
            if e.slot_mirrored(slot) {
                continue; // its copy on a working device is served once its ops drain
            }
            let spb = (e.config().block_size / 512) as u32;
            for k in 0..spb {
                if e.sector_state(slot, k).1 {
                    lost.push((vm, block * u64::from(spb) + u64::from(k)));
                }
            }
        }
    }
    lost
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(300)))]

    #[test]
    fn out_of_order_completions_and_failures_lose_no_acknowledged_write(
        steps in prop::collection::vec(step(), 1..200),
        shared in any::<bool>(),
        fill_block in any::<bool>(),
        kind in prop::sample::select(ReplacementKind::ALL.to_vec()),
        timers in any::<bool>(),
        protect in any::<bool>(),
        remote in any::<bool>(),
        devices in any::<bool>(),
        errors in any::<bool>(),
        mirror in any::<bool>(),
        ahead in prop::sample::select(vec![0u32, 2, 8]),
        turnover in any::<bool>(),
        ram in prop::sample::select(vec![0u64, 0, 2, 5]),
        ram_second in any::<bool>(),
    ) {
        let partition = if shared { PartitionMode::Shared } else { PartitionMode::Static };
        let fill = if fill_block { FillMode::Block } else { FillMode::Request };
        run(&steps, Setup { partition, fill, kind, timers, protect, remote, devices, errors, mirror, ahead, turnover, ram, ram_second }).map_err(TestCaseError::fail)?;
    }
}
