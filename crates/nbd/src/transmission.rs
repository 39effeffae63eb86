//! NBD transmission (proto.md "Transmission") on the data path's asynchronous API
//! (`datapath.rs`): the connection's reader thread decodes requests and submits them;
//! each reply is written by whichever data-path thread completes the request, in
//! completion order (NBD matches replies by cookie), so no thread per request waits.
//!
//! A request past the export's end, or with flags the command does not take, gets EINVAL;
//! an unknown command EINVAL; a device failure EIO (ENOSPC when a device is full); a
//! request to a vDisk removed meanwhile ESHUTDOWN, and the connection closes. A bad magic
//! or an oversized WRITE payload (the stream cannot be resynchronized) closes the
//! connection (EOVERFLOW first for the payload). TRIM drops the range from the cache and
//! hints the backing store. CACHE queues a hint for the background loader and is answered
//! at once; BLOCK_STATUS answers `base:allocation` from the backing store's holes and the
//! cache's dirty blocks (the data path's `allocation.rs`). With structured replies, a READ is one
//! final OFFSET_DATA chunk and a failed READ or BLOCK_STATUS an ERROR chunk; the other
//! commands keep simple replies, as qemu-nbd does. Nothing is changed by a request that
//! is refused. Every reply in flight is sent before a connection closes.

use super::backend::{copy_range, Bytes, ClientError, Cmd, Done, ExportBackend};
use super::handshake::Replies;
use super::proto::*;
use super::structured::{block_status_chunk, error_chunk, read_data_header, BASE_ALLOCATION_ID};
use prometheus_client::metrics::histogram::Histogram;
use std::io::{self, Read, Write};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// One export, "vm0" (VM id 0) of `size` bytes with the cache's block size: the
/// handshake's view of a bare data path with one vDisk (tests and benches).
pub struct SingleExport {
    /// Export size in bytes.
    pub size: u64,
    /// The cache's block size.
    pub block_size: u64,
}

impl super::handshake::Exports for SingleExport {
    fn exports(&self) -> Vec<crate::backend::ExportInfo> {
        vec![crate::backend::ExportInfo { id: 0, name: "vm0".into(), size: self.size, ..Default::default() }]
    }
    fn block_size(&self) -> u64 {
        self.block_size
    }
}

/// Latency histograms by command: read, write, flush, write_zeroes, trim, other.
pub type Latency = [Histogram; 6];

/// Replies in flight and the connection's writer.
struct Conn<W> {
    out: Mutex<W>,
    /// Requests not yet answered, and whether [`Conn::drain`] waits for them (a condvar
    /// notify is a syscall even with no waiter: at iodepth 1 it was one per request).
    in_flight: Mutex<(usize, bool)>,
    drained: Condvar,
    latency: Option<Latency>,
}

impl<W: Write> Conn<W> {
    /// Sends a reply without data and observes its latency.
    fn reply(&self, error: u32, cookie: u64, timing: (usize, Instant)) {
        self.send(&simple_reply(error, cookie), timing);
    }

    /// Sends a whole reply message (header and data in one write) and observes its
    /// latency.
    fn send(&self, msg: &[u8], timing: (usize, Instant)) {
        self.send_slices(&mut [io::IoSlice::new(msg)], timing);
    }

    /// Sends a reply made of several pieces (a read's header and the buffers its data is
    /// in: no copy into one message) and observes its latency.
    fn send_slices(&self, mut slices: &mut [io::IoSlice<'_>], timing: (usize, Instant)) {
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        // A client that went away cannot be answered; the reader sees the close.
        while !slices.is_empty() {
            match out.write_vectored(slices) {
                Ok(0) | Err(_) => break,
                Ok(n) => io::IoSlice::advance_slices(&mut slices, n),
            }
        }
        let _ = out.flush();
        drop(out);
        if let Some(l) = &self.latency {
            l[timing.0].observe(timing.1.elapsed().as_secs_f64());
        }
        self.end();
    }

    /// A request ended (answered, or not answered by the protocol: DISC).
    fn end(&self) {
        let mut n = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        n.0 -= 1;
        if n.0 == 0 && n.1 {
            self.drained.notify_all();
        }
    }

    fn begin(&self) {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).0 += 1;
    }

    fn drain(&self) {
        let mut n = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        n.1 = true;
        while n.0 > 0 {
            n = self.drained.wait(n).unwrap_or_else(|p| p.into_inner());
        }
        n.1 = false;
    }
}

/// The pieces of `parts` (a read's reply buffers, in completion order) that make up
/// `len` bytes at `offset`, in disk order; `None` if they leave a gap.
fn in_order(parts: &[Bytes], offset: u64, len: u64) -> Option<Vec<&[u8]>> {
    let mut sorted: Vec<&Bytes> = parts.iter().collect();
    sorted.sort_by_key(|(_, base)| *base);
    let (mut at, end) = (offset, offset + len);
    let mut pieces = Vec::with_capacity(sorted.len());
    for (bytes, base) in sorted {
        let stop = (base + bytes.len() as u64).min(end);
        if stop <= at {
            continue; // wholly before what is still needed
        }
        if *base > at {
            return None;
        }
        pieces.push(&bytes[(at - base) as usize..(stop - base) as usize]);
        at = stop;
    }
    (at >= end).then_some(pieces)
}

