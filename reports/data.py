"""What the report shows, as tables: per-cell ratios and verdicts, the dispatcher's verdict in words, comparisons."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.paths import TUNED_CUBLASLT
from bench.results import load_results, load_run_info
from calibrate.analysis import (Cells, cell_verdicts, crossover, failures, forward_totals, low_m_measured, model_uses,
                                provenance, verdict)
from calibrate.forward_model import judged_forward, judged_vetoes
from calibrate.forward_noise import load_forward_floor
from calibrate.noise import load_noise
from calibrate.runs import table_problem
from dispatch.backends import ATEN, DISPATCH, is_flashinfer
from dispatch.profiles import PROFILES, GpuProfile
from dispatch.table import REGIMES, ThresholdTable, load_table
from dispatch.vllm import SEED_PR_MAX_M
from harness.errors import HarnessError
from harness.shipped import shipped_file

MARGIN = 0.03  # equivalence margin of every verdict in the report, as in `python -m calibrate validate`


@dataclass
class Run:
    label: str
    path: str
    df: pd.DataFrame
    info: dict[str, Any]
    profile: GpuProfile | None
    cells: Cells
    table: ThresholdTable | None
    incomplete: list[str]  # what check_grid found missing (only with --partial; empty for a complete run)
    table_problem: str = ""  # why the table cannot judge this run (calibrate.runs.table_problem)
    noise_file: str | None = None  # the floors its verdicts are widened by; None: the profile's shipped ones
    forward_floor_file: str | None = None

    @cached_property
    def noise(self) -> Any:
        """The run-to-run noise floor of its cell verdicts (None: the bootstrap alone), read on first use."""
        if self.profile is None:
            return None
        return load_noise(self.profile.name, self.noise_file)

    @cached_property
    def forward_floor(self) -> Any:
        """The forward noise floor of its measured-forward verdicts (None: the paired rounds alone)."""
        if self.profile is None:
            return None
        return load_forward_floor(self.profile.name, self.forward_floor_file)

    @property
    def gpu(self) -> str:
        return str((self.info.get("fingerprint") or {}).get("gpu_name", "unknown GPU"))


def load_run(path: str | Path, thresholds: str | None = None, partial: bool = False, noise: str | None = None,
             forward_floor: str | None = None) -> Run:
    """A results folder with the table that judges it; `noise`, `forward_floor`: floor files that widen its verdicts
    in place of the profile's shipped ones (a table run judges its check with its own)."""
    df = load_results(path, partial=partial)
    info = load_run_info(path)
    incomplete = df.attrs["incomplete"]
    for col in ("n", "k", "m"):
        df[col] = df[col].astype(int)
    profile = PROFILES.get(str(info.get("profile", "")))
    table = None
    if thresholds:
        table = load_table(path=thresholds)
    elif profile and shipped_file("table", profile.name).exists():
        table = load_table(profile.name)
    cells = Cells.from_results(df)
    problem = table_problem(table, info, cells.paths(), Path(path).name) if table is not None else ""
    if problem:  # the report shows the measurements, and says why no dispatcher verdict
        table = None
    label = f"{Path(path).name} ({info.get('started', '?')[:10]}, {(info.get('fingerprint') or {}).get('gpu_name', '?')})"
    return Run(label, str(path), df, info, profile, cells, table, incomplete, problem, noise, forward_floor)


