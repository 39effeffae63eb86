//! The etcd driver of a node's membership (`cachevisor_cluster::membership`): one thread
//! (`cv-cluster`) with a single-threaded tokio runtime asks etcd what the state machine
//! asks for — a lease, its keep-alives, the member key under it, the leader key's
//! creation, the leader's map writes guarded by its term — and reads the cluster's keys
//! back every [`OBSERVE_MS`] (one range read of the prefix: members, leader, map).
//! Every request has a deadline, so an unreachable etcd only makes requests fail; the
//! lease then runs out on the node's own clock and the node fences itself. Decisions are
//! the pure crate's; this file only moves them to and from etcd.
//!
//! Keys under the prefix: `members/<name>` (a `MemberInfo`, under the node's lease),
//! `leader` (the leader's name, under its lease; its create revision is the term), `map`
//! (the `ClusterMap`, written by the leader only), `claims/<vdisk>` (the node serving it,
//! under its lease: `claims.rs`).

use super::{claims, ClaimConflict, Cluster, Shared};
use cachevisor_cluster::allocation::Solver;
use cachevisor_cluster::cluster_map::{next_map, ClusterMap};
use cachevisor_cluster::estimate::{decide, AllocationRecord, NodeEstimates};
use cachevisor_cluster::membership::{Leader, MemberInfo, Request};
use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp};
use std::sync::Arc;
use std::time::Duration;

/// How often the cluster's keys are read back (ms).
pub(crate) const OBSERVE_MS: u64 = 200;

/// Runs until the cluster handle is dropped.
pub(super) fn run(cluster: std::sync::Weak<Cluster>) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
    rt.block_on(drive(cluster));
}

async fn drive(weak: std::sync::Weak<Cluster>) {
    let mut client: Option<Client> = None;
    loop {
        let Some(c) = weak.upgrade() else { return };
        let deadline = Duration::from_millis((c.settings.timing.keepalive_every_ms() / 2).clamp(100, 1000));
        if client.is_none() {
            let opts = ConnectOptions::new().with_connect_timeout(deadline).with_timeout(deadline);
            match tokio::time::timeout(deadline, Client::connect(&c.settings.etcd, Some(opts))).await {
                Ok(Ok(cl)) => client = Some(cl),
                Ok(Err(e)) => c.etcd_error(format!("connecting to etcd: {e}")),
                Err(_) => c.etcd_error("connecting to etcd: timed out".into()),
            }
        }
        if let Some(cl) = client.as_mut() {
            // At most a few requests between two reads of the keys.
            for _ in 0..4 {
                let now = c.now_ms();
                let Some(req) = c.lock().member.poll_request(now) else { break };
                let answer = tokio::time::timeout(deadline, perform(cl, &c, &req, now)).await;
                let now = c.now_ms();
                let failed = match answer {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(format!("{req:?}: {e}")),
                    Err(_) => Some(format!("{req:?}: no answer within {deadline:?}")),
                };
                match failed {
                    None => c.etcd_ok(),
                    Some(e) => {
                        c.lock().member.etcd_failed(now, &req);
                        c.etcd_error(e);
                    }
                }
                c.log_events();
            }
            match tokio::time::timeout(deadline, observe(cl, &c)).await {
                Ok(Ok(())) => c.etcd_ok(),
                Ok(Err(e)) => c.etcd_error(format!("reading the cluster's keys: {e}")),
                Err(_) => c.etcd_error(format!("reading the cluster's keys: no answer within {deadline:?}")),
            }
        }
        c.log_events();
        let now = c.now_ms();
        let next = c.lock().member.poll_timeout().unwrap_or(u64::MAX).min(now + OBSERVE_MS);
        drop(c);
        tokio::time::sleep(Duration::from_millis(next.saturating_sub(now).max(10))).await;
    }
}

fn key(c: &Cluster, k: &str) -> String {
    format!("{}{k}", c.settings.prefix)
}

/// Writes this node's member record under `lease` and remembers it as published.
async fn put_member(cl: &mut Client, c: &Cluster, lease: i64, info: MemberInfo) -> Result<(), etcd_client::Error> {
    let body = serde_json::to_vec(&info).expect("member info serializes");
    cl.put(key(c, &format!("members/{}", c.settings.name)), body, Some(PutOptions::new().with_lease(lease))).await?;
    c.lock().published = Some(info);
    Ok(())
}

