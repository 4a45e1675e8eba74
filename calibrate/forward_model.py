"""Measured forwards against the model of them that sums isolated cells (CPU only).

The model is what `dispatch validate` used to state as per-forward totals: per linear of the forward, the cell's GPU
time in the CUDA-graph regime and max(host, GPU) per call in the eager regime, summed. A measured forward
(bench/forward.py) is the ground truth; this module reads it, validates it, and sets the two side by side."""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pandas as pd

from bench.forward import Bound
from bench.forward_paths import DISPATCHER_RULES, FUSED_RULES, NEVER_BEST, TABLE_DIRECT, Target, path_for
from bench.results import load_run_info, numeric, samples_missing, samples_ok
from calibrate.analysis import Cells, Veto, forward_vetoes, paired_ratio_ci, parse_samples, veto_key
from calibrate.pairing import paired, pooled, widened
from dispatch.backends import ATEN, DISPATCH
from dispatch.profiles import GpuProfile
from dispatch.table import ThresholdTable
from harness.errors import HarnessError
from shapes.catalog import model_configs
from shapes.derive import forward_sequence, load_config

if TYPE_CHECKING:
    from calibrate.forward_noise import ForwardFloor

KEY = ("model", "tp", "m", "path", "regime")
MODEL_MISS = 0.05  # a model that misses the measurement by more than this is flagged
FORWARD_MARGIN = 0.01  # the dispatcher's measured forward may exceed the best measured path by at most this


FORWARD_STATUSES = ("ok", "failed", "skipped")


def _bad_forward(csv: Path, df: pd.DataFrame, mask, column: str, what: str) -> HarnessError:
    row = df[mask].iloc[0]
    return HarnessError(f"{csv}: {int(mask.sum())} row(s) with {what} in {column} (first: {row.get('model')} "
                        f"M={row.get('m')} {row.get('path')} {row.get('regime')}); re-run or restore it")


def _check_forward_columns(df: pd.DataFrame, csv: Path) -> None:
    """Every column a number is computed from: status known, M a positive integer, times finite and > 0 on ok rows,
    the other time columns finite and >= 0 where given, samples parse as positive numbers."""
    bad = sorted(set(map(str, df["status"])) - set(FORWARD_STATUSES))
    if bad:
        raise HarnessError(f"{csv}: unknown status values {bad}; expected {', '.join(FORWARD_STATUSES)}")
    m = pd.to_numeric(df["m"], errors="coerce")
    broken = ~(m.notna() & np.isfinite(m) & (m >= 1) & (m == np.floor(m)))
    if broken.any():
        raise _bad_forward(csv, df, broken, "m", "a value that is not a positive integer")
    df["m"] = m.astype(int)
    ok = df["status"] == "ok"
    us = pd.to_numeric(df["us"], errors="coerce")
    broken = ok & ~(np.isfinite(us) & (us > 0))
    if broken.any():
        raise _bad_forward(csv, df, broken, "us", "a missing, NaN or non-positive time on an ok row")
    df["us"] = us
    for col in ("us_p20", "us_p80", "submit_us", "gpu_busy_us", "span_us", "event_us"):
        if col in df.columns:
            num, garbage = numeric(df[col])
            broken = garbage | (ok & num.notna() & ~(np.isfinite(num) & (num >= 0)))
            if broken.any():
                raise _bad_forward(csv, df, broken, col, "text, an infinite or a negative time")
            df[col] = num
    broken = ok & df["samples_us"].map(lambda v: samples_missing(v) or not samples_ok(v))  # required here
    if broken.any():
        raise _bad_forward(csv, df, broken, "samples_us", "samples that are not ';'-separated positive numbers")


