//! A dead owner's write-back vDisk restarted on this node ("dirty data whose
//! only remaining copy is a replica is written back first"): before the vDisk is served,
//! the owner's replica log is read from the peer keeping it (`replica-<owner>@<epoch>`,
//! which every live member may read once the owner is gone) and its live records for
//! this vDisk are written to the backing store and made durable (`replica_replay.rs`
//! decides which bytes). Done once per (owner, log, vDisk): `METADATA/cluster-replays.json`
//! remembers it, so a vDisk removed and added again here is not rolled back to the log.

use super::replica_state::ReplicaState;
use super::Cluster;
use cachevisor_cluster::replica_record::{self as rr, Geometry, Superblock, RING_START};
use cachevisor_cluster::replica_replay;
use cachevisor_store::backing::Backing;
use std::path::{Path, PathBuf};

/// What a takeover must replay: `owner`'s log `state.log_id`, kept by `state.peer`.
#[derive(Debug, Clone)]
pub struct Replay {
    /// The dead home.
    pub owner: String,
    /// Its replica state in etcd.
    pub state: ReplicaState,
}

/// What a replay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Replayed {
    /// Live records in the log (every vDisk's; a data record's checksum not looked at
    /// unless it is this vDisk's).
    pub records: u64,
    /// Bytes written to the backing store.
    pub bytes: u64,
}

fn done_file(meta: &Path) -> PathBuf {
    meta.join("cluster-replays.json")
}

fn key(r: &Replay, vdisk: &str) -> String {
    format!("{}/{}/{vdisk}", r.owner, r.state.log_id)
}

fn load(meta: &Path) -> Result<Vec<String>, String> {
    match cachevisor_files::bounded_read::read(&done_file(meta), cachevisor_files::bounded_read::STATE_CAP) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| format!("{}: damaged ({e})", done_file(meta).display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(format!("{}: {e}", done_file(meta).display())),
    }
}

/// Replays `r` for `vdisk` onto `backing` unless this node did already; `certs` are this
/// node's client credentials.
pub(crate) fn replay_once(
    c: &Cluster,
    r: &Replay,
    vdisk: &str,
    backing: &Backing,
    certs: &Path,
    meta: &Path,
) -> Result<Replayed, String> {
    let mut done = load(meta)?;
    if done.contains(&key(r, vdisk)) {
        return Ok(Replayed::default());
    }
    let out = replay(c, r, vdisk, backing, certs)?;
    done.push(key(r, vdisk));
    cachevisor_files::private_files::write_atomic(
        &done_file(meta),
        &serde_json::to_vec(&done).expect("strings serialize"),
    )
    .map_err(|e| format!("{}: {e}", done_file(meta).display()))?;
    Ok(out)
}

fn replay(c: &Cluster, r: &Replay, vdisk: &str, backing: &Backing, certs: &Path) -> Result<Replayed, String> {
    let (addr, epoch) = c
        .replica_target(&r.state.peer)
        .ok_or_else(|| format!("{} (keeping {}'s replica log) is not a live member", r.state.peer, r.owner))?;
    let uri = format!(
        "nbds://{addr}/{}?tls-certificates={}",
        super::replica_host::ReplicaLogs::export_name(&r.owner, epoch),
        certs.display()
    );
    let log = Backing::connect_once(Path::new(&uri)).map_err(|e| format!("{uri}: {e}"))?;
    let size = log.size().map_err(|e| format!("{uri}: {e}"))?;
    let mut first = vec![0u8; 1024];
    log.read_at(&mut first, 0).map_err(|e| format!("{uri}: {e}"))?;
    let sb = Superblock::decode(&first).ok_or_else(|| format!("{}'s replica log has no valid superblock", r.owner))?;
    if sb.log_id != r.state.log_id {
        return Err(format!(
            "{}'s replica log is log {} but etcd names log {}: not replayed",
            r.owner, sb.log_id, r.state.log_id
        ));
    }
    let g = Geometry::new(size, sb.block).ok_or_else(|| format!("{}'s replica log: a ring of no records", r.owner))?;
    // Read piece by piece (a log may be far larger than memory should hold), keeping
    // this vDisk's live records only.
    let per_piece = ((4u64 << 20) / g.record_bytes()).max(1);
    let mut piece = vec![0u8; (per_piece * g.record_bytes()) as usize];
    let (mut found, mut live) = (Vec::new(), 0u64);
    let mut slot = 0;
    while slot < g.slots {
        let n = per_piece.min(g.slots - slot);
        let bytes = &mut piece[..(n * g.record_bytes()) as usize];
        log.read_at(bytes, RING_START + slot * g.record_bytes()).map_err(|e| format!("{uri}: {e}"))?;
        let counted = std::cell::Cell::new(0u64);
        found.extend(rr::scan_part(g, &sb, slot, bytes, |r| {
            counted.set(counted.get() + 1);
            r.vdisk == vdisk
        }));
        live += counted.get();
        slot += n;
    }
    let plan = replica_replay::plan(vdisk, &found);
    let mut bytes = 0u64;
    for e in &plan {
        backing.write_at(&e.data, e.offset).map_err(|x| format!("writing {vdisk}'s backing store: {x}"))?;
        bytes += e.data.len() as u64;
    }
    backing.sync().map_err(|x| format!("syncing {vdisk}'s backing store: {x}"))?;
    tracing::info!(vdisk, owner = %r.owner, peer = %r.state.peer, live, records = found.len(), bytes, "replica log replayed onto the backing store");
    Ok(Replayed { records: live, bytes })
}
