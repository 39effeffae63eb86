//! One node's view of the cluster's coordination, kept in etcd (ROADMAP §3: leases for
//! membership, leader election, the versioned map; no home-made consensus or failure
//! detector): what the daemon's etcd driver (`server/src/cluster/`) asks etcd next, and
//! what etcd's answers mean — whether this node may serve other nodes' data (fencing),
//! whether it leads, which map epoch it is at. Sans-IO like the engine: time (ms on the
//! driver's monotonic clock) is passed in, requests go out (`poll_request`), answers and
//! watch events come back.
//!
//! Fencing (Kleppmann's fencing tokens; Ceph's OSD map epochs): etcd expires a lease at
//! the earliest `ttl` after it received the grant or the last keep-alive, so a node that
//! counts from when it *sent* that request, minus a margin for clock-rate drift, stops
//! serving other nodes' data and stops leading before etcd can have handed its lease's
//! keys (its membership, the leader key) to anybody else. Peer requests carry the map's
//! epoch; [`Member::check_epoch`] refuses an older one (the sender decided on a stale
//! map) and a newer one until this node has seen it.
//!
//! Leadership is etcd's: the leader key is created with the candidate's lease in a
//! transaction that succeeds only if the key does not exist; its create revision is the
//! term (a fencing token etcd makes monotonic), and the leader's map writes are
//! transactions guarded by it. Hand-written: the state is ours; etcd does the agreeing.

use serde::{Deserialize, Serialize};

/// The coordination settings (`[cluster]` in the daemon's config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// The lease's time to live (ms): a node that stops renewing is dead after it.
    pub lease_ttl_ms: u64,
    /// Before the lease's earliest expiry at etcd, the node fences itself this much early
    /// (ms; clock-rate drift between the node and etcd).
    pub margin_ms: u64,
    /// The leader's allocation interval (ms).
    pub interval_ms: u64,
}

impl Timing {
    /// Keep-alives every third of the TTL (etcd's own clients renew at a third).
    pub fn keepalive_every_ms(&self) -> u64 {
        (self.lease_ttl_ms / 3).max(1)
    }
}

/// What a node publishes about itself under its lease (`members/<name>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    /// Its name (unique in the cluster).
    pub name: String,
    /// Where peers reach its lent-cache exports (`host:port`, TLS NBD).
    pub peer_address: String,
    /// Its HTTP API, if any.
    pub api: Option<String>,
    /// Its cache's blocks.
    pub cache_blocks: u64,
    /// Its block size (bytes).
    pub block_size: u64,
    /// The vDisks it serves.
    pub vdisks: Vec<String>,
    /// What it lends each peer (bytes; 0: nothing).
    #[serde(default)]
    pub lend_bytes: u64,
    /// Its process's incarnation: a lender that restarted has a new one, and what a
    /// borrower cached in it before is gone.
    #[serde(default)]
    pub incarnation: u64,
    /// The vDisks it serves that may hold dirty blocks in its cache (write-back, or dirty
    /// blocks left): the map keeps this after the node is gone, so no other node takes
    /// one over from the backing store unasked.
    #[serde(default)]
    pub write_back: Vec<String>,
    /// The replica log it keeps for each peer naming it (bytes; 0: none).
    #[serde(default)]
    pub replica_bytes: u64,
    /// The vDisks it serves whose client writes go to its replica log on a peer.
    #[serde(default)]
    pub replicated: Vec<String>,
}

/// The leader as etcd's leader key says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leader {
    /// Its name.
    pub name: String,
    /// The leader key's create revision: the term.
    pub term: i64,
}

/// What to ask etcd next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Grant a lease of the TTL; answer with [`Member::lease_granted`].
    GrantLease,
    /// Renew the lease; answer with [`Member::kept_alive`].
    KeepAlive {
        /// The lease.
        lease: i64,
        /// When the request was sent (pass it back).
        sent_at: u64,
    },
    /// Put `members/<name>` with the lease; answer with [`Member::registered`].
    Register {
        /// The lease.
        lease: i64,
    },
    /// Create the leader key with the lease if it is absent; answer with
    /// [`Member::campaigned`].
    Campaign {
        /// The lease.
        lease: i64,
    },
    /// Put `estimates/<name>` (this window's per-VM curves) with the lease; answer with
    /// [`Member::published`]. Every interval.
    Publish {
        /// The lease.
        lease: i64,
    },
    /// (Leader) decide the next map and write it if the leader key's create revision is
    /// still `term` and the map is still at `epoch`.
    Allocate {
        /// The term.
        term: i64,
        /// The map's epoch the decision is made at.
        epoch: u64,
    },
}

