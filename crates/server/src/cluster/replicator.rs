//! The owner's driver of its replica log (`[cluster] replica = "<peer>"`,
//! "durability beyond ELICA"): the data path hands it each client write of a replicated
//! vDisk as the write's local part starts — a cache write's bytes become a data record, a
//! backing write a tombstone — and holds the write's answer until the records are on the
//! peer (`O_DSYNC` there), or, when the log is not usable, until the bytes are on the
//! backing store too (`datapath/src/logged_writes.rs`). Writer threads append what is
//! queued (`replica_writer.rs`); a worker thread runs the log's steps (`replica_log.rs`):
//! trims (destage, then a new tail), and after a failure or at start, telling etcd the
//! log is void, draining the dirty blocks, a new log, and telling etcd it is valid again.
//!
//! The stall a client sees when the peer is cut off: its write's records wait at most
//! `cluster.replica_timeout` (then the peer counts as failed), plus one etcd write; the
//! longest wait is kept (`stall_max_us`) for the status and the bench.

use super::peer_device::{PeerDevice, PeerLinks};
use super::replica_state::{self, ReplicaState};
use crate::config::cluster_section::ClusterSettings;
use cachevisor_cluster::replica_log::{Action, Health, ReplicaLog};
use cachevisor_cluster::replica_record::Geometry;
use cachevisor_datapath::injected::{LogOutcomes, LogRecord as Rec, WriteLog};
use cachevisor_datapath::DataPath;
use cachevisor_engine::{Device, Io};
use cachevisor_trace::VmId;
use serde::Serialize;
use std::collections::HashMap;
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
    pub(super) device: PeerDevice,
    state: Mutex<LogState>,
    /// Signalled when the log changes (room after a trim, a new health).
    pub(super) cv: Condvar,
    /// Replicated vDisks: name by VM id.
    vms: RwLock<Vec<Option<String>>>,
    start: Instant,
    pub(super) stop: AtomicBool,
    pub(super) records: AtomicU64,
    pub(super) writes: AtomicU64,
    pub(super) write_ns: AtomicU64,
    pub(super) stall_max_us: AtomicU64,
    /// Writes waiting for their records to be appended (`replica_writer.rs`).
    pub(super) queue: Mutex<std::collections::VecDeque<super::replica_writer::Queued>>,
    pub(super) queue_cv: Condvar,
    /// Where outcomes go (the data path's).
    pub(super) sink: std::sync::OnceLock<LogOutcomes>,
}

/// The log and what it must be told of the writes it holds.
pub(super) struct LogState {
    pub(super) log: ReplicaLog,
    /// Writes whose local part or log outcome is still to come: ticket → its track.
    pub(super) tracks: HashMap<u64, Track>,
}

/// A write's standing: its records count as reported to the engine
/// ([`ReplicaLog::reported`]) once both its local part ended and their append's outcome
/// is known (a trim's destage then finds the blocks dirty, and no write to a slot behind
/// a new tail is still under way).
#[derive(Default)]
pub(super) struct Track {
    pub(super) local: bool,
    /// Its outcome was delivered.
    pub(super) delivered: bool,
    /// Firsts of its appends whose outcome is known, not yet reported.
    pub(super) appended: Vec<u64>,
}

impl LogState {
    /// Write `ticket`'s append from `first` ended.
    pub(super) fn appended(&mut self, ticket: u64, first: u64) {
        let t = self.tracks.entry(ticket).or_default();
        if t.local {
            self.log.reported(first);
        } else {
            t.appended.push(first);
        }
    }

    /// Write `ticket`'s outcome was delivered.
    pub(super) fn delivered(&mut self, ticket: u64) {
        let t = self.tracks.entry(ticket).or_default();
        t.delivered = true;
        if t.local {
            self.tracks.remove(&ticket);
        }
    }

    /// Write `ticket`'s local part ended: the appends whose outcome is known are reported
    /// now, later ones as they end ([`Self::appended`]).
    pub(super) fn local_done(&mut self, ticket: u64) {
        let t = self.tracks.entry(ticket).or_default();
        t.local = true;
        let (firsts, delivered) = (std::mem::take(&mut t.appended), t.delivered);
        for f in firsts {
            self.log.reported(f);
        }
        if delivered {
            self.tracks.remove(&ticket);
        }
    }
}