def load_forward(path: str | Path, partial: bool = False) -> tuple[pd.DataFrame, dict[str, Any]]:
    """forward.csv and its run.json, validated: columns, finite positive times on ok rows, no duplicate row, and
    every (model, M, path, regime) of the run present unless `partial`."""
    p = Path(path)
    csv = p / "forward.csv" if p.is_dir() else p
    if not csv.is_file():
        raise HarnessError(f"forward results {csv} not found; run `python -m bench forward` first or pass its folder")
    info = load_run_info(csv)
    if info.get("kind") != "forward":
        raise HarnessError(f"{csv.parent}/run.json is not a forward run's (kind {info.get('kind')!r}); pass the folder "
                           f"that `python -m bench forward` wrote")
    try:
        df = pd.read_csv(csv, dtype={"kernel_digest": str})  # hex that may look like a number
    except Exception as exc:
        raise HarnessError(f"cannot read forward results {csv} ({type(exc).__name__}); re-run or restore it") from None
    missing = [c for c in (*KEY, "status", "us", "linears", "samples_us") if c not in df.columns]
    if missing or df.empty:
        raise HarnessError(f"{csv} lacks column(s) {', '.join(missing) or 'and rows'}; it was not written by a "
                           f"current bench forward: re-run it")
    _check_forward_columns(df, csv)
    grid = {k: info.get(k) for k in ("models", "ms", "paths", "regimes")}
    empty = [k for k, v in grid.items() if not (isinstance(v, list) and v)]
    if empty and not partial:
        raise HarnessError(f"{csv.parent}/run.json names no {', '.join(empty)}, so missing rows cannot be told; "
                           f"no verdict on it (pass --partial to judge what it holds)")
    if df.duplicated(list(KEY)).any():
        raise HarnessError(f"{csv}: a (model, tp, m, path, regime) row appears twice; re-run or restore it")
    want = {(mo, m, pa, r) for mo in info.get("models", []) for m in info.get("ms", []) for pa in info.get("paths", [])
            for r in info.get("regimes", [])}
    have = set(zip(df["model"], df["m"].astype(int), df["path"], df["regime"]))
    gaps = sorted(want - have)
    if (gaps or info.get("status") != "complete") and not partial:
        raise HarnessError(f"forward results {csv}: run status {info.get('status')!r}, {len(gaps)} of {len(want)} rows "
                           f"missing; finish it with --resume, or pass --partial")
    if eager_void(info):
        df["reason"] = df["reason"].astype(object)
        df.loc[df["regime"] == "eager", ["status", "reason"]] = ["void", EAGER_VOID]
        print(f"note: {csv}: its eager rows are void ({EAGER_VOID}); its graph rows are used", file=sys.stderr)
    return df, info


# An older bench forward flushed CUPTI between each settle and its timed forward, which stretched the timed eager
# forward's host submission several times over. Its runs say settle_ms in run.json and not
# settle_drain, which later runs record.
EAGER_VOID = "a CUPTI flush ran between each settle and its timed eager forward and stretched its host time"


def eager_void(info: dict[str, Any]) -> bool:
    return bool(info.get("settle_ms")) and not info.get("settle_drain")


def modelled_us(cells: Cells, seq, rule: str, m: int, regime: str, sm: int, profile: GpuProfile,
                table: ThresholdTable | None, paths_run_lm_head: bool = False) -> float:
    """The cell-sum model of one forward; NaN where a cell it needs was not measured."""
    total = 0.0
    for lin in seq:
        path = path_for(rule, lin, m, Target(sm, profile, table, paths_run_lm_head), regime)
        if not cells.has(lin.n, lin.k, m, path):
            return math.nan
        total += cells.cost(lin.n, lin.k, m, path, regime)
    return total


def model_vs_measured(cells: Cells, forward: pd.DataFrame, info: dict[str, Any], profile: GpuProfile,
                      table: ThresholdTable | None) -> pd.DataFrame:
    """One row per measured (model, M, path, regime): measured µs, modelled µs, their ratio and whether the model
    misses by more than MODEL_MISS. Models outside the catalog (a --config run) cannot be rebuilt and are left out."""
    sm = _run_sm(info, profile)
    seqs = _sequences(info, set(forward["model"]))
    rows = []
    for r in forward[forward["status"] == "ok"].itertuples(index=False):
        if r.model not in seqs or r.path in FUSED_RULES or (table is None and r.path in DISPATCHER_RULES):
            continue  # no table: the dispatcher's choices cannot be modelled
        model = modelled_us(cells, seqs[r.model], r.path, int(r.m), r.regime, sm, profile, table,
                            paths_run_lm_head="lm_head_rule" not in info)
        rows.append({"model": r.model, "m": int(r.m), "path": r.path, "regime": r.regime, "measured_us": r.us,
                     "modelled_us": model, "measured_over_model": r.us / model if model == model else math.nan})
    out = pd.DataFrame(rows)
    if not out.empty:
        out["miss"] = (out["measured_over_model"] - 1).abs() > MODEL_MISS
    return out


