"""How closely two runs of the same cells agree (CPU only): `python -m calibrate agree RUN_A RUN_B`.

For checking a run split over GPUs against one on a single GPU (or any replicate pair): per cell both measured ok,
the relative difference of the per-call GPU time (the analysis's: span for pdl rows) and the ratio of host times."""
from __future__ import annotations

import numpy as np
import pandas as pd

from calibrate.analysis import Cells


def agreement(a: Cells, b: Cells) -> pd.DataFrame:
    rows = []
    for key in sorted(set(a.samples) & set(b.samples)):
        n, k, m, path = key
        ha, hb = a.host(n, k, m, path), b.host(n, k, m, path)
        rows.append({"n": n, "k": k, "m": m, "path": path, "gpu_a": a.gpu(*key), "gpu_b": b.gpu(*key),
                     "gpu_diff": b.gpu(*key) / a.gpu(*key) - 1, "host_ratio": hb / ha if ha > 0 else np.nan})
    return pd.DataFrame(rows)


def summary_lines(df: pd.DataFrame) -> list[str]:
    if df.empty:
        return ["the runs share no cell measured ok in both"]
    d = df["gpu_diff"].abs()
    h = df["host_ratio"].dropna()
    lines = [f"{len(df)} cells measured ok in both runs",
             f"GPU time, |b/a - 1|: median {d.median():.2%}, p90 {d.quantile(0.9):.2%}, max {d.max():.2%}; "
             f"median signed {df['gpu_diff'].median():+.2%}"]
    if len(h):
        lines.append(f"host time, b/a: median {h.median():.3f}, p10-p90 {h.quantile(0.1):.3f}-{h.quantile(0.9):.3f}")
    return lines