impl WriteLog for Replicator {
    fn covers(&self, vm: VmId) -> bool {
        Replicator::covers(self, vm)
    }
    fn attach(&self, outcomes: LogOutcomes) {
        let _ = self.sink.set(outcomes);
    }
    fn submit(&self, ticket: u64, recs: Vec<Rec>) {
        self.enqueue(ticket, recs);
    }
    fn local_done(&self, ticket: u64) {
        self.lock().local_done(ticket);
        self.cv.notify_all();
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
            state: Mutex::new(LogState {
                log: ReplicaLog::new(placeholder, rand::random::<u64>() | 1),
                tracks: HashMap::new(),
            }),
            cv: Condvar::new(),
            vms: RwLock::new(Vec::new()),
            start: Instant::now(),
            stop: AtomicBool::new(false),
            records: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            write_ns: AtomicU64::new(0),
            stall_max_us: AtomicU64::new(0),
            queue: Mutex::default(),
            queue_cv: Condvar::new(),
            sink: std::sync::OnceLock::new(),
        }
    }

    /// Before a new log's superblock: the ring the peer's export holds now.
    fn size_ring(&self) -> Result<(), String> {
        let size = self.device.export_size().map_err(|e| e.to_string())?;
        let mut st = self.lock();
        let block = st.log.geometry().block;
        let g = Geometry::new(size, block).ok_or_else(|| {
            format!("{}'s replica log ({size} B) holds fewer than 16 records of {block} B", self.peer)
        })?;
        st.log.set_geometry(g);
        Ok(())
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replicates `vm` (`name`) from now on, or stops (`None`).
    pub(crate) fn set_vdisk(&self, vm: VmId, name: Option<String>) {
        let mut v = self.vms.write().unwrap_or_else(|e| e.into_inner());
        if v.len() <= vm as usize {
            v.resize(vm as usize + 1, None);
        }
        v[vm as usize] = name;
    }

    /// Replicated vDisks' names by VM id.
    pub(super) fn vms_read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Option<String>>> {
        self.vms.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The vDisks whose client writes are logged.
    pub(crate) fn names(&self) -> Vec<String> {
        self.vms.read().unwrap_or_else(|e| e.into_inner()).iter().flatten().cloned().collect()
    }

    /// Whether `vm`'s client writes are logged.
    pub(crate) fn covers(&self, vm: VmId) -> bool {
        self.vms.read().unwrap_or_else(|e| e.into_inner()).get(vm as usize).is_some_and(Option::is_some)
    }

    /// The figures.
    pub(crate) fn status(&self) -> ReplicaStatus {
        let st = self.lock();
        let l = &st.log;
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
        self.queue_cv.notify_all();
    }

    /// Runs the log's writers and its steps until stopped or `dp` is gone.
    pub(crate) fn run(self: &Arc<Self>, dp: Weak<DataPath>) {
        std::thread::scope(|scope| {
            for i in 0..super::replica_writer::WRITERS {
                std::thread::Builder::new()
                    .name(format!("cv-replica-w{i}"))
                    .spawn_scoped(scope, || self.write_loop())
                    .expect("spawning a replica log writer");
            }
            self.run_steps(dp);
            self.stop(); // the data path is gone: the writers end too
        });
    }

    /// Runs the log's steps until stopped or `dp` is gone.
    fn run_steps(&self, dp: Weak<DataPath>) {
        let mut resync_failures = 0u64;
        while !self.stop.load(Relaxed) {
            let action = self.lock().log.poll_action(self.now_ms());
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
                    self.lock().log.destaged(self.now_ms(), r.is_ok());
                }
                Action::WriteSuperblock(sb) => {
                    let resync = self.lock().log.health() != Health::Healthy;
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
                    self.lock().log.superblock_written(self.now_ms(), ok);
                }
                Action::Publish { valid, log_id } => {
                    let st = ReplicaState { peer: self.peer.clone(), log_id, valid };
                    let r = replica_state::publish(&self.settings, &st, Duration::from_secs(1));
                    match &r {
                        Ok(()) => tracing::info!(valid, log_id, peer = %self.peer, "replica log: state published"),
                        Err(e) => tracing::warn!(%e, "replica log: publishing its state failed; tried again"),
                    }
                    self.lock().log.published(self.now_ms(), r.is_ok());
                }
            }
            self.cv.notify_all();
        }
    }
}