def forward_ratios(forward: pd.DataFrame) -> pd.DataFrame:
    """Per model, M and regime: each path's measured per-forward µs over aten's."""
    ok = forward[forward["status"] == "ok"]
    piv = ok.pivot_table(index=["model", "m", "regime"], columns="path", values="us")
    if ATEN not in piv.columns:
        raise HarnessError("the forward run has no aten rows to compare the paths with")
    return piv.div(piv[ATEN], axis=0).reset_index()


def forward_verdicts(forward: pd.DataFrame, capture_size: int, floor: "ForwardFloor | None" = None) -> pd.DataFrame:
    """Per model, M and regime (both: a step runs captured up to vLLM's capture size and eagerly above it, and any M
    runs eagerly under enforce_eager): the dispatcher's measured forward over the best measured path, and over
    all-aten. The forwards of all paths ran interleaved, so sample i of each ran side by side: each ratio is the median
    of per-pair ratios with a bootstrap interval, and the dispatcher FAILs only where the whole interval lies above
    1 + FORWARD_MARGIN (host time on one machine drifts by several percent between rounds; a point estimate would fail
    the dispatcher against the very path it runs). `vllm_regime` marks the regime vLLM runs that M in. Where the run
    measured table-direct, `choices_over_best` (the table's choices called directly, over the best path) and
    `binding_cost` (dispatch over table-direct, with its interval) split the ratio in two.

    `same_kernels`: a captured dispatcher replays the very kernels table-direct's graph does (same kernel_digest), so
    both rows measure one forward and their ratio is noise, though a single run's interval can exclude 1. There the
    ratio to best is pooled from both (their geometric mean) and its interval spans both intervals.

    `floor` (calibrate.forward_noise): the intervals of both ratios widened by the run-to-run noise of measured
    forwards, so that a verdict holds for a fresh process's run and not only for this run's rounds."""
    ok = forward[forward["status"] == "ok"]
    rows = []
    for (model, m, regime), g in ok.groupby(["model", "m", "regime"]):
        g = g.set_index("path")
        if DISPATCH not in g.index:
            continue
        best = g["us"].drop(list(NEVER_BEST), errors="ignore").idxmin()  # twins and fused forwards: no single path
        ratio, lo, hi = paired(g, DISPATCH, best)
        a_ratio, a_lo, a_hi = paired(g, DISPATCH, ATEN) if ATEN in g.index else (math.nan,) * 3
        same = regime == "graph" and _same_kernels(g, DISPATCH, TABLE_DIRECT)
        if same:
            ratio, lo, hi = pooled((ratio, lo, hi), paired(g, TABLE_DIRECT, best))
            if ATEN in g.index:
                a_ratio, a_lo, a_hi = pooled((a_ratio, a_lo, a_hi), paired(g, TABLE_DIRECT, ATEN))
        lo, hi = widened(regime, ratio, lo, hi, floor)
        a_lo, a_hi = widened(regime, a_ratio, a_lo, a_hi, floor)
        fails = (lo if lo == lo else ratio) > 1 + FORWARD_MARGIN
        # with table-direct measured beside it: how much of the distance to the best path is the table's choices
        # (table-direct / best) and how much the dispatcher's own per-call work (dispatch / table-direct)
        direct = (paired(g, TABLE_DIRECT, best)[0], *paired(g, DISPATCH, TABLE_DIRECT)) if TABLE_DIRECT in g.index \
            else (math.nan,) * 4
        rows.append({"model": model, "m": int(m), "regime": regime,
                     "vllm_regime": (regime == "graph") == (m <= capture_size), "dispatch_us": g.at[DISPATCH, "us"],
                     "best": best, "best_us": g.at[best, "us"], "dispatch_over_best": ratio, "ratio_lo": lo,
                     "ratio_hi": hi, "dispatch_over_aten": a_ratio, "aten_lo": a_lo, "aten_hi": a_hi,
                     "choices_over_best": direct[0], "binding_cost": direct[1], "binding_lo": direct[2],
                     "binding_hi": direct[3], "same_kernels": same, "ok": not fails,
                     "verdict": "OVER" if fails else ("within noise" if ratio > 1 + FORWARD_MARGIN else "ok")})
    return pd.DataFrame(rows)


