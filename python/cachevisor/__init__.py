"""cachevisor from Python: the simulator, the trace readers, the demand estimators, the
allocators and ELICA's cluster solver of the `cachevisor` CLI, in one process.

The numbers are the CLI's: every function calls the same Rust crates (the native module
`cachevisor._native`), and a simulation returns exactly the JSON `cachevisor simulate`
writes as `result.json`. Long calls release the GIL, so threads run simulations in
parallel.

    >>> import cachevisor as cv
    >>> r = cv.simulate({"trace": {"files": ["web.csv"]}, "cache": {"size": "1GiB"}})
    >>> r.vms[["vm", "hit_ratio"]]
    >>> m = cv.mrc(["web.csv"], method="shards", rate=0.01)
    >>> m.curves.plot(x="size_bytes", y="miss_ratio")

Modules: :mod:`cachevisor.traces` (reading traces), :mod:`cachevisor.simulation`
(scenarios and results), :mod:`cachevisor.curves` (MRCs, allocators, the cluster solver).
"""

from ._native import __version__
from .curves import MrcResult, allocate, allocators, mrc, solve_cluster
from .simulation import ClusterResult, SimulationResult, load_scenario, simulate, simulate_cluster, working_set_bytes
from .traces import Request, TraceBatch, iter_batches, iter_requests, read_trace

__all__ = [
    "__version__",
    "ClusterResult",
    "MrcResult",
    "Request",
    "SimulationResult",
    "TraceBatch",
    "allocate",
    "allocators",
    "iter_batches",
    "iter_requests",
    "load_scenario",
    "mrc",
    "read_trace",
    "simulate",
    "simulate_cluster",
    "solve_cluster",
    "working_set_bytes",
]
