"""Demand curves and what is decided from them: per-VM LRU miss-ratio curves of a trace
(exact, or SHARDS-sampled at a fixed rate or size — what `cachevisor analyze mrc`
computes), the registry's allocators run once on given demands (ECI-Cache, S-CAVE,
SymFlex, ours, ...), and ELICA's Eq. 4 (local and remote cache per VM across nodes)
solved for given hit-ratio curves."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _native

PathLike = Union[str, "os.PathLike[str]"]


class MrcResult:
    """Per-VM miss-ratio curves and sizes.

    `summary`: one row per VM (`vm`, `block_accesses`, `read_accesses`, `wss_bytes`,
    `wss80_bytes`, `hit_ratio_at_wss`, `max_stack_distance`, `elica_ideal_max_bytes`,
    `elica_ideal_percentile_bytes`, `urd_size_bytes`, `estimator_memory_bytes`);
    `curves`: one row per VM and size (`vm`, `size_blocks`, `size_bytes`, `miss_ratio`),
    every VM on the same sizes; `raw`: the JSON parsed (`block_size`, `method`, `kind`,
    `percentile`, ...).
    """

    def __init__(self, text: str):
        import pandas as pd

        self.raw: Dict[str, Any] = json.loads(text)
        self.block_size: int = self.raw["block_size"]
        self.summary = pd.DataFrame(self.raw["vms"])
        rows = [
            (v["vm"], p["blocks"], p["blocks"] * self.block_size, p["miss_ratio"])
            for v, curve in zip(self.raw["vms"], self.raw["curves"])
            for p in curve
        ]
        self.curves = pd.DataFrame(rows, columns=["vm", "size_blocks", "size_bytes", "miss_ratio"])

    def wide(self):
        """The curves one column per VM, as `analyze mrc` writes `mrc.csv`."""
        w = self.curves.pivot(index=["size_bytes", "size_blocks"], columns="vm", values="miss_ratio")
        w = w[[v["vm"] for v in self.raw["vms"]]].reset_index()
        w.columns.name = None
        return w

    def demands(self) -> List[Dict[str, Any]]:
        """Each VM's demand for :func:`allocate` (`hit_curve`, `read_curve`, `accesses`;
        weight 1): needs `mrc(..., hit_curve_unit=U)`, then allocate with `unit=U`."""
        if "hit_curves" not in self.raw:
            raise ValueError("hit curves were not computed: call mrc(..., hit_curve_unit=BLOCKS)")
        return [
            {"vm": v["vm"], "hit_curve": h["hit_curve"], "read_curve": h["read_curve"], "accesses": h["accesses"]}
            for v, h in zip(self.raw["vms"], self.raw["hit_curves"])
        ]

    def __repr__(self) -> str:
        return f"MrcResult(vms={len(self.summary)}, method={self.raw['method']}, kind={self.raw['kind']})"


def mrc(
    files: Union[PathLike, Sequence[PathLike]],
    *,
    block_size: int = 4096,
    method: str = "exact",
    rate: Optional[float] = None,
    max_blocks: Optional[int] = None,
    seed: int = 0,
    shards_correction: str = "size-biased",
    kind: str = "all",
    percentile: float = 0.95,
    points: int = 200,
    hit_curve_unit: Optional[int] = None,
    **options,
) -> MrcResult:
    """Per-VM LRU miss-ratio curves of `files` (merged by time, each file's VMs).

    `method`: `exact` or `shards` (`rate` in (0, 1], or `max_blocks` for fixed-size;
    rate 0.01 when neither; `seed` picks SHARDS' hash, i.e. which blocks are sampled);
    `shards_correction`: `size-biased` or `first-bucket` (FAST'15's SHARDS_adj); `kind`:
    `all`, `read`, `write` or `urd`; `points` sizes per
    curve; `percentile` for ELICA's and the URD size; `hit_curve_unit` (blocks) adds
    each VM's hit curves for :meth:`MrcResult.demands`. `options` are the trace options
    of :func:`cachevisor.iter_batches`."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    return MrcResult(
        _native.mrc(
            [os.fspath(f) for f in files],
            block_size=block_size,
            method=method,
            rate=rate,
            max_blocks=max_blocks,
            seed=seed,
            shards_correction=shards_correction,
            kind=kind,
            percentile=percentile,
            points=points,
            hit_curve_unit=hit_curve_unit,
            **options,
        )
    )


def allocators() -> List[str]:
    """The allocator names `allocate` (and a scenario's `cache.allocator`) accept."""
    return list(_native.allocators())


def allocate(
    name: str,
    capacity: int,
    vms: Sequence[Mapping[str, Any]],
    *,
    unit: int = 1,
    params: Optional[Mapping[str, float]] = None,
) -> Dict[str, Any]:
    """Runs allocator `name` once: a pool of `capacity` blocks shared by `vms`, each a
    dict of the allocator contract's fields (`weight`, `min_blocks`, `hit_curve` and
    `read_curve` — hits at sizes 0, unit, 2·unit, … blocks —, `accesses`, `used_blocks`,
    `recs`, `hit_ratio`, `throughput_ratio`, `hit_throughput`, `write_policy`, ...; a
    `vm` key rides along). Returns `{"targets": [blocks per VM], "write_policies": [...],
    "uncapped": bool, "paced_shrinks": bool}`."""
    return json.loads(_native.allocate(name, int(capacity), [dict(v) for v in vms], unit=int(unit), params=dict(params or {})))


def solve_cluster(
    capacity: Sequence[int],
    vms: Sequence[Tuple[int, Sequence[float]]],
    latencies: Mapping[str, float],
    *,
    solver: str = "exact",
) -> Dict[str, Any]:
    """ELICA's Eq. 4: each VM `(home node, hit ratio at 0, 1, 2, … units)` gets local
    units on its home and remote units on other nodes, each node holding at most its
    `capacity` units, minimising the summed average latency (Eq. 3) under `latencies`
    (`ssd_local_us`, `ssd_remote_us`, `network_us`, `hdd_us`). `solver`: `exact`,
    `ilp` or `fast`. Returns `{"local": [...], "remote": [[(node, units), ...], ...],
    "total_avl": µs}`."""
    out = json.loads(
        _native.solve_cluster(
            solver, {k: float(v) for k, v in latencies.items()}, [int(c) for c in capacity], [(int(h), [float(x) for x in c]) for h, c in vms]
        )
    )
    out["remote"] = [[tuple(r) for r in rs] for rs in out["remote"]]
    return out