def _same_kernels(g: pd.DataFrame, a: str, b: str) -> bool:
    """Whether rows a and b ran the same kernel sequence (runs before kernel_digest existed: unknown, so False)."""
    if "kernel_digest" not in g.columns or a not in g.index or b not in g.index:
        return False
    da, db = g.at[a, "kernel_digest"], g.at[b, "kernel_digest"]
    return isinstance(da, str) and bool(da) and da == db


def null_pair_spread(verdicts: pd.DataFrame) -> tuple[int, float, float]:
    """The measured noise of identical captured forwards: over the points where dispatch and table-direct replayed
    the same kernels, how many, and the median and largest |dispatch / table-direct - 1|."""
    same = verdicts[verdicts["same_kernels"].astype(bool)] if "same_kernels" in verdicts else verdicts.iloc[:0]
    dev = (same["binding_cost"] - 1).abs()
    return len(same), (float(dev.median()) if len(dev) else math.nan), (float(dev.max()) if len(dev) else math.nan)


GPU_BOUND_MARGIN = 1.25  # GPU-bound: busy >= 1.25x the submission time (room for a path's extra host time)


def _eager_aten_by_model(forward: pd.DataFrame, hold_out: set[int] | frozenset[int]
                         ) -> dict[str, list[tuple[int, float, float]]]:
    """Per model: its measured eager all-aten forwards as (M, CUPTI busy µs, host submission µs), by M; a model
    whose rows have no busy or submission time at all is left out."""
    ok = forward[(forward["status"] == "ok") & (forward["regime"] == "eager") & (forward["path"] == ATEN)]
    out = {}
    for model, g in ok.groupby("model"):
        g = g[~g["m"].astype(int).isin(hold_out)]
        busy, submit = (pd.to_numeric(g[c], errors="coerce") for c in ("gpu_busy_us", "submit_us"))
        if not len(g) or (busy.isna() | submit.isna()).all():
            continue
        out[str(model)] = sorted(zip(g["m"].astype(int), busy, submit), key=lambda row: row[0])
    return out


def gpu_bound_from(forward: pd.DataFrame, margin: float = GPU_BOUND_MARGIN,
                   hold_out: set[int] | frozenset[int] = frozenset()) -> dict[str, float]:
    """Per model with measured eager all-aten forwards: the smallest measured M from which on every measured
    forward kept the GPU busy at least `margin` times as long as the host took to submit it (CUPTI busy time over
    host submission time); inf where the largest measured M was not. Host time grows little with M and GPU time a
    lot, so between a host-bound M and the next GPU-bound one the forward counts as host-bound (the cautious side)."""
    out = {}
    for model, rows in _eager_aten_by_model(forward, hold_out).items():
        start = math.inf
        for m, busy, submit in reversed(rows):
            if not busy >= margin * submit:
                break
            start = float(m)
        out[model] = start
    return out


def host_bound_until(forward: pd.DataFrame, margin: float = GPU_BOUND_MARGIN,
                     hold_out: set[int] | frozenset[int] = frozenset()) -> dict[str, float]:
    """Per model with measured eager all-aten forwards: the largest measured M up to which (from the smallest on)
    every measured forward took the host at least `margin` times as long to submit as it kept the GPU busy; 0 where
    the smallest measured M was not. Between it and gpu_bound_from the forward is balanced: host and GPU time both
    show in it (on the H200, the 4B at M = 1-128 without the profiler: busy 1.03-1.23x submission)."""
    out = {}
    for model, rows in _eager_aten_by_model(forward, hold_out).items():
        until = 0.0
        for m, busy, submit in rows:
            if not submit >= margin * busy:
                break
            until = float(m)
        out[model] = until
    return out