/// Sends one request and feeds its answer to the state machine.
async fn perform(cl: &mut Client, c: &Arc<Cluster>, req: &Request, sent: u64) -> Result<(), etcd_client::Error> {
    let ttl_s = (c.settings.timing.lease_ttl_ms / 1000) as i64;
    match *req {
        Request::GrantLease => {
            let r = cl.lease_grant(ttl_s, None).await?;
            let now = c.now_ms();
            c.lock().member.lease_granted(now, sent, r.id(), r.ttl());
            tracing::info!(lease = r.id(), ttl_s = r.ttl(), "cluster: lease granted");
        }
        Request::KeepAlive { lease, sent_at } => {
            let (mut keeper, mut stream) = cl.lease_keep_alive(lease).await?;
            keeper.keep_alive().await?;
            let ttl = match stream.message().await? {
                Some(r) => r.ttl(),
                None => 0,
            };
            let now = c.now_ms();
            c.lock().member.kept_alive(now, lease, sent_at, ttl);
        }
        Request::Register { lease } => {
            // Its vDisks' claims first (a new lease: the last one's went with it).
            let r = cl.get(key(c, "claims/"), Some(GetOptions::new().with_prefix())).await?;
            let held = r.kvs().iter().filter_map(|kv| held_claim(c, kv.key_str().ok()?, kv)).collect();
            let adding = c.lock().adding.clone();
            let info = c.source.info();
            fix_claims(cl, c, lease, &info.vdisks, &adding, &held).await?;
            put_member(cl, c, lease, info).await?;
            c.lock().member.registered(lease);
        }
        Request::Campaign { lease } => {
            let k = key(c, "leader");
            // A leader key no lease holds (`observe`) is removed first, if it is still
            // the one read.
            let stale = c.lock().stale_leader.take();
            if let Some(rev) = stale {
                let clear = Txn::new()
                    .when([Compare::mod_revision(k.clone(), CompareOp::Equal, rev)])
                    .and_then([TxnOp::delete(k.clone(), None)]);
                if cl.txn(clear).await?.succeeded() {
                    tracing::warn!("cluster: removed a leader key no lease held");
                }
            }
            let txn = Txn::new()
                .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(k, c.settings.name.clone(), Some(PutOptions::new().with_lease(lease)))]);
            let r = cl.txn(txn).await?;
            let term = r.succeeded().then(|| r.header().map_or(0, |h| h.revision()));
            let now = c.now_ms();
            c.lock().member.campaigned(now, term);
            if let Some(term) = term {
                tracing::info!(term, "cluster: elected leader");
            }
        }
        Request::Publish { lease } => {
            let e = c.source.estimates();
            let body = serde_json::to_vec(&e).expect("estimates serialize");
            cl.put(key(c, &format!("estimates/{}", c.settings.name)), body, Some(PutOptions::new().with_lease(lease)))
                .await?;
            let now = c.now_ms();
            c.lock().member.published(now);
        }
        Request::Allocate { term, .. } => {
            let written = allocate(cl, c, term).await?;
            allocate_cache(cl, c, term).await?;
            let now = c.now_ms();
            c.lock().member.allocated(now, written);
        }
    }
    Ok(())
}

/// The leader's step: the next map from the members etcd lists, written only if the
/// leader key is still this term's and the map is still the one read.
async fn allocate(cl: &mut Client, c: &Arc<Cluster>, term: i64) -> Result<Option<u64>, etcd_client::Error> {
    let mk = key(c, "map");
    let r = cl.get(mk.clone(), None).await?;
    let (current, rev) = match r.kvs().first() {
        Some(kv) => match ClusterMap::decode(kv.value()) {
            Ok(m) => (m, kv.mod_revision()),
            Err(e) => {
                // Replaced from the highest epoch this node has seen, so every node takes
                // the new map (they never go back to a lower epoch).
                let epoch = c.lock().map.epoch;
                tracing::warn!(error = %e, epoch, "cluster: replacing an unreadable map");
                (ClusterMap { epoch, ..ClusterMap::default() }, kv.mod_revision())
            }
        },
        None => (ClusterMap::default(), 0),
    };
    let members = c.lock().member.members().to_vec();
    let Some(next) = next_map(&current, &members) else { return Ok(None) };
    let txn = Txn::new()
        .when([
            Compare::create_revision(key(c, "leader"), CompareOp::Equal, term),
            Compare::mod_revision(mk.clone(), CompareOp::Equal, rev),
        ])
        .and_then([TxnOp::put(mk, next.encode(), None)]);
    let done = cl.txn(txn).await?.succeeded();
    if done {
        tracing::info!(
            epoch = next.epoch,
            nodes = next.nodes.len(),
            vdisks = next.vdisks.len(),
            "cluster: map written"
        );
        c.lock().map = next.clone();
        Ok(Some(next.epoch))
    } else {
        Ok(None)
    }
}

