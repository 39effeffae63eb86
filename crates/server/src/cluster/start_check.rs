//! A cluster node's start, before its cache is touched: which of the vDisks it is starting
//! with moved away while it was down (ROADMAP §4, the returning owner). A node SIGKILLed
//! with dirty blocks of a vDisk that was then served by another node — replayed there
//! from its replica log, or added there with force — holds blocks older than what that
//! node wrote: writing them back (the flusher, a destage, the replica log's resync) would
//! overwrite newer data on the backing store, and serving them would show a VM stale
//! bytes. So the map and the live members are read from etcd first (`read_view`); each
//! vDisk another node serves or homes now (`ClusterMap::served_elsewhere`, pure) is not
//! served here and its cached blocks are dropped, dirty ones too, before the data path
//! starts (`daemon/start.rs`). A map that cannot be read refuses the start: what is
//! safe is unknown. The vDisks that stay are claimed in etcd before anything is served
//! (`claims.rs`): a claim another node holds moves that vDisk away too.

use super::claims::{self, StartLease};
use super::etcd_once::block_on;
use crate::config::cluster_section::ClusterSettings;
use cachevisor_cluster::cluster_map::ClusterMap;
use cachevisor_cluster::membership::MemberInfo;
use serde::Serialize;
use std::time::{Duration, Instant};

/// A vDisk of this node's config that another node serves or homes now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MovedAway {
    /// The vDisk.
    pub vdisk: String,
    /// The node the map or a live member says has it.
    pub node: String,
    /// Its blocks this node still cached, dropped unwritten (of which dirty).
    pub dropped_blocks: u64,
    /// Of those, dirty.
    pub dropped_dirty: u64,
}

/// The map (epoch 0 when none was written yet) and the live members, as etcd holds them.
pub(crate) fn read_view(s: &ClusterSettings, deadline: Duration) -> Result<(ClusterMap, Vec<MemberInfo>), String> {
    let prefix = s.prefix.clone();
    let kvs = block_on(s, deadline, async move |c| {
        let r = c.get(prefix, Some(etcd_client::GetOptions::new().with_prefix())).await?;
        Ok(r.kvs().iter().map(|kv| (kv.key().to_vec(), kv.value().to_vec())).collect::<Vec<_>>())
    })?;
    let (mut map, mut members) = (ClusterMap::default(), Vec::new());
    for (k, v) in kvs {
        let k = String::from_utf8_lossy(&k);
        let k = k.strip_prefix(&s.prefix).unwrap_or_default();
        if k == "map" {
            super::bad_records::small_enough(&v).map_err(|e| format!("the cluster map in etcd: {e}"))?;
            map = ClusterMap::decode(&v).map_err(|e| e.to_string())?;
        } else if k.starts_with("members/") {
            members.extend(super::agent::decode_member(k, &v));
        }
    }
    Ok((map, members))
}

/// How long a start waits for etcd to answer: a few lease TTLs, at least 10 s (etcd
/// restarting beside the node, a slow election).
pub(crate) fn wait(s: &ClusterSettings) -> Duration {
    Duration::from_millis((3 * s.timing.lease_ttl_ms).max(10_000))
}

/// Which of `vdisks` moved away from this node (name, node), asking etcd until `wait`
/// runs out; `Err` says why the start cannot go on.
pub(crate) fn moved_away(
    s: &ClusterSettings,
    vdisks: &[String],
    wait: Duration,
) -> Result<Vec<(String, String)>, String> {
    let end = Instant::now() + wait;
    let (map, members) = loop {
        let left = end.saturating_duration_since(Instant::now());
        match read_view(s, left.clamp(Duration::from_millis(100), Duration::from_secs(2))) {
            Ok(v) => break v,
            Err(e) if Instant::now() >= end => {
                return Err(format!(
                    "cluster: the map could not be read from etcd within {wait:?} ({e}): whether another node took over this node's vDisks while it was down is not known, and serving them, or writing their cached blocks back, could overwrite newer data. Start again once etcd ({}) answers",
                    s.etcd.join(", ")
                ))
            }
            Err(e) => {
                tracing::info!(error = %e, "cluster: waiting for etcd to read the map before starting");
                std::thread::sleep(Duration::from_millis(250).min(left));
            }
        }
    };
    Ok(vdisks
        .iter()
        .filter_map(|v| map.served_elsewhere(&members, &s.name, v).map(|n| (v.clone(), n.to_string())))
        .collect())
}

/// [`moved_away`], then the claims (`claims.rs`) of the vDisks that did not move, under a
/// lease granted now: one another node holds (it serves or is adding the vDisk) counts
/// as moved away too. The lease goes to the membership agent ([`StartLease::adopt`]).
pub(crate) fn moved_away_and_claim(
    s: &ClusterSettings,
    vdisks: &[String],
    wait: Duration,
) -> Result<(Vec<(String, String)>, StartLease), String> {
    let end = Instant::now() + wait;
    let mut moved = moved_away(s, vdisks, wait)?;
    let refused = |e: String| {
        format!("cluster: this node's vDisks could not be claimed in etcd ({e}): whether another node is taking one of them over now is not known. Start again once etcd ({}) answers", s.etcd.join(", "))
    };
    let left = || end.saturating_duration_since(Instant::now()).max(Duration::from_secs(2));
    let lease = StartLease::grant(s, left()).map_err(refused)?;
    let claim: Vec<String> = vdisks.iter().filter(|v| !moved.iter().any(|(m, _)| m == *v)).cloned().collect();
    let (prefix, me, id) = (s.prefix.clone(), s.name.clone(), lease.id());
    let found = block_on(s, left(), async move |c| {
        let mut found = Vec::new();
        for v in claim {
            found.push((claims::take(c, &prefix, &me, id, &v).await?, v));
        }
        Ok(found)
    })
    .map_err(refused)?;
    for (claim, v) in found {
        if let claims::Claim::HeldBy(n) = claim {
            tracing::warn!(vdisk = %crate::log_safe(&v), node = %crate::log_safe(&n), "cluster: another node claims this vDisk: not served here");
            moved.push((v, n));
        }
    }
    Ok((moved, lease))
}
