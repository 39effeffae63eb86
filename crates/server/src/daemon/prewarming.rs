//! The daemon's snapshots and prewarming (`docs/prewarm.md`): a snapshot of the
//! cache's state (a bitmap of cached blocks per vDisk, the `prewarm` crate's capture)
//! taken on the configured schedule and at shutdown into the snapshot directory, and a
//! prewarm of this cache from another cache's snapshots — scored, limited and planned by
//! the `prewarm` crate, each read an engine job (`Engine::prewarm_load`) that loads free
//! slots only, paced by the crate's loader while the vDisks' own I/O goes on beside it.
//!
//! A running prewarm's whole set is also written, crash-safe, as a snapshot directory of
//! its own in the metadata directory (`prewarm-pending/`), removed when the prewarm ends:
//! after a crash the next start resumes the prewarm from it (blocks already loaded are
//! cached and skipped), and every snapshot taken meanwhile holds it — a crash mid-prewarm
//! neither loses the prewarm nor shrinks the history to what was loaded.

use super::{Daemon, OpError};
use crate::config::{PrewarmConfig, SnapshotSchedule};
use crate::prewarm_job::{Progress, Report};
use crate::snapshot_files;
use cachevisor_engine::{Failure, PrewarmOutcome};
use cachevisor_prewarm::{online, plan, Activity, Capture, Loader, LoaderConfig, Ranking, ReadOutcome, RoaringTreemap};
use cachevisor_trace::VmId;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A vDisk counts as busy for this long after its request counters last moved.
const BUSY_FOR: Duration = Duration::from_millis(20);
/// Slots a snapshot reads per hold of the engine's lock.
const CAPTURE_STEP: u32 = 1 << 16;
/// Longest sleep of the prewarm loop between reads.
const MAX_NAP: Duration = Duration::from_millis(50);

/// Where snapshots go and which comes next.
#[derive(Debug)]
pub(crate) struct Snapshots {
    pub(crate) dir: PathBuf,
    pub(crate) kept: usize,
    pub(crate) next_seq: u64,
    pub(crate) config: PrewarmConfig,
    /// The running prewarm's whole set by vDisk name: every snapshot taken while it runs
    /// holds it, so a partial load never shrinks the next snapshot (InnoDB's MDEV-11454:
    /// a dump taken mid-load lost what the load had not reached yet).
    pub(crate) pending: BTreeMap<String, RoaringTreemap>,
    /// When the previous snapshot was taken (or the daemon started) and each vDisk's
    /// counters then: a snapshot carries each vDisk's activity since (format 2).
    seen: (Instant, Vec<Activity>),
}

/// How far back an online prewarm looks at the source's activity, in (`prewarm.minute`)
/// minutes (the slides' five-minute average).
const ONLINE_LOOKBACK_MINUTES: f64 = 5.0;

impl Snapshots {
    /// The state for `cfg`, snapshots under `meta_dir/snapshots` unless configured.
    /// A configured directory's parent must exist (a mistyped path is refused, never
    /// built).
    pub(crate) fn new(cfg: &PrewarmConfig, meta_dir: &Path) -> std::io::Result<Snapshots> {
        let dir = cfg.snapshot_dir.clone().unwrap_or_else(|| meta_dir.join("snapshots"));
        if !dir.is_dir() {
            cachevisor_store::owner_lock::parent_must_exist(&dir, "prewarm.snapshot_dir")
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::NotFound, e))?;
        }
        let next_seq = snapshot_files::next_seq(&dir)?;
        Ok(Snapshots {
            dir,
            kept: cfg.snapshots_kept,
            next_seq,
            config: cfg.clone(),
            pending: BTreeMap::new(),
            seen: (Instant::now(), Vec::new()),
        })
    }
}

/// A prewarm ready to run: its loader, the VM of each of its sets, the snapshots read,
/// and its whole set by vDisk name.
struct Prepared {
    loader: Loader,
    set_vm: Vec<Option<VmId>>,
    pending: BTreeMap<String, RoaringTreemap>,
    /// What is known before the first read: snapshots, planned blocks, what matched.
    planned: Progress,
}

/// The running prewarm's set, under the metadata directory.
pub(crate) fn pending_dir(meta_dir: &Path) -> PathBuf {
    meta_dir.join("prewarm-pending")
}

