//! The cluster's map as the leader keeps it in etcd (`map`): node and vDisk ids by name
//! (ids are never reused, so a stale reference can never name somebody else), each
//! vDisk's home node, the stripes lent away from home (ELICA §3.1's ownership map, the
//! part [`crate::ownership`] looks up), and the epoch every peer request carries. The
//! leader's step [`next_map`] is pure: from the map and the members etcd lists, the next
//! map or nothing to change. Hand-written: the record is ours; serde writes it.

use crate::membership::MemberInfo;
use crate::ownership::{NodeId, OwnershipMap, Update};
use cachevisor_trace::VmId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A vDisk in the map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VdiskEntry {
    /// Its cluster-wide id.
    pub id: VmId,
    /// The node serving it (its VM's node), by name.
    pub home: String,
    /// The node it was served by before its last move (a failover, or a VM moved), if
    /// it moved: the node whose cache snapshots prewarm it at its new home.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_from: Option<String>,
    /// The epoch of that move (0: never moved).
    #[serde(default)]
    pub moved_at: u64,
    /// Its home last said it may hold dirty blocks there (write-back): if that node is
    /// gone, the backing store may lack acknowledged writes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub write_back: bool,
    /// Its home last said its client writes go to the home's replica log on a peer: if
    /// the home is gone, that log (when valid) holds what the backing store may lack.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replicated: bool,
}

/// The largest epoch a map may carry (`ClusterMap::decode`, `next_map`).
pub const MAX_EPOCH: u64 = 1 << 53;

/// The map.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ClusterMap {
    /// The epoch (0: no map written yet; each write adds 1).
    pub epoch: u64,
    /// Node ids by name.
    pub nodes: BTreeMap<String, NodeId>,
    /// vDisks by name.
    pub vdisks: BTreeMap<String, VdiskEntry>,
    /// Stripes cached away from their vDisk's home: (vDisk id, stripe, node id).
    pub lent: Vec<(VmId, u64, NodeId)>,
}

/// A map record etcd returned that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("the cluster map in etcd is not readable ({0}); the leader writes a new one")]
pub struct BadMap(String);

impl ClusterMap {
    /// Reads a record.
    pub fn decode(bytes: &[u8]) -> Result<ClusterMap, BadMap> {
        let m: ClusterMap = serde_json::from_slice(bytes).map_err(|e| BadMap(e.to_string()))?;
        // A leader adds 1 per write: no cluster reaches 2^53 (a forged epoch near 2^64
        // would wrap, or pin every node to it).
        if m.epoch > MAX_EPOCH {
            return Err(BadMap(format!("epoch {} is past any a cluster writes ({MAX_EPOCH})", m.epoch)));
        }
        let ids: std::collections::BTreeSet<_> = m.nodes.values().collect();
        if ids.len() != m.nodes.len() {
            return Err(BadMap("two nodes share an id".into()));
        }
        Ok(m)
    }

    /// Writes a record.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a map serializes")
    }

    /// A node's id by name.
    pub fn node_id(&self, name: &str) -> Option<NodeId> {
        self.nodes.get(name).copied()
    }

    /// The ownership map for lookups (`stripe_blocks` cache blocks per stripe).
    pub fn ownership(&self, stripe_blocks: u64) -> OwnershipMap {
        let mut o = OwnershipMap::new(stripe_blocks);
        let mut u: Vec<Update> = Vec::new();
        for v in self.vdisks.values() {
            if let Some(&node) = self.nodes.get(&v.home) {
                u.push(Update::Home { vdisk: v.id, node });
            }
        }
        u.extend(self.lent.iter().map(|&(vdisk, stripe, node)| Update::Assign { vdisk, stripe, node }));
        if !u.is_empty() {
            o.apply(0, &u).expect("a fresh map takes any well-formed batch");
        }
        o
    }

    /// Whether vDisk `vdisk`, which node `me` is starting with, moved away while `me` was
    /// down — served since (or now) by another node, so whatever `me` still caches of it,
    /// dirty blocks included, is older than what that node wrote: the other node's name.
    /// Either the map homes it elsewhere (its home changes only when another node claims
    /// it while the old home does not: `next_map`), or a live member other than `me`
    /// claims it now (the map may not show that yet).
    pub fn served_elsewhere<'a>(&'a self, members: &'a [MemberInfo], me: &str, vdisk: &str) -> Option<&'a str> {
        if let Some(m) = members.iter().find(|m| m.name != me && m.vdisks.iter().any(|v| v == vdisk)) {
            return Some(&m.name);
        }
        self.vdisks.get(vdisk).map(|e| e.home.as_str()).filter(|h| *h != me)
    }
}

