"""A fit that prefers few ranges: per shape and regime, the fewest contiguous M ranges (one path each) whose cost
stays within a tolerance of the per-M best, where every range that is not F.linear beats F.linear beyond the noise
over its span. Dynamic programming over the measured M, not a stack of rules.

Rule, in a sentence: at every measured M a range's path costs at most (1 + tolerance) x the cheapest there of
F.linear and the paths that beat F.linear beyond the noise at that M; a FlashInfer range's cost over its span (geometric mean of its per-M ratios to F.linear, each judged at
the upper end of its interval widened by the noise floor) lies below 1 - min_gain; among the segmentations with the
fewest ranges, the one with the lowest total cost; F.linear wins ties.
"""
from __future__ import annotations

import math
from typing import Any

import pandas as pd

from calibrate.analysis import Cells, calibrated_ratio, dispatch_candidates, shapes_to_fit
from dispatch.backends import ATEN
from dispatch.table import REGIMES, ThresholdTable, compress, describe_ranges
from harness.errors import HarnessError

DEFAULT_TOLERANCE = 0.02
RULE = ("fewest M ranges per shape and regime such that at every measured M the range's path costs at most "
        "(1 + tolerance) x the cheapest there of F.linear and the paths that beat it beyond the noise, and every FlashInfer range's geometric-mean ratio to "
        "F.linear over its span (each M at the top of its noise-widened interval) lies below 1 - min_gain; "
        "graph cost: GPU time, eager cost: max(host, GPU) per call; ties to the lower total cost, then F.linear")


def _upper_ratio(cells: Cells, n: int, k: int, m: int, path: str, regime: str, noise: Any) -> float:
    """A conservative ratio of path over F.linear at one cell: the interval's top in the graph regime, the 80th
    percentile cost over F.linear's 20th (widened by the floor) eagerly."""
    if regime == "graph":
        return calibrated_ratio(cells, n, k, m, path, ATEN, noise, m)[2]
    floor = math.exp(noise.half_width(cells.gpu(n, k, m, ATEN))) if noise is not None else 1.0
    return cells.cost_bound(n, k, m, path, "p80") * floor / cells.cost_bound(n, k, m, ATEN, "p20")


def segment(ms: list[int], cost: dict[tuple[int, str], float], upper: dict[tuple[int, str], float],
            paths: list[str], tolerance: float, min_gain: float) -> list[tuple[int, str]]:
    """Per-M choices [(m, path)] of the fewest-range segmentation (see the module's rule). `cost[(m, p)]`: the
    regime's cost, `upper[(m, p)]`: p's conservative ratio to F.linear at m; a path absent at an M cannot cover it."""
    t = len(ms)
    # the per-M best among what may replace F.linear there: F.linear, and paths that beat it beyond the noise
    best = [min(cost[(m, p)] for p in paths if (m, p) in cost and (p == ATEN or upper[(m, p)] < 1 - min_gain))
            for m in ms]
    # f[j]: (ranges, total cost) of the best segmentation of ms[:j]; back[j]: (i, path) of its last range
    f: list[tuple[float, float]] = [(0, 0.0)] + [(math.inf, math.inf)] * t
    back: list[tuple[int, str]] = [(0, ATEN)] * (t + 1)
    for j in range(1, t + 1):
        for p in paths:
            total, logs = 0.0, 0.0
            for i in range(j, 0, -1):  # the range ms[i-1 .. j-1]
                m = ms[i - 1]
                if (m, p) not in cost or cost[(m, p)] > (1 + tolerance) * best[i - 1]:
                    break
                total += cost[(m, p)]
                if p != ATEN:
                    logs += math.log(upper[(m, p)])
                if p != ATEN and math.exp(logs / (j - i + 1)) >= 1 - min_gain:
                    continue  # this span does not beat F.linear beyond the noise; a longer one still may
                cand = (f[i - 1][0] + 1, f[i - 1][1] + total)
                if cand < f[j] or (cand == f[j] and p == ATEN):
                    f[j], back[j] = cand, (i - 1, p)
    if math.isinf(f[t][0]):
        raise HarnessError("no segmentation meets the tolerance; raise --tolerance")
    out: list[tuple[int, str]] = []
    j = t
    while j > 0:
        i, p = back[j]
        out[:0] = [(m, p) for m in ms[i:j]]
        j = i
    return out


def fit_segments(cells: Cells, base: ThresholdTable, tolerance: float = DEFAULT_TOLERANCE, min_gain: float = 0.01,
                 noise: Any = None, hold_out: set[int] | frozenset[int] = frozenset()
                 ) -> tuple[ThresholdTable, pd.DataFrame]:
    """The table of the fewest-range fit (RULE) from measured cells, and per shape what it chose."""
    among = dispatch_candidates(cells, base)
    shapes_out: dict[tuple[int, int], dict[str, tuple]] = {}
    report = []
    for n, k, ms in shapes_to_fit(cells, hold_out):
        own = {}
        for regime in REGIMES:
            cost, upper = {}, {}
            for m in ms:
                for p in among:
                    if cells.has(n, k, m, p):
                        cost[(m, p)] = cells.cost(n, k, m, p, regime)
                        upper[(m, p)] = 1.0 if p == ATEN else _upper_ratio(cells, n, k, m, p, regime, noise)
            own[regime] = compress(segment(ms, cost, upper, among, tolerance, min_gain))
        shapes_out[(n, k)] = own
        report.append({"n": n, "k": k, "graph": describe_ranges(own["graph"]), "eager": describe_ranges(own["eager"])})
    if not shapes_out:
        raise HarnessError("nothing to fit: no shape has F.linear measured ok")
    table = ThresholdTable(base.profile, base.low_m_backend, {r: () for r in REGIMES}, shapes_out)
    return table, pd.DataFrame(report)


def range_counts(table: ThresholdTable) -> dict[str, float]:
    """Mean number of ranges per shape and regime, F.linear's own included (a shape with no ranges has one: F.linear
    everywhere), and the narrowest range as a share of its upper M."""
    counts, narrow = [], math.inf
    for own in table.shapes.values():
        for regime in REGIMES:
            ranges = own.get(regime, ())
            lo = 1
            pieces = 0
            for up, _ in ranges:
                narrow = min(narrow, (up - lo + 1) / up)
                lo, pieces = up + 1, pieces + 1
            counts.append(pieces + (1 if not ranges or lo <= 16384 else 0))
    return {"mean_ranges": sum(counts) / len(counts) if counts else 0.0, "max_ranges": max(counts, default=0),
            "narrowest_share": narrow}
