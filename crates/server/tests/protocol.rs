//! Protocol robustness against the real server over TCP: malformed handshakes, unknown
//! options and commands, oversized lengths, requests past the export's end, a client
//! vanishing mid-request. Each gets the protocol's error or a closed connection; the
//! server keeps serving other clients and no stored data changes.

mod common;
use cachevisor_nbd::proto::*;
use common::*;
use std::io::Write;

fn setup() -> (tempfile::TempDir, cachevisor_server::service::Running) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "1MiB", &[("a", "4MiB", "wb"), ("b", "4MiB", "wt")]);
    let r = serve(&cfg);
    (dir, r)
}

#[test]
fn negotiation_errors_and_listing() {
    let (_d, r) = setup();
    let addr = r.tcp.unwrap();
    // Unknown client flags: the server closes.
    let mut s = greet(addr, 0x80);
    assert!(closed(&mut s));
    // Unknown option, STARTTLS, LIST, INFO of an unknown export, malformed GO: each answered.
    let mut s = greet(addr, FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    send_option(&mut s, 99, b"xyz");
    assert_eq!(read_option_reply(&mut s).unwrap().1, REP_ERR_UNSUP);
    send_option(&mut s, OPT_STARTTLS, &[]);
    assert_eq!(read_option_reply(&mut s).unwrap().1, REP_ERR_POLICY);
    send_option(&mut s, OPT_LIST, &[]);
    let mut names = Vec::new();
    loop {
        let (_, k, d) = read_option_reply(&mut s).unwrap();
        if k == REP_ACK {
            break;
        }
        assert_eq!(k, REP_SERVER);
        names.push(String::from_utf8(d[4..].to_vec()).unwrap());
    }
    assert_eq!(names, ["a", "b"]);
    send_option(&mut s, OPT_INFO, &go_data("nope"));
    assert_eq!(read_option_reply(&mut s).unwrap().1, REP_ERR_UNKNOWN);
    send_option(&mut s, OPT_GO, &[0, 0, 0, 9, b'a']);
    assert_eq!(read_option_reply(&mut s).unwrap().1, REP_ERR_INVALID);
    // INFO with a block-size request, then GO into transmission on the same connection.
    let mut d = go_data("a");
    d.truncate(d.len() - 2);
    d.extend_from_slice(&1u16.to_be_bytes());
    d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    send_option(&mut s, OPT_INFO, &d);
    let (_, k, info) = read_option_reply(&mut s).unwrap();
    assert_eq!((k, u64::from_be_bytes(info[2..10].try_into().unwrap())), (REP_INFO, 4 << 20));
    let (_, k, bs) = read_option_reply(&mut s).unwrap();
    assert_eq!((k, u16::from_be_bytes([bs[0], bs[1]])), (REP_INFO, INFO_BLOCK_SIZE));
    assert_eq!(read_option_reply(&mut s).unwrap().1, REP_ACK);
    // Oversized option data: TOO_BIG, then closed.
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&OPT_GO.to_be_bytes());
    b.extend_from_slice(&u32::MAX.to_be_bytes());
    s.write_all(&b).unwrap();
    assert_eq!(read_option_reply(&mut s).unwrap().1, REP_ERR_TOO_BIG);
    assert!(closed(&mut s));
    // EXPORT_NAME of an unknown export: closed; of a known one: size and flags.
    let mut s = greet(addr, FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    send_option(&mut s, OPT_EXPORT_NAME, b"nope");
    assert!(closed(&mut s));
    // Bad option magic: closed.
    let mut s = greet(addr, FLAG_C_FIXED_NEWSTYLE);
    s.write_all(&[0u8; 16]).unwrap();
    assert!(closed(&mut s));
    // ABORT: acknowledged.
    let mut s = greet(addr, FLAG_C_FIXED_NEWSTYLE);
    send_option(&mut s, OPT_ABORT, &[]);
    assert_eq!(read_option_reply(&mut s).unwrap().1, REP_ACK);
    // The server still serves.
    let (mut c, size) = Client::connect(addr, "b");
    assert_eq!(size, 4 << 20);
    assert_eq!(c.read(0, 4096).unwrap(), vec![0u8; 4096]);
}

#[test]
fn bad_requests_get_errors_and_change_nothing() {
    let (_d, r) = setup();
    let addr = r.tcp.unwrap();
    let (mut c, size) = Client::connect(addr, "a");
    c.write(8192, &[7u8; 8192], false).unwrap();
    // Past the end, overflowing, or unknown: EINVAL; the connection stays usable.
    assert_eq!(c.read(size - 4096, 8192), Err(EINVAL));
    assert_eq!(c.read(u64::MAX - 10, 100), Err(EINVAL));
    assert_eq!(c.write(size - 1, &[1, 2], false), Err(EINVAL));
    assert_eq!(c.read(0, MAX_PAYLOAD + 1), Err(EOVERFLOW));
    let k = c.send(77, 0, 0, 0, &[]);
    assert_eq!(c.reply().unwrap(), (EINVAL, k));
    let k = c.send(CMD_READ, 1 << 9, 0, 512, &[]);
    assert_eq!(c.reply().unwrap(), (EINVAL, k), "unknown command flag");
    // TRIM past the end or with an unknown flag: EINVAL, nothing dropped.
    let k = c.send(CMD_TRIM, 0, size - 4096, 8192, &[]);
    assert_eq!(c.reply().unwrap(), (EINVAL, k), "TRIM past the end");
    let k = c.send(CMD_TRIM, CMD_FLAG_NO_HOLE, 8192, 8192, &[]);
    assert_eq!(c.reply().unwrap(), (EINVAL, k), "TRIM with a flag it does not take");
    assert_eq!(c.read(8192, 8192).unwrap(), vec![7u8; 8192]);
    assert_eq!(c.read(size - 4096, 4096).unwrap(), vec![0u8; 4096]);
    // WRITE_ZEROES, with FUA.
    let k = c.send(CMD_WRITE_ZEROES, CMD_FLAG_FUA, 8192 + 512, 1024, &[]);
    assert_eq!(c.reply().unwrap(), (0, k));
    let got = c.read(8192, 8192).unwrap();
    assert!(
        got[..512].iter().all(|&b| b == 7)
            && got[512..1536].iter().all(|&b| b == 0)
            && got[1536..].iter().all(|&b| b == 7)
    );
    // A bad request magic closes this connection only.
    c.s.write_all(&[0u8; REQUEST_LEN]).unwrap();
    assert!(closed(&mut c.s));
    // A client that vanishes halfway through a WRITE's payload changes nothing.
    let (mut c2, _) = Client::connect(addr, "a");
    c2.s.write_all(&encode_request(&Request { flags: 0, kind: CMD_WRITE, cookie: 9, offset: 8192, length: 8192 }))
        .unwrap();
    c2.s.write_all(&[9u8; 100]).unwrap();
    drop(c2);
    // An oversized WRITE payload closes the connection with EOVERFLOW.
    let (mut c3, _) = Client::connect(addr, "a");
    let k = c3.send(CMD_WRITE, 0, 0, MAX_PAYLOAD + 1, &[]);
    assert_eq!(c3.reply().unwrap(), (EOVERFLOW, k));
    assert!(closed(&mut c3.s));
    let (mut c4, _) = Client::connect(addr, "a");
    assert_eq!(c4.read(8192, 8192).unwrap()[1600..], vec![7u8; 8192 - 1600][..]);
    assert_eq!(c4.read(8192, 512).unwrap(), vec![7u8; 512]);
    c4.send(CMD_DISC, 0, 0, 0, &[]);
    assert!(closed(&mut c4.s));
}

#[test]
fn a_missing_backing_file_fails_at_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = parse(dir.path(), &ServeConfig::new("1MiB").vdisk("a", "missing.img", &[]));
    let e = cachevisor_server::service::start(&cfg).err().unwrap().to_string();
    assert!(e.contains("missing.img") && e.contains("does not exist"), "{e}");
    // A backing URI whose host does not resolve (`.invalid` never does, RFC 6761; no port
    // means NBD's 10809, as libnbd reads it).
    let cfg = parse(dir.path(), &ServeConfig::new("1MiB").vdisk("a", "nbd://storage-host.invalid/x", &[]));
    let e = cachevisor_server::service::start(&cfg).err().unwrap().to_string();
    assert!(e.contains("nbd://storage-host.invalid/x") && e.contains("does not resolve"), "{e}");
}
