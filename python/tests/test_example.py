"""The notebook-style example runs end to end and draws its figures."""

import subprocess
import sys

from conftest import REPO


def test_the_example_notebook_runs(traces, tmp_path):
    r = subprocess.run(
        [sys.executable, str(REPO / "examples" / "notebook.py"), str(traces), str(tmp_path)],
        capture_output=True,
        text=True,
        env={"MPLBACKEND": "Agg", "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    for f in ("mrc.png", "policies.png"):
        png = (tmp_path / f).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000, f
    assert "optimal:" in r.stdout and "s3fifo" in r.stdout
