//! NBD_CMD_CACHE: a client's hint to bring a range into the cache, run by the prewarm
//! machinery — each run of blocks an engine job (`Engine::prewarm_load`: free slots only,
//! never evicting, a block a request is working on skipped), paced by the prewarm's own
//! pacer at its busy rate (a vDisk whose client sends hints is busy). The request is
//! answered as soon as it is queued, so a hint never delays the requests behind it; one
//! thread per data path loads the queue in order, and hints beyond [`MAX_QUEUED_BLOCKS`]
//! are dropped (counted). The thread starts with the first hint and ends with the data
//! path.

use super::DataPath;
use cachevisor_prewarm::pacer::{PaceConfig, Pacer};
use cachevisor_trace::VmId;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

/// Blocks waiting at most (a flood of hints is dropped, not buffered).
pub const MAX_QUEUED_BLOCKS: u64 = 1 << 20;

/// What the hints did, in blocks.
#[derive(Debug, Default)]
pub struct HintCounts {
    /// Asked for (queued).
    pub queued: AtomicU64,
    /// Loaded into the cache.
    pub loaded: AtomicU64,
    /// Already cached, in use, or past the vDisk's end.
    pub skipped: AtomicU64,
    /// Dropped: the queue was full, or no free slot was left.
    pub dropped: AtomicU64,
}

/// Runs of blocks waiting, `(vm, first, count)`, and their total.
type Queue = (VecDeque<(VmId, u64, u64)>, u64);

/// The hint queue of a data path.
#[derive(Debug)]
pub(crate) struct CacheHints {
    queue: Mutex<Queue>,
    cv: Condvar,
    started: AtomicBool,
    pace: Mutex<(PaceConfig, u32)>,
    /// Counters (`/metrics`).
    pub counts: HintCounts,
}

impl Default for CacheHints {
    fn default() -> Self {
        let pace = PaceConfig { rate: Some(64 << 20), busy_rate: 16 << 20, burst: 4 << 20 };
        CacheHints {
            queue: Mutex::new((VecDeque::new(), 0)),
            cv: Condvar::new(),
            started: AtomicBool::new(false),
            pace: Mutex::new((pace, 32)),
            counts: HintCounts::default(),
        }
    }
}

impl DataPath {
    /// Queues a CACHE hint for `len` bytes at `offset` of `vm` (whole blocks covering it).
    pub fn hint_cache(self: &Arc<Self>, vm: VmId, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let bs = self.shared.bs;
        let (first, end) = (offset / bs, (offset + len).div_ceil(bs));
        let h = &self.hints;
        let mut q = h.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.1 + (end - first) > MAX_QUEUED_BLOCKS {
            h.counts.dropped.fetch_add(end - first, Relaxed);
            return;
        }
        q.0.push_back((vm, first, end - first));
        q.1 += end - first;
        h.counts.queued.fetch_add(end - first, Relaxed);
        drop(q);
        h.cv.notify_one();
        if !h.started.swap(true, Relaxed) {
            let weak = Arc::downgrade(self);
            super::named("cv-cache-hints".into(), move || hint_loop(weak));
        }
    }

    /// Paces hints as a prewarm with `pace` and reads of at most `max_run` blocks.
    pub fn set_hint_pacing(&self, pace: PaceConfig, max_run: u32) {
        *self.hints.pace.lock().unwrap_or_else(|p| p.into_inner()) = (pace, max_run.max(1));
    }

    /// The hint counters.
    pub fn hint_counts(&self) -> &HintCounts {
        &self.hints.counts
    }
}

/// Loads queued hints until the data path is gone.
fn hint_loop(dp: Weak<DataPath>) {
    let t0 = Instant::now();
    let mut pacer: Option<Pacer> = None;
    loop {
        let Some(d) = dp.upgrade() else { return };
        if d.shared.halted.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let h = &d.hints;
        let (pace, max_run) = *h.pace.lock().unwrap_or_else(|p| p.into_inner());
        let bs = d.shared.bs;
        let p = pacer.get_or_insert_with(|| Pacer::new(pace, u64::from(max_run) * bs));
        let next = {
            let mut q = h.queue.lock().unwrap_or_else(|p| p.into_inner());
            if q.0.is_empty() {
                // Sleep without holding the data path: it may be dropped meanwhile.
                let (g, _) = h.cv.wait_timeout(q, Duration::from_millis(200)).unwrap_or_else(|p| p.into_inner());
                q = g;
            }
            match q.0.front_mut() {
                None => None,
                Some((vm, first, n)) => {
                    let take = (*n).min(u64::from(max_run));
                    let run = (*vm, *first, take);
                    (*first, *n) = (*first + take, *n - take);
                    if *n == 0 {
                        q.0.pop_front();
                    }
                    q.1 -= take;
                    Some(run)
                }
            }
        };
        let Some((vm, first, n)) = next else { continue };
        let now = t0.elapsed().as_nanos() as u64;
        let at = p.ready_at(now, n * bs, true);
        if at > now {
            std::thread::sleep(Duration::from_nanos(at - now).min(Duration::from_secs(1)));
        }
        p.take(t0.elapsed().as_nanos() as u64, n * bs, true);
        let mut o = cachevisor_engine::PrewarmOutcome::default();
        let r = d.run_job(|e, out| o = e.prewarm_load(vm, first, n as u32, out));
        let loaded = if r.is_ok() { u64::from(o.loaded) } else { 0 };
        let skipped = u64::from(o.skipped) + u64::from(o.out_of_range);
        h.counts.loaded.fetch_add(loaded, Relaxed);
        h.counts.skipped.fetch_add(skipped, Relaxed);
        h.counts.dropped.fetch_add(n.saturating_sub(loaded + skipped), Relaxed);
    }
}
