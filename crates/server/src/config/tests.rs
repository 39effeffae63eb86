//! The configuration's checks: every key of the reference parses, and each bad value is
//! refused with a message naming it.

use super::*;
use cachevisor_engine::ReplacementKind;

#[test]
fn max_size_is_checked_where_it_enters() {
    let base = "[cache]\npath = \"c.img\"\nsize = \"64MiB\"\n{}[listen]\ntcp = \"127.0.0.1:1\"\n[[vdisk]]\nname = \"a\"\nbacking = \"a.img\"\nsize = \"1MiB\"\n";
    let r = |extra: &str| Config::parse(&base.replace("{}", extra), "t", Path::new("/srv")).and_then(|c| c.resolve());
    assert_eq!(r("").unwrap().max_slots, 16384, "default: the size");
    assert_eq!(r("max_size = \"64MiB\"\n").unwrap().max_slots, 16384, "equal to the size");
    assert_eq!(r("max_size = \"1GiB\"\n").unwrap().max_slots, 262144);
    for (bad, why) in [
        ("max_size = \"0\"\n", "at least cache.size"),
        ("max_size = \"32MiB\"\n", "at least cache.size"),
        ("max_size = \"65537KiB\"\n", "multiple of block_size"),
        ("max_size = \"99999999999EiB\"\n", "cache.max_size"),
        ("max_size = \"lots\"\n", "cache.max_size"),
    ] {
        let e = r(bad).unwrap_err();
        assert!(e.contains("cache.max_size") && e.contains(why), "{bad}: {e}");
    }
    // Past what an engine can lay out (slot ids are 32-bit): refused, not wrapped.
    let e = r("max_size = \"64TiB\"\n").unwrap_err();
    assert!(e.contains("cache.max_size"), "{e}");
}

#[test]
fn seal_after_is_0_or_1s_to_1h() {
    let base = "[cache]\npath = \"c.img\"\nsize = \"64MiB\"\n{}[listen]\ntcp = \"127.0.0.1:1\"\n[[vdisk]]\nname = \"a\"\nbacking = \"a.img\"\nsize = \"1MiB\"\n";
    let r = |extra: &str| Config::parse(&base.replace("{}", extra), "t", Path::new("/srv")).and_then(|c| c.resolve());
    assert_eq!(r("").unwrap().seal_after_ns, 30_000_000_000, "default 30 s");
    assert_eq!(r("seal_after = \"0s\"\n").unwrap().seal_after_ns, 0, "never");
    assert_eq!(r("seal_after = \"1h\"\n").unwrap().seal_after_ns, 3_600_000_000_000);
    for bad in ["500ms", "61min", "soon", "-1s"] {
        let e = r(&format!("seal_after = \"{bad}\"\n")).unwrap_err();
        assert!(e.starts_with("cache.seal_after"), "{bad}: {e}");
    }
}

#[test]
fn the_reference_lists_every_setting_and_parses() {
    let text = default_with_reference();
    let reference: String = text
        .lines()
        .skip_while(|l| !l.starts_with("# Every setting"))
        .skip(1)
        .map(|l| l.strip_prefix("# ").unwrap_or("").to_string() + "\n")
        .collect();
    let c = Config::parse(&reference, "reference", Path::new("/tmp")).unwrap();
    c.resolve().unwrap();
    assert_eq!(c.vdisk.len(), 1);
    // Every key of every section is shown (serde would refuse an unknown one).
    let keys = |t: &str| {
        t.lines()
            .filter_map(|l| l.split_once(" =").map(|(k, _)| k.trim().to_string()))
            .filter(|k| !k.starts_with('['))
            .collect::<Vec<_>>()
    };
    let shown = keys(&reference);
    let full = toml::to_string(&c).unwrap();
    for k in keys(&full) {
        assert!(shown.contains(&k), "`{k}` is not in the reference");
    }
    for k in ["params", "metadata", "unix", "token", "min", "sequential_cutoff", "write_policy", "grow"] {
        assert!(shown.iter().any(|s| s == k), "{k}");
    }
}

