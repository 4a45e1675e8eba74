"""calibrate compare RUN_A RUN_B: two sweeps of one GPU kind, cell by cell (nvbench_compare's shape).

Per (shape, M, path) both runs measured ok: B's GPU time over A's, its bootstrap interval (each run's replays
resampled) widened in quadrature by the profile's run-to-run noise floor at A's F.linear time (calibrate/noise.py),
and a verdict against a margin (default 3%): SAME (the whole interval inside 1 +- margin), FASTER or SLOWER (the
whole interval beyond it), AMBIGUOUS (neither: more replays or a quieter machine would tell). The environments come
first: the fingerprint keys a regression baseline is tied to (calibrate/baseline.py); a difference there refuses the
comparison unless --allow-env-mismatch, since then a change of kernel, not of code, may explain a verdict. Exit 1
where any cell is SLOWER, so that a script can gate on it; 0 otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from calibrate.analysis import Cells, ratio_ci, verdict
from calibrate.baseline import fingerprint_mismatch, fingerprint_of
from dispatch.backends import ATEN
from harness.errors import HarnessError

VERDICTS = ("SLOWER", "AMBIGUOUS", "FASTER", "SAME")  # the order a listing shows them in
DEFAULT_MARGIN = 0.03


@dataclass(frozen=True)
class Comparison:
    rows: pd.DataFrame  # shape, n, k, m, path, a_us, b_us, ratio, lo, hi, verdict, same_kernels
    env_differences: list[str]
    only_a: int  # ok cells of A that B did not measure ok
    only_b: int


def compare(a: pd.DataFrame, b: pd.DataFrame, info_a: dict[str, Any], info_b: dict[str, Any], noise: Any = None,
            margin: float = DEFAULT_MARGIN, paths: list[str] | None = None) -> Comparison:
    """B against A at every cell both measured ok (of `paths`, default every path)."""
    ca, cb = Cells.from_results(a), Cells.from_results(b)
    names = {(int(r.n), int(r.k)): str(r.shape) for r in a.itertuples(index=False)} if "shape" in a else {}
    keys_a = {key for key in ca.samples if paths is None or key[3] in paths}
    keys_b = {key for key in cb.samples if paths is None or key[3] in paths}
    both = sorted(keys_a & keys_b)
    if not both:
        raise HarnessError("the two runs share no cell measured ok" + (f" on {', '.join(paths)}" if paths else "")
                           + "; compare runs of the same grid and paths")
    rows = []
    for n, k, m, path in both:
        ratio, lo, hi = ratio_ci(cb.samples[(n, k, m, path)], ca.samples[(n, k, m, path)],
                                 seed=hash((n, k, m)) & 0xFFFF)
        if noise is not None:
            ref = ca.gpu(n, k, m, ATEN if ca.has(n, k, m, ATEN) else path)
            lo, hi = noise.widen(ratio, lo, hi, ref)
        ka, kb = ca.kernels(n, k, m, path), cb.kernels(n, k, m, path)
        rows.append({"shape": names.get((n, k), f"n{n}_k{k}"), "n": n, "k": k, "m": m, "path": path,
                     "a_us": ca.gpu(n, k, m, path), "b_us": cb.gpu(n, k, m, path), "ratio": ratio, "lo": lo,
                     "hi": hi, "verdict": verdict(lo, hi, margin),
                     "same_kernels": ka is not None and ka == kb})
    env = fingerprint_mismatch(fingerprint_of(info_a), fingerprint_of(info_b))
    return Comparison(pd.DataFrame(rows), env, len(keys_a - keys_b), len(keys_b - keys_a))


def verdict_totals(verdicts) -> str:
    """'SLOWER 1, AMBIGUOUS 0, FASTER 0, SAME 7': how many of `verdicts` fall in each class, in listing order."""
    verdicts = list(verdicts)
    return ", ".join(f"{v} {verdicts.count(v)}" for v in VERDICTS)


def counts_per_path(rows: pd.DataFrame) -> pd.DataFrame:
    """Compared cells per path (index) and verdict (a column for every class, in listing order)."""
    counts = rows.groupby(["path", "verdict"]).size().unstack(fill_value=0)
    return counts.reindex(columns=list(VERDICTS), fill_value=0)


def not_same(rows: pd.DataFrame) -> pd.DataFrame:
    """The compared cells that are not SAME, SLOWER first, the largest ratio first within a class."""
    odd = rows[rows["verdict"] != "SAME"].assign(order=lambda d: d["verdict"].map(VERDICTS.index))
    return odd.sort_values(["order", "ratio"], ascending=[True, False]).drop(columns="order")


def summary_lines(c: Comparison, margin: float, label_a: str, label_b: str, listed: int = 40) -> list[str]:
    """What the command prints: the environment, counts per path and verdict, then the cells that are not SAME."""
    lines = [f"B = {label_b} against A = {label_a}: GPU time B / A per cell, margin {margin:.0%}"]
    lines += ([f"environment differs: {d}" for d in c.env_differences] if c.env_differences
              else ["environment: the same (every fingerprint key a baseline is tied to)"])
    if c.only_a or c.only_b:
        lines.append(f"cells measured ok in one run only: {c.only_a} in A, {c.only_b} in B (not compared)")
    lines.append("")
    lines.append(counts_per_path(c.rows).to_string())
    odd = not_same(c.rows)
    if not odd.empty:
        lines.append("")
        lines.append("cells not SAME (kernels: whether both runs ran the very same kernels):")
        shown = odd.head(listed)
        lines.append(shown[["shape", "m", "path", "a_us", "b_us", "ratio", "lo", "hi", "verdict", "same_kernels"]]
                     .to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        if len(odd) > listed:
            lines.append(f"... and {len(odd) - listed} more (--out-file writes every cell)")
    lines.append("")
    lines.append(verdict_totals(c.rows["verdict"]) + f" of {len(c.rows)} cells")
    return lines