/// The leader's Eq. 4 on the estimates the live nodes published (`estimates/<node>`,
/// under their leases: a dead node's are gone), written as `allocation` if the leader
/// key is still this term's.
async fn allocate_cache(cl: &mut Client, c: &Arc<Cluster>, term: i64) -> Result<(), etcd_client::Error> {
    let (est, last): (Vec<(String, NodeEstimates)>, _) = {
        let s = c.lock();
        (s.estimates.iter().map(|(n, e)| (n.clone(), e.clone())).collect(), s.allocation.clone())
    };
    if est.is_empty() {
        return Ok(());
    }
    let (lat, unit) = (c.settings.lat, c.settings.unit_bytes);
    let record = match decide(lat, Solver::Fast, unit, &est, last.as_ref(), c.settings.hysteresis) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "cluster: the allocation failed; the last one stays");
            return Ok(());
        }
    };
    let txn = Txn::new()
        .when([Compare::create_revision(key(c, "leader"), CompareOp::Equal, term)])
        .and_then([TxnOp::put(key(c, "allocation"), serde_json::to_vec(&record).expect("serializes"), None)]);
    // Every node, the leader too, applies it when it reads it back (`observe`).
    cl.txn(txn).await?;
    Ok(())
}

/// The member record at key `k` (under the prefix, `members/<name>`), or `None` (logged)
/// when it is unreadable or names another node than its key.
pub(super) fn decode_member(k: &str, value: &[u8]) -> Option<MemberInfo> {
    let name = k.strip_prefix("members/")?;
    super::bad_records::small_enough(value).ok()?;
    match serde_json::from_slice::<MemberInfo>(value) {
        Ok(m) if m.name == name => Some(m),
        _ => None, // noted by the caller (`bad_records.rs`: once per change)
    }
}

/// A claim key (full key `k`) as (vDisk, (holder, lease)).
fn held_claim(c: &Cluster, k: &str, kv: &etcd_client::KeyValue) -> Option<(String, (String, i64))> {
    let v = k.strip_prefix(&c.settings.prefix)?.strip_prefix("claims/")?;
    Some((v.to_string(), (String::from_utf8_lossy(kv.value()).into_owned(), kv.lease())))
}

/// Brings this node's claims in line with the vDisks it serves (`claims::to_fix`; `adding`
/// read before `serving`): takes
/// the missing ones under `lease`, releases those of vDisks it no longer serves, and
/// records the ones another node holds (logged when new).
async fn fix_claims(
    cl: &mut Client,
    c: &Cluster,
    lease: i64,
    serving: &[String],
    adding: &std::collections::BTreeSet<String>,
    held: &claims::Held,
) -> Result<(), etcd_client::Error> {
    let (me, prefix) = (c.settings.name.as_str(), c.settings.prefix.as_str());
    let fix = claims::to_fix(me, lease, serving, adding, held);
    let mut conflicts = fix.conflicts;
    // A bounded round (the request's deadline); the next read of the keys does the rest.
    for v in fix.take.into_iter().take(claims::PER_ROUND) {
        if let claims::Claim::HeldBy(n) = claims::take(cl, prefix, me, lease, &v).await? {
            conflicts.push((v, n));
        }
    }
    for v in fix.release.into_iter().take(claims::PER_ROUND) {
        claims::release(cl, prefix, me, &v).await?;
    }
    let conflicts: Vec<ClaimConflict> =
        conflicts.into_iter().map(|(vdisk, node)| ClaimConflict { vdisk, node }).collect();
    let mut s = c.lock();
    for x in conflicts.iter().filter(|x| !s.claim_conflicts.contains(x)) {
        tracing::error!(
            vdisk = %crate::log_safe(&x.vdisk),
            node = %crate::log_safe(&x.node),
            "cluster: this node serves a vDisk another node claims (it took it over while this node had no lease): two nodes serve one vDisk — remove it on one of them"
        );
    }
    s.claim_conflicts = conflicts;
    Ok(())
}

