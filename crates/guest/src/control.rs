//! The guest's end of a vSSD's control channel (`cachevisor_vssd::protocol`): a unix
//! socket on the host, or the virtio-serial port QEMU carries it to inside a guest
//! (`/dev/virtio-ports/NAME`). A reader thread splits the host's lines into replies (to
//! the request waiting for one) and notices (queued until the driver takes them).

use cachevisor_vssd::protocol::{HostLine, Notice, Reply, Request};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How long a request waits for its reply.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// A connected control channel.
pub struct Control {
    out: Box<dyn Write + Send>,
    lines: Receiver<io::Result<HostLine>>,
    notices: std::collections::VecDeque<Notice>,
}

impl Control {
    /// Connects to `path`: a unix socket (the daemon's), or a character device or file
    /// (a virtio-serial port in a guest).
    pub fn open(path: &Path) -> io::Result<Control> {
        use std::os::unix::fs::FileTypeExt;
        let named = |e: io::Error| io::Error::new(e.kind(), format!("vSSD control channel {}: {e}", path.display()));
        let kind = std::fs::metadata(path).map_err(named)?.file_type();
        if kind.is_socket() {
            let s = UnixStream::connect(path).map_err(named)?;
            let r = s.try_clone().map_err(named)?;
            Ok(Control::over(r, s))
        } else {
            let f = std::fs::OpenOptions::new().read(true).write(true).open(path).map_err(named)?;
            let r = f.try_clone().map_err(named)?;
            Ok(Control::over(r, f))
        }
    }

    /// A channel over a reading and a writing half.
    pub fn over(reader: impl io::Read + Send + 'static, writer: impl Write + Send + 'static) -> Control {
        let (tx, rx) = channel();
        std::thread::Builder::new()
            .name("cv-guest-control".into())
            .spawn(move || {
                let mut r = BufReader::new(reader);
                let mut line = String::new();
                loop {
                    line.clear();
                    let got = match r.read_line(&mut line) {
                        Ok(0) => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the host closed the channel")),
                        Ok(_) => serde_json::from_str::<HostLine>(line.trim()).map_err(|e| {
                            io::Error::new(
                                io::ErrorKind::InvalidData,
                                format!("not a host line ({e}): {}", line.trim()),
                            )
                        }),
                        Err(e) => Err(e),
                    };
                    let end = got.is_err();
                    if tx.send(got).is_err() || end {
                        return;
                    }
                }
            })
            .expect("a thread");
        Control { out: Box::new(writer), lines: rx, notices: Default::default() }
    }

    /// Sends `req` and waits for its reply (notices that come first are queued).
    pub fn request(&mut self, req: &Request) -> io::Result<Reply> {
        let mut line = serde_json::to_string(req).expect("a request serializes");
        line.push('\n');
        self.out.write_all(line.as_bytes())?;
        self.out.flush()?;
        let until = Instant::now() + REPLY_TIMEOUT;
        loop {
            let wait = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(wait) {
                Ok(Ok(HostLine::Reply(r))) => return Ok(r),
                Ok(Ok(HostLine::Notice(n))) => self.notices.push_back(n),
                Ok(Err(e)) => return Err(e),
                Err(RecvTimeoutError::Timeout) => {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "no reply from the host in 30 s"))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the control channel is closed"))
                }
            }
        }
    }

    /// The next notice, waiting up to `wait` for one (`Ok(None)`: none came).
    pub fn notice(&mut self, wait: Duration) -> io::Result<Option<Notice>> {
        if let Some(n) = self.notices.pop_front() {
            return Ok(Some(n));
        }
        match self.lines.recv_timeout(wait) {
            Ok(Ok(HostLine::Notice(n))) => Ok(Some(n)),
            Ok(Ok(HostLine::Reply(r))) => {
                Err(io::Error::new(io::ErrorKind::InvalidData, format!("a reply nobody asked for: {r:?}")))
            }
            Ok(Err(e)) => Err(e),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => {
                Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the control channel is closed"))
            }
        }
    }
}
