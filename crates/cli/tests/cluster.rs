//! Daemons as nodes of a cluster coordinated through etcd, each node in its own network
//! namespace with its own address (`common/netns.rs`), etcd started by the test:
//! membership under leases, one leader, the map it writes, a killed leader replaced
//! within the lease, a node cut off from the network fencing itself before the others
//! can see it gone (and serving its own vDisks on), and etcd down: nodes serve on and
//! the map is neither lost nor rolled back.

use cachevisor_testkit as common;

use common::certs;
use common::cluster::{formed, has_data, Cluster, TTL_MS};
use common::netns::Net;
use common::Daemon;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn nodes_join_under_leases_elect_one_leader_and_a_killed_leader_is_replaced_within_the_lease() {
    let mut c = Cluster::new(3);
    let s = formed(&c, 3);
    let leader = Cluster::leader(&s[0]).unwrap();
    let lk: usize = leader.trim_start_matches('n').parse().unwrap();
    let metrics = Net::http_get(&c.net.nodes[lk], &format!("http://{}:8080/metrics", c.net.addr(lk))).unwrap();
    for m in ["cachevisor_cluster_serving 1", "cachevisor_cluster_leading 1", "cachevisor_cluster_members 3"] {
        assert!(metrics.contains(m), "{m} in {metrics}");
    }
    assert_eq!(s.iter().filter(|s| s["leading"] == true).count(), 1, "one node leads: {s:#?}");
    let map = &s[lk]["map"];
    for k in 0..3 {
        assert_eq!(map["vdisks"][format!("vm{k}")]["home"], format!("n{k}"), "{map:#}");
    }
    let epoch = map["epoch"].as_u64().unwrap();
    assert!(epoch >= 1);
    // Every node reaches the leader's map.
    c.wait_all("the leader's map everywhere", Duration::from_secs(5), |_, s| s["epoch"].as_u64() >= Some(epoch));

    // SIGKILL the leader: its lease expires, another node is elected.
    let killed_at = Instant::now();
    c.nodes[lk].as_mut().unwrap().kill9();
    c.nodes[lk] = None;
    let s = c.wait_all("a new leader", Duration::from_secs(10), |_, s| {
        Cluster::leader(s).is_some_and(|l| l != leader) && s["serving"] == true
    });
    let took = killed_at.elapsed();
    eprintln!("new leader elected {took:?} after the old one was killed (lease TTL {TTL_MS} ms)");
    // Within the lease, plus a read of the keys (200 ms) and a request's deadline (333 ms).
    assert!(took < Duration::from_millis(TTL_MS + 1500), "re-election took {took:?}");
    let new = Cluster::leader(&s[0]).unwrap();
    assert!(s.iter().all(|s| Cluster::leader(s).as_deref() == Some(new.as_str())));
    c.wait_all("the dead node gone from the members", Duration::from_secs(5), |_, s| {
        !Cluster::members(s).contains(&leader)
    });

    // Allocation goes on: a vDisk added on a surviving node is homed there by the new
    // leader, at a later epoch; the dead node's vDisk keeps its entry (its id is not reused).
    let k = (0..3).find(|&k| k != lk).unwrap();
    std::fs::File::create(c.dir.path().join("extra.img")).unwrap().set_len(4 << 20).unwrap();
    c.add_vdisk(k, "extra", "extra.img");
    let s = c.wait_all("the new vDisk in the map", Duration::from_secs(5), |_, s| {
        s["map"]["vdisks"]["extra"]["home"] == format!("n{k}")
    });
    let m = &s[0]["map"];
    assert!(m["epoch"].as_u64().unwrap() > epoch, "{m:#}");
    assert_eq!(m["vdisks"][format!("vm{lk}")]["home"], leader, "the dead node's vDisk keeps its entry: {m:#}");
    let ids: std::collections::BTreeSet<u64> =
        m["vdisks"].as_object().unwrap().values().map(|v| v["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), 4, "vDisk ids are distinct: {m:#}");
}

#[test]
fn a_node_cut_off_fences_itself_before_the_others_can_see_it_gone_and_serves_its_own_vdisks_on() {
    let c = Cluster::new(3);
    formed(&c, 3);
    let cut = 2;
    c.net.link(cut, false);
    let at = Instant::now();
    let (mut fenced, mut gone) = (None, None);
    while (fenced.is_none() || gone.is_none()) && at.elapsed() < Duration::from_secs(15) {
        if fenced.is_none() && c.status(cut).is_some_and(|s| s["serving"] == false) {
            fenced = Some(at.elapsed());
        }
        if gone.is_none()
            && c.status(0).is_some_and(|s| !Cluster::members(&s).contains(&format!("n{cut}")))
            && c.status(1).is_some_and(|s| !Cluster::members(&s).contains(&format!("n{cut}")))
        {
            gone = Some(at.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (fenced, gone) = (fenced.expect("the cut node fenced itself"), gone.expect("the others saw it gone"));
    eprintln!("link cut: node fenced after {fenced:?}, seen gone by the others after {gone:?}");
    assert!(fenced < gone, "fenced at {fenced:?}, but the others saw it gone at {gone:?}");
    assert!(fenced <= Duration::from_millis(TTL_MS), "fenced within its lease: {fenced:?}");
    let s = c.status(cut).unwrap();
    assert_eq!(s["leading"], false);
    assert_eq!(s["etcd_reachable"], false);
    let metrics = Net::http_get(&c.net.nodes[cut], &format!("http://{}:8080/metrics", c.net.addr(cut))).unwrap();
    assert!(metrics.contains("cachevisor_cluster_serving 0"), "{metrics}");
    let errors = metrics
        .lines()
        .find_map(|l| l.strip_prefix("cachevisor_cluster_etcd_errors_total "))
        .and_then(|v| v.trim().parse::<u64>().ok());
    assert!(errors.is_some_and(|n| n > 0), "etcd's failures are counted: {metrics}");
    // Its own vDisk is served on (from inside its namespace).
    c.write_and_read(cut, 0, 0x5a);
    // The others go on with a leader among them.
    c.wait_all("a leader among the connected nodes", Duration::from_secs(10), |k, s| {
        k == cut || Cluster::leader(s).is_some_and(|l| l != format!("n{cut}"))
    });

    // With it gone, n0 takes its vDisk over (write-through: nothing only the cut node
    // holds), opening the backing store by a path of its own as another host would: the
    // claim the cut node lost with its lease is n0's now.
    std::fs::File::create(c.dir.path().join("vm2-n0.img")).unwrap().set_len(16 << 20).unwrap();
    let (ok, text) = c.try_post(0, "/vdisks", &c.vdisk_body("vm2", "vm2-n0.img", ""));
    assert!(ok, "{text}\n{:#}", c.status(0).unwrap());

    // The link back: the node holds a lease again and is a member again, and finds the
    // claim of a vDisk it serves held by n0: a conflict, shown and logged.
    c.net.link(cut, true);
    formed(&c, 3);
    c.write_and_read(cut, 1 << 20, 0x6b);
    let s = c.wait_all("the conflict shown", Duration::from_secs(5), |k, s| {
        k != cut || s["claim_conflicts"].as_array().is_some_and(|a| !a.is_empty())
    });
    assert_eq!(s[cut]["claim_conflicts"], serde_json::json!([{"vdisk": "vm2", "node": "n0"}]), "{:#}", s[cut]);
    let metrics = Net::http_get(&c.net.nodes[cut], &format!("http://{}:8080/metrics", c.net.addr(cut))).unwrap();
    assert!(metrics.contains("cachevisor_cluster_claim_conflicts 1"), "{metrics}");
    assert!(c.logs().contains("two nodes serve one vDisk"), "logged");
    // Removed on n0, its claim goes back to the node serving it, and the conflict ends.
    c.delete(0, "/vdisks/vm2");
    c.wait_all("the conflict over", Duration::from_secs(5), |_, s| {
        s["claim_conflicts"].as_array().is_some_and(|a| a.is_empty())
    });
    let (ok, text) = c.try_post(1, "/vdisks", &c.vdisk_body("vm2", "vm2-n0.img", ""));
    assert!(!ok && text.contains("claimed by node n2"), "n2 took its claim back: {text}");
}

#[test]
fn with_etcd_down_nodes_serve_on_and_the_map_survives_to_when_it_is_back() {
    let mut c = Cluster::new(2);
    let s = formed(&c, 2);
    let epoch = s[0]["map"]["epoch"].as_u64().unwrap();
    let map = s[0]["map"].clone();
    c.etcd.kill();
    let at = Instant::now();
    // Every node serves its vDisks; none can renew: each fences itself within its lease.
    for k in 0..2 {
        c.write_and_read(k, 0, 0x11 + k as u8);
    }
    c.wait_all("etcd unreachable, fenced", Duration::from_millis(TTL_MS + 2000), |_, s| {
        s["etcd_reachable"] == false && s["serving"] == false && s["leading"] == false
    });
    assert!(at.elapsed() < Duration::from_millis(TTL_MS + 2000));
    for k in 0..2 {
        c.write_and_read(k, 4 << 20, 0x21 + k as u8);
        assert_eq!(c.status(k).unwrap()["epoch"].as_u64(), Some(epoch), "no map change without etcd");
    }
    // A node that restarts meanwhile cannot tell whether its vDisks moved away while it
    // was down (`start_check.rs`): it waits, then refuses to start, naming etcd.
    c.nodes[1].as_mut().unwrap().kill9();
    c.nodes[1] = None;
    let t = Instant::now();
    let failed = Daemon::start_in(Some(&c.net.nodes[1]), c.dir.path(), "n1.toml", &[]).err().expect("refused");
    assert!(
        failed.output.contains("the map could not be read from etcd") && failed.output.contains(&c.etcd.url),
        "{}",
        failed.output
    );
    assert!(t.elapsed() >= Duration::from_secs(10), "it waited for etcd first: {:?}", t.elapsed());
    c.etcd.restart();
    c.nodes[1] = Some(c.start(1));
    let s = formed(&c, 2);
    for s in &s {
        assert!(s["epoch"].as_u64() >= Some(epoch), "the map's epoch never goes back: {s:#}");
        assert_eq!(s["map"]["vdisks"], map["vdisks"], "the map survived");
        assert_eq!(s["etcd_reachable"], true);
    }
}

#[test]
fn the_leader_lends_an_idle_nodes_cache_to_a_vm_that_outgrows_its_own() {
    // ELICA's skewed placement: vm0 loops over 12 MiB, its node caches 8 MiB; node 1's
    // VM is idle. Eq. 4 on the estimates the nodes publish gives vm0 node 1's units.
    let c = Cluster::with(2, "interval = \"1s\"\nunit = \"1MiB\"");
    formed(&c, 2);
    let uri = format!("nbd://{}:10809/vm0", c.net.addr(0));
    let end = Instant::now() + Duration::from_secs(30);
    let share = loop {
        let out = Net::command(&c.net.nodes[0], "qemu-io")
            .args(["-f", "raw", "-r", &uri, "-c", "read 0 12M", "-c", "read 0 12M", "-c", "read 0 12M"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let s = c.status(1).unwrap();
        let a = &s["allocation"]["vms"]["vm0"];
        if a["remote"].as_array().is_some_and(|r| !r.is_empty()) {
            break s["allocation"].clone();
        }
        assert!(Instant::now() < end, "no remote share for vm0: {s:#}\n{}", c.logs());
    };
    eprintln!("allocation: {share:#}");
    let vm0 = &share["vms"]["vm0"];
    assert_eq!(vm0["node"], "n0");
    assert_eq!(vm0["local_units"], 8, "vm0 fills its own node's 8 units: {share:#}");
    assert_eq!(vm0["remote"][0][0], "n1");
    let remote = vm0["remote"][0][1].as_u64().unwrap();
    assert!((4..=5).contains(&remote), "12 MiB of reuse needs 4 more units (the 1% cut may leave 5): {share:#}");
    assert_eq!(share["vms"]["vm1"]["local_units"], 0, "the idle VM gets nothing: {share:#}");
    assert_eq!(share["unit_bytes"], 1 << 20);
}

/// qemu-io inside `ns` on export `name` of `host`:10809 over TLS with the client
/// directory `creds` (QEMU's tls-creds-x509 layout), running `cmds`.
fn tls_qemu_io(ns: &str, host: &str, name: &str, creds: &Path, cmds: &[&str]) -> (bool, String) {
    let mut c = tls_qemu_io_command(ns, host, name, creds);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    let o = c.output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    (o.status.success() && !text.contains("failed") && !text.contains("Pattern verification failed"), text)
}

/// The qemu-io command of [`tls_qemu_io`], before its `-c` commands.
fn tls_qemu_io_command(ns: &str, host: &str, name: &str, creds: &Path) -> Command {
    let mut c = Net::command(ns, "qemu-io");
    c.args(["--object", &format!("tls-creds-x509,id=tls0,dir={},endpoint=client", creds.display())]);
    c.args([
        "--image-opts",
        &format!("driver=nbd,server.type=inet,server.host={host},server.port=10809,export={name},tls-creds=tls0"),
    ]);
    c
}

#[test]
fn lent_cache_is_served_to_its_borrowers_certificate_only_and_never_by_a_fenced_lender() {
    let dir = tempfile::tempdir().unwrap();
    let pki = certs::Pki::new(&dir.path().join("pki"));
    let servers: Vec<_> = (0..2)
        .map(|k| pki.server(&format!("srv{k}"), &format!("/CN=n{k}"), &format!("IP:10.77.0.{}", k + 1)))
        .collect();
    let n1 = pki.client("n1", "/CN=n1", None, 1);
    let intruder = pki.client("n9", "/CN=n9", None, 1);
    let anonymous = pki.anonymous("anon");
    let c = Cluster::with_listen(2, "interval = \"300ms\"\nlend = \"4MiB\"", |k| {
        format!("tls = \"on\"\ntls_dir = \"{}\"\n", servers[k].display())
    });
    let s = formed(&c, 2);
    let lender = &s[0];
    let epoch = lender["epoch"].as_u64().unwrap();
    let incarnation = lender["members"][0]["incarnation"].as_u64().unwrap();
    assert!(incarnation > 0 && lender["members"][0]["lend_bytes"] == 4 << 20, "{lender:#}");
    let name = format!("lent-n1@{epoch}@{incarnation}");
    let (ns1, host) = (&c.net.nodes[1], c.net.addr(0));

    // The borrower's certificate opens its region: bytes round-trip.
    let (ok, out) = tls_qemu_io(ns1, &host, &name, &n1, &["write -P 0x77 0 64k", "flush", "read -P 0x77 0 64k"]);
    assert!(ok, "{out}");
    let region = std::fs::metadata(c.dir.path().join("n0/cache.img.meta/lent/n1.img")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&region.permissions()) & 0o777,
        0o600,
        "another node's data is private"
    );
    // Another member's certificate, a certificate the CA signed for a host that is not a
    // member, and no certificate: nothing opens, nothing is written.
    for (who, creds) in [("a certificate for n9", &intruder), ("no client certificate", &anonymous)] {
        let (ok, out) = tls_qemu_io(ns1, &host, &name, creds, &["write -P 0x66 0 64k"]);
        assert!(!ok, "{who} opened n1's region: {out}");
    }
    // An older epoch, another incarnation: no such export.
    for stale in [format!("lent-n1@{}@{incarnation}", epoch - 1), format!("lent-n1@{epoch}@{}", incarnation + 1)] {
        let (ok, out) = tls_qemu_io(ns1, &host, &stale, &n1, &["read 0 4k"]);
        assert!(!ok, "{stale} opened: {out}");
    }
    let (ok, out) = tls_qemu_io(ns1, &host, &name, &n1, &["read -P 0x77 0 64k"]);
    assert!(ok, "the bytes are the borrower's: {out}");

    // Fencing: the lender loses etcd (and only etcd: its peers still reach it). A
    // connection opened before gets no byte once the lender's lease ran out.
    let reader = tls_qemu_io_command(ns1, &host, &name, &n1)
        .args(["-c", "read -P 0x77 0 64k", "-c", "sleep 4000", "-c", "read -P 0x77 0 64k"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let cut = Command::new("ip")
        .args(["-n", &c.net.nodes[0], "route", "add", "blackhole", &format!("{}/32", Net::HUB_ADDR)])
        .status()
        .unwrap();
    assert!(cut.success());
    let t = Instant::now();
    while c.status(0).is_some_and(|s| s["serving"] == true) {
        assert!(t.elapsed() < Duration::from_millis(TTL_MS + 1000), "the lender did not fence itself");
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = reader.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    let reads: Vec<&str> = text.lines().filter(|l| l.starts_with("read ") || l.contains("read failed")).collect();
    assert!(
        reads.first().is_some_and(|l| l.starts_with("read 65536/65536")) && text.contains("read failed"),
        "before the fence a read, after it none: {text}"
    );
    assert!(c.logs().contains("lent cache: request refused"), "{}", c.logs());
    let (ok, _) = tls_qemu_io(ns1, &host, &name, &n1, &["read 0 4k"]);
    assert!(!ok, "a fenced lender lists no lent export");

    // etcd back: a new lease, the region serves its borrower again.
    let back = Command::new("ip")
        .args(["-n", &c.net.nodes[0], "route", "del", "blackhole", &format!("{}/32", Net::HUB_ADDR)])
        .status()
        .unwrap();
    assert!(back.success());
    let s = formed(&c, 2);
    let name = format!("lent-n1@{}@{incarnation}", s[0]["epoch"].as_u64().unwrap());
    let (ok, out) = tls_qemu_io(ns1, &host, &name, &n1, &["read -P 0x77 0 64k"]);
    assert!(ok, "{out}");
}

/// Two nodes: n0 borrows from n1 (its VM loops over 12 MiB, its cache holds 8); n1
/// lends. Returns once some of vm0's blocks are cached in n1's region (its bytes checked
/// on the way), with the PKI's directory kept alive beside the cluster.
fn borrowing_pair() -> (Cluster, tempfile::TempDir) {
    let (c, dir) = Cluster::borrowing();
    vm0_io(&c, &["write -P 0x42 0 12M", "flush"]);
    let region = c.dir.path().join("n1/cache.img.meta/lent/n0.img");
    let end = Instant::now() + Duration::from_secs(40);
    while !has_data(&region) {
        vm0_io(&c, &["read -P 0x42 0 12M", "read -P 0x42 0 12M", "read -P 0x42 0 12M"]);
        assert!(Instant::now() < end, "nothing cached in n1's region for n0: {:#}\n{}", c.status(0).unwrap(), c.logs());
    }
    eprintln!("allocation: {:#}", c.status(0).unwrap()["allocation"]["vms"]["vm0"]);
    (c, dir)
}

/// qemu-io on n0's vm0 from inside n0's namespace: every command must succeed with
/// its pattern; returns how long it took.
fn vm0_io(c: &Cluster, cmds: &[&str]) -> Duration {
    c.io(0, "vm0", cmds)
}

#[test]
fn a_vm_caches_in_a_peers_lent_region_and_a_killed_peer_costs_it_no_byte_and_no_error() {
    let (c, _pki) = borrowing_pair();
    // Hits from the lent region carry the VM's bytes.
    vm0_io(&c, &["read -P 0x42 0 12M", "write -P 0x43 4M 1M", "read -P 0x43 4M 1M", "read -P 0x42 0 4M"]);
    // SIGKILL the lender: the VM's reads and writes go on, every byte as written.
    let pid = c.nodes[1].as_ref().unwrap().pid.to_string();
    assert!(Command::new("kill").args(["-KILL", &pid]).status().unwrap().success());
    while !cachevisor_testkit::process::ended(pid.parse().unwrap()) {
        std::thread::sleep(Duration::from_millis(10));
    }
    vm0_io(&c, &["read -P 0x42 0 4M", "read -P 0x43 4M 1M", "read -P 0x42 5M 7M"]);
    vm0_io(&c, &["write -P 0x44 8M 2M", "read -P 0x44 8M 2M", "read -P 0x42 0 4M"]);
    assert!(c.logs().contains("lent cache on a peer: op failed"), "{}", c.logs());
}

#[test]
fn a_peer_cut_off_the_network_stalls_the_vm_at_most_its_lease_and_costs_no_byte() {
    let (c, _pki) = borrowing_pair();
    c.net.link(1, false);
    // The first pass after the cut meets the silent peer: its ops time out after the
    // lease TTL, the region is dropped, the requests are served from the backing store.
    let first = vm0_io(&c, &["read -P 0x42 0 12M"]);
    let after = vm0_io(&c, &["read -P 0x42 0 12M", "write -P 0x45 0 1M", "read -P 0x45 0 1M"]);
    eprintln!("link cut: first 12 MiB pass {first:?} (lease TTL {TTL_MS} ms), next pass {after:?}");
    assert!(first < Duration::from_millis(TTL_MS + 3000), "the stall was {first:?}");
    // The region is closed to new blocks by the failure (`lose_lender`) or by the next
    // allocation, whichever comes first.
    assert!(c.logs().contains("lent cache on a peer: op failed"), "{}", c.logs());
    c.net.link(1, true);
    formed(&c, 2);
    vm0_io(&c, &["read -P 0x45 0 1M", "read -P 0x42 1M 11M"]);
}

/// The names of the vDisks node k serves.
fn served(c: &Cluster, k: usize) -> Vec<String> {
    let all = c.get(k, "/vdisks");
    let list = all.as_array().or(all["vdisks"].as_array()).expect("a list of vDisks").clone();
    list.iter().map(|v| v["name"].as_str().unwrap().to_string()).collect()
}

#[test]
fn two_nodes_taking_one_vdisk_at_once_one_gets_it_by_its_claim_in_etcd() {
    let mut c = Cluster::new(2);
    formed(&c, 2);
    // Two operators add one vDisk on two nodes at the same moment: each node's look at
    // the members sees it free; the claim's transaction lets one through. Each node opens
    // the backing store by a path of its own, as two hosts do (their file locks do not
    // see each other; on one machine the lock would refuse the second).
    let image = |name: &str, k: usize| {
        let f = format!("{name}-n{k}.img");
        std::fs::File::create(c.dir.path().join(&f)).unwrap().set_len(4 << 20).unwrap();
        f
    };
    for round in 0..4 {
        let name = format!("both{round}");
        let bodies: Vec<String> = (0..2).map(|k| c.vdisk_body(&name, &image(&name, k), "")).collect();
        let answers: Vec<(bool, String)> = std::thread::scope(|s| {
            let c = &c;
            let hs: Vec<_> =
                bodies.iter().enumerate().map(|(k, b)| s.spawn(move || c.try_post(k, "/vdisks", b))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let won: Vec<usize> = (0..2).filter(|&k| answers[k].0).collect();
        assert_eq!(won.len(), 1, "round {round}: exactly one node adds {name}: {answers:#?}\n{}", c.logs());
        let lost = 1 - won[0];
        assert!(
            answers[lost].1.contains("claimed by node"),
            "round {round}: the refusal names the claim: {answers:#?}"
        );
        assert!(served(&c, won[0]).contains(&name) && !served(&c, lost).contains(&name));
        // Removed there, it can be added on the other node at once (the claim is released).
        c.delete(won[0], &format!("/vdisks/{name}"));
        c.post(lost, "/vdisks", &bodies[lost]);
        let (ok, text) = c.try_post(won[0], "/vdisks", &bodies[won[0]]);
        assert!(!ok && text.contains("claimed by node"), "round {round}: {text}");
    }

    // A node starting with a vDisk in its config while another adds it at about that
    // moment (the add sent at a few points of the start): exactly one of them serves it.
    let mut s = Vec::new();
    for (round, delay_ms) in [0u64, 60, 120, 250].into_iter().enumerate() {
        let name = format!("race{round}");
        c.nodes[0].take().unwrap().term(Duration::from_secs(20));
        let cfg = c.dir.path().join("n0.toml");
        let text = std::fs::read_to_string(&cfg).unwrap();
        let vdisk = format!("[[vdisk]]\nname = \"{name}\"\nbacking = \"{}\"\n", image(&name, 0));
        std::fs::write(&cfg, text.replacen("[cluster]", &format!("{vdisk}[cluster]"), 1)).unwrap();
        let body = c.vdisk_body(&name, &image(&name, 1), "");
        let (n0, added) = std::thread::scope(|s| {
            let start = s.spawn(|| c.start(0));
            std::thread::sleep(Duration::from_millis(delay_ms));
            let add = s.spawn(|| c.try_post(1, "/vdisks", &body));
            (start.join().unwrap(), add.join().unwrap())
        });
        c.nodes[0] = Some(n0);
        s = c.wait_all("both serving", Duration::from_secs(10), |_, s| s["serving"] == true);
        let on_n0 = served(&c, 0).contains(&name);
        let on_n1 = served(&c, 1).contains(&name);
        assert!(on_n0 != on_n1, "one node serves `{name}`: n0 {on_n0}, n1 {on_n1} (n1's add: {added:?})\n{s:#?}");
        assert_eq!(on_n1, added.0, "{added:?}");
        if on_n1 {
            assert!(s[0]["moved_away"].as_array().unwrap().iter().any(|m| m["vdisk"] == name.as_str()), "{:#}", s[0]);
        }
        eprintln!(
            "the start and the add {delay_ms} ms later raced: {} got `{name}`",
            if on_n0 { "the start (n0)" } else { "the add (n1)" }
        );
    }
    for s in &s {
        assert_eq!(s["claim_conflicts"].as_array().map(Vec::len), Some(0), "{s:#}");
    }
}

/// Puts `value` at `key` (under the cluster's prefix) through etcd's JSON gateway, as
/// anyone with write access to etcd could (no lease unless `lease` is given).
fn forge(c: &Cluster, key: &str, value: &[u8]) {
    let b64 = |bytes: &[u8]| {
        let f = c.dir.path().join("forged.bin");
        std::fs::write(&f, bytes).unwrap();
        let o = std::process::Command::new("base64").args(["-w0"]).arg(&f).output().unwrap();
        String::from_utf8(o.stdout).unwrap()
    };
    let body = c.dir.path().join("forged.json");
    std::fs::write(
        &body,
        format!(
            "{{\"key\": \"{}\", \"value\": \"{}\"}}",
            b64(format!("/cachevisor/default/{key}").as_bytes()),
            b64(value)
        ),
    )
    .unwrap();
    let out = Net::command(&c.net.hub, "curl")
        .args(["-sf", "--max-time", "5", "-X", "POST", "-d"])
        .arg(format!("@{}", body.display()))
        .arg(format!("{}/v3/kv/put", c.etcd.url))
        .output()
        .unwrap();
    assert!(out.status.success(), "etcd put {key}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn forged_etcd_records_neither_wedge_the_cluster_nor_flood_the_log() {
    // a map at epoch u64::MAX (the leader wrapped to 0 and nodes kept
    // the forged map), a leader key with no lease (leaderless forever), a 1.5 MB
    // unparseable member record (logged 4 times a second per node without end).
    let c = Cluster::new(2);
    formed(&c, 2);
    forge(&c, "members/evil", &vec![b'{'; 1_500_000]);
    forge(&c, "members/liar", b"{not json");
    forge(
        &c,
        "map",
        format!("{{\"epoch\": {}, \"nodes\": {{}}, \"vdisks\": {{}}, \"lent\": []}}", u64::MAX).as_bytes(),
    );
    std::thread::sleep(Duration::from_secs(2));
    // The map is replaced by the leader from the epoch the nodes are at, never wrapped.
    let s = c.wait_all("a readable map past the forged one", Duration::from_secs(20), |_, s| {
        let e = s["map"]["epoch"].as_u64().unwrap_or(0);
        e > 0 && e < 1 << 53 && s["map"]["nodes"].as_object().is_some_and(|n| n.len() == 2)
    });
    assert!(s.iter().all(|s| s["bad_records"].as_u64().unwrap_or(0) >= 2), "{s:#?}");
    // A leader key with no lease: treated as absent, and a leader is elected again.
    let out = Net::command(&c.net.hub, "curl")
        .args(["-sf", "--max-time", "5", "-X", "POST", "-d"])
        .arg(format!(
            "{{\"key\": \"{}\"}}",
            String::from_utf8(
                std::process::Command::new("sh")
                    .args(["-c", "printf %s /cachevisor/default/leader | base64 -w0"])
                    .output()
                    .unwrap()
                    .stdout
            )
            .unwrap()
        ))
        .arg(format!("{}/v3/kv/deleterange", c.etcd.url))
        .output()
        .unwrap();
    assert!(out.status.success());
    forge(&c, "leader", b"");
    std::thread::sleep(Duration::from_secs(1));
    c.wait_all("a leader again", Duration::from_secs(20), |_, s| {
        Cluster::leader(s).is_some_and(|l| !l.is_empty()) && s["leading"].is_boolean()
    });
    c.write_and_read(0, 0, 7);
    // Each bad record logged once per node, not at every read of the keys.
    std::thread::sleep(Duration::from_secs(2));
    for k in 0..2 {
        let log = c.nodes[k].as_ref().unwrap().log();
        assert_eq!(log.matches("members/evil").count(), 1, "node {k}:\n{log}");
        assert_eq!(log.matches("members/liar").count(), 1, "node {k}:\n{log}");
    }
}
