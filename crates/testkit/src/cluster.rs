//! A cluster of daemons for the multi-node tests: each node in its own network namespace
//! with its own address (`netns.rs`), etcd started beside them, every node's config
//! written by the test, and what the tests ask of the nodes — their `GET /cluster`, their
//! vDisks' counters, API calls and qemu-io from inside a node's namespace.

use crate::netns::{Etcd, Net};
use crate::process::Daemon;
use serde_json::Value;
use std::time::{Duration, Instant};

pub const TOKEN: &str = "cluster-test-token-0123456789";
/// The lease TTL the nodes run with (ms).
pub const TTL_MS: u64 = 2000;

/// The cluster under test (dropped in field order: daemons, etcd, namespaces, files).
pub struct Cluster {
    pub nodes: Vec<Option<Daemon>>,
    pub etcd: Etcd,
    pub net: Net,
    pub dir: tempfile::TempDir,
}

impl Cluster {
    pub fn new(n: usize) -> Cluster {
        Cluster::with(n, "interval = \"300ms\"")
    }

    /// `n` nodes whose `[cluster]` sections end with `extra`.
    pub fn with(n: usize, extra: &str) -> Cluster {
        Cluster::with_listen(n, extra, |_| String::new())
    }

    /// As [`Cluster::with`], node k's `[listen]` section ending with `listen(k)`.
    pub fn with_listen(n: usize, extra: &str, listen: impl Fn(usize) -> String) -> Cluster {
        Cluster::with_nodes(n, |_| extra.to_string(), listen)
    }

    /// Node k's `[cluster]` section ending with `extra(k)`, its `[listen]` with `listen(k)`.
    pub fn with_nodes(n: usize, extra: impl Fn(usize) -> String, listen: impl Fn(usize) -> String) -> Cluster {
        Cluster::with_nodes_in(n, extra, listen, |_| {})
    }

