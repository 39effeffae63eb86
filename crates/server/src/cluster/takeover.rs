//! Failover with prewarming (the Nutanix study's slides, made real; ROADMAP §4): when a
//! vDisk's home moves to this node — its VM restarted here after its node died, or moved
//! — the cluster map says where it came from (`moved_from`, at epoch `moved_at`), and
//! this node prewarms it from that node's last snapshots, which the cluster keeps where
//! every node can read them (`cluster.snapshots`, beside the backing store). The prewarm
//! is the daemon's usual one: scored, limited, rate-limited and yielding to the VMs' own
//! I/O, with the online parameters when `prewarm.online` is set.
//!
//! Each move is prewarmed once: the moves handled are kept in the metadata directory
//! (`cluster-moves.json`, written atomically), so a restart of this node does not load a
//! dead node's old snapshots over a cache that has its own history by then.

use cachevisor_cluster::cluster_map::ClusterMap;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The moves this node handled: vDisk name → the epoch of the move prewarmed.
#[derive(Debug)]
pub(crate) struct Takeovers {
    file: PathBuf,
    done: Mutex<BTreeMap<String, u64>>,
}

/// A prewarm to start: from the node `from`'s snapshots, these vDisks (each with the epoch
/// of its move).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Due {
    /// The node the vDisks came from.
    pub from: String,
    /// The vDisks and the epochs of their moves.
    pub vdisks: Vec<(String, u64)>,
}

/// The moves to prewarm: vDisks homed at `me` and served here whose map entry says they
/// came from another node at an epoch not handled yet, grouped by that node (one prewarm
/// per source, in name order; the first group is returned).
pub(crate) fn due(map: &ClusterMap, me: &str, served: &BTreeSet<String>, done: &BTreeMap<String, u64>) -> Option<Due> {
    let mut by_from: BTreeMap<&str, Vec<(String, u64)>> = BTreeMap::new();
    for (name, e) in &map.vdisks {
        let Some(from) = e.moved_from.as_deref() else { continue };
        // The name becomes a directory under the shared one: a map record naming no
        // node a config could (`..`, `/`) is skipped, never followed.
        if crate::config::cluster_section::check_name("name", from).is_err() {
            tracing::warn!(vdisk = %crate::log_safe(name), "cluster: a map entry's moved_from is not a node name; not prewarmed");
            continue;
        }
        if e.home != me || from == me || !served.contains(name) || done.get(name).is_some_and(|&at| at >= e.moved_at) {
            continue;
        }
        by_from.entry(from).or_default().push((name.clone(), e.moved_at));
    }
    by_from.into_iter().next().map(|(from, vdisks)| Due { from: from.to_string(), vdisks })
}

impl Takeovers {
    /// The moves handled so far, read from `meta_dir` (none when the file is absent; an
    /// unreadable file is an error naming it).
    pub(crate) fn load(meta_dir: &Path) -> Result<Takeovers, String> {
        let file = meta_dir.join("cluster-moves.json");
        let done = match cachevisor_files::bounded_read::read(&file, cachevisor_files::bounded_read::STATE_CAP) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| format!("{}: {e}", file.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(format!("{}: {e}", file.display())),
        };
        Ok(Takeovers { file, done: Mutex::new(done) })
    }

    /// The next prewarm to start for `map`, if any.
    pub(crate) fn due(&self, map: &ClusterMap, me: &str, served: &BTreeSet<String>) -> Option<Due> {
        due(map, me, served, &self.done.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Records `d` handled (durably, so a restart does not redo it).
    pub(crate) fn mark(&self, d: &Due) {
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        for (v, at) in &d.vdisks {
            done.insert(v.clone(), *at);
        }
        if let Err(e) = self.save(&done) {
            tracing::warn!(file = %self.file.display(), error = %e, "cluster: the moves prewarmed could not be saved; a restart may prewarm them again");
        }
    }

    /// Forgets `d` (its prewarm could not start for now: it is tried again).
    pub(crate) fn unmark(&self, d: &Due) {
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        for (v, _) in &d.vdisks {
            done.remove(v);
        }
    }

    fn save(&self, done: &BTreeMap<String, u64>) -> std::io::Result<()> {
        cachevisor_files::private_files::write_atomic(&self.file, &serde_json::to_vec(done).expect("a map serializes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachevisor_cluster::cluster_map::VdiskEntry;

    fn entry(id: u16, home: &str, from: Option<&str>, at: u64) -> VdiskEntry {
        VdiskEntry {
            id: id as _,
            home: home.into(),
            moved_from: from.map(str::to_string),
            moved_at: at,
            write_back: false,
            replicated: false,
        }
    }

    #[test]
    fn a_move_here_is_due_once_per_epoch_grouped_by_the_node_it_came_from() {
        let mut map = ClusterMap::default();
        map.vdisks.insert("v1".into(), entry(0, "b", Some("a"), 4));
        map.vdisks.insert("v2".into(), entry(1, "b", Some("a"), 4));
        map.vdisks.insert("v3".into(), entry(2, "b", Some("c"), 5));
        map.vdisks.insert("v4".into(), entry(3, "b", None, 0)); // never moved
        map.vdisks.insert("v5".into(), entry(4, "c", Some("b"), 6)); // moved away from here
        map.vdisks.insert("v6".into(), entry(5, "b", Some("a"), 4)); // not served here (yet)
        let served: BTreeSet<String> = ["v1", "v2", "v3", "v4", "v5"].map(String::from).into();
        let d = due(&map, "b", &served, &BTreeMap::new()).unwrap();
        assert_eq!(d, Due { from: "a".into(), vdisks: vec![("v1".into(), 4), ("v2".into(), 4)] });
        let mut done: BTreeMap<String, u64> = [("v1".into(), 4), ("v2".into(), 4)].into();
        let d = due(&map, "b", &served, &done).unwrap();
        assert_eq!(d, Due { from: "c".into(), vdisks: vec![("v3".into(), 5)] });
        done.insert("v3".into(), 5);
        assert_eq!(due(&map, "b", &served, &done), None);
        // A map record whose old home is no node name is never a path to follow.
        let mut bad = map.clone();
        bad.vdisks.insert("v9".into(), entry(8, "b", Some("../../etc"), 9));
        let mut served9 = served.clone();
        served9.insert("v9".into());
        assert_eq!(due(&bad, "b", &served9, &done), None);
        // v1 moves away and back again later: due again.
        map.vdisks.insert("v1".into(), entry(0, "b", Some("c"), 9));
        assert_eq!(due(&map, "b", &served, &done), Some(Due { from: "c".into(), vdisks: vec![("v1".into(), 9)] }));
    }

    #[test]
    fn the_moves_handled_survive_a_restart_and_a_damaged_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let t = Takeovers::load(dir.path()).unwrap();
        let d = Due { from: "a".into(), vdisks: vec![("v1".into(), 3)] };
        t.mark(&d);
        let again = Takeovers::load(dir.path()).unwrap();
        let mut map = ClusterMap::default();
        map.vdisks.insert("v1".into(), entry(0, "b", Some("a"), 3));
        let served: BTreeSet<String> = ["v1".to_string()].into();
        assert_eq!(again.due(&map, "b", &served), None, "handled before the restart");
        again.unmark(&d);
        assert_eq!(again.due(&map, "b", &served), Some(d));
        std::fs::write(dir.path().join("cluster-moves.json"), b"{oops").unwrap();
        let e = Takeovers::load(dir.path()).unwrap_err();
        assert!(e.contains("cluster-moves.json"), "{e}");
    }
}