/// The leader's step: the next map given the members etcd lists (their keys live under
/// their leases, so a dead node is absent), or `None` when nothing changes.
/// - a new member gets the next node id (new members in name order); a departed one keeps its id (never reused);
/// - a vDisk a live member serves is homed there (a vDisk that moved, as after a
///   failover, moves home; two live members claiming one name: the current home keeps
///   it, else the first by name); a vDisk nobody serves keeps its entry (its node may
///   come back, or its VM restart elsewhere);
/// - a vDisk whose home changes records where it came from and at which epoch
///   (`moved_from`, `moved_at`): its new node prewarms it from the old one's snapshots
///   (the Nutanix study's failover, made real);
/// - a vDisk's `write_back` and `replicated` are what its home (live) last said; a gone
///   home's are kept;
/// - stripes lent to a node that is not live go back home (their blocks are gone with
///   it, ELICA leaves this case open: the home node reads the backing store).
pub fn next_map(current: &ClusterMap, members: &[MemberInfo]) -> Option<ClusterMap> {
    let mut next = current.clone();
    let mut members: Vec<&MemberInfo> = members.iter().collect();
    members.sort_by(|a, b| a.name.cmp(&b.name));
    for m in &members {
        if !next.nodes.contains_key(&m.name) {
            let id = next.nodes.values().max().map_or(0, |&i| i + 1);
            next.nodes.insert(m.name.clone(), id);
        }
    }
    let live: std::collections::BTreeSet<&str> = members.iter().map(|m| m.name.as_str()).collect();
    let mut claims: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for m in &members {
        for v in &m.vdisks {
            claims.entry(v.as_str()).or_default().push(m.name.as_str());
        }
    }
    for (vdisk, by) in claims {
        let home = match next.vdisks.get(vdisk) {
            Some(e) if by.contains(&e.home.as_str()) => e.home.clone(),
            _ => by.iter().min().expect("a claim has a claimant").to_string(),
        };
        match next.vdisks.get_mut(vdisk) {
            Some(e) if e.home != home => {
                e.moved_from = Some(std::mem::replace(&mut e.home, home));
                e.moved_at = current.epoch.saturating_add(1);
            }
            Some(_) => {}
            None => {
                let id = next.vdisks.values().map(|e| e.id + 1).max().unwrap_or(0);
                let e = VdiskEntry { id, home, moved_from: None, moved_at: 0, write_back: false, replicated: false };
                next.vdisks.insert(vdisk.to_string(), e);
            }
        }
        let e = next.vdisks.get_mut(vdisk).expect("just homed");
        let home = members.iter().find(|m| m.name == e.home);
        e.write_back = home.is_some_and(|m| m.write_back.iter().any(|w| w == vdisk));
        e.replicated = home.is_some_and(|m| m.replicated.iter().any(|w| w == vdisk));
    }
    let live_ids: Vec<NodeId> = live.iter().filter_map(|n| next.nodes.get(*n).copied()).collect();
    next.lent.retain(|l| live_ids.contains(&l.2));
    if next == *current {
        return None;
    }
    // Checked: a map at the last epoch is not advanced (never wrapped to 0).
    next.epoch = current.epoch.checked_add(1).filter(|&e| e <= MAX_EPOCH)?;
    Some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, vdisks: &[&str]) -> MemberInfo {
        MemberInfo {
            name: name.into(),
            peer_address: format!("{name}:1"),
            api: None,
            cache_blocks: 100,
            block_size: 4096,
            vdisks: vdisks.iter().map(|s| s.to_string()).collect(),
            lend_bytes: 0,
            incarnation: 1,
            write_back: Vec::new(),
            replica_bytes: 0,
            replicated: Vec::new(),
        }
    }

    #[test]
    fn a_vdisk_homed_or_claimed_elsewhere_moved_away_from_a_returning_node() {
        let m1 = next_map(&ClusterMap::default(), &[member("a", &["vm1", "vm3"]), member("b", &["vm2"])]).unwrap();
        // a died; vm1 restarted on b.
        let m2 = next_map(&m1, &[member("b", &["vm1", "vm2"])]).unwrap();
        let none: &[MemberInfo] = &[];
        assert_eq!(m2.served_elsewhere(none, "a", "vm1"), Some("b"), "homed on b by the map");
        assert_eq!(m2.served_elsewhere(none, "a", "vm3"), None, "still a's: nobody took it");
        assert_eq!(m2.served_elsewhere(none, "a", "vm9"), None, "never in the map");
        assert_eq!(m2.served_elsewhere(none, "b", "vm1"), None, "b's own");
        // The map not written yet, but c claims vm3 already; a's own claim does not count.
        let live = [member("c", &["vm3"]), member("a", &["vm3"])];
        assert_eq!(m1.served_elsewhere(&live, "a", "vm3"), Some("c"));
        assert_eq!(m1.served_elsewhere(&live[1..], "a", "vm3"), None);
        // b stopped serving vm1 (removed it): still b's since a left, a's copy stale.
        let m3 = next_map(&m2, &[member("b", &["vm2"])]).unwrap_or(m2.clone());
        assert_eq!(m3.served_elsewhere(none, "a", "vm1"), Some("b"));
    }

    #[test]
    fn members_get_ids_vdisks_get_homes_and_a_failover_moves_the_home() {
        let m0 = ClusterMap::default();
        let m1 = next_map(&m0, &[member("b", &["vm2"]), member("a", &["vm1"])]).unwrap();
        assert_eq!(m1.epoch, 1);
        assert_eq!((m1.node_id("a"), m1.node_id("b")), (Some(0), Some(1)));
        assert_eq!(m1.vdisks["vm1"].home, "a");
        assert!(next_map(&m1, &[member("a", &["vm1"]), member("b", &["vm2"])]).is_none(), "nothing changed");
        // b dies: its vDisk keeps its entry; stripes lent to it go home.
        let mut m1 = m1;
        m1.lent.push((m1.vdisks["vm1"].id, 3, 1));
        let m2 = next_map(&m1, &[member("a", &["vm1"])]).unwrap();
        assert!(m2.lent.is_empty());
        assert_eq!(m2.vdisks["vm2"].home, "b");
        // vm2 restarts on a; c joins with a new id, b's is not reused.
        let m3 = next_map(&m2, &[member("a", &["vm1", "vm2"]), member("c", &[])]).unwrap();
        assert_eq!(m3.vdisks["vm2"].home, "a");
        assert_eq!((m3.vdisks["vm2"].moved_from.as_deref(), m3.vdisks["vm2"].moved_at), (Some("b"), 3));
        assert_eq!((m3.vdisks["vm1"].moved_from.as_deref(), m3.vdisks["vm1"].moved_at), (None, 0));
        assert_eq!(m3.vdisks["vm2"].id, m1.vdisks["vm2"].id, "a vDisk keeps its id");
        assert_eq!(m3.node_id("c"), Some(2));
        assert_eq!(m3.epoch, 3);
        let o = m3.ownership(16);
        assert_eq!(o.owner(m3.vdisks["vm2"].id, 0), Some(0));
        assert_eq!(ClusterMap::decode(&m3.encode()).unwrap(), m3);
    }

    #[test]
    fn a_write_back_vdisk_stays_marked_after_its_home_is_gone() {
        let mut a = member("a", &["vm1", "vm2"]);
        a.write_back = vec!["vm1".into()];
        let m1 = next_map(&ClusterMap::default(), &[a.clone(), member("b", &[])]).unwrap();
        assert!(m1.vdisks["vm1"].write_back && !m1.vdisks["vm2"].write_back);
        // a dies: the map does not change (the mark stays); vm1 set write-through on a
        // restarted a clears it.
        assert_eq!(next_map(&m1, &[member("b", &[])]), None);
        let m2 = m1;
        a.write_back.clear();
        assert!(!next_map(&m2, &[a, member("b", &[])]).unwrap().vdisks["vm1"].write_back);
    }

    #[test]
    fn two_members_claiming_one_vdisk_leave_it_where_it_is() {
        let m1 = next_map(&ClusterMap::default(), &[member("b", &["vm"])]).unwrap();
        assert!(
            next_map(&m1, &[member("a", &["vm"]), member("b", &["vm"])]).is_some_and(|m| m.vdisks["vm"].home == "b")
        );
    }

    #[test]
    fn an_unreadable_record_is_an_error_naming_why() {
        let e = ClusterMap::decode(b"{\"epoch\": 1, \"nodes\": {\"a\": 0, \"b\": 0}, \"vdisks\": {}, \"lent\": []}")
            .unwrap_err();
        assert!(e.to_string().contains("two nodes share an id"), "{e}");
        assert!(ClusterMap::decode(b"not json").is_err());
    }

    #[test]
    fn a_forged_epoch_is_refused_and_the_last_epoch_never_wraps() {
        let forged = format!("{{\"epoch\": {}, \"nodes\": {{}}, \"vdisks\": {{}}, \"lent\": []}}", u64::MAX);
        assert!(ClusterMap::decode(forged.as_bytes()).unwrap_err().0.contains("epoch"));
        let last = ClusterMap { epoch: MAX_EPOCH, ..ClusterMap::default() };
        let m = member("a", &["v"]);
        assert_eq!(next_map(&last, std::slice::from_ref(&m)), None, "not advanced past the bound");
        let before = ClusterMap { epoch: MAX_EPOCH - 1, ..ClusterMap::default() };
        assert_eq!(next_map(&before, &[m]).unwrap().epoch, MAX_EPOCH);
    }
}
