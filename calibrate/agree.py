"""How closely two runs of the same cells agree (CPU only): `python -m calibrate agree RUN_A RUN_B`; and whether arms
of runs differ in host time beyond the run-to-run noise: `python -m calibrate host-shift --arm NAME RUN... ...`.

For checking a run split over GPUs against one on a single GPU (or any replicate pair): per cell both measured ok,
the relative difference of the per-call GPU time (the analysis's: span for pdl rows) and the ratio of host times; and
per path, how far its GPU-time ratio to F.linear moved (what a table's decision at a cell rests on)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from calibrate.analysis import Cells
from calibrate.noise import replicate_diffs


def agreement(a: Cells, b: Cells) -> pd.DataFrame:
    rows = []
    for key in sorted(set(a.samples) & set(b.samples)):
        n, k, m, path = key
        ha, hb = a.host(n, k, m, path), b.host(n, k, m, path)
        rows.append({"n": n, "k": k, "m": m, "path": path, "gpu_a": a.gpu(*key), "gpu_b": b.gpu(*key),
                     "gpu_diff": b.gpu(*key) / a.gpu(*key) - 1, "host_ratio": hb / ha if ha > 0 else np.nan})
    return pd.DataFrame(rows)


def ratio_moves(a: Cells, b: Cells) -> pd.DataFrame:
    """Per path other than F.linear, at every cell both runs measured with F.linear: how far the path's GPU-time
    ratio to F.linear moved from run a to run b (|r_b / r_a - 1|; calibrate.noise.replicate_diffs's log ratio). A
    table's decision at a cell rests on that ratio, so this is how many decisions another machine could reverse, where
    the GPU times alone may shift together."""
    d = replicate_diffs(a, b)
    columns = ["n", "k", "m", "path", "ratio_a", "ratio_b", "move"]
    return d.assign(move=np.expm1(d["d"]))[columns] if not d.empty else pd.DataFrame(columns=columns)


def ratio_lines(moves: pd.DataFrame) -> list[str]:
    lines = []
    for path, g in moves.groupby("path"):
        d = g["move"].abs()
        lines.append(f"  {path}: {len(g)} cells, median {d.median():.2%}, p90 {d.quantile(0.9):.2%}, "
                     f"moved > 3%: {int((d > 0.03).sum())}, > 5%: {int((d > 0.05).sum())}")
    return ["ratio to F.linear, |b/a - 1| per path:", *lines] if lines else []


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


# ------------------------------------------------------------------ host time under concurrency (arms of runs)
SHIFT_LEVEL = 0.90  # two-sided level of the intervals host_shift prints


@dataclass
class HostShift:
    """Host time of arms of runs of the same cells (e.g. 1 GPU, 2 GPUs serialized, 2 GPUs concurrent):
    `factors` per run (median over cells of its host time over the cell's mean over all runs, a ratio), `noise`
    the pooled within-arm spread of those factors (a ratio: 1.08 = runs of one arm differ by 8% (one sd)),
    `pairs` per arm pair: the median over cells of the arm-mean ratio (with a bootstrap interval over cells) and
    the run-level ratio of the arms' mean factors (with a t interval from the within-arm spread), and whether the
    run-level interval excludes 1: a shift beyond the run-to-run noise."""
    cells: int
    factors: dict[str, dict[str, float]]  # arm -> run -> factor
    noise: float
    pairs: list[dict]


def t_quantile(p: float, dof: int) -> float:
    """Student's t quantile by the Cornish-Fisher expansion around the normal one (within 0.1% of the exact value
    for dof >= 5 at the levels used here), so that no statistics package is needed."""
    from statistics import NormalDist
    z = NormalDist().inv_cdf(p)
    return (z + (z ** 3 + z) / (4 * dof) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * dof ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * dof ** 3))


def host_shift(arms: dict[str, dict[str, Cells]], boot: int = 2000, seed: int = 0) -> HostShift:
    runs = {(arm, name): c for arm, named in arms.items() for name, c in named.items()}
    if len(arms) < 2 or any(len(named) < 2 for named in arms.values()):
        raise ValueError("host_shift needs two or more arms of two or more runs each")
    keys = sorted(set.intersection(*(set(c.samples) for c in runs.values())))
    logs = pd.DataFrame({r: [math.log(c.host(*k)) if c.host(*k) > 0 else np.nan for k in keys]
                         for r, c in runs.items()}).dropna()
    if logs.empty:
        raise ValueError("the runs share no cell with a host time in all of them")
    rel = logs.sub(logs.mean(axis=1), axis=0).median(axis=0)  # log factor per run
    factors = {arm: {name: math.exp(rel[(arm, name)]) for name in named} for arm, named in arms.items()}
    within = [rel[[(arm, n) for n in named]] for arm, named in arms.items()]
    dof = sum(len(w) - 1 for w in within)
    pooled = math.sqrt(sum(((w - w.mean()) ** 2).sum() for w in within) / dof)
    rng = np.random.default_rng(seed)
    q = (1 - SHIFT_LEVEL) / 2
    pairs = []
    names = list(arms)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            d = (logs[[(b, n) for n in arms[b]]].mean(axis=1) - logs[[(a, n) for n in arms[a]]].mean(axis=1)).to_numpy()
            meds = np.median(rng.choice(d, (boot, len(d))), axis=1)
            run_d = rel[[(b, n) for n in arms[b]]].mean() - rel[[(a, n) for n in arms[a]]].mean()
            half = t_quantile(1 - q, dof) * pooled * math.sqrt(1 / len(arms[a]) + 1 / len(arms[b]))
            pairs.append({"pair": f"{b} / {a}", "cells": math.exp(np.median(d)),
                          "cells_lo": math.exp(np.quantile(meds, q)), "cells_hi": math.exp(np.quantile(meds, 1 - q)),
                          "runs": math.exp(run_d), "runs_lo": math.exp(run_d - half), "runs_hi": math.exp(run_d + half),
                          "beyond_noise": abs(run_d) > half})
    return HostShift(len(logs), factors, math.exp(pooled), pairs)


def host_shift_lines(s: HostShift) -> list[str]:
    lines = [f"{s.cells} cells measured ok in every run; host time per run over the cells' mean over all runs "
             f"(median over cells):"]
    for arm, f in s.factors.items():
        lines.append(f"  {arm:12s} " + "  ".join(f"{n} {v:.3f}" for n, v in f.items()))
    lines.append(f"run-to-run noise (pooled within-arm sd of those factors): {s.noise - 1:.1%}")
    pct = round(SHIFT_LEVEL * 100)
    for p in s.pairs:
        word = "a shift beyond the run-to-run noise" if p["beyond_noise"] else "no shift beyond the run-to-run noise"
        lines.append(f"  {p['pair']:24s} per cell {p['cells']:.3f} [{p['cells_lo']:.3f}, {p['cells_hi']:.3f}]   "
                     f"per run {p['runs']:.3f} [{p['runs_lo']:.3f}, {p['runs_hi']:.3f}] ({pct}%): {word}")
    return lines
