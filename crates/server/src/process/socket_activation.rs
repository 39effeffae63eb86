//! Listening sockets systemd hands over (socket activation: `LISTEN_FDS`, `LISTEN_PID`,
//! `LISTEN_FDNAMES`; `dist/cachevisor.socket` and `dist/cachevisor-api.socket`), as
//! nbdkit and qemu-storage-daemon take them: the sockets exist before the daemon starts,
//! so a VM can connect at once — its connection waits in the socket's backlog and is
//! served once recovery finished and the daemon accepts.
//!
//! Each passed socket's name (`FileDescriptorName=`) says what it is: `nbd` (a TCP or a
//! unix stream socket: the NBD listeners, in place of `listen.tcp` / `listen.unix`) or
//! `api` (a TCP socket: the HTTP API, in place of `api.listen`; the `[api]` section is
//! still needed for its settings). A socket unit's own name stands for its socket's when
//! `FileDescriptorName=` is not set: `cachevisor.socket` is NBD, `cachevisor-api.socket`
//! the API. Taking the descriptors
//! is the `listenfd` crate's (it checks each is a listening socket of the asked kind;
//! wrapping a raw descriptor needs `unsafe`, which this workspace forbids).

use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;

/// The listeners systemd passed.
#[derive(Debug, Default)]
pub(crate) struct Inherited {
    /// The NBD TCP listener.
    pub nbd_tcp: Option<TcpListener>,
    /// The NBD unix listener and its path.
    pub nbd_unix: Option<(UnixListener, PathBuf)>,
    /// The API's TCP listener.
    pub api: Option<TcpListener>,
}

impl Inherited {
    /// Whether systemd passed any NBD listener (then the config's are not bound).
    pub(crate) fn has_nbd(&self) -> bool {
        self.nbd_tcp.is_some() || self.nbd_unix.is_some()
    }
}

/// Takes the sockets passed to this process, if any (none when `LISTEN_PID` names
/// another process). Errors name the descriptor and why it cannot be used.
pub(crate) fn take() -> Result<Inherited, String> {
    let names: Vec<String> =
        std::env::var("LISTEN_FDNAMES").map(|n| n.split(':').map(str::to_string).collect()).unwrap_or_default();
    take_from(listenfd::ListenFd::from_env(), &names)
}

fn take_from(mut fds: listenfd::ListenFd, names: &[String]) -> Result<Inherited, String> {
    let mut got = Inherited::default();
    for i in 0..fds.len() {
        let name = names.get(i).map_or("nbd", String::as_str);
        let what = format!("socket activation: descriptor {} (`{name}`)", 3 + i);
        match name {
            "api" | "cachevisor-api.socket" => {
                let l = fds.take_tcp_listener(i).map_err(|e| format!("{what}: not a TCP listening socket: {e}"))?;
                if got.api.replace(l.expect("not taken before")).is_some() {
                    return Err(format!("{what}: a second API socket"));
                }
            }
            "nbd" | "cachevisor.socket" | "unknown" | "" => match fds.take_tcp_listener(i) {
                Ok(l) => {
                    if got.nbd_tcp.replace(l.expect("not taken before")).is_some() {
                        return Err(format!("{what}: a second NBD TCP socket (one TCP and one unix socket at most)"));
                    }
                }
                Err(_) => {
                    let l = fds
                        .take_unix_listener(i)
                        .map_err(|e| format!("{what}: neither a TCP nor a unix stream listening socket: {e}"))?
                        .expect("not taken before");
                    let path = l
                        .local_addr()
                        .ok()
                        .and_then(|a| a.as_pathname().map(PathBuf::from))
                        .ok_or_else(|| format!("{what}: a unix socket with no path (an abstract socket)"))?;
                    if got.nbd_unix.replace((l, path)).is_some() {
                        return Err(format!("{what}: a second NBD unix socket"));
                    }
                }
            },
            other => {
                return Err(format!("{what}: unknown name `{other}` (FileDescriptorName= must be `nbd` or `api`)"));
            }
        }
    }
    Ok(got)
}
