//! A scenario's request stream read on its own thread (reading and decoding a
//! trace was about a quarter of a cache-model run; on a second core it overlaps the
//! replay). The reader sends batches of requests through a bounded channel and gets the
//! emptied buffers back, so memory stays a few batches.
//!
//! What the replay sees is exactly what reading in place gives: the same requests in the
//! same order, up to the same limit (the reader never reads past it, so per-input counts
//! match), VM names as they were right after each request was read (a batch ends where
//! the names grow, and carries the names read with its first request), and a trace error
//! after the requests before it.
//!
//! Hand-written: a channel of batches is all it takes; no crate does this for a
//! `TraceSource` that must keep its name and count semantics.

use crate::inputs::Inputs;
use cachevisor_trace::{Request, SourceCounts, TraceError};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

/// Requests per batch (32 bytes each: 256 KiB).
const BATCH: usize = 8192;
/// Batches in flight between the reader and the replay.
const IN_FLIGHT: usize = 4;

/// What the reader thread sends.
enum Msg {
    /// Requests, with the VM names as of the first one when they grew at it.
    Batch(Vec<Request>, Option<Vec<String>>),
    /// The end of the stream (or of the limit), with the per-input counts there.
    End(Vec<SourceCounts>),
    /// A trace error after the requests already sent.
    Error(TraceError),
}

/// The request stream of [`Inputs`], read ahead on a thread.
pub struct ReadAhead {
    rx: Receiver<Msg>,
    back: SyncSender<Vec<Request>>,
    batch: Vec<Request>,
    /// The next request of `batch`.
    pos: usize,
    names: Vec<String>,
    counts: Vec<SourceCounts>,
    ended: bool,
}

impl ReadAhead {
    /// Starts reading `inputs`, at most `limit` requests, on a thread of its own.
    pub fn spawn(inputs: Inputs, limit: u64) -> ReadAhead {
        let (tx, rx) = sync_channel(IN_FLIGHT);
        let (back, spare) = sync_channel(IN_FLIGHT + 2);
        std::thread::Builder::new()
            .name("trace-reader".into())
            .spawn(move || read(inputs, limit, &tx, &spare))
            .expect("a thread for the trace reader");
        ReadAhead { rx, back, batch: Vec::new(), pos: 0, names: Vec::new(), counts: Vec::new(), ended: false }
    }

    /// The next request, `Ok(None)` at the end.
    #[inline]
    pub fn next_request(&mut self) -> Result<Option<Request>, TraceError> {
        if let Some(&r) = self.batch.get(self.pos) {
            self.pos += 1;
            return Ok(Some(r));
        }
        self.next_batch()
    }

    /// The first request of the next batch (or the end, or the reader's error).
    #[cold]
    fn next_batch(&mut self) -> Result<Option<Request>, TraceError> {
        loop {
            if let Some(&r) = self.batch.get(self.pos) {
                self.pos += 1;
                return Ok(Some(r));
            }
            if self.ended {
                return Ok(None);
            }
            // The reader sends `End` or `Error` last; no message means it panicked.
            let Ok(msg) = self.rx.recv() else {
                self.ended = true;
                return Err(TraceError::Usage("the trace reader stopped (its panic is reported above)".into()));
            };
            match msg {
                Msg::Batch(v, names) => {
                    if let Some(n) = names {
                        self.names = n;
                    }
                    let old = std::mem::replace(&mut self.batch, v);
                    self.pos = 0;
                    if old.capacity() > 0 {
                        self.recycle(old); // (none when `take_batch` took it)
                    }
                }
                Msg::End(counts) => {
                    self.counts = counts;
                    self.ended = true;
                }
                Msg::Error(e) => {
                    self.ended = true;
                    return Err(e);
                }
            }
        }
    }

    /// The rest of the current batch, or the next one, whole (`Ok(None)` at the end): VM
    /// names ([`Self::vm_names`]) hold for all of it. Hand it back with [`Self::recycle`].
    pub fn take_batch(&mut self) -> Result<Option<Vec<Request>>, TraceError> {
        let Some(first) = self.next_request()? else { return Ok(None) };
        let mut v = std::mem::take(&mut self.batch);
        v.drain(..self.pos - 1);
        debug_assert_eq!(v.first(), Some(&first));
        self.pos = 0;
        Ok(Some(v))
    }

    /// Gives a batch's buffer back to the reader.
    pub fn recycle(&self, mut v: Vec<Request>) {
        v.clear();
        let _ = self.back.try_send(v);
    }

    /// VM names by id, as far as read when the last request returned was.
    pub fn vm_names(&self) -> &[String] {
        &self.names
    }

    /// Per-input counts; complete once the stream (or the limit) has ended.
    pub fn counts(&self) -> Vec<SourceCounts> {
        self.counts.clone()
    }
}