#[test]
fn the_default_parses_and_errors_name_the_key() {
    let c = Config::parse(DEFAULT, "default", Path::new("/tmp/x")).unwrap();
    assert_eq!(c.vdisk.len(), 2);
    assert_eq!(c.resolve().unwrap().slots, 65536);
    let bad = DEFAULT.replace("size = \"256MiB\"", "size = \"256 potatoes\"");
    assert!(Config::parse(&bad, "x", Path::new(".")).unwrap().resolve().unwrap_err().starts_with("cache.size"));
    let bad = DEFAULT.replace("127.0.0.1:10809", "localhost");
    assert!(Config::parse(&bad, "x", Path::new(".")).unwrap().resolve().unwrap_err().starts_with("listen.tcp"));
    let bad = DEFAULT.replace("name = \"vm2\"", "name = \"vm1\"");
    assert!(Config::parse(&bad, "x", Path::new(".")).unwrap().resolve().unwrap_err().contains("used twice"));
    let e = Config::parse(&DEFAULT.replace("[listen]", "[listen]\nport = 1"), "cfg.toml", Path::new(".")).unwrap_err();
    assert!(e.contains("cfg.toml") && e.contains("port"), "{e}");
    for (from, to, key) in [
        ("write_policy = \"wt\"", "write_policy = \"wt\"\ninterval = \"often\"", "cache.interval"),
        ("write_policy = \"wt\"", "write_policy = \"wt\"\nflush_rate = \"fast\"", "cache.flush_rate"),
        ("write_policy = \"wt\"", "write_policy = \"wt\"\nwriteback_percent = 150", "cache.writeback_percent"),
        ("write_policy = \"wt\"", "write_policy = \"wt\"\nwriteback_ahead = 5000", "cache.writeback_ahead"),
        (
            "write_policy = \"wt\"",
            "write_policy = \"wt\"\nallocator = \"s-cave\"\nreplacement = \"lru\"",
            "cache.replacement",
        ),
        ("127.0.0.1:10810", "localhost:10810", "api.listen"),
        ("listen = \"127.0.0.1:10810\"", "listen = \"127.0.0.1:10810\"\ntoken = \"short\"", "api.token"),
        ("[listen]", "[listen]\npoll = \"2ms\"", "listen.poll"),
        ("[listen]", "[listen]\npoll = \"soon\"", "listen.poll"),
        ("name = \"vm1\"", "name = \"vm1\"\nratio = 0.0", "vdisk[0] (vm1).ratio"),
        ("name = \"vm1\"", "name = \"vm1\"\nmin = \"x\"", "vdisk[0] (vm1).min"),
        ("name = \"vm1\"", "name = \"vm1\"\nsequential_cutoff = \"x\"", "vdisk[0] (vm1).sequential_cutoff"),
        // every key has a range.
        ("write_policy = \"wt\"", "write_policy = \"wt\"\nerror_threshold = 0", "cache.error_threshold"),
        ("size = \"256MiB\"\nblock_size = \"4KiB\"", "size = \"10001KiB\"\nblock_size = \"8KiB\"", "cache.size"),
        ("name = \"vm1\"", "name = \"vm1\"\nmin = \"512MiB\"", "vdisk[0] (vm1).min"),
        ("write_policy = \"wb\"", "write_policy = \"wb\"\nmin = \"200MiB\"\n[[vdisk]]\nname = \"vm3\"\nbacking = \"var/vm3.img\"\nsize = \"1GiB\"\nmin = \"100MiB\"", "vdisk.min"),
        ("size = \"1GiB\"", "size = \"16778241B\"", "vdisk[0] (vm1).size"),
        ("listen = \"127.0.0.1:10810\"", "listen = \"127.0.0.1:10810\"\ntoken = \"                \"", "api.token"),
        ("listen = \"127.0.0.1:10810\"", "listen = \"127.0.0.1:10810\"\ntoken = \"0123456789\\nabcdefgh\"", "api.token"),
        ("[listen]", "[listen]\nmax_connections = 0", "listen.max_connections"),
        ("name = \"vm1\"", "name = \"vm1\"\nweight = 1000000.5", "vdisk[0] (vm1).weight"),
        ("name = \"vm1\"", "name = \"vm1\"\nratio = 1e308", "vdisk[0] (vm1).ratio"),
        ("[listen]", "[listen]\nmax_connections = 65537", "listen.max_connections"),
        ("write_policy = \"wt\"", "write_policy = \"wt\"\nerror_threshold = 1000001", "cache.error_threshold"),
        ("[[vdisk]]", "[prewarm]\nsnapshots_kept = 10001\n[[vdisk]]", "prewarm.snapshots_kept"),
        (
            "[[vdisk]]",
            "[cluster]\nname = \"a\"\naddress = \"10.0.0.1:1\"\netcd = [\"http://10.0.0.9:2379\"]\nlease_ttl = \"1s\"\n[[vdisk]]",
            "cluster.lease_ttl",
        ),
        ("[[vdisk]]", "[cluster]\nname = \"a\"\naddress = \"here\"\netcd = [\"http://h:1\"]\n[[vdisk]]", "cluster.address"),
        (
            "[[vdisk]]",
            "[cluster]\nname = \"a\"\naddress = \"10.0.0.1:1\"\netcd = [\"http://h:1\"]\nlend = \"1MiB\"\n[[vdisk]]",
            "cluster.lend",
        ),
        ("[[vdisk]]", "[prewarm]\nmax_read = \"65MiB\"\n[[vdisk]]", "prewarm.max_read"),
        ("size = \"1GiB\"", "size = \"0B\"", "vdisk[0] (vm1).size"),
        ("[listen]", "[listen]\nhandshake_timeout = \"1ms\"", "listen.handshake_timeout"),
        ("[listen]", "[listen]\nhandshake_timeout = \"1h\"", "listen.handshake_timeout"),
        ("[[vdisk]]", "[prewarm]\nmax_read = \"1TiB\"\n[[vdisk]]", "prewarm.max_read"),
        ("[[vdisk]]", "[prewarm]\nsnapshots_kept = 0\n[[vdisk]]", "prewarm.snapshots_kept"),
        ("listen = \"127.0.0.1:10810\"", "listen = \"127.0.0.1:10810\"\nidle_timeout = \"999ms\"", "api.idle_timeout"),
        ("listen = \"127.0.0.1:10810\"", "listen = \"127.0.0.1:10810\"\nidle_timeout = \"61min\"", "api.idle_timeout"),
    ] {
        let bad = DEFAULT.replacen(from, to, 1);
        let e = Config::parse(&bad, "x", Path::new(".")).unwrap().resolve().unwrap_err();
        assert!(e.starts_with(key), "{key}: {e}");
    }
    // Each range's ends are accepted.
    for (from, to) in [
        ("[listen]", "[listen]\nmax_connections = 1\nhandshake_timeout = \"100ms\""),
        ("[listen]", "[listen]\nmax_connections = 65536\nhandshake_timeout = \"10min\""),
        ("write_policy = \"wt\"", "write_policy = \"wt\"\nerror_threshold = 1000000"),
        ("write_policy = \"wt\"", "write_policy = \"wt\"\nerror_threshold = 1"),
        ("[[vdisk]]", "[prewarm]\nsnapshots_kept = 10000\nmax_read = \"64MiB\"\n[[vdisk]]"),
        ("name = \"vm1\"", "name = \"vm1\"\nmin = \"256MiB\""),
        ("size = \"1GiB\"", "size = \"512B\""),
        ("name = \"vm1\"", "name = \"vm1\"\nweight = 1000000.0\nratio = 1000000.0"),
        ("listen = \"127.0.0.1:10810\"", "listen = \"127.0.0.1:10810\"\nidle_timeout = \"1s\""),
        ("listen = \"127.0.0.1:10810\"", "listen = \"127.0.0.1:10810\"\nidle_timeout = \"1h\""),
    ] {
        let ok = DEFAULT.replacen(from, to, 1);
        Config::parse(&ok, "x", Path::new(".")).unwrap().resolve().unwrap_or_else(|e| panic!("{to}: {e}"));
    }
    // The largest block size works with the default prewarm read (one block).
    let big = DEFAULT.replacen("block_size = \"4KiB\"", "block_size = \"1MiB\"", 1);
    Config::parse(&big, "x", Path::new(".")).unwrap().resolve().unwrap();
    // Unset, the replacement is the allocator's own; set, it is what is set.
    for (alloc, set, want) in [
        ("static", "", ReplacementKind::Lru),
        ("adaptive", "", ReplacementKind::S3fifo),
        ("s-cave", "", ReplacementKind::Clock),
        ("adaptive", "\nreplacement = \"lru\"", ReplacementKind::Lru),
    ] {
        let t = DEFAULT.replacen(
            "write_policy = \"wt\"",
            &format!("write_policy = \"wt\"\nallocator = \"{alloc}\"{set}"),
            1,
        );
        let c = Config::parse(&t, "x", Path::new(".")).unwrap();
        c.resolve().unwrap();
        assert_eq!(c.cache.replacement(), want, "{alloc}{set}");
    }
    // A wrong type is a parse error naming the file, the line and the key.
    let e = Config::parse(
        &DEFAULT.replacen("write_policy = \"wt\"", "write_policy = \"wt\"\nio_uring = \"yes\"", 1),
        "cfg.toml",
        Path::new("."),
    )
    .unwrap_err();
    assert!(e.contains("cfg.toml") && e.contains("io_uring = \"yes\"") && e.contains("expected a boolean"), "{e}");
    let e = Config::parse(
        &DEFAULT.replacen("write_policy = \"wt\"", "write_policy = \"wt\"\ndirect = \"fast\"", 1),
        "cfg.toml",
        Path::new("."),
    )
    .unwrap_err();
    assert!(e.contains("cfg.toml") && e.contains("direct") && e.contains("auto"), "{e}");
    let missing = "[cache]\npath = \"c\"\nsize = \"1MiB\"\n[listen]\ntcp = \"127.0.0.1:1\"\n[[vdisk]]\nname = \"a\"\nbacking = \"/nonexistent/a.img\"\n";
    assert!(Config::parse(missing, "x", Path::new(".")).unwrap().resolve().unwrap_err().contains("does not exist"));
}

