//! Prefetch into the cache for sequential readers of slow backing stores, per vDisk:
//! `none` (the default), `obl` (one-block lookahead: a read that continues the vDisk's
//! last read loads the block after it — libCacheSim's OBL) and `amp` / `amp:N` (Adaptive
//! Multi-stream Prefetching, Gill & Bathen, FAST '07: a stream's degree p (blocks loaded
//! per prefetch) and trigger distance g (how far before the loaded run's end the next
//! prefetch starts) adapt — p grows when a run's last block is read, shrinks when a
//! prefetched block leaves unread; g grows when a read waits on a prefetch still in
//! flight; p ≤ N, default 64) and `auto` (AMP that decides per vDisk whether prefetch
//! pays: when more of its last 32 prefetched blocks left the cache unread than were
//! read, it pauses for the next 1,024 sequential reads, then tries again). One stream per
//! vDisk (the run its reads continue).
//!
//! Prefetched blocks are clean and enter the replacement policy at the cold end
//! (`Replacement::insert_prewarmed`), so an unread one is the next victim; they bypass
//! admission (prefetch is its own decision). The loads run as a background job
//! (`prewarm_load.rs`'s loader, allowed to evict), which holds its blocks: a read of one
//! waits for its load and then hits. At most `PREFETCH_INFLIGHT` blocks per vDisk are
//! loading at once. On the engine's synchronous face (the cache model) a prefetch loads
//! at once, into the request's output.

use rustc_hash::FxHashMap;

/// Blocks a vDisk may have loading by prefetch at once.
pub const PREFETCH_INFLIGHT: u32 = 256;

/// A vDisk's prefetch policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum PrefetchPolicy {
    /// No prefetch.
    #[default]
    None,
    /// One-block lookahead on a sequential read.
    Obl,
    /// AMP, its degree at most `max` blocks.
    Amp {
        /// The largest degree.
        max: u32,
    },
    /// AMP (degree up to 64) that pauses itself while its loads go unread.
    Auto,
}

impl std::fmt::Display for PrefetchPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PrefetchPolicy::None => write!(f, "none"),
            PrefetchPolicy::Obl => write!(f, "obl"),
            PrefetchPolicy::Amp { max: 64 } => write!(f, "amp"),
            PrefetchPolicy::Amp { max } => write!(f, "amp:{max}"),
            PrefetchPolicy::Auto => write!(f, "auto"),
        }
    }
}

impl std::str::FromStr for PrefetchPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "none" => Ok(PrefetchPolicy::None),
            "obl" => Ok(PrefetchPolicy::Obl),
            "amp" => Ok(PrefetchPolicy::Amp { max: 64 }),
            "auto" => Ok(PrefetchPolicy::Auto),
            t => match t.strip_prefix("amp:").map(|n| n.trim().parse::<u32>()) {
                Some(Ok(max)) if (1..=PREFETCH_INFLIGHT).contains(&max) => Ok(PrefetchPolicy::Amp { max }),
                Some(_) => Err(format!(
                    "prefetch `{s}`: amp:N takes a whole N from 1 to {PREFETCH_INFLIGHT} (the largest degree, blocks)"
                )),
                None => Err(format!("prefetch `{s}`: expected none, obl, amp, amp:N or auto")),
            },
        }
    }
}

impl From<PrefetchPolicy> for String {
    fn from(p: PrefetchPolicy) -> String {
        p.to_string()
    }
}

impl TryFrom<String> for PrefetchPolicy {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

/// What a vDisk's prefetch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PrefetchCounts {
    /// Blocks loaded by prefetch.
    pub loaded: u64,
    /// Of them, read (or written) before they left the cache.
    pub used: u64,
    /// Of them, evicted (or dropped) unread.
    pub wasted: u64,
    /// Reads that waited on a prefetch still loading their block.
    pub late: u64,
}

/// A vDisk's prefetch at one moment (`Engine::prefetch_state`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct PrefetchState {
    /// Its policy.
    pub policy: PrefetchPolicy,
    /// What it did.
    #[serde(flatten)]
    pub counts: PrefetchCounts,
    /// The stream's degree now (blocks per prefetch).
    pub degree: u32,
    /// The stream's trigger distance now (blocks before the loaded run's end).
    pub trigger: u32,
    /// `auto`: paused now because its loads went unread.
    pub paused: bool,
    /// `auto`: times it paused.
    pub pauses: u64,
}

