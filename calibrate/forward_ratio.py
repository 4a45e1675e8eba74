"""One measured forward rule over another, per model, regime and M: the median of paired rounds with its interval
(widened by the stored forward floor) and a verdict, the way every forward verdict reads two rows (calibrate/pairing).
What a forward-wide option measured beside its reference gives: PDL for the GEMV (table-pdl / table-direct), fused
siblings (fused-siblings / table-direct, vllm-fused / aten)."""
from __future__ import annotations

import math

import pandas as pd

from calibrate.analysis import verdict
from calibrate.pairing import paired, widened
from calibrate.vllm_terms import geomean, measured_as
from harness.errors import HarnessError


def parse_pairs(spec: str) -> list[tuple[str, str]]:
    """'a/b,c/d' -> [(a, b), (c, d)]; one clear error otherwise."""
    pairs = []
    for token in (t.strip() for t in spec.split(",")):
        a, sep, b = token.partition("/")
        if not sep or not a.strip() or not b.strip() or "/" in b:
            raise HarnessError(f"--pairs entry {token!r} is not RULE/REFERENCE; give e.g. table-pdl/table-direct")
        pairs.append((a.strip(), b.strip()))
    return pairs


def ratios(forward: pd.DataFrame, pairs: list[tuple[str, str]], floor=None) -> pd.DataFrame:
    """Per pair, model, regime and M where both rules have an ok row: ratio, lo, hi, verdict."""
    ok = forward[forward["status"] == "ok"]
    rows = []
    for a, b in pairs:
        for (model, regime, m), g in ok.groupby(["model", "regime", "m"]):
            g = g.set_index("path")
            if a not in g.index or b not in g.index:
                continue
            if measured_as(g, a) == measured_as(g, b):
                r, lo, hi = 1.0, 1.0, 1.0  # one measurement under two names
            else:
                r, lo, hi = paired(g, a, b)
                lo, hi = widened(str(regime), r, lo, hi, floor)
            rows.append({"pair": f"{a}/{b}", "model": model, "regime": regime, "m": int(m), "ratio": r, "lo": lo,
                         "hi": hi, "verdict": verdict(lo, hi, 0.0) if lo == lo else "n/a", "a_us": float(g.at[a, "us"]),
                         "b_us": float(g.at[b, "us"])})
    if not rows:
        raise HarnessError("no (model, regime, M) of the forward runs measured both rules of any pair; measure them "
                           "with python -m bench forward --paths naming both")
    return pd.DataFrame(rows)


def text(df: pd.DataFrame) -> str:
    lines = []
    for (pair, model, regime), g in df.groupby(["pair", "model", "regime"], sort=False):
        lines.append(f"{pair}  {model}, {regime}:")
        for d in g.sort_values("m").to_dict("records"):
            span = "" if math.isnan(d["lo"]) else f" [{d['lo']:.3f}, {d['hi']:.3f}]"
            lines.append(f"  M={d['m']:>5}  {d['a_us']:>9.1f} / {d['b_us']:>9.1f} µs = {d['ratio']:.3f}{span}  "
                         f"{d['verdict']}")
        lines.append(f"  geometric mean over M: {geomean(g['ratio']):.3f}")
    return "\n".join(lines)
