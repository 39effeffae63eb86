//! The live block manager (SymFlex §2.2's block manager and resize engine), a sans-IO
//! state machine: the driver passes time in and calls it (registration, targets, the
//! guest's releases, I/O start and end), and takes work out of it — records to journal
//! (`poll_record`, then `committed`), device ops to run (`poll_op`, then `op_done`),
//! events for the guest's control channel and the logs (`poll_event`), and when to call
//! back (`poll_timeout`, `handle_timeout`).
//!
//! Each physical block is in one live state ([`Live`]). The rules that keep one VM from
//! ever seeing another's bytes and keep acknowledged data across a crash:
//! - a block taken from the free list is zeroed (or, for a swapped-out block, filled from
//!   its copy) *before* its `Assign` record is written, and serves I/O only once that
//!   record is committed; the driver makes an op's effect durable before it commits any
//!   record emitted after the op completed. A crash at any point leaves the block free
//!   (nothing durable names it) or assigned with zeros or its owner's data;
//! - a released block takes no new I/O, waits for the I/O in flight on it to end, then
//!   its `Free` (or `SwappedOut`) record is written, and it returns to the free list only
//!   once that record is committed — so no other vSSD writes it while a crash could still
//!   give it back to its old owner.
//!
//! The vSSD metadata SymFlex keeps in the SSD's first blocks lives in the driver's journal
//! instead (the daemon's metadata journal and checkpoints), so the whole region is blocks.

use crate::geometry::{Geometry, Lbn, Pbn};
use crate::record::{Record, VssdId};
use crate::state::State;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Time in nanoseconds, as the driver counts it.
pub type Nanos = u64;

/// The manager's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// The region's shape.
    pub geometry: Geometry,
    /// How long a guest has to answer a deflate request before the host picks the blocks
    /// itself (least recently used first).
    pub deflate_grace: Nanos,
}

/// A device op's id.
pub type OpId = u64;

/// Work on the region's bytes for the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpKind {
    /// Fill block `pbn` with zeros (a block about to serve vSSD `id`'s `lbn`).
    Zero {
        /// The block.
        pbn: Pbn,
    },
    /// Copy block `pbn` (vSSD `id`'s `lbn`) to secondary storage (§2.4.4).
    SwapOut {
        /// The vSSD.
        id: VssdId,
        /// Its logical block.
        lbn: Lbn,
        /// The block.
        pbn: Pbn,
    },
    /// Copy vSSD `id`'s `lbn` from secondary storage into block `pbn`.
    SwapIn {
        /// The vSSD.
        id: VssdId,
        /// Its logical block.
        lbn: Lbn,
        /// The block.
        pbn: Pbn,
    },
}

/// An op with its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// Passed back to `op_done`.
    pub id: OpId,
    /// What to do.
    pub kind: OpKind,
}

/// What the guest's control channel, the logs and the metrics hear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// These logical blocks became valid (inflate, or registration).
    Inflated {
        /// The vSSD.
        id: VssdId,
        /// The blocks, ascending.
        lbns: Vec<Lbn>,
    },
    /// The guest is asked to release `blocks` blocks by `deadline` (0: request withdrawn).
    DeflateRequested {
        /// The vSSD.
        id: VssdId,
        /// Blocks still asked for.
        blocks: u32,
        /// When the host picks them itself.
        deadline: Nanos,
    },
    /// These logical blocks are no longer valid: released by the guest, or picked by the
    /// host after the deadline (`forced`).
    Released {
        /// The vSSD.
        id: VssdId,
        /// The blocks, ascending.
        lbns: Vec<Lbn>,
        /// Picked by the host, not the guest.
        forced: bool,
    },
    /// A vSSD is gone (stopped without P, or removed), its removal committed.
    Removed {
        /// The vSSD.
        id: VssdId,
    },
    /// These blocks left the region, durably: the cache engine may have them back.
    Yielded {
        /// The blocks, ascending.
        pbns: Vec<Pbn>,
    },
    /// An op failed: its block is set aside until restart, the work it was for not done.
    OpFailed {
        /// The op.
        kind: OpKind,
        /// The driver's error.
        error: String,
    },
}