def cell_rows(run: Run, dispatch_verdicts: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every row of the run with its GPU-time ratio to aten, that ratio's 95% interval and verdict, and whether
    the path ran aten's kernels. The dispatch path's verdict is the dispatcher's against the best candidate, from
    dispatch_verdicts (cell_verdicts' table; computed here when None, left out when empty)."""
    return with_dispatch_verdicts(run, ratio_rows(run), dispatch_verdicts)


def ratio_rows(run: Run) -> pd.DataFrame:
    """Every row of the run with its GPU-time ratio to aten, that ratio's interval and verdict, and whether the path
    ran aten's kernels (cell_rows without the dispatcher's verdict)."""
    df = run.df.copy()
    c = run.cells
    ratio, lo, hi, verd, same = [], [], [], [], []
    for r in df.itertuples(index=False):
        key, akey = (r.n, r.k, r.m, r.path), (r.n, r.k, r.m, ATEN)
        if r.path != ATEN and key in c.samples and akey in c.samples:
            x, a, b = c.ratio_ci(*key, ATEN, n_boot=1000, seed=(r.n * 31 + r.m) & 0xFFFF)
            ratio.append(x), lo.append(a), hi.append(b), verd.append(verdict(a, b, MARGIN))
            same.append(str(r.kernels) == str(c.kernels(*akey)))
        else:
            ratio.append(np.nan), lo.append(np.nan), hi.append(np.nan), verd.append(""), same.append(None)
    df["ratio"], df["ratio_lo"], df["ratio_hi"], df["verdict"], df["same_kernel"] = ratio, lo, hi, verd, same
    return df.sort_values(["n", "k", "m", "path"]).reset_index(drop=True)


def with_dispatch_verdicts(run: Run, df: pd.DataFrame, dispatch_verdicts: pd.DataFrame | None) -> pd.DataFrame:
    """ratio_rows' table with the dispatch rows' verdict against the best candidate (see cell_rows)."""
    df = df.copy()
    c = run.cells
    if dispatch_verdicts is None and run.table is not None:
        dispatch_verdicts = cell_verdicts(c, run.table, MARGIN, noise=run.noise)
    if dispatch_verdicts is not None and not dispatch_verdicts.empty and DISPATCH in set(df["path"]):
        v = dispatch_verdicts.set_index(["n", "k", "m"])
        is_d = df["path"] == DISPATCH
        df.loc[is_d, "verdict"] = [f"{v.loc[(n, k, m), 'verdict']} vs best" if (n, k, m) in v.index else ""
                                   for n, k, m in zip(df.loc[is_d, "n"], df.loc[is_d, "k"], df.loc[is_d, "m"])]
    return df.sort_values(["n", "k", "m", "path"]).reset_index(drop=True)


@dataclass
class Headline:
    holds: bool | None  # None: no threshold table for this GPU
    sentences: list[str]
    verdicts: pd.DataFrame
    totals: pd.DataFrame


def headline(run: Run, forwards: list[tuple[pd.DataFrame, dict]] | None = None) -> Headline:
    """The dispatcher's verdict on this run, in plain words, with the tables behind it: calibrate validate's on the
    same inputs (the measured forwards, where given, judge the (model, M) they measured in place of the cell-sum
    model, and their own failures count)."""
    c, df = run.cells, run.df
    s: list[str] = []
    ok = df[df["status"] == "ok"]
    s.append(f"{len(ok)} cells measured ok, {int((df['status'] == 'skipped').sum())} skipped and "
             f"{int((df['status'] == 'failed').sum())} failed, over {df['shape'].nunique()} shapes and "
             f"{df['m'].nunique()} token counts M = {df['m'].min()}..{df['m'].max()}.")
    piv = ok.pivot_table(index=["n", "k", "m"], columns="path", values="gpu_us")
    if {TUNED_CUBLASLT, ATEN} <= set(piv.columns):
        r = (piv[TUNED_CUBLASLT] / piv[ATEN]).dropna()
        r = r[r.index.get_level_values("m") >= 64]
        if len(r):
            s.append(f"FlashInfer's tuned cuBLASLt against aten at M >= 64: GPU-time ratio median {r.median():.3f}, "
                     f"range {r.min():.3f}-{r.max():.3f} over {len(r)} cells.")
    host = ok.groupby("path")["host_us"].median().dropna()
    if len(host):
        s.append("Median host time per eager call: " + ", ".join(f"{p} {v:.0f} µs" for p, v in host.items()) + ".")
    if run.profile is None or run.table is None:
        s.insert(0, (run.table_problem[0].upper() + run.table_problem[1:] + "; " if run.table_problem else
                     "No threshold table exists for this GPU, so the dispatcher cannot be judged here; ") +
                    "fit one with `python -m calibrate fit`.")
        return Headline(None, s, pd.DataFrame(), pd.DataFrame())
    floor = run.forward_floor
    # the fit's vetoes as validate judges them: refuted where a given forward measured the vetoed path no slower
    uses = model_uses(df)
    vetoes, _ = judged_vetoes(run.table, [fdf for fdf, _ in forwards or []], uses, floor)
    verdicts = cell_verdicts(c, run.table, MARGIN, noise=run.noise, vetoes=vetoes)
    totals = forward_totals(c, run.table, uses, run.profile.capture_size)
    slower, over = failures(verdicts, totals, floor)
    measured_over, covered = 0, set()
    if forwards:
        for fdf, finfo in forwards:
            fv, _, _, both = judged_forward(fdf, finfo, run.table, run.profile, floor)
            covered |= both
            measured_over += int((~fv["ok"]).sum()) if not fv.empty else 0
        over = over[[(mo, m) not in covered for mo, m in zip(over["model"], over["m"])]]
    holds = slower.empty and over.empty and not measured_over
    t = run.table
    rule = table_rule(t)
    if holds:
        s.insert(0, f"Yes, the dispatcher holds on this {run.gpu}: with its table ({rule}) it is never slower than the "
                    f"best measured path by more than {MARGIN:.0%} in any of {len(verdicts)} cells (GPU time, graph "
                    f"regime), and "
                    f"its per-forward totals stay within 1% of the best in the regime each M runs in.")
    else:
        where = ", ".join(f"{r.n}x{r.k} M={r.m}" for r in slower.head(8).itertuples())
        s.insert(0, f"No, the dispatcher does not hold everywhere on this {run.gpu} ({rule}): it is SLOWER than the "
                    f"best choice beyond {MARGIN:.0%} in {len(slower)} cell(s)" + (f" ({where})" if where else "") +
                    (f" and, in the cell-sum model (a sum of isolated cells, not a measurement; measured forwards "
                     f"overrule it where they exist), its per-forward total exceeds the best by more than 1% at "
                     f"{len(over)} (model, M) points" if len(over) else "") +
                    (f"; its measured forward is more than 1% above the best measured path at {measured_over} "
                     f"point(s)" if measured_over else "") + ".")
    if run.incomplete:  # no verdict on incomplete data: say what the measured cells show, and that it is not one
        s[0] = (f"No verdict: this run is incomplete ({'; '.join(run.incomplete)}), judged with --partial. On the "
                f"measured cells alone: " + s[0])
        holds = None
    p = provenance(t, run.path, run.df["m"])
    if p.fitted_from:
        s.insert(1, f"The table was fitted from {p.fitted_from}"
                 + (f" (M {', '.join(map(str, p.held_out))} held out)" if p.held_out else "")
                 + ("; this is the run it was fitted on (in-sample)." if p.in_sample else
                    "; this run is another one (out of sample)" + (f", with M values the fit never saw: "
                                                                    f"{', '.join(map(str, p.unseen))}." if p.unseen
                                                                   else ".")))
    if t.source.get("note"):
        s.insert(1, f"About this table: {t.source['note']}")
    seed = ThresholdTable.from_thresholds(t.profile, t.low_m_backend, SEED_PR_MAX_M, path=low_m_measured(c, t))
    seed_slow = int((cell_verdicts(c, seed, MARGIN)["verdict"] == "SLOWER").sum())
    s.insert(1, f"A single threshold at M <= {SEED_PR_MAX_M} on every shape (the seed PR's split, applied to this "
                f"GPU's low-M backend) would be SLOWER beyond {MARGIN:.0%} in {seed_slow} cell(s) on this GPU.")
    return Headline(holds, s, verdicts, totals)


def table_rule(t: ThresholdTable) -> str:
    """The table in words: per regime, its default ranges and how many shapes have their own."""
    own = {r: sum(1 for v in t.shapes.values() if any(p != ATEN for _, p in v[r])) for r in REGIMES}
    return "; ".join(f"{r}: {t.describe(r)} by default" + (f", own ranges with FlashInfer on {own[r]} of "
                                                            f"{len(t.shapes)} shapes" if t.shapes else "")
                     for r in REGIMES)


def shape_crossovers(run: Run) -> dict[tuple[int, int], float]:
    if run.table is None:
        return {}
    return {(n, k): crossover(run.cells, run.table, n, k, MARGIN) for n, k in run.cells.shapes()}


def compare_runs(a: Run, b: Run, rows_a: pd.DataFrame | None = None) -> pd.DataFrame:
    """FlashInfer/aten GPU-time ratios of two runs side by side, per cell both measured, with the drift b/a - 1."""
    ra, rb = (cell_rows(a) if rows_a is None else rows_a), cell_rows(b, pd.DataFrame())  # FlashInfer rows only
    keep = ["n", "k", "m", "path", "shape", "ratio", "ratio_lo", "ratio_hi", "kernels"]
    ra = ra[ra["path"].map(is_flashinfer) & ra["ratio"].notna()][keep]
    rb = rb[rb["path"].map(is_flashinfer) & rb["ratio"].notna()][keep]
    j = ra.merge(rb, on=["n", "k", "m", "path", "shape"], suffixes=("_a", "_b"))
    if j.empty:
        raise HarnessError(f"{a.path} and {b.path} share no FlashInfer cell measured against aten; nothing to compare")
    j["drift"] = j["ratio_b"] / j["ratio_a"] - 1
    j["kernel_changed"] = j["kernels_a"].astype(str) != j["kernels_b"].astype(str)
    return j.sort_values("drift", key=lambda s: -s.abs()).reset_index(drop=True)


def load_anatomy(path: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    p = Path(path)
    csv = p / "results.csv" if p.is_dir() else p
    if not csv.is_file():
        raise HarnessError(f"host-anatomy results {csv} not found; run `python -m bench host-anatomy` first")
    try:
        df = pd.read_csv(csv)
    except Exception as exc:
        raise HarnessError(f"cannot read host-anatomy results {csv} ({type(exc).__name__}: {exc})") from None
    missing = [c for c in ("path", "kind", "layer", "m", "n", "k", "host_us") if c not in df.columns]
    if missing:
        raise HarnessError(f"{csv} lacks column(s) {', '.join(missing)}; it was not written by bench host-anatomy")
    host = pd.to_numeric(df["host_us"], errors="coerce")
    bad = host.isna() | ~np.isfinite(host)  # a segment (a layer less its callees) may be slightly negative
    if bad.any():
        raise HarnessError(f"{csv}: {int(bad.sum())} row(s) whose host_us is not a finite number (first: "
                           f"{df[bad].iloc[0]['path']} {df[bad].iloc[0]['layer']}); re-run or restore it")
    df["host_us"] = host
    return df, load_run_info(csv)
