"""Reading block traces: every format the CLI reads (MSR, SNIA/CloudPhysics vscsi,
blkparse, MQSim, libCacheSim oracleGeneral, generic CSV with a column mapping, ...;
detected from content when `format` is not given), several files merged by time with
each file's VMs, into NumPy columns, a pandas DataFrame, an Arrow table, or an iterator
of requests."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Iterator, List, NamedTuple, Optional, Sequence, Union

if TYPE_CHECKING:
    import numpy as np  # imported where used: it costs 60 ms at `import cachevisor`

from ._native import TraceReader

PathLike = Union[str, "os.PathLike[str]"]

_DTYPES = {"time_ns": "<u8", "vm": "<u4", "op": "u1", "offset": "<u8", "len": "<u4"}


class Request(NamedTuple):
    """One request: time from the trace's start (ns), VM name, `read`/`write`, byte
    offset and length."""

    time_ns: int
    vm: str
    op: str
    offset: int
    len: int


@dataclass
class TraceBatch:
    """Requests as NumPy columns: `time_ns` (uint64), `vm` (uint32, an index into
    `vm_names`), `op` (uint8: 0 read, 1 write), `offset` and `len` (bytes)."""

    time_ns: np.ndarray
    vm: np.ndarray
    op: np.ndarray
    offset: np.ndarray
    len: np.ndarray
    vm_names: List[str]

    def __len__(self) -> int:
        return int(self.time_ns.shape[0])

    def columns(self) -> Dict[str, np.ndarray]:
        """The five columns by name."""
        return {k: getattr(self, k) for k in _DTYPES}

    def to_pandas(self):
        """A DataFrame with `vm` and `op` as categoricals of names."""
        import numpy as np
        import pandas as pd

        names = list(self.vm_names)
        return pd.DataFrame(
            {
                "time_ns": self.time_ns,
                "vm": pd.Categorical.from_codes(self.vm.astype(np.int64), categories=names)
                if names
                else pd.Categorical([]),
                "op": pd.Categorical.from_codes(self.op.astype(np.int64), categories=["read", "write"]),
                "offset": self.offset,
                "len": self.len,
            }
        )

    def to_arrow(self):
        """A `pyarrow.Table` (`vm` dictionary-encoded by name, `op` as a bool `write`)."""
        import numpy as np
        import pyarrow as pa

        vm = pa.DictionaryArray.from_arrays(pa.array(self.vm.astype(np.int32)), pa.array(list(self.vm_names), pa.string()))
        return pa.table(
            {
                "time_ns": pa.array(self.time_ns),
                "vm": vm,
                "write": pa.array(self.op.astype(bool)),
                "offset": pa.array(self.offset),
                "len": pa.array(self.len),
            }
        )


def _open(files, **options) -> TraceReader:
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    return TraceReader([os.fspath(f) for f in files], **options)


def _columns(raw: dict) -> Dict[str, np.ndarray]:
    import numpy as np

    return {k: np.frombuffer(raw[k], dtype=dt) for k, dt in _DTYPES.items()}


def iter_batches(
    files: Union[PathLike, Sequence[PathLike]], batch_size: int = 65536, **options
) -> Iterator[TraceBatch]:
    """Reads `files` in batches of at most `batch_size` requests. `options` are the
    CLI's trace options: `format`, `vm_mode` (`file` or `device`), `skip_bad`,
    `blkparse_action`, `csv_columns`, `rename` (a dict), `rebase` (default True: each
    file starts at time 0). A malformed record raises ValueError naming its file and
    line, after the batches before it."""
    reader = _open(files, **options)
    try:
        while True:
            raw = reader.read_batch(batch_size)
            if raw["rows"] == 0:
                return
            yield TraceBatch(vm_names=reader.vm_names(), **_columns(raw))
    finally:
        reader.close()


def read_trace(files: Union[PathLike, Sequence[PathLike]], max_requests: Optional[int] = None, **options) -> TraceBatch:
    """The whole trace (or its first `max_requests`) as one :class:`TraceBatch`; see
    :func:`iter_batches` for `options`."""
    import numpy as np

    reader = _open(files, **options)
    parts: List[Dict[str, np.ndarray]] = []
    left = max_requests if max_requests is not None else -1
    try:
        while left != 0:
            n = 1 << 20 if left < 0 else min(left, 1 << 20)
            raw = reader.read_batch(n)
            if raw["rows"] == 0:
                break
            parts.append(_columns(raw))
            if left > 0:
                left -= raw["rows"]
        names = reader.vm_names()
    finally:
        reader.close()
    cols = {k: np.concatenate([p[k] for p in parts]) if parts else np.empty(0, dt) for k, dt in _DTYPES.items()}
    return TraceBatch(vm_names=names, **cols)


def iter_requests(files: Union[PathLike, Sequence[PathLike]], **options) -> Iterator[Request]:
    """Every request as a :class:`Request` (slower than batches: one Python object per
    request); see :func:`iter_batches` for `options`."""
    for b in iter_batches(files, **options):
        names = b.vm_names
        for t, v, o, off, ln in zip(b.time_ns.tolist(), b.vm.tolist(), b.op.tolist(), b.offset.tolist(), b.len.tolist()):
            yield Request(t, names[v], "write" if o else "read", off, ln)
