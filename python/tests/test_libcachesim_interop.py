"""Where a user has both packages: one trace, the same LRU and FIFO miss ratios through
libCacheSim's Python package and through cachevisor (block-sized objects of an
oracleGeneral trace; cache sizes in whole blocks)."""

import pytest

import cachevisor as cv

lcs = pytest.importorskip("libcachesim")


@pytest.mark.parametrize("policy", ["lru", "fifo"])
@pytest.mark.parametrize("blocks", [100, 1000, 5000])
def test_same_miss_ratios_as_libcachesim(zipf, policy, blocks):
    reader = lcs.TraceReader(str(zipf), lcs.TraceType.ORACLE_GENERAL_TRACE)
    cache = {"lru": lcs.LRU, "fifo": lcs.FIFO}[policy](cache_size=blocks * 4096)
    theirs, _byte_miss_ratio = cache.process_trace(reader)
    ours = cv.simulate(
        {
            "trace": {"files": [str(zipf)], "format": "oracle-general"},
            "cache": {"size": f"{blocks * 4096}B", "replacement": policy, "partition": "shared"},
        }
    )
    assert ours.raw["total"]["requests"] == 50000
    assert 1.0 - ours.hit_ratio == pytest.approx(theirs, abs=1e-12)