def _cautious_over_runs(per_run: Callable[..., dict[str, float]], runs: list[pd.DataFrame], margin: float,
                        hold_out: set[int] | frozenset[int], cautious: Callable[[float, float], float]
                        ) -> dict[str, float]:
    """per_run over several runs, per model the cautious one of the runs' answers; a model that some run did not
    measure keeps the others' answer."""
    out: dict[str, float] = {}
    for run in runs:
        for model, value in per_run(run, margin, hold_out).items():
            out[model] = cautious(out.get(model, value), value)
    return out


def host_bound_in_every_run(runs: list[pd.DataFrame], margin: float = GPU_BOUND_MARGIN,
                            hold_out: set[int] | frozenset[int] = frozenset()) -> dict[str, float]:
    """host_bound_until over several runs: per model, the smallest (the cautious side)."""
    return _cautious_over_runs(host_bound_until, runs, margin, hold_out, min)


def _against_aten(forward: pd.DataFrame, candidates: list[str], floor: "ForwardFloor | None" = None
                  ) -> dict[tuple[str, str, int], dict[str, tuple[float, float, float]]]:
    """Per (regime, model, M) measured with all-aten, each candidate's whole forward over all-aten's: its paired
    ratio and interval, widened by `floor` where given (the one reading both forward tests below share)."""
    ok = forward[forward["status"] == "ok"]
    out = {}
    for (regime, model, m), g in ok.groupby(["regime", "model", "m"]):
        g = g.set_index("path")
        if ATEN not in g.index:
            continue
        ratios = {}
        for path in candidates:
            if path != ATEN and path in g.index:
                ratio, lo, hi = paired(g, path, ATEN)
                ratios[path] = (ratio, *widened(str(regime), ratio, lo, hi, floor))
        out[(str(regime), str(model), int(m))] = ratios
    return out


def _beaten(forward: pd.DataFrame, candidates: list[str], min_gain: float, floor: "ForwardFloor | None" = None
            ) -> dict[tuple[str, str, int], dict[str, tuple[float, float]]]:
    """Per (regime, model, M) measured with all-aten: each candidate path whose whole forward beat all-aten beyond
    the noise (paired interval, widened by `floor` where given, wholly below 1 - min_gain), with its ratio and the
    interval's upper end."""
    return {key: {p: (ratio, hi) for p, (ratio, _, hi) in ratios.items() if hi == hi and hi < 1 - min_gain}
            for key, ratios in _against_aten(forward, candidates, floor).items()}


def forward_picks(forward: pd.DataFrame, candidates: list[str], min_gain: float
                  ) -> dict[tuple[str, str, int], tuple[str, float, float]]:
    """Per (regime, model, M) measured: the lean single path (one path wherever it can run, F.linear elsewhere)
    whose whole forward beat all-aten beyond the noise (paired interval wholly below 1 - min_gain), the fastest such
    one, with its ratio and the interval's upper end. What users pay is a forward, not a cell: gains of a few
    percent per cell that no single cell shows beyond the noise add up over a forward."""
    return picks_in_every_run([forward], candidates, min_gain)


def picks_in_every_run(runs: list[pd.DataFrame], candidates: list[str], min_gain: float,
                       floor: "ForwardFloor | None" = None) -> dict[tuple[str, str, int], tuple[str, float, float]]:
    """forward_picks over several measured-forward runs (fresh processes, other leases): per (regime, model, M),
    a path qualifies only if it beat all-aten beyond the noise in every run; the one whose worst run is fastest is
    picked, with its largest ratio and interval end over the runs. One run's picks vary with the GPU and host of its
    lease (on the H200: graph 35B-A3B M = 512 picked in two runs of one lease, not in the fit's run of another)."""
    per_run = [_beaten(run, candidates, min_gain, floor) for run in runs]
    # a run takes part in the decision at (regime, model, M) where it measured all-aten there: one that did not
    # measure that model, or whose rows there are void (EAGER_VOID), does not veto it
    measured = [{(str(r), str(mo), int(m)) for r, mo, m in
                 run.loc[(run["status"] == "ok") & (run["path"] == ATEN), ["regime", "model", "m"]].itertuples(index=False)}
                for run in runs]
    picks = {}
    for key in sorted({key for b in per_run for key in b}):
        taking_part = [b for b, seen in zip(per_run, measured) if key in seen]
        if all(key in b for b in taking_part):
            _pick(key, taking_part, candidates, picks)
    return picks


