//! Helpers for tests that drive the daemon as a real process: start `cachevisor serve`
//! from a config file and read the addresses it prints (or the error it exits with), kill
//! it with SIGKILL or stop it with SIGTERM, talk to it with qemu-io, and run it inside a
//! private mount namespace with a small tmpfs (a file system that can be filled up), which
//! works as root and, through a user namespace, without it.

use crate::netns;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The `cachevisor` binary under test.
pub fn bin() -> &'static str {
    crate::bins::cachevisor()
}

/// A running daemon process (SIGKILLed when dropped).
pub struct Daemon {
    pub child: Option<Child>,
    pub pid: u32,
    /// NBD TCP address (empty when it listens on a unix socket only).
    pub nbd: String,
    /// HTTP API address, when the config has one.
    pub api: Option<String>,
    /// What it printed before serving (the warm-start line among them).
    pub banner: Vec<String>,
    /// Its stderr (the log), as a file.
    pub log: PathBuf,
}

/// A start that failed: the exit status and what it printed.
#[derive(Debug)]
pub struct Failed {
    pub status: Option<ExitStatus>,
    pub output: String,
}

/// Reads the banner from `lines` until the NBD URIs (and the API line when `api` is
/// expected) are out; `None` when the stream ends first.
fn read_banner(
    lines: &mut dyn Iterator<Item = String>,
    want_api: bool,
) -> Option<(String, Option<String>, Vec<String>)> {
    let (mut nbd, mut api, mut banner) = (None, None, Vec::new());
    while nbd.is_none() || (want_api && api.is_none()) {
        let l = lines.next()?;
        if let Some(rest) = l.strip_prefix("nbd://").or(l.strip_prefix("nbds://")) {
            nbd.get_or_insert_with(|| rest.split('/').next().unwrap().to_string());
        } else if l.starts_with("nbd+unix://") || l.starts_with("nbds+unix://") || l.starts_with("vhost-user-blk: ") {
            nbd.get_or_insert_with(String::new); // a unix-socket-only daemon: no TCP address
        } else if let Some(rest) = l.strip_prefix("# API: http://").or(l.strip_prefix("# API: https://")) {
            api = Some(rest.split('/').next().unwrap().to_string());
        }
        banner.push(l);
    }
    Some((nbd?, api, banner))
}

impl Daemon {
    /// Starts `cachevisor serve --config CONFIG ARGS…` in `dir`; waits until it serves, or
    /// returns how it failed.
    pub fn start(dir: &Path, config: &str, args: &[&str]) -> Result<Daemon, Failed> {
        Daemon::start_in(None, dir, config, args)
    }

    /// As [`Daemon::start`], inside network namespace `ns` when given.
    pub fn start_in(ns: Option<&str>, dir: &Path, config: &str, args: &[&str]) -> Result<Daemon, Failed> {
        let want_api = std::fs::read_to_string(dir.join(config)).unwrap().contains("[api]");
        let log = dir.join(format!(
            "{config}.{}.log",
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
        ));
        let mut cmd = match ns {
            Some(ns) => netns::Net::command(ns, bin()),
            None => Command::new(bin()),
        };
        let mut child = cmd
            .current_dir(dir)
            .args(["serve", "--config", config])
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines().map_while(Result::ok);
        match read_banner(&mut lines, want_api) {
            Some((nbd, api, banner)) => {
                std::thread::spawn(move || lines.for_each(drop)); // keep its stdout drained
                Ok(Daemon { child: Some(child), pid, nbd, api, banner, log })
            }
            None => {
                let status = wait_for(&mut child, Duration::from_secs(20));
                let output = std::fs::read_to_string(&log).unwrap_or_default();
                Err(Failed { status, output })
            }
        }
    }

    /// `nbd://ADDR/NAME`.
    pub fn uri(&self, name: &str) -> String {
        format!("nbd://{}/{name}", self.nbd)
    }

    /// SIGKILL, and waits for the process to be gone.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM; the exit status (`None`: still running after `within`).
    pub fn term(&mut self, within: Duration) -> Option<ExitStatus> {
        let mut c = self.child.take()?;
        let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
        let s = wait_for(&mut c, within);
        if s.is_none() {
            let _ = c.kill();
            let _ = c.wait();
        }
        s
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            print_log_tail("the daemon", &self.log());
        }
    }
}

