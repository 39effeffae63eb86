//! A borrower's device for a region a peer lends it (`[cluster] peers`, `borrow`): the
//! engine's `StoreKind::Lent { node }` row, run over our NBD client (`backing.rs`'s pool,
//! TLS with this node's client certificate) against the peer's export
//! `lent-<me>@<epoch>@<incarnation>` (`lent.rs`), the address, epoch and incarnation read
//! from the cluster view at each connection.
//!
//! What keeps a borrower from reading what is not its data: an op fails (EIO) — and the
//! engine's repair drops the clean block, the request is retried from the backing store
//! (`cachevisor_datapath::vdisk_export`) — when the peer is not a live member, when it has been
//! fenced (its export refuses), and for good once the peer's incarnation is not the one
//! this node first cached in: a lender that restarted has emptied its regions, so none of
//! the blocks the engine placed there exist any more. Blocks there are never dirty
//! (`Engine::set_lent_write_through`), so none of this loses an acknowledged write.

use super::Cluster;
use cachevisor_engine::{Device, Io};
use cachevisor_store::backing::Backing;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// What every peer device shares: this node's name, its credentials, the cluster handle
/// (set once the node joined).
pub(crate) struct PeerLinks {
    /// This node.
    pub me: String,
    /// Peers by engine node id − 1.
    pub peers: Vec<String>,
    /// Client credentials.
    pub certs: PathBuf,
    /// Slots of each peer's region.
    pub borrow_slots: u64,
    /// How long an op on a peer may take before it fails (the lease TTL: a peer cut off
    /// the network stalls the requests that reach it at most this long, and is dead in
    /// everybody's view by then).
    pub op_timeout: std::time::Duration,
    /// The cluster, once joined.
    pub cluster: OnceLock<Weak<Cluster>>,
    /// Peers whose blocks are gone for good here (they restarted: a new incarnation).
    pub restarted: Mutex<std::collections::BTreeSet<String>>,
    /// Peers whose last op failed, until when their ops fail at once (1.5 TTLs later).
    pub down: Mutex<std::collections::BTreeMap<String, std::time::Instant>>,
    /// How long some op on a peer was in flight: the node's link busy time, the
    /// congestion signal of the migration planner (ELICA §3.6.3).
    pub busy: LinkBusy,
}

/// Time with at least one op on a peer in flight.
#[derive(Default)]
pub(crate) struct LinkBusy {
    /// Ops in flight, since when some were, and the busy time before that.
    state: Mutex<(u32, Option<std::time::Instant>, u64)>,
}

impl LinkBusy {
    fn begin(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.0 == 0 {
            s.1 = Some(std::time::Instant::now());
        }
        s.0 += 1;
    }

    fn end(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.0 -= 1;
        if s.0 == 0 {
            if let Some(t) = s.1.take() {
                s.2 += t.elapsed().as_nanos() as u64;
            }
        }
    }

    /// Busy nanoseconds so far (the current busy spell included).
    pub(crate) fn busy_ns(&self) -> u64 {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.2 + s.1.map_or(0, |t| t.elapsed().as_nanos() as u64)
    }
}

/// The cluster's lent regions as the data path's remote cache stores: node id k is
/// `peers[k − 1]`.
pub(crate) struct PeerStores(pub Arc<PeerLinks>);

impl cachevisor_datapath::injected::RemoteStores for PeerStores {
    fn device(&self, node: u16, size: u64) -> Option<cachevisor_datapath::injected::StoreDevice> {
        let name = self.0.peers.get(usize::from(node).wrapping_sub(1))?;
        Some(Box::new(PeerDevice::new(self.0.clone(), name.clone(), size)))
    }
}

