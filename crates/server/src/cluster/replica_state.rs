//! Whether a node's replica log may be replayed, as the cluster's store says:
//! `<prefix>replicas/<owner>` in etcd, a [`ReplicaState`] the owner writes — outside any
//! lease, so it outlives the owner — before its writes stop going through the log
//! (`valid: false`) and once a new log holds everything again (`valid: true`,
//! `replica_log.rs`). The node a dead owner's vDisk restarts on reads it before it
//! replays. One short-lived connection per call: these are rare (a start, a peer lost, a
//! takeover), and the membership agent's connection is its own thread's.

use super::etcd_once::block_on;
use crate::config::cluster_section::ClusterSettings;
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
pub(crate) fn publish(s: &ClusterSettings, state: &ReplicaState, deadline: Duration) -> Result<(), String> {
    let body = serde_json::to_vec(state).expect("a replica state serializes");
    let k = key(s, &s.name);
    block_on(s, deadline, async move |c| c.put(k, body, None).await.map(drop))
}

/// What `owner`'s log's state is (`None`: it never had one).
pub(crate) fn read(s: &ClusterSettings, owner: &str, deadline: Duration) -> Result<Option<ReplicaState>, String> {
    let k = key(s, owner);
    let value = block_on(s, deadline, async move |c| {
        let r = c.get(k, None).await?;
        Ok(r.kvs().first().map(|kv| kv.value().to_vec()))
    })?;
    value.map(|v| decode(owner, &v)).transpose()
}

/// `owner`'s record as etcd holds it; an unreadable one is an error naming the key (a
/// replay never guesses).
fn decode(owner: &str, v: &[u8]) -> Result<ReplicaState, String> {
    serde_json::from_slice(v).map_err(|e| format!("replicas/{}: not a replica state: {e}", crate::log_safe(owner)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_a_corrupt_one_is_named() {
        let st = ReplicaState { peer: "b".into(), log_id: 7, valid: true };
        assert_eq!(decode("a", &serde_json::to_vec(&st).unwrap()).unwrap(), st);
        for bad in [&b"{\"peer\":\"b\"}"[..], b"not json", b"{\"peer\":1,\"log_id\":1,\"valid\":true}"] {
            let e = decode("a\nb", bad).unwrap_err();
            assert!(e.starts_with("replicas/a") && e.contains("not a replica state") && !e.contains('\n'), "{e}");
        }
    }
}
