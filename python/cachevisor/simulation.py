"""Simulations: a scenario — a TOML file (what `cachevisor simulate --scenario` reads), TOML
text, or a dict of the same sections (`cache`, `devices`, `replay`, `trace`, `vm`,
`phase`, `failover`, `node`, `cluster`) — run by the CLI's simulator. The result is the
CLI's `result.json` (:attr:`SimulationResult.json`, identical text) with per-VM and
per-window tables as pandas DataFrames."""

from __future__ import annotations

import functools
import json
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional, Tuple, Union

from . import _native

if TYPE_CHECKING:
    import pandas as pd

ScenarioLike = Union[str, "os.PathLike[str]", Mapping[str, Any]]
Progress = Callable[[int, Optional[int]], Any]


def _source(scenario: ScenarioLike) -> Tuple[str, str]:
    """(text, kind) for the native module: a path (`file`), TOML text or a dict (`json`)."""
    if isinstance(scenario, Mapping):
        return json.dumps(scenario), "json"
    if isinstance(scenario, os.PathLike):
        return os.fspath(scenario), "file"
    if isinstance(scenario, str):
        # An existing file is a file even when its path has `=` in it (`runs/size=5%/s.toml`).
        if os.path.isfile(scenario) or not ("\n" in scenario or "=" in scenario or scenario.lstrip().startswith("[")):
            return scenario, "file"
        return scenario, "toml"
    raise TypeError(f"scenario: expected a path, TOML text or a dict, not {type(scenario).__name__}")


def load_scenario(scenario: ScenarioLike) -> Dict[str, Any]:
    """The scenario as a dict with every default filled in (from a file, relative trace
    paths resolved against its directory): change it and pass it to :func:`simulate`."""
    return json.loads(_native.scenario_json(*_source(scenario)))


def working_set_bytes(scenario: ScenarioLike) -> int:
    """Distinct blocks the scenario's inputs touch × its block size (what a cache size
    given as a fraction is a fraction of)."""
    return _native.working_set_bytes(*_source(scenario))[0]


def trace_size(scenario: ScenarioLike) -> Tuple[int, int]:
    """`(working set bytes, requests)` the scenario replays (up to
    `replay.max_requests`), in one pass over its inputs."""
    return tuple(_native.working_set_bytes(*_source(scenario)))


class SimulationResult:
    """One run's result.

    Attributes: `json` (the CLI's `result.json` text), `raw` (it parsed), `model`
    (`cache` or `full`) and `model_reason`, `vms` (one row per VM; latency columns
    flattened as `latency.p99_us`, ...), `total` (the all-VM row as a Series), `windows`
    (one row per window and VM), `devices`, `scenario` (the dict that ran).
    """

    def __init__(self, text: str):
        self.json: str = text
        self.raw: Dict[str, Any] = json.loads(text)
        self.model: str = self.raw["model"]
        self.model_reason: str = self.raw["model_reason"]
        self.scenario: Dict[str, Any] = self.raw["scenario"]

    # The tables are built on first use: importing pandas takes longer than a
    # million-request simulation (0.25 s against 0.13 s, measured), and a caller asking
    # for `hit_ratio` needs none of it.
    @functools.cached_property
    def vms(self) -> "pd.DataFrame":
        import pandas as pd

        return pd.json_normalize(self.raw["vms"])

    @functools.cached_property
    def total(self) -> "pd.Series":
        import pandas as pd

        return pd.json_normalize([self.raw["total"]]).iloc[0]

    @functools.cached_property
    def windows(self) -> "pd.DataFrame":
        import pandas as pd

        return pd.DataFrame(self.raw["windows"])

    @functools.cached_property
    def devices(self) -> "pd.DataFrame":
        import pandas as pd

        return pd.DataFrame(self.raw["devices"])

    @property
    def hit_ratio(self) -> float:
        """All VMs' request hit ratio."""
        return float(self.raw["total"]["hit_ratio"])

    def __repr__(self) -> str:
        return (
            f"SimulationResult(model={self.model}, vms={len(self.vms)}, requests={self.raw['total']['requests']}, "
            f"hit_ratio={self.hit_ratio:.4f})"
        )


def simulate(
    scenario: ScenarioLike,
    *,
    cache_size: Optional[str] = None,
    progress: Optional[Progress] = None,
    **sections: Mapping[str, Any],
) -> SimulationResult:
    """Runs a one-host scenario.

    `cache_size` overrides `cache.size`: absolute (`"4GiB"`) or a fraction of the working
    set (`"0.01"`, `"5%"`), as `simulate --cache-size` takes it. Keyword sections
    (`cache={...}`, `replay={...}`, ...) are merged key by key over the scenario's (which
    is then read as a dict). `progress(done, total)` is called at most ten times a second
    during the run (`total` is None when unknown); an exception it raises is raised after
    the run. Bad keys raise ValueError naming them; an unreadable trace OSError.
    """
    if sections:
        base = load_scenario(scenario)
        for name, values in sections.items():
            if isinstance(values, Mapping) and isinstance(base.get(name), dict):
                base[name] = {**base[name], **values}
            else:
                base[name] = values
        scenario = base
    text, kind = _source(scenario)
    if cache_size is not None:
        cache_size = str(cache_size)
    return SimulationResult(_native.simulate(text, kind, cache_size, progress))


class ClusterResult:
    """A cluster run's result: `json` (the CLI's `cluster.json` text), `raw`, and its
    tables as DataFrames: `vms`, `nodes`."""

    def __init__(self, text: str):
        self.json: str = text
        self.raw: Dict[str, Any] = json.loads(text)

    @functools.cached_property
    def vms(self) -> "pd.DataFrame":
        import pandas as pd

        return pd.json_normalize(self.raw.get("vms", []))

    @functools.cached_property
    def nodes(self) -> "pd.DataFrame":
        import pandas as pd

        return pd.json_normalize(self.raw.get("nodes", []))

    def __repr__(self) -> str:
        return f"ClusterResult(nodes={len(self.nodes)}, vms={len(self.vms)})"


def simulate_cluster(scenario: ScenarioLike, *, progress: Optional[Progress] = None) -> ClusterResult:
    """Runs a cluster scenario (`[[node]]` sections, ELICA); `progress(requests, None)`."""
    return ClusterResult(_native.simulate_cluster(*_source(scenario), progress))
