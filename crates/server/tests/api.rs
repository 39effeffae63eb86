//! The HTTP API: listing, Prometheus metrics, and mutating calls that need the token.

mod common;
use common::*;

fn api_cfg(dir: &std::path::Path) -> cachevisor_server::Config {
    let mut c = config(dir, "1MiB", &[("a", "4MiB", "wb"), ("b", "4MiB", "wt")]);
    c.api = Some(cachevisor_server::config::ApiConfig { listen: "127.0.0.1:0".into(), token: None });
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
    let m = ureq::get(&format!("http://{api}/metrics")).call().unwrap().into_string().unwrap();
    for needle in ["cachevisor_block_hits_total{vdisk=\"a\"} 16", "cachevisor_dirty_blocks{vdisk=\"a\"} 16", "cachevisor_request_duration_seconds_count{vdisk=\"a\",op=\"read\"} 16"] {
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
    assert_eq!((job["done_blocks"].as_u64(), job["total_blocks"].as_u64(), job["vdisk"].as_str()), (Some(16), Some(16), Some("a")), "{job}");
    assert_eq!(r.daemon.occupancy(0).1, 0);
    let m = ureq::get(&format!("http://{api}/metrics")).call().unwrap().into_string().unwrap();
    for needle in ["cachevisor_destaged_blocks_total 16", "cachevisor_destage_job_done_blocks 16", "cachevisor_destage_job_running 0"] {
        assert!(m.contains(needle), "metrics lack `{needle}`:\n{m}");
    }
    ureq::post(&format!("http://{api}/vdisks/a/resize")).set("Authorization", &auth).send_json(serde_json::json!({"size": "32KiB"})).unwrap();
    assert!(r.daemon.occupancy(0).0 <= 8);
    ureq::post(&format!("http://{api}/vdisks/b/write-policy")).set("Authorization", &auth).send_json(serde_json::json!({"policy": "ro"})).unwrap();
    assert_eq!(r.daemon.status()[1].write_policy, cachevisor_engine::WritePolicy::Ro);
    // Bad input is a clear 4xx.
    let e = ureq::post(&format!("http://{api}/vdisks/b/write-policy")).set("Authorization", &auth).send_json(serde_json::json!({"policy": "fast"})).unwrap_err();
    assert!(matches!(e, ureq::Error::Status(400, _)));
    let e = ureq::post(&format!("http://{api}/vdisks/zz/destage")).set("Authorization", &auth).call().unwrap_err();
    assert!(matches!(e, ureq::Error::Status(404, _)));
    // Data is intact after all that.
    assert_eq!(c.read(0, 4096).unwrap(), vec![3; 4096]);
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