    /// As [`Cluster::with_nodes`], `prepare` run on the test's directory before any node
    /// starts.
    pub fn with_nodes_in(
        n: usize,
        extra: impl Fn(usize) -> String,
        listen: impl Fn(usize) -> String,
        prepare: impl FnOnce(&std::path::Path),
    ) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        prepare(dir.path());
        let net = Net::new(n);
        let etcd = Etcd::start(&net.hub, Net::HUB_ADDR, dir.path());
        let mut c = Cluster { nodes: Vec::new(), etcd, net, dir };
        for k in 0..n {
            c.write_config(k, &extra(k), &listen(k));
            let d = c.start(k);
            c.nodes.push(Some(d));
        }
        c
    }

    pub fn write_config(&self, k: usize, extra: &str, listen: &str) {
        let d = self.dir.path();
        std::fs::create_dir_all(d.join(format!("n{k}"))).unwrap();
        let img = d.join(format!("vm{k}.img"));
        std::fs::File::create(&img).unwrap().set_len(16 << 20).unwrap();
        let a = self.net.addr(k);
        std::fs::write(
            d.join(format!("n{k}.toml")),
            format!(
                "[cache]\npath = \"n{k}/cache.img\"\nsize = \"8MiB\"\n[listen]\ntcp = \"{a}:10809\"\n{listen}\
                 [api]\nlisten = \"{a}:8080\"\ntoken = \"{TOKEN}\"\n[[vdisk]]\nname = \"vm{k}\"\nbacking = \"vm{k}.img\"\n\
                 [cluster]\nname = \"n{k}\"\naddress = \"{a}:10809\"\netcd = [\"{}\"]\nlease_ttl = \"2s\"\n{extra}\n",
                self.etcd.url
            ),
        )
        .unwrap();
    }

    pub fn start(&self, k: usize) -> Daemon {
        Daemon::start_in(Some(&self.net.nodes[k]), self.dir.path(), &format!("n{k}.toml"), &[])
            .unwrap_or_else(|f| panic!("node {k} did not start: {}", f.output))
    }

    /// Node k's `GET /cluster`, asked from inside its own namespace (so it answers
    /// while its link is cut).
    pub fn status(&self, k: usize) -> Option<Value> {
        let body = Net::http_get(&self.net.nodes[k], &format!("http://{}:8080/cluster", self.net.addr(k)))?;
        serde_json::from_str(&body).ok()
    }

    pub fn members(s: &Value) -> Vec<String> {
        s["members"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap().to_string()).collect()
    }

    pub fn leader(s: &Value) -> Option<String> {
        s["leader"]["name"].as_str().map(str::to_string)
    }

    /// Waits until `ok` holds for every live node's status; returns the statuses.
    pub fn wait_all(&self, what: &str, within: Duration, ok: impl Fn(usize, &Value) -> bool) -> Vec<Value> {
        let end = Instant::now() + within;
        loop {
            let live: Vec<usize> = (0..self.nodes.len()).filter(|&k| self.nodes[k].is_some()).collect();
            let s: Vec<Option<Value>> = live.iter().map(|&k| self.status(k)).collect();
            if live.iter().zip(&s).all(|(&k, s)| s.as_ref().is_some_and(|s| ok(k, s))) {
                return s.into_iter().flatten().collect();
            }
            assert!(Instant::now() < end, "{what}: not within {within:?}; statuses: {s:#?}\nlogs: {}", self.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn logs(&self) -> String {
        self.nodes.iter().flatten().map(|d| d.log()).collect::<Vec<_>>().join("\n----\n")
    }

    /// qemu-io inside node k's namespace on its vDisk: writes `pattern` at `offset`, reads
    /// it back.
    pub fn write_and_read(&self, k: usize, offset: u64, pattern: u8) {
        let uri = format!("nbd://{}:10809/vm{k}", self.net.addr(k));
        let out = Net::command(&self.net.nodes[k], "qemu-io")
            .args(["-f", "raw", &uri, "-c"])
            .arg(format!("write -P {pattern} {offset} 64k"))
            .arg("-c")
            .arg(format!("read -P {pattern} {offset} 64k"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && !text.contains("Pattern verification failed"), "node {k}: {text}");
    }
}

/// Whether the file at `path` holds a non-zero byte (a lent region some block landed in).
pub fn has_data(path: &std::path::Path) -> bool {
    std::fs::read(path).is_ok_and(|b| b.iter().any(|&x| x != 0))
}

pub fn formed(c: &Cluster, n: usize) -> Vec<Value> {
    let s = c.wait_all("three members, one leader, a map with every node", Duration::from_secs(20), |_, s| {
        Cluster::members(s).len() == n
            && Cluster::leader(s).is_some()
            && s["map"]["nodes"].as_object().unwrap().len() == n
            && s["serving"] == true
    });
    let leaders: std::collections::BTreeSet<_> = s.iter().map(|s| Cluster::leader(s).unwrap()).collect();
    assert_eq!(leaders.len(), 1, "every node names the same leader: {s:#?}");
    s
}

impl Cluster {
    /// Two nodes: n0 (8 MiB of cache) borrows up to 8 MiB from n1, which lends it over
    /// TLS to n0's certificate; returned once formed, with the PKI's directory kept alive
    /// beside the cluster.
    pub fn borrowing() -> (Cluster, tempfile::TempDir) {
        Cluster::borrowing_with("")
    }

    /// [`Cluster::borrowing`], n0's `[cluster]` section ending with `extra`.
    pub fn borrowing_with(extra: &str) -> (Cluster, tempfile::TempDir) {
        Cluster::borrowing_from(1, extra, "")
    }

    /// n0 borrows up to 8 MiB from each of `lenders` nodes (n1, n2, …), which lend it
    /// over TLS to n0's certificate; n0's `[cluster]` section ends with `extra`.
    pub fn borrowing_from(lenders: usize, extra: &str, every_node: &str) -> (Cluster, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let pki = crate::certs::Pki::new(&dir.path().join("pki"));
        let servers: Vec<_> = (1..=lenders)
            .map(|k| pki.server(&format!("srv{k}"), &format!("/CN=n{k}"), &format!("IP:10.77.0.{}", k + 1)))
            .collect();
        let n0 = pki.client("n0", "/CN=n0", None, 1);
        let peers: Vec<String> = (1..=lenders).map(|k| format!("\"n{k}\"")).collect();
        let extra = |k: usize| {
            match k {
            0 => format!(
                "interval = \"500ms\"\nunit = \"1MiB\"\npeers = [{}]\nborrow = \"8MiB\"\npeer_tls_dir = \"{}\"\n{extra}\n{every_node}",
                peers.join(", "),
                n0.display()
            ),
            _ => format!("interval = \"500ms\"\nunit = \"1MiB\"\nlend = \"8MiB\"\n{every_node}"),
        }
        };
        let c = Cluster::with_nodes(lenders + 1, extra, |k| match k {
            0 => String::new(),
            _ => format!("tls = \"on\"\ntls_dir = \"{}\"\n", servers[k - 1].display()),
        });
        formed(&c, lenders + 1);
        (c, dir)
    }

    /// Two nodes that each lend the other up to 8 MiB and borrow up to 8 MiB of the
    /// other's: both TLS servers (their lent regions) and clients (their borrowing),
    /// `extra` ending both `[cluster]` sections.
    pub fn mutual(extra: &str) -> (Cluster, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let pki = crate::certs::Pki::new(&dir.path().join("pki"));
        let servers: Vec<_> = (0..2)
            .map(|k| pki.server(&format!("srv{k}"), &format!("/CN=n{k}"), &format!("IP:10.77.0.{}", k + 1)))
            .collect();
        let clients: Vec<_> = (0..2).map(|k| pki.client(&format!("n{k}"), &format!("/CN=n{k}"), None, 1)).collect();
        let c = Cluster::with_nodes(
            2,
            |k| {
                format!(
                    "interval = \"500ms\"\nunit = \"1MiB\"\nlend = \"8MiB\"\npeers = [\"n{}\"]\nborrow = \"8MiB\"\npeer_tls_dir = \"{}\"\n{extra}",
                    1 - k,
                    clients[k].display()
                )
            },
            |k| format!("tls = \"on\"\ntls_dir = \"{}\"\n", servers[k].display()),
        );
        formed(&c, 2);
        (c, dir)
    }

    /// qemu-io inside node k's namespace on its export `vdisk`: every command must succeed
    /// with its pattern; returns how long it took.
    pub fn io(&self, k: usize, vdisk: &str, cmds: &[&str]) -> Duration {
        let t = Instant::now();
        let mut q = Net::command(&self.net.nodes[k], "qemu-io");
        q.args(["-f", "raw", &format!("nbd://{}:10809/{vdisk}", self.net.addr(k))]);
        for cmd in cmds {
            q.args(["-c", cmd]);
        }
        let o = q.output().unwrap();
        let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success() && !text.contains("failed"), "n{k} {vdisk} {cmds:?}: {text}\n{}", self.logs());
        t.elapsed()
    }

    /// `POST` of a JSON body to node k's API from inside its namespace; the answer's body.
    pub fn post(&self, k: usize, path: &str, body: &str) -> String {
        let (ok, text) = self.try_post(k, path, body);
        assert!(ok, "POST {path} on n{k}: {text}");
        text
    }

    /// [`Cluster::post`]: whether it succeeded (2xx), and the body.
    pub fn try_post(&self, k: usize, path: &str, body: &str) -> (bool, String) {
        self.request(k, "POST", path, body)
    }

    /// `DELETE` of node k's API path; it must succeed.
    pub fn delete(&self, k: usize, path: &str) {
        let (ok, text) = self.try_delete(k, path);
        assert!(ok, "DELETE {path} on n{k}: {text}");
    }

    /// `DELETE` of node k's API path: whether it succeeded (2xx), and the body.
    pub fn try_delete(&self, k: usize, path: &str) -> (bool, String) {
        self.request(k, "DELETE", path, "")
    }

    fn request(&self, k: usize, method: &str, path: &str, body: &str) -> (bool, String) {
        let out = Net::command(&self.net.nodes[k], "curl")
            .args(["-sS", "--fail-with-body", "-X", method, "-H", &format!("Authorization: Bearer {TOKEN}"), "-H"])
            .args(["Content-Type: application/json", "-d", body, &format!("http://{}:8080{path}", self.net.addr(k))])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    }

    /// The JSON body adding a vDisk named `name` backed by `backing` (under the test's
    /// directory), with `extra` fields (`, "write_policy": "wb"`).
    pub fn vdisk_body(&self, name: &str, backing: &str, extra: &str) -> String {
        format!("{{\"name\": \"{name}\", \"backing\": \"{}\"{extra}}}", self.dir.path().join(backing).display())
    }

    /// `GET` of node k's API path, as JSON.
    pub fn get(&self, k: usize, path: &str) -> Value {
        let body = Net::http_get(&self.net.nodes[k], &format!("http://{}:8080{path}", self.net.addr(k)))
            .unwrap_or_else(|| panic!("GET {path} on n{k}"));
        serde_json::from_str(&body).unwrap()
    }

    /// A vDisk's (blocks accessed, blocks hit) so far on node k.
    pub fn hits(&self, k: usize, vdisk: &str) -> (u64, u64) {
        let all = self.get(k, "/vdisks");
        let list = all.as_array().or(all["vdisks"].as_array()).expect("a list of vDisks");
        let v = list.iter().find(|v| v["name"] == vdisk).unwrap_or_else(|| panic!("{vdisk} on n{k}: {all:#}"));
        (v["stats"]["blocks"].as_u64().unwrap(), v["stats"]["hit_blocks"].as_u64().unwrap())
    }

    /// Adds a vDisk backed by `backing` (under the test's directory) on node k.
    pub fn add_vdisk(&self, k: usize, name: &str, backing: &str) {
        self.post(k, "/vdisks", &self.vdisk_body(name, backing, ""));
    }
}
