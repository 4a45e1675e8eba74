"""The distance to the limit in a verdict: per weight, the dispatcher's share of the run's size-matched read ceiling
at small M; per model and M, its captured forward over the forward's floors (bench/ceiling.py measures both)."""
from __future__ import annotations

import pandas as pd

from bench.forward_paths import FUSED_SIBLINGS, VLLM_FUSED
from dispatch.backends import DISPATCH

SMALL_M = (1, 2, 4, 8)
LARGE_WEIGHT_BYTES = 16e6  # the weights a decode step's time is made of
BANDWIDTH_BOUND_M = 128  # above it a forward is bound by compute, and a bandwidth floor says little
# the forwards whose distance to the floor is shown: the dispatcher, and beside it, where the forward measured them,
# the same forward with its sibling linears fused (the table's choices; vLLM default's F.linear)
LIMIT_RULES = (DISPATCH, FUSED_SIBLINGS, VLLM_FUSED)


def shape_shares(df: pd.DataFrame, ms: tuple[int, ...] = SMALL_M) -> pd.DataFrame:
    """(N, K) x M: the dispatcher row's share of the size-matched ceiling, for weights of LARGE_WEIGHT_BYTES or more;
    empty where the run measured no ceiling or no dispatcher row."""
    if "of_ceiling" not in df.columns:
        return pd.DataFrame()
    rows = df[(df["path"] == DISPATCH) & (df["status"] == "ok") & df["m"].isin(ms)
              & (df["n"] * df["k"] * 2 >= LARGE_WEIGHT_BYTES)]
    rows = rows.assign(of_ceiling=pd.to_numeric(rows["of_ceiling"], errors="coerce")).dropna(subset=["of_ceiling"])
    if rows.empty:
        return pd.DataFrame()
    return rows.pivot_table(index=["n", "k"], columns="m", values="of_ceiling")


def forward_distance(fdf: pd.DataFrame) -> pd.DataFrame:
    """Per model and M, the dispatcher's captured forward (and the fused-siblings forwards where measured:
    LIMIT_RULES): µs, over the floor (the unfused forward's bytes over the large-buffer ceiling; fusing moves the same
    bytes) and over the sum of its linears' size-matched reads; empty where the run measured no ceiling."""
    if "over_floor" not in fdf.columns:
        return pd.DataFrame()
    rows = fdf[fdf["path"].isin(LIMIT_RULES) & (fdf["regime"] == "graph") & (fdf["status"] == "ok")
               & (fdf["m"] <= BANDWIDTH_BOUND_M)]
    rows = rows.dropna(subset=["over_floor"]).assign(order=lambda d: d["path"].map(LIMIT_RULES.index))
    return rows.sort_values(["model", "m", "order"])[["model", "m", "path", "us", "floor_us", "over_floor",
                                                      "over_ceiling_sum"]]


def lines(df: pd.DataFrame, fdf: pd.DataFrame | None) -> list[str]:
    out = []
    shares = shape_shares(df)
    if not shares.empty:
        out += [f"\ndistance to the limit: the dispatcher's share of the size-matched read ceiling, weights of "
                f">= {LARGE_WEIGHT_BYTES / 1e6:.0f} MB, graph regime (1 = as fast as streaming the weight alone):",
                shares.to_string(float_format=lambda v: f"{v:.3f}")]
    dist = forward_distance(fdf) if fdf is not None else pd.DataFrame()
    if not dist.empty:
        out += [f"\ndistance to the limit per forward (captured dispatcher, and the fused-siblings rules where "
                f"measured, M <= {BANDWIDTH_BOUND_M}): over_floor = µs over its bytes at the run's large-buffer "
                "ceiling; over_ceiling_sum = over the sum of its linears' size-matched reads:",
                dist.to_string(index=False, float_format=lambda v: f"{v:.3f}")]
    return out