/// `admission` and `write_admission` parse as the engine's policies (the write one as the
/// read one when unset), and a bad value is refused naming the key and the choices.
#[test]
fn admission_keys_parse_and_a_bad_one_names_the_key() {
    use cachevisor_engine::AdmissionPolicy;
    let c = Config::parse(
        &DEFAULT.replace("name = \"vm1\"", "name = \"vm1\"\nadmission = \"second-hit:3\""),
        "x",
        Path::new("."),
    )
    .unwrap();
    let nth = AdmissionPolicy::NthMiss { n: 3 };
    assert_eq!(c.vdisk[0].admissions(), (nth, nth));
    assert_eq!(c.vdisk[1].admissions(), (AdmissionPolicy::All, AdmissionPolicy::All));
    let c = Config::parse(
        &DEFAULT
            .replace("name = \"vm1\"", "name = \"vm1\"\nadmission = \"probability:0.5\"\nwrite_admission = \"all\""),
        "x",
        Path::new("."),
    )
    .unwrap();
    assert_eq!(c.vdisk[0].admissions(), (AdmissionPolicy::Probability { p: 0.5 }, AdmissionPolicy::All));
    let e = Config::parse(
        &DEFAULT.replace("name = \"vm1\"", "name = \"vm1\"\nadmission = \"second-hit:1\""),
        "cfg.toml",
        Path::new("."),
    )
    .unwrap_err();
    assert!(e.contains("cfg.toml") && e.contains("admission") && e.contains("second-hit:N"), "{e}");
    let budget = |s: &str| {
        Config::parse(&DEFAULT.replace("name = \"vm1\"", &format!("name = \"vm1\"\n{s}")), "cfg.toml", Path::new("."))
    };
    let c = budget("admission = \"write-budget:3dwpd\"").unwrap();
    let rate = cachevisor_engine::BudgetRate::Dwpd(3.0);
    assert_eq!(c.vdisk[0].admissions().1, AdmissionPolicy::WriteBudget { rate });
    let e = budget("admission = \"write-budget:1MiB/s\"\nwrite_admission = \"write-budget:2MiB/s\"")
        .and_then(|c| c.resolve())
        .unwrap_err();
    assert!(e.contains("vdisk[0] (vm1)") && e.contains("write-budget:2MiB/s") && e.contains("differ"), "{e}");
    let e = budget("write_admission = \"write-budget:50MiB\"").unwrap_err();
    assert!(e.contains("cfg.toml") && e.contains("write_admission") && e.contains("50MiB/s"), "{e}");
}