def _pick(key: tuple[str, str, int], per_run: list[dict], candidates: list[str], picks: dict) -> None:
    """Into `picks`: of the candidates that beat all-aten at `key` in every run, the one whose worst run is fastest."""
    common = [p for p in candidates if all(p in b[key] for b in per_run)]
    worst = {p: (max(b[key][p][0] for b in per_run), max(b[key][p][1] for b in per_run)) for p in common}
    if worst:
        path = min(worst, key=lambda p: worst[p][0])
        picks[key] = (path, *worst[path])


def slower_in_every_run(runs: list[pd.DataFrame], candidates: list[str], floor: "ForwardFloor | None" = None
                        ) -> dict[tuple[str, str, int], dict[str, float]]:
    """Per (regime, model, M): the lean single paths whose whole forward was slower than all-aten beyond the noise
    (paired interval, widened by `floor` where given, wholly above 1) in every run that measured both there, with the
    smallest of their ratios. A forward measures what cells cannot: a tuned kernel faster in a short burst of calls
    may run a whole forward at a lower clock under the power cap."""
    per_run = []
    for run in runs:
        seen = {key: ({p: ratio for p, (ratio, lo, _) in ratios.items() if lo == lo and lo > 1}, {ATEN, *ratios})
                for key, ratios in _against_aten(run, [p for p in candidates if p != ATEN], floor).items()}
        per_run.append(seen)
    out: dict[tuple[str, str, int], dict[str, float]] = {}
    for key in sorted({key for seen in per_run for key in seen}):
        for path in candidates:
            taking_part = [seen[key] for seen in per_run if key in seen and path in seen[key][1]]
            if taking_part and all(path in slow for slow, _ in taking_part):
                out.setdefault(key, {})[path] = min(slow[path] for slow, _ in taking_part)
    return out


def gpu_bound_in_every_run(runs: list[pd.DataFrame], margin: float = GPU_BOUND_MARGIN,
                           hold_out: set[int] | frozenset[int] = frozenset()) -> dict[str, float]:
    """gpu_bound_from over several runs: per model, the latest start of any run (the cautious side)."""
    return _cautious_over_runs(gpu_bound_from, runs, margin, hold_out, max)


def _run_sm(info: dict[str, Any], profile: GpuProfile) -> int:
    """The SM a forward run measured on (its fingerprint's; the profile's where the fingerprint lacks it)."""
    return int((info.get("fingerprint") or {}).get("sm") or profile.sm)


def _sequences(info: dict[str, Any], models: set[str]) -> dict[str, list]:
    """The forward sequences a run measured (catalog models only: a --config run's cannot be rebuilt)."""
    configs = model_configs()
    seqs = {name: forward_sequence(load_config(configs[name]), name, int(info.get("tp", 1)), info.get("decoder_layers"))
            for name in models if name in configs}
    if not info.get("lm_head", True):
        seqs = {k: [lin for lin in v if lin.layer != "lm_head"] for k, v in seqs.items()}
    return seqs


def table_paths_used(seq, table: ThresholdTable, m: int, sm: int, profile: GpuProfile, regime: str) -> str:
    """What a forward's paths_used column says the table-direct rule ran: 'path:count;...' (bench.forward.Bound)."""
    bound = Bound()
    for lin in seq:
        p = path_for(TABLE_DIRECT, lin, m, Target(sm, profile, table), regime)
        bound.used[p] = bound.used.get(p, 0) + 1
    return bound.describe()


