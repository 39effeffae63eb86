//! The HTTP API: listing, Prometheus metrics, and mutating calls that need the token.

mod common;
use common::*;

fn api_cfg(dir: &std::path::Path) -> cachevisor_server::Config {
    let mut c = config(dir, "1MiB", &[("a", "4MiB", "wb"), ("b", "4MiB", "wt")]);
    c.api = Some(cachevisor_server::config::ApiConfig::on("127.0.0.1:0"));
    c
}

#[test]
fn list_metrics_and_authorized_changes() {
    let dir = tempfile::tempdir().unwrap();
    let r = serve(&api_cfg(dir.path()));
    let (api, token) = r.api.clone().unwrap();
    assert_eq!(std::fs::read_to_string(dir.path().join("cache.img.meta/api-token")).unwrap(), token);
    let (mut c, _) = Client::connect(r.tcp.unwrap(), "a");
    for i in 0..16u64 {
        c.write(i * 4096, &[3; 4096], false).unwrap();
        c.read(i * 4096, 4096).unwrap();
    }
    let list: serde_json::Value = ureq::get(&format!("http://{api}/vdisks")).call().unwrap().into_json().unwrap();
    assert_eq!(list[0]["name"], "a");
    assert_eq!(list[0]["dirty_blocks"], 16);
    assert_eq!(list[0]["stats"]["hit_blocks"], 16);
    // A request's latency is recorded once its reply is written, so the client can see
    // its last reply a moment before the histogram counts it: wait for the count.
    let scrape = || ureq::get(&format!("http://{api}/metrics")).call().unwrap().into_string().unwrap();
    let t = std::time::Instant::now();
    let mut m = scrape();
    while !m.contains("cachevisor_request_duration_seconds_count{vdisk=\"a\",op=\"read\"} 16")
        && t.elapsed() < std::time::Duration::from_secs(5)
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
        m = scrape();
    }
    for needle in [
        "cachevisor_block_hits_total{vdisk=\"a\",op=\"read\"} 16",
        "cachevisor_block_misses_total{vdisk=\"a\",op=\"read\"} 0",
        "cachevisor_block_misses_total{vdisk=\"a\",op=\"write\"} 16",
        "cachevisor_bytes_total{vdisk=\"a\",op=\"write\"} 65536",
        "cachevisor_dirty_blocks{vdisk=\"a\"} 16",
        "cachevisor_written_back_ahead_blocks_total{vdisk=\"a\"} 0",
        "cachevisor_inserted_blocks_total{vdisk=\"a\"} 16",
        "cachevisor_bypassed_blocks_total{vdisk=\"a\"} 0",
        "cachevisor_request_duration_seconds_count{vdisk=\"a\",op=\"read\"} 16",
        // 16 misses into a cache with free slots to spare: none waited for a commit.
        "cachevisor_slot_waits_total 0",
    ] {
        assert!(m.contains(needle), "metrics lack `{needle}`:\n{m}");
    }
    // Without the token: refused, nothing changes.
    let e = ureq::post(&format!("http://{api}/vdisks/a/destage")).call().unwrap_err();
    assert!(matches!(e, ureq::Error::Status(401, _)));
    assert_eq!(r.daemon.occupancy(0).1, 16);
    let auth = format!("Bearer {token}");
    let started = ureq::post(&format!("http://{api}/vdisks/a/destage")).set("Authorization", &auth).call().unwrap();
    assert_eq!(started.status(), 202);
    let job = wait_for_destage(&api);
    assert_eq!(
        (job["done_blocks"].as_u64(), job["total_blocks"].as_u64(), job["vdisk"].as_str()),
        (Some(16), Some(16), Some("a")),
        "{job}"
    );
    assert_eq!(r.daemon.occupancy(0).1, 0);
    let m = ureq::get(&format!("http://{api}/metrics")).call().unwrap().into_string().unwrap();
    for needle in [
        "cachevisor_destaged_blocks_total 16",
        "cachevisor_destage_job_done_blocks 16",
        "cachevisor_destage_job_running 0",
    ] {
        assert!(m.contains(needle), "metrics lack `{needle}`:\n{m}");
    }
    ureq::post(&format!("http://{api}/vdisks/a/resize"))
        .set("Authorization", &auth)
        .send_json(serde_json::json!({"size": "32KiB"}))
        .unwrap();
    assert!(r.daemon.occupancy(0).0 <= 8);
    ureq::post(&format!("http://{api}/vdisks/b/write-policy"))
        .set("Authorization", &auth)
        .send_json(serde_json::json!({"policy": "ro"}))
        .unwrap();
    assert_eq!(r.daemon.status()[1].write_policy, cachevisor_engine::WritePolicy::Ro);
    // Bad input is a clear 4xx.
    let e = ureq::post(&format!("http://{api}/vdisks/b/write-policy"))
        .set("Authorization", &auth)
        .send_json(serde_json::json!({"policy": "fast"}))
        .unwrap_err();
    assert!(matches!(e, ureq::Error::Status(400, _)));
    let e = ureq::post(&format!("http://{api}/vdisks/zz/destage")).set("Authorization", &auth).call().unwrap_err();
    assert!(matches!(e, ureq::Error::Status(404, _)));
    // Data is intact after all that.
    assert_eq!(c.read(0, 4096).unwrap(), vec![3; 4096]);
    // What the API set survives a restart (the config file is not rewritten): the write
    // policy and the target; then an allocator switch, which replaces saved targets.
    drop((c, r));
    let r = serve(&api_cfg(dir.path()));
    let st = r.daemon.status();
    assert_eq!((st[0].target_blocks, st[1].write_policy), (8, cachevisor_engine::WritePolicy::Ro), "{st:?}");
    let (api, token) = r.api.clone().unwrap();
    let auth = format!("Bearer {token}");
    ureq::post(&format!("http://{api}/allocator"))
        .set("Authorization", &auth)
        .send_json(serde_json::json!({"name": "symflex-weighted", "params": {}}))
        .unwrap();
    drop(r);
    let r = serve(&api_cfg(dir.path()));
    assert_eq!(r.daemon.allocator_name(), "symflex-weighted");
    assert_eq!(r.daemon.status()[1].write_policy, cachevisor_engine::WritePolicy::Ro);
    assert!(!std::fs::read_to_string(dir.path().join("cache.img.meta/vdisks.toml")).unwrap().contains("target_blocks"));
}

