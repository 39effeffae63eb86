//! Every reader on real sample data from ../shared/traces and on malformed input.

mod common;
use cachevisor_trace::*;
use common::*;

#[test]
fn vscsi_v1_real_sample() {
    let p = shared_trace("cloudPhysicsIO.vscsi");
    assert_eq!(Format::detect(&p).unwrap(), Format::Vscsi);
    let mut s = open_trace(&p, &ReadOptions::default()).unwrap();
    let reqs = read_all(&mut *s).unwrap();
    let c = s.counts();
    assert_eq!(reqs.len() as u64 + c.ignored, 113_872);
    assert_eq!(s.vm_names(), ["cloudPhysicsIO"]);
    let r = reqs[0];
    assert_eq!((r.op, r.offset, r.len, r.time_ns), (Op::Write, 42_932_745 * 512, 512, 5_633_898_368_802_000));
}

#[test]
fn cloudphysics_csv_matches_vscsi_copy() {
    let (csv, _) = {
        let mut s = open_trace(&shared_trace("cloudPhysicsIO.csv"), &ReadOptions::default()).unwrap();
        (read_all(&mut *s).unwrap(), ())
    };
    let mut s = open_trace(&shared_trace("cloudPhysicsIO.vscsi"), &ReadOptions::default()).unwrap();
    let bin = read_all(&mut *s).unwrap();
    assert_eq!(csv.len(), bin.len());
    for (a, b) in csv.iter().zip(&bin) {
        assert_eq!((a.op, a.offset, a.len), (b.op, b.offset, b.len));
        // CSV `time` is whole seconds of the VSCSI µs timestamp.
        assert_eq!(a.time_ns, b.time_ns / 1_000_000_000 * 1_000_000_000);
    }
}

#[test]
fn mqsim_real_samples_one_vm_per_device() {
    let p = shared_trace("websearch-small.mqsim.txt");
    assert_eq!(Format::detect(&p).unwrap(), Format::Mqsim);
    let mut s = open_trace(&p, &ReadOptions::default()).unwrap();
    let reqs = read_all(&mut *s).unwrap();
    assert_eq!(reqs.len(), 24_783);
    assert_eq!(s.vm_names().len(), 6);
    assert_eq!(s.vm_names()[0], "websearch-small:0");
    assert!(reqs.iter().filter(|r| r.op == Op::Read).count() > 24_000);
    let per_file = ReadOptions { vm_mode: VmMode::File, ..Default::default() };
    let mut s = open_trace(&shared_trace("tpcc-small.mqsim.txt"), &per_file).unwrap();
    let reqs = read_all(&mut *s).unwrap();
    assert_eq!(reqs.len(), 6_999);
    assert_eq!(s.vm_names(), ["tpcc-small"]);
    assert!(reqs.iter().all(|r| r.vm == 0));
    assert_eq!((reqs[0].time_ns, reqs[0].offset, reqs[0].len), (938_513_000, 264_719_034 * 512, 16 * 512));
}

#[test]
fn msr_lines_and_vms() {
    let text = b"128166372003061629,hm,0,Write,7014912,4096,26\n128166372016382155,hm,1,Read,1074696192,4096,113\n";
    let (r, names) = read_text("hm.csv", text, &ReadOptions::default());
    let r = r.unwrap();
    assert_eq!(names, ["hm_0", "hm_1"]);
    assert_eq!(r[0].op, Op::Write);
    assert_eq!(r[1].vm, 1);
    assert_eq!(r[0].time_ns, (128166372003061629 - 116_444_736_000_000_000) * 100);
    let (r, names) = read_text("hm.csv", text, &ReadOptions { vm_mode: VmMode::File, ..Default::default() });
    assert_eq!(names, ["hm"]);
    assert!(r.unwrap().iter().all(|x| x.vm == 0));
}