def other_table_keys(forward: pd.DataFrame, info: dict[str, Any], table: ThresholdTable, profile: GpuProfile
                     ) -> tuple[set[tuple[str, int, str]], bool]:
    """The (model, M, regime) at which a forward run's table-direct rows ran other choices than `table` makes (the
    run measured another table there: its dispatcher rows are no verdict on this one), and whether the run has
    table-direct rows to check by at all."""
    ok = forward[(forward["status"] == "ok") & (forward["path"] == TABLE_DIRECT)]
    seqs = _sequences(info, set(ok["model"]))
    sm = _run_sm(info, profile)
    other = {(str(r.model), int(r.m), str(r.regime)) for r in ok.itertuples()
             if r.model in seqs and str(r.paths_used) != table_paths_used(seqs[r.model], table, int(r.m), sm, profile,
                                                                          str(r.regime))}
    return other, not ok.empty


def measured_groups(runs: list[tuple[pd.DataFrame, dict[str, Any]]], table: ThresholdTable, profile: GpuProfile,
                    regime: str) -> dict[tuple[str, int], list[pd.DataFrame]]:
    """Per (model, M) of one regime: the rows (indexed by path) of each run whose table-direct ran exactly what
    `table` chooses there (checked by paths_used). A key that some run measured with other choices is left out."""
    per_key: dict[tuple[str, int], list[pd.DataFrame]] = {}
    mismatched: set[tuple[str, int]] = set()
    for df, info in runs:
        # that run measured another table's choices at these keys
        mismatched |= {(model, m) for model, m, r in other_table_keys(df, info, table, profile)[0] if r == regime}
        ok = df[(df["status"] == "ok") & (df["regime"] == regime)]
        models = set(_sequences(info, set(ok["model"])))
        for (model, m), g in ok.groupby(["model", "m"]):
            g = g.set_index("path")
            if TABLE_DIRECT in g.index and model in models:
                per_key.setdefault((str(model), int(m)), []).append(g)
    return {key: groups for key, groups in per_key.items() if key not in mismatched}


def kept_choices(runs: list[tuple[pd.DataFrame, dict[str, Any]]], table: ThresholdTable, profile: GpuProfile,
                 regime: str, floor: "ForwardFloor | None" = None) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (model, M) of one regime: where every run that measured `table`'s own choices there (table-direct) found
    the dispatcher running them faster than all-aten beyond the noise (paired interval wholly below 1; table-direct
    where the run has no dispatcher rows), its worst ratio and interval end. A refit keeps such choices unless a single
    path beat them (hysteresis: a measured gain is not given up on the strength of the cells alone). The dispatcher,
    not table-direct, is the measure: it is what a model pays, and table-direct's registry calls cost more host time
    eagerly."""
    out = {}
    for key, groups in sorted(measured_groups(runs, table, profile, regime).items()):
        if not all(ATEN in g.index for g in groups):
            continue
        paired = [paired(g, DISPATCH if DISPATCH in g.index else TABLE_DIRECT, ATEN) for g in groups]
        paired = [(r, *widened(regime, r, lo, hi, floor)) for r, lo, hi in paired]
        if all(hi < 1 for _, _, hi in paired):
            out[key] = {"ratio": max(r for r, _, _ in paired), "hi": max(hi for _, _, hi in paired),
                        "runs": len(groups)}
    return out


def overrides_over_the_table(runs: list[tuple[pd.DataFrame, dict[str, Any]]], table: ThresholdTable,
                             profile: GpuProfile, candidates: list[str], min_gain: float, regime: str = "graph",
                             floor: "ForwardFloor | None" = None) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (model, M) in one regime: a single path (all-aten included) whose whole forward beat the table's own
    choices (table-direct rows that ran exactly what `table` chooses there, checked by their paths_used) in every
    run, and by more than `min_gain` over the rounds of all runs pooled. What the cell test cannot see (gains of
    1-2% spread over many cells, each inside the noise) shows in the forward; runs of the same table in fresh processes and leases are the evidence.

    A path qualifies when (1) its point ratio to table-direct is below 1 in every run that measured the table here,
    (2) the paired ratio over all those runs' rounds pooled has its interval wholly below 1 and its median at most
    1 - min_gain. The fastest by pooled median is returned, with the runs it was measured in."""
    per_key = measured_groups(runs, table, profile, regime)
    out = {}
    for key, groups in sorted(per_key.items()):
        best = None
        for path in candidates:
            if not all(path in g.index for g in groups):
                continue
            points = [paired(g, path, TABLE_DIRECT)[0] for g in groups]
            sa = [parse_samples(g.at[path, "samples_us"]) for g in groups]
            sb = [parse_samples(g.at[TABLE_DIRECT, "samples_us"]) for g in groups]
            if any(len(a) != len(b) or not len(a) for a, b in zip(sa, sb)):
                continue
            ratio, lo, hi = paired_ratio_ci(np.concatenate(sa), np.concatenate(sb))
            lo, hi = widened(regime, ratio, lo, hi, floor)
            if max(points) < 1 and hi < 1 and ratio <= 1 - min_gain and (best is None or ratio < best["ratio"]):
                best = {"path": path, "ratio": ratio, "lo": lo, "hi": hi, "worst_run": max(points), "runs": len(groups)}
        if best is not None:
            out[key] = best
    return out


