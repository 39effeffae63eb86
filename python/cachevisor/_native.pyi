"""Type stubs of the native module (crates/python); the documented API is the
pure-Python layer around it."""

from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

__version__: str

def simulate(
    scenario: str,
    source: str,
    cache_size: Optional[str] = None,
    progress: Optional[Callable[[int, Optional[int]], object]] = None,
) -> str: ...
def simulate_cluster(
    scenario: str, source: str, progress: Optional[Callable[[int, Optional[int]], object]] = None
) -> str: ...
def scenario_json(scenario: str, source: str) -> str: ...
def working_set_bytes(scenario: str, source: str) -> Tuple[int, int]: ...
def resolve_cache(
    scenario: str, source: str, cache_size: Optional[str] = None, wss_bytes: Optional[int] = None
) -> Tuple[int, int]: ...
def mrc(
    files: Sequence[str],
    *,
    format: Optional[str] = None,
    vm_mode: Optional[str] = None,
    skip_bad: bool = False,
    blkparse_action: Optional[str] = None,
    csv_columns: Optional[str] = None,
    rename: Optional[Mapping[str, str]] = None,
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
) -> str: ...
def allocators() -> List[str]: ...
def allocate(
    name: str, capacity: int, vms: Sequence[Dict[str, object]], *, unit: int = 1, params: Optional[Mapping[str, float]] = None
) -> str: ...
def solve_cluster(
    solver: str, latencies: Mapping[str, float], capacity: Sequence[int], vms: Sequence[Tuple[int, Sequence[float]]]
) -> str: ...

class TraceReader:
    def __init__(
        self,
        files: Sequence[str],
        *,
        format: Optional[str] = None,
        vm_mode: Optional[str] = None,
        skip_bad: bool = False,
        blkparse_action: Optional[str] = None,
        csv_columns: Optional[str] = None,
        rename: Optional[Mapping[str, str]] = None,
        rebase: bool = True,
    ) -> None: ...
    def read_batch(self, n: int) -> Dict[str, object]: ...
    def vm_names(self) -> List[str]: ...
    @property
    def requests(self) -> int: ...
    def counts(self) -> List[Tuple[str, int, int, Optional[str]]]: ...
    def close(self) -> None: ...
