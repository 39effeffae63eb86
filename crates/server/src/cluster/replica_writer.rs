//! The replica log's writers (group commit): the data path queues each replicated
//! write's records ([`Replicator::enqueue`]); a writer takes every write queued, in
//! order, reserves their records in the log at once, writes them to the peer as one
//! device write (one `O_DSYNC` write there, split only where the ring wraps), and
//! delivers the outcomes to the data path, which completes the writes. [`WRITERS`]
//! writers run at once, so a batch gathers while the one before is on its way: the more
//! writes are queued, the larger the batch, with no timer. A log that is full waits for
//! its trim; one that is being declared void holds the writes; one that is void answers
//! `Bypass` (the data path writes the bytes through). A failed append degrades the log
//! and its writes go back to the head of the queue, to be logged again or bypassed.

use super::replicator::Replicator;
use cachevisor_cluster::replica_log::Append;
use cachevisor_cluster::replica_record::{self as rr, Geometry, Kind, Record, HEADER};
use cachevisor_datapath::injected::{LogRecord, Logged};
use cachevisor_engine::{Device, Io};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// Writers appending at once (each on its own connection to the peer).
pub(super) const WRITERS: usize = 4;

/// The most bytes one append carries.
const BATCH_BYTES: usize = 4 << 20;

/// A write waiting for its records to be appended.
pub(crate) struct Queued {
    ticket: u64,
    recs: Vec<LogRecord>,
    /// When the data path queued it.
    asked: Instant,
    /// It waited for the log (a failed append, a wait for etcd or for room): its wait
    /// counts as a stall.
    stalled: bool,
}