impl Daemon {
    /// A prewarm a crash interrupted, to resume: its pending set's directory.
    pub fn interrupted_prewarm(&self) -> Option<PathBuf> {
        let dir = pending_dir(&self.meta_dir);
        snapshot_files::list(&dir).ok().filter(|l| !l.is_empty()).map(|_| dir)
    }

    /// The directory this daemon writes its snapshots to.
    pub fn snapshot_dir(&self) -> PathBuf {
        self.snapshots.lock().unwrap_or_else(|e| e.into_inner()).dir.clone()
    }

    /// Takes a snapshot of the cache's state now and writes it, crash-safe; the oldest
    /// beyond `snapshots_kept` are removed. Returns its path.
    pub fn take_snapshot(&self) -> Result<PathBuf, OpError> {
        self.cache_must_be_in("a snapshot").map_err(OpError::Invalid)?;
        let names: Vec<String> = {
            let exports = self.exports.read().unwrap_or_else(|e| e.into_inner());
            exports
                .iter()
                .enumerate()
                .map(|(i, e)| e.as_ref().map_or(format!("(removed vDisk {i})"), |e| e.name.clone()))
                .collect()
        };
        let requests = self.requests_served();
        let counters: Vec<Activity> = (0..names.len() as VmId)
            .map(|vm| {
                let s = self.dp.stats(vm);
                Activity { requests: s.reads + s.writes, accesses: s.blocks, hits: s.hit_blocks, span_ns: 0 }
            })
            .collect();
        let mut st = self.snapshots.lock().unwrap_or_else(|e| e.into_inner());
        let seq = st.next_seq;
        // A range of slots at a time under the engine's lock, so requests go on between.
        let slots = self.max_cache_blocks() as u32;
        let mut c = Capture::default();
        for start in (0..slots).step_by(CAPTURE_STEP as usize) {
            self.dp.with_engine(|e| c.add_slots(e, start..start.saturating_add(CAPTURE_STEP)));
        }
        let mut snap = c.finish(seq, requests, self.block_size as u32, &names);
        for (name, blocks) in &st.pending {
            *snap.sets.entry(name.clone()).or_default() |= blocks;
        }
        let (since, before) = &st.seen;
        let span_ns = since.elapsed().as_nanos().max(1) as u64;
        for (vm, (name, now)) in names.iter().zip(&counters).enumerate() {
            let was = before.get(vm).copied().unwrap_or_default();
            let a = Activity {
                requests: now.requests.saturating_sub(was.requests),
                accesses: now.accesses.saturating_sub(was.accesses),
                hits: now.hits.saturating_sub(was.hits),
                span_ns,
            };
            snap.activity.insert(name.clone(), Activity { hits: a.hits.min(a.accesses), ..a });
            // counters read apart
        }
        let path = snapshot_files::write(&st.dir, &snap, st.kept)
            .map_err(|e| OpError::Other(format!("snapshot into {}: {e}", st.dir.display())))?;
        st.next_seq += 1;
        st.seen = (Instant::now(), counters);
        tracing::debug!(path = %path.display(), blocks = snap.objects(), "cache snapshot written");
        Ok(path)
    }

    /// Requests served so far over every vDisk (reads and writes).
    pub fn requests_served(&self) -> u64 {
        let n = self.exports.read().unwrap_or_else(|e| e.into_inner()).len() as VmId;
        (0..n).map(|vm| self.dp.stats(vm)).map(|s| s.reads + s.writes).sum()
    }

    /// The prewarm job (progress of the running or last one).
    pub fn prewarm_job(&self) -> &crate::prewarm_job::Job {
        &self.prewarm
    }

    /// Starts prewarming this cache from the snapshots in `from` (another cache's, or
    /// this one's from an earlier life) on a thread. Snapshots that cannot be read — a
    /// corrupt or truncated file — refuse the prewarm with an error naming the file (the
    /// daemon goes on cold); `Err` also when a prewarm is already running.
    pub fn start_prewarm(self: &Arc<Self>, from: &Path) -> Result<Progress, Progress> {
        self.start_prewarm_of(from, None)
    }