#[test]
fn blkparse_keeps_one_action() {
    let text = b"  8,0    1    11   0.000120000  4211  Q   W 2048 + 8 [kworker/u8:1]
  8,0    1    12   0.000131062  4211  D   W 2048 + 8 [kworker/u8:1]
  8,0    1    13   0.000200000  4211  D   RM 4096 + 16 [cat]
  8,0    1    14   0.000300000  4211  D   N 0 + 0 [x]
  8,0    1    15   0.000400000  4211  C   W 2048 + 8 [0]
CPU1 (8,0):
 Reads Queued:           0,        0KiB\t Writes Queued:           1,        4KiB
";
    let (r, names) =
        read_text("sda.blktrace.txt", text, &ReadOptions { format: Some(Format::Blkparse), ..Default::default() });
    let r = r.unwrap();
    assert_eq!(names, ["sda.blktrace:8,0"]);
    assert_eq!(r.len(), 2);
    assert_eq!((r[0].time_ns, r[0].op, r[0].offset, r[0].len), (131_062, Op::Write, 2048 * 512, 4096));
    assert_eq!(r[1].op, Op::Read);
    let (r, _) = read_text(
        "x.txt",
        text,
        &ReadOptions { format: Some(Format::Blkparse), blkparse_action: "Q".into(), ..Default::default() },
    );
    assert_eq!(r.unwrap().len(), 1);
}

#[test]
fn generic_csv_mapping() {
    let text = b"ts\tdisk\tkind\tlba\tbytes\n10\tvda\tR\t8\t4096\n20\tvdb\tW\t16\t512\n";
    let cols: formats::generic_csv::CsvColumns = "time=0:us,vm=1,op=2,offset=3:sector,len=4,sep=tab".parse().unwrap();
    let (r, names) = read_text("g.tsv", text, &ReadOptions { csv_columns: Some(cols), ..Default::default() });
    let r = r.unwrap();
    assert_eq!(names, ["g.tsv:vda", "g.tsv:vdb"]);
    assert_eq!((r[1].time_ns, r[1].op, r[1].offset, r[1].len), (20_000, Op::Write, 8192, 512));
}

/// (file name, format, bad text, expected fragments of the error)
const MALFORMED: &[(&str, Format, &str, &[&str])] = &[
    (
        "m.csv",
        Format::Msr,
        "128166372003061629,hm,0,Write,7014912,4096,26\n128166372016382155,hm,0,Erase,1,4096,1\n",
        &["m.csv", "line 2", "`Type`", "Erase"],
    ),
    ("m.csv", Format::Msr, "128166372003061629,hm,0,Write,70x4912,4096,26\n", &["line 1", "`Offset`"]),
    ("m.csv", Format::Msr, "128166372003061629,hm,0,Write\n", &["line 1", "`Offset`", "missing"]),
    ("q.txt", Format::Mqsim, "1 0 8 8 1\n2 0 8 eight 1\n", &["q.txt", "line 2", "`size_in_sectors`"]),
    ("q.txt", Format::Mqsim, "1 0 8 8 3\n", &["line 1", "`type`"]),
    // a range whose end would wrap past 2^64.
    ("w.csv", Format::Csv, "0,0,R,18446744073709551515,4096\n", &["w.csv", "line 1", "`offset`", "2^64"]),
    ("c.csv", Format::CloudphysicsCsv, "version,time,op,size,lbn\n1,5,2a,512,zz\n", &["line 2", "`lbn`"]),
    ("b.txt", Format::Blkparse, "  8,0 1 1 0.1 4211 D W 2048 + x [k]\n", &["line 1", "`nsectors`"]),
    ("b.txt", Format::Blkparse, "  8,0 1 1 0.1x 4211 D W 2048 + 8 [k]\n", &["line 1", "`time`"]),
    ("g.csv", Format::Csv, "time_ns,vm,op,offset,len\n1,a,R,0,512\n2,a,X,0,512\n", &["line 3", "`op`"]),
];

#[test]
fn malformed_records_name_file_line_and_field() {
    for (name, format, text, want) in MALFORMED {
        let opts = ReadOptions { format: Some(*format), ..Default::default() };
        let (r, _) = read_text(name, text.as_bytes(), &opts);
        let msg = r.expect_err(text).to_string();
        for w in *want {
            assert!(msg.contains(w), "{format}: `{msg}` lacks `{w}`");
        }
        // With skip-bad the same input reads and the bad record is counted.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        let mut s = open_trace(&p, &ReadOptions { skip_bad: true, ..opts }).unwrap();
        read_all(&mut *s).unwrap();
        assert_eq!(s.counts().skipped_bad, 1, "{format}");
    }
}