/// I/O classes and congestion thresholds: every malformed value refused naming the key,
/// counts and ranges checked at their bounds (0, the largest, past it).
#[test]
fn classes_and_congestion_thresholds_are_checked_where_they_enter() {
    let vdisk = |lines: &str| {
        let vm1 = "backing = \"var/vm1.img\"\nsize = \"1GiB\"\n";
        Config::parse(&DEFAULT.replace(vm1, &format!("{vm1}{lines}\n")), "c.toml", Path::new("."))
            .and_then(|c| c.resolve())
    };
    let class = |body: &str| vdisk(&format!("[[vdisk.class]]\nname = \"k\"\n{body}"));
    assert!(class(
        "range = \"0-1GiB\"\nsize = \"-64KiB\"\nop = \"write\"\npinned = true\nmax_occupancy = \"100%\"\npriority = 0"
    )
    .is_ok());
    for (body, want) in [
        ("op = \"trim\"", "op"),
        ("range = \"1GiB-1GiB\"", "range"),
        ("range = \"1GiB\"", "range"),
        ("size = \"x-\"", "size"),
        ("max_occupancy = \"0%\"", "max_occupancy"),
        ("max_occupancy = \"101%\"", "max_occupancy"),
        ("admission = \"second-hit:1\"", "admission"),
        ("priority = 256", "class `k`.priority: 256 is outside 0 to 255"),
        ("priority = -1", "class `k`.priority: -1 is outside 0 to 255"),
    ] {
        let e = class(body).unwrap_err();
        assert!(e.contains(want), "{body}: {e}");
    }
    let e = vdisk("[[vdisk.class]]\nname = \"\"").unwrap_err();
    assert!(e.contains("name"), "{e}");
    let e = vdisk("[[vdisk.class]]\nname = \"a\"\n[[vdisk.class]]\nname = \"a\"").unwrap_err();
    assert!(e.contains("named twice"), "{e}");
    let many = |n: usize| (0..n).map(|i| format!("[[vdisk.class]]\nname = \"c{i}\"\n")).collect::<String>();
    assert!(vdisk(&many(32)).is_ok(), "32 classes, the most");
    assert!(vdisk(&many(33)).unwrap_err().contains("at most 32"));
    let cache = |line: &str| {
        Config::parse(&DEFAULT.replace("[cache]", &format!("[cache]\n{line}")), "c.toml", Path::new("."))
            .and_then(|c| c.resolve())
    };
    assert!(cache("congested_read_threshold = \"10us\"\ncongested_write_threshold = \"60s\"").is_ok());
    assert!(cache("write_budget = \"3dwpd\"").is_ok() && cache("write_budget = \"50MiB/s\"").is_ok());
    for line in [
        "congested_read_threshold = \"0s\"",
        "congested_read_threshold = \"9us\"",
        "congested_write_threshold = \"61s\"",
        "congested_write_threshold = \"99999999999999999999s\"",
        "congested_write_threshold = \"fast\"",
        "write_budget = \"50MiB\"",
        "write_budget = \"0B/s\"",
        "write_budget = \"-3dwpd\"",
    ] {
        let e = cache(line).unwrap_err();
        assert!(e.contains(line.split(' ').next().unwrap()), "{line}: {e}");
    }
}

