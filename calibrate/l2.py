"""Dispatch decisions under three L2 states (CPU only): the same cells swept with --l2 rotate, flush and warm.

A cell's GPU time depends on whether its weight is in L2: a narrow GEMM at small M is a weight read, and a warm L2
makes it several times cheaper. Which state a forward sees depends on what ran before (in a real forward the previous
layers' weights have evicted this one's). This module says which decisions flip with the state, and which state's
cell-sum model comes closest to a measured forward."""
from __future__ import annotations

import numpy as np
import pandas as pd

from calibrate.analysis import Cells, low_m_measured, verdict
from dispatch.backends import ATEN
from dispatch.table import ThresholdTable

MODES = ("rotate", "flush", "warm")


def close_cells(cells: Cells, table: ThresholdTable, within: float = 0.10) -> list[tuple[int, int, int]]:
    """(n, k, m) where the table's low-M backend and aten are within `within` of each other (GPU time medians)."""
    low = low_m_measured(cells, table)
    out = []
    for n, k in cells.shapes():
        for m in cells.ms(n, k):
            if cells.has(n, k, m, low) and cells.has(n, k, m, ATEN):
                if abs(cells.gpu_ratio(n, k, m, low, ATEN) - 1) <= within:
                    out.append((n, k, m))
    return out


def decisions(runs: dict[str, Cells], table: ThresholdTable, keys: list[tuple[int, int, int]],
              margin: float = 0.03) -> pd.DataFrame:
    """Per cell and L2 mode: low-M/aten ratio with its interval, the verdict, the faster path, and whether the faster
    path differs from the rotate mode's (a flip) and from the committed table's choice (graph regime: these are
    GPU-time decisions)."""
    low = low_m_measured(next(iter(runs.values())), table)
    rows = []
    for n, k, m in keys:
        row: dict = {"n": n, "k": k, "m": m, "table_choice": table.choose(n, k, m)}
        for mode, cells in runs.items():
            if not (cells.has(n, k, m, low) and cells.has(n, k, m, ATEN)):
                row[f"{mode}_ratio"] = np.nan
                row[f"{mode}_faster"] = ""
                continue
            r, lo, hi = cells.ratio_ci(n, k, m, low, ATEN, seed=m)
            row[f"{mode}_ratio"] = r
            row[f"{mode}_verdict"] = verdict(lo, hi, margin)
            row[f"{mode}_faster"] = low if r < 1 else ATEN
        faster = {row.get(f"{mode}_faster") for mode in runs if row.get(f"{mode}_faster")}
        row["flips"] = len(faster) > 1
        rows.append(row)
    return pd.DataFrame(rows)
