//! Network namespaces for multi-node tests: a hub namespace with a bridge (and etcd on
//! the bridge's address), and one namespace per node joined to it by a veth pair, each
//! with its own address — what separate hosts on one switch look like. A node's link can
//! be cut and restored (`ip link set … down/up` on the hub side). Everything is created by
//! the test and removed when dropped. Needs root (`ip netns add`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static NEXT: AtomicU32 = AtomicU32::new(0);

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip (iproute2) runs");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// The namespaces.
pub struct Net {
    /// The hub namespace (bridge `br0`, address [`Net::HUB_ADDR`]).
    pub hub: String,
    /// Node namespaces, node k at `10.77.0.(k+1)`.
    pub nodes: Vec<String>,
}

impl Net {
    /// The hub's address (where etcd listens).
    pub const HUB_ADDR: &'static str = "10.77.0.254";

    /// A hub and `n` nodes.
    pub fn new(n: usize) -> Net {
        let uid = Command::new("id").arg("-u").output().expect("id runs");
        assert!(
            String::from_utf8_lossy(&uid.stdout).trim() == "0",
            "multi-node tests create network namespaces (`ip netns add`) and need root"
        );
        let tag = format!("cv{}x{}", std::process::id() % 100_000, NEXT.fetch_add(1, Ordering::Relaxed));
        let hub = format!("{tag}h");
        ip(&["netns", "add", &hub]);
        let net = Net { hub: hub.clone(), nodes: Vec::new() };
        ip(&["-n", &hub, "link", "set", "lo", "up"]);
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &hub, "addr", "add", &format!("{}/24", Net::HUB_ADDR), "dev", "br0"]);
        ip(&["-n", &hub, "link", "set", "br0", "up"]);
        let mut net = net;
        for k in 0..n {
            let ns = format!("{tag}n{k}");
            ip(&["netns", "add", &ns]);
            net.nodes.push(ns.clone());
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            let h = format!("h{k}");
            ip(&["-n", &hub, "link", "add", &h, "type", "veth", "peer", "name", "eth0", "netns", &ns]);
            ip(&["-n", &hub, "link", "set", &h, "master", "br0"]);
            ip(&["-n", &hub, "link", "set", &h, "up"]);
            ip(&["-n", &ns, "addr", "add", &format!("{}/24", net.addr(k)), "dev", "eth0"]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        }
        net
    }

    /// Node k's address.
    pub fn addr(&self, k: usize) -> String {
        format!("10.77.0.{}", k + 1)
    }

    /// Cuts (`up = false`) or restores node k's link.
    pub fn link(&self, k: usize, up: bool) {
        ip(&["-n", &self.hub, "link", "set", &format!("h{k}"), if up { "up" } else { "down" }]);
    }

    /// A command run inside namespace `ns` (`ip netns exec` execs it: the child's pid is
    /// the command's).
    pub fn command(ns: &str, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, program]);
        c
    }

    /// `curl` inside `ns`: the body of a GET (None when it fails).
    pub fn http_get(ns: &str, url: &str) -> Option<String> {
        let out = Net::command(ns, "curl").args(["-sf", "--max-time", "2", url]).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).to_string())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.nodes.iter().chain(std::iter::once(&self.hub)) {
            let _ = Command::new("ip").args(["netns", "del", ns]).stderr(Stdio::null()).status();
        }
    }
}

/// etcd (Debian's `etcd-server`) in a namespace, its data in a directory of the test;
/// killed when dropped.
pub struct Etcd {
    child: Option<Child>,
    ns: String,
    dir: PathBuf,
    /// Its client URL.
    pub url: String,
    log: PathBuf,
}

impl Etcd {
    /// Starts etcd in `ns` listening on `addr` (client port 2379, peer port 2380) with its
    /// data under `dir`; waits until it answers.
    pub fn start(ns: &str, addr: &str, dir: &Path) -> Etcd {
        let mut e = Etcd {
            child: None,
            ns: ns.to_string(),
            dir: dir.join("etcd"),
            url: format!("http://{addr}:2379"),
            log: dir.join("etcd.log"),
        };
        e.restart();
        e
    }

    /// Starts it again (same data) after [`Etcd::kill`].
    pub fn restart(&mut self) {
        let addr = self.url.trim_start_matches("http://").trim_end_matches(":2379").to_string();
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let child = Net::command(&self.ns, "etcd")
            .args(["--name", "t", "--data-dir"])
            .arg(&self.dir)
            .args(["--listen-client-urls", &self.url, "--advertise-client-urls", &self.url])
            .args(["--listen-peer-urls", &format!("http://{addr}:2380")])
            .args(["--initial-advertise-peer-urls", &format!("http://{addr}:2380")])
            .args(["--initial-cluster", &format!("t=http://{addr}:2380")])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("etcd (etcd-server) runs");
        self.child = Some(child);
        let end = Instant::now() + Duration::from_secs(20);
        while Net::http_get(&self.ns, &format!("{}/health", self.url)).is_none_or(|b| !b.contains("true")) {
            assert!(Instant::now() < end, "etcd did not start: {}", std::fs::read_to_string(&self.log).unwrap());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}
