//! One node at a time, by compare-and-swap (ROADMAP §4): before a node serves a vDisk it
//! holds the vDisk's claim, `<prefix>claims/<vdisk>` = its name, under its lease, taken by
//! an etcd transaction that succeeds only if the key is absent or already this node's.
//! Reading the members first and publishing after (what `may_serve` and the start check
//! do) leaves a window in which two nodes both see the vDisk free — two operators adding
//! it at once, a node starting while another adds it; the transaction closes it: of two
//! nodes racing, one takes the claim and the other is refused. A node that dies drops its
//! claims with its lease (after the TTL), so its vDisks can be taken over.
//!
//! Where claims are taken: at a start, under a lease granted before the cache is touched
//! ([`StartLease`], kept alive here until the membership agent adopts it); on `POST
//! /vdisks` (`Cluster::claim`); and by the agent after every new lease, for every vDisk
//! the node serves ([`to_fix`], run at each read of the keys). A claim the node holds
//! for a vDisk it no longer serves is released. A claim another node holds for a vDisk
//! this node serves (only after this node lost its lease and another took the vDisk
//! over) is a conflict, shown in `GET /cluster` and logged.

use super::etcd_once::block_on;
use crate::config::cluster_section::ClusterSettings;
use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The most claims the agent takes (and releases) in one round, so that a node serving
/// many vDisks stays within a request's deadline (a few hundred ms); the next read of the
/// keys, 200 ms later, goes on.
pub(crate) const PER_ROUND: usize = 16;

/// What a claim transaction found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claim {
    /// This node holds it now, under the lease asked for.
    Taken,
    /// Another node holds it.
    HeldBy(String),
}

/// The claim key of `vdisk` under `prefix`.
pub(crate) fn key(prefix: &str, vdisk: &str) -> String {
    format!("{prefix}claims/{vdisk}")
}

/// Takes `vdisk`'s claim for `me` under `lease`: created if absent, moved under `lease` if
/// `me` holds it under another (an earlier lease of this node's), refused if another
/// node holds it.
pub(crate) async fn take(
    cl: &mut Client,
    prefix: &str,
    me: &str,
    lease: i64,
    vdisk: &str,
) -> Result<Claim, etcd_client::Error> {
    let k = key(prefix, vdisk);
    let put = || TxnOp::put(k.clone(), me, Some(PutOptions::new().with_lease(lease)));
    for _ in 0..8 {
        let txn = Txn::new()
            .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
            .and_then([put()])
            .or_else([TxnOp::get(k.clone(), None)]);
        let r = cl.txn(txn).await?;
        if r.succeeded() {
            return Ok(Claim::Taken);
        }
        let held = r.op_responses().into_iter().find_map(|o| match o {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| (kv.value().to_vec(), kv.lease())),
            _ => None,
        });
        // Gone between the compare and the read (its lease expired): ask again.
        let Some((holder, held_lease)) = held else { continue };
        if holder != me.as_bytes() {
            return Ok(Claim::HeldBy(String::from_utf8_lossy(&holder).into_owned()));
        }
        if held_lease == lease {
            return Ok(Claim::Taken);
        }
        let txn = Txn::new().when([Compare::value(k.clone(), CompareOp::Equal, me)]).and_then([put()]);
        if cl.txn(txn).await?.succeeded() {
            return Ok(Claim::Taken);
        }
        // It expired or changed hands in between: ask again.
    }
    Ok(Claim::HeldBy("another node (the claim kept changing hands while asked)".into()))
}

/// Releases `vdisk`'s claim if `me` holds it.
pub(crate) async fn release(cl: &mut Client, prefix: &str, me: &str, vdisk: &str) -> Result<(), etcd_client::Error> {
    let k = key(prefix, vdisk);
    cl.txn(Txn::new().when([Compare::value(k.clone(), CompareOp::Equal, me)]).and_then([TxnOp::delete(k, None)]))
        .await?;
    Ok(())
}

/// The claims as read (vDisk → holder, lease), from the keys under `claims/`.
pub(crate) type Held = BTreeMap<String, (String, i64)>;

/// What to do about this node's claims, from the claims read: the vDisks it serves whose
/// claim is absent or under an earlier lease (take them), those another node holds
/// (conflicts: nothing to take), and the claims it holds for vDisks it neither serves
/// nor is adding (release them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Fix {
    /// Take these.
    pub take: Vec<String>,
    /// Another node holds these: (vDisk, holder).
    pub conflicts: Vec<(String, String)>,
    /// Release these.
    pub release: Vec<String>,
}

/// [`Fix`] for node `me` under `lease`, serving `serving`, adding `adding`.
pub(crate) fn to_fix(me: &str, lease: i64, serving: &[String], adding: &BTreeSet<String>, held: &Held) -> Fix {
    let mut f = Fix::default();
    for v in serving {
        match held.get(v) {
            Some((h, l)) if h == me && *l == lease => {}
            Some((h, _)) if h != me => f.conflicts.push((v.clone(), h.clone())),
            _ => f.take.push(v.clone()),
        }
    }
    for (v, (h, _)) in held {
        if h == me && !serving.contains(v) && !adding.contains(v) {
            f.release.push(v.clone());
        }
    }
    f
}

/// A lease granted at a start, before the cache is touched, under which the start takes
/// its vDisks' claims; renewed here until the membership agent adopts it
/// ([`Self::adopt`]), revoked if the start fails first (its claims go with it).
pub(crate) struct StartLease {
    id: i64,
    origin: Instant,
    renewed: Arc<Mutex<(Instant, i64)>>,
    stop: Arc<AtomicBool>,
    settings: ClusterSettings,
    adopted: bool,
}

