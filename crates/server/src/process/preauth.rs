//! Connections that have not finished their NBD handshake (TLS included), or their first
//! API request, kept apart from the established ones: 1,030
//! idle TCP connections took every NBD slot and real clients failed "to read initial
//! magic", renewably every `handshake_timeout`, with `tls = "require"` and no certificate.
//! Here such a connection holds no established slot; the pool of them has a size of its
//! own and a share per source address, and when either is full the *oldest* one is
//! closed to make room — a real client finishes its handshake in milliseconds, so the
//! oldest waiting connection is almost surely one that never will. An attacker then must
//! open connections faster than a client completes a handshake to keep one out, and the
//! established clients are never touched. Evictions are counted (`/metrics`) and logged
//! once when they begin and once when they end.

use crate::guards::Guards;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Closes a waiting connection (shuts its socket down: its blocked reads end).
pub(crate) type Closer = Box<dyn Fn() + Send + Sync>;

struct Waiting {
    start: Instant,
    source: String,
    close: Closer,
}

/// The pool of connections still in their handshake.
pub(crate) struct PreAuth {
    what: &'static str,
    max: usize,
    per_source: usize,
    table: Mutex<BTreeMap<u64, Waiting>>,
    next: AtomicU64,
    evicting: AtomicBool,
    counts: Arc<Guards>,
}

impl std::fmt::Debug for PreAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreAuth")
            .field("what", &self.what)
            .field("max", &self.max)
            .field("waiting", &self.waiting())
            .finish()
    }
}

/// A connection's place in the pool, left when dropped (its handshake ended).
pub(crate) struct Place {
    pool: Arc<PreAuth>,
    id: u64,
    /// It left the pool itself ([`Place::leave`]).
    left: std::cell::Cell<bool>,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut t = self.pool.table.lock().unwrap_or_else(|e| e.into_inner());
        t.remove(&self.id);
        if t.is_empty() && self.pool.evicting.swap(false, Relaxed) {
            tracing::info!(what = self.pool.what, "connections still in their handshake are below their limit again");
        }
    }
}

impl Place {
    /// Whether the connection was closed to make room (its handshake's error is that).
    pub(crate) fn evicted(&self) -> bool {
        !self.left.get() && !self.pool.table.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&self.id)
    }

    /// The handshake is about to tell its client it is connected: the connection leaves
    /// the pool now, so no newer one can close it from here on. `false`: it was closed
    /// to make room already (its client must not be told it is connected).
    pub(crate) fn leave(&self) -> bool {
        let left = self.pool.table.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id).is_some();
        self.left.set(left);
        left
    }
}

impl PreAuth {
    /// A pool of at most `max` waiting connections, `per_source` of them from one
    /// address; `what` labels the log.
    pub(crate) fn new(what: &'static str, max: usize, per_source: usize, counts: Arc<Guards>) -> Arc<PreAuth> {
        Arc::new(PreAuth {
            what,
            max: max.max(1),
            per_source: per_source.max(1),
            table: Default::default(),
            next: AtomicU64::new(0),
            evicting: AtomicBool::new(false),
            counts,
        })
    }

    /// The pool for `max_connections` established NBD connections: a quarter of them
    /// (at least 16) waiting at once, a quarter of those (at least 4) from one source.
    pub(crate) fn for_nbd(max_connections: usize, counts: Arc<Guards>) -> Arc<PreAuth> {
        let max = (max_connections / 4).max(16);
        PreAuth::new("nbd", max, (max / 4).max(4), counts)
    }

    /// Enters a connection from `source` (closed by `close` if it is evicted); makes room
    /// by closing the oldest waiting connection of the same source when that source has
    /// its share, else the oldest of all when the pool is full.
    pub(crate) fn enter(self: &Arc<Self>, source: &str, close: Closer) -> Place {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let from_source = t.values().filter(|w| w.source == source).count();
        let victim = if from_source >= self.per_source {
            t.iter().filter(|(_, w)| w.source == source).min_by_key(|(_, w)| w.start).map(|(&id, _)| id)
        } else if t.len() >= self.max {
            t.iter().min_by_key(|(_, w)| w.start).map(|(&id, _)| id)
        } else {
            None
        };
        if let Some(id) = victim {
            if let Some(w) = t.remove(&id) {
                (w.close)();
                self.counts.handshakes_evicted.fetch_add(1, Relaxed);
                if !self.evicting.swap(true, Relaxed) {
                    tracing::warn!(
                        what = self.what,
                        max = self.max,
                        per_source = self.per_source,
                        "connections still in their handshake at their limit: the oldest are closed to make room"
                    );
                }
            }
        }
        let id = self.next.fetch_add(1, Relaxed);
        t.insert(id, Waiting { start: Instant::now(), source: source.to_string(), close });
        Place { pool: self.clone(), id, left: std::cell::Cell::new(false) }
    }

    /// Connections waiting now (the log says when evictions end: once none waits).
    pub(crate) fn waiting(&self) -> usize {
        self.table.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn closer(log: &Arc<Mutex<Vec<u32>>>, n: u32) -> Closer {
        let log = log.clone();
        Box::new(move || log.lock().unwrap().push(n))
    }

    #[test]
    fn the_oldest_waiting_connection_makes_room_and_a_source_has_its_share() {
        let closed = Arc::new(Mutex::new(Vec::new()));
        let p = PreAuth::new("t", 4, 2, Default::default());
        let a = p.enter("x", closer(&closed, 0));
        let _b = p.enter("x", closer(&closed, 1));
        // x has its share: its oldest goes.
        let _c = p.enter("x", closer(&closed, 2));
        assert_eq!(*closed.lock().unwrap(), vec![0]);
        drop(a); // already gone: no harm
        let _d = p.enter("y", closer(&closed, 3));
        let _e = p.enter("z", closer(&closed, 4));
        assert_eq!(p.waiting(), 4);
        // Full: the oldest of all (x's second) goes.
        let _f = p.enter("w", closer(&closed, 5));
        assert_eq!(*closed.lock().unwrap(), vec![0, 1]);
        assert_eq!(p.waiting(), 4);
        assert_eq!(p.counts.read(Default::default()).handshakes_evicted, 2);
        drop(_f);
        assert_eq!(p.waiting(), 3);
    }

    #[test]
    fn a_connection_that_left_before_its_reply_is_never_closed_and_one_closed_cannot_leave() {
        let closed = Arc::new(Mutex::new(Vec::new()));
        let p = PreAuth::new("t", 1, 1, Default::default());
        let a = p.enter("x", closer(&closed, 0));
        assert!(a.leave(), "still waiting: it leaves, its client is told it is connected");
        let b = p.enter("x", closer(&closed, 1));
        assert!(closed.lock().unwrap().is_empty(), "the one that left makes no room");
        assert!(!a.evicted());
        let _c = p.enter("x", closer(&closed, 2));
        assert_eq!(*closed.lock().unwrap(), vec![1]);
        assert!(b.evicted() && !b.leave(), "closed to make room: its client is told nothing");
    }
}