/// One vDisk's stream.
#[derive(Debug, Clone)]
pub(crate) struct Stream {
    policy: PrefetchPolicy,
    /// The block after the vDisk's last read.
    last_end: u64,
    /// The block after the last one prefetched (0: none yet).
    pub(crate) frontier: u64,
    degree: u32,
    trigger: u32,
    /// Blocks loading now.
    pub(crate) inflight: u32,
    counts: PrefetchCounts,
    /// `auto`: outcomes (read, left unread) of its latest loads, and sequential reads
    /// left to sit out.
    outcomes: [u32; 2],
    paused_reads: u32,
    pauses: u64,
}

/// `auto`: outcomes per verdict.
const AUTO_OUTCOMES: u32 = 32;
/// `auto`: sequential reads a pause lasts.
const AUTO_PAUSE: u32 = 1024;

impl PrefetchPolicy {
    /// AMP's largest degree, for the AMP policies.
    fn amp_max(self) -> Option<u32> {
        match self {
            PrefetchPolicy::Amp { max } => Some(max),
            PrefetchPolicy::Auto => Some(64),
            _ => None,
        }
    }
}

impl Stream {
    fn new(policy: PrefetchPolicy) -> Self {
        let degree = policy.amp_max().map_or(1, |max| max.min(4));
        Stream {
            policy,
            last_end: u64::MAX,
            frontier: 0,
            degree,
            trigger: degree / 2,
            inflight: 0,
            counts: Default::default(),
            outcomes: [0, 0],
            paused_reads: 0,
            pauses: 0,
        }
    }

    /// A read of blocks `first..=last` (`late`: it waited on a prefetch); the range to
    /// load, if any.
    pub(crate) fn after_read(&mut self, first: u64, last: u64, late: bool) -> Option<(u64, u32)> {
        let sequential = first <= self.last_end && self.last_end <= last.saturating_add(1) && self.last_end != u64::MAX;
        self.last_end = last.saturating_add(1);
        if late {
            self.counts.late += 1;
            if self.policy.amp_max().is_some() {
                self.trigger = (self.trigger + 1).min(self.degree.saturating_sub(1));
            }
        }
        if !sequential {
            self.frontier = 0;
            return None;
        }
        if self.paused_reads > 0 {
            self.paused_reads -= 1;
            self.frontier = 0;
            return None;
        }
        let next = last + 1;
        let start = self.frontier.max(next);
        // Due when the loaded run ends within the trigger distance of this read.
        if self.frontier > next && self.frontier - next > u64::from(self.trigger) {
            return None;
        }
        let n = self.degree.min(PREFETCH_INFLIGHT.saturating_sub(self.inflight));
        if n == 0 {
            return None;
        }
        self.frontier = start + u64::from(n);
        Some((start, n))
    }

    /// A prefetched block was read; `last_of_run`: it ended its prefetch's run.
    fn used(&mut self, last_of_run: bool) {
        self.counts.used += 1;
        if let (Some(max), true) = (self.policy.amp_max(), last_of_run) {
            self.degree = (self.degree + 1).min(max);
        }
        self.judge(0);
    }

    /// A prefetched block left the cache unread.
    fn wasted(&mut self) {
        self.counts.wasted += 1;
        if self.policy.amp_max().is_some() {
            self.degree = self.degree.saturating_sub(1).max(1);
            self.trigger = self.trigger.min(self.degree - 1);
        }
        self.judge(1);
    }

    /// `auto`: counts a load's outcome (0 read, 1 unread); every [`AUTO_OUTCOMES`], a
    /// verdict — more unread than read pauses it for [`AUTO_PAUSE`] sequential reads.
    fn judge(&mut self, outcome: usize) {
        if self.policy != PrefetchPolicy::Auto {
            return;
        }
        self.outcomes[outcome] += 1;
        if self.outcomes[0] + self.outcomes[1] >= AUTO_OUTCOMES {
            if self.outcomes[1] > self.outcomes[0] {
                self.paused_reads = AUTO_PAUSE;
                self.pauses += 1;
            }
            self.outcomes = [0, 0];
        }
    }