/// The histogram index of a command.
fn slot_of(kind: u16) -> usize {
    match kind {
        CMD_READ => 0,
        CMD_WRITE => 1,
        CMD_FLUSH => 2,
        CMD_WRITE_ZEROES => 3,
        CMD_TRIM => 4,
        _ => 5,
    }
}

/// Serves an export of `size` bytes from `dp` (a vDisk or a vSSD) with the replies
/// negotiated until the client disconnects, observing request latencies in `latency`
/// when given.
pub fn serve<R: Read, W: Write + Send + 'static>(
    input: R,
    output: W,
    dp: Arc<dyn ExportBackend>,
    (size, replies): (u64, Replies),
    latency: Option<Latency>,
) -> io::Result<()> {
    let mut r = io::BufReader::with_capacity(1 << 18, input);
    let direct = dp.direct();
    let conn =
        Arc::new(Conn { out: Mutex::new(output), in_flight: Mutex::new((0, false)), drained: Condvar::new(), latency });
    let res = (|| -> io::Result<()> {
        loop {
            let mut h = [0u8; REQUEST_LEN];
            match r.read_exact(&mut h) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
            let req = match decode_request(&h) {
                Ok(req) => req,
                Err(e) => {
                    tracing::warn!(%e, "closing connection");
                    return Ok(());
                }
            };
            let timing = (slot_of(req.kind), Instant::now());
            let mut payload = Vec::new();
            if req.kind == CMD_WRITE {
                if req.length > MAX_PAYLOAD {
                    tracing::warn!(length = req.length, "write payload over the limit: closing");
                    conn.begin();
                    conn.reply(EOVERFLOW, req.cookie, timing);
                    return Ok(());
                }
                payload = vec![0u8; req.length as usize];
                r.read_exact(&mut payload)?;
            }
            conn.begin();
            if req.kind == CMD_DISC {
                conn.end(); // not answered (the protocol's rule)
                return Ok(());
            }
            // READ and BLOCK_STATUS fail with an ERROR chunk once replies are structured.
            let chunked = replies.structured && matches!(req.kind, CMD_READ | CMD_BLOCK_STATUS);
            let fail = move |c: &Conn<W>, e: u32, cookie: u64, why: &str| {
                if chunked {
                    c.send(&error_chunk(cookie, e, why), timing)
                } else {
                    c.reply(e, cookie, timing)
                }
            };
            if !dp.serves() {
                tracing::info!("the export is no longer served: closing");
                fail(&conn, ESHUTDOWN, req.cookie, "the export was removed or stopped");
                return Ok(());
            }
            let allowed = match req.kind {
                CMD_READ if replies.structured => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_DF,
                CMD_READ | CMD_WRITE => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE,
                CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE,
                CMD_TRIM => CMD_FLAG_FUA,
                CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
                _ => 0,
            };
            let known = matches!(req.kind, CMD_READ | CMD_WRITE | CMD_WRITE_ZEROES | CMD_TRIM | CMD_FLUSH | CMD_CACHE)
                || (req.kind == CMD_BLOCK_STATUS && replies.allocation);
            let range = if req.kind == CMD_FLUSH { Ok(()) } else { check_range(&req, size) };
            if let Err(e) = range.and(if !known || req.flags & !allowed != 0 { Err(EINVAL) } else { Ok(()) }) {
                fail(
                    &conn,
                    e,
                    req.cookie,
                    if known {
                        "request past the export's end or with a flag it does not take"
                    } else {
                        "unknown command (BLOCK_STATUS needs base:allocation)"
                    },
                );
                continue;
            }
            let (c, cookie, fua) = (conn.clone(), req.cookie, req.flags & CMD_FLAG_FUA != 0);
            // This thread runs the request's cache-store ops itself when that costs less
            // than a hand-off: always through the page cache; with O_DIRECT (real device
            // waits) only when no further request is buffered (iodepth 1).
            let here = !direct || r.buffer().is_empty();
            // FUA: durable before the reply (a flush after the command).
            let then_flush = move |dp: Arc<dyn ExportBackend>, c: Arc<Conn<W>>| -> Done {
                Box::new(move |res| match (res, fua) {
                    (Ok(_), true) => {
                        dp.clone().submit(
                            0,
                            Cmd::Flush,
                            false,
                            Box::new(move |r| c.reply(r.map_or_else(ClientError::errno, |_| 0), cookie, timing)),
                        );
                    }
                    (Ok(_), false) => c.reply(0, cookie, timing),
                    (Err(f), _) => c.reply(f.errno(), cookie, timing),
                })
            };
            match req.kind {
                CMD_READ => {
                    let (offset, len) = (req.offset, req.length);
                    let done = Box::new(move |res: Result<Vec<Bytes>, ClientError>| match res {
                        Ok(parts) => {
                            // One final OFFSET_DATA chunk when structured (DF holds), else a
                            // simple reply; the data follows the header either way.
                            let (simple, chunk) = (simple_reply(0, cookie), read_data_header(cookie, offset, len));
                            let header: &[u8] = if replies.structured { &chunk } else { &simple };
                            match in_order(&parts, offset, len as u64) {
                                Some(pieces) => {
                                    let mut slices: Vec<io::IoSlice<'_>> =
                                        std::iter::once(header).chain(pieces).map(io::IoSlice::new).collect();
                                    c.send_slices(&mut slices, timing);
                                }
                                None => {
                                    let mut msg = vec![0u8; header.len() + len as usize];
                                    msg[..header.len()].copy_from_slice(header);
                                    copy_range(&parts, offset, &mut msg[header.len()..]);
                                    c.send(&msg, timing);
                                }
                            }
                        }
                        Err(f) => fail(&c, f.errno(), cookie, "the read failed"),
                    });
                    dp.submit(offset, Cmd::Read(len), here, done);
                }
                CMD_WRITE if fua => {
                    dp.submit_fua_write(req.offset, payload, here, then_flush(dp.clone(), c));
                }
                CMD_WRITE => {
                    dp.submit(req.offset, Cmd::Write(payload), here, then_flush(dp.clone(), c));
                }
                CMD_TRIM => {
                    dp.submit(req.offset, Cmd::Discard(req.length), false, then_flush(dp.clone(), c));
                }
                CMD_CACHE => {
                    // A hint, queued for the background loader: answered at once, so it
                    // never delays the requests behind it.
                    dp.hint_cache(req.offset, req.length as u64);
                    conn.reply(0, cookie, timing);
                }
                CMD_BLOCK_STATUS => {
                    let one = req.flags & CMD_FLAG_REQ_ONE != 0;
                    match dp.allocation(req.offset, req.length, one) {
                        Ok(extents) => conn.send(&block_status_chunk(cookie, BASE_ALLOCATION_ID, &extents), timing),
                        Err(e) => fail(&conn, EIO, cookie, &format!("block status: {e}")),
                    }
                }
                CMD_FLUSH => {
                    dp.submit(
                        0,
                        Cmd::Flush,
                        false,
                        Box::new(move |r| c.reply(r.map_or_else(ClientError::errno, |_| 0), cookie, timing)),
                    );
                }
                _ => {
                    // WRITE_ZEROES: zeroes in 1 MiB writes, waited for here (rare, any length).
                    let chunk = vec![0u8; (1 << 20).min(req.length as usize)];
                    let mut at = req.offset;
                    let end = req.offset + req.length as u64;
                    let mut result = Ok(());
                    while at < end && result.is_ok() {
                        let n = (end - at).min(chunk.len() as u64) as usize;
                        result = dp.write_now(at, &chunk[..n]);
                        at += n as u64;
                    }
                    if result.is_ok() && fua {
                        result = dp.flush_now();
                    }
                    conn.reply(result.map_or_else(ClientError::errno, |()| 0), cookie, timing);
                }
            }
        }
    })();
    conn.drain();
    res
}