/// A start lease handed to the agent: its id, when its last renewal was sent and the TTL
/// etcd answered, and the instant every time of it counts from.
#[derive(Debug, Clone, Copy)]
pub struct Adopted {
    /// The lease.
    pub id: i64,
    /// When the lease was asked for (the agent's clock starts here).
    pub origin: Instant,
    /// When its last grant or keep-alive was sent.
    pub sent: Instant,
    /// The TTL etcd answered then (s).
    pub ttl_s: i64,
}

impl StartLease {
    /// Asks etcd for a lease of the configured TTL and keeps it alive.
    pub(crate) fn grant(s: &ClusterSettings, deadline: Duration) -> Result<StartLease, String> {
        let origin = Instant::now();
        let ttl_s = (s.timing.lease_ttl_ms / 1000) as i64;
        let r = block_on(s, deadline, async move |c| c.lease_grant(ttl_s, None).await)?;
        let lease = StartLease {
            id: r.id(),
            origin,
            renewed: Arc::new(Mutex::new((origin, r.ttl()))),
            stop: Arc::new(AtomicBool::new(false)),
            settings: s.clone(),
            adopted: false,
        };
        let (settings, renewed, stop, id) = (s.clone(), lease.renewed.clone(), lease.stop.clone(), lease.id);
        std::thread::Builder::new()
            .name("cv-start-lease".into())
            .spawn(move || keep(&settings, id, &renewed, &stop))
            .map_err(|e| format!("starting the lease keeper: {e}"))?;
        Ok(lease)
    }

    /// The lease.
    pub(crate) fn id(&self) -> i64 {
        self.id
    }

    /// Stops renewing; the agent renews it from now on.
    pub(crate) fn adopt(mut self) -> Adopted {
        self.adopted = true;
        self.stop.store(true, Ordering::SeqCst);
        let (sent, ttl_s) = *self.renewed.lock().unwrap_or_else(|e| e.into_inner());
        Adopted { id: self.id, origin: self.origin, sent, ttl_s }
    }
}

impl Drop for StartLease {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if !self.adopted {
            let id = self.id;
            if let Err(e) = block_on(&self.settings, Duration::from_secs(1), async move |c| c.lease_revoke(id).await) {
                tracing::warn!(error = %e, "cluster: revoking the start's lease (its claims expire with it)");
            }
        }
    }
}

/// Renews lease `id` every third of the TTL until `stop`, on one connection (made again
/// after a failure), recording each answered renewal's send time and TTL.
fn keep(s: &ClusterSettings, id: i64, renewed: &Mutex<(Instant, i64)>, stop: &AtomicBool) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
    let every = Duration::from_millis(s.timing.keepalive_every_ms());
    let deadline = (every / 2).max(Duration::from_millis(100));
    let mut client: Option<Client> = None;
    let mut last = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(20));
        if last.elapsed() < every || stop.load(Ordering::SeqCst) {
            continue;
        }
        let sent = Instant::now();
        last = sent;
        let answer = rt.block_on(async {
            let renew = async {
                if client.is_none() {
                    let opts = etcd_client::ConnectOptions::new().with_connect_timeout(deadline).with_timeout(deadline);
                    client = Some(Client::connect(&s.etcd, Some(opts)).await?);
                }
                let c = client.as_mut().expect("connected above");
                let (mut k, mut stream) = c.lease_keep_alive(id).await?;
                k.keep_alive().await?;
                Ok::<_, etcd_client::Error>(stream.message().await?.map_or(0, |r| r.ttl()))
            };
            tokio::time::timeout(deadline, renew).await
        });
        match answer {
            Ok(Ok(ttl)) if ttl > 0 => *renewed.lock().unwrap_or_else(|e| e.into_inner()) = (sent, ttl),
            Ok(Ok(_)) => {
                tracing::warn!(
                    "cluster: the start's lease expired at etcd (its claims with it); the agent takes new ones"
                );
                return;
            }
            failed => {
                client = None;
                let e = failed.map_or_else(
                    |_| "no answer in time".to_string(),
                    |r| r.err().map(|e| e.to_string()).unwrap_or_default(),
                );
                tracing::warn!(error = %e, "cluster: renewing the start's lease");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(list: &[(&str, &str, i64)]) -> Held {
        list.iter().map(|(v, h, l)| (v.to_string(), (h.to_string(), *l))).collect()
    }

    #[test]
    fn what_to_take_and_release_follows_what_is_served() {
        let serving = ["a".to_string(), "b".to_string(), "c".to_string(), "d".to_string()];
        let adding: BTreeSet<String> = ["e".to_string()].into();
        let h = held(&[("a", "n0", 7), ("b", "n0", 6), ("c", "n1", 9), ("e", "n0", 7), ("f", "n0", 7), ("g", "n1", 9)]);
        let f = to_fix("n0", 7, &serving, &adding, &h);
        // a is held under this lease; b under an earlier one; d not at all.
        assert_eq!(f.take, vec!["b".to_string(), "d".to_string()]);
        assert_eq!(f.conflicts, vec![("c".to_string(), "n1".to_string())]);
        // e is being added; g is another node's.
        assert_eq!(f.release, vec!["f".to_string()]);
        assert_eq!(to_fix("n0", 7, &[], &BTreeSet::new(), &Held::new()), Fix::default());
    }
}