def judged_forward(forward: pd.DataFrame, info: dict[str, Any], table: ThresholdTable, profile: GpuProfile,
                   floor: "ForwardFloor | None" = None) -> tuple[pd.DataFrame, set, bool, set[tuple[str, int]]]:
    """The measured forward verdicts that judge this table: (verdicts, the (model, M, regime) whose dispatcher ran
    another table's choices (left out), whether that could be checked, the (model, M) measured in both regimes).
    calibrate validate and the report's headline both take their measured verdicts from here."""
    fv = forward_verdicts(forward, profile.capture_size, floor)
    other, checkable = other_table_keys(forward, info, table, profile)
    if other:
        fv = fv[[(mo, m, r) not in other for mo, m, r in zip(fv["model"], fv["m"], fv["regime"])]]
    if fv.empty:
        return fv, other, checkable, set()
    regimes = fv.groupby(["model", "m"])["regime"].nunique()
    return fv, other, checkable, {key for key, n in regimes.items() if n == 2}


def judged_vetoes(table: ThresholdTable, forwards: list[pd.DataFrame], uses: dict[str, list[tuple[int, int, int]]],
                  floor) -> tuple[dict[Veto, frozenset[str]], list[str]]:
    """The table's vetoes (calibrate.analysis.forward_vetoes) that stand: a check forward that measured a vetoed path
    alone and all-aten at the (regime, model, M) of a model using the cell's shape, and found it not slower beyond
    the noise, refutes the veto there (its cells are judged against every path again). Returns them and what to
    say."""
    vetoes = forward_vetoes(table)
    if not vetoes:
        return vetoes, []
    paths = sorted({p for ps in vetoes.values() for p in ps})
    measured, slow = set(), {}
    for fdf in forwards:
        ok = fdf[fdf["status"] == "ok"]
        measured |= {(str(r), str(mo), int(m), str(p)) for r, mo, m, p in zip(ok["regime"], ok["model"], ok["m"],
                                                                                ok["path"])}
        for key, found in slower_in_every_run([fdf], paths, floor).items():
            slow.setdefault(key, set()).update(found)
    models = {}
    for model, shapes in uses.items():
        for n, k, _ in shapes:
            models.setdefault((n, k), []).append(model)
    kept, confirmed, refuted = {}, [], []
    for (regime, n, k, m), vetoed in sorted(vetoes.items()):
        for path in sorted(vetoed):
            checked = [mo for mo in models.get((n, k), [])
                       if {(regime, mo, m, path), (regime, mo, m, ATEN)} <= measured]
            said = f"{veto_key(regime, n, k, m)} {path}"
            if checked and not any(path in slow.get((regime, mo, m), ()) for mo in checked):
                refuted.append(said)
                continue
            if checked:
                confirmed.append(said)
            kept[(regime, n, k, m)] = kept.get((regime, n, k, m), frozenset()) | {path}
    lines = [f"the table's fit vetoed a path at {len(vetoes)} cell(s) (its forwards ran slower with it alone than "
             f"all-aten where the cells said otherwise); the check forwards confirm {len(confirmed)}, refute "
             f"{len(refuted)}, did not measure {sum(map(len, vetoes.values())) - len(confirmed) - len(refuted)}"]
    if refuted:
        lines.append("refuted (judged against every path): " + ", ".join(refuted))
    return kept, lines
