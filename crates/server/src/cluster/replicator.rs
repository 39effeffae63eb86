//! The owner's driver of its replica log (`[cluster] replica = "<peer>"`,
//! "durability beyond ELICA"): the data path hands it each client write of a replicated
//! vDisk once the local part is done — a cache write's bytes become a data record, a
//! backing write a tombstone — and answers the write only once the records are on the
//! peer (`O_DSYNC` there), or, when the log is not usable, once the bytes are on the
//! backing store too. A worker thread runs the log's steps (`replica_log.rs`): trims
//! (destage, then a new tail), and after a failure or at start, telling etcd the log is
//! void, draining the dirty blocks, a new log, and telling etcd it is valid again.
//!
//! The stall a client sees when the peer is cut off: its write's records wait at most
//! `cluster.replica_timeout` (then the peer counts as failed), plus one etcd write; the
//! longest wait is kept (`stall_max_us`) for the status and the bench.

use super::peer_device::{PeerDevice, PeerLinks};
use super::replica_state::{self, ReplicaState};
use crate::config::cluster_section::ClusterSettings;
use cachevisor_cluster::replica_log::{Action, Append, Health, ReplicaLog};
use cachevisor_cluster::replica_record::{self as rr, Geometry, Kind, Record, HEADER};
use cachevisor_datapath::injected::{LogRecord as Rec, Logged, WriteLog};
use cachevisor_datapath::DataPath;
use cachevisor_engine::{Device, Io};
use cachevisor_trace::VmId;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

/// `GET /cluster`'s replica figures.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ReplicaStatus {
    /// The peer keeping the log.
    pub peer: String,
    /// `healthy`, `degrading` or `resyncing`.
    pub health: String,
    /// The live log.
    pub log_id: u64,
    /// Records in use, and the ring's records.
    pub used: u64,
    /// See `used`.
    pub slots: u64,
    /// Records written.
    pub records: u64,
    /// Device writes they took (records ÷ writes: the group commit's batch).
    pub writes: u64,
    /// Mean time of one device write to the peer (µs).
    pub write_mean_us: f64,
    /// Writes that went through to the backing store (the log unusable).
    pub bypassed: u64,
    /// Trims finished.
    pub trims: u64,
    /// The longest a write waited for the log when its record could not be appended at
    /// once (a failed append, a wait for etcd or for room), until it could be answered (µs).
    pub stall_max_us: u64,
}

/// The owner's replica log.
pub(crate) struct Replicator {
    settings: ClusterSettings,
    peer: String,
    device: PeerDevice,
    log: Mutex<ReplicaLog>,
    cv: Condvar,
    /// Replicated vDisks: name by VM id.
    vms: RwLock<Vec<Option<String>>>,
    start: Instant,
    stop: AtomicBool,
    records: AtomicU64,
    writes: AtomicU64,
    write_ns: AtomicU64,
    stall_max_us: AtomicU64,
    batch: Mutex<Batch>,
}

/// Device writes to the peer at once (its connections run them in parallel).
const WRITERS: usize = 2;

/// Records waiting to be written, and the writers writing (group commit).
#[derive(Default)]
struct Batch {
    /// First sequence number → (records, bytes, where the outcome goes).
    pending: BTreeMap<u64, (u64, Vec<u8>, Arc<Outcome>)>,
    writing: usize,
}

/// Whether a write's records reached the peer, once known.
#[derive(Default)]
struct Outcome {
    done: Mutex<Option<bool>>,
    cv: Condvar,
}

impl Outcome {
    /// Sets it (the first outcome counts) and wakes its writer.
    fn set(&self, ok: bool) {
        let mut d = self.done.lock().unwrap_or_else(|e| e.into_inner());
        if d.is_none() {
            *d = Some(ok);
            self.cv.notify_one();
        }
    }

    /// Waits for it at most `t`.
    fn wait_for(&self, t: Duration) -> Option<bool> {
        let d = self.done.lock().unwrap_or_else(|e| e.into_inner());
        if d.is_some() {
            return *d;
        }
        *self.cv.wait_timeout(d, t).unwrap_or_else(|e| e.into_inner()).0
    }
}