/// A physical block's live state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Live {
    /// On the free list.
    Free,
    /// Taken for `(id, lbn)`, its zero or swap-in op running (`swap_in`: copying its
    /// swapped-out data back); nothing durable names it.
    Filling { id: VssdId, lbn: Lbn, op: OpId, swap_in: bool },
    /// Filled; its `Assign` record is waiting for its commit. `data`: it holds the
    /// vSSD's swapped-out data (never dropped on arrival).
    Committing { id: VssdId, lbn: Lbn, data: bool },
    /// Serves I/O.
    Valid { id: VssdId, lbn: Lbn },
    /// Released: no new I/O; waiting for the I/O in flight to end, then freed.
    Draining { id: VssdId, lbn: Lbn },
    /// Its swap-out copy running.
    SwappingOut { id: VssdId, lbn: Lbn, op: OpId },
    /// Its `Free` / `SwappedOut` record is waiting for its commit.
    Freeing,
    /// An op on it failed: unused until restart.
    Failed,
    /// Not in the region: the cache engine's (one SSD budget).
    Outside,
    /// Its `Yield` record is waiting for its commit; then it is the cache's.
    Yielding,
}

/// What happens when a record is committed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum AfterCommit {
    Valid(Pbn),
    Free(Pbn),
    Removed(VssdId),
    Yielded(Pbn),
}

/// A vSSD's live state beside its durable one.
#[derive(Debug, Clone, Default)]
pub(crate) struct VssdLive {
    /// Blocks the host wants it to hold.
    pub target: u32,
    /// Blocks asked of the guest and not released yet.
    pub asked: u32,
    /// When the host picks the asked blocks itself.
    pub deadline: Option<Nanos>,
    /// When it was deactivated (inactive vSSDs are reclaimed oldest first).
    pub inactive_since: Option<Nanos>,
    /// Logical blocks the host took after a deadline, not inflated again until the
    /// guest's next hello: a guest that has not heard of the take yet would read the new
    /// zeroed block as the data it cached there.
    pub fenced: BTreeSet<Lbn>,
    /// Its blocks by live state (`tally.rs`).
    pub(crate) tally: crate::tally::Tally,
}

/// Counters since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Blocks that became valid.
    pub inflated: u64,
    /// Blocks guests released when asked.
    pub released: u64,
    /// Blocks the host picked after a guest missed its deadline.
    pub forced: u64,
    /// Deadlines missed.
    pub deadlines_missed: u64,
    /// Blocks copied out to secondary storage and back in.
    pub swapped_out: u64,
    /// Blocks copied back in.
    pub swapped_in: u64,
    /// Ops that failed.
    pub failed_ops: u64,
}

/// The block manager.
pub struct BlockManager {
    pub(crate) config: Config,
    /// What the records emitted so far say (the journal's tail, committed or not).
    pub(crate) state: State,
    pub(crate) live: Vec<Live>,
    pub(crate) inflight: Vec<u32>,
    pub(crate) last_access: Vec<Nanos>,
    pub(crate) free: BTreeSet<Pbn>,
    pub(crate) vssds: BTreeMap<VssdId, VssdLive>,
    records: VecDeque<(u64, Record)>,
    next_seq: u64,
    awaiting: VecDeque<(u64, AfterCommit)>,
    ops: VecDeque<Op>,
    next_op: OpId,
    events: VecDeque<Event>,
    pub(crate) counters: Counters,
    /// The next registration's id: never one whose removal may still be pending.
    pub(crate) next_id: VssdId,
    /// The block each running op works on (`tally.rs`).
    pub(crate) op_blocks: std::collections::HashMap<OpId, Pbn>,
}

impl BlockManager {
    /// A manager over `state` (empty, or replayed from a journal after a restart or a
    /// crash): every block a vSSD maps serves it at once, targets are what each holds,
    /// swapped-out blocks of active vSSDs are copied back in.
    pub fn new(config: Config, state: State) -> BlockManager {
        assert_eq!(config.geometry, state.geometry(), "the state is of another region");
        let n = config.geometry.blocks as usize;
        let mut m = BlockManager {
            config,
            live: vec![Live::Free; n],
            inflight: vec![0; n],
            last_access: vec![0; n],
            free: state.free_blocks().collect(),
            vssds: BTreeMap::new(),
            state,
            records: VecDeque::new(),
            next_seq: 1,
            awaiting: VecDeque::new(),
            ops: VecDeque::new(),
            next_op: 1,
            events: VecDeque::new(),
            counters: Counters::default(),
            next_id: 0,
            op_blocks: Default::default(),
        };
        m.next_id = m.state.next_id();
        for pbn in 0..n as Pbn {
            if !m.state.inside(pbn) {
                m.set_live(pbn, Live::Outside);
            }
        }
        let ids: Vec<VssdId> = m.state.vssds().keys().copied().collect();
        for id in ids {
            let v = m.state.vssd(id).expect("listed");
            let live = VssdLive {
                target: v.map.len() as u32 + if v.active { v.swapped.len() as u32 } else { 0 },
                inactive_since: (!v.active).then_some(0),
                ..Default::default()
            };
            let blocks: Vec<(Lbn, Pbn)> = v.map.iter().map(|(&l, &p)| (l, p)).collect();
            m.vssds.insert(id, live);
            for (lbn, pbn) in blocks {
                m.set_live(pbn, Live::Valid { id, lbn });
            }
        }
        // A removal the crash interrupted goes on (`Record::Removing`).
        let removing: Vec<VssdId> = m.state.vssds().values().filter(|v| v.removing).map(|v| v.id).collect();
        for id in removing {
            m.remove_blocks(id);
        }
        m.fill();
        m
    }

