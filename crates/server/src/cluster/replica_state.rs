//! Whether a node's replica log may be replayed, as the cluster's store says:
//! `<prefix>replicas/<owner>` in etcd, a [`ReplicaState`] the owner writes — outside any
//! lease, so it outlives the owner — before its writes stop going through the log
//! (`valid: false`) and once a new log holds everything again (`valid: true`,
//! `replica_log.rs`). The node a dead owner's vDisk restarts on reads it before it
//! replays. One short-lived connection per call: these are rare (a start, a peer lost, a
//! takeover), and the membership agent's connection is its own thread's.

use super::etcd_once::block_on;
use super::settings::ClusterSettings;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// `<prefix>replicas/<owner>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaState {
    /// The node keeping the log.
    pub peer: String,
    /// The log (its records and superblock carry it).
    pub log_id: u64,
    /// Whether it holds every acknowledged write not yet on the backing stores.
    pub valid: bool,
}

fn key(s: &ClusterSettings, owner: &str) -> String {
    format!("{}replicas/{owner}", s.prefix)
}

/// Records `state` as this node's (`s.name`'s).
pub fn publish(s: &ClusterSettings, state: &ReplicaState, deadline: Duration) -> Result<(), String> {
    let body = serde_json::to_vec(state).expect("a replica state serializes");
    let k = key(s, &s.name);
    block_on(s, deadline, async move |c| c.put(k, body, None).await.map(drop))
}

/// What `owner`'s log's state is (`None`: it never had one).
pub fn read(s: &ClusterSettings, owner: &str, deadline: Duration) -> Result<Option<ReplicaState>, String> {
    let k = key(s, owner);
    let value = block_on(s, deadline, async move |c| {
        let r = c.get(k, None).await?;
        Ok(r.kvs().first().map(|kv| kv.value().to_vec()))
    })?;
    match value {
        None => Ok(None),
        Some(v) => serde_json::from_slice(&v)
            .map(Some)
            .map_err(|e| format!("replicas/{}: not a replica state: {e}", crate::log_safe(owner))),
    }
}
