//! `cachevisor check --metadata DIR`: after a SIGKILL it reports what the next
//! start recovers (the dirty blocks a client wrote, the backing they belong to) and
//! changes nothing; a torn journal tail is noted and harmless; a damaged checkpoint is a
//! problem (exit 1) that the start indeed refuses.

use cachevisor_testkit as common;

use common::{bin, qemu_io_ok, s, Daemon, ServeConfig};
use std::process::Command;

fn check(dir: &std::path::Path, json: bool) -> (i32, String) {
    let mut c = Command::new(bin());
    c.args(["check", "--metadata"]).arg(dir);
    if json {
        c.arg("--json");
    }
    let o = c.output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr),
    )
}

#[test]
fn check_reports_what_a_start_recovers_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ServeConfig::new("16MiB")
        .no_writeback()
        .vdisk("vm1", "vm1.img", &[("size", s("32MiB")), ("write_policy", s("wb"))])
        .vdisk("vm2", "vm2.img", &[("size", s("8MiB"))])
        .write(d, "m.toml");
    let mut a = Daemon::start(d, "m.toml", &[]).unwrap();
    qemu_io_ok(&a.uri("vm1"), &["write -P 0x21 0 4M", "flush"]);
    a.kill9();
    let meta = d.join("cache.img.meta");
    let files = |m: &std::path::Path| -> Vec<(String, Vec<u8>, std::time::SystemTime)> {
        ["checkpoint", "journal"]
            .iter()
            .map(|f| {
                let p = m.join(f);
                (f.to_string(), std::fs::read(&p).unwrap(), std::fs::metadata(&p).unwrap().modified().unwrap())
            })
            .collect()
    };
    let before = files(&meta);
    let (code, out) = check(&meta, false);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("consistent"), "{out}");
    let (code, json) = check(&meta, true);
    assert_eq!(code, 0, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let vm1 = v["vdisks"].as_array().unwrap().iter().find(|x| x["name"] == "vm1").unwrap().clone();
    assert_eq!((vm1["blocks"].as_u64(), vm1["dirty_blocks"].as_u64()), (Some(1024), Some(1024)), "{json}");
    assert!(vm1["backing"].as_str().is_some_and(|b| !b.is_empty()), "{json}");
    assert_eq!(files(&meta), before, "check changed the metadata");
    // The start recovers what check said.
    let a = Daemon::start(d, "m.toml", &[]).unwrap();
    assert!(a.banner.iter().any(|l| l.contains("1024 blocks cached (1024 dirty)")), "{:?}", a.banner);
    qemu_io_ok(&a.uri("vm1"), &["read -P 0x21 0 4M"]);
    let mut a = a;
    a.kill9();

    // A torn last record (a crash mid-append): noted, not a problem.
    let mut j = std::fs::OpenOptions::new().append(true).open(meta.join("journal")).unwrap();
    std::io::Write::write_all(&mut j, &[0x55, 0x01, 0x00]).unwrap();
    let (code, out) = check(&meta, false);
    assert!(code == 0 && out.contains("torn"), "{out}");

    // A damaged checkpoint: a problem, and the start indeed refuses.
    let ck = meta.join("checkpoint");
    let mut b = std::fs::read(&ck).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0xff;
    std::fs::write(&ck, &b).unwrap();
    let (code, out) = check(&meta, false);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("checkpoint") && out.contains("problem"), "{out}");
    let e = Daemon::start(d, "m.toml", &[]).err().expect("a start on a damaged checkpoint must be refused");
    assert!(e.output.contains("checkpoint"), "{}", e.output);

    // --repair salvages the whole records before the damage: a check passes, the start
    // recovers them, and vm1 reads its own bytes where a block survived and the backing
    // store's (zeros: the lost dirty data) elsewhere — never another block's.
    let mut c = Command::new(bin());
    let o = c.args(["check", "--repair", "--json", "--metadata"]).arg(&meta).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{text}{}", String::from_utf8_lossy(&o.stderr));
    // Two JSON documents: the repair's, then the check's after it.
    let docs: Vec<serde_json::Value> =
        serde_json::Deserializer::from_str(&text).into_iter().collect::<Result<_, _>>().unwrap();
    let (repaired, after) = (&docs[0], &docs[1]);
    assert!(after["problems"].as_array().unwrap().is_empty(), "{after}");
    let kept = repaired["slots_kept"].as_u64().unwrap();
    assert!(repaired["checkpoint_damaged"] == true && kept > 0 && kept < 1024, "{repaired}");
    assert_eq!(check(&meta, false).0, 0);
    let a = Daemon::start(d, "m.toml", &[]).unwrap();
    assert!(a.banner.iter().any(|l| l.contains(&format!("{kept} blocks cached ({kept} dirty)"))), "{:?}", a.banner);
    let img = d.join("vm1-read.raw");
    let st =
        Command::new("qemu-img").args(["convert", "-f", "raw", "-O", "raw", &a.uri("vm1")]).arg(&img).status().unwrap();
    assert!(st.success());
    let bytes = std::fs::read(&img).unwrap();
    let (mut own, mut zero) = (0u64, 0u64);
    for (i, chunk) in bytes[..4 << 20].chunks(4096).enumerate() {
        if chunk.iter().all(|&b| b == 0x21) {
            own += 1;
        } else if chunk.iter().all(|&b| b == 0) {
            zero += 1;
        } else {
            panic!("block {i} holds bytes that are neither its own nor the backing store's");
        }
    }
    assert_eq!((own, zero), (kept, 1024 - kept));

    let (code, out) = check(&d.join("nowhere"), false);
    assert!(code == 1 && out.contains("nowhere"), "{out}");
}
