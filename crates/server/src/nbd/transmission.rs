//! The transmission phase (NBD proto.md "Transmission"): requests are read, checked and
//! executed in order per connection, each answered with a simple reply — except reads that
//! miss the cache (and, with an O_DIRECT cache store, every read), and writes that go to
//! the backing store (write-through, write-around, pass-through), which are handed to the
//! connection's read threads (up to [`MISS_THREADS`]) and answered when their data arrives
//! from the device, while the requests behind them go on (NBD lets replies come in any order; a client only
//! relies on a reply to know its request is done). A request past the export's end or of
//! an unknown type gets EINVAL, a device failure EIO (ENOSPC when a device is full); a bad magic or an oversized WRITE
//! payload (the stream cannot be resynchronized) closes the connection. TRIM drops the
//! range from the cache and hints the backing store. A request to a vDisk removed
//! meanwhile gets ESHUTDOWN and the connection closes. Nothing is changed by a request that
//! is refused. Requests in flight are finished before a connection closes.

use super::proto::*;
use crate::daemon::Daemon;
use prometheus_client::metrics::histogram::Histogram;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Instant;

/// Threads per connection serving reads that wait on the backing store.
pub const MISS_THREADS: usize = 16;

/// Bytes zeroed per engine call by WRITE_ZEROES.
const ZERO_CHUNK: usize = 1 << 20;

/// Serves requests for export `vm` until the client disconnects. Requests are read
/// through a buffer and replies batched until no further request is already buffered, so
/// a pipelining client (iodepth > 1) costs few system calls per request.
pub fn serve<R: Read, W: Write + Send>(input: R, output: W, d: &Daemon, vm: u32) -> io::Result<()> {
    let Some(export) = d.export(vm) else { return Ok(()) }; // removed meanwhile
    let mut r = io::BufReader::with_capacity(1 << 18, input);
    let s = Replies(Mutex::new(io::BufWriter::with_capacity(1 << 18, output)));
    let (tx, rx) = mpsc::channel::<MissJob>();
    let shared = MissShared {
        rx: Mutex::new(rx),
        in_flight: AtomicUsize::new(0),
        threads: AtomicUsize::new(0),
        read_latency: d.metrics().histogram(&export.name, "read"),
        write_latency: d.metrics().histogram(&export.name, "write"),
    };
    let res = std::thread::scope(|scope| {
        let misses = Misses { scope, tx, shared: &shared, d, vm, s: &s };
        serve_buffered(&mut r, &s, d, &export, &misses)
        // `misses` (the sender) is dropped here; leaving the scope waits for the miss
        // threads to answer every read in flight.
    });
    let _ = s.flush();
    res
}

/// The connection's reply stream, shared with its miss threads.
struct Replies<W: Write>(Mutex<io::BufWriter<W>>);

impl<W: Write> Replies<W> {
    fn send(&self, b: &[u8]) -> io::Result<()> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).write_all(b)
    }
    fn flush(&self) -> io::Result<()> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).flush()
    }
}

/// A request handed to a read thread: a read, or a write (with its payload and FUA)
/// that waits on the backing store.
struct MissJob {
    cookie: u64,
    offset: u64,
    length: u32,
    started: Instant,
    write: Option<(Vec<u8>, bool)>,
}

impl MissJob {
    /// The read request `r`, received at `started`.
    fn read(r: &Request, started: Instant) -> MissJob {
        MissJob { cookie: r.cookie, offset: r.offset, length: r.length, started, write: None }
    }
}

/// What the miss threads share.
struct MissShared {
    rx: Mutex<mpsc::Receiver<MissJob>>,
    in_flight: AtomicUsize,
    threads: AtomicUsize,
    read_latency: Histogram,
    write_latency: Histogram,
}

/// The connection's miss threads, started as reads wait (at most [`MISS_THREADS`]).
struct Misses<'scope, 'env, W: Write + Send> {
    scope: &'scope std::thread::Scope<'scope, 'env>,
    tx: mpsc::Sender<MissJob>,
    shared: &'env MissShared,
    d: &'env Daemon,
    vm: u32,
    s: &'env Replies<W>,
}