/// Polls `GET /destage` until the job has ended; returns its last progress.
fn wait_for_destage(api: &std::net::SocketAddr) -> serde_json::Value {
    for _ in 0..600 {
        let p: serde_json::Value = ureq::get(&format!("http://{api}/destage")).call().unwrap().into_json().unwrap();
        if p["running"] == false {
            assert!(p["error"].is_null(), "{p}");
            return p;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("the destage job did not end within 30 s");
}

#[test]
fn vdisks_are_added_and_removed_online_and_that_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = api_cfg(dir.path());
    let r = serve(&cfg);
    let (api, token) = r.api.clone().unwrap();
    let auth = format!("Bearer {token}");
    let url = format!("http://{api}/vdisks");
    let c_img = dir.path().join("c.img");
    let add = serde_json::json!({"name": "c", "backing": c_img, "size": "4MiB", "write_policy": "wb"});
    // Refused without the token; bad bodies are 400 naming the problem; nothing changes.
    assert!(matches!(ureq::post(&url).send_json(add.clone()).unwrap_err(), ureq::Error::Status(401, _)));
    for (body, needle) in [
        (serde_json::json!({"name": "c", "backing": c_img, "size": "4MiB", "speed": 1}), "speed"),
        (serde_json::json!({"name": "c", "backing": dir.path().join("nope.img")}), "does not exist"),
        (serde_json::json!({"name": "c", "backing": c_img, "size": "4MiB", "weight": -1}), "weight"),
    ] {
        match ureq::post(&url).set("Authorization", &auth).send_json(body).unwrap_err() {
            ureq::Error::Status(400, resp) => {
                let text = resp.into_string().unwrap();
                assert!(text.contains(needle), "{text}");
            }
            e => panic!("{e}"),
        }
    }
    assert!(matches!(
        ureq::post(&url)
            .set("Authorization", &auth)
            .send_json(serde_json::json!({"name": "a", "backing": c_img, "size": "4MiB"}))
            .unwrap_err(),
        ureq::Error::Status(409, _)
    ));
    assert_eq!(r.daemon.exports().len(), 2);
    let resp = ureq::post(&url).set("Authorization", &auth).send_json(add).unwrap();
    assert_eq!(resp.status(), 201);
    let list: serde_json::Value = resp.into_json().unwrap();
    assert_eq!(list.as_array().unwrap().len(), 3);
    // The allocator re-divided the cache at once (static: a third each).
    let targets: Vec<u64> = list.as_array().unwrap().iter().map(|v| v["target_blocks"].as_u64().unwrap()).collect();
    assert!(targets.iter().all(|&t| (85..=86).contains(&t)), "{targets:?}");
    let (mut c, size) = Client::connect(r.tcp.unwrap(), "c");
    assert_eq!(size, 4 << 20);
    for i in 0..16u64 {
        c.write(i * 4096, &[i as u8 + 40; 4096], false).unwrap();
    }
    c.flush().unwrap();
    assert_eq!(r.daemon.occupancy(2).1, 16);
    // Remove `a` while a client is connected to it and it holds dirty blocks.
    let (mut a, _) = Client::connect(r.tcp.unwrap(), "a");
    for i in 0..8u64 {
        a.write(i * 4096, &[i as u8 + 7; 4096], false).unwrap();
    }
    assert!(matches!(ureq::delete(&format!("{url}/a")).call().unwrap_err(), ureq::Error::Status(401, _)));
    let list: serde_json::Value =
        ureq::delete(&format!("{url}/a")).set("Authorization", &auth).call().unwrap().into_json().unwrap();
    let names: Vec<&str> = list.as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["b", "c"]);
    let targets: Vec<u64> = list.as_array().unwrap().iter().map(|v| v["target_blocks"].as_u64().unwrap()).collect();
    assert_eq!(targets, [128, 128], "the others share the cache at once");
    assert_eq!(a.read(0, 4096), Err(cachevisor_nbd::proto::ESHUTDOWN));
    assert!(closed(&mut a.s));
    let a_img = std::fs::read(dir.path().join("a.img")).unwrap();
    for i in 0..8usize {
        assert!(
            a_img[i * 4096..(i + 1) * 4096].iter().all(|&x| x == i as u8 + 7),
            "block {i} written back before the removal"
        );
    }
    assert!(cachevisor_nbd::client::Client::connect(r.tcp.unwrap(), "a").is_err(), "no longer offered");
    assert!(matches!(
        ureq::delete(&format!("{url}/a")).set("Authorization", &auth).call().unwrap_err(),
        ureq::Error::Status(404, _)
    ));
    ureq::delete(&format!("{url}/b")).set("Authorization", &auth).call().unwrap();
    match ureq::delete(&format!("{url}/c")).set("Authorization", &auth).call().unwrap_err() {
        ureq::Error::Status(409, resp) => assert!(resp.into_string().unwrap().contains("last vDisk")),
        e => panic!("{e}"),
    }
    drop((c, r));
    // A restart with the same config file serves what the API left: `c` (warm, dirty data
    // intact), not `a` or `b`, whose backing files may be gone.
    std::fs::remove_file(dir.path().join("a.img")).unwrap();
    std::fs::remove_file(dir.path().join("b.img")).unwrap();
    let r = serve(&cfg);
    let names: Vec<String> = r.daemon.exports().into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["c"]);
    let (mut c, _) = Client::connect(r.tcp.unwrap(), "c");
    for i in 0..16u64 {
        assert_eq!(c.read(i * 4096, 4096).unwrap(), vec![i as u8 + 40; 4096]);
    }
    assert_eq!(r.daemon.stats(0).hit_blocks, 16, "warm after the restart");
}

