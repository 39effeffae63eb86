"""Shared fixtures: the bundled traces (`../shared/traces` beside the repository, or
$CACHEVISOR_TRACES), the CLI binary ($CACHEVISOR_BIN, else target/debug/cachevisor) and
a small Zipf oracleGeneral trace the CLI generates."""

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def traces_dir() -> Path:
    env = os.environ.get("CACHEVISOR_TRACES")
    d = Path(env) if env else REPO.parent / "shared" / "traces"
    assert (d / "tpcc-small.mqsim.txt").exists(), f"bundled traces not found in {d}; set CACHEVISOR_TRACES"
    return d


@pytest.fixture(scope="session")
def traces() -> Path:
    return traces_dir()


@pytest.fixture(scope="session")
def cli() -> Path:
    b = Path(os.environ.get("CACHEVISOR_BIN", REPO / "target" / "debug" / "cachevisor"))
    assert b.exists(), f"{b} not built: run `cargo build -p cachevisor` or set CACHEVISOR_BIN"
    return b


def run_cli(cli: Path, *args, cwd=None) -> subprocess.CompletedProcess:
    r = subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True, cwd=cwd)
    assert r.returncode == 0, f"cachevisor {' '.join(map(str, args))} failed:\n{r.stderr}"
    return r


@pytest.fixture(scope="session")
def zipf(cli, tmp_path_factory) -> Path:
    """50,000 single-block reads over 10,000 blocks, Zipf(1), oracleGeneral."""
    p = tmp_path_factory.mktemp("zipf") / "zipf.oracleGeneral"
    run_cli(cli, "trace", "zipf", "--requests", 50000, "--blocks", 10000, "-o", p)
    return p