impl WriteLog for Replicator {
    fn covers(&self, vm: VmId) -> bool {
        Replicator::covers(self, vm)
    }
    fn log(&self, recs: &[Rec<'_>], local: &mut dyn FnMut() -> std::io::Result<()>) -> std::io::Result<Logged> {
        Replicator::log(self, recs, local)
    }
}

impl Replicator {
    /// The log `peer` keeps for this node, for blocks of `block` bytes. It starts as the
    /// log's rules say (void in etcd, writes through, a resync once the peer answers: its
    /// export's size gives the ring).
    pub(crate) fn new(settings: &ClusterSettings, peer: String, links: Arc<PeerLinks>, block: u64) -> Replicator {
        let device = PeerDevice::replica_log(links, peer.clone());
        let placeholder = Geometry { block, slots: 16 };
        Replicator {
            settings: settings.clone(),
            peer,
            device,
            log: Mutex::new(ReplicaLog::new(placeholder, rand::random::<u64>() | 1)),
            cv: Condvar::new(),
            vms: RwLock::new(Vec::new()),
            start: Instant::now(),
            stop: AtomicBool::new(false),
            records: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            write_ns: AtomicU64::new(0),
            stall_max_us: AtomicU64::new(0),
            batch: Mutex::default(),
        }
    }