#[cfg(test)]
mod tests {
    use super::in_order;

    #[test]
    fn reply_pieces_come_in_disk_order_and_a_gap_falls_back_to_a_copy() {
        let part = |base: u64, len: usize, byte: u8| (bytes::Bytes::from(vec![byte; len]), base);
        // Completion order 8192, 0, 4096; the request is 1024..12000.
        let parts = vec![part(8192, 4096, 3), part(0, 4096, 1), part(4096, 4096, 2)];
        let pieces = in_order(&parts, 1024, 12000 - 1024).unwrap();
        let joined: Vec<u8> = pieces.concat();
        assert_eq!(joined.len(), 12000 - 1024);
        assert!(joined[..3072].iter().all(|&b| b == 1) && joined[3072..7168].iter().all(|&b| b == 2));
        assert!(joined[7168..].iter().all(|&b| b == 3));
        // A coalesced run's buffer shared by two blocks, and a part wholly before the range.
        let parts = vec![part(0, 512, 9), part(4096, 8192, 5)];
        assert_eq!(in_order(&parts, 4096, 8192).unwrap().concat(), vec![5; 8192]);
        // A gap: no pieces (the caller copies with `copy_range`, which leaves zeroes).
        let parts = vec![part(0, 4096, 1), part(8192, 4096, 3)];
        assert!(in_order(&parts, 0, 12288).is_none());
        assert!(in_order(&parts, 0, 4096).is_some());
    }
}
