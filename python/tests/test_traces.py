"""Reading traces from Python: the same requests the CLI reads, in batches or whole, as
NumPy, pandas and Arrow; bad input named by file and line."""

import json

import numpy as np
import pytest

import cachevisor as cv
from conftest import run_cli


def test_a_merged_trace_reads_as_the_cli_counts_it(traces, cli):
    files = [traces / "tpcc-small.mqsim.txt", traces / "websearch-small.mqsim.txt"]
    b = cv.read_trace(files)
    info = json.loads(run_cli(cli, "trace", "info", *files, "--json").stdout)
    per_vm = {v["vm"]: v for v in info}
    assert b.vm_names == ["tpcc-small", "websearch-small"]
    for i, name in enumerate(b.vm_names):
        mine = b.vm == i
        assert int(mine.sum()) == per_vm[name]["requests"]
        assert int(b.len[mine & (b.op == 0)].astype(np.uint64).sum()) == per_vm[name]["read_bytes"]
        assert int(b.len[mine & (b.op == 1)].astype(np.uint64).sum()) == per_vm[name]["write_bytes"]
    assert np.all(np.diff(b.time_ns.astype(np.int64)) >= 0), "merged by time"
    assert b.time_ns.dtype == np.uint64 and b.offset.dtype == np.uint64 and b.len.dtype == np.uint32


def test_batches_requests_and_the_whole_trace_agree(traces):
    f = traces / "cloudPhysicsIO.vscsi"
    whole = cv.read_trace(f)
    parts = list(cv.iter_batches(f, batch_size=7777))
    assert all(len(p) == 7777 for p in parts[:-1]) and 0 < len(parts[-1]) <= 7777
    for k in ("time_ns", "vm", "op", "offset", "len"):
        assert np.array_equal(np.concatenate([getattr(p, k) for p in parts]), getattr(whole, k))
    first = cv.read_trace(f, max_requests=1000)
    assert len(first) == 1000 and np.array_equal(first.offset, whole.offset[:1000])
    reqs = []
    for r in cv.iter_requests(f):
        reqs.append(r)
        if len(reqs) == 1000:
            break
    assert [r.offset for r in reqs] == whole.offset[:1000].tolist()
    assert {r.op for r in reqs} <= {"read", "write"} and reqs[0].vm == "cloudPhysicsIO"


def test_pandas_and_arrow_views(traces):
    b = cv.read_trace([traces / "tpcc-small.mqsim.txt", traces / "websearch-small.mqsim.txt"], max_requests=5000)
    df = b.to_pandas()
    assert len(df) == 5000 and list(df.columns) == ["time_ns", "vm", "op", "offset", "len"]
    assert set(df["vm"].cat.categories) == {"tpcc-small", "websearch-small"}
    assert (df["op"] == "write").sum() == int(b.op.sum())
    t = b.to_arrow()
    assert t.num_rows == 5000 and t.column("vm").to_pylist()[:3] == df["vm"].astype(str).tolist()[:3]
    assert t.column("write").to_pylist() == b.op.astype(bool).tolist()


def test_a_malformed_record_is_named_and_the_requests_before_it_are_kept(tmp_path):
    f = tmp_path / "bad.csv"
    rows = ["time_ns,vm,op,offset,len"] + [f"{i * 1000},vmA,R,{i * 4096},4096" for i in range(10)]
    rows.insert(6, "6000,vmA,R,notanumber,4096")
    f.write_text("\n".join(rows) + "\n")
    batches = cv.iter_batches(f, batch_size=3, format="csv")
    got = []
    with pytest.raises(ValueError, match=r"bad\.csv: line 7: field `offset`"):
        for b in batches:
            got.append(len(b))
    assert sum(got) == 5, "the five good records before line 7 came through first"
    ok = cv.read_trace(f, format="csv", skip_bad=True)
    assert len(ok) == 10 and ok.offset.tolist() == [i * 4096 for i in range(10)]


def test_bad_arguments_name_themselves(tmp_path, traces):
    with pytest.raises(OSError, match="missing.csv"):
        cv.read_trace(tmp_path / "missing.csv")
    with pytest.raises(ValueError, match="format"):
        cv.read_trace(traces / "tpcc-small.mqsim.txt", format="nope")
    with pytest.raises(ValueError, match="vm_mode"):
        cv.read_trace(traces / "tpcc-small.mqsim.txt", vm_mode="disk")
    with pytest.raises(ValueError, match="no trace files"):
        cv.read_trace([])


def test_one_reader_shared_by_two_threads_never_deadlocks(traces):
    import threading

    from cachevisor._native import TraceReader

    r = TraceReader([str(traces / "cloudPhysicsIO.vscsi")])
    rows, refused = [], []

    def reader():
        while True:
            try:
                b = r.read_batch(2000)
            except RuntimeError:
                refused.append(1)
                continue
            if b["rows"] == 0:
                return
            rows.append(b["rows"])

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        try:
            r.vm_names()
        except RuntimeError:
            refused.append(1)
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "deadlocked"
    assert sum(rows) == 113872, "every request read exactly once"