#[test]
fn cache_devices_are_checked_where_they_enter() {
    let base = "[cache]\npath = \"c.img\"\nsize = \"64MiB\"\n{max}[listen]\ntcp = \"127.0.0.1:1\"\n[[vdisk]]\nname = \"a\"\nbacking = \"a.img\"\nsize = \"1MiB\"\n{devices}";
    let r = |max: &str, devices: &[(&str, &str)]| {
        let d: String =
            devices.iter().map(|(p, s)| format!("[[cache.device]]\npath = \"{p}\"\nsize = \"{s}\"\n")).collect();
        Config::parse(&base.replace("{max}", max).replace("{devices}", &d), "t", Path::new("/srv"))
            .and_then(|c| c.resolve().map(|r| (c, r)))
    };
    let (c, ok) = r("", &[("d1.img", "32MiB"), ("/nvme/d2", "16MiB")]).unwrap();
    assert_eq!(ok.device_slots, [16384, 8192, 4096]);
    assert_eq!((ok.slots, ok.engine_slots()), (16384, 28672), "cache.size stays the first device's");
    assert_eq!(c.cache.device[0].path, Path::new("/srv/d1.img"), "relative to the config");
    assert_eq!(r("", &[]).unwrap().1.device_slots, [16384], "one device without any");
    for (max, devices, why) in [
        ("", vec![("d1.img", "1000B")], "cache.device[0].size: 1000 bytes is not a whole number of blocks"),
        ("", vec![("d1.img", "0")], "cache.device[0].size"),
        ("", vec![("d1.img", "lots")], "cache.device[0].size"),
        ("", vec![("c.img", "8MiB")], "cache.device[0].path: /srv/c.img is cache.path itself"),
        ("", vec![("d.img", "8MiB"), ("d.img", "8MiB")], "cache.device[1].path: /srv/d.img is cache.device[0]'s too"),
        ("max_size = \"128MiB\"\n", vec![("d.img", "8MiB")], "cache.max_size: a cache over several devices"),
        ("", vec![("d.img", "64TiB")], "cache.device: "),
    ] {
        let e = r(max, &devices).unwrap_err();
        assert!(e.contains(why), "{devices:?}: {e}");
    }
    let vssd = base
        .replace("{max}", "")
        .replace("{devices}", "[[cache.device]]\npath = \"d.img\"\nsize = \"8MiB\"\n[vssd]\nsize = \"8MiB\"\n");
    let e = Config::parse(&vssd, "t", Path::new("/srv")).unwrap().resolve().unwrap_err();
    assert!(e.contains("cache.device: a cache with a vSSD region"), "{e}");
    // Mirrored dirty data: on by default with two devices, refused with one, off when asked.
    assert!(ok.mirror_dirty && !r("", &[]).unwrap().1.mirror_dirty);
    let one = base.replace("{max}", "mirror_dirty = true\n").replace("{devices}", "");
    let e = Config::parse(&one, "t", Path::new("/srv")).unwrap().resolve().unwrap_err();
    assert!(e.contains("cache.mirror_dirty: mirroring dirty data needs two or more cache devices"), "{e}");
    assert!(!r("mirror_dirty = false\n", &[("d.img", "8MiB")]).unwrap().1.mirror_dirty);
    let bad = base.replace("{max}", "").replace("{devices}", "[[cache.device]]\npath = \"d.img\"\n");
    let e = Config::parse(&bad, "t", Path::new("/srv")).unwrap_err();
    assert!(e.contains("size"), "{e}");
}
