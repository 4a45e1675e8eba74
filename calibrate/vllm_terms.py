"""The answer in vLLM's terms, from measured forwards: per model, regime and M, what vLLM runs by default, with its
flag, under the seed PR's rule, under the best single threshold T (the low-M backend through vLLM's op at M <= T,
F.linear above) and under the table, each as a ratio to vLLM's default with its interval.

A threshold rule runs, at each M, either the low-M backend's forward or vLLM default's, so every T is read off those
two measured rows; T is chosen per regime from the measured M (the smallest T whose geometric-mean ratio over every
model and M is the lowest).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bench.forward_paths import SEED_PR, VLLM_DEFAULT, VLLM_FLAG, threshold_base
from bench.paths import DISPATCH
from calibrate.pairing import paired, widened
from dispatch import vllm
from dispatch.profiles import GpuProfile
from harness.errors import HarnessError

REGIMES = ("graph", "eager")
COMPARED = (VLLM_FLAG, SEED_PR, "threshold", DISPATCH)
LABELS = {VLLM_DEFAULT: "vLLM default", VLLM_FLAG: "vLLM flag", SEED_PR: "seed PR rule", "threshold": "best threshold",
          DISPATCH: "table"}


@dataclass(frozen=True)
class VllmTerms:
    rows: pd.DataFrame  # model, regime, m, vllm_regime, default_us, then <rule>, <rule>_lo, <rule>_hi per COMPARED
    thresholds: dict[str, int]  # per regime: the best single T over every model (0: F.linear at every M)
    per_model: dict[tuple[str, str], int]  # (model, regime): the best T for that model alone
    low_path: str
    profile: str
    capture_size: int


def required_paths(profile: GpuProfile) -> list[str]:
    return [VLLM_DEFAULT, VLLM_FLAG, SEED_PR, threshold_base(profile), DISPATCH]


def _check(forward: pd.DataFrame, profile: GpuProfile) -> pd.DataFrame:
    ok = forward[forward["status"] == "ok"]
    have = set(ok["path"])
    missing = [p for p in required_paths(profile) if p not in have]
    if missing:
        raise HarnessError(f"the forward runs lack measured rows of {', '.join(missing)}; measure them with "
                           f"python -m bench forward --gpu {profile.name} (its default paths)")
    return ok


TWIN_REASON = "same paths as "  # bench/forward.py twin_rows: a row that is another rule's measurement


def measured_as(g: pd.DataFrame, path: str) -> str:
    """The rule whose measurement this row is: itself, or the rule its twin row names."""
    reason = str(g.at[path, "reason"]) if "reason" in g.columns else ""
    return reason[len(TWIN_REASON):].split(" ", 1)[0] if reason.startswith(TWIN_REASON) else path


def _ratio(g: pd.DataFrame, path: str, regime: str, floor) -> tuple[float, float, float]:
    if measured_as(g, path) == measured_as(g, VLLM_DEFAULT):
        return 1.0, 1.0, 1.0  # one measurement under two names: the same forward, no noise between them
    r, lo, hi = paired(g, path, VLLM_DEFAULT)
    lo, hi = widened(regime, r, lo, hi, floor)
    return r, lo, hi


def _groups(forward: pd.DataFrame, profile: GpuProfile) -> dict[tuple[str, str, int], pd.DataFrame]:
    """(model, regime, M) -> its ok rows by path, where every required path was measured; the low-M backend may
    instead be skipped as far slower than all-aten (bench forward --skip-slower), which no threshold then reaches."""
    need, low = set(required_paths(profile)), threshold_base(profile)
    out = {}
    for (model, regime, m), g in forward.groupby(["model", "regime", "m"]):
        ok = g[g["status"] == "ok"]
        slow = ((g["path"] == low) & (g["status"] == "skipped")
                & g["reason"].astype(str).str.contains("aten's graph replay time")).any()
        if need <= set(ok["path"]) | ({low} if slow else set()):
            out[(str(model), str(regime), int(m))] = ok.set_index("path")
    if not out:
        raise HarnessError("no (model, M, regime) of the forward runs measured every rule; pass a complete "
                           "bench forward run")
    return out


def best_threshold(groups: dict[tuple[str, str, int], pd.DataFrame], low: str, regime: str,
                   model: str | None = None) -> int:
    """The T among 0 and the measured M with the lowest geometric-mean ratio to vllm-default over every (model, M)
    of the regime (or one model's); the smallest such T."""
    keys = [k for k in groups if k[1] == regime and model in (None, k[0])]
    candidates = sorted({0, *(k[2] for k in keys)})
    log_low = {k: math.log(groups[k].at[low, "us"] / groups[k].at[VLLM_DEFAULT, "us"]) if low in groups[k].index
               else math.inf for k in keys}
    scores = [(sum(log_low[k] for k in keys if k[2] <= t), t) for t in candidates]
    best = min(s for s, _ in scores)
    return min(t for s, t in scores if s <= best + 1e-12)


def vllm_terms(forward: pd.DataFrame, profile: GpuProfile, floor=None) -> VllmTerms:
    _check(forward, profile)
    low = threshold_base(profile)
    groups = _groups(forward, profile)
    thresholds = {r: best_threshold(groups, low, r) for r in REGIMES if any(k[1] == r for k in groups)}
    per_model = {(mo, r): best_threshold(groups, low, r, mo) for mo, r in sorted({(k[0], k[1]) for k in groups})}
    rows = []
    for (model, regime, m), g in sorted(groups.items()):
        captured = m <= profile.capture_size
        row = {"model": model, "regime": regime, "m": m, "vllm_regime": (regime == "graph") == captured,
               "default_us": float(g.at[VLLM_DEFAULT, "us"])}
        for rule in COMPARED:
            path = (low if m <= thresholds[regime] else VLLM_DEFAULT) if rule == "threshold" else rule
            row[rule], row[f"{rule}_lo"], row[f"{rule}_hi"] = _ratio(g, path, regime, floor)
        row["low_m"] = float(g.at[low, "us"] / g.at[VLLM_DEFAULT, "us"]) if low in g.index else math.inf
        # the table beside the best threshold: dispatch over the threshold rule's forward, paired
        t_path = low if m <= thresholds[regime] else VLLM_DEFAULT
        r, lo, hi = paired(g, DISPATCH, t_path)
        row["table_over_threshold"], row["tot_lo"], row["tot_hi"] = (r, *widened(regime, r, lo, hi, floor))
        rows.append(row)
    return VllmTerms(pd.DataFrame(rows), thresholds, per_model, low, profile.name, profile.capture_size)


def _cell(r: float, lo: float, hi: float) -> str:
    return f"{r:.3f}" if lo != lo else f"{r:.3f} [{lo:.3f}, {hi:.3f}]"


def geomean(values) -> float:
    v = np.asarray(list(values), dtype=float)
    return float(np.exp(np.log(v).mean())) if len(v) else math.nan


def text(t: VllmTerms) -> str:
    """The vLLM-terms table as plain text: a block per model and regime, then the thresholds."""
    lines = [f"vLLM {vllm.VLLM_VERSION} on {t.profile}: per-forward linear time over vLLM default's (F.linear on every "
             f"linear), median of paired rounds [95% interval]; * = the regime vLLM runs that M in "
             f"(capture size {t.capture_size})"]
    for (model, regime), g in t.rows.groupby(["model", "regime"], sort=False):
        lines.append(f"\n{model}, {regime} (best threshold over every model T = {t.thresholds[regime]}; for this "
                     f"model alone T = {t.per_model[(model, regime)]}):")
        head = f"  {'M':>6}  {'default µs':>10}  " + "  ".join(f"{LABELS[c]:>24}" for c in COMPARED)
        lines.append(head + f"  {'table / threshold':>24}")
        for d in g.to_dict("records"):
            cells = "  ".join(f"{_cell(d[c], d[c + '_lo'], d[c + '_hi']):>24}" for c in COMPARED)
            lines.append(f"  {d['m']:>5}{'*' if d['vllm_regime'] else ' '}  {d['default_us']:>10.1f}  {cells}  "
                         f"{_cell(d['table_over_threshold'], d['tot_lo'], d['tot_hi']):>24}")
        lines.append("  geometric mean over M: " + ", ".join(f"{LABELS[c]} {geomean(g[c]):.3f}" for c in COMPARED))
    lines.append("\nthe single threshold a vLLM change should use on this GPU (low-M backend through vLLM's op at "
                 "M <= T, F.linear above): " + ", ".join(f"{r} T = {v}" for r, v in t.thresholds.items()))
    return "\n".join(lines)



def markdown(t: VllmTerms) -> str:
    """The short answer: per model and regime, each rule over vLLM default at the smallest measured M and as the
    geometric mean over the M at which vLLM runs that regime."""
    head = ["model", "regime", "M", *[LABELS[c] for c in COMPARED]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (model, regime), g in t.rows.groupby(["model", "regime"], sort=False):
        first = g.iloc[0]
        lines.append(f"| {model} | {regime} | {first['m']} | " + " | ".join(f"{first[c]:.2f}" for c in COMPARED) + " |")
        mine = g[g["vllm_regime"]]
        if len(mine):
            span = f"{mine['m'].min()}-{mine['m'].max()} (geo-mean)"
            lines.append(f"| {model} | {regime} | {span} | " + " | ".join(f"{geomean(mine[c]):.2f}" for c in COMPARED)
                         + " |")
    lines.append("")
    lines.append("Best single threshold T: " + ", ".join(f"{r} {v}" for r, v in t.thresholds.items()))
    return "\n".join(lines)