/// A change the driver acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The node holds a valid lease again: it may serve peers.
    Serving,
    /// The lease expired or etcd said it is gone: stop serving other nodes' data now.
    Fenced,
    /// This node leads (term).
    Leading(i64),
    /// This node no longer leads.
    NotLeading,
}

/// Why a peer request's epoch is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EpochRefusal {
    /// This node's lease is not valid: it serves no other node's data.
    #[error("this node is fenced (its cluster lease is not valid): it serves no other node's data")]
    Fenced,
    /// The sender decided on an older map.
    #[error("request made at map epoch {sent}, this node is at epoch {current}: refresh the map")]
    Stale {
        /// The request's epoch.
        sent: u64,
        /// This node's.
        current: u64,
    },
    /// This node has not seen the sender's epoch yet.
    #[error("request made at map epoch {sent}, this node has seen only epoch {current}: retry")]
    Ahead {
        /// The request's epoch.
        sent: u64,
        /// This node's.
        current: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lease {
    /// None held; a grant may be in flight.
    None { granting: bool },
    /// Held until `valid_until` (the node's clock, margin taken).
    Held { id: i64, valid_until: u64, last_sent: u64, renewing: bool },
}

/// One node's coordination state.
#[derive(Debug, Clone)]
pub struct Member {
    name: String,
    timing: Timing,
    lease: Lease,
    registered: bool,
    registering: bool,
    campaigning: bool,
    /// A campaign lost: not again until the leader key has been read since.
    campaign_lost: bool,
    leader: Option<Leader>,
    /// The term this node's campaign won, and under which lease: it leads only while the
    /// leader key is that one and the lease is held (a key named after it from an earlier
    /// lease, or an earlier process, is not its own).
    won: Option<(i64, i64)>,
    leading: bool,
    members: Vec<MemberInfo>,
    epoch: u64,
    allocating: bool,
    next_allocation: u64,
    publishing: bool,
    next_publish: u64,
    serving: bool,
    events: Vec<Event>,
    etcd_errors: u64,
    /// After a failed request, nothing is asked before this (ms).
    backoff_until: u64,
}

/// After a failed request, how long before the next one (ms): an unreachable etcd is
/// asked a few times a second, not in a tight loop.
pub const BACKOFF_MS: u64 = 200;

impl Member {
    /// A node named `name` with no lease yet.
    pub fn new(name: &str, timing: Timing) -> Member {
        Member {
            name: name.to_string(),
            timing,
            lease: Lease::None { granting: false },
            registered: false,
            registering: false,
            campaigning: false,
            campaign_lost: false,
            leader: None,
            won: None,
            leading: false,
            members: Vec::new(),
            epoch: 0,
            allocating: false,
            next_allocation: 0,
            publishing: false,
            next_publish: 0,
            serving: false,
            events: Vec::new(),
            etcd_errors: 0,
            backoff_until: 0,
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The next request to send at `now`, if any.
    pub fn poll_request(&mut self, now: u64) -> Option<Request> {
        self.expire(now);
        if now < self.backoff_until {
            return None;
        }
        match self.lease {
            Lease::None { granting: false } => {
                self.lease = Lease::None { granting: true };
                return Some(Request::GrantLease);
            }
            Lease::None { granting: true } => return None,
            Lease::Held { id, last_sent, renewing, valid_until } => {
                if !renewing && now >= last_sent + self.timing.keepalive_every_ms() {
                    self.lease = Lease::Held { id, valid_until, last_sent, renewing: true };
                    return Some(Request::KeepAlive { lease: id, sent_at: now });
                }
                if !self.registered && !self.registering {
                    self.registering = true;
                    return Some(Request::Register { lease: id });
                }
                if self.registered && self.leader.is_none() && !self.campaigning && !self.campaign_lost {
                    self.campaigning = true;
                    return Some(Request::Campaign { lease: id });
                }
                if self.registered && !self.publishing && now >= self.next_publish {
                    self.publishing = true;
                    return Some(Request::Publish { lease: id });
                }
            }
        }
        if let (true, Some(l)) = (self.leading, &self.leader) {
            if !self.allocating && now >= self.next_allocation {
                self.allocating = true;
                return Some(Request::Allocate { term: l.term, epoch: self.epoch });
            }
        }
        None
    }

    /// When to call [`Self::poll_request`] again at the latest (the next keep-alive,
    /// the lease's end, the next allocation).
    pub fn poll_timeout(&self) -> Option<u64> {
        let mut t = None::<u64>;
        let mut at = |x: u64| t = Some(t.map_or(x, |t| t.min(x)));
        if let Lease::Held { valid_until, last_sent, renewing, .. } = self.lease {
            at(valid_until);
            if !renewing {
                at((last_sent + self.timing.keepalive_every_ms()).max(self.backoff_until));
            }
            if self.registered && !self.publishing {
                at(self.next_publish.max(self.backoff_until));
            }
        } else {
            at(self.backoff_until);
        }
        if self.leading && !self.allocating {
            at(self.next_allocation);
        }
        t
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        if self.events.is_empty() {
            None
        } else {
            Some(self.events.remove(0))
        }
    }

    /// A lease `id` of `ttl_s` seconds was granted for a request sent at `sent_at`.
    pub fn lease_granted(&mut self, now: u64, sent_at: u64, id: i64, ttl_s: i64) {
        let valid_until = self.valid_until(sent_at, ttl_s);
        self.lease = Lease::Held { id, valid_until, last_sent: sent_at, renewing: false };
        self.registered = false;
        self.registering = false;
        self.campaigning = false;
        self.expire(now);
    }

    /// A keep-alive of `lease` sent at `sent_at` was answered with `ttl_s` seconds left
    /// (0: etcd no longer knows the lease). An answer for an earlier lease is ignored.
    pub fn kept_alive(&mut self, now: u64, lease: i64, sent_at: u64, ttl_s: i64) {
        if let Lease::Held { id, valid_until, .. } = self.lease {
            if id != lease {
            } else if ttl_s <= 0 {
                self.lose_lease();
            } else {
                let until = self.valid_until(sent_at, ttl_s).max(valid_until);
                self.lease = Lease::Held { id, valid_until: until, last_sent: sent_at, renewing: false };
            }
        }
        self.expire(now);
    }

    /// A request to etcd failed (unreachable, timed out, refused): the lease runs on
    /// until its end; the request is retried at the next poll.
    pub fn etcd_failed(&mut self, now: u64, what: &Request) {
        self.etcd_errors += 1;
        self.backoff_until = now + BACKOFF_MS;
        match *what {
            Request::GrantLease => self.lease = Lease::None { granting: false },
            Request::KeepAlive { lease, .. } => {
                if let Lease::Held { id, valid_until, last_sent, .. } = self.lease {
                    if id != lease {
                        return self.expire(now);
                    }
                    // Retried once the back-off ends.
                    let last_sent = last_sent.max(now.saturating_sub(self.timing.keepalive_every_ms()));
                    self.lease = Lease::Held { id, valid_until, last_sent, renewing: false };
                }
            }
            Request::Register { .. } => self.registering = false,
            Request::Campaign { .. } => self.campaigning = false,
            Request::Publish { .. } => self.publishing = false,
            Request::Allocate { .. } => self.allocated(now, None),
        }
        self.expire(now);
    }

    /// The member key was written under lease `lease`.
    pub fn registered(&mut self, lease: i64) {
        if matches!(self.lease, Lease::Held { id, .. } if id == lease) {
            self.registered = true;
        }
        self.registering = false;
    }

    /// The campaign's transaction answered: `Some(term)` if this node created the leader
    /// key, `None` if another holds it (its watch says who).
    pub fn campaigned(&mut self, now: u64, term: Option<i64>) {
        self.campaigning = false;
        match term {
            Some(term) => {
                if let Lease::Held { id, .. } = self.lease {
                    self.won = Some((id, term));
                }
                self.leader_seen(now, Some(Leader { name: self.name.clone(), term }))
            }
            None => self.campaign_lost = true,
        }
    }

    /// The leader key as etcd's watch (or a read) shows it.
    pub fn leader_seen(&mut self, now: u64, leader: Option<Leader>) {
        self.leader = leader;
        self.campaign_lost = false;
        self.expire(now);
        self.update_leading(now);
    }

    /// The members etcd lists (their keys live under their leases).
    pub fn members_seen(&mut self, mut members: Vec<MemberInfo>) {
        members.sort_by(|a, b| a.name.cmp(&b.name));
        if !members.iter().any(|m| m.name == self.name) && self.registered {
            // Our key is gone (the lease expired at etcd, or somebody deleted it).
            self.registered = false;
        }
        self.members = members;
    }

    /// The map's epoch etcd holds.
    pub fn epoch_seen(&mut self, epoch: u64) {
        self.epoch = self.epoch.max(epoch);
    }

    /// This window's estimates were written.
    pub fn published(&mut self, now: u64) {
        self.publishing = false;
        self.next_publish = now + self.timing.interval_ms;
    }

    /// The leader's allocation finished: `Some(epoch)` if it wrote a new map, `None` if
    /// nothing changed or the write lost its guard.
    pub fn allocated(&mut self, now: u64, epoch: Option<u64>) {
        self.allocating = false;
        self.next_allocation = now + self.timing.interval_ms;
        if let Some(e) = epoch {
            self.epoch_seen(e);
        }
    }

    /// Whether this node may serve other nodes' data at `now` (a valid lease).
    pub fn serving(&self, now: u64) -> bool {
        matches!(self.lease, Lease::Held { valid_until, .. } if now < valid_until)
    }

    /// Whether this node leads at `now`.
    pub fn leading(&self, now: u64) -> bool {
        self.leading && self.serving(now)
    }

    /// The leader, as last seen.
    pub fn leader(&self) -> Option<&Leader> {
        self.leader.as_ref()
    }

    /// The members, as last seen (by name).
    pub fn members(&self) -> &[MemberInfo] {
        &self.members
    }

    /// The map epoch this node is at.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The lease and when this node stops trusting it, if held.
    pub fn lease(&self) -> Option<(i64, u64)> {
        match self.lease {
            Lease::Held { id, valid_until, .. } => Some((id, valid_until)),
            Lease::None { .. } => None,
        }
    }

    /// Requests to etcd that failed so far.
    pub fn etcd_errors(&self) -> u64 {
        self.etcd_errors
    }

    /// A peer request made at map epoch `sent`, at `now`: accepted, or why not.
    pub fn check_epoch(&self, now: u64, sent: u64) -> Result<(), EpochRefusal> {
        if !self.serving(now) {
            return Err(EpochRefusal::Fenced);
        }
        let current = self.epoch;
        match sent.cmp(&current) {
            std::cmp::Ordering::Less => Err(EpochRefusal::Stale { sent, current }),
            std::cmp::Ordering::Greater => Err(EpochRefusal::Ahead { sent, current }),
            std::cmp::Ordering::Equal => Ok(()),
        }
    }

    fn valid_until(&self, sent_at: u64, ttl_s: i64) -> u64 {
        let ttl = (ttl_s.max(0) as u64 * 1000).min(self.timing.lease_ttl_ms.max(1000) * 2);
        (sent_at + ttl).saturating_sub(self.timing.margin_ms)
    }

    fn lose_lease(&mut self) {
        self.lease = Lease::None { granting: false };
        self.registered = false;
        self.registering = false;
        self.campaigning = false;
    }

    /// The lease's end passed: fenced, not leading.
    fn expire(&mut self, now: u64) {
        if matches!(self.lease, Lease::Held { valid_until, .. } if now >= valid_until) {
            self.lose_lease();
        }
        let serving = self.serving(now);
        if serving != self.serving {
            self.serving = serving;
            self.events.push(if serving { Event::Serving } else { Event::Fenced });
        }
        self.update_leading(now);
    }

    fn update_leading(&mut self, now: u64) {
        let held = match self.lease {
            Lease::Held { id, .. } => Some(id),
            Lease::None { .. } => None,
        };
        let leading = self.serving(now)
            && self
                .leader
                .as_ref()
                .is_some_and(|l| l.name == self.name && held.is_some_and(|id| self.won == Some((id, l.term))));
        if leading != self.leading {
            self.leading = leading;
            if let (true, Some(l)) = (leading, &self.leader) {
                self.events.push(Event::Leading(l.term));
                self.next_allocation = now;
            } else {
                self.events.push(Event::NotLeading);
            }
        }
    }
}

#[cfg(test)]
#[path = "membership_tests.rs"]
mod tests;
