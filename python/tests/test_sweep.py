"""Sweeps: the grid expanded and run across cores by `cachevisor sweep`, each cell the
simulation it names, resumed after a SIGKILL without rerunning finished cells, and the
same table from a local Ray cluster — with a Ray worker killed mid-sweep."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

import cachevisor as cv
from cachevisor.sweep import MEASURED_COLUMNS, load_spec
from conftest import REPO


def sweep_env():
    return {**os.environ, "CACHEVISOR_PYTHON": sys.executable}


def run_sweep_cli(cli, *args, check=True):
    r = subprocess.run([str(cli), "sweep", *map(str, args)], capture_output=True, text=True, env=sweep_env(), cwd=REPO)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def simulated(table: pd.DataFrame) -> pd.DataFrame:
    return table.drop(columns=MEASURED_COLUMNS).reset_index(drop=True)


def write_spec(path: Path, traces: Path, sizes, policies, model="auto", max_requests=0) -> Path:
    files = ", ".join(f'"{traces / t}"' for t in ("cloudPhysicsIO.vscsi", "tpcc-small.mqsim.txt"))
    path.write_text(
        f"""
[sweep]
name = "test"
[base]
cache = {{ partition = "shared" }}
replay = {{ model = "{model}", max_requests = {max_requests} }}
[grid]
trace = [{files}]
cache_size = [{", ".join(f'"{s}"' for s in sizes)}]
"cache.replacement" = [{", ".join(f'"{p}"' for p in policies)}]
"""
    )
    return path


@pytest.fixture(scope="module")
def local_run(cli, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "local"
    r = run_sweep_cli(cli, "examples/sweep.toml", "--out", out, "--jobs", 2)
    return out, pd.read_parquet(out / "results.parquet"), r


def test_a_local_sweep_runs_every_cell_and_writes_its_table_and_summary(local_run):
    out, t, r = local_run
    assert len(t) == 3 * 3 * 2 * 2, "18 cells, each a VM row and a total row"
    assert t["key"].nunique() == 18
    csv = pd.read_csv(out / "results.csv")
    assert csv["hit_ratio"].tolist() == pytest.approx(t["hit_ratio"].tolist(), abs=1e-12)
    html = (out / "summary.html").read_text()
    assert "Best configuration per trace" in html and html.count("<img") == 3
    assert "Measured ÷ predicted" in html
    assert (t["peak_rss_bytes"] > 0).all() and (t["predicted_rss_bytes"] > 0).all()
    # The best line per trace printed.
    assert "cloudPhysicsIO" in r.stdout and "hit_ratio" in r.stdout


def test_each_cell_is_the_simulation_it_names(local_run):
    _, t, _ = local_run
    spec = load_spec(REPO / "examples" / "sweep.toml")
    for c in (spec.cells[0], spec.cells[-1]):
        row = t[(t["key"] == c.key) & (t["vm"] == "total")].iloc[0]
        direct = cv.simulate(c.scenario, cache_size=c.cache_size)
        assert row["hit_ratio"] == direct.hit_ratio and row["cache_bytes"] == direct.raw["resolved"]["cache_bytes"]
        assert row["cache.replacement"] == c.params["cache.replacement"] == direct.raw["resolved"]["replacement"]


def test_an_interrupted_sweep_resumes_without_rerunning_finished_cells(cli, local_run, tmp_path):
    _, full, _ = local_run
    out = tmp_path / "resumed"
    p = subprocess.Popen(
        [str(cli), "sweep", "examples/sweep.toml", "--out", str(out), "--jobs", "1", "--no-predict"],
        cwd=REPO,
        env=sweep_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 120
    while len(list((out / "cells").glob("*.json"))) < 4:
        assert p.poll() is None and time.time() < deadline, "the sweep ended before it could be interrupted"
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    finished = {f.stem for f in (out / "cells").glob("*.json")}
    assert 4 <= len(finished) < 18
    r = run_sweep_cli(cli, "examples/sweep.toml", "--out", out, "--jobs", 2, "--no-predict")
    assert f"18 cells, {len(finished)} already done" in r.stderr
    resumed = pd.read_parquet(out / "results.parquet")
    pd.testing.assert_frame_equal(simulated(resumed), simulated(full))
    # A third run has nothing to do.
    r = run_sweep_cli(cli, "examples/sweep.toml", "--out", out, "--no-predict")
    assert "18 cells, 18 already done" in r.stderr and "simulating" not in r.stderr


def test_bad_specs_are_named(cli, tmp_path, traces):
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[grid]\ntrace = ["{traces / "tpcc-small.mqsim.txt"}"]\n"cache.colour" = ["red"]\n')
    r = run_sweep_cli(cli, bad, "--out", tmp_path / "o", check=False)
    assert r.returncode == 1 and "colour" in r.stderr
    bad.write_text(f'[grid]\ntrace = ["{traces / "tpcc-small.mqsim.txt"}"]\n"cachee.replacement" = ["lru"]\n')
    r = run_sweep_cli(cli, bad, "--out", tmp_path / "o", check=False)
    assert r.returncode == 1 and "cachee" in r.stderr
    bad.write_text("[sweep]\nmetric = 'speed'\n")
    r = run_sweep_cli(cli, bad, check=False)
    assert r.returncode == 1 and "speed" in r.stderr
    bad.write_text("[grid]\ntrace = []\n")
    r = run_sweep_cli(cli, bad, check=False)
    assert r.returncode == 1 and "grid.\"trace\"" in r.stderr


def test_without_the_package_the_cli_says_how_to_install_it(cli, tmp_path):
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")  # no site-packages
    fake.chmod(0o755)
    r = subprocess.run(
        [str(cli), "sweep", "examples/sweep.toml"], capture_output=True, text=True, cwd=REPO,
        env={**os.environ, "CACHEVISOR_PYTHON": str(fake)},
    )
    assert r.returncode == 1 and "pip install ." in r.stderr


# --- Ray ------------------------------------------------------------------------------

ray = pytest.importorskip("ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """A local Ray cluster on loopback: a head with two worker CPUs."""
    ray_bin = Path(sys.executable).parent / "ray"
    port = free_port()
    temp = Path("/tmp") / f"cvray{port}"  # Ray's socket paths must stay short
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run(
        [str(ray_bin), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
         "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"],
        check=True, capture_output=True, env=env,
    )
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([str(ray_bin), "stop", "--force"], capture_output=True, env=env)
        shutil.rmtree(temp, ignore_errors=True)


def test_a_sweep_on_ray_gives_the_local_table(cli, ray_head, local_run, tmp_path):
    _, local, _ = local_run
    out = tmp_path / "ray"
    run_sweep_cli(cli, "examples/sweep.toml", "--out", out, "--ray", ray_head)
    on_ray = pd.read_parquet(out / "results.parquet")
    pd.testing.assert_frame_equal(simulated(on_ray), simulated(local))
    assert (on_ray["peak_rss_bytes"] > 0).all()


def ray_cell_workers():
    ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in ps.splitlines() if "ray::run_cell" in line]


def test_a_ray_worker_killed_mid_sweep_has_its_cell_rerun(cli, ray_head, tmp_path, traces):
    spec = write_spec(tmp_path / "kill.toml", traces, ["2%", "5%", "10%"], ["lru", "clock"], model="full")
    local_out, ray_out = tmp_path / "local", tmp_path / "ray"
    p = subprocess.Popen(
        [str(cli), "sweep", str(spec), "--out", str(ray_out), "--ray", ray_head, "--no-predict"],
        cwd=REPO, env=sweep_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    killed = None
    deadline = time.time() + 120
    while killed is None and p.poll() is None and time.time() < deadline:
        workers = ray_cell_workers()
        if workers:
            killed = workers[0]
            os.kill(killed, signal.SIGKILL)
        time.sleep(0.02)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert killed is not None, "no Ray worker was seen running a cell"
    run_sweep_cli(cli, spec, "--out", local_out, "--no-predict")
    on_ray = pd.read_parquet(ray_out / "results.parquet")
    assert on_ray["key"].nunique() == 12
    pd.testing.assert_frame_equal(simulated(on_ray), simulated(pd.read_parquet(local_out / "results.parquet")))


def test_the_host_layout_example_expands_to_checked_scenarios():
    # 3 traces × 3 device counts × with and without a RAM tier; load_spec runs every
    # cell's scenario through the simulator's own parser.
    spec = load_spec(REPO / "examples" / "host-layouts.toml")
    assert len(spec.cells) == 18
    assert spec.grid_keys == ["devices.ssd_count", "devices.ram"]
