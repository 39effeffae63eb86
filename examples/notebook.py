"""A notebook-style tour of the Python package: read a trace, plot its miss-ratio curves
(exact and SHARDS), compare replacement policies across cache sizes with the simulator,
and let an allocator split a cache between two VMs. Run cell by cell in Jupyter, or as a
script (figures go to OUT, default out/notebook):

    python examples/notebook.py [TRACES_DIR] [OUT]
"""

# %% Setup
import sys
from pathlib import Path

import matplotlib

if __name__ == "__main__" and "ipykernel" not in sys.modules:
    matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

import cachevisor as cv

here = Path(__file__).resolve().parent
traces = Path(sys.argv[1]) if len(sys.argv) > 1 else here.parent.parent / "shared" / "traces"
out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("out/notebook")
out.mkdir(parents=True, exist_ok=True)
vdi = traces / "cloudPhysicsIO.vscsi"
pair = [traces / "tpcc-small.mqsim.txt", traces / "websearch-small.mqsim.txt"]

# %% The trace as a DataFrame
df = cv.read_trace(vdi).to_pandas()
print(f"{len(df):,} requests, {df['op'].eq('read').mean():.0%} reads, {df['len'].sum() / 2**30:.2f} GiB moved")

# %% Miss-ratio curves: exact against SHARDS at R = 0.01
exact = cv.mrc(vdi)
shards = cv.mrc(vdi, method="shards", rate=0.01)
fig, ax = plt.subplots(figsize=(6, 4))
for name, m, style in (("exact", exact, "-"), ("SHARDS R=0.01", shards, "--")):
    c = m.curves
    ax.plot(c["size_bytes"] / 2**30, c["miss_ratio"], style, label=name)
mae = (exact.curves["miss_ratio"] - shards.curves["miss_ratio"]).abs().mean()
ax.set(xlabel="cache size (GiB)", ylabel="LRU miss ratio", title=f"{vdi.stem}: MRC (SHARDS MAE {mae:.4f})", ylim=(0, 1.05))
ax.legend()
fig.tight_layout()
fig.savefig(out / "mrc.png", dpi=120)
print(exact.summary[["vm", "wss_bytes", "wss80_bytes", "urd_size_bytes"]].to_string(index=False))

# %% Policies × sizes (fractions of the working set), one simulation each
rows = []
for policy in ("lru", "fifo", "clock", "s3fifo"):
    for size in ("1%", "5%", "10%", "25%"):
        r = cv.simulate(
            {"trace": {"files": [str(vdi)]}, "cache": {"replacement": policy, "partition": "shared"}},
            cache_size=size,
        )
        rows.append({"policy": policy, "size": size, "cache_bytes": r.raw["resolved"]["cache_bytes"], "hit_ratio": r.hit_ratio})
cmp = pd.DataFrame(rows)
table = cmp.pivot(index="size", columns="policy", values="hit_ratio").loc[["1%", "5%", "10%", "25%"]]
print(table.round(4).to_string())
ax = table.plot(kind="bar", figsize=(6, 4), rot=0, title=f"{vdi.stem}: request hit ratio by policy")
ax.set(xlabel="cache size (share of the working set)", ylabel="hit ratio")
ax.figure.tight_layout()
ax.figure.savefig(out / "policies.png", dpi=120)

# %% An allocator splits 64 MiB between two VMs from their curves
unit = 256  # blocks per curve step (1 MiB of 4 KiB blocks)
m = cv.mrc(pair, hit_curve_unit=unit)
capacity = 64 * 2**20 // 4096
for name in ("static", "optimal"):
    t = cv.allocate(name, capacity, m.demands(), unit=unit)["targets"]
    print(f"{name:>8}: " + ", ".join(f"{v} {b * 4096 / 2**20:.0f} MiB" for v, b in zip(m.summary["vm"], t)))
print(f"figures in {out}")
