"""Ratios of two measured forwards paired round by round, the one way every forward verdict reads them (the forward
model, the forward noise floor and the answer in vLLM's terms share these)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from calibrate.analysis import paired_ratio_ci, parse_samples

if TYPE_CHECKING:
    from calibrate.forward_noise import ForwardFloor


def paired(g: pd.DataFrame, a: str, b: str) -> tuple[float, float, float]:
    """us(a)/us(b) as the median of per-round ratios with its interval; the point ratio alone without samples."""
    if a == b:
        return 1.0, 1.0, 1.0
    if "samples_us" in g.columns:
        sa, sb = parse_samples(g.at[a, "samples_us"]), parse_samples(g.at[b, "samples_us"])
        if len(sa) == len(sb) and len(sa):
            return paired_ratio_ci(sa, sb)
    return g.at[a, "us"] / g.at[b, "us"], math.nan, math.nan


def pooled(a: tuple[float, float, float], b: tuple[float, float, float]) -> tuple[float, float, float]:
    """Two measurements of one ratio: their geometric mean, and an interval spanning both intervals."""
    return math.sqrt(a[0] * b[0]), float(np.fmin(a[1], b[1])), float(np.fmax(a[2], b[2]))


def widened(regime: str, ratio: float, lo: float, hi: float, floor: "ForwardFloor | None") -> tuple[float, float]:
    """[lo, hi] widened by the forward floor where one is given (every forward test reads its interval through this)."""
    return floor.widen(regime, ratio, lo, hi) if floor is not None else (lo, hi)