    pub(crate) fn loaded(&mut self, n: u32) {
        self.counts.loaded += u64::from(n);
    }

    pub(crate) fn state(&self) -> PrefetchState {
        PrefetchState {
            policy: self.policy,
            counts: self.counts,
            degree: self.degree,
            trigger: self.trigger,
            paused: self.paused_reads > 0,
            pauses: self.pauses,
        }
    }
}

/// Every vDisk's stream, and the prefetched blocks not read yet (inside `Engine`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Prefetcher {
    pub(crate) streams: Vec<Option<Stream>>,
    /// Slot → (vDisk, whether it ends its run): prefetched, not read yet.
    unread: FxHashMap<u32, (u32, bool)>,
    /// Prefetch jobs running: (job id, vDisk, blocks).
    pub(crate) jobs: Vec<(crate::inflight::ReqId, u32, u32)>,
}

impl Prefetcher {
    /// Sets `vm`'s policy (its stream starts afresh, its prefetched blocks count as any
    /// other block from now on; `None` drops it).
    pub(crate) fn set(&mut self, vm: u32, policy: PrefetchPolicy) {
        self.unread.retain(|_, x| x.0 != vm);
        let v = vm as usize;
        if self.streams.len() <= v {
            self.streams.resize_with(v + 1, || None);
        }
        self.streams[v] = (policy != PrefetchPolicy::None).then(|| Stream::new(policy));
    }

    /// `vm`'s stream, when it prefetches.
    #[inline]
    pub(crate) fn stream(&mut self, vm: u32) -> Option<&mut Stream> {
        self.streams.get_mut(vm as usize)?.as_mut()
    }

    /// Slot `s` now holds a prefetched block of `vm`.
    pub(crate) fn mark(&mut self, s: u32, vm: u32, last_of_run: bool) {
        self.unread.insert(s, (vm, last_of_run));
    }

    /// Whether slot `s` holds a prefetched block not read yet.
    #[inline]
    pub(crate) fn unread(&self, s: u32) -> bool {
        !self.unread.is_empty() && self.unread.contains_key(&s)
    }

    /// Slot `s` was read or written: a prefetched block's first use.
    #[inline]
    pub(crate) fn touched(&mut self, s: u32) {
        if self.unread.is_empty() {
            return;
        }
        if let Some((vm, last)) = self.unread.remove(&s) {
            if let Some(st) = self.stream(vm) {
                st.used(last);
            }
        }
    }

    /// Slot `s` was emptied: a prefetched block that leaves unread was wasted.
    #[inline]
    pub(crate) fn forgotten(&mut self, s: u32) {
        if self.unread.is_empty() {
            return;
        }
        if let Some((vm, _)) = self.unread.remove(&s) {
            if let Some(st) = self.stream(vm) {
                st.wasted();
            }
        }
    }

    /// Slot `s`'s block moved to slot `d`.
    pub(crate) fn moved(&mut self, s: u32, d: u32) {
        if let Some(x) = (!self.unread.is_empty()).then(|| self.unread.remove(&s)).flatten() {
            self.unread.insert(d, x);
        }
    }

    /// A job retired: if it was a prefetch, its blocks are loading no more.
    pub(crate) fn retired(&mut self, id: crate::inflight::ReqId) {
        if let Some(i) = self.jobs.iter().position(|j| j.0 == id) {
            let (_, vm, n) = self.jobs.swap_remove(i);
            if let Some(st) = self.stream(vm) {
                st.inflight = st.inflight.saturating_sub(n);
            }
        }
    }
}