impl PeerLinks {
    /// Whether `peer`'s region may be given blocks again: it did not restart, and its
    /// last failure is 1.5 lease TTLs old (by then a dead peer is gone from the members;
    /// one that answers again is live and serves).
    pub(crate) fn usable(&self, peer: &str) -> bool {
        let down = self.down.lock().unwrap_or_else(|e| e.into_inner()).get(peer).copied();
        !self.restarted.lock().unwrap_or_else(|e| e.into_inner()).contains(peer)
            && down.is_none_or(|t| std::time::Instant::now() >= t)
    }
}

use cachevisor_datapath::injected::{is_remote_failure as is_peer_failure, RemoteUnavailable as PeerUnavailable};

/// The connection and the incarnation it reaches.
#[derive(Default)]
struct Link {
    conn: Option<(u64, u64, Arc<Backing>)>,
    /// The incarnation the engine's blocks in this store were placed in.
    first: Option<u64>,
    /// After a failure, ops fail at once until then (1.5 TTLs) (no reconnect per op to a peer that
    /// does not answer: the requests go to the backing store instead).
    down_until: Option<std::time::Instant>,
}

/// One peer's lent region, or the replica log it keeps for this node.
pub(crate) struct PeerDevice {
    links: Arc<PeerLinks>,
    peer: String,
    size: u64,
    link: Mutex<Link>,
    /// The peer's replica log for this node (`replica-<me>@<epoch>`, kept across the
    /// peer's restarts) instead of its lent region.
    replica: bool,
}

fn refused(msg: String) -> io::Error {
    io::Error::other(PeerUnavailable(msg))
}

impl PeerDevice {
    /// The region `peer` lends this node, `size` bytes.
    pub(crate) fn new(links: Arc<PeerLinks>, peer: String, size: u64) -> PeerDevice {
        PeerDevice { links, peer, size, link: Mutex::new(Link::default()), replica: false }
    }

    /// The replica log `peer` keeps for this node (its size read from the export).
    pub(crate) fn replica_log(links: Arc<PeerLinks>, peer: String) -> PeerDevice {
        PeerDevice { links, peer, size: 0, link: Mutex::new(Link::default()), replica: true }
    }

    /// The size of the peer's export (connecting if need be).
    pub(crate) fn export_size(&self) -> io::Result<u64> {
        let b = self.connection().map_err(|e| self.failed(e))?;
        b.size().map_err(|e| self.failed(e))
    }

    fn replica_connection(&self, c: &Cluster) -> io::Result<Arc<Backing>> {
        let (addr, epoch) = c
            .replica_target(&self.peer)
            .ok_or_else(|| refused(format!("{} is not a live member keeping replica logs", self.peer)))?;
        let mut l = self.link.lock().unwrap_or_else(|e| e.into_inner());
        if l.down_until.is_some_and(|t| std::time::Instant::now() < t) {
            return Err(refused(format!("{} failed moments ago", self.peer)));
        }
        if let Some((_, e, b)) = &l.conn {
            if *e == epoch {
                return Ok(b.clone());
            }
        }
        let uri =
            format!("nbds://{addr}/replica-{}@{epoch}?tls-certificates={}", self.links.me, self.links.certs.display());
        let b = Arc::new(Backing::connect_once_within(std::path::Path::new(&uri), self.links.op_timeout)?);
        b.set_op_timeout(Some(self.links.op_timeout))?;
        l.conn = Some((0, epoch, b.clone()));
        Ok(b)
    }