/// `POST` of `body` to `url` with `token` (if any): the status and the body.
fn post(url: &str, token: Option<&str>, body: serde_json::Value) -> (u16, String) {
    let mut r = ureq::post(url);
    if let Some(t) = token {
        r = r.set("Authorization", &format!("Bearer {t}"));
    }
    match r.send_json(body) {
        Ok(x) => (x.status(), x.into_string().unwrap()),
        Err(ureq::Error::Status(c, x)) => (c, x.into_string().unwrap()),
        Err(e) => panic!("{url}: {e}"),
    }
}

/// A vDisk's row of `GET /vdisks`.
fn row(api: &std::net::SocketAddr, name: &str) -> serde_json::Value {
    let list: serde_json::Value = ureq::get(&format!("http://{api}/vdisks")).call().unwrap().into_json().unwrap();
    list.as_array().unwrap().iter().find(|v| v["name"] == name).cloned().unwrap()
}

/// SymFlex's phases live — a vDisk's weight (or ratio) set through the API
/// re-divides the cache at once (the static allocator), survives a restart, and bad values
/// change nothing.
#[test]
fn weights_set_through_the_api_redivide_the_cache_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = api_cfg(dir.path());
    let r = serve(&cfg);
    let (api, token) = r.api.clone().unwrap();
    let url = format!("http://{api}/vdisks/a/share");
    assert_eq!(
        (row(&api, "a")["target_blocks"].as_u64(), row(&api, "b")["target_blocks"].as_u64()),
        (Some(128), Some(128))
    );
    assert_eq!(post(&url, None, serde_json::json!({"weight": 3.0})).0, 401);
    for bad in [
        serde_json::json!({"weight": 0.0}),
        serde_json::json!({"ratio": -1.0}),
        serde_json::json!({"weight": 1e308}),
        serde_json::json!({"ratio": 1000001.0}),
        serde_json::json!({}),
    ] {
        let (code, body) = post(&url, Some(&token), bad.clone());
        assert_eq!(code, 400, "{bad}: {body}");
    }
    assert_eq!(post(&url, Some(&token), serde_json::json!({"weight": 3.0, "speed": 1})).0 / 100, 4, "unknown keys");
    assert_eq!(row(&api, "a")["weight"], 1.0, "refused changes change nothing");
    let (code, body) = post(&url, Some(&token), serde_json::json!({"weight": 3.0}));
    assert_eq!(code, 200, "{body}");
    let (a, b) = (row(&api, "a"), row(&api, "b"));
    assert_eq!(
        (a["weight"].as_f64(), a["target_blocks"].as_u64(), b["target_blocks"].as_u64()),
        (Some(3.0), Some(192), Some(64))
    );
    assert_eq!(post(&format!("http://{api}/vdisks/b/share"), Some(&token), serde_json::json!({"ratio": 2.5})).0, 200);
    drop(r);
    let r = serve(&cfg);
    let api = r.api.clone().unwrap().0;
    let (a, b) = (row(&api, "a"), row(&api, "b"));
    assert_eq!((a["weight"].as_f64(), a["target_blocks"].as_u64()), (Some(3.0), Some(192)), "after a restart: {a}");
    assert_eq!((b["ratio"].as_f64(), b["weight"].as_f64()), (Some(2.5), Some(1.0)), "{b}");
}