impl<W: Write + Send> Misses<'_, '_, W> {
    /// Hands a read to a miss thread, starting one when all are busy.
    fn submit(&self, job: MissJob) {
        let sh = self.shared;
        let busy = sh.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        if busy > sh.threads.load(Ordering::Acquire) && sh.threads.load(Ordering::Acquire) < MISS_THREADS {
            sh.threads.fetch_add(1, Ordering::AcqRel);
            let (d, vm, s) = (self.d, self.vm, self.s);
            self.scope.spawn(move || miss_thread(sh, d, vm, s));
        }
        let _ = self.tx.send(job); // the receiver lives as long as the scope
    }
}

/// Serves handed-over reads until the connection's sender is gone and the queue is empty.
fn miss_thread<W: Write>(sh: &MissShared, d: &Daemon, vm: u32, s: &Replies<W>) {
    let mut reply = Vec::new();
    loop {
        let job = sh.rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
        let Ok(job) = job else { return };
        let sent = if let Some((data, fua)) = &job.write {
            let e = d.write(vm, job.offset, data, *fua).map_or_else(
                |e| {
                    tracing::error!(%e, vdisk = %vdisk_name(d, vm), "write failed");
                    e.nbd_errno()
                },
                |()| 0,
            );
            s.send(&simple_reply(e, job.cookie))
        } else {
            reply.clear();
            reply.extend_from_slice(&simple_reply(0, job.cookie));
            reply.resize(16 + job.length as usize, 0);
            match d.read(vm, job.offset, &mut reply[16..]) {
                Ok(()) => s.send(&reply),
                Err(e) => {
                    tracing::error!(%e, vdisk = %vdisk_name(d, vm), "read failed");
                    s.send(&simple_reply(e.nbd_errno(), job.cookie))
                }
            }
        };
        // The reader may be waiting on the socket: send now. A vanished client is noticed
        // by the reader.
        let _ = sent.and_then(|()| s.flush());
        let latency = if job.write.is_some() { &sh.write_latency } else { &sh.read_latency };
        latency.observe(job.started.elapsed().as_secs_f64());
        sh.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

fn serve_buffered<R: Read, W: Write + Send>(
    input: &mut io::BufReader<R>,
    s: &Replies<W>,
    d: &Daemon,
    export: &crate::daemon::ExportInfo,
    misses: &Misses<'_, '_, W>,
) -> io::Result<()> {
    let (vm, size, name) = (export.id, export.size, &export.name);
    let latency = ["read", "write", "flush", "write_zeroes", "trim", "other"].map(|op| d.metrics().histogram(name, op));
    let mut reply: Vec<u8> = Vec::new();
    let direct = d.direct_io();
    loop {
        if input.buffer().is_empty() {
            s.flush()?; // nothing more pipelined: send the batched replies
        }
        let mut h = [0u8; REQUEST_LEN];
        match input.read_exact(&mut h) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()), // client went away
            Err(e) => return Err(e),
        }
        let r = match decode_request(&h) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(%e, "closing connection");
                return Ok(());
            }
        };
        if !d.is_live(vm) {
            tracing::info!(export = %name, "the vDisk was removed: closing");
            s.send(&simple_reply(ESHUTDOWN, r.cookie))?;
            return Ok(());
        }
        let known_flags = CMD_FLAG_FUA | CMD_FLAG_NO_HOLE;
        let started = std::time::Instant::now();
        let hist = &latency[match r.kind {
            CMD_READ => 0,
            CMD_WRITE => 1,
            CMD_FLUSH => 2,
            CMD_WRITE_ZEROES => 3,
            CMD_TRIM => 4,
            _ => 5,
        }];
        let error = |e: u32| simple_reply(e, r.cookie);
        match r.kind {
            CMD_READ => {
                if let Err(e) =
                    check_range(&r, size).and(if r.flags & !known_flags != 0 { Err(EINVAL) } else { Ok(()) })
                {
                    s.send(&error(e))?;
                    continue;
                }
                // With O_DIRECT every read waits on a device: while others are in flight or
                // pipelined behind it, it goes to the read threads; alone, it is served here
                // (a hand-over would only add latency).
                let busy = misses.shared.in_flight.load(Ordering::Acquire) > 0 || !input.buffer().is_empty();
                if direct && busy {
                    misses.submit(MissJob::read(&r, started));
                    continue;
                }
                reply.clear();
                reply.extend_from_slice(&simple_reply(0, r.cookie));
                reply.resize(16 + r.length as usize, 0);
                let done = if direct {
                    Some(d.read(vm, r.offset, &mut reply[16..]))
                } else {
                    d.read_if_cached(vm, r.offset, &mut reply[16..])
                };
                match done {
                    Some(Ok(())) => s.send(&reply)?,
                    Some(Err(e)) => {
                        tracing::error!(%e, vdisk = %vdisk_name(d, vm), "read failed");
                        s.send(&error(e.nbd_errno()))?;
                    }
                    None => {
                        // Waits on the backing store: answered by a miss thread.
                        misses.submit(MissJob::read(&r, started));
                        continue;
                    }
                }
            }
            CMD_WRITE => {
                if r.length > MAX_PAYLOAD {
                    tracing::warn!(length = r.length, "write payload over the limit: closing");
                    s.send(&error(EOVERFLOW))?;
                    return Ok(());
                }
                let mut data = vec![0u8; r.length as usize];
                input.read_exact(&mut data)?;
                let res = check_range(&r, size).and(if r.flags & !known_flags != 0 { Err(EINVAL) } else { Ok(()) });
                if res.is_ok() && d.writes_wait_on_backing(vm) {
                    // Answered once on the backing store, by a read thread.
                    misses.submit(MissJob {
                        cookie: r.cookie,
                        offset: r.offset,
                        length: r.length,
                        started,
                        write: Some((data, r.flags & CMD_FLAG_FUA != 0)),
                    });
                    continue;
                }
                let e = match res {
                    Err(e) => e,
                    Ok(()) => d.write(vm, r.offset, &data, r.flags & CMD_FLAG_FUA != 0).map_or_else(
                        |e| {
                            tracing::error!(%e, vdisk = %vdisk_name(d, vm), "write failed");
                            e.nbd_errno()
                        },
                        |()| 0,
                    ),
                };
                s.send(&error(e))?;
            }
            CMD_WRITE_ZEROES => {
                let e = match check_range(&r, size) {
                    Err(e) => e,
                    Ok(()) => {
                        let zeros = vec![0u8; ZERO_CHUNK.min(r.length as usize)];
                        let mut at = 0u64;
                        let mut e = 0;
                        while at < r.length as u64 {
                            let n = (r.length as u64 - at).min(ZERO_CHUNK as u64) as usize;
                            if let Err(err) = d.write(vm, r.offset + at, &zeros[..n], false) {
                                tracing::error!(%err, vdisk = %vdisk_name(d, vm), "write-zeroes failed");
                                e = err.nbd_errno();
                                break;
                            }
                            at += n as u64;
                        }
                        if e == 0 && r.flags & CMD_FLAG_FUA != 0 {
                            if let Err(err) = d.flush(vm) {
                                e = err.nbd_errno();
                            }
                        }
                        e
                    }
                };
                s.send(&error(e))?;
            }
            CMD_TRIM => {
                let e = match check_range(&r, size).and({
                    if r.flags & !CMD_FLAG_FUA != 0 {
                        Err(EINVAL)
                    } else {
                        Ok(())
                    }
                }) {
                    Err(e) => e,
                    Ok(()) => match d.trim(vm, r.offset, r.length as u64).and_then(|()| {
                        if r.flags & CMD_FLAG_FUA != 0 {
                            d.flush(vm)
                        } else {
                            Ok(())
                        }
                    }) {
                        Ok(()) => 0,
                        Err(e) => {
                            tracing::error!(%e, vdisk = %vdisk_name(d, vm), "trim failed");
                            e.nbd_errno()
                        }
                    },
                };
                s.send(&error(e))?;
            }
            CMD_FLUSH => {
                let e = d.flush(vm).map_or_else(
                    |e| {
                        tracing::error!(%e, vdisk = %vdisk_name(d, vm), "flush failed");
                        e.nbd_errno()
                    },
                    |()| 0,
                );
                s.send(&error(e))?;
            }
            CMD_DISC => return Ok(()),
            _ => s.send(&error(EINVAL))?,
        }
        hist.observe(started.elapsed().as_secs_f64());
    }
}

/// The export name of `vm`, for log lines.
fn vdisk_name(d: &Daemon, vm: u32) -> String {
    d.export(vm).map_or_else(|| format!("#{vm}"), |e| e.name)
}
