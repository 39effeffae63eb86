//! The daemons `bench cluster-serve` runs (`cluster_serve.rs`): etcd alone on
//! loopback, a certificate per node (the tests' maker, openssl), each node a `cachevisor
//! serve` in front of its own slow backing store (nbdkit memory + delay), and what the
//! bench reads from them — hit counters, the leader's allocation, a lender's served
//! reads — and the loopback round trip it compares a remote hit with.

use crate::bench::cluster_serve::Opts;
use crate::bench::median;
use crate::bench::serve::{free_port, spawn_serve, start_nbdkit, Proc};
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) const NAMES: [&str; 3] = ["a", "b", "c"];

/// A running node.
pub(crate) struct Node {
    _backing: Proc,
    /// Its backing store's own URI (nbdkit's).
    pub(crate) backing_uri: String,
    pub(crate) proc: Proc,
    /// `nbd://127.0.0.1:PORT/vm-NAME`.
    pub(crate) uri: String,
    pub(crate) api: String,
}

/// A node's part in a run.
pub(crate) struct Role {
    pub(crate) cache_mib: u64,
    /// Keys added to its vDisk's `[[vdisk]]` (`write_policy = "wb"`).
    pub(crate) vdisk_extra: String,
    /// The `[cluster]` keys after name/address/etcd (None: no cluster).
    pub(crate) cluster: Option<String>,
}

/// etcd on loopback, alone, in `dir`.
pub(crate) fn start_etcd(etcd: &Path, dir: &Path) -> anyhow::Result<(Proc, String)> {
    let (client, peer) = (free_port()?, free_port()?);
    let url = format!("http://127.0.0.1:{client}");
    let c = Command::new(etcd)
        .args(["--name", "bench", "--data-dir"])
        .arg(dir.join("etcd"))
        .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(["--initial-cluster", &format!("bench=http://127.0.0.1:{peer}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {} (apt-get install etcd-server)", etcd.display()))?;
    let c = Proc(c);
    for _ in 0..200 {
        if ureq::get(&format!("{url}/health")).call().is_ok() {
            return Ok((c, url));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("etcd did not answer at {url}")
}

/// Starts the nodes of one run under `dir` (its backing stores fresh), each recording
/// its requests to `dir/NAME.rec.csv` when `record`.
pub(crate) fn start_nodes(
    o: &Opts,
    dir: &Path,
    pki: &Path,
    etcd: &str,
    run: &str,
    roles: &[Role],
    record: bool,
) -> anyhow::Result<Vec<Node>> {
    std::fs::create_dir_all(dir)?;
    let delay = format!("{}ms", o.delay_ms);
    let mut nodes = Vec::new();
    for (name, role) in NAMES.iter().zip(roles) {
        let (kit, kit_uri) = start_nbdkit(&[
            "--filter=delay",
            "-t",
            "16",
            "memory",
            &format!("{}M", o.set_mib.max(64)),
            &format!("rdelay={delay}"),
            &format!("wdelay={delay}"),
        ])?;
        let (port, api) = (free_port()?, format!("127.0.0.1:{}", free_port()?));
        let cluster = role.cluster.as_ref().map_or(String::new(), |extra| {
            format!("[cluster]\nname = \"{name}\"\naddress = \"127.0.0.1:{port}\"\netcd = [\"{etcd}\"]\ncluster = \"{run}\"\nlease_ttl = \"2s\"\ninterval = \"1s\"\n{extra}\n")
        });
        let cfg = dir.join(format!("{name}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[cache]\npath = \"{d}/{name}.cache\"\nsize = \"{c}MiB\"\n[listen]\ntcp = \"127.0.0.1:{port}\"\ntls = \"on\"\ntls_dir = \"{srv}\"\n\
                 [api]\nlisten = \"{api}\"\n[[vdisk]]\nname = \"vm-{name}\"\nbacking = \"{b}/\"\n{v}\n{cluster}",
                d = dir.display(),
                c = role.cache_mib,
                srv = pki.join(format!("{name}-server")).display(),
                b = kit_uri.trim_end_matches('/'),
                v = role.vdisk_extra,
            ),
        )?;
        let rec = dir.join(format!("{name}.rec.csv"));
        let proc = spawn_serve(&cfg, record.then_some(rec.as_path())).with_context(|| format!("node {name}"))?;
        nodes.push(Node {
            _backing: kit,
            backing_uri: kit_uri.clone(),
            proc,
            uri: format!("nbd://127.0.0.1:{port}/vm-{name}"),
            api,
        });
    }
    Ok(nodes)
}

/// The certificates: per node a server certificate for 127.0.0.1 and a client
/// certificate with CN = its name.
pub(crate) fn make_pki(dir: &Path) -> anyhow::Result<PathBuf> {
    let root = dir.join("pki");
    let _ = std::fs::remove_dir_all(&root);
    let pki = cachevisor_testkit::certs::Pki::new(&root);
    for n in NAMES {
        pki.server(&format!("{n}-server"), &format!("/CN={n}"), "IP:127.0.0.1");
        pki.client(&format!("{n}-client"), &format!("/CN={n}"), None, 2);
    }
    Ok(root)
}

/// A vDisk's (blocks accessed, blocks hit) so far.
pub(crate) fn hits(api: &str) -> anyhow::Result<(u64, u64)> {
    let v: serde_json::Value = ureq::get(&format!("http://{api}/vdisks")).call()?.into_json()?;
    let s = &v[0]["stats"];
    Ok((s["blocks"].as_u64().unwrap_or(0), s["hit_blocks"].as_u64().unwrap_or(0)))
}

pub(crate) fn ratio(before: (u64, u64), after: (u64, u64)) -> f64 {
    (after.1 - before.1) as f64 / (after.0 - before.0).max(1) as f64
}

/// The units the leader gives `vm` from other nodes, per node a's view.
pub(crate) fn remote_units(api: &str, vm: &str) -> u64 {
    let Ok(r) = ureq::get(&format!("http://{api}/cluster")).call() else { return 0 };
    let Ok(v) = r.into_json::<serde_json::Value>() else { return 0 };
    let remote = v["allocation"]["vms"][vm]["remote"].as_array().cloned().unwrap_or_default();
    remote.iter().map(|x| x[1].as_u64().unwrap_or(0)).sum()
}

/// The reads `lender` (its API) served from the region it lends `borrower`: (count, total
/// seconds), from its request-latency histogram.
pub(crate) fn lent_reads(lender: &str, borrower: &str) -> anyhow::Result<(u64, f64)> {
    let text = ureq::get(&format!("http://{lender}/metrics")).call()?.into_string()?;
    let want = |l: &&str, what: &str| {
        l.starts_with(&format!("cachevisor_request_duration_seconds_{what}{{"))
            && l.contains(&format!("vdisk=\"lent-{borrower}\""))
            && l.contains("op=\"read\"")
    };
    let value = |what: &str| -> f64 {
        text.lines()
            .find(|l| want(l, what))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    Ok((value("count") as u64, value("sum")))
}

/// The loopback round trip: median of 2000 one-byte ping-pongs over TCP (µs).
pub(crate) fn loopback_rtt_us() -> anyhow::Result<f64> {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            let _ = s.set_nodelay(true);
            let mut b = [0u8; 1];
            while s.read_exact(&mut b).is_ok() && s.write_all(&b).is_ok() {}
        }
    });
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut b = [7u8; 1];
    let mut v = Vec::new();
    for _ in 0..2000 {
        let t = Instant::now();
        s.write_all(&b)?;
        s.read_exact(&mut b)?;
        v.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(median(v))
}