/// Prints the last lines of a daemon's log to stderr (a failing test's output then says
/// what the daemon did, in CI where its files are gone).
pub fn print_log_tail(who: &str, log: &str) {
    let lines: Vec<&str> = log.lines().collect();
    let tail = &lines[lines.len().saturating_sub(80)..];
    eprintln!("--- {who}'s log, last {} of {} lines ---\n{}\n---", tail.len(), lines.len(), tail.join("\n"));
}

fn wait_for(c: &mut Child, within: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if let Ok(Some(s)) = c.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Runs qemu-io commands against `uri`; returns whether every command succeeded (exit
/// status 0, no "failed" in the output) and the output.
pub fn qemu_io(uri: &str, cmds: &[&str]) -> (bool, String) {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    let o = c.arg(uri).output().expect("qemu-io is installed (qemu-utils; scripts/test installs it)");
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    (o.status.success() && !text.contains("failed"), text)
}

/// A qemu-io client running `cmds` on `uri` (e.g. one that sleeps while the test changes
/// the daemon under it): started, not waited for ([`client_ok`] waits).
pub fn client(uri: &str, cmds: &[String]) -> Child {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for x in cmds {
        c.args(["-c", x]);
    }
    c.arg(uri).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
}

/// Waits for a [`client`]; panics with its output unless every command succeeded.
pub fn client_ok(c: Child) {
    let o = c.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && !out.contains("failed") && !out.contains("error"), "the connected client: {out}");
}

/// Like [`qemu_io`], panicking with the output when a command fails.
pub fn qemu_io_ok(uri: &str, cmds: &[&str]) {
    let (ok, out) = qemu_io(uri, cmds);
    assert!(ok, "qemu-io {cmds:?} on {uri}:\n{out}");
}

/// `cachevisor destage` against the API at `api` with the token in `token_file`.
pub fn destage(api: &str, token_file: &Path) -> (bool, String) {
    cachevisor(&["destage", "--api", api, "--token-file", token_file.to_str().unwrap()])
}

/// `cachevisor cache status --json` of the daemon whose API is `api` (its token in the
/// metadata directory `meta`), parsed; panics with the error when it fails.
pub fn cache_status_json(api: &str, meta: &Path) -> serde_json::Value {
    serde_json::from_slice(&cache_status(api, meta, true)).unwrap()
}

/// `cachevisor cache status` (what an operator reads) of the daemon whose API is `api`.
pub fn cache_status_text(api: &str, meta: &Path) -> String {
    String::from_utf8_lossy(&cache_status(api, meta, false)).into_owned()
}

fn cache_status(api: &str, meta: &Path, json: bool) -> Vec<u8> {
    let o = Command::new(bin())
        .args(["cache", "status", "--api", api, "--token-file"])
        .arg(meta.join("api-token"))
        .args(json.then_some("--json"))
        .env_remove("CACHEVISOR_API_TOKEN")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o.stdout
}

/// A loopback TCP port free right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `cachevisor ARGS…` to completion: (success, stdout + stderr).
pub fn cachevisor(args: &[&str]) -> (bool, String) {
    let o = Command::new(bin()).args(args).env_remove("CACHEVISOR_API_TOKEN").output().unwrap();
    (o.status.success(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

/// A shell in a private mount namespace (through a user namespace, so root is not
/// needed) with small tmpfs mounts (`DIR/fs` by default): what is on them is seen only
/// by processes started through [`Self::run`]. Daemons started there are ordinary
/// processes of this PID namespace (their pids can be killed from the test) and share
/// the network namespace (loopback).
pub struct SmallFs {
    shell: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The directory holding the mounts (visible to both sides; the mounts' contents only
    /// inside).
    pub dir: PathBuf,
}

impl SmallFs {
    /// A tmpfs of `size` (e.g. "48m") at `dir/fs`.
    pub fn new(dir: &Path, size: &str) -> SmallFs {
        SmallFs::with_mounts(dir, &[("fs", size)])
    }

    /// A tmpfs per `(subdirectory of dir, size)`.
    pub fn with_mounts(dir: &Path, mounts: &[(&str, &str)]) -> SmallFs {
        let mut script = String::new();
        for (sub, size) in mounts {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
            script += &format!("mount -t tmpfs -o size={size} tmpfs \"$1/{sub}\" || exit 1; ");
        }
        script += "cd \"$1\"; echo ready; while read -r cmd; do eval \"$cmd\"; echo \"done $?\"; done";
        let mut shell = Command::new("unshare")
            .args(["--user", "--map-root-user", "--mount", "sh", "-c"])
            .arg(script)
            .args(["sh", dir.to_str().unwrap()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("unshare (util-linux) runs");
        let stdin = shell.stdin.take().unwrap();
        let mut stdout = BufReader::new(shell.stdout.take().unwrap());
        let mut l = String::new();
        stdout.read_line(&mut l).unwrap();
        assert_eq!(
            l.trim(),
            "ready",
            "could not mount a tmpfs in a private mount namespace (needs user namespaces or root)"
        );
        SmallFs { shell, stdin, stdout, dir: dir.to_path_buf() }
    }

    /// Runs a shell command inside (working directory `dir`); returns its exit code.
    pub fn run(&mut self, cmd: &str) -> i32 {
        writeln!(self.stdin, "{cmd}").unwrap();
        let mut l = String::new();
        self.stdout.read_line(&mut l).unwrap();
        l.trim().strip_prefix("done ").unwrap_or_else(|| panic!("namespace shell: {l:?}")).parse().unwrap()
    }

    /// Starts `cachevisor serve --config CONFIG ARGS…` inside (config path relative to
    /// `dir`); waits until it serves (reading its banner from a file), or returns how it
    /// failed. The returned daemon is killed by pid.
    pub fn serve(&mut self, config: &str, args: &[&str]) -> Result<NsDaemon, Failed> {
        let want_api = std::fs::read_to_string(self.dir.join(config)).unwrap().contains("[api]");
        let n = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let (out, log) = (format!("serve.{n}.out"), format!("serve.{n}.log"));
        let extra: String = args.iter().map(|a| format!(" '{a}'")).collect();
        assert_eq!(
            self.run(&format!(
                "RUST_LOG=info '{}' serve --config '{config}'{extra} > {out} 2> {log} & echo $! > serve.pid",
                bin()
            )),
            0
        );
        let pid: u32 = std::fs::read_to_string(self.dir.join("serve.pid")).unwrap().trim().parse().unwrap();
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let text = std::fs::read_to_string(self.dir.join(&out)).unwrap_or_default();
            let mut lines = text.lines().map(str::to_string);
            if let Some((nbd, api, banner)) = read_banner(&mut lines, want_api) {
                return Ok(NsDaemon { pid, nbd, api, banner, log: self.dir.join(&log) });
            }
            let alive = Path::new(&format!("/proc/{pid}")).exists()
                && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z");
            if !alive || Instant::now() > end {
                self.run("wait");
                return Err(Failed {
                    status: None,
                    output: std::fs::read_to_string(self.dir.join(&log)).unwrap_or_default(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = self.shell.kill();
        let _ = self.shell.wait();
    }
}

/// A daemon started inside a [`SmallFs`].
pub struct NsDaemon {
    pub pid: u32,
    pub nbd: String,
    pub api: Option<String>,
    pub banner: Vec<String>,
    pub log: PathBuf,
}

impl NsDaemon {
    /// `nbd://ADDR/NAME`.
    pub fn uri(&self, name: &str) -> String {
        format!("nbd://{}/{name}", self.nbd)
    }

    /// Sends `sig` (e.g. "KILL", "TERM") and waits up to `within` for the process to end;
    /// returns whether it ended.
    pub fn signal(&self, sig: &str, within: Duration) -> bool {
        let _ = Command::new("kill").args([&format!("-{sig}"), &self.pid.to_string()]).status();
        let end = Instant::now() + within;
        while Instant::now() < end {
            if ended(self.pid) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Whether process `pid` ended: gone, or a zombie all of whose threads exited. The
/// leader turns zombie while other threads may still be exiting (one waiting on an I/O)
/// with the process's files open — and its locks held: a restart then was refused with
/// "in use by another cachevisor".
pub fn ended(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    if stat.is_empty() {
        return true;
    }
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
    stat.contains(") Z") && tasks <= 1
}

impl Drop for NsDaemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_log_tail("the namespace daemon", &self.log());
        }
        let _ = Command::new("kill").args(["-KILL", &self.pid.to_string()]).stderr(Stdio::null()).status();
    }
}

/// A counter of a daemon's `/metrics` text (the sum over its label sets that contain
/// `labels`).
pub fn metric(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
