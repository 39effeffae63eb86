"""Simulations from Python: the CLI's numbers (identical result.json), scenarios as
files, text or dicts, cache sizes as fractions, progress, the GIL released, errors."""

import json
import threading

import pytest

import cachevisor as cv
from conftest import REPO, run_cli


@pytest.fixture(autouse=True)
def at_repo(monkeypatch):
    # The example scenarios' trace paths are relative to their files, which the CLI and
    # the package both resolve against the same working directory.
    monkeypatch.chdir(REPO)


def test_a_python_run_and_a_cli_run_of_one_scenario_give_identical_json(cli, tmp_path):
    run_cli(cli, "simulate", "--scenario", "examples/mixed.toml", "--max-requests", 20000, "--out", tmp_path)
    want = (tmp_path / "result.json").read_text()
    got = cv.simulate("examples/mixed.toml", replay={"max_requests": 20000})
    assert got.json == want
    assert got.model == "full" and len(got.vms) == 3
    # The same scenario as a dict and as TOML text: the same run.
    sc = cv.load_scenario("examples/mixed.toml")
    sc["replay"]["max_requests"] = 20000
    assert cv.simulate(sc).json == want
    # Tables: one row per VM, per window and VM; the totals row.
    assert got.vms["requests"].sum() == got.total["requests"] == 20000
    assert set(got.windows["vm"]) == set(got.vms["vm"])
    assert "latency.p99_us" in got.vms.columns and (got.vms["latency.p99_us"] > 0).all()


def test_cluster_runs_match_the_cli(cli, tmp_path):
    run_cli(cli, "simulate", "--scenario", "examples/elica-cluster.toml", "--max-requests", 20000, "--out", tmp_path)
    want = (tmp_path / "cluster.json").read_text()
    sc = cv.load_scenario("examples/elica-cluster.toml")
    sc["replay"]["max_requests"] = 20000
    got = cv.simulate_cluster(sc)
    # Everything but the solver's wall-clock time (`solve_s`, measured, not simulated).
    want, mine = json.loads(want), json.loads(got.json)
    assert want.pop("solve_s") >= 0 and mine.pop("solve_s") >= 0
    assert mine == want
    assert len(got.nodes) == 3 and len(got.vms) == 4


def test_cache_sizes_as_fractions_of_the_working_set_resolve_as_the_cli_does(cli, tmp_path, traces):
    f = traces / "cloudPhysicsIO.vscsi"
    run_cli(
        cli, "simulate", "--trace", f, "--cache-size", "5%", "--replacement", "lru", "--partition", "shared",
        "--out", tmp_path,
    )
    want = json.loads((tmp_path / "result.json").read_text())
    sc = {"trace": {"files": [str(f)]}, "cache": {"replacement": "lru", "partition": "shared"}}
    got = cv.simulate(sc, cache_size="5%")
    wss = cv.working_set_bytes(sc)
    b = cv.read_trace(f)
    first, last = b.offset // 4096, (b.offset + b.len - 1) // 4096
    blocks = set()
    for a, z in zip(first.tolist(), last.tolist()):
        blocks.update(range(a, z + 1))
    assert wss == len(blocks) * 4096
    assert got.raw["resolved"]["cache_bytes"] == want["resolved"]["cache_bytes"] == (wss // 4096 * 5 // 100) * 4096
    assert got.raw["total"] == want["total"] and got.model == want["model"]
    with pytest.raises(ValueError, match="cache_size"):
        cv.simulate(sc, cache_size="150%")


def test_progress_is_reported_and_its_exceptions_surface(traces):
    sc = {"trace": {"files": [str(traces / "cloudPhysicsIO.vscsi")]}, "cache": {"size": "64MiB"}}
    seen = []
    r = cv.simulate(sc, progress=lambda done, total: seen.append((done, total)))
    assert seen and seen[-1][0] == r.raw["total"]["requests"]
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)

    def boom(done, total):
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        cv.simulate(sc, progress=boom)


def test_the_gil_is_released_during_a_run(traces):
    sc = {
        "trace": {"files": [str(traces / "cloudPhysicsIO.vscsi")]},
        "cache": {"size": "64MiB"},
        "replay": {"model": "full"},
    }
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", cv.simulate(sc)))
    spins = 0
    t.start()
    while t.is_alive():
        spins += 1
    t.join()
    assert out["r"].model == "full"
    # With the GIL held for the run this thread could not run at all until it ended.
    assert spins > 1000, f"the main thread ran {spins} loop iterations during the simulation"


def test_bad_scenarios_name_the_key(traces, tmp_path):
    base = {"trace": {"files": [str(traces / "tpcc-small.mqsim.txt")]}}
    with pytest.raises(ValueError, match="colour"):
        cv.simulate({**base, "cache": {"size": "64MiB", "colour": "blue"}})
    with pytest.raises(ValueError, match="cache.size"):
        cv.simulate({**base, "cache": {"size": "lots"}})
    with pytest.raises(OSError, match="nope.csv"):
        cv.simulate({"trace": {"files": [str(tmp_path / "nope.csv")]}, "cache": {"size": "64MiB"}})
    with pytest.raises(ValueError, match="missing.toml"):
        cv.simulate(str(tmp_path / "missing.toml"))
    with pytest.raises(TypeError):
        cv.simulate(42)
    bad = tmp_path / "bad.toml"
    bad.write_text("[cache]\nsize = 'big'\n[trace]\nfiles = ['x.csv']\n")
    with pytest.raises(ValueError, match="cache.size"):
        cv.simulate(bad)