    /// Before a new log's superblock: the ring the peer's export holds now.
    fn size_ring(&self) -> Result<(), String> {
        let size = self.device.export_size().map_err(|e| e.to_string())?;
        let mut l = self.lock();
        let block = l.geometry().block;
        let g = Geometry::new(size, block).ok_or_else(|| {
            format!("{}'s replica log ({size} B) holds fewer than 16 records of {block} B", self.peer)
        })?;
        l.set_geometry(g);
        Ok(())
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ReplicaLog> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replicates `vm` (`name`) from now on, or stops (`None`).
    pub(crate) fn set_vdisk(&self, vm: VmId, name: Option<String>) {
        let mut v = self.vms.write().unwrap_or_else(|e| e.into_inner());
        if v.len() <= vm as usize {
            v.resize(vm as usize + 1, None);
        }
        v[vm as usize] = name;
    }

    /// The vDisks whose client writes are logged.
    pub(crate) fn names(&self) -> Vec<String> {
        self.vms.read().unwrap_or_else(|e| e.into_inner()).iter().flatten().cloned().collect()
    }

    /// Whether `vm`'s client writes are logged.
    pub(crate) fn covers(&self, vm: VmId) -> bool {
        self.vms.read().unwrap_or_else(|e| e.into_inner()).get(vm as usize).is_some_and(Option::is_some)
    }

    /// Logs `recs` (a run's client writes) while `local` writes them locally (the records
    /// are queued for the peer first, so the two overlap); returns once both are done —
    /// `Appended` — or, when the log is not usable, once `local` is done: the caller then
    /// writes the data through as well (`Bypass`). `local`'s error is returned as is.
    pub(crate) fn log(
        &self,
        recs: &[Rec<'_>],
        local: &mut dyn FnMut() -> std::io::Result<()>,
    ) -> std::io::Result<Logged> {
        let mut done = false;
        let mut run_local = || {
            if std::mem::replace(&mut done, true) {
                return Ok(());
            }
            local()
        };
        let stopped =
            || std::io::Error::new(std::io::ErrorKind::NotConnected, "stopping: a replicated write was not logged");
        let n = recs.len() as u64;
        let asked = Instant::now();
        let mut waited = Duration::ZERO;
        // Anything but one append that succeeds: the time until the write may be answered
        // counts as a stall (a failed append, a wait for etcd or for room).
        let mut stalled = false;
        let mut next_warn = Duration::from_secs(10);
        let mut l = self.lock();
        loop {
            if self.stop.load(Relaxed) {
                return Err(stopped());
            }
            match l.reserve(n) {
                Append::Granted(first) => {
                    let log_id = l.log_id();
                    let g = l.geometry();
                    drop(l);
                    let queued = self.encode_records(g, log_id, first, recs).map(|buf| self.enqueue(first, n, buf));
                    let written = run_local();
                    let ok = queued.is_some_and(|o| self.settle(&o));
                    l = self.lock();
                    l.appended(ok);
                    l.reported(first); // the engine marked the blocks dirty at dispatch
                    self.cv.notify_all();
                    written?;
                    if ok {
                        self.records.fetch_add(n, Relaxed);
                        if stalled {
                            self.stall_max_us.fetch_max(asked.elapsed().as_micros() as u64, Relaxed);
                        }
                        return Ok(Logged::Appended);
                    }
                    stalled = true;
                }
                Append::Bypass => {
                    drop(l);
                    run_local()?;
                    self.stall_max_us.fetch_max(asked.elapsed().as_micros() as u64, Relaxed);
                    return Ok(Logged::Bypass);
                }
                Append::Full | Append::Wait => {
                    stalled = true;
                    let t = Instant::now();
                    l = self.cv.wait_timeout(l, Duration::from_millis(50)).unwrap_or_else(|e| e.into_inner()).0;
                    waited += t.elapsed();
                    if waited >= next_warn {
                        next_warn += Duration::from_secs(10);
                        tracing::warn!(
                            waited_s = waited.as_secs(),
                            "replica log: a write has waited a long time for the log (etcd unreachable?)"
                        );
                    }
                }
            }
        }
    }

    /// The bytes of records `first..` (each a whole ring slot); `None` for a record the
    /// log cannot hold (a vDisk no longer replicated, a cache write not in whole sectors).
    fn encode_records(&self, g: Geometry, log_id: u64, first: u64, recs: &[Rec<'_>]) -> Option<Vec<u8>> {
        let names = self.vms.read().unwrap_or_else(|e| e.into_inner());
        let rb = g.record_bytes() as usize;
        let mut buf = vec![0u8; rb * recs.len()];
        for (i, r) in recs.iter().enumerate() {
            let Some(Some(vdisk)) = names.get(r.vm as usize) else { return None };
            let data = r.data.unwrap_or(&[]);
            let (offset, len) = match r.data {
                Some(_) if rr::check(vdisk, r.offset, r.len, g.block).is_ok() => (r.offset, r.len),
                Some(_) => {
                    tracing::error!(offset = r.offset, len = r.len, "replica log: a cache write not in whole sectors");
                    return None;
                }
                None => rr::tombstone_range(r.offset, r.len),
            };
            let rec = Record {
                log_id,
                seq: first + i as u64,
                kind: if r.data.is_some() { Kind::Data } else { Kind::Tombstone },
                vdisk: vdisk.clone(),
                offset,
                len,
                data_crc: rr::crc(data),
            };
            let at = i * rb;
            buf[at..at + HEADER as usize].copy_from_slice(&rec.encode());
            buf[at + HEADER as usize..at + HEADER as usize + data.len()].copy_from_slice(data);
        }
        Some(buf)
    }

    /// Queues `n` records from `first` (their bytes `buf`) for the peer; the slot their
    /// outcome arrives in.
    fn enqueue(&self, first: u64, n: u64, buf: Vec<u8>) -> Arc<Outcome> {
        let slot = Arc::new(Outcome::default());
        self.batch.lock().unwrap_or_else(|e| e.into_inner()).pending.insert(first, (n, buf, slot.clone()));
        slot
    }

    /// Waits for `mine`, writing what is queued meanwhile — group commit: while fewer than
    /// [`WRITERS`] write, a waiting thread takes every batch queued and writes runs of
    /// consecutive records as one device write (on the peer one `O_DSYNC` write), and goes
    /// on while batches are queued (so none is left behind) before it looks at its own;
    /// the others sleep until their outcome is set (only their thread wakes). Whether the
    /// records reached the peer.
    fn settle(&self, mine: &Outcome) -> bool {
        loop {
            let mut b = self.batch.lock().unwrap_or_else(|e| e.into_inner());
            if b.writing < WRITERS && !b.pending.is_empty() {
                b.writing += 1;
                let taken = std::mem::take(&mut b.pending);
                drop(b);
                // Stable while records are queued: a new ring comes only with a resync,
                // which waits until every granted record was reported.
                let g = self.lock().geometry();
                let mut slots: BTreeMap<u64, Arc<Outcome>> = BTreeMap::new();
                let runs = taken
                    .into_iter()
                    .map(|(f, (n, buf, o))| {
                        slots.insert(f, o);
                        (f, (n, buf))
                    })
                    .collect();
                for (first, written) in self.write_runs(g, runs) {
                    slots[&first].set(written);
                }
                self.batch.lock().unwrap_or_else(|e| e.into_inner()).writing -= 1;
                continue;
            }
            drop(b);
            if let Some(ok) = mine.wait_for(Duration::from_millis(2)) {
                return ok;
            }
        }
    }

    /// Writes batches (first → (count, bytes)), consecutive ones as one run of at most
    /// 4 MiB; each batch's first with whether its run was written.
    fn write_runs(&self, g: Geometry, taken: BTreeMap<u64, (u64, Vec<u8>)>) -> Vec<(u64, bool)> {
        let mut out = Vec::with_capacity(taken.len());
        let mut run: Vec<u64> = Vec::new();
        let (mut start, mut end, mut bytes) = (0u64, 0u64, Vec::new());
        let flush = |run: &mut Vec<u64>, start: u64, bytes: &mut Vec<u8>, out: &mut Vec<(u64, bool)>| {
            if run.is_empty() {
                return;
            }
            let ok = self.write_run(g, start, bytes);
            out.extend(run.drain(..).map(|f| (f, ok)));
            bytes.clear();
        };
        for (first, (n, buf)) in taken {
            if run.is_empty() || first != end || bytes.len() + buf.len() > 4 << 20 {
                flush(&mut run, start, &mut bytes, &mut out);
                start = first;
            }
            run.push(first);
            bytes.extend_from_slice(&buf);
            end = first + n;
        }
        flush(&mut run, start, &mut bytes, &mut out);
        out
    }

    /// Writes records from `first` (whole slots) into the ring, split where it wraps.
    fn write_run(&self, g: Geometry, first: u64, bytes: &[u8]) -> bool {
        let rb = g.record_bytes() as usize;
        let count = bytes.len() / rb;
        let mut i = 0;
        while i < count {
            let seq = first + i as u64;
            let k = ((g.slots - seq % g.slots) as usize).min(count - i);
            self.writes.fetch_add(1, Relaxed);
            let t = Instant::now();
            let r = self.device.submit(0, g.offset_of(seq), Io::Write(&bytes[i * rb..(i + k) * rb]));
            self.write_ns.fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
            if let Err(e) = r {
                tracing::debug!(%e, "replica log: append failed");
                return false;
            }
            i += k;
        }
        true
    }

    /// The figures.
    pub(crate) fn status(&self) -> ReplicaStatus {
        let l = self.lock();
        ReplicaStatus {
            peer: self.peer.clone(),
            health: match l.health() {
                Health::Healthy => "healthy",
                Health::Degrading => "degrading",
                Health::Resyncing => "resyncing",
            }
            .into(),
            log_id: l.log_id(),
            used: l.used(),
            slots: l.geometry().slots,
            records: self.records.load(Relaxed),
            writes: self.writes.load(Relaxed),
            write_mean_us: self.write_ns.load(Relaxed) as f64 / 1000.0 / self.writes.load(Relaxed).max(1) as f64,
            bypassed: l.bypassed,
            trims: l.trims,
            stall_max_us: self.stall_max_us.load(Relaxed),
        }
    }

    /// Stops: writes waiting for the log fail (shutdown).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Relaxed);
        self.cv.notify_all();
    }

    /// Runs the log's steps until stopped or `dp` is gone.
    pub(crate) fn run(self: &Arc<Self>, dp: Weak<DataPath>) {
        let mut resync_failures = 0u64;
        while !self.stop.load(Relaxed) {
            let action = self.lock().poll_action(self.now_ms());
            let Some(a) = action else {
                let l = self.lock();
                drop(self.cv.wait_timeout(l, Duration::from_millis(20)).unwrap_or_else(|e| e.into_inner()));
                continue;
            };
            let Some(dp) = dp.upgrade() else { return };
            match a {
                Action::Destage => {
                    let vms: Vec<VmId> = {
                        let v = self.vms.read().unwrap_or_else(|e| e.into_inner());
                        (0..v.len() as VmId).filter(|&i| v[i as usize].is_some()).collect()
                    };
                    let r = dp.destage_pass(&vms);
                    if let Err(e) = &r {
                        tracing::warn!(?e, "replica log: destage failed; tried again");
                    }
                    self.lock().destaged(self.now_ms(), r.is_ok());
                }
                Action::WriteSuperblock(sb) => {
                    let resync = self.lock().health() != Health::Healthy;
                    let sized = if resync { self.size_ring() } else { Ok(()) };
                    if let Err(e) = &sized {
                        tracing::debug!(%e, "replica log: the peer's log is not reachable yet");
                    }
                    let (at, bytes) = sb.encode();
                    let ok = sized.is_ok() && self.device.submit(0, at, Io::Write(&bytes)).is_ok();
                    if resync {
                        // Said once, then every ~10 s (a retry every 200 ms) while it lasts.
                        resync_failures = if ok { 0 } else { resync_failures + 1 };
                        if resync_failures % 50 == 1 {
                            tracing::warn!(peer = %self.peer, "replica log: the peer's log cannot be written; the replicated vDisks write through to their backing stores until it can");
                        }
                    }
                    self.lock().superblock_written(self.now_ms(), ok);
                }
                Action::Publish { valid, log_id } => {
                    let st = ReplicaState { peer: self.peer.clone(), log_id, valid };
                    let r = replica_state::publish(&self.settings, &st, Duration::from_secs(1));
                    match &r {
                        Ok(()) => tracing::info!(valid, log_id, peer = %self.peer, "replica log: state published"),
                        Err(e) => tracing::warn!(%e, "replica log: publishing its state failed; tried again"),
                    }
                    self.lock().published(self.now_ms(), r.is_ok());
                }
            }
            self.cv.notify_all();
        }
    }
}