/// `cache.partition = "shared"` serves every vDisk from one pool (the
/// unmanaged baseline the simulator has): one vDisk may fill the cache, and what has no
/// meaning there (targets, the allocator) is refused with the reason.
#[test]
fn a_shared_cache_lets_one_vdisk_fill_it_and_refuses_targets() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = api_cfg(dir.path());
    cfg.cache.partition = cachevisor_engine::PartitionMode::Shared;
    let r = serve(&cfg);
    let (api, token) = r.api.clone().unwrap();
    let (mut c, _) = Client::connect(r.tcp.unwrap(), "a");
    for i in 0..240u64 {
        c.write(i * 4096, &[(i % 200) as u8 + 1; 4096], false).unwrap();
    }
    c.flush().unwrap();
    let used = row(&api, "a")["used_blocks"].as_u64().unwrap();
    assert!(used > 200, "one vDisk holds most of a shared 256-block cache: {used}");
    for i in 0..240u64 {
        assert_eq!(c.read(i * 4096, 4096).unwrap(), vec![(i % 200) as u8 + 1; 4096], "block {i}");
    }
    let (code, body) = post(&format!("http://{api}/vdisks/a/resize"), Some(&token), serde_json::json!({"blocks": 10}));
    assert!(code == 400 && body.contains("shared pool"), "{code} {body}");
    let (code, body) = post(&format!("http://{api}/allocator"), Some(&token), serde_json::json!({"name": "optimal"}));
    assert!(code == 400 && body.contains("shared"), "{code} {body}");
    assert_eq!(row(&api, "a")["used_blocks"].as_u64(), Some(used), "refusals change nothing");
}

/// A generated API token goes to `METADATA/api-token`, readable by the daemon's user only;
/// an existing token file others can read refuses the start (creating keeps a file's
/// mode), naming the `chmod`, and is left as it was.
#[test]
fn the_token_file_is_private_and_a_readable_one_refuses_the_start() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let r = serve(&api_cfg(dir.path()));
    let file = dir.path().join("cache.img.meta/api-token");
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    r.daemon.shutdown().unwrap();
    drop(r);
    std::fs::write(&file, "old").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = match cachevisor_server::service::start(&api_cfg(dir.path())) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("started with a token file others can read"),
    };
    assert!(e.contains("api-token has mode 0644") && e.contains("chmod 600"), "{e}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "old", "left as it was");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let r = serve(&api_cfg(dir.path()));
    assert_ne!(std::fs::read_to_string(&file).unwrap(), "old", "a new token");
    drop(r);
}
