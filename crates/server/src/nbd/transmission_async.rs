//! NBD transmission (proto.md "Transmission") on the data path's asynchronous API
//! (`datapath.rs`): the connection's reader thread decodes requests and submits them;
//! each reply is written by whichever data-path thread completes the request, in
//! completion order (NBD matches replies by cookie), so no thread per request waits. A
//! disconnect (or the client closing) waits for every reply in flight. TRIM is not served
//! by the engine's asynchronous face yet: it is answered ENOTSUP, and a server using this
//! loop advertises [`TRANSMISSION_FLAGS`] (no TRIM) in its handshake.
//!
//! This is the NBD face the daemon moves to (issue 12, part 2); until then it serves a
//! `DataPath` in tests and benches.

use super::proto::*;
use crate::datapath::{copy_range, DataPath};
use cachevisor_engine::Failure;
use std::io::{self, Read, Write};
use std::sync::{Arc, Condvar, Mutex};

/// Transmission flags of an export served by this loop: flush, FUA, write-zeroes and
/// multi-conn, not TRIM.
pub const TRANSMISSION_FLAGS: u16 = super::handshake::TRANSMISSION_FLAGS & !TFLAG_SEND_TRIM;

/// One export, "vm0" (VM id 0) of `size` bytes with the cache's block size, as served
/// by this loop (no TRIM): the handshake's view of a data path with one vDisk.
pub struct SingleExport {
    /// Export size in bytes.
    pub size: u64,
    /// The cache's block size.
    pub block_size: u64,
}

impl super::handshake::Exports for SingleExport {
    fn exports(&self) -> Vec<crate::daemon::ExportInfo> {
        vec![crate::daemon::ExportInfo { id: 0, name: "vm0".into(), size: self.size }]
    }
    fn block_size(&self) -> u64 {
        self.block_size
    }
    fn transmission_flags(&self) -> u16 {
        TRANSMISSION_FLAGS
    }
}

/// The errno a failure is reported with.
fn errno(f: Failure) -> u32 {
    match f {
        Failure::NoSpace => ENOSPC,
        Failure::Io => EIO,
    }
}

/// Replies in flight and the connection's writer.
struct Conn<W> {
    out: Mutex<W>,
    in_flight: Mutex<usize>,
    drained: Condvar,
}

impl<W: Write> Conn<W> {
    fn reply(&self, error: u32, cookie: u64, data: Option<&[u8]>) {
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        // A client that went away cannot be answered; the reader sees the close.
        let _ = out.write_all(&simple_reply(error, cookie));
        if let Some(d) = data.filter(|_| error == 0) {
            let _ = out.write_all(d);
        }
        let _ = out.flush();
        drop(out);
        self.end();
    }

    /// A request ended (answered, or not answered by the protocol: DISC).
    fn end(&self) {
        let mut n = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        *n -= 1;
        if *n == 0 {
            self.drained.notify_all();
        }
    }

    fn begin(&self) {
        *self.in_flight.lock().unwrap_or_else(|p| p.into_inner()) += 1;
    }

    fn drain(&self) {
        let mut n = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        while *n > 0 {
            n = self.drained.wait(n).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Serves export `vm` of `size` bytes from `dp` until the client disconnects.
pub fn serve<R: Read, W: Write + Send + 'static>(
    input: R,
    output: W,
    dp: &Arc<DataPath>,
    vm: u32,
    size: u64,
) -> io::Result<()> {
    let mut r = io::BufReader::with_capacity(1 << 18, input);
    let conn = Arc::new(Conn { out: Mutex::new(output), in_flight: Mutex::new(0), drained: Condvar::new() });
    let res = (|| -> io::Result<()> {
        loop {
            let mut h = [0u8; REQUEST_LEN];
            match r.read_exact(&mut h) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
            let req = decode_request(&h).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            let mut payload = Vec::new();
            if req.kind == CMD_WRITE {
                if req.length > MAX_PAYLOAD {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "write payload over the limit"));
                }
                payload = vec![0u8; req.length as usize];
                r.read_exact(&mut payload)?;
            }
            conn.begin();
            if let Err(e) = check_range(&req, size) {
                conn.reply(e, req.cookie, None);
                continue;
            }
            let (c, cookie, fua) = (conn.clone(), req.cookie, req.flags & CMD_FLAG_FUA != 0);
            match req.kind {
                CMD_READ => {
                    let (offset, len) = (req.offset, req.length);
                    dp.submit(
                        vm,
                        offset,
                        len,
                        None,
                        false,
                        Box::new(move |res| match res {
                            Ok(parts) => {
                                let mut buf = vec![0u8; len as usize];
                                copy_range(&parts, offset, &mut buf);
                                c.reply(0, cookie, Some(&buf));
                            }
                            Err(f) => c.reply(errno(f), cookie, None),
                        }),
                    );
                }
                CMD_WRITE_ZEROES => {
                    // Zeroes in 1 MiB writes, waited for here (rare, and of any length).
                    let chunk = vec![0u8; 1 << 20];
                    let mut at = req.offset;
                    let end = req.offset + req.length as u64;
                    let mut result = Ok(());
                    while at < end && result.is_ok() {
                        let n = (end - at).min(chunk.len() as u64) as usize;
                        result = dp.write(vm, at, &chunk[..n], false);
                        at += n as u64;
                    }
                    if result.is_ok() && fua {
                        result = dp.flush();
                    }
                    conn.reply(result.map_or_else(errno, |()| 0), cookie, None);
                }
                CMD_WRITE => {
                    let data = payload;
                    let dp2 = dp.clone();
                    dp.submit(
                        vm,
                        req.offset,
                        0,
                        Some(data),
                        false,
                        Box::new(move |res| match (res, fua) {
                            (Ok(_), true) => {
                                // FUA: durable before the reply (a flush after the write).
                                dp2.submit(
                                    vm,
                                    0,
                                    0,
                                    None,
                                    true,
                                    Box::new(move |r| c.reply(r.map_or_else(errno, |_| 0), cookie, None)),
                                );
                            }
                            (Ok(_), false) => c.reply(0, cookie, None),
                            (Err(f), _) => c.reply(errno(f), cookie, None),
                        }),
                    );
                }
                CMD_FLUSH => dp.submit(
                    vm,
                    0,
                    0,
                    None,
                    true,
                    Box::new(move |r| c.reply(r.map_or_else(errno, |_| 0), cookie, None)),
                ),
                CMD_DISC => {
                    conn.end(); // not answered (the protocol's rule)
                    return Ok(());
                }
                _ => conn.reply(ENOTSUP, req.cookie, None),
            }
            // No further request buffered: run the queued ops here rather than hand them
            // to a device thread (at iodepth 1 the request never changes threads).
            if r.buffer().is_empty() {
                dp.run_queued();
            }
        }
    })();
    conn.drain();
    res
}
