"""MRCs, allocators and the cluster solver from Python, checked against the CLI, the
simulator and brute force."""

import csv
import itertools
import json

import numpy as np
import pytest

import cachevisor as cv
from conftest import run_cli

LAT = {"ssd_local_us": 90, "ssd_remote_us": 90, "network_us": 60, "hdd_us": 6000}


def test_mrc_matches_analyze_mrc(cli, traces, tmp_path):
    files = [traces / "tpcc-small.mqsim.txt", traces / "websearch-small.mqsim.txt"]
    run_cli(cli, "analyze", "mrc", *files, "--kind", "urd", "--points", 50, "--out", tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    m = cv.mrc(files, kind="urd", points=50)
    assert m.raw["vms"] == summary["vms"] and m.raw["method"] == summary["method"]
    with open(tmp_path / "mrc.csv") as f:
        rows = list(csv.reader(f))
    w = m.wide()
    assert list(w.columns) == rows[0]
    assert np.allclose(w.iloc[:, 2:].to_numpy(), np.array(rows[1:], dtype=float)[:, 2:], atol=5e-7)
    assert w["size_blocks"].tolist() == [int(r[1]) for r in rows[1:]]


def test_exact_hit_curves_are_what_an_lru_simulation_hits(zipf):
    m = cv.mrc(zipf, hit_curve_unit=1000)
    (d,) = m.demands()
    assert d["accesses"] == 50000
    for k in (1, 3, 7):
        r = cv.simulate(
            {"trace": {"files": [str(zipf)]}, "cache": {"size": f"{k * 1000 * 4096}B", "replacement": "lru", "partition": "shared"}}
        )
        assert r.model == "cache"
        assert d["hit_curve"][k] == pytest.approx(r.raw["total"]["requests"] * r.hit_ratio, abs=1e-6)


def test_shards_follows_the_exact_curve(zipf):
    exact = cv.mrc(zipf, points=100).curves["miss_ratio"].to_numpy()
    sampled = cv.mrc(zipf, method="shards", rate=0.1, points=100).curves["miss_ratio"].to_numpy()
    mae = float(np.abs(exact - sampled).mean())
    assert mae < 0.02, f"SHARDS R=0.1 mean absolute error {mae:.4f}"
    fixed = cv.mrc(zipf, method="shards", max_blocks=2000, points=100).curves["miss_ratio"].to_numpy()
    assert float(np.abs(exact - fixed).mean()) < 0.02
    with pytest.raises(ValueError, match="rate"):
        cv.mrc(zipf, method="shards", rate=1.5)
    with pytest.raises(ValueError, match="method"):
        cv.mrc(zipf, method="lru")


def test_optimal_allocation_is_the_best_split_by_brute_force(traces):
    unit = 256
    m = cv.mrc([traces / "tpcc-small.mqsim.txt", traces / "websearch-small.mqsim.txt"], hit_curve_unit=unit)
    demands = m.demands()
    capacity = 40 * unit

    def hits(i, blocks):
        c = demands[i]["hit_curve"]
        return c[min(blocks // unit, len(c) - 1)]

    best = max(hits(0, a * unit) + hits(1, capacity - a * unit) for a in range(41))
    t = cv.allocate("optimal", capacity, demands, unit=unit)["targets"]
    assert sum(t) <= capacity
    assert hits(0, t[0]) + hits(1, t[1]) == pytest.approx(best)
    # static: shares by weight.
    assert cv.allocate("static", 1000, [{"weight": 1}, {"weight": 3}])["targets"] == [250, 750]
    assert "s-cave" in cv.allocators()
    with pytest.raises(ValueError, match="nope"):
        cv.allocate("nope", 1000, [{}])
    with pytest.raises(ValueError, match=r"vms\[0\]: unknown key `wieght`"):
        cv.allocate("static", 1000, [{"wieght": 1}])


def test_the_cluster_solvers_agree_and_meet_the_constraints():
    rng = np.random.default_rng(7)
    for _ in range(5):
        vms = []
        for v in range(4):
            steps = np.sort(rng.random(int(rng.integers(2, 9))))
            vms.append((v % 2, [0.0, *steps.tolist()]))
        cap = [int(rng.integers(1, 6)), int(rng.integers(1, 6))]
        exact = cv.solve_cluster(cap, vms, LAT, solver="exact")
        ilp = cv.solve_cluster(cap, vms, LAT, solver="ilp")
        fast = cv.solve_cluster(cap, vms, LAT, solver="fast")
        assert ilp["total_avl"] == pytest.approx(exact["total_avl"], rel=1e-9)
        assert fast["total_avl"] >= exact["total_avl"] - 1e-9
        for node in range(2):
            used = sum(l for (h, _), l in zip(vms, exact["local"]) if h == node)
            used += sum(u for rs in exact["remote"] for n, u in rs if n == node)
            assert used <= cap[node]
    # Brute force on a tiny problem: every (local, remote) per VM.
    vms = [(0, [0, 0.5, 0.7, 0.8]), (1, [0, 0.2, 0.3])]
    best = float("inf")
    for l0, r0, l1, r1 in itertools.product(range(4), range(4), range(3), range(3)):
        if l0 + r0 > 3 or l1 + r1 > 2 or l0 + r1 > 2 or l1 + r0 > 2:
            continue
        cost = 0.0
        for (h, c), loc, rem in ((vms[0], l0, r0), (vms[1], l1, r1)):
            hr = c[loc + rem] if loc + rem else 0.0
            hit = LAT["ssd_local_us"] * loc + (LAT["ssd_remote_us"] + LAT["network_us"]) * rem
            cost += hr * (hit / (loc + rem) if loc + rem else 0) + (1 - hr) * LAT["hdd_us"]
        best = min(best, cost)
    assert cv.solve_cluster([2, 2], vms, LAT)["total_avl"] == pytest.approx(best)
    with pytest.raises(ValueError, match="hdd_us"):
        cv.solve_cluster([2], [(0, [0, 1])], {"ssd_local_us": 1, "ssd_remote_us": 1, "network_us": 1})
    with pytest.raises(ValueError, match="home node 3"):
        cv.solve_cluster([2], [(3, [0, 1])], LAT)


def test_sizes_and_counts_from_python_are_bounded_where_they_enter(zipf):
    from cachevisor import _native

    steps, node_units, exact_units = 1 << 20, 1 << 16, 4096
    # allocate: at most 2^20 steps of the unit.
    assert len(cv.allocate("static", steps, [{}, {}])["targets"]) == 2
    with pytest.raises(ValueError, match="steps"):
        cv.allocate("static", steps + 1, [{}])
    with pytest.raises(ValueError, match="unit"):
        cv.allocate("static", 10, [{}], unit=0)
    with pytest.raises(OverflowError):
        cv.allocate("static", 2**64, [{}])
    # solve_cluster: nodes, units per node, the exact solver's whole cluster.
    assert cv.solve_cluster([node_units], [(0, [0, 0.5])], LAT, solver="fast")["local"] == [1]
    with pytest.raises(ValueError, match="capacity\\[0\\]"):
        cv.solve_cluster([node_units + 1], [(0, [0, 0.5])], LAT, solver="fast")
    assert cv.solve_cluster([exact_units], [(0, [0, 0.5])], LAT)["local"] == [1]
    with pytest.raises(ValueError, match="exact solver"):
        cv.solve_cluster([exact_units, 1], [(0, [0, 0.5])], LAT)
    with pytest.raises(ValueError, match="nodes"):
        cv.solve_cluster([], [], LAT)
    with pytest.raises(OverflowError):
        cv.solve_cluster([2**64], [(0, [0, 0.5])], LAT)
    # mrc: points, block size, the hit-curve unit.
    assert len(cv.mrc(zipf, points=1).curves) == 2
    with pytest.raises(ValueError, match="points 0"):
        cv.mrc(zipf, points=0)
    with pytest.raises(ValueError, match="points 1000001"):
        cv.mrc(zipf, points=1_000_001)
    with pytest.raises(ValueError, match="block_size"):
        cv.mrc(zipf, block_size=3000)
    with pytest.raises(ValueError, match="hit_curve_unit"):
        cv.mrc(zipf, hit_curve_unit=0)
    with pytest.raises(OverflowError):
        _native.mrc([str(zipf)], points=-1)


def test_a_scenario_path_with_an_equals_sign_is_a_file(tmp_path, traces):
    d = tmp_path / "size=5%"
    d.mkdir()
    f = d / "s.toml"
    f.write_text(f'[cache]\nsize = "16MiB"\n[trace]\nfiles = ["{traces / "tpcc-small.mqsim.txt"}"]\n')
    assert cv.simulate(str(f)).raw["total"]["requests"] == 6999