    /// [`Self::start_prewarm`] of some vDisks only (`Some(names)`), or of all.
    pub fn start_prewarm_of(self: &Arc<Self>, from: &Path, vdisks: Option<&[String]>) -> Result<Progress, Progress> {
        let cfg = self.snapshots.lock().unwrap_or_else(|e| e.into_inner()).config.clone();
        let label = match vdisks {
            Some([v]) => crate::log_safe(&format!("{} (vDisk {v})", from.display())),
            Some(v) => crate::log_safe(&format!("{} (vDisks {})", from.display(), v.join(", "))),
            None => crate::log_safe(&from.display().to_string()),
        };
        let prepared = match vdisks.and_then(|v| v.iter().find(|v| self.vdisk(v).is_none())) {
            Some(v) => Err(format!("no vDisk `{v}` is served here")),
            None => self.prepare_prewarm(&cfg, from, vdisks),
        };
        let Prepared { loader, set_vm, pending, planned } = match prepared {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "prewarm refused; the cache starts cold");
                if !self.prewarm.progress().running {
                    self.prewarm.refused(&label, e);
                }
                return Err(self.prewarm.progress());
            }
        };
        if self.prewarm.progress().running {
            return Err(self.prewarm.progress());
        }
        // Snapshots hold the whole set from now on (taken before the job's thread runs
        // too), and it is durable before the first read (a crash resumes from it).
        self.snapshots.lock().unwrap_or_else(|e| e.into_inner()).pending = pending.clone();
        let mut snap = cachevisor_prewarm::Snapshot::new(1, 0, self.block_size as u32);
        snap.sets = pending;
        let keep = pending_dir(&self.meta_dir);
        if let Err(e) = snapshot_files::write(&keep, &snap, 1) {
            tracing::warn!(dir = %keep.display(), error = %e, "the prewarm set could not be saved: a crash would not resume it");
        }
        let d = self.clone();
        self.prewarm.start(
            Progress { from: label, ..planned.clone() },
            Box::new(move |report| {
                let r = d.run_prewarm(loader, &set_vm, planned, report);
                if r.is_ok() {
                    // Done: nothing to resume. (Stopped: kept for the next start.)
                    if let Err(e) = std::fs::remove_dir_all(&keep) {
                        tracing::warn!(dir = %keep.display(), error = %e, "the finished prewarm's set could not be removed");
                    }
                }
                d.snapshots.lock().unwrap_or_else(|e| e.into_inner()).pending.clear();
                r
            }),
        )
    }

    /// The loader for a prewarm from `from`: the history read, scored, limited to this
    /// cache's share for vDisks served here, planned.
    fn prepare_prewarm(&self, cfg: &PrewarmConfig, from: &Path, only: Option<&[String]>) -> Result<Prepared, String> {
        let (_, pacing) = cfg.resolve(self.block_size)?;
        // Each set cut at its vDisk's end while decoded, sets naming no vDisk here left
        // unread, and no set larger than 16 caches of this one (or 2^20 blocks) believed:
        // what a hostile or damaged snapshot can make a prewarm hold is bounded.
        let end_of = |name: &str| {
            self.vdisk(name)
                .filter(|_| only.is_none_or(|o| o.iter().any(|n| n == name)))
                .map(|vm| self.dp.with_engine(|e| e.disk_blocks(vm)))
        };
        let cap = (16 * self.max_cache_blocks()).max(1 << 20);
        let (history, out_of_range) = snapshot_files::read_history_clipped(from, cfg.snapshots_kept, &end_of, cap)?;
        if let Some(s) = history.iter().find(|s| s.block_size as u64 != self.block_size) {
            return Err(format!(
                "{}: snapshot {} has {}-byte blocks, this cache {}-byte ones",
                crate::log_safe(&from.display().to_string()),
                s.seq,
                s.block_size,
                self.block_size
            ));
        }
        let refs: Vec<_> = history.iter().collect();
        let ranking = Ranking::new(&refs, cfg.heuristic);
        let set_vm: Vec<Option<VmId>> =
            ranking.sets.iter().map(|n| self.vdisk(n).filter(|_| only.is_none_or(|o| o.contains(n)))).collect();
        // Each set's vDisk size in blocks: entries past it are skipped and counted, never
        // read (a larger disk's snapshot, or a damaged one; `disk_range.rs` refuses them
        // in the engine too).
        let blocks: Vec<u64> =
            set_vm.iter().map(|vm| vm.map_or(0, |vm| self.dp.with_engine(|e| e.disk_blocks(vm)))).collect();
        let limit = (pacing.limit * self.cache_blocks() as f64).floor() as usize;
        let mut pace = pacing.pace;
        let mut online_skipped = Vec::new();
        let minute_s = cfg.minute_s()?;
        let choice = cfg.online.then(|| self.online_choice(&refs, &ranking, &set_vm, minute_s)).flatten();
        let candidates = match &choice {
            Some(c) => {
                pace = cachevisor_prewarm::settings::online_pace(pace, c.rate, self.block_size);
                online_skipped = c.skipped.iter().map(|n| crate::log_safe(n)).collect();
                &c.chosen
            }
            None => &ranking.objects,
        };
        let served: Vec<_> = candidates
            .iter()
            .filter(|(o, _)| set_vm[o.set as usize].is_some() && o.id < blocks[o.set as usize])
            .take(limit)
            .copied()
            .collect();
        let runs = plan(&served, pacing.max_run);
        let mut pending: BTreeMap<String, RoaringTreemap> = BTreeMap::new();
        for (o, _) in &served {
            pending.entry(ranking.sets[o.set as usize].clone()).or_default().insert(o.id);
        }
        let (mut matched_vdisks, mut unmatched_sets) = (Vec::new(), Vec::new());
        for (name, vm) in ranking.sets.iter().zip(&set_vm) {
            let list = if vm.is_some() { &mut matched_vdisks } else { &mut unmatched_sets };
            list.push(crate::log_safe(name));
        }
        if matched_vdisks.is_empty() {
            tracing::warn!(from = %crate::log_safe(&from.display().to_string()), sets = ?unmatched_sets, "prewarm: no set in the snapshots names a vDisk served here; nothing to load");
        } else if !unmatched_sets.is_empty() {
            tracing::info!(sets = ?unmatched_sets, "prewarm: sets naming no vDisk served here are skipped");
        }
        if out_of_range > 0 {
            tracing::warn!(
                blocks = out_of_range,
                "prewarm: the snapshots name blocks past the end of their vDisk; skipped"
            );
        }
        let lc = LoaderConfig { pace, block_size: self.block_size, busy_depth: 1, idle_depth: 1 };
        tracing::info!(from = %crate::log_safe(&from.display().to_string()), snapshots = history.len(), blocks = served.len(), reads = runs.len(), matched = ?matched_vdisks, "prewarming");
        let planned = Progress {
            snapshots: history.len(),
            planned_blocks: served.len() as u64,
            matched_vdisks,
            unmatched_sets,
            out_of_range_blocks: out_of_range,
            online: cfg.online.then(|| choice.is_some()),
            online_skipped,
            rate_bytes: pace.rate,
            protect_ms: cfg.protect_ms()?,
            ..Progress::default()
        };
        Ok(Prepared { loader: Loader::new(lc, runs), set_vm, pending, planned })
    }

    /// The online parameters' choice (`prewarm::online`) for the vDisks served here, from
    /// the activity in the source's snapshots over their last five minutes of
    /// `minute_s` seconds;
    /// `None` (logged) when the snapshots carry none (format 1, another tool's), and the
    /// configured limit and rate apply.
    fn online_choice(
        &self,
        history: &[&cachevisor_prewarm::Snapshot],
        ranking: &Ranking,
        set_vm: &[Option<VmId>],
        minute_s: f64,
    ) -> Option<online::OnlineChoice> {
        let lookback_ns = (ONLINE_LOOKBACK_MINUTES * minute_s * 1e9) as u64;
        if set_vm.iter().any(Option::is_some) && !online::has_activity(history) {
            tracing::warn!("prewarm.online: the snapshots carry no activity (written before format 2); prewarming with limit and rate");
            return None;
        }
        // A vDisk the snapshots know no activity of was idle: its blocks in the newest
        // snapshot are prewarmed at the floor rate.
        let decisions: Vec<_> = ranking
            .sets
            .iter()
            .map(|name| online::decide(&online::observe(history, name, lookback_ns), self.block_size, minute_s))
            .collect();
        let c = online::choose(ranking, &decisions, u64::MAX);
        tracing::info!(rate = c.rate, skipped = ?c.skipped, "prewarm.online: per-vDisk parameters from the source's activity");
        Some(c)
    }

    /// Runs the loader to its end: each read an engine job, at most one at a time (its
    /// ops run on the device threads behind client ops), paced; a vDisk with requests in
    /// the last [`BUSY_FOR`] counts as busy (the loader's busy rate).
    fn run_prewarm(
        &self,
        mut loader: Loader,
        set_vm: &[Option<VmId>],
        planned: Progress,
        report: Report,
    ) -> Result<(), String> {
        let t0 = Instant::now();
        self.dp.with_engine_mut(|e| e.set_prewarm_protection(planned.protect_ms));
        let mut seen: Vec<(u64, Instant)> = vec![(0, t0); set_vm.len()];
        let progress = |l: &Loader| {
            let p = l.progress();
            Progress {
                planned_blocks: p.planned,
                loaded_blocks: p.loaded,
                skipped_blocks: p.skipped,
                read_bytes: p.bytes_read,
                full_vdisks: p.sets_full,
                elapsed_s: t0.elapsed().as_secs_f64(),
                ..planned.clone()
            }
        };
        report(&progress(&loader));
        loop {
            if self.is_stopped() {
                return Err("the daemon stopped".into());
            }
            let now = Instant::now();
            for (set, vm) in set_vm.iter().enumerate() {
                if let Some(vm) = *vm {
                    let s = self.dp.stats(vm);
                    if s.reads + s.writes != seen[set].0 {
                        seen[set] = (s.reads + s.writes, now);
                    }
                }
            }
            let busy = |set: u32| set_vm[set as usize].is_some() && now.duration_since(seen[set as usize].1) < BUSY_FOR;
            let ns = now.duration_since(t0).as_nanos() as u64;
            let Some(run) = loader.poll_read(ns, busy) else {
                if loader.finished() {
                    report(&progress(&loader));
                    return Ok(());
                }
                let wake =
                    loader.poll_timeout(ns, busy).map_or(MAX_NAP, |t| Duration::from_nanos(t.saturating_sub(ns)));
                std::thread::sleep(wake.min(MAX_NAP));
                continue;
            };
            let vm = set_vm[run.set as usize].expect("only served vDisks are planned");
            let mut o = PrewarmOutcome::default();
            let r = if self.is_live(vm) {
                self.dp.run_job(|e, out| o = e.prewarm_load(vm, run.first, run.len, out))
            } else {
                o.no_room = true; // removed meanwhile: its reads stop
                Ok(false)
            };
            let done = t0.elapsed().as_nanos() as u64;
            match r {
                Err(Failure::Shutdown) => return Err("the daemon stopped".into()),
                Err(f) => {
                    tracing::warn!(vdisk = vm, first = run.first, blocks = run.len, error = ?f, "a prewarm read failed; going on");
                    loader.complete(
                        run,
                        done,
                        ReadOutcome { loaded: 0, skipped: o.skipped + o.out_of_range, no_room: o.no_room },
                    );
                }
                Ok(_) => loader.complete(
                    run,
                    done,
                    ReadOutcome { loaded: o.loaded, skipped: o.skipped + o.out_of_range, no_room: o.no_room },
                ),
            }
            report(&progress(&loader));
        }
    }
}