    /// The settings.
    pub fn config(&self) -> Config {
        self.config
    }

    /// The durable state the records emitted so far describe.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// Counters since start.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Free blocks (committed free, not set aside).
    pub fn free_blocks(&self) -> u32 {
        self.free.len() as u32
    }

    /// The next record to journal, with its sequence number.
    pub fn poll_record(&mut self) -> Option<(u64, Record)> {
        self.records.pop_front()
    }

    /// The next op to run.
    pub fn poll_op(&mut self) -> Option<Op> {
        self.ops.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Emits `r` (applied to `state` now; durable once committed); `after` runs at its
    /// commit. Returns its sequence number.
    pub(crate) fn emit(&mut self, r: Record, after: Option<AfterCommit>) -> u64 {
        self.state.apply(&r).unwrap_or_else(|e| panic!("the manager emitted a record that does not fit: {e}"));
        let seq = self.next_seq;
        self.next_seq += 1;
        self.records.push_back((seq, r));
        if let Some(a) = after {
            self.awaiting.push_back((seq, a));
        }
        seq
    }

    /// Drops the commit actions `f` matches.
    pub(crate) fn forget_awaited(&mut self, f: impl Fn(AfterCommit) -> bool) {
        self.awaiting.retain(|&(_, a)| !f(a));
    }

    pub(crate) fn push_op(&mut self, kind: OpKind) -> OpId {
        let id = self.next_op;
        self.next_op += 1;
        self.ops.push_back(Op { id, kind });
        id
    }

    pub(crate) fn push_event(&mut self, e: Event) {
        self.events.push_back(e);
    }

    /// Every record up to and including `seq` is durable.
    pub fn committed(&mut self, seq: u64) {
        let mut valid: BTreeMap<VssdId, Vec<Lbn>> = BTreeMap::new();
        let mut yielded = Vec::new();
        let mut freed = false;
        while self.awaiting.front().is_some_and(|&(s, _)| s <= seq) {
            let (_, a) = self.awaiting.pop_front().expect("checked");
            match a {
                AfterCommit::Valid(pbn) => {
                    let Live::Committing { id, lbn, data } = self.live[pbn as usize] else {
                        unreachable!("block {pbn} awaited validity in {:?}", self.live[pbn as usize])
                    };
                    if !data && self.surplus_arrival(id) {
                        self.set_live(pbn, Live::Draining { id, lbn });
                        self.drain(pbn);
                        continue;
                    }
                    self.set_live(pbn, Live::Valid { id, lbn });
                    self.counters.inflated += 1;
                    valid.entry(id).or_default().push(lbn);
                }
                AfterCommit::Free(pbn) => {
                    debug_assert_eq!(self.live[pbn as usize], Live::Freeing);
                    self.set_live(pbn, Live::Free);
                    self.free.insert(pbn);
                    freed = true;
                }
                AfterCommit::Removed(id) => {
                    self.vssds.remove(&id);
                    self.push_event(Event::Removed { id });
                }
                AfterCommit::Yielded(pbn) => {
                    debug_assert_eq!(self.live[pbn as usize], Live::Yielding);
                    self.set_live(pbn, Live::Outside);
                    yielded.push(pbn);
                }
            }
        }
        // Blocks freed, or an inactive vSSD's blocks settled (they can be swapped out
        // now): what active vSSDs lack may be met.
        let settled = freed || !valid.is_empty();
        for (id, mut lbns) in valid {
            lbns.sort_unstable();
            self.push_event(Event::Inflated { id, lbns });
        }
        if !yielded.is_empty() {
            yielded.sort_unstable();
            self.push_event(Event::Yielded { pbns: yielded });
        }
        if settled {
            self.fill();
        }
    }

    /// The op `op` ended (`Err`: the driver's error text).
    pub fn op_done(&mut self, op: OpId, result: Result<(), String>) {
        let Some(pbn) = self.block_of_op(op) else { panic!("op {op} is not running") };
        match (self.live[pbn as usize], result) {
            (Live::Filling { id, lbn, .. }, Ok(())) => {
                let v = self.state.vssd(id).expect("filling blocks' vSSDs exist");
                let swapped = v.swapped.contains(&lbn);
                // A zeroed block its vSSD no longer wants (stopped without P, removed, or
                // its target lowered meanwhile) is not handed out.
                let wanted = swapped || (!v.removing && (v.active || v.persist) && !self.surplus_arrival(id));
                if wanted {
                    if swapped {
                        self.counters.swapped_in += 1;
                    }
                    self.set_live(pbn, Live::Committing { id, lbn, data: swapped });
                    self.emit(Record::Assign { pbn, id, lbn }, Some(AfterCommit::Valid(pbn)));
                } else {
                    // Its vSSD stopped or went away while the block was zeroed.
                    self.set_live(pbn, Live::Free);
                    self.free.insert(pbn);
                    self.settle(id);
                }
            }
            (Live::SwappingOut { id, lbn, .. }, result) if self.state.vssd(id).is_some_and(|v| v.removing) => {
                // Removed while its copy ran: the copy is not kept, the block is freed
                // (as `remove` frees the others) and the removal can finish.
                if let Err(error) = result {
                    self.counters.failed_ops += 1;
                    self.push_event(Event::OpFailed { kind: OpKind::SwapOut { id, lbn, pbn }, error });
                }
                self.set_live(pbn, Live::Draining { id, lbn });
                self.drain(pbn);
            }
            (Live::SwappingOut { id, lbn, .. }, Ok(())) => {
                self.counters.swapped_out += 1;
                self.set_live(pbn, Live::Freeing);
                self.emit(Record::SwappedOut { id, lbn, pbn: Some(pbn) }, Some(AfterCommit::Free(pbn)));
            }
            (Live::Filling { id, lbn, .. }, Err(error)) => {
                self.set_live(pbn, Live::Failed);
                self.counters.failed_ops += 1;
                let swapped = self.state.vssd(id).is_some_and(|v| v.swapped.contains(&lbn));
                let kind = if swapped { OpKind::SwapIn { id, lbn, pbn } } else { OpKind::Zero { pbn } };
                self.push_event(Event::OpFailed { kind, error });
                self.settle(id);
            }
            (Live::SwappingOut { id, lbn, .. }, Err(error)) => {
                // The block stays where it is, with its data.
                self.set_live(pbn, Live::Valid { id, lbn });
                self.counters.failed_ops += 1;
                self.push_event(Event::OpFailed { kind: OpKind::SwapOut { id, lbn, pbn }, error });
            }
            _ => unreachable!(),
        }
        self.fill();
    }

    /// Whether a block arriving for `id` (counted in `held`) is beyond its target: then it
    /// is not handed out, and the guest is asked for one block fewer.
    pub(crate) fn surplus_arrival(&mut self, id: VssdId) -> bool {
        let active = self.state.vssd(id).is_some_and(|v| v.active && !v.removing);
        let held = self.held(id);
        let l = self.vssds.get_mut(&id).expect("live");
        if !active || held <= l.target {
            return false;
        }
        let rest = held - 1 - l.target;
        if l.asked > rest {
            l.asked = rest;
            if rest == 0 {
                l.deadline = None;
            }
            let (blocks, deadline) = (l.asked, l.deadline.unwrap_or(0));
            self.push_event(Event::DeflateRequested { id, blocks, deadline });
        }
        true
    }

    /// Blocks of `id` that count toward its allocation: valid, committing and filling,
    /// and, while it runs, its blocks being swapped out or swapped out and waiting to be
    /// copied back in (their data comes back whatever its target says).
    pub fn held(&self, id: VssdId) -> u32 {
        let Some(t) = self.tally(id) else { return 0 };
        let on_ssd = t.valid + t.committing + t.filling.len() as u32;
        match self.state.vssd(id).filter(|v| v.active) {
            // Swap-ins running count once (filling); the rest wait for a block.
            Some(v) => on_ssd + t.swapping_out + (v.swapped.len() as u32).saturating_sub(t.filling_swap_in),
            None => on_ssd,
        }
    }

    /// Logical blocks of `id` that serve I/O now (the guest's bitmap), ascending.
    pub fn valid_lbns(&self, id: VssdId) -> Vec<Lbn> {
        let Some(v) = self.state.vssd(id) else { return Vec::new() };
        v.map.iter().filter(|(_, &p)| matches!(self.live[p as usize], Live::Valid { .. })).map(|(&l, _)| l).collect()
    }

    /// Takes free blocks for what active vSSDs lack: swapped-out blocks first (their
    /// data), then blocks up to each target (zeroed), vSSDs in id order; when the free
    /// list runs out, persistent blocks of inactive vSSDs are swapped out (§2.4.4),
    /// those inactive longest first.
    pub(crate) fn fill(&mut self) {
        let ids: Vec<VssdId> = self.vssds.keys().copied().collect();
        let mut short = 0u64;
        for id in ids {
            let Some(v) = self.state.vssd(id) else { continue };
            if !v.active || v.removing {
                continue;
            }
            let filling: BTreeSet<Lbn> = self.vssds[&id].tally.filling.keys().copied().collect();
            let swap_ins: Vec<Lbn> = v.swapped.iter().filter(|l| !filling.contains(l)).copied().collect();
            let mut want = self.vssds[&id].target.saturating_sub(self.held(id));
            for lbn in swap_ins {
                let Some(pbn) = self.free.pop_first() else {
                    short += 1;
                    continue;
                };
                let op = self.push_op(OpKind::SwapIn { id, lbn, pbn });
                self.set_live(pbn, Live::Filling { id, lbn, op, swap_in: true });
            }
            let v = self.state.vssd(id).expect("listed");
            let max = v.max_blocks;
            let mut lbn = 0;
            while want > 0 && lbn < max {
                let v = self.state.vssd(id).expect("listed");
                let fenced = &self.vssds[&id].fenced;
                if v.map.contains_key(&lbn)
                    || v.swapped.contains(&lbn)
                    || filling.contains(&lbn)
                    || fenced.contains(&lbn)
                {
                    lbn += 1;
                    continue;
                }
                let Some(pbn) = self.free.pop_first() else {
                    short += u64::from(want);
                    break;
                };
                let op = self.push_op(OpKind::Zero { pbn });
                self.set_live(pbn, Live::Filling { id, lbn, op, swap_in: false });
                want -= 1;
                lbn += 1;
            }
        }
        if short > 0 {
            self.reclaim_inactive(short);
        }
    }

    /// Starts swapping out up to `n` blocks of inactive persistent vSSDs, inactive longest
    /// first (blocks already on their way out count); returns how many it started.
    pub(crate) fn reclaim_inactive(&mut self, n: u64) -> u64 {
        let leaving = self.live.iter().filter(|l| matches!(l, Live::SwappingOut { .. } | Live::Freeing)).count() as u64;
        let mut n = n.saturating_sub(leaving);
        let mut started = 0;
        let mut order: Vec<(Nanos, VssdId)> =
            self.vssds.iter().filter_map(|(&id, l)| l.inactive_since.map(|t| (t, id))).collect();
        order.sort_unstable();
        for (_, id) in order {
            let blocks: Vec<(Lbn, Pbn)> =
                self.state.vssd(id).map(|v| v.map.iter().map(|(&l, &p)| (l, p)).collect()).unwrap_or_default();
            for (lbn, pbn) in blocks {
                if n == 0 {
                    return started;
                }
                if self.live[pbn as usize] == (Live::Valid { id, lbn }) {
                    let op = self.push_op(OpKind::SwapOut { id, lbn, pbn });
                    self.set_live(pbn, Live::SwappingOut { id, lbn, op });
                    n -= 1;
                    started += 1;
                }
            }
        }
        started
    }

    /// Writes `Remove` for a vSSD being removed once it holds nothing.
    pub(crate) fn settle(&mut self, id: VssdId) {
        let Some(v) = self.state.vssd(id) else { return };
        let busy = self.tally(id).is_some_and(|t| t.busy());
        if v.removing && !busy && v.map.is_empty() && v.swapped.is_empty() {
            self.emit(Record::Remove { id }, Some(AfterCommit::Removed(id)));
        }
    }
}