/// Reads the prefix back: members, leader, map, estimates, allocation, claims.
async fn observe(cl: &mut Client, c: &Arc<Cluster>) -> Result<(), etcd_client::Error> {
    let r = cl.get(c.settings.prefix.clone(), Some(GetOptions::new().with_prefix())).await?;
    let (mut members, mut leader, mut map) = (Vec::new(), None, None);
    let (mut estimates, mut allocation) = (std::collections::BTreeMap::new(), None::<AllocationRecord>);
    let mut held = claims::Held::new();
    // Records ignored in this read (`bad_records.rs`): (key, mod revision, why).
    let mut bad: Vec<(String, i64, String)> = Vec::new();
    let mut stale_leader = None;
    for kv in r.kvs() {
        let full = kv.key_str().unwrap_or_default();
        let k = full.strip_prefix(&c.settings.prefix).unwrap_or_default();
        let mut ignore = |why: String| bad.push((k.to_string(), kv.mod_revision(), why));
        if let Err(why) = super::bad_records::small_enough(kv.value()) {
            ignore(why);
        } else if k.starts_with("claims/") {
            held.extend(held_claim(c, full, kv));
        } else if k.starts_with("members/") {
            match decode_member(k, kv.value()) {
                Some(m) => members.push(m),
                None => ignore("an unreadable member record, or one naming another node".into()),
            }
        } else if k == "leader" {
            // A leader holds its key under its lease; one with none (or no name) was not
            // written by a campaign: treated as absent, removed by the next campaign.
            if kv.lease() == 0 || kv.value().is_empty() {
                ignore("a leader key held by no lease: treated as absent".into());
                stale_leader = Some(kv.mod_revision());
            } else {
                let name = String::from_utf8_lossy(kv.value()).to_string();
                leader = Some(Leader { name, term: kv.create_revision() });
            }
        } else if let Some(node) = k.strip_prefix("estimates/") {
            match serde_json::from_slice::<NodeEstimates>(kv.value()) {
                Ok(e) => {
                    estimates.insert(node.to_string(), e);
                }
                Err(_) => ignore("unreadable estimates".into()),
            }
        } else if k == "allocation" {
            match serde_json::from_slice(kv.value()) {
                Ok(a) => allocation = Some(a),
                Err(_) => ignore("an unreadable allocation".into()),
            }
        } else if k == "map" {
            match ClusterMap::decode(kv.value()) {
                Ok(m) => map = Some(m),
                Err(e) => ignore(format!("an unreadable map: {e}")),
            }
        }
    }
    let now = c.now_ms();
    // What is being added, before what is served: a vDisk whose add finishes in between
    // is in one or the other (its claim is not released under it).
    let adding = c.lock().adding.clone();
    let info = c.source.info();
    let (fresh, republish, map_now, registered) = {
        let mut s: std::sync::MutexGuard<'_, Shared> = c.lock();
        for (k, rev, why) in &bad {
            s.bad.note(k, *rev, why);
        }
        s.bad.keep_only(&bad.iter().map(|b| b.0.clone()).collect::<Vec<_>>());
        s.stale_leader = stale_leader;
        s.member.members_seen(members);
        s.member.leader_seen(now, leader);
        s.estimates = estimates;
        if let Some(m) = map {
            s.member.epoch_seen(m.epoch);
            if m.epoch >= s.map.epoch {
                s.map = m;
            }
        }
        let fresh = allocation.filter(|a| s.allocation.as_ref() != Some(a));
        if let Some(a) = &fresh {
            s.allocation = Some(a.clone());
        }
        // A member record that no longer says what this node serves is written again.
        let registered = s.member.lease().filter(|_| s.published.is_some() && s.member.serving(now)).map(|(l, _)| l);
        (
            fresh,
            s.member.lease().filter(|_| s.published.as_ref().is_some_and(|p| *p != info)),
            s.map.clone(),
            registered,
        )
    };
    if let Some(lease) = registered {
        fix_claims(cl, c, lease, &info.vdisks, &adding, &held).await?;
    }
    if let Some(a) = fresh {
        c.source.apply(&a);
    }
    c.source.map_seen(&map_now);
    if let Some((lease, _)) = republish {
        put_member(cl, c, lease, info).await?;
    }
    Ok(())
}