impl crate::Engine {
    /// For a client read submitted now: whether it waits on a prefetch of one of its
    /// blocks (a late prefetch), and the range its stream loads next, if any.
    pub(crate) fn prefetch_due(&mut self, req: &cachevisor_trace::Request) -> Option<(u64, u32)> {
        if req.op != cachevisor_trace::Op::Read || self.prefetcher.stream(req.vm).is_none() || req.len == 0 {
            return None;
        }
        let (first, last) = (req.offset >> self.shift, (req.end() - 1) >> self.shift);
        let late = (first..=last).any(|b| {
            self.lookup(req.vm, b).is_some_and(|s| {
                self.prefetcher.unread(s) && self.flight.holds_block(crate::slot_table::pack_key(req.vm, b))
            })
        });
        let due = self.prefetcher.stream(req.vm)?.after_read(first, last, late);
        if due.is_some() && self.congestion.on() && self.congestion.reads_congested(self.ahead.now_ns()) {
            // Dropped under congestion (the cache device is the bottleneck); the next
            // read that continues the stream asks again.
            self.prefetcher.stream(req.vm)?.frontier = 0;
            return None;
        }
        due
    }

    /// Starts a background job loading blocks `first..first + n` of `vm` as a prefetch.
    pub(crate) fn start_prefetch(&mut self, vm: u32, first: u64, n: u32) {
        let mut loaded = 0;
        let id = self.submit_job(|e, out| {
            loaded = e.load_blocks(vm, first, n, crate::prewarm_load::Load::Prefetch, out).loaded;
        });
        if let Some(s) = self.prefetcher.stream(vm) {
            s.loaded(loaded);
            if let Some(id) = id {
                s.inflight += n;
                self.prefetcher.jobs.push((id, vm, n));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_and_print_back() {
        for s in ["none", "obl", "amp", "amp:8", "amp:256", "auto"] {
            assert_eq!(s.parse::<PrefetchPolicy>().unwrap().to_string(), s);
        }
        for bad in ["amp:0", "amp:257", "amp:x", "obl:2", "lookahead", ""] {
            let e = bad.parse::<PrefetchPolicy>().unwrap_err();
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }

    /// OBL loads the block after a read that continues the last one, once.
    #[test]
    fn obl_loads_one_block_ahead_of_a_sequential_reader_only() {
        let mut s = Stream::new(PrefetchPolicy::Obl);
        assert_eq!(s.after_read(10, 10, false), None, "the first read starts no stream");
        assert_eq!(s.after_read(11, 11, false), Some((12, 1)));
        assert_eq!(s.after_read(12, 13, false), Some((14, 1)));
        assert_eq!(s.after_read(50, 50, false), None, "a jump ends the stream");
        assert_eq!(s.after_read(51, 51, false), Some((52, 1)));
    }

    /// AMP: a run's last block read grows the degree; a late read grows the trigger
    /// distance; a wasted block shrinks the degree; the next prefetch starts once the
    /// reader is within the trigger distance of the loaded run's end.
    #[test]
    fn amp_adapts_degree_and_trigger() {
        let mut s = Stream::new(PrefetchPolicy::Amp { max: 6 });
        assert_eq!((s.degree, s.trigger), (4, 2));
        s.after_read(0, 0, false);
        assert_eq!(s.after_read(1, 1, false), Some((2, 4)), "blocks 2..6");
        assert_eq!(s.after_read(2, 2, false), None, "3 blocks left: beyond the trigger distance 2");
        assert_eq!(s.after_read(3, 3, false), Some((6, 4)), "2 left: the next run");
        s.used(true);
        s.used(true);
        s.used(true);
        assert_eq!(s.degree, 6, "at most max");
        s.after_read(4, 4, true);
        assert_eq!((s.trigger, s.counts.late), (3, 1));
        s.wasted();
        assert_eq!(s.degree, 5);
        for _ in 0..10 {
            s.wasted();
        }
        assert_eq!((s.degree, s.trigger), (1, 0));
        s.inflight = PREFETCH_INFLIGHT;
        s.frontier = 0;
        assert_eq!(s.after_read(5, 5, false), None, "no room in flight");
        s.inflight = 0;
        assert_eq!(s.after_read(6, 6, false), Some((7, 1)));
    }

    fn engine(slots: u64) -> crate::Engine {
        let mut e = crate::Engine::new(crate::EngineConfig::with_slots(slots)).unwrap();
        e.set_target(0, slots, &mut crate::Output::default());
        e
    }

    fn read(e: &mut crate::Engine, block: u64, out: &mut crate::Output) -> bool {
        let r = cachevisor_trace::Request {
            time_ns: 0,
            vm: 0,
            op: cachevisor_trace::Op::Read,
            offset: block * 4096,
            len: 4096,
        };
        e.access(0, &r, out);
        out.blocks[0].hit
    }

    /// On the synchronous face: a sequential reader under AMP hits from its third read on
    /// (the prefetch loads ahead of it, into the request's output, as background ops);
    /// a random reader loads nothing; an unread prefetched block that is evicted counts
    /// as wasted.
    #[test]
    fn a_sequential_reader_hits_what_amp_loaded_and_a_random_one_loads_nothing() {
        let mut e = engine(64);
        let mut out = crate::Output::default();
        e.set_prefetch_policy(0, PrefetchPolicy::Amp { max: 8 });
        assert!(!read(&mut e, 100, &mut out));
        assert!(!read(&mut e, 101, &mut out), "the stream starts here");
        let loads: Vec<u64> = out
            .ops
            .iter()
            .filter(|o| o.kind == crate::OpKind::BackingRead && !o.client)
            .map(|o| o.disk_addr / 4096)
            .collect();
        assert_eq!(loads, [102, 103, 104, 105], "degree 4 ahead of block 101");
        let hits = (102..140).filter(|&b| read(&mut e, b, &mut out)).count();
        assert_eq!(hits, 38, "every later block was loaded before its read");
        let st = e.prefetch_state(0).unwrap();
        assert!(st.counts.used >= 38 && st.degree == 8, "{st:?}");
        assert_eq!(st.counts.wasted, 0);
        e.check_invariants().unwrap();
        // A random reader: nothing loaded.
        e.set_prefetch_policy(0, PrefetchPolicy::Obl);
        for b in [500u64, 900, 300, 700] {
            read(&mut e, b, &mut out);
        }
        assert_eq!(e.prefetch_state(0).unwrap().counts.loaded, 0);
        // Unread prefetched blocks pushed out by other misses are wasted.
        read(&mut e, 1000, &mut out);
        read(&mut e, 1001, &mut out);
        for b in 2000..2100u64 {
            read(&mut e, b * 7, &mut out);
        }
        let st = e.prefetch_state(0).unwrap();
        assert_eq!((st.counts.loaded, st.counts.wasted), (1, 1), "{st:?}");
        e.set_prefetch_policy(0, PrefetchPolicy::None);
        assert!(e.prefetch_state(0).is_none());
        e.check_invariants().unwrap();
    }

    /// `auto` against AMP: a reader of pairs of blocks (two in a row, then elsewhere)
    /// makes every prefetch a waste; AMP keeps loading a block a pair, `auto` pauses and
    /// loads a fraction of that. A sequential reader is served by both alike.
    #[test]
    fn auto_pauses_while_its_loads_go_unread_and_serves_a_sequential_reader_as_amp_does() {
        let mut loaded = Vec::new();
        for p in [PrefetchPolicy::Amp { max: 64 }, PrefetchPolicy::Auto] {
            let mut e = engine(64);
            let mut out = crate::Output::default();
            e.set_prefetch_policy(0, p);
            for i in 0..5000u64 {
                let b = (i * 7919) % 1_000_000 * 4;
                read(&mut e, b, &mut out);
                read(&mut e, b + 1, &mut out);
            }
            let st = e.prefetch_state(0).unwrap();
            loaded.push(st.counts.loaded);
            if p == PrefetchPolicy::Auto {
                assert!(st.pauses > 0, "{st:?}");
            }
            // Then a long sequential read: hits from prefetch under both.
            // (A pause still running when the reader turns sequential sits out up to 1,024
            // of its reads.)
            let hits = (2_000_000..2_010_000u64).filter(|&b| read(&mut e, b, &mut out)).count();
            let want = if p == PrefetchPolicy::Auto { 10_000 - AUTO_PAUSE as usize - 300 } else { 9_900 };
            assert!(hits > want, "{p}: {hits} of 10,000 sequential reads hit");
            e.check_invariants().unwrap();
        }
        assert!(loaded[1] * 4 < loaded[0], "auto loaded {} blocks, amp {}", loaded[1], loaded[0]);
    }
}