    /// The connection to use now.
    fn connection(&self) -> io::Result<Arc<Backing>> {
        let c = self.links.cluster.get().and_then(Weak::upgrade).ok_or_else(|| refused("not joined yet".into()))?;
        if self.replica {
            return self.replica_connection(&c);
        }
        let (addr, incarnation, epoch) =
            c.peer_target(&self.peer).ok_or_else(|| refused(format!("{} is not a live member", self.peer)))?;
        let mut l = self.link.lock().unwrap_or_else(|e| e.into_inner());
        if l.down_until.is_some_and(|t| std::time::Instant::now() < t) {
            return Err(refused(format!("{} failed moments ago", self.peer)));
        }
        if *l.first.get_or_insert(incarnation) != incarnation {
            self.links.restarted.lock().unwrap_or_else(|e| e.into_inner()).insert(self.peer.clone());
            return Err(refused(format!(
                "{} restarted (incarnation {incarnation}): the blocks cached there are gone",
                self.peer
            )));
        }
        if let Some((i, e, b)) = &l.conn {
            if *i == incarnation && *e == epoch {
                return Ok(b.clone());
            }
        }
        let uri = format!(
            "nbds://{addr}/lent-{}@{epoch}@{incarnation}?tls-certificates={}",
            self.links.me,
            self.links.certs.display()
        );
        let b = Arc::new(Backing::connect_once_within(std::path::Path::new(&uri), self.links.op_timeout)?);
        b.set_op_timeout(Some(self.links.op_timeout))?;
        l.conn = Some((incarnation, epoch, b.clone()));
        Ok(b)
    }

    fn failed(&self, e: io::Error) -> io::Error {
        if is_peer_failure(&e) && e.to_string().ends_with("failed moments ago") {
            return e; // inside the window: already reported
        }
        let mut l = self.link.lock().unwrap_or_else(|e| e.into_inner());
        if l.down_until.is_none_or(|t| std::time::Instant::now() >= t) {
            if self.replica {
                tracing::warn!(peer = %self.peer, %e, "replica log on a peer: write failed (the replicated vDisks go through to the backing store until a new log is in place)");
            } else {
                tracing::warn!(peer = %self.peer, %e, "lent cache on a peer: op failed (its ops fail at once for 1.5 lease TTLs; the requests are served from the backing store)");
            }
        }
        l.conn = None;
        // One and a half TTLs: a dead peer's lease has expired at etcd by then and this
        // node has read it (a peer tried again before that still looks live: its
        // connection is refused, one more failure).
        let until = std::time::Instant::now() + self.links.op_timeout * 3 / 2;
        l.down_until = Some(until);
        self.links.down.lock().unwrap_or_else(|e| e.into_inner()).insert(self.peer.clone(), until);
        io::Error::other(PeerUnavailable(format!("{}: {e}", self.peer)))
    }
}

impl Device for PeerDevice {
    fn submit(&self, now_ns: u64, at: u64, io: Io<'_>) -> io::Result<u64> {
        let b = self.connection().map_err(|e| self.failed(e))?;
        self.links.busy.begin();
        let r = match io {
            Io::Read(buf) => b.read_at(buf, at),
            Io::Write(data) => b.write_at(data, at),
            Io::Model { .. } => Err(io::Error::new(io::ErrorKind::InvalidInput, "a model's op on a peer's region")),
        };
        self.links.busy.end();
        r.map_err(|e| self.failed(e))?;
        Ok(now_ns)
    }

    /// Nothing to make durable: a lent region holds clean blocks only (write-through),
    /// their journal records are never restored (`persist.rs`), and the lender empties
    /// its regions at every start. Syncing it would only make this node's commits — its
    /// own vDisks' acknowledgements — wait on a peer (measured: a commit retried for 3 s
    /// after a lender's SIGKILL, a 3.2 s stall of the borrower's reads).
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }

    fn queue_depth(&self) -> u32 {
        1
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn describe(&self) -> String {
        if self.replica {
            format!("the replica log {} keeps for this node", self.peer)
        } else {
            format!("the cache region {} lends this node", self.peer)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LinkBusy;
    use std::time::Duration;

    #[test]
    fn busy_time_is_the_union_of_ops_in_flight() {
        let b = LinkBusy::default();
        assert_eq!(b.busy_ns(), 0);
        b.begin();
        b.begin(); // two at once count once
        std::thread::sleep(Duration::from_millis(20));
        b.end();
        let mid = b.busy_ns();
        assert!(mid >= 20_000_000, "{mid}");
        b.end();
        let idle = b.busy_ns();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(b.busy_ns(), idle, "no op in flight: not busy");
    }
}