#[test]
fn malformed_binary_names_byte_offset() {
    let mut bytes = std::fs::read(shared_trace("cloudPhysicsIO.vscsi")).unwrap();
    bytes.truncate(32 * 3);
    bytes[32 * 2 + 15] = 7; // record 2 claims version 7
    let (r, _) = read_text("x.vscsi", &bytes, &ReadOptions::default());
    let msg = r.unwrap_err().to_string();
    assert!(msg.contains("byte offset 64 (record 2)") && msg.contains("`ver`"), "{msg}");
    bytes.truncate(32 * 2 + 10);
    let (r, _) = read_text("x.vscsi", &bytes, &ReadOptions::default());
    let msg = r.unwrap_err().to_string();
    assert!(msg.contains("truncated") && msg.contains("byte offset 64"), "{msg}");
}

#[test]
fn compressed_inputs_read_transparently() {
    use std::io::Write;
    let raw = std::fs::read(shared_trace("tpcc-small.mqsim.txt")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gz = dir.path().join("tpcc.mqsim.txt.gz");
    let mut e = flate2::write::GzEncoder::new(std::fs::File::create(&gz).unwrap(), flate2::Compression::fast());
    e.write_all(&raw).unwrap();
    e.finish().unwrap();
    let zst = dir.path().join("tpcc.mqsim.txt.zst");
    std::fs::write(&zst, zstd::encode_all(&raw[..], 3).unwrap()).unwrap();
    let mut plain = open_trace(&shared_trace("tpcc-small.mqsim.txt"), &ReadOptions::default()).unwrap();
    let want = read_all(&mut *plain).unwrap();
    for p in [gz, zst] {
        let mut s = open_trace(&p, &ReadOptions::default()).unwrap();
        assert_eq!(read_all(&mut *s).unwrap(), want, "{}", p.display());
    }
}

#[test]
fn merge_orders_by_time_and_names_vms() {
    let opts = ReadOptions { vm_mode: VmMode::File, ..Default::default() };
    let paths = [shared_trace("tpcc-small.mqsim.txt"), shared_trace("websearch-small.mqsim.txt")];
    let mut rename = std::collections::HashMap::new();
    rename.insert("tpcc-small".to_string(), "db".to_string());
    let m = MergedTrace::open(&paths, &opts, MergeOptions { rebase: true, rename }).unwrap();
    let mut last = 0;
    let mut n = [0u64; 2];
    let mut m = m;
    while let Some(r) = m.next_request().unwrap() {
        assert!(r.time_ns >= last);
        last = r.time_ns;
        n[r.vm as usize] += 1;
    }
    assert_eq!(m.vm_names(), ["db", "websearch-small"]);
    assert_eq!(n, [6_999, 24_783]);
}

#[test]
fn batches_equal_single_reads() {
    for name in ["cloudPhysicsIO.vscsi", "tpcc-small.mqsim.txt"] {
        let mut a = open_trace(&shared_trace(name), &ReadOptions::default()).unwrap();
        let one = read_all(&mut *a).unwrap();
        let mut b = open_trace(&shared_trace(name), &ReadOptions::default()).unwrap();
        let mut batched = Vec::new();
        while b.next_batch(&mut batched, 777).unwrap() > 0 {}
        assert_eq!(one, batched, "{name}");
        assert_eq!(a.counts(), b.counts(), "{name}");
    }
}

#[test]
fn an_oracle_general_file_is_recognized_without_its_name_and_vscsi_is_not_taken_for_one() {
    // `trace info` did not recognize `trace zipf`'s own output.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("zipf.bin");
    let mut src = cachevisor_trace::zipf::ZipfSource::new(500, 100, 1.0, 4096, 1).unwrap();
    let out = Box::new(std::io::BufWriter::new(std::fs::File::create(&p).unwrap()));
    let mut w = TraceWriter::new(Format::OracleGeneral, out, 4096).unwrap();
    while let Some(r) = src.next_request().unwrap() {
        w.write(&r, "vm0").unwrap();
    }
    w.finish().unwrap();
    assert_eq!(Format::detect(&p).unwrap(), Format::OracleGeneral);
    assert_eq!(Format::detect(&shared_trace("cloudPhysicsIO.vscsi")).unwrap(), Format::Vscsi);
    let noise = dir.path().join("noise.bin");
    std::fs::write(&noise, [0u8; 160]).unwrap(); // binary, objects of 0 bytes
    assert!(Format::detect(&noise).unwrap_err().to_string().contains("neither VSCSI nor oracleGeneral"));
}
