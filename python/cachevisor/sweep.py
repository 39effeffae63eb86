"""Policy sweeps: a grid of traces × cache sizes × policies × parameters, each cell one
simulation, run across the cores of this machine or as tasks of a Ray cluster, resumed
after an interruption, written as one tidy table (Parquet, CSV beside it) and an HTML
summary with the best configuration per trace and plots.

A spec (TOML; paths relative to it):

    [sweep]
    name = "policies"            # the summary's title
    metric = "hit_ratio"         # what "best" maximises (a column of the table)

    [base]                       # the scenario every cell starts from
    scenario = "mixed.toml"      # optional: a scenario file, then the sections below over it
    cache = { partition = "shared" }
    replay = { max_requests = 100000 }

    [grid]
    trace = ["a.vscsi", ["b.csv", "c.csv"]]   # one trace per item (a list is merged)
    cache_size = ["1%", "5%", "256MiB"]       # absolute or fractions of the working set
    "cache.replacement" = ["lru", "s3fifo"]   # any scenario key, by its dotted path

Each cell is keyed by a digest of what determines its result — the traces' and synthetic
configs' contents, the scenario after the grid's values, the cache size, the package's
version — so a finished cell (its file under `OUT/cells/`) is never rerun and a resumed
sweep gives the table an uninterrupted one gives. Before running, each cell's memory and
time are predicted from its trace's requests and working set (two short calibration runs
of the cell give its cost per request, its set-up and the cache's bytes per slot); after it,
both are measured (peak RSS of the process that ran it alone, wall time) and put beside
the prediction in the table.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import copy
import hashlib
import itertools
import json
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

try:  # Python ≥ 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.9 / 3.10
    import tomli as tomllib  # type: ignore[no-redef]

#: Columns that are measured, not simulated: they differ between two runs of one cell.
MEASURED_COLUMNS = ["predicted_rss_bytes", "predicted_time_s", "peak_rss_bytes", "time_s"]

_VM_COLUMNS = [
    "requests",
    "hit_ratio",
    "read_hit_ratio",
    "write_hit_ratio",
    "ssd_write_bytes",
    "backing_read_bytes",
    "backing_write_bytes",
    "evicted_blocks",
]


class SpecError(ValueError):
    """A spec that cannot run; the message names the key."""


@dataclass
class Cell:
    """One simulation of the sweep."""

    key: str
    trace: str
    params: Dict[str, Any]
    cache_size: Optional[str]
    scenario: Dict[str, Any]
    # A digest of everything but the cache size.
    family: str = ""
    predicted: Dict[str, float] = field(default_factory=dict)


@dataclass
class Spec:
    """A parsed spec."""

    path: Path
    name: str
    metric: str
    cells: List[Cell]
    grid_keys: List[str]


def _digest_file(path: str, cache: Dict[str, str]) -> str:
    if path not in cache:
        h = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        except OSError as e:
            raise SpecError(f"{path}: {e.strerror}") from None
        cache[path] = h.hexdigest()
    return cache[path]


def _set_path(sc: Dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node: Any = sc
    for i, p in enumerate(parts[:-1]):
        if not isinstance(node, dict) or p not in node or not isinstance(node[p], dict):
            raise SpecError(f"grid.\"{dotted}\": the scenario has no section `{'.'.join(parts[: i + 1])}`")
        node = node[p]
    node[parts[-1]] = value


def load_spec(path: os.PathLike) -> Spec:
    """Reads and expands a spec; every cell's scenario is checked by the simulator's
    own parser (a bad key fails here, naming it, before anything runs)."""
    from . import _native
    from .simulation import load_scenario

    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as e:
        raise SpecError(f"{path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{path}: {e}") from None
    unknown = set(raw) - {"sweep", "base", "grid"}
    if unknown:
        raise SpecError(f"{path}: unknown section `{sorted(unknown)[0]}` (expected sweep, base, grid)")
    here = path.parent
    meta = dict(raw.get("sweep", {}))
    name = str(meta.pop("name", path.stem))
    metric = str(meta.pop("metric", "hit_ratio"))
    if meta:
        raise SpecError(f"{path}: sweep: unknown key `{sorted(meta)[0]}` (expected name, metric)")
    if metric not in _VM_COLUMNS:
        raise SpecError(f"{path}: sweep.metric `{metric}`: expected one of {', '.join(_VM_COLUMNS)}")
    base_raw = dict(raw.get("base", {}))
    base_file = base_raw.pop("scenario", None)
    base = load_scenario(Path(here, base_file)) if base_file else load_scenario({})
    for section, values in base_raw.items():
        if isinstance(values, dict) and isinstance(base.get(section), dict):
            base[section] = {**base[section], **values}
        else:
            base[section] = values
    grid = dict(raw.get("grid", {}))
    for k, v in grid.items():
        if not isinstance(v, list) or not v:
            raise SpecError(f"{path}: grid.\"{k}\": expected a non-empty list")
    traces: List[Tuple[str, List[str]]] = []
    for item in grid.pop("trace", [None]):
        if item is None:
            files = [str(f) for f in base["trace"]["files"]]
        else:
            files = [item] if isinstance(item, str) else list(item)
            files = [str(Path(here, f)) for f in files]
        if not files:
            raise SpecError(f"{path}: a cell has no trace (grid.trace or base.trace.files)")
        traces.append(("+".join(Path(f).stem for f in files), files))
    sizes = [str(s) for s in grid.pop("cache_size", [None]) if s is not None] or [None]
    keys = list(grid)
    version = _native.__version__
    digests: Dict[str, str] = {}
    cells = []
    for label, files in traces:
        for combo in itertools.product(*(grid[k] for k in keys)):
            sc = copy.deepcopy(base)
            sc["trace"]["files"] = files
            params = dict(zip(keys, combo))
            for k, v in params.items():
                _set_path(sc, k, v)
            try:
                checked = load_scenario(sc)
            except ValueError as e:
                raise SpecError(f"{path}: cell {label} {params}: {e}") from None
            ident = copy.deepcopy(checked)
            ident["trace"]["files"] = [_digest_file(f, digests) for f in files]
            for s in ident.get("synthetic", []):
                s["config"] = _digest_file(s["config"], digests)
            family = hashlib.sha256(json.dumps({"v": version, "sc": ident}, sort_keys=True).encode()).hexdigest()
            for size in sizes:
                key = hashlib.sha256(json.dumps([family, size]).encode()).hexdigest()[:24]
                cells.append(Cell(key, label, params, size, checked, family))
    return Spec(path, name, metric, cells, keys)


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def run_cell(cell: Dict[str, Any]) -> Dict[str, Any]:
    """Runs one cell (in a process of its own: its peak RSS is the cell's); returns the
    total and per-VM rows and the measurements. Ray and the local pool both call this."""
    import resource

    from . import _native

    t0 = time.perf_counter()
    out = json.loads(_native.simulate(json.dumps(cell["scenario"]), "json", cell["cache_size"], None))
    elapsed = time.perf_counter() - t0
    rows = []
    for v in [out["total"], *out["vms"]]:
        row = {c: v[c] for c in _VM_COLUMNS}
        row["vm"] = v["vm"]
        row["mean_us"] = v["latency"]["mean_us"]
        row["p99_us"] = v["latency"]["p99_us"]
        rows.append(row)
    return {
        "key": cell["key"],
        "model": out["model"],
        "cache_bytes": out["resolved"]["cache_bytes"],
        "rows": rows,
        "time_s": elapsed,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def _baseline_rss() -> int:
    """RSS of a fresh process that imported the package: what every cell starts from."""
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(1, mp_context=ctx) as ex:
        return ex.submit(_import_and_measure).result()


def _import_and_measure() -> int:
    from . import _native  # noqa: F401

    return _rss_bytes()


def predict(spec: Spec, cells: Sequence[Cell], progress=None) -> None:
    """Fills each cell's `predicted` memory (bytes) and time (s) before it runs, from its
    trace's requests and working set and two short calibration runs of the cell itself
    (its first n and 2n requests, n = 2.5% of them, at least 10,000): their difference
    gives the seconds per request, the rest of the first the set-up (allocating the
    cache's slots); memory is a fresh process's RSS plus the cache's slots × the bytes
    per slot the calibration's engine reports plus the working set's share of the
    index. About 7.5% of the sweep's work."""
    from . import _native

    base_rss = _baseline_rss()
    sizes: Dict[str, Tuple[int, int]] = {}

    def timed(sc, n, size):
        sc = copy.deepcopy(sc)
        sc["replay"]["max_requests"] = n
        t0 = time.perf_counter()
        r = json.loads(_native.simulate(json.dumps(sc), "json", size, None))
        return time.perf_counter() - t0, r

    for i, c in enumerate(cells):
        tkey = json.dumps(c.scenario["trace"], sort_keys=True) + str(c.scenario["replay"].get("max_requests"))
        if tkey not in sizes:
            sizes[tkey] = tuple(_native.working_set_bytes(json.dumps(c.scenario), "json"))
        wss, requests = sizes[tkey]
        n1 = min(requests, max(10000, requests // 40))
        t1, r = timed(c.scenario, n1, c.cache_size)
        if 2 * n1 <= requests:
            t2, _ = timed(c.scenario, 2 * n1, c.cache_size)
            per_request = max(t2 - t1, 0.0) / n1 or t2 / (2 * n1)
            setup = max(t1 - per_request * n1, 0.0)
        else:
            per_request, setup = t1 / max(n1, 1), 0.0
        cache_bytes, block = _native.resolve_cache(json.dumps(c.scenario), "json", c.cache_size, wss)
        slots = cache_bytes // block
        c.predicted = {
            "predicted_time_s": setup + per_request * requests,
            "predicted_rss_bytes": base_rss + slots * r["engine"]["bytes_per_slot"] + (wss // max(block, 1)) * 16,
        }
        if progress:
            progress(i + 1, len(cells))


class _Bar:
    """A one-line progress bar on stderr (a terminal or not)."""

    def __init__(self, what: str, total: int, enabled: bool = True):
        self.what, self.total, self.enabled, self.t0 = what, total, enabled, time.monotonic()
        self.tty = sys.stderr.isatty()

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        # Not a terminal (a log): a line at each tenth, not a redraw per cell.
        if not self.tty and done < self.total and done * 10 // max(self.total, 1) == (done - 1) * 10 // max(self.total, 1):
            return
        w = 30
        fill = int(w * done / max(self.total, 1))
        el = time.monotonic() - self.t0
        eta = el / done * (self.total - done) if done else 0
        end = "" if self.tty else "\n"
        sys.stderr.write(f"\r{self.what} [{'#' * fill}{'.' * (w - fill)}] {done}/{self.total} {el:.0f}s eta {eta:.0f}s {end}")
        sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\n")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _done_cells(cells_dir: Path) -> Dict[str, Dict[str, Any]]:
    done = {}
    for p in cells_dir.glob("*.tmp"):
        p.unlink()  # a write cut short by a kill
    for p in cells_dir.glob("*.json"):
        try:
            r = json.loads(p.read_text())
            done[r["key"]] = r
        except (ValueError, KeyError):
            p.unlink()  # a cell file cut short: that cell runs again
    return done


def run_sweep(
    spec_path: os.PathLike,
    out: Optional[os.PathLike] = None,
    *,
    jobs: Optional[int] = None,
    ray_address: Optional[str] = None,
    progress: bool = True,
    predict_first: bool = True,
):
    """Runs a sweep (only its cells without a result under `out/cells/`) and writes
    `results.parquet`, `results.csv` and `summary.html` in `out` (default
    `out/sweep/<spec name>`); returns the table as a DataFrame."""
    spec = load_spec(spec_path)
    out = Path(out) if out is not None else Path("out/sweep") / Path(spec_path).stem
    cells_dir = out / "cells"
    cells_dir.mkdir(parents=True, exist_ok=True)
    done = _done_cells(cells_dir)
    todo = [c for c in spec.cells if c.key not in done]
    log = sys.stderr if progress else None
    if log:
        print(f"sweep {spec.name}: {len(spec.cells)} cells, {len(spec.cells) - len(todo)} already done", file=log)
    if todo and predict_first:
        bar = _Bar("predicting", len(todo), progress)
        predict(spec, todo, lambda d, t: bar.update(d))
        bar.finish()
    if todo:
        bar = _Bar("simulating", len(todo), progress)
        runner = _run_ray if ray_address else _run_local
        n = 0
        for c, result in runner(todo, jobs, ray_address):
            result.update(c.predicted)
            _write_atomic(cells_dir / f"{c.key}.json", json.dumps(result))
            done[c.key] = result
            n += 1
            bar.update(n)
        bar.finish()
    table = _table(spec, done)
    table.attrs["metric"] = spec.metric
    _write_outputs(spec, table, out)
    if log:
        print(f"wrote {out}/results.parquet, results.csv, summary.html", file=log)
    return table


def _cell_arg(c: Cell) -> Dict[str, Any]:
    return {"key": c.key, "scenario": c.scenario, "cache_size": c.cache_size}


def _run_local(cells: List[Cell], jobs: Optional[int], _address):
    """Each cell in a fresh process (its peak RSS its own), `jobs` at once."""
    jobs = max(1, jobs or os.cpu_count() or 1)
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(jobs, mp_context=ctx, max_tasks_per_child=1) as ex:
        futures = {ex.submit(run_cell, _cell_arg(c)): c for c in cells}
        for f in cf.as_completed(futures):
            yield futures[f], f.result()


def _run_ray(cells: List[Cell], _jobs, address: str):
    """Each cell a Ray task (one process per task, `max_calls=1`; a task whose worker
    dies is rerun elsewhere, up to 5 times), scheduled with its predicted memory. Every
    node needs the package installed and the traces at the same paths as here."""
    import ray

    ray.init(address=address, log_to_driver=False, ignore_reinit_error=True)
    task = ray.remote(max_calls=1, max_retries=5)(run_cell)
    # A cell asking for more memory than any node has would wait forever: such a cell
    # is scheduled without the request (and a warning).
    node_memory = max((n.get("Resources", {}).get("memory", 0) for n in ray.nodes() if n.get("Alive")), default=0)
    pending = {}
    for c in cells:
        opts = {"num_cpus": 1}
        mem = c.predicted.get("predicted_rss_bytes")
        if mem and mem <= node_memory:
            opts["memory"] = int(mem)
        elif mem:
            print(f"warning: cell {c.key} ({c.trace}) is predicted to need {mem / 2**30:.1f} GiB, more than any node offers", file=sys.stderr)
        pending[task.options(**opts).remote(_cell_arg(c))] = c
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                yield pending.pop(ref), ray.get(ref)
    finally:
        ray.shutdown()


def _table(spec: Spec, done: Dict[str, Dict[str, Any]]):
    import pandas as pd

    rows = []
    for c in spec.cells:
        r = done[c.key]
        for vm_row in r["rows"]:
            rows.append(
                {
                    "key": c.key,
                    "trace": c.trace,
                    **c.params,
                    "cache_size": c.cache_size if c.cache_size is not None else str(c.scenario["cache"]["size"]),
                    "cache_bytes": r["cache_bytes"],
                    "model": r["model"],
                    **vm_row,
                    **{m: r.get(m) for m in MEASURED_COLUMNS},
                }
            )
    cols = ["key", "trace", *spec.grid_keys, "cache_size", "cache_bytes", "model", "vm", *_VM_COLUMNS, "mean_us", "p99_us", *MEASURED_COLUMNS]
    return pd.DataFrame(rows, columns=cols)


def _write_outputs(spec: Spec, table, out: Path) -> None:
    table.to_csv(out / "results.csv", index=False)
    try:
        table.to_parquet(out / "results.parquet", index=False)
    except ImportError:
        print("note: pyarrow is not installed: results.parquet not written (pip install pyarrow)", file=sys.stderr)
    (out / "summary.html").write_text(summary_html(spec, table))


def best_per_trace(table, metric: str = "hit_ratio"):
    """Per trace, the cell (its total row) with the highest `metric` (ties: the first)."""
    total = table[table["vm"] == "total"]
    idx = total.groupby("trace", sort=False)[metric].idxmax()
    return total.loc[idx]


def summary_html(spec: Spec, table) -> str:
    """The HTML summary: the best configuration per trace, the predictions against the
    measurements, a plot per trace (metric against cache size, a line per policy and
    parameter), and every cell's total row."""
    import html

    total = table[table["vm"] == "total"]
    best = best_per_trace(table, spec.metric)
    show = ["trace", *spec.grid_keys, "cache_size", "model", spec.metric, "requests", "mean_us", "p99_us"]
    parts = [
        "<!doctype html><meta charset=utf-8>",
        f"<title>{html.escape(spec.name)}</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}</style>",
        f"<h1>Sweep {html.escape(spec.name)}</h1>",
        f"<p>{len(total)} cells over {total['trace'].nunique()} traces; best by <b>{html.escape(spec.metric)}</b>.</p>",
        "<h2>Best configuration per trace</h2>",
        best[show].to_html(index=False, float_format=lambda x: f"{x:.4f}"),
    ]
    if total["time_s"].notna().all() and total["predicted_time_s"].notna().all():
        rt = (total["time_s"] / total["predicted_time_s"]).agg(["min", "max"])
        rm = (total["peak_rss_bytes"] / total["predicted_rss_bytes"]).agg(["min", "max"])
        parts.append(
            f"<p>Measured ÷ predicted: time {rt['min']:.2f}–{rt['max']:.2f}×, peak memory {rm['min']:.2f}–{rm['max']:.2f}×.</p>"
        )
    parts += _plots(spec, total)
    parts += ["<h2>All cells (all VMs)</h2>", total[show + MEASURED_COLUMNS].to_html(index=False, float_format=lambda x: f"{x:.4g}")]
    return "\n".join(parts)


def _plots(spec: Spec, total) -> List[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return ["<p>(matplotlib is not installed: no plots)</p>"]
    import base64
    import io

    out = ["<h2>Plots</h2>"]
    for trace, t in total.groupby("trace", sort=False):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        lines = t.groupby(spec.grid_keys, sort=False) if spec.grid_keys else [("all", t)]
        for name, g in lines:
            g = g.sort_values("cache_bytes")
            values = name if isinstance(name, tuple) else (name,)
            label = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(spec.grid_keys, values)) or "all"
            ax.plot(g["cache_bytes"] / 2**20, g[spec.metric], marker="o", label=label)
        ax.set(title=trace, xlabel="cache (MiB)", ylabel=spec.metric)
        if len(t["cache_bytes"].unique()) > 2:
            ax.set_xscale("log")
            plain = matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}")
            ax.xaxis.set_major_formatter(plain)
            ax.xaxis.set_minor_formatter(plain)
        ax.legend(fontsize="small")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        plt.close(fig)
        out.append(f'<img alt="{trace}" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">')
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m cachevisor sweep SPEC` (what `cachevisor sweep` runs)."""
    p = argparse.ArgumentParser(prog="cachevisor sweep", description="Run a policy sweep (see cachevisor.sweep).")
    p.add_argument("spec", help="sweep spec (TOML)")
    p.add_argument("--out", help="output directory (default out/sweep/SPEC-NAME)")
    p.add_argument("--jobs", type=int, help="cells at once locally (default: one per core)")
    p.add_argument("--ray", metavar="ADDRESS", help="run each cell as a task on this Ray cluster")
    p.add_argument("--no-predict", action="store_true", help="skip the memory and time predictions")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    a = p.parse_args(argv)
    if a.jobs is not None and not 1 <= a.jobs <= 1024:
        p.error(f"--jobs {a.jobs}: expected 1 to 1024")
    try:
        table = run_sweep(a.spec, a.out, jobs=a.jobs, ray_address=a.ray, progress=not a.quiet, predict_first=not a.no_predict)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    best = best_per_trace(table, table.attrs["metric"])
    print(best.drop(columns=["key"]).to_string(index=False))
    return 0