/// Takes a snapshot on `schedule` until the daemon stops (a thread per daemon): every so
/// long, or every so many requests served (checked five times a second).
pub(crate) fn snapshot_loop(d: std::sync::Weak<Daemon>) {
    let tick = Duration::from_millis(200);
    // The schedule in force, when the next snapshot is due by time and by requests.
    let mut current: Option<SnapshotSchedule> = None;
    let mut next_at = Instant::now();
    let mut next_requests = 0u64;
    loop {
        let Some(d) = d.upgrade() else { return };
        if d.is_stopped() {
            return;
        }
        let schedule = d.snapshot_schedule();
        if current != Some(schedule) {
            // Started, or a reload changed it: counted from now.
            next_at =
                Instant::now() + Duration::from_nanos(if let SnapshotSchedule::Every(ns) = schedule { ns } else { 0 });
            next_requests = d.requests_served() + if let SnapshotSchedule::Requests(n) = schedule { n } else { 0 };
            current = Some(schedule);
        }
        let due = match schedule {
            SnapshotSchedule::Every(ns) => {
                let due = Instant::now() >= next_at;
                if due {
                    next_at = Instant::now() + Duration::from_nanos(ns);
                }
                due
            }
            SnapshotSchedule::Requests(n) => {
                let served = d.requests_served();
                let due = served >= next_requests;
                if due {
                    next_requests = served + n;
                }
                due
            }
            SnapshotSchedule::AtShutdown => false,
        };
        // A detached cache has nothing to snapshot (and must not age the history out).
        if due && d.dp.cache_state() == cachevisor_datapath::CacheState::Attached {
            if let Err(e) = d.take_snapshot() {
                tracing::warn!(error = %e, "periodic cache snapshot failed");
            }
        }
        drop(d);
        std::thread::sleep(tick);
    }
}
