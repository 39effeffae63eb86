//! The transmission phase (NBD proto.md "Transmission"): requests are read, checked and
//! executed one at a time per connection, each answered with a simple reply. A request
//! past the export's end or of an unknown type gets EINVAL, a device failure EIO; a bad
//! magic or an oversized WRITE payload (the stream cannot be resynchronized) closes the
//! connection. TRIM drops the range from the cache and hints the backing store. A request to
//! a vDisk removed meanwhile gets ESHUTDOWN and the connection closes. Nothing is changed by a request that is refused.

use super::proto::*;
use crate::daemon::Daemon;
use std::io::{self, Read, Write};

/// Bytes zeroed per engine call by WRITE_ZEROES.
const ZERO_CHUNK: usize = 1 << 20;

/// Serves requests for export `vm` until the client disconnects. Requests are read
/// through a buffer and replies batched until no further request is already buffered, so
/// a pipelining client (iodepth > 1) costs few system calls per request.
pub fn serve<R: Read, W: Write>(input: R, output: W, d: &Daemon, vm: u32) -> io::Result<()> {
    let mut r = io::BufReader::with_capacity(1 << 18, input);
    let mut s = io::BufWriter::with_capacity(1 << 18, output);
    let res = serve_buffered(&mut r, &mut s, d, vm);
    let _ = s.flush();
    res
}

fn serve_buffered<R: Read, W: Write>(input: &mut io::BufReader<R>, s: &mut W, d: &Daemon, vm: u32) -> io::Result<()> {
    let Some(export) = d.export(vm) else { return Ok(()) }; // removed meanwhile
    let (size, name) = (export.size, &export.name);
    let latency = ["read", "write", "flush", "write_zeroes", "trim", "other"].map(|op| d.metrics().histogram(name, op));
    let mut reply: Vec<u8> = Vec::new();
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
            s.write_all(&simple_reply(ESHUTDOWN, r.cookie))?;
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
                if let Err(e) = check_range(&r, size).and_then(|()| if r.flags & !known_flags != 0 { Err(EINVAL) } else { Ok(()) }) {
                    s.write_all(&error(e))?;
                    continue;
                }
                reply.clear();
                reply.extend_from_slice(&simple_reply(0, r.cookie));
                reply.resize(16 + r.length as usize, 0);
                match d.read(vm, r.offset, &mut reply[16..]) {
                    Ok(()) => s.write_all(&reply)?,
                    Err(e) => {
                        tracing::error!(%e, "read failed");
                        s.write_all(&error(EIO))?;
                    }
                }
            }
            CMD_WRITE => {
                if r.length > MAX_PAYLOAD {
                    tracing::warn!(length = r.length, "write payload over the limit: closing");
                    s.write_all(&error(EOVERFLOW))?;
                    return Ok(());
                }
                let mut data = vec![0u8; r.length as usize];
                input.read_exact(&mut data)?;
                let res = check_range(&r, size).and_then(|()| if r.flags & !known_flags != 0 { Err(EINVAL) } else { Ok(()) });
                let e = match res {
                    Err(e) => e,
                    Ok(()) => d.write(vm, r.offset, &data, r.flags & CMD_FLAG_FUA != 0).map_or_else(
                        |e| {
                            tracing::error!(%e, "write failed");
                            EIO
                        },
                        |()| 0,
                    ),
                };
                s.write_all(&error(e))?;
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
                                tracing::error!(%err, "write-zeroes failed");
                                e = EIO;
                                break;
                            }
                            at += n as u64;
                        }
                        if e == 0 && r.flags & CMD_FLAG_FUA != 0 && d.flush(vm).is_err() {
                            e = EIO;
                        }
                        e
                    }
                };
                s.write_all(&error(e))?;
            }
            CMD_TRIM => {
                let e = match check_range(&r, size).and_then(|()| if r.flags & !CMD_FLAG_FUA != 0 { Err(EINVAL) } else { Ok(()) }) {
                    Err(e) => e,
                    Ok(()) => match d.trim(vm, r.offset, r.length as u64).and_then(|()| if r.flags & CMD_FLAG_FUA != 0 { d.flush(vm) } else { Ok(()) }) {
                        Ok(()) => 0,
                        Err(e) => {
                            tracing::error!(%e, "trim failed");
                            EIO
                        }
                    },
                };
                s.write_all(&error(e))?;
            }
            CMD_FLUSH => {
                let e = d.flush(vm).map_or_else(
                    |e| {
                        tracing::error!(%e, "flush failed");
                        EIO
                    },
                    |()| 0,
                );
                s.write_all(&error(e))?;
            }
            CMD_DISC => return Ok(()),
            _ => s.write_all(&error(EINVAL))?,
        }
        hist.observe(started.elapsed().as_secs_f64());
    }
}