/// The reader thread: batches cut where the names grow, then `End` or `Error`. A replay
/// that stops early drops its receiver; the reader then stops at its next send.
fn read(mut inputs: Inputs, limit: u64, tx: &SyncSender<Msg>, spare: &Receiver<Vec<Request>>) {
    let mut n = 0u64;
    let mut names_len = 0;
    let mut batch = Vec::with_capacity(BATCH);
    let mut names: Option<Vec<String>> = None;
    let send = |batch: &mut Vec<Request>, names: &mut Option<Vec<String>>| {
        let next = spare.try_recv().unwrap_or_else(|_| Vec::with_capacity(BATCH));
        tx.send(Msg::Batch(std::mem::replace(batch, next), names.take())).is_ok()
    };
    loop {
        if n >= limit {
            break;
        }
        let r = match inputs.next_request() {
            Ok(Some(r)) => r,
            Ok(None) => break,
            Err(e) => {
                if !batch.is_empty() && !send(&mut batch, &mut names) {
                    return;
                }
                let _ = tx.send(Msg::Error(e));
                return;
            }
        };
        n += 1;
        let grew = inputs.vm_names().len() != names_len;
        if grew {
            // The names now are those right after `r`: `r` starts a batch carrying them.
            if !batch.is_empty() && !send(&mut batch, &mut names) {
                return;
            }
            names_len = inputs.vm_names().len();
            names = Some(inputs.vm_names().to_vec());
        }
        batch.push(r);
        if batch.len() == BATCH && !send(&mut batch, &mut names) {
            return;
        }
    }
    if !batch.is_empty() && !send(&mut batch, &mut names) {
        return;
    }
    let _ = tx.send(Msg::End(inputs.counts()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::open_inputs;
    use crate::scenario::Scenario;

    /// Everything reading in place sees, request by request: the request, the names then.
    type Seen = (Vec<(Request, usize)>, Result<(), String>, Vec<SourceCounts>);

    fn in_place(sc: &Scenario, limit: u64) -> Seen {
        let mut t = open_inputs(sc).unwrap();
        let mut v = Vec::new();
        let end = loop {
            if v.len() as u64 >= limit {
                break Ok(());
            }
            match t.next_request() {
                Ok(Some(r)) => v.push((r, t.vm_names().len())),
                Ok(None) => break Ok(()),
                Err(e) => break Err(e.to_string()),
            }
        };
        (v, end, t.counts())
    }

    /// The same through `take_batch`, the names read once per batch.
    fn batches(sc: &Scenario, limit: u64) -> Seen {
        let mut t = ReadAhead::spawn(open_inputs(sc).unwrap(), limit);
        let mut v = Vec::new();
        let end = loop {
            match t.take_batch() {
                Ok(Some(b)) => {
                    v.extend(b.iter().map(|&r| (r, t.vm_names().len())));
                    t.recycle(b);
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e.to_string()),
            }
        };
        (v, end, t.counts())
    }

    fn ahead(sc: &Scenario, limit: u64) -> Seen {
        let mut t = ReadAhead::spawn(open_inputs(sc).unwrap(), limit);
        let mut v = Vec::new();
        let end = loop {
            match t.next_request() {
                Ok(Some(r)) => v.push((r, t.vm_names().len())),
                Ok(None) => break Ok(()),
                Err(e) => break Err(e.to_string()),
            }
        };
        (v, end, t.counts())
    }

    #[test]
    fn reading_ahead_sees_what_reading_in_place_sees() {
        let d = tempfile::tempdir().unwrap();
        // Three VMs in two files, interleaved in time, the third appearing late; more
        // requests than a batch so batches are cut both by size and by new names.
        let (mut a, mut b) = (String::new(), String::new());
        for i in 0..20_000u64 {
            let vm = if i < 15_000 { "x" } else { "y" };
            a += &format!("{},{vm},R,{},4096\n", 2 * i, (i % 977) * 4096);
            b += &format!("{},z,W,{},8192\n", 2 * i + 1, (i % 31) * 8192);
        }
        let (pa, pb) = (d.path().join("a.csv"), d.path().join("b.csv"));
        std::fs::write(&pa, &a).unwrap();
        std::fs::write(&pb, &b).unwrap();
        let mut sc = Scenario::default();
        sc.trace.files = vec![pa.clone(), pb];
        sc.trace.format = Some(cachevisor_trace::Format::Csv);
        sc.trace.vm_mode = Some(cachevisor_trace::VmMode::Device);
        for limit in [u64::MAX, 30_001, 8192, 1] {
            let (x, y) = (in_place(&sc, limit), ahead(&sc, limit));
            assert!(x.0.len() as u64 == limit.min(40_000) && x.0.last().unwrap().1 >= 1, "{limit}");
            assert_eq!(x.0, y.0, "requests and names at {limit}");
            assert_eq!((&x.1, &x.2), (&y.1, &y.2), "end and counts at {limit}");
            let z = batches(&sc, limit);
            assert_eq!((x.0, x.1, x.2), (z.0, z.1, z.2), "batch by batch at {limit}");
        }
        // A bad line: the requests before it, then the same error.
        std::fs::write(&pa, format!("{a}99999999,x,R,zero,4096\n")).unwrap();
        let (x, y, z) = (in_place(&sc, u64::MAX), ahead(&sc, u64::MAX), batches(&sc, u64::MAX));
        assert!(x.1.is_err(), "the bad line fails");
        assert_eq!((&x.0, &x.1), (&y.0, &y.1));
        assert_eq!((x.0, x.1), (z.0, z.1));
    }
}