impl Replicator {
    /// Queues write `ticket`'s records for the next batch.
    pub(super) fn enqueue(&self, ticket: u64, recs: Vec<LogRecord>) {
        let q = Queued { ticket, recs, asked: Instant::now(), stalled: false };
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).push_back(q);
        self.queue_cv.notify_one();
    }

    /// Hands outcomes to the data path.
    fn deliver(&self, outcomes: Vec<(u64, std::io::Result<Logged>)>) {
        match self.sink.get() {
            Some(f) => f(outcomes),
            None => tracing::error!(writes = outcomes.len(), "replica log: outcomes with nowhere to go"),
        }
    }

    /// A writer: appends batches until stopped; then fails whatever is queued.
    pub(super) fn write_loop(&self) {
        let mut waited = Duration::ZERO;
        let mut next_warn = Duration::from_secs(10);
        // The records' bytes of one append, reused from append to append.
        let mut encoded = Vec::new();
        loop {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            while q.is_empty() && !self.stop.load(Relaxed) {
                q = self.queue_cv.wait_timeout(q, Duration::from_millis(100)).unwrap_or_else(|e| e.into_inner()).0;
            }
            if self.stop.load(Relaxed) {
                let stopped = q.drain(..).map(|w| (w.ticket, Err(stopped()))).collect::<Vec<_>>();
                drop(q);
                self.deliver(stopped);
                return;
            }
            // Reserve what is queued, in order, while the log grants it.
            let mut st = self.lock();
            let rb = st.log.geometry().record_bytes() as usize;
            let (mut granted, mut bypass, mut bytes) = (Vec::new(), Vec::new(), 0usize);
            let mut blocked = false;
            while let Some(w) = q.front() {
                let n = w.recs.len();
                if !granted.is_empty() && bytes + n * rb > BATCH_BYTES {
                    break;
                }
                match st.log.reserve(n as u64) {
                    Append::Granted(first) => {
                        bytes += n * rb;
                        granted.push((q.pop_front().expect("front"), first));
                    }
                    Append::Bypass => bypass.push(q.pop_front().expect("front")),
                    Append::Full | Append::Wait => {
                        blocked = true;
                        break;
                    }
                }
            }
            if blocked {
                q.iter_mut().for_each(|w| w.stalled = true);
            }
            drop(q);
            if granted.is_empty() && bypass.is_empty() {
                // Full until a trim ends, or held while etcd is told the log is void.
                let t = Instant::now();
                drop(self.cv.wait_timeout(st, Duration::from_millis(50)).unwrap_or_else(|e| e.into_inner()));
                waited += t.elapsed();
                if waited >= next_warn {
                    next_warn += Duration::from_secs(10);
                    tracing::warn!(
                        waited_s = waited.as_secs(),
                        "replica log: writes have waited a long time for the log (etcd unreachable?)"
                    );
                }
                continue;
            }
            waited = Duration::ZERO;
            next_warn = Duration::from_secs(10);
            let (log_id, g) = (st.log.log_id(), st.log.geometry());
            for w in &bypass {
                st.delivered(w.ticket);
            }
            drop(st);
            if !bypass.is_empty() {
                for w in &bypass {
                    self.stall_max_us.fetch_max(w.asked.elapsed().as_micros() as u64, Relaxed);
                }
                self.deliver(bypass.iter().map(|w| (w.ticket, Ok(Logged::Bypass))).collect());
            }
            if !granted.is_empty() {
                self.append(g, log_id, granted, &mut encoded);
            }
        }
    }

    /// Writes the granted writes' records (consecutive from the first's `first`) and
    /// delivers their outcomes; after a failure they go back to the head of the queue.
    /// `buf` holds the records' bytes on the way.
    fn append(&self, g: Geometry, log_id: u64, granted: Vec<(Queued, u64)>, buf: &mut Vec<u8>) {
        let start = granted[0].1;
        let ok = self.encode(g, log_id, &granted, buf) && self.write_run(g, start, buf);
        let mut st = self.lock();
        st.log.appended(ok);
        for (w, first) in &granted {
            st.appended(w.ticket, *first);
            if ok {
                st.delivered(w.ticket);
            }
        }
        drop(st);
        self.cv.notify_all();
        if ok {
            let n: usize = granted.iter().map(|(w, _)| w.recs.len()).sum();
            self.records.fetch_add(n as u64, Relaxed);
            for (w, _) in granted.iter().filter(|(w, _)| w.stalled) {
                self.stall_max_us.fetch_max(w.asked.elapsed().as_micros() as u64, Relaxed);
            }
            self.deliver(granted.into_iter().map(|(w, _)| (w.ticket, Ok(Logged::Appended))).collect());
        } else {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            for (mut w, _) in granted.into_iter().rev() {
                w.stalled = true;
                q.push_front(w);
            }
            drop(q);
            self.queue_cv.notify_one();
        }
    }

    /// Puts the bytes of the granted writes' records in `buf`, each a whole ring slot
    /// (zeros past its data), from the first's sequence number on; `false` for a record the
    /// log cannot hold (a vDisk no longer replicated, a cache write not in whole sectors):
    /// the append fails.
    fn encode(&self, g: Geometry, log_id: u64, granted: &[(Queued, u64)], buf: &mut Vec<u8>) -> bool {
        let names = self.vms_read();
        let rb = g.record_bytes() as usize;
        let n: usize = granted.iter().map(|(w, _)| w.recs.len()).sum();
        buf.clear();
        buf.resize(rb * n, 0);
        let mut i = 0;
        for (w, first) in granted {
            debug_assert_eq!(*first, granted[0].1 + i as u64, "granted together: consecutive");
            for r in &w.recs {
                let Some(Some(vdisk)) = names.get(r.vm as usize) else { return false };
                let data = r.data.as_deref().unwrap_or(&[]);
                let (offset, len) = match r.data {
                    Some(_) if rr::check(vdisk, r.offset, r.len, g.block).is_ok() => (r.offset, r.len),
                    Some(_) => {
                        tracing::error!(
                            offset = r.offset,
                            len = r.len,
                            "replica log: a cache write not in whole sectors"
                        );
                        return false;
                    }
                    None => rr::tombstone_range(r.offset, r.len),
                };
                let rec = Record {
                    log_id,
                    seq: granted[0].1 + i as u64,
                    kind: if r.data.is_some() { Kind::Data } else { Kind::Tombstone },
                    vdisk: vdisk.clone(),
                    offset,
                    len,
                    data_crc: rr::crc(data),
                };
                let at = i * rb;
                buf[at..at + HEADER as usize].copy_from_slice(&rec.encode());
                buf[at + HEADER as usize..at + HEADER as usize + data.len()].copy_from_slice(data);
                i += 1;
            }
        }
        true
    }

    /// Writes records from `first` (whole slots) into the ring, split where it wraps.
    fn write_run(&self, g: Geometry, first: u64, bytes: &[u8]) -> bool {
        let rb = g.record_bytes() as usize;
        let count = bytes.len() / rb;
        let mut i = 0;
        while i < count {
            let seq = first + i as u64;
            let k = ((g.slots - seq % g.slots) as usize).min(count - i);
            self.writes.fetch_add(1, Relaxed);
            let t = Instant::now();
            let r = self.device.submit(0, g.offset_of(seq), Io::Write(&bytes[i * rb..(i + k) * rb]));
            self.write_ns.fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
            if let Err(e) = r {
                tracing::debug!(%e, "replica log: append failed");
                return false;
            }
            i += k;
        }
        true
    }
}

fn stopped() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::NotConnected, "stopping: a replicated write was not logged")
}
